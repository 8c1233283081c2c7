#!/bin/sh
# `kiln quantize` end to end (registered in CTest as kiln_quantize_export): a short MLP run,
# `kiln export`, `kiln quantize` within a budget (the report's fields checked), `kiln predict` on
# the int8 artifact, and the gate refusing an impossible budget with nothing written.
# usage: quantize_e2e_test.sh KILN CONFIG DIGITS WORKDIR
set -u
KILN=$1; CONFIG=$2; DIGITS=$3; W=$4
rm -rf "$W"; mkdir -p "$W"
fail() { echo "FAIL: $*"; exit 1; }

"$KILN" train "$CONFIG" --set steps=150 --set eval_every=0 --set checkpoint_every=150 \
  --output-dir "$W/run" > "$W/train.log" 2>&1 || { cat "$W/train.log"; fail "train"; }
"$KILN" export "$W/run" --out "$W/art" --batch 16 > "$W/export.log" 2>&1 \
  || { cat "$W/export.log"; fail "export"; }
"$KILN" quantize "$W/art" --calibration "$DIGITS" --input-scale 0.0625 --out "$W/int8" \
  --budget 2 --latency-runs 5 > "$W/quantize.txt" 2>&1 || { cat "$W/quantize.txt"; fail "quantize"; }
cat "$W/quantize.txt"
grep -q '^accuracy: f32 ' "$W/quantize.txt" || fail "no accuracy line"
grep -q '^latency at batch 16 ' "$W/quantize.txt" || fail "no latency line"
R="$W/int8/quantize.json"
test -s "$R" || fail "no quantize.json"
for key in '"metric": "accuracy"' '"accepted": true' '"budget": 2.0' '"method": "minmax"' \
           '"f32_median"' '"int8_median"' '"f32_over_int8"' '"weight_bytes"' \
           '"weight_scales"' '"activation_scale"' '"calibration_examples": 512' \
           '"eval_examples": 1285' '"op": "dot_general"'; do
  grep -q "$key" "$R" || fail "quantize.json lacks $key"
done
test "$(grep -c '"op": "dot_general"' "$R")" -eq 3 || fail "expected 3 quantized layers"
grep -q 'quantized_dot' "$W/int8/program.ir" || fail "no quantized_dot in program.ir"

gzip -dc "$DIGITS" | head -20 | cut -d, -f1-64 > "$W/rows.csv"
"$KILN" predict "$W/int8" --input "$W/rows.csv" > "$W/out.csv" 2> "$W/predict.err" \
  || { cat "$W/predict.err"; fail "predict"; }
test "$(wc -l < "$W/out.csv")" -eq 21 || fail "predict printed $(wc -l < "$W/out.csv") lines"

if "$KILN" quantize "$W/art" --calibration "$DIGITS" --input-scale 0.0625 --out "$W/refused" \
     --budget -1 --latency-runs 2 > "$W/refused.txt" 2> "$W/refused.err"; then
  fail "a budget of -1 was accepted"
fi
grep -q 'refused: the accuracy drop of' "$W/refused.err" || { cat "$W/refused.err"; fail "message"; }
test ! -e "$W/refused" || fail "a refused quantize wrote $W/refused"
echo "kiln_quantize_export: ok"
