#!/bin/sh
# `kiln predict --input-dir` on DICOM studies (docs/cli.md "Bulk DICOM classification"): a CNN
# trained for a few steps on an import of four pydicom test files (CT and MR), then a folder of
# studies with a truncated DICOM and a text file. Checks: one result line per study (JSON lines
# and CSV), the two failures listed by name with the reason (never dropped), the report, the exit
# codes (3: failures; 5: failures and a missed deadline), the error for a dataset of another
# size. Skipped (77) without Debian's pydicom test files or a kiln built with GDCM.
#   predict_dicom_test.sh KILN OUT_DIR
set -eu
kiln=$1
out=$2
d=/usr/lib/python3/dist-packages/pydicom/data/test_files
[ -f "$d/CT_small.dcm" ] && [ -f "$d/MR_small.dcm" ] || exit 77
rm -rf "$out"
mkdir -p "$out/train" "$out/studies/sub"
cp "$d/CT_small.dcm" "$d/MR_small.dcm" "$d/MR_small_RLE.dcm" "$d/MR_small_implicit.dcm" "$out/train/"
cp "$d/CT_small.dcm" "$d/MR_small_bigendian.dcm" "$out/studies/"
cp "$d/MR_small_expb.dcm" "$out/studies/sub/"
head -c 3000 "$d/CT_small.dcm" > "$out/studies/truncated.dcm"
echo "not a DICOM file" > "$out/studies/notes.txt"
if ! "$kiln" data import dicom "$out/train" --out "$out/ds" --size 16x16 --held-out 0.25 --shards 1 --quiet > "$out/import.log" 2>&1; then
  grep -q "built without" "$out/import.log" && exit 77
  cat "$out/import.log"; exit 1
fi
cat > "$out/cnn.yaml" <<YAML
model: {kind: cnn, channels: 1, height: 16, width: 16, widths: [4], blocks_per_stage: 1}
data: {source: dataset:$out/ds, batch_size: 1, seed: 0}
optimizer: {kind: adamw, lr: 0.01}
schedule: {kind: constant, warmup_steps: 0}
steps: 4
eval_every: 0
checkpoint_every: 4
log_every: 2
output_dir: $out/run
YAML
"$kiln" train "$out/cnn.yaml" > "$out/train.log" 2>&1 || { cat "$out/train.log"; exit 1; }

rc=0
"$kiln" predict "$out/run" --input-dir "$out/studies" --out "$out/r.jsonl" --batch 2 --threads 2 \
  > "$out/report" 2> "$out/progress" || rc=$?
[ "$rc" -eq 3 ] || { echo "exit $rc, expected 3"; cat "$out/report" "$out/progress"; exit 1; }
[ "$(wc -l < "$out/r.jsonl")" -eq 5 ] || { cat "$out/r.jsonl"; exit 1; }
grep -q '^{"path":"CT_small.dcm","label":"\(CT\|MR\)","probabilities":{"CT":[0-9.e-]*,"MR":[0-9.e-]*}}$' "$out/r.jsonl"
grep -q '^{"path":"sub/MR_small_expb.dcm","label":' "$out/r.jsonl"
grep -q '^{"path":"truncated.dcm","error":"truncated.dcm: ' "$out/r.jsonl"
grep -q '^{"path":"notes.txt","error":"notes.txt: ' "$out/r.jsonl"
grep -q '^classified 3 of 5 studies in ' "$out/report"
grep -q '^2 studies failed to decode' "$out/report"
grep -q '^  truncated.dcm: GDCM aborted decoding it (signal 6' "$out/report"
grep -q '^  notes.txt: GDCM cannot read' "$out/report"
grep -q '^predict: 5/5 studies (100.0%)' "$out/progress"
[ ! -e "$out/r.jsonl.partial" ]
# The probabilities of each classified study sum to 1.
python3 - "$out/r.jsonl" <<'PY' || exit 1
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "probabilities" in r:
        assert abs(sum(r["probabilities"].values()) - 1) < 1e-4, r
        assert r["label"] == max(r["probabilities"], key=r["probabilities"].get), r
PY

rc=0
"$kiln" predict "$out/run" --input-dir "$out/studies" --out "$out/r.csv" --deadline 0.001s --quiet \
  > "$out/report2" 2>&1 || rc=$?
[ "$rc" -eq 5 ] || { echo "exit $rc, expected 5"; cat "$out/report2"; exit 1; }
head -1 "$out/r.csv" | grep -qx 'path,label,p_CT,p_MR,error'
[ "$(wc -l < "$out/r.csv")" -eq 6 ]
grep -q '^truncated.dcm,,,,"truncated.dcm: GDCM ' "$out/r.csv"
grep -q '^deadline 0.001s: MISSED' "$out/report2"

# All studies decode: exit 0 and the deadline met.
mkdir -p "$out/good"
cp "$d/CT_small.dcm" "$d/MR_small.dcm" "$out/good/"
"$kiln" predict "$out/run" --input-dir "$out/good" --out "$out/g.jsonl" --deadline 10m --quiet > "$out/report3"
grep -q '^deadline 10m: met' "$out/report3"

# The same studies through an exported artifact (its own batch size, --dataset given): the same
# labels and probabilities as the run directory gave.
"$kiln" export "$out/run" --out "$out/art" --batch 3 > /dev/null
rc=0
"$kiln" predict "$out/art" --dataset "$out/ds" --input-dir "$out/studies" --out "$out/a.jsonl" --quiet \
  > /dev/null 2>&1 || rc=$?
[ "$rc" -eq 3 ] || { echo "artifact: exit $rc, expected 3"; exit 1; }
python3 - "$out/r.jsonl" "$out/a.jsonl" <<'PY' || exit 1
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["path"] for r in a] == [r["path"] for r in b]
for x, y in zip(a, b):
    assert x.get("label") == y.get("label"), (x, y)
    for k, v in x.get("probabilities", {}).items():
        assert abs(v - y["probabilities"][k]) < 1e-4, (x, y)
PY
"$kiln" predict "$out/art" --input-dir "$out/good" --out "$out/x.jsonl" > /dev/null 2> "$out/err" && exit 1
grep -q 'needs --dataset DIR' "$out/err"

# A dataset of another size than the model: an error naming both.
"$kiln" data import dicom "$out/train" --out "$out/ds32" --size 32x32 --held-out 0 --shards 1 --quiet > /dev/null 2>&1
rc=0
"$kiln" predict "$out/run" --dataset "$out/ds32" --input-dir "$out/good" --out "$out/x.jsonl" > /dev/null 2> "$out/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q 'the model takes 256 features .* 32x32x1 = 1024 pixels' "$out/err"
echo OK
