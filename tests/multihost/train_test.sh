#!/bin/sh
# `kiln train --workers 2 --hostfile` over two "hosts" (network namespaces, lab.sh) against one
# process, then the two faults of ../shared/reference/multihost.md §2d (CTest, label multihost;
# docs/distributed.md "Multi-host tests"):
#   1. the loss at every step within 1e-4 relative of the one-process run, and run.json naming
#      the two hosts its ranks ran on; then one process restarts that run from its checkpoint
#      (another mesh) and continues it, tracking the one-process run;
#   2. host n2 dies (SIGKILL of everything in its namespace) mid-run of the GPT example: the job
#      ends non-zero within LIMIT_S, and rerunning the same command resumes from the last
#      checkpoint and logs the same losses, bit for bit, as an uninterrupted two-host run;
#   3. n2's link goes down (a partition: OpenMPI never notices one): rank 0's collective times
#      out after --collective-timeout and it reports and aborts; mpirun, which cannot reach n2's
#      daemon, ends the job at its --job-timeout; nothing outlives the test.
# usage: train_test.sh KILN CONFIG OUTDIR STEPS LIMIT_S
# Exits 77 (CTest SKIP_RETURN_CODE) without root, netns support or mpirun. Every run is bounded
# by timeout(1) and mpirun's --job-timeout; everything started inside the namespaces is killed
# by PID (lab_down) on every exit path.
set -u
# One lab at a time on this machine (the subnet, bridge address and Slurm ports are fixed): a
# second run waits for the first (several build folders' test suites may run at once).
exec 9>/tmp/kiln-multihost.lock
flock -w 600 9 || { echo "multihost: another multihost test held the lock for 600 s"; exit 1; }
kiln=$1 config=$2 out=$3 steps=$4 limit=$5
here=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null 2>&1 || { echo "multihost: mpirun not found: skipped"; exit 77; }
. "$here/lab.sh"
KILN_LAB_PREFIX=kmh
export KILN_LAB_PREFIX
trap 'lab_down 2' EXIT
trap 'exit 1' INT TERM
lab_up 2 || { echo "multihost: no namespace lab here: skipped"; exit 77; }
rm -rf "$out" && mkdir -p "$out" || exit 1
printf 'n1 slots=1\nn2 slots=1\n' >"$out/hostfile"
# mpirun (in the root namespace, reached by its orteds on the bridge address) starts one orted
# and rank per namespace through netns_rsh; MPI traffic stays on the test subnet.
export OMPI_MCA_plm_rsh_agent="$here/netns_rsh"
export OMPI_MCA_btl=self,tcp
export OMPI_MCA_btl_tcp_if_include=10.247.2.0/24
export OMPI_MCA_oob_tcp_if_include=10.247.2.0/24
common="--set steps=$steps --set log_every=1 --set eval_every=0"
fail() {
  echo "multihost: FAILED: $*"
  exit 1
}
losses() {  # "step loss" per line of metrics.jsonl (%.17g: text equality is bit equality)
  sed -n 's/.*"step":\([0-9]*\),.*"loss":\([^,}]*\).*/\1 \2/p' "$1/metrics.jsonl"
}
# train NAME [flags...]: a bounded run; sets rc and the seconds it took.
train() {
  name=$1
  shift
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 5 "$limit" "$kiln" train "$config" $common "$@" --output-dir "$out/$name" \
    >>"$out/$name.log" 2>&1
  rc=$?
  took=$(($(date +%s) - t0))
}
hosts="--workers 2 --hostfile $out/hostfile"
bounded="--job-timeout $((limit - 5))"

# 1. Two hosts against one process.
train one --set checkpoint_every=0
[ "$rc" -eq 0 ] || { cat "$out/one.log"; fail "the one-process run exited $rc"; }
# shellcheck disable=SC2086
train two $hosts $bounded --set checkpoint_every=10
[ "$rc" -eq 0 ] || { cat "$out/two.log"; fail "the two-host run exited $rc"; }
losses "$out/one" >"$out/one.loss"
losses "$out/two" >"$out/two.loss"
[ "$(wc -l <"$out/two.loss")" -eq "$steps" ] || fail "expected $steps losses from the two-host run"
paste "$out/one.loss" "$out/two.loss" | awk -v steps="$steps" '
  { if ($1 != $3) { print "step mismatch: " $0; bad = 1; exit }
    d = $2 - $4; if (d < 0) d = -d; a = $2; if (a < 0) a = -a; r = d / a
    if (r > worst) { worst = r; at = $1 } }
  END { if (bad) exit 1
        printf "two hosts vs one process over %d steps: largest relative loss difference %.3g (step %d)\n", steps, worst, at
        if (worst > 1e-4) exit 1 }' || fail "losses differ by more than 1e-4"
for h in n1 n2; do
  grep -q "\"$h\"" "$out/two/run.json" || fail "run.json does not name host $h"
done
echo "run.json names hosts n1 and n2"

# Restart onto another mesh: one process continues the two-host run from its last checkpoint
# (data-parallel state is whole on rank 0) and tracks the one-process run continued the same way.
more=$((steps + 10))
train one --set checkpoint_every=0 --set steps=$more
[ "$rc" -eq 0 ] || { tail -20 "$out/one.log"; fail "continuing the one-process run exited $rc"; }
train two --set checkpoint_every=10 --set steps=$more
[ "$rc" -eq 0 ] || { tail -20 "$out/two.log"; fail "one process continuing the two-host run exited $rc"; }
grep -q "resum" "$out/two.log" || fail "one process did not resume the two-host run"
losses "$out/one" | awk -v s="$steps" '$1 > s' >"$out/one.more"
losses "$out/two" | awk -v s="$steps" '$1 > s' >"$out/two.more"
[ "$(wc -l <"$out/two.more")" -eq 10 ] || fail "the restart onto one process did not log steps $((steps + 1))..$more"
paste "$out/one.more" "$out/two.more" | awk '{ d = $2 - $4; if (d < 0) d = -d; a = $2; if (a < 0) a = -a
    if (d / a > worst) worst = d / a }
  END { printf "restart of the two-host run in one process: steps continue, largest relative difference %.3g\n", worst
        if (worst > 1e-4) exit 1 }' || fail "the restarted run's losses differ by more than 1e-4"

# 2. Host n2 dies after the first checkpoint; the rerun resumes and matches an uninterrupted
# two-host run bit for bit. The GPT example, 100 steps: long enough for the kill to land mid-run
# (the MLP's 30 steps can finish first on a quiet machine).
gpt=$(dirname "$config")/gpt_text.yaml
kill_flags="--set steps=100 --set log_every=1 --set eval_every=0 --set checkpoint_every=10"
# shellcheck disable=SC2086
timeout -k 5 "$limit" "$kiln" train "$gpt" $kill_flags $hosts $bounded --output-dir "$out/ref" \
  >"$out/ref.log" 2>&1 || { tail -20 "$out/ref.log"; fail "the uninterrupted two-host GPT run"; }
losses "$out/ref" >"$out/ref.loss"
# shellcheck disable=SC2086
( timeout -k 5 "$limit" "$kiln" train "$gpt" $kill_flags $hosts $bounded --output-dir "$out/killed" \
    >>"$out/killed.log" 2>&1 ) &
runner=$!
i=0
until [ -f "$out/killed/checkpoints/step_10/manifest.json" ] || [ "$i" -ge $((limit * 5)) ]; do
  sleep 0.2
  i=$((i + 1))
done
[ -f "$out/killed/checkpoints/step_10/manifest.json" ] || { kill "$runner"; fail "no checkpoint before the kill"; }
t0=$(date +%s)
lab_kill 2
wait "$runner"
rc=$?
took=$(($(date +%s) - t0))
[ "$rc" -ne 0 ] || fail "the job survived the death of host n2 with exit 0"
echo "host n2 killed: the job ended (exit $rc) $took s later"
# shellcheck disable=SC2086
timeout -k 5 "$limit" "$kiln" train "$gpt" $kill_flags $hosts $bounded --output-dir "$out/killed" \
  >>"$out/killed.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$out/killed.log"; fail "the rerun after the kill exited $rc"; }
losses "$out/killed" | sort -n -u -k1,1 >"$out/killed.loss"
# Steps recomputed after the resume are logged twice: every logged value must equal run 1's.
losses "$out/killed" | sort -u | awk 'NR == FNR { want[$1] = $2; next }
  { if (!($1 in want) || want[$1] != $2) { print "step " $1 ": " $2 " vs " want[$1]; bad = 1 } }
  END { exit bad }' "$out/ref.loss" - || fail "the resumed run's losses differ from the uninterrupted run"
[ "$(wc -l <"$out/killed.loss")" -eq 100 ] || fail "the resumed run did not reach step 100"
echo "rerun after the kill resumed and logged the uninterrupted run's losses bit for bit"

# 3. A partition: n2's link goes down; the collective timeout ends the job.
# shellcheck disable=SC2086
# mpirun cannot reach n2's orted to end the job once rank 0 aborts: its --job-timeout does, so
# this run gets a short one (the steps before the cut take a few seconds).
( train cut $hosts --job-timeout 25 --set checkpoint_every=0 --set steps=100000 --collective-timeout 5; exit "$rc" ) &
runner=$!
i=0
until grep -q '^step 20/' "$out/cut.log" 2>/dev/null || [ "$i" -ge $((limit * 5)) ]; do
  sleep 0.2
  i=$((i + 1))
done
t0=$(date +%s)
ip -n "${KILN_LAB_PREFIX}n2" link set veth0 down
wait "$runner"
rc=$?
took=$(($(date +%s) - t0))
ip -n "${KILN_LAB_PREFIX}n2" link set veth0 up
[ "$rc" -ne 0 ] || fail "the job survived a partition with exit 0"
grep -q "did not complete within" "$out/cut.log" || { tail -20 "$out/cut.log"; fail "no collective timeout reported"; }
[ "$took" -le 30 ] || fail "the job ended $took s after the cut, past its 25 s job timeout"
echo "n2 cut off: the collective timed out and the job ended (exit $rc) $took s after the cut"
echo "multihost: PASS"
