#!/bin/sh
# A real Prometheus server scrapes `kiln serve` (CTest; docs/serving.md "Metrics"): an MLP from a
# short `kiln train` of examples/mlp_digits.yaml is exported and served; after 20 inference
# requests, `promtool check metrics` must find /metrics clean, and Prometheus (Debian's, on a
# private loopback port with its own data folder; ../shared/reference/console.md §1), scraping
# every second, must answer a p99 latency from the histogram with histogram_quantile, and count
# the 20 successful requests. Both servers are stopped by PID (SIGTERM; kiln serve must exit 0).
# usage: serve_prometheus_test.sh KILN EXAMPLE_YAML DIGITS_CSV_GZ OUT_DIR
# Exits 77 (CTest SKIP_RETURN_CODE) without prometheus, promtool or curl.
set -u
KILN=$1 YAML=$2 DIGITS=$3 OUT=$4
for b in prometheus promtool curl python3; do
  command -v "$b" >/dev/null 2>&1 || { echo "prometheus test: $b not found: skipped"; exit 77; }
done
rm -rf "$OUT" && mkdir -p "$OUT" || exit 1
SERVE= PROM=
stop() {
  [ -n "$PROM" ] && kill -TERM "$PROM" 2>/dev/null && wait "$PROM" 2>/dev/null
  [ -n "$SERVE" ] && kill -9 "$SERVE" 2>/dev/null
  return 0
}
trap stop EXIT
trap 'exit 1' INT TERM
fail() {
  echo "prometheus test: FAILED: $*"
  exit 1
}
"$KILN" train "$YAML" --set steps=4 --set schedule.warmup_steps=1 --set eval_every=0 \
  --set checkpoint_every=4 --output-dir "$OUT/run" >/dev/null || fail "kiln train"
"$KILN" export "$OUT/run" --out "$OUT/art" --batch 2 >/dev/null || fail "kiln export"
"$KILN" serve --model "$OUT/art" --name mlp --port 0 --max-batch 8 --preferred-batch 4,8 \
  --max-queue-delay-us 1000 >"$OUT/serve.out" 2>"$OUT/serve.err" &
SERVE=$!
i=0
until grep -q 'ready$' "$OUT/serve.out" 2>/dev/null; do
  i=$((i + 1))
  if [ $i -gt 300 ] || ! kill -0 "$SERVE" 2>/dev/null; then
    cat "$OUT/serve.out" "$OUT/serve.err"
    fail "kiln serve did not start"
  fi
  sleep 0.1
done
PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$OUT/serve.out")
[ -n "$PORT" ] || fail "no port in kiln serve's startup lines"
gzip -dc "$DIGITS" | head -20 | cut -d, -f1-64 >"$OUT/rows.csv"
n=0
while read -r row; do
  n=$((n + 1))
  printf '{"id":"r%d","inputs":[{"name":"x","shape":[1,64],"datatype":"FP32","data":[%s]}]}' \
    "$n" "$row" >"$OUT/req.json"
  timeout 20 curl -sf -X POST "http://127.0.0.1:$PORT/v2/models/mlp/infer" \
    -H 'Content-Type: application/json' --data-binary "@$OUT/req.json" >/dev/null ||
    fail "inference request $n"
done <"$OUT/rows.csv"
timeout 20 curl -sf "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt" || fail "GET /metrics"
promtool check metrics <"$OUT/metrics.txt" || fail "promtool check metrics found problems"
echo "/metrics passes promtool check metrics"

PROM_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$OUT/prometheus.yml" <<YML
global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: kiln
    static_configs: [{targets: ['127.0.0.1:$PORT']}]
YML
prometheus --config.file="$OUT/prometheus.yml" --storage.tsdb.path="$OUT/prom-data" \
  --web.listen-address="127.0.0.1:$PROM_PORT" --storage.tsdb.retention.time=1h \
  --log.level=warn >"$OUT/prometheus.log" 2>&1 &
PROM=$!
api="http://127.0.0.1:$PROM_PORT"
# query EXPR: the first result's value ("" while there is none).
query() {
  curl -sf --get "$api/api/v1/query" --data-urlencode "query=$1" 2>/dev/null | python3 -c '
import json, sys
try:
    r = json.load(sys.stdin)["data"]["result"]
    print(r[0]["value"][1] if r else "")
except Exception:
    print("")'
}
# Prometheus 2.42 applies its targets on a 5 s tick: the first scrape comes 6-7 s after start.
i=0
until [ "$(query 'up{job="kiln"} == 1')" = "1" ]; do
  i=$((i + 1))
  [ $i -le 300 ] || { cat "$OUT/prometheus.log"; fail "Prometheus did not scrape kiln serve in 30 s"; }
  sleep 0.1
done
ok=$(query 'sum(kiln_inference_requests_total{job="kiln",outcome="success"})')
[ "$ok" = "20" ] || fail "Prometheus counts $ok successful requests, not 20"
p99=$(query 'histogram_quantile(0.99, sum by (le) (kiln_inference_request_duration_seconds_bucket{job="kiln"}))')
python3 -c "import math, sys; v = float('$p99' or 'nan'); sys.exit(0 if math.isfinite(v) and v > 0 else 1)" ||
  fail "histogram_quantile gave '$p99' for the request latency"
echo "Prometheus scraped kiln serve: 20 successful requests, p99 request latency $p99 s"
kill -TERM "$SERVE"
rc=0
timeout 20 sh -c "while kill -0 $SERVE 2>/dev/null; do sleep 0.1; done"
wait "$SERVE" || rc=$?
SERVE=
[ "$rc" -eq 0 ] || fail "kiln serve exited $rc after SIGTERM"
echo "prometheus test: PASS"
