#!/bin/sh
# `kiln serve` as a process: an MLP from a short `kiln train` run of examples/mlp_digits.yaml,
# exported at batch 2, served with batch sizes 4 and 8; its answers over HTTP must equal
# `kiln predict` on the same rows; then SIGTERM while requests wait in the queue: every one of
# them is answered 200 and the server exits 0. Bounded by timeouts; processes killed by PID.
# Usage: serve_process_test.sh KILN EXAMPLE_YAML DIGITS_CSV_GZ OUT_DIR
set -eu
KILN=$1 YAML=$2 DIGITS=$3 OUT=$4
command -v curl > /dev/null || { echo "curl not installed: skipped"; exit 77; }
rm -rf "$OUT" && mkdir -p "$OUT"
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2> /dev/null || true; }
trap cleanup EXIT

"$KILN" train "$YAML" --set steps=4 --set schedule.warmup_steps=1 --set eval_every=0 \
  --set checkpoint_every=4 --output-dir "$OUT/run" > /dev/null
"$KILN" export "$OUT/run" --out "$OUT/art" --batch 2 > /dev/null
gzip -dc "$DIGITS" | head -5 | cut -d, -f1-64 > "$OUT/rows.csv"
"$KILN" predict "$OUT/art" --input "$OUT/rows.csv" > "$OUT/predict.csv"

# Starts `kiln serve` with extra flags; sets PID and PORT.
start() {
  rm -f "$OUT/serve.out" "$OUT/serve.err"  # else the previous server's lines could match below
  "$KILN" serve --model "$OUT/art" --name mlp --port 0 --max-batch 8 --preferred-batch 4,8 "$@" \
    > "$OUT/serve.out" 2> "$OUT/serve.err" &
  PID=$!
  i=0
  until grep -q 'ready$' "$OUT/serve.out" 2> /dev/null; do
    i=$((i + 1))
    if [ $i -gt 300 ] || ! kill -0 "$PID" 2> /dev/null; then
      echo "kiln serve did not start:"; cat "$OUT/serve.out" "$OUT/serve.err"; exit 1
    fi
    sleep 0.1
  done
  PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$OUT/serve.out")
}

request() {  # row number (1-based) -> JSON body
  sed -n "${1}p" "$OUT/rows.csv" |
    awk '{print "{\"id\":\"row'"$1"'\",\"inputs\":[{\"name\":\"x\",\"shape\":[1,64],\"datatype\":\"FP32\",\"data\":[" $0 "]}]}"}'
}

start --max-queue-delay-us 2000
for r in 1 2 3 4 5; do
  request $r > "$OUT/req$r.json"
  timeout 20 curl -sf -X POST "http://127.0.0.1:$PORT/v2/models/mlp/infer" \
    -H 'Content-Type: application/json' --data-binary "@$OUT/req$r.json" > "$OUT/resp$r.json"
done
python3 - "$OUT" << 'PY'
import csv, json, sys
out = sys.argv[1]
rows = list(csv.reader(open(out + "/predict.csv")))[1:]
for r in range(5):
    resp = json.load(open(f"{out}/resp{r + 1}.json"))
    assert resp["id"] == f"row{r + 1}", resp
    logits = resp["outputs"][0]["data"]
    want = [float(v) for v in rows[r][:10]]
    for g, w in zip(logits, want):
        assert abs(g - w) <= 1e-4 * (1 + abs(w)), (r, logits, want)
    assert resp["outputs"][1]["data"][0] == int(rows[r][10]), (resp, rows[r])
print("served logits equal kiln predict's on 5 rows")
PY
kill -TERM "$PID"
timeout 20 sh -c "while kill -0 $PID 2> /dev/null; do sleep 0.1; done"
wait "$PID" || { echo "kiln serve exited $?"; exit 1; }
PID=

# Drain: three requests wait for a batch (a 20 s delay, nothing fills one); SIGTERM arrives once
# /metrics shows all three queued, and the drain must send them at once.
start --max-queue-delay-us 20000000
for r in 1 2 3; do
  (timeout 20 curl -s -o "$OUT/drain$r.json" -w '%{http_code}' -X POST \
    "http://127.0.0.1:$PORT/v2/models/mlp/infer" --data-binary "@$OUT/req$r.json" \
    > "$OUT/drain$r.code") &
done
i=0
until timeout 5 curl -s "http://127.0.0.1:$PORT/metrics" |
    grep -q 'kiln_inference_queue_depth{model="mlp",version="1"} 3'; do
  i=$((i + 1))
  if [ $i -gt 200 ]; then
    echo "the 3 requests never showed as queued:"
    timeout 5 curl -s "http://127.0.0.1:$PORT/metrics" | grep -E 'queue_depth|requests_total|http'
    cat "$OUT"/drain*.code "$OUT/serve.out" "$OUT/serve.err"
    exit 1
  fi
  sleep 0.05
done
kill -TERM "$PID"
timeout 10 sh -c "while kill -0 $PID 2> /dev/null; do sleep 0.1; done" ||
  { echo "kiln serve did not exit within 10 s of SIGTERM (the queue was not flushed)"; exit 1; }
RC=0
wait "$PID" || RC=$?
PID=
wait
for r in 1 2 3; do
  [ "$(cat "$OUT/drain$r.code")" = 200 ] || { echo "request $r during drain: $(cat "$OUT/drain$r.code")"; exit 1; }
done
[ $RC -eq 0 ] || { echo "kiln serve exited $RC after SIGTERM"; cat "$OUT/serve.err"; exit 1; }
grep -q 'SIGTERM: draining' "$OUT/serve.out"
grep -q 'stopped' "$OUT/serve.out"
echo "SIGTERM drained 3 queued requests (all 200) and exited 0"
