#!/bin/sh
# SIGKILL during `kiln data import images`, then the same command again: the result must be
# byte-identical to an uninterrupted import (every shard and dataset.json), and the rerun must keep
# the shards the killed run finished. The kill lands once the first shard has been renamed into
# place (polled every 10 ms), so it hits a run in progress.
#   import_sigkill_test.sh KILN CHECK_DATASET_PY WORKDIR
set -u
kiln=$1 check=$2 work=$3
command -v python3 > /dev/null || exit 77
rm -rf "$work" && mkdir -p "$work" || exit 1
python3 "$check" --make-pngs "$work/src" 160 120 40 || exit 1
args="--size 24x24 --shards 12 --held-out 0.1 --threads 1 --quiet"
"$kiln" data import images "$work/src" --out "$work/whole" $args > /dev/null || exit 1

"$kiln" data import images "$work/src" --out "$work/killed" $args > /dev/null 2>&1 &
pid=$!
i=0
while [ ! -f "$work/killed/train-00000-of-00012.tfrecord" ] && [ $i -lt 1000 ]; do
  sleep 0.01; i=$((i + 1))
done
kill -9 $pid 2> /dev/null
wait $pid 2> /dev/null
if [ -f "$work/killed/dataset.json" ]; then
  echo "note: the import finished before the kill landed; checking the rerun only"
else
  echo "killed mid-import: $(ls "$work/killed" | grep -c 'tfrecord$') shards finished"
fi
out=$("$kiln" data import images "$work/src" --out "$work/killed" $args) || exit 1
echo "$out"
for f in $(cd "$work/whole" && ls); do
  cmp "$work/whole/$f" "$work/killed/$f" || { echo "FAIL: $f differs after resume"; exit 1; }
done
[ "$(ls "$work/whole" | wc -l)" -eq "$(ls "$work/killed" | wc -l)" ] || { echo "FAIL: file sets differ"; exit 1; }
ls -a "$work/killed" | grep -q partial && { echo "FAIL: a partial shard is left"; exit 1; }
"$kiln" data inspect "$work/killed" > /dev/null || exit 1
echo "resumed import is byte-identical to the uninterrupted one"
