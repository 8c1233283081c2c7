#!/bin/sh
# Sharded checkpoints through mpirun (CTest, label mpi; docs/distributed.md "Sharded checkpoints").
#   reshard: a 2-rank ZeRO-1 run (optimizer.shard_state) checkpoints step 20 in pieces; it
#     resumes in one process, as 2 data-parallel ranks without shard_state and as 4 ZeRO-1 ranks,
#     and a one-process (unsharded) checkpoint resumes as 2 ZeRO-1 ranks: each tracks the
#     uninterrupted one-process run over steps 21-30 within 1e-4 relative (largest difference
#     printed); `kiln eval` and `kiln export` read the sharded run. A constant schedule, so that
#     runs of 20 and 30 steps train alike.
#   tp: the same for a tensor-parallel run (CONFIG: the GPT): a {data: 2, model: 2} run (4 ranks)
#     checkpoints step 20 in pieces (each rank its share of its shards); it resumes in one
#     process, as 2 data-parallel ranks and as {data: 1, model: 2} (4 ranks -> 2), and a 2-rank
#     data-parallel checkpoint resumes as {data: 2, model: 2}: each tracks the one-process run over
#     steps 21-30 within 1e-4; `kiln eval` and `kiln export` read the tensor-parallel run.
#   kill_save: a 2-rank ZeRO-1 run checkpointing every step; rank 1 SIGKILLed mid-run (most of a
#     step is its save): the job ends within 10 s, every committed checkpoint verifies
#     (`kiln eval` of each), and rerunning the command resumes from the newest.
#     $DIST_KILL_ARGS replaces the job's "--workers 2 --set optimizer.shard_state=true" (e.g.
#     "--workers 4 --set mesh.data=2 --set mesh.model=2": a tensor-parallel job).
# usage: dist_sharded_ckpt_test.sh reshard|tp|kill_save KILN CONFIG OUTDIR LIMIT_S
# Exits 77 when mpirun is absent; every run is bounded by timeout(1) and --job-timeout.
set -u
mode=$1 kiln=$2 config=$3 out=$4 limit=$5
command -v mpirun >/dev/null 2>&1 || { echo "dist_sharded_ckpt_test: mpirun not found: skipped"; exit 77; }
rm -rf "$out" && mkdir -p "$out" || exit 1
fail() { echo "dist_sharded_ckpt_test: FAILED: $*"; exit 1; }
run() {  # run NAME [flags...]: --workers N, when given, comes first
  name=$1
  shift
  jt=""
  [ "${1:-}" = --workers ] && jt="--job-timeout $limit"
  # shellcheck disable=SC2086
  timeout -k 5 "$limit" "$kiln" train "$config" --set log_every=1 --set eval_every=0 \
    --set checkpoint_every=10 --set schedule.kind=constant --set schedule.warmup_steps=0 \
    "$@" $jt --output-dir "$out/$name" >>"$out/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { cat "$out/$name.log"; fail "run $name exited $rc"; }
}
losses() {  # steps > $2 of run $1
  sed -n 's/.*"step":\([0-9]*\),.*"loss":\([^,}]*\).*/\1 \2/p' "$out/$1/metrics.jsonl" |
    awk -v after="$2" '$1 > after'
}
compare() {  # compare NAME: steps 21-30 against the reference
  losses ref 20 >"$out/ref.loss"
  losses "$1" 20 >"$out/$1.loss"
  [ "$(wc -l <"$out/$1.loss")" -eq 10 ] || fail "$1 logged $(wc -l <"$out/$1.loss") steps after 20"
  grep -q "resumed from .*step_20" "$out/$1.log" || { cat "$out/$1.log"; fail "$1 did not resume from step 20"; }
  paste "$out/ref.loss" "$out/$1.loss" | awk -v n="$1" '
    { if ($1 != $3) { print "step mismatch: " $0; exit 1 }
      d = $2 - $4; if (d < 0) d = -d; a = $2; if (a < 0) a = -a; r = d / a
      if (r > worst) { worst = r; at = $1 } }
    END { printf "%s: largest relative loss difference vs one process, steps 21-30: %.3g (step %d)\n", n, worst, at
          if (worst > 1e-4) exit 1 }' || fail "$1 is above 1e-4"
}

if [ "$mode" = reshard ]; then
  run ref --set steps=30
  run src --workers 2 --set steps=20 --set optimizer.shard_state=true
  grep -q '"format_version": 2' "$out/src/checkpoints/step_20/manifest.json" ||
    fail "the 2-rank checkpoint is not sharded"
  ls "$out/src/checkpoints/step_20" | grep -q '^rank-00001-shard' || fail "rank 1 wrote no shard"
  run one1 --set steps=20
  for target in to_one to_dp2 to_zero4 one_to_zero2; do
    case $target in
      one_to_zero2) cp -r "$out/one1" "$out/$target" ;;
      *) cp -r "$out/src" "$out/$target" ;;
    esac
    : >"$out/$target.log"
  done
  run to_one --set steps=30
  run to_dp2 --workers 2 --set steps=30
  run to_zero4 --workers 4 --set steps=30 --set optimizer.shard_state=true
  run one_to_zero2 --workers 2 --set steps=30 --set optimizer.shard_state=true
  for target in to_one to_dp2 to_zero4 one_to_zero2; do compare $target; done
  timeout -k 5 "$limit" "$kiln" eval "$out/src" >"$out/eval.log" 2>&1 || { cat "$out/eval.log"; fail "kiln eval of the sharded run"; }
  grep -q "step 20: held-out loss" "$out/eval.log" || { cat "$out/eval.log"; fail "kiln eval output"; }
  timeout -k 5 "$limit" "$kiln" export "$out/src" --out "$out/export" >"$out/export.log" 2>&1 ||
    { cat "$out/export.log"; fail "kiln export of the sharded run"; }
  echo "dist_sharded_ckpt_test: PASS"
  exit 0
fi

if [ "$mode" = tp ]; then
  mesh="--set mesh.data=2 --set mesh.model=2"
  run ref --set steps=30
  # shellcheck disable=SC2086
  run src --workers 4 --set steps=20 $mesh
  grep -q '"format_version": 2' "$out/src/checkpoints/step_20/manifest.json" ||
    fail "the tensor-parallel checkpoint is not sharded"
  for r in 0 1 2 3; do
    ls "$out/src/checkpoints/step_20" | grep -q "^rank-0000$r-shard" || fail "rank $r wrote no shard"
  done
  run dp2 --workers 2 --set steps=20
  for target in to_one to_dp2 to_tp2 dp_to_tp; do
    case $target in
      dp_to_tp) cp -r "$out/dp2" "$out/$target" ;;
      *) cp -r "$out/src" "$out/$target" ;;
    esac
    : >"$out/$target.log"
  done
  run to_one --set steps=30
  run to_dp2 --workers 2 --set steps=30
  run to_tp2 --workers 2 --set steps=30 --set mesh.model=2
  # shellcheck disable=SC2086
  run dp_to_tp --workers 4 --set steps=30 $mesh
  for target in to_one to_dp2 to_tp2 dp_to_tp; do compare $target; done
  timeout -k 5 "$limit" "$kiln" eval "$out/src" >"$out/eval.log" 2>&1 || { cat "$out/eval.log"; fail "kiln eval of the tensor-parallel run"; }
  grep -q "step 20: held-out loss" "$out/eval.log" || { cat "$out/eval.log"; fail "kiln eval output"; }
  timeout -k 5 "$limit" "$kiln" export "$out/src" --out "$out/export" >"$out/export.log" 2>&1 ||
    { cat "$out/export.log"; fail "kiln export of the tensor-parallel run"; }
  echo "dist_sharded_ckpt_test: PASS"
  exit 0
fi

# kill_save
job_args=${DIST_KILL_ARGS:---workers 2 --set optimizer.shard_state=true}
flags="--set steps=1000000 --set checkpoint_every=1 --set keep_last=2 --set log_every=1000 --set eval_every=0"
# shellcheck disable=SC2086
timeout -k 5 120 "$kiln" train "$config" $job_args --job-timeout 120 --collective-timeout 5 \
  $flags --output-dir "$out/run" >"$out/log" 2>&1 &
job=$!
victim=""
cleanup() { kill -9 "$job" 2>/dev/null; [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; }
trap cleanup EXIT
i=0
while [ $i -lt 300 ]; do
  victim=$(awk '/"pid":/ {p = $2} /"rank": 1,?$/ {gsub(",", "", p); print p}' "$out/run/run.json" 2>/dev/null | head -1)
  [ -n "$victim" ] && ls "$out/run/checkpoints" 2>/dev/null | grep -q '^step_3$' && break
  sleep 0.1
  i=$((i + 1))
done
[ -n "$victim" ] || { cat "$out/log"; fail "no rank 1 pid in run.json and no step_3 after 30 s"; }
# Kill while a save is in flight: once a step_<N>.tmp-* directory exists (rank 0 made it), stop
# rank 1 (SIGSTOP) and check that step_<N> is still uncommitted AND that rank 1 has not yet
# written its rank manifest (rank-00001.json, the last file a rank writes before the commit
# barrier): only then can rank 0 not commit without it. If rank 1 got that far before the stop
# (it may already be past the barrier, and rank 0 may rightly commit), let it go on and try the
# next save.
during=0
tries=0
while [ $tries -lt 50 ] && [ "$during" -eq 0 ]; do
  i=0
  while [ $i -lt 20000 ] && ! ls "$out/run/checkpoints" 2>/dev/null | grep -q '\.tmp-'; do i=$((i + 1)); done
  kill -STOP "$victim"
  tmp=$(ls "$out/run/checkpoints" | sed -n 's/^\(step_[0-9]*\)\.tmp-.*/\1/p' | head -1)
  tmpdir=$(ls -d "$out/run/checkpoints/$tmp".tmp-* 2>/dev/null | head -1)
  if [ -n "$tmp" ] && [ ! -e "$out/run/checkpoints/$tmp" ] && [ -n "$tmpdir" ] &&
    [ ! -e "$tmpdir/rank-00001.json" ]; then
    during=1
  else
    kill -CONT "$victim"
  fi
  tries=$((tries + 1))
done
[ "$during" -eq 1 ] || fail "no save caught in flight in $tries tries"
start=$(date +%s)
kill -KILL "$victim"
wait "$job"
rc=$?
took=$(($(date +%s) - start))
echo "rank 1 (pid $victim) killed: the job exited $rc after ${took} s"
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$took" -le 10 ] || fail "the job took ${took} s to end"
n=0
for d in "$out"/run/checkpoints/step_*; do
  case $d in *.tmp-* | *.old-*) continue ;; esac
  timeout -k 5 "$limit" "$kiln" eval "$d" >"$out/eval.log" 2>&1 || { cat "$out/eval.log"; fail "$d does not verify"; }
  n=$((n + 1))
done
[ "$n" -ge 1 ] || fail "no committed checkpoint"
echo "killed during the save of $tmp (try $tries); $n committed checkpoints verify: $(ls "$out/run/checkpoints" | tr '\n' ' ')"
[ ! -e "$out/run/checkpoints/$tmp" ] || fail "$tmp was committed without rank 1"
last=$(ls "$out/run/checkpoints" | sed -n 's/^step_\([0-9]*\)$/\1/p' | sort -n | tail -1)
# shellcheck disable=SC2086
timeout -k 5 "$limit" "$kiln" train "$config" $job_args --job-timeout "$limit" \
  $flags --set steps=$((last + 3)) --output-dir "$out/run" \
  >"$out/resume.log" 2>&1 || { cat "$out/resume.log"; fail "the rerun exited non-zero"; }
grep -q "resumed from .*step_$last" "$out/resume.log" || { cat "$out/resume.log"; fail "the rerun did not resume from step $last"; }
echo "the rerun resumed from step $last and finished"
echo "dist_sharded_ckpt_test: PASS"
