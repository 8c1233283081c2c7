#!/bin/sh
# A 2-worker `kiln train` whose rank 1 stops (SIGSTOP: hung, so only Kiln's collective timeout can
# notice) or dies (SIGKILL: mpirun notices) mid-run must end, non-zero, within LIMIT_S, instead of
# hanging; one whose rank 1 gets SIGTERM must stop on every rank after the same step, commit a
# checkpoint and exit 75 (CTest, label mpi; docs/distributed.md "Faults").
# With `restart`, the job runs under --max-restarts 2: rank 1 SIGKILLed, the supervisor relaunches
# the job, which resumes from the last checkpoint and finishes (exit 0) within LIMIT_S.
# usage: dist_train_fault_test.sh stop|kill|term|restart KILN CONFIG OUTDIR LIMIT_S
# Exits 77 when mpirun is absent. Everything it starts is bounded by timeout(1) and, at the end,
# killed by PID.
set -u
mode=$1 kiln=$2 config=$3 out=$4 limit=$5
command -v mpirun >/dev/null 2>&1 || { echo "dist_train_fault_test: mpirun not found: skipped"; exit 77; }
rm -rf "$out" && mkdir -p "$out" || exit 1
if [ "$mode" = restart ]; then
  # Long enough that the kill lands mid-run on a quiet machine (run it on the GPT example: a
  # 3000-step MLP run finished before the kill there).
  run_flags="--max-restarts 2 --set steps=200 --set checkpoint_every=10"
else
  run_flags="--set steps=1000000 --set checkpoint_every=0"
fi
# shellcheck disable=SC2086
timeout -k 5 120 "$kiln" train "$config" --workers 2 --job-timeout 120 --collective-timeout 2 \
  $run_flags --set eval_every=0 --set log_every=1000 \
  --output-dir "$out/run" >"$out/log" 2>&1 &
job=$!
cleanup() { kill -9 "$job" 2>/dev/null; [ -n "${victim:-}" ] && kill -9 "$victim" 2>/dev/null; }
trap cleanup EXIT
victim=""
i=0
while [ $i -lt 300 ]; do  # run.json lists every rank's pid once the ranks are set up (<= 30 s)
  victim=$(awk '/"pid":/ {p = $2} /"rank": 1$/ {gsub(",", "", p); print p}' "$out/run/run.json" 2>/dev/null)
  [ -n "$victim" ] && break
  sleep 0.1
  i=$((i + 1))
done
if [ -z "$victim" ]; then
  cat "$out/log"
  echo "dist_train_fault_test: FAILED: no rank 1 pid in run.json after 30 s"
  exit 1
fi
sleep 1  # a few steps in
if [ "$mode" = restart ]; then  # and past the first committed checkpoint (not a step_N.tmp-* save in flight)
  i=0
  while [ $i -lt 300 ] && ! ls "$out/run/checkpoints" 2>/dev/null | grep -qE '^step_[0-9]+$'; do
    sleep 0.1
    i=$((i + 1))
  done
fi
start=$(date +%s)
case $mode in
  stop) kill -STOP "$victim" ;;
  kill | restart) kill -KILL "$victim" ;;
  *) kill -TERM "$victim" ;;
esac
wait "$job"
rc=$?
took=$(($(date +%s) - start))
cat "$out/log"
echo "rank 1 (pid $victim), $mode: the job exited $rc after ${took} s"
if [ "$mode" = restart ]; then
  if [ "$rc" -ne 0 ] || ! grep -q "restart 1 of 2" "$out/log" || ! grep -q "resumed from" "$out/log" ||
    ! grep -q "done: step 200" "$out/log"; then
    echo "dist_train_fault_test: FAILED: expected a restart that resumes and finishes (exit 0)"
    exit 1
  fi
elif [ "$mode" = term ]; then
  if [ "$rc" -ne 75 ] || ! grep -q "checkpoint committed at" "$out/log"; then
    echo "dist_train_fault_test: FAILED: expected exit 75 with a committed checkpoint"
    exit 1
  fi
elif [ "$rc" -eq 0 ]; then  # (timeout(1) at 120 s cannot be it: the limit below is far less)
  echo "dist_train_fault_test: FAILED: expected a non-zero exit of the job itself"
  exit 1
fi
if [ "$took" -gt "$limit" ]; then
  echo "dist_train_fault_test: FAILED: took more than ${limit} s"
  exit 1
fi
if [ "$mode" = stop ] && ! grep -q "did not complete within 2000 ms" "$out/log"; then
  echo "dist_train_fault_test: FAILED: no collective timeout reported"
  exit 1
fi
echo "dist_train_fault_test: PASS"
