#!/bin/sh
# The recommender refresh end to end at small sizes (registered in CTest as
# kiln_recommender_refresh; docs/workloads.md "3. Recommender refresh"): generate day 1 and day 2
# click logs, train day 1, warm start day 2 from it with --init-from and train day 2 from scratch
# on the same budget. Checks: the day-1 model's AUC is well above chance; the warm run's step-0
# evaluation equals `kiln eval` of the day-1 model on the day-2 data (it really loaded those
# weights); and the warm run ends above the scratch run.
# usage: recommender_refresh_test.sh KILN CONFIG WORKDIR
set -u
KILN=$1; CONFIG=$2; W=$3
rm -rf "$W"; mkdir -p "$W"
fail() { echo "FAIL: $*"; exit 1; }
# "auc 0.1234" -> 0.1234 from the last line of $1 that has it.
auc() { grep -o 'auc [0-9.]*' "$1" | tail -1 | cut -d' ' -f2; }

SIZES="--users 60 --items 80 --events 30000 --seed 3 --quiet"
"$KILN" data generate clicks --out "$W/day1" --day 1 $SIZES > "$W/gen1.txt" || fail "generate day 1"
"$KILN" data generate clicks --out "$W/day2" --day 2 $SIZES > "$W/gen2.txt" || fail "generate day 2"
cat "$W/gen1.txt" "$W/gen2.txt"
grep -q 'Bayes-optimal on held_out' "$W/gen2.txt" || fail "no Bayes line"
grep -q '"bayes"' "$W/day2/dataset.json" || fail "no bayes record in dataset.json"

COMMON="--set model.tables=[60,80] --set data.batch_size=128 --set eval_every=0 --set checkpoint_every=0 --set log_every=100"
"$KILN" train "$CONFIG" --set data.source="dataset:$W/day1" --output-dir "$W/run1" $COMMON \
  --set steps=600 --set schedule.warmup_steps=20 > "$W/train1.log" 2>&1 \
  || { cat "$W/train1.log"; fail "train day 1"; }
A1=$(auc "$W/train1.log")
echo "day 1: auc $A1"
awk -v a="$A1" 'BEGIN { exit !(a > 0.65) }' || fail "day-1 auc $A1 is not well above 0.5"

"$KILN" eval "$W/run1" --set data.source="dataset:$W/day2" > "$W/eval12.txt" 2> /dev/null \
  || fail "eval day 1 on day 2"
A12=$(auc "$W/eval12.txt")

"$KILN" train "$CONFIG" --set data.source="dataset:$W/day2" --output-dir "$W/warm" $COMMON \
  --set steps=100 --set schedule.warmup_steps=10 --init-from "$W/run1" > "$W/warm.log" 2>&1 \
  || { cat "$W/warm.log"; fail "warm start"; }
"$KILN" train "$CONFIG" --set data.source="dataset:$W/day2" --output-dir "$W/scratch" $COMMON \
  --set steps=100 --set schedule.warmup_steps=10 > "$W/scratch.log" 2>&1 \
  || { cat "$W/scratch.log"; fail "scratch"; }
grep 'init_from' "$W/warm.log"
grep -q 'init_from: loaded 12 tensors' "$W/warm.log" || fail "init_from did not load 12 tensors"
A0=$(grep 'init_from: eval at step 0' "$W/warm.log" | grep -o 'auc [0-9.]*' | cut -d' ' -f2)
test -n "$A0" || fail "no step-0 evaluation in the warm run"
test "$A0" = "$A12" || fail "warm step-0 auc $A0 != day-1 model on day 2 $A12"
grep -q '"step":0,.*"eval/auc"' "$W/warm/metrics.jsonl" || fail "no step-0 eval/auc in metrics.jsonl"
grep -q '"init_from"' "$W/warm/run.json" || fail "no init_from in run.json"
AW=$(auc "$W/warm.log"); AS=$(auc "$W/scratch.log")
echo "day 2: day-1 model $A12, warm start $AW, from scratch $AS (100 steps each)"
awk -v w="$AW" -v s="$AS" 'BEGIN { exit !(w > s + 0.02) }' || fail "warm $AW is not above scratch $AS"
echo PASS
