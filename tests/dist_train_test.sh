#!/bin/sh
# `kiln train CONFIG --workers N` against one process (CTest, label mpi; docs/distributed.md):
#   - the loss at every step within 1e-4 relative of the one-process run (the largest relative
#     difference is printed);
#   - a second run of the same N-worker job gives bit-identical losses and final checkpoint bytes.
# usage: dist_train_test.sh KILN CONFIG OUTDIR WORKERS STEPS LIMIT_S [--set k=v ...]
#          [--workers-only --set k=v ...]
# Flags after --workers-only go to the N-worker runs alone (e.g. optimizer.shard_state=true: ZeRO-1
# against the plain one-process run).
# $DIST_WORKER_ARGS (optional, e.g. "--set mesh.data=2 --set mesh.model=2") goes to the
# N-worker runs only.
# Exits 77 (CTest SKIP_RETURN_CODE) when mpirun is absent. Every run is bounded by timeout(1)
# (TERM at LIMIT_S, KILL 5 s later, to its own process group: mpirun and its ranks) and by
# mpirun's own --job-timeout.
set -u
kiln=$1 config=$2 out=$3 workers=$4 steps=$5 limit=$6
shift 6
both="" only=""
for a in "$@"; do
  if [ "$a" = --workers-only ]; then
    only=" "
  elif [ -n "$only" ]; then
    only="$only $a"
  else
    both="$both $a"
  fi
done
command -v mpirun >/dev/null 2>&1 || { echo "dist_train_test: mpirun not found: skipped"; exit 77; }
rm -rf "$out" && mkdir -p "$out" || exit 1
common="--set steps=$steps --set log_every=1 --set eval_every=0 --set checkpoint_every=0"
run() {  # run NAME [extra flags...]
  name=$1
  shift
  # shellcheck disable=SC2086
  timeout -k 5 "$limit" "$kiln" train "$config" $common "$@" --output-dir "$out/$name" \
    >"$out/$name.log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$out/$name.log"
    echo "dist_train_test: FAILED: run $name exited $rc"
    exit 1
  fi
}
# "step loss" per line of metrics.jsonl (the loss as written: %.17g, so text equality is bits).
losses() {
  sed -n 's/.*"step":\([0-9]*\),.*"loss":\([^,}]*\).*/\1 \2/p' "$out/$1/metrics.jsonl"
}
# shellcheck disable=SC2086
run one $both
# shellcheck disable=SC2086
run dp1 --workers "$workers" --job-timeout "$limit" $both $only ${DIST_WORKER_ARGS:-}
# shellcheck disable=SC2086
run dp2 --workers "$workers" --job-timeout "$limit" $both $only ${DIST_WORKER_ARGS:-}
losses one >"$out/one.loss"
losses dp1 >"$out/dp1.loss"
losses dp2 >"$out/dp2.loss"
n=$(wc -l <"$out/one.loss")
if [ "$n" -ne "$steps" ] || [ "$(wc -l <"$out/dp1.loss")" -ne "$steps" ]; then
  echo "dist_train_test: FAILED: expected $steps logged losses, got $n and $(wc -l <"$out/dp1.loss")"
  exit 1
fi
grep -q '"ranks": *'"$workers" "$out/dp1/run.json" || grep -q '"ranks":'"$workers" "$out/dp1/run.json" || {
  echo "dist_train_test: FAILED: run.json does not record a mesh of $workers ranks"
  exit 1
}
paste "$out/one.loss" "$out/dp1.loss" | awk -v steps="$steps" -v workers="$workers" '
  { if ($1 != $3) { print "step mismatch: " $0; bad = 1; exit }
    d = $2 - $4; if (d < 0) d = -d; a = $2; if (a < 0) a = -a; r = d / a
    if (r > worst) { worst = r; at = $1 } }
  END { if (bad) exit 1
        printf "largest relative loss difference, %d workers vs one process, over %d steps: %.3g (step %d)\n", workers, steps, worst, at
        if (worst > 1e-4) { print "dist_train_test: FAILED: above 1e-4"; exit 1 } }' || exit 1
if ! cmp -s "$out/dp1.loss" "$out/dp2.loss"; then
  diff "$out/dp1.loss" "$out/dp2.loss" | head
  echo "dist_train_test: FAILED: two runs of the same $workers-worker job logged different losses"
  exit 1
fi
for f in "$out"/dp1/checkpoints/step_"$steps"/*.safetensors; do
  g="$out/dp2/checkpoints/step_$steps/$(basename "$f")"
  if ! cmp "$f" "$g"; then
    echo "dist_train_test: FAILED: final checkpoints differ ($f, $g)"
    exit 1
  fi
done
echo "two runs of the same $workers-worker job: bit-identical losses and final checkpoint"
echo "dist_train_test: PASS"
