#!/bin/sh
# `kiln serve` applies an artifact's input normalization: a ViT from a 2-step `kiln train` run of
# examples/vit_pretrain.yaml (data.augment.normalize set), exported at batch 2, served; its
# answers over HTTP to raw digits rows must equal `kiln predict` on the same rows (which
# normalizes them) and differ from `kiln predict --no-normalize`. Bounded by timeouts; the server
# killed by PID. Usage: serve_normalization_test.sh KILN VIT_YAML DIGITS_CSV_GZ OUT_DIR
set -eu
KILN=$1 YAML=$2 DIGITS=$3 OUT=$4
rm -rf "$OUT" && mkdir -p "$OUT"
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2> /dev/null || true; }
trap cleanup EXIT

"$KILN" train "$YAML" --set steps=2 --set schedule.warmup_steps=1 --set eval_every=0 \
  --set checkpoint_every=2 --output-dir "$OUT/run" > /dev/null
"$KILN" export "$OUT/run" --out "$OUT/art" --batch 2 > /dev/null
grep -q 'input_normalization' "$OUT/art/manifest.json"
gzip -dc "$DIGITS" | head -3 | cut -d, -f1-64 > "$OUT/rows.csv"
"$KILN" predict "$OUT/art" --input "$OUT/rows.csv" > "$OUT/predict.csv"
"$KILN" predict "$OUT/art" --input "$OUT/rows.csv" --no-normalize > "$OUT/raw.csv"

"$KILN" serve --model "$OUT/art" --name vit --port 0 --max-batch 4 --preferred-batch 4 \
  --max-queue-delay-us 1000 > "$OUT/serve.out" 2> "$OUT/serve.err" &
PID=$!
i=0
until grep -q 'ready$' "$OUT/serve.out" 2> /dev/null; do
  i=$((i + 1))
  if [ $i -gt 600 ] || ! kill -0 "$PID" 2> /dev/null; then
    echo "kiln serve did not start:"; cat "$OUT/serve.out" "$OUT/serve.err"; exit 1
  fi
  sleep 0.1
done
grep -q 'inputs normalized as in training' "$OUT/serve.out" ||
  { echo "the startup line does not say the inputs are normalized:"; cat "$OUT/serve.out"; exit 1; }
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$OUT/serve.out")

timeout 60 python3 - "$OUT" "$PORT" << 'PY'
import csv, json, sys, urllib.request
out, port = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}/v2/models/vit"
meta = json.load(urllib.request.urlopen(base, timeout=20))
x = meta["inputs"][0]
rows = [[float(v) for v in r] for r in csv.reader(open(out + "/rows.csv"))]
want = [[float(v) for v in r[:10]] for r in list(csv.reader(open(out + "/predict.csv")))[1:]]
raw = [[float(v) for v in r[:10]] for r in list(csv.reader(open(out + "/raw.csv")))[1:]]
def close(a, b):
    return all(abs(g - w) <= 1e-4 * (1 + abs(w)) for g, w in zip(a, b))
differs = False
for r, row in enumerate(rows):
    body = {"inputs": [{"name": x["name"], "datatype": "FP32", "shape": [1] + x["shape"][1:],
                        "data": row}]}
    req = urllib.request.Request(base + "/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    logits = json.load(urllib.request.urlopen(req, timeout=20))["outputs"][0]["data"][:10]
    assert close(logits, want[r]), ("row", r, logits, "kiln predict:", want[r])
    differs |= not close(logits, raw[r])
assert differs, "served logits equal kiln predict --no-normalize's: not normalized"
print(f"served logits equal kiln predict's (normalized) on {len(rows)} raw rows")
PY
kill -TERM "$PID"
timeout 20 sh -c "while kill -0 $PID 2> /dev/null; do sleep 0.1; done"
wait "$PID" || { echo "kiln serve exited $?"; exit 1; }
PID=
