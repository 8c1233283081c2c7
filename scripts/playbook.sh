#!/usr/bin/env bash
# The single-device playbook that `make demo` runs after the engine demo: verify on a small
# validation subset, train a small CNN with checkpoints and evaluation, get preempted (SIGTERM)
# midway, resume, finish, profile a few steps, evaluate and export. Each stage says what it does.
#   scripts/playbook.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
KILN="${1:-build}/src/kiln/cli/kiln"
CONFIG=examples/cnn_digits.yaml
OUT=runs/playbook
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
[ -x "$KILN" ] || { echo "playbook: $KILN not built (run make build)"; exit 1; }
rm -rf "$OUT"
stage() { printf '\n== %s\n' "$*"; }

stage "1/6 verify: 40 steps of the CNN, evaluated on a 2-batch validation subset"
"$KILN" train "$CONFIG" --output-dir "$OUT/verify" --set steps=40 --set eval_every=40 \
  --set eval_batches=2 --set checkpoint_every=0 --set log_every=10 | tail -n 4

stage "2/6 train: 400 steps with evaluation and a checkpoint every 100 steps"
"$KILN" train "$CONFIG" --output-dir "$OUT/run" > "$OUT.train1.log" 2>&1 &
pid=$!
echo "trainer running in the background (pid $pid), log in $OUT.train1.log"
# Preempt once the step-200 checkpoint is committed (the manifest is renamed into place last).
for _ in $(seq 1 600); do
  [ -f "$OUT/run/checkpoints/step_200/manifest.json" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
stage "3/6 preempt: SIGTERM to the trainer (pid $pid) after the step-200 checkpoint"
kill -TERM "$pid" 2>/dev/null || true
set +e; wait "$pid"; rc=$?; set -e
tail -n 3 "$OUT.train1.log"
if [ "$rc" -eq 75 ]; then
  echo "trainer exited 75: preempted, resumable"
elif [ "$rc" -eq 0 ]; then
  echo "trainer had already finished before the signal (fast machine); nothing to resume"
else
  echo "playbook: trainer failed with exit $rc"; cat "$OUT.train1.log"; exit 1
fi

stage "4/6 resume: the same command continues from the newest committed checkpoint"
"$KILN" train "$CONFIG" --output-dir "$OUT/run" | grep -E "resum|eval at|done" | tail -n 6

stage "5/6 profile: steps 35-45 of a short run, with the time breakdown"
"$KILN" train "$CONFIG" --output-dir "$OUT/profile" --set steps=45 --set checkpoint_every=0 \
  --set eval_every=0 --profile-steps 35:45 | sed -n '/^profile of/,$p' 
echo "(open the trace in Perfetto or chrome://tracing)"

stage "6/6 evaluate and export the trained model"
"$KILN" eval "$OUT/run"
"$KILN" export "$OUT/run" --out "$OUT/export"
echo
echo "playbook done: run directory $OUT/run (metrics.jsonl, TensorBoard events, checkpoints)"
