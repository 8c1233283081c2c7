#!/bin/sh
# `kiln serve --grpc-port` as a process, talked to by a Python gRPC client whose stubs protoc and
# grpc_python_plugin generate here from proto/inference.proto (grpc_client_check.py): an MLP
# from a short `kiln train` run, exported at batch 2; its gRPC answers (typed and raw contents)
# must equal REST's and `kiln predict`'s; bad requests get INVALID_ARGUMENT / NOT_FOUND; then a
# SIGTERM with three gRPC requests queued answers all three and exits 0; a taken or invalid gRPC
# port is refused with the reason; the repository RPCs against `--model-repository`. Skipped (77) without
# /usr/bin/python3's grpc module or the code generators. Processes killed by PID.
# Usage: grpc_process_test.sh KILN EXAMPLE_YAML DIGITS_CSV_GZ SRC_ROOT OUT_DIR
set -eu
KILN=$1 YAML=$2 DIGITS=$3 SRC=$4 OUT=$5
PY=/usr/bin/python3
HERE=$(dirname "$0")
$PY -c 'import grpc, google.protobuf' 2> /dev/null || { echo "python3-grpcio missing: skipped"; exit 77; }
command -v protoc > /dev/null && command -v grpc_python_plugin > /dev/null ||
  { echo "protoc or grpc_python_plugin missing: skipped"; exit 77; }
rm -rf "$OUT" && mkdir -p "$OUT/py"
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2> /dev/null || true; }
trap cleanup EXIT

protoc --proto_path="$SRC" --python_out="$OUT/py" --grpc_out="$OUT/py" \
  --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" "$SRC/kiln/serve/proto/inference.proto"
"$KILN" train "$YAML" --set steps=4 --set schedule.warmup_steps=1 --set eval_every=0 \
  --set checkpoint_every=4 --output-dir "$OUT/run" > /dev/null
"$KILN" export "$OUT/run" --out "$OUT/art" --batch 2 > /dev/null
gzip -dc "$DIGITS" | head -5 | cut -d, -f1-64 > "$OUT/rows.csv"
"$KILN" predict "$OUT/art" --input "$OUT/rows.csv" > "$OUT/predict.csv"

# Starts `kiln serve` with extra flags (after $SOURCE, what it serves); sets PID, PORT and GPORT.
SOURCE="--model $OUT/art --name mlp"
start() {
  rm -f "$OUT/serve.out" "$OUT/serve.err"
  # shellcheck disable=SC2086
  "$KILN" serve $SOURCE --port 0 --grpc-port 0 --max-batch 8 \
    --preferred-batch 4,8 "$@" > "$OUT/serve.out" 2> "$OUT/serve.err" &
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
  GPORT=$(sed -n 's/.*gRPC listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$OUT/serve.out")
  [ -n "$GPORT" ] || { echo "no gRPC port printed:"; cat "$OUT/serve.out"; exit 1; }
}

start --max-queue-delay-us 2000
timeout 60 $PY "$HERE/grpc_client_check.py" "$OUT/py" "$GPORT" "$PORT" "$OUT"
# A gRPC port that is taken, or out of range: exit 1 with the reason.
if "$KILN" serve --model "$OUT/art" --port 0 --grpc-port "$GPORT" > /dev/null 2> "$OUT/taken.err"; then
  echo "a second kiln serve on gRPC port $GPORT started"; exit 1
fi
grep -q "gRPC: cannot listen on 127.0.0.1:$GPORT" "$OUT/taken.err" || { cat "$OUT/taken.err"; exit 1; }
if "$KILN" serve --model "$OUT/art" --grpc-port 70000 > /dev/null 2> "$OUT/range.err"; then exit 1; fi
grep -q -- "--grpc-port 70000 is outside -1..65535" "$OUT/range.err" || { cat "$OUT/range.err"; exit 1; }
kill -TERM "$PID"
timeout 20 sh -c "while kill -0 $PID 2> /dev/null; do sleep 0.1; done"
wait "$PID" || { echo "kiln serve exited $?"; exit 1; }
PID=

# Drain: a 20 s delay, nothing fills a batch; SIGTERM once the three gRPC requests are queued.
start --max-queue-delay-us 20000000
timeout 30 $PY "$HERE/grpc_client_check.py" "$OUT/py" "$GPORT" "$PORT" "$OUT" --drain "$PID"
timeout 10 sh -c "while kill -0 $PID 2> /dev/null; do sleep 0.1; done" ||
  { echo "kiln serve did not exit within 10 s of SIGTERM"; exit 1; }
RC=0
wait "$PID" || RC=$?
PID=
[ $RC -eq 0 ] || { echo "kiln serve exited $RC after SIGTERM"; cat "$OUT/serve.err"; exit 1; }
grep -q 'stopped' "$OUT/serve.out"

# The repository RPCs: `kiln serve --model-repository` with mlp/1 (the artifact) and broken/1
# (empty); the client adds version 2, breaks version 3, reloads and unloads over gRPC.
mkdir -p "$OUT/repo/mlp" "$OUT/repo/broken/1"
cp -r "$OUT/art" "$OUT/repo/mlp/1"
SOURCE="--model-repository $OUT/repo"
start --max-queue-delay-us 2000
timeout 120 $PY "$HERE/grpc_client_check.py" "$OUT/py" "$GPORT" "$PORT" "$OUT" --repository "$OUT/repo"
kill -TERM "$PID"
RC=0
wait "$PID" || RC=$?
PID=
[ $RC -eq 0 ] || { echo "kiln serve --model-repository exited $RC after SIGTERM"; cat "$OUT/serve.err"; exit 1; }
