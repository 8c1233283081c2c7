#!/bin/sh
# Real-signal preemption test of `kiln train` (registered in CTest as kiln_train_sigterm):
# a run interrupted by SIGTERM exits 75 with a checkpoint, a rerun resumes and finishes, and the
# result is bit-identical to an uninterrupted run: same loss at every step, same final weights.
# usage: train_signal_test.sh KILN CONFIG WORKDIR
set -u
KILN=$1; CONFIG=$2; W=$3
rm -rf "$W"; mkdir -p "$W"
COMMON="--set steps=1000 --set log_every=1 --set eval_every=0 --set checkpoint_every=100"

"$KILN" train "$CONFIG" $COMMON --output-dir "$W/straight" > "$W/straight.log" 2>&1 \
  || { echo "straight run failed"; cat "$W/straight.log"; exit 1; }

"$KILN" train "$CONFIG" $COMMON --output-dir "$W/interrupted" > "$W/first.log" 2>&1 &
PID=$!
# Wait until it has logged step 30 (or finished early), then SIGTERM it.
i=0
while [ $i -lt 400 ]; do
  if grep -q '"step":30,' "$W/interrupted/metrics.jsonl" 2>/dev/null; then break; fi
  sleep 0.05; i=$((i + 1))
done
kill -TERM $PID
wait $PID; RC=$?
if [ $RC -ne 75 ]; then echo "expected exit 75 after SIGTERM, got $RC"; cat "$W/first.log"; exit 1; fi
ls "$W/interrupted/checkpoints" | grep -q step_ || { echo "no checkpoint after SIGTERM"; exit 1; }
STOP=$(ls "$W/interrupted/checkpoints" | sed 's/step_//' | sort -n | tail -1)
echo "stopped at step $STOP"
[ "$STOP" -lt 1000 ] || { echo "run finished before the signal; nothing tested"; exit 1; }

"$KILN" train "$CONFIG" $COMMON --output-dir "$W/interrupted" > "$W/second.log" 2>&1 \
  || { echo "resumed run failed"; cat "$W/second.log"; exit 1; }
grep -q "resumed from" "$W/second.log" || { echo "second run did not resume"; exit 1; }

# Losses step by step (the JSONL lines carry the exact float printed with full precision).
extract() { grep -o '"step":[0-9]*,[^}]*"loss":[-0-9.e]*' "$1" | sed 's/"step":\([0-9]*\),.*"loss":\(.*\)/\1 \2/' | sort -n; }
extract "$W/straight/metrics.jsonl" > "$W/a.txt"
extract "$W/interrupted/metrics.jsonl" > "$W/b.txt"
[ "$(wc -l < "$W/a.txt")" -eq 1000 ] || { echo "straight run logged $(wc -l < "$W/a.txt") steps"; exit 1; }
cmp -s "$W/a.txt" "$W/b.txt" || { echo "losses differ:"; diff "$W/a.txt" "$W/b.txt" | head; exit 1; }
for f in "$W"/straight/checkpoints/step_1000/*.safetensors; do
  cmp -s "$f" "$W/interrupted/checkpoints/step_1000/$(basename "$f")" \
    || { echo "final weights differ: $(basename "$f")"; exit 1; }
done
echo "PASS: SIGTERM at step $STOP -> exit 75, resumed, 1000 losses and final weights bit-identical"

# --max-restarts: SIGKILL the worker mid-run; the supervisor restarts it from the last checkpoint.
# The steps recomputed after the restart must log exactly the losses they logged before the kill.
# (A longer run, so the kill lands well before the end.)
"$KILN" train "$CONFIG" --set steps=1500 --set log_every=1 --set eval_every=0 \
  --set checkpoint_every=100 --output-dir "$W/supervised" --max-restarts 2 > "$W/sup.log" 2>&1 &
SUP=$!
i=0
while [ $i -lt 400 ]; do
  if grep -q '"step":150,' "$W/supervised/metrics.jsonl" 2>/dev/null; then break; fi
  sleep 0.05; i=$((i + 1))
done
WORKER=$(pgrep -P $SUP | head -1)
# A second trainer on the same folder is refused while the worker holds its lock, naming the pid.
"$KILN" train "$CONFIG" --set steps=1500 --output-dir "$W/supervised" > "$W/second_trainer.log" 2>&1
RC2=$?
[ $RC2 -eq 1 ] && grep -q "in use by another kiln train (process $WORKER holds" "$W/second_trainer.log" \
  || { echo "a second trainer was not refused (exit $RC2)"; cat "$W/second_trainer.log"; exit 1; }
[ -n "$WORKER" ] && kill -KILL "$WORKER"
wait $SUP; RC=$?
[ $RC -eq 0 ] || { echo "supervised run exited $RC"; cat "$W/sup.log"; exit 1; }
grep -q "restart 1 of 2" "$W/sup.log" || { echo "worker was not restarted"; cat "$W/sup.log"; exit 1; }
extract "$W/supervised/metrics.jsonl" | uniq > "$W/c.txt"
[ "$(wc -l < "$W/c.txt")" -eq 1500 ] || { echo "recomputed steps logged different losses:"; awk '{print $1}' "$W/c.txt" | uniq -d | head; exit 1; }
[ "$(wc -l < "$W/supervised/metrics.jsonl")" -gt 1500 ] || { echo "no step was recomputed"; exit 1; }
echo "PASS: SIGKILL of the worker -> restarted by --max-restarts; recomputed steps bit-identical"
rm -rf "$W"
