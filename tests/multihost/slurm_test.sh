#!/bin/sh
# `kiln train` started by Slurm's srun (no mpirun): a private one-node Slurm cluster (munged,
# slurmctld, slurmd on private ports, every file under OUTDIR but munge's (/tmp/kiln-munge.*); multihost.md
# §3) runs `srun -n 2 --mpi=pmix -K kiln train CONFIG`; each rank finds its rank from the PMIx /
# Slurm environment, the two train data-parallel, and the losses must track a one-process run
# within 1e-4 relative; then `kiln train --workers 2 --slurm` builds that srun line itself and
# must log the same losses (CTest, label multihost; docs/distributed.md "Slurm").
# usage: slurm_test.sh KILN CONFIG OUTDIR STEPS LIMIT_S
# Exits 77 (CTest SKIP_RETURN_CODE) without root or the Slurm/munge binaries. The daemons are
# stopped (scontrol shutdown, then SIGKILL by PID) on every exit path; every run is bounded.
set -u
# One lab at a time on this machine (the subnet, bridge address and Slurm ports are fixed): a
# second run waits for the first (several build folders' test suites may run at once).
exec 9>/tmp/kiln-multihost.lock
flock -w 600 9 || { echo "multihost: another multihost test held the lock for 600 s"; exit 1; }
kiln=$1 config=$2 out=$3 steps=$4 limit=$5
for b in munged mungekey slurmctld slurmd srun scontrol sinfo; do
  command -v "$b" >/dev/null 2>&1 || { echo "slurm: $b not found: skipped"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "slurm: needs root: skipped"; exit 77; }
# slurmd 22.05 sets up its cgroup plugin whatever the config says (multihost.md §4): a chroot
# or container without /sys/fs/cgroup cannot run it.
mountpoint -q /sys/fs/cgroup 2>/dev/null ||
  { echo "slurm: no cgroup file system at /sys/fs/cgroup (slurmd needs one): skipped"; exit 77; }
fail() {
  echo "slurm: FAILED: $*"
  exit 1
}
rm -rf "$out" && mkdir -p "$out" || exit 1
lab=$(cd "$out" && pwd)
export SLURM_CONF="$lab/slurm/slurm.conf"
stop() {
  scontrol shutdown >/dev/null 2>&1
  sleep 1
  for f in "$lab"/slurm/run/*.pid "${munge:-/nonexistent}"/munged.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
  done
  [ -n "${munge:-}" ] && rm -rf "$munge"
  return 0
}
trap stop EXIT
trap 'exit 1' INT TERM
# munged refuses a socket whose every parent folder is not searchable by all: a build folder
# under a 0700 one (/root, a mktemp -d clone) is not, so munge lives in its own folder in /tmp.
munge=$(mktemp -d /tmp/kiln-munge.XXXXXX) && chmod 755 "$munge" || exit 1
mkdir -p "$lab/slurm/state" "$lab/slurm/log" "$lab/slurm/run" "$lab/slurm/spool/localhost" ||
  exit 1
# The node line repeats this machine's topology (slurmd refuses a node that differs from it).
topo=$(slurmd -C 2>/dev/null | sed -n 's/^NodeName=[^ ]* \(CPUs=[0-9]* Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*\).*/\1/p')
[ -n "$topo" ] || fail "slurmd -C printed no topology"
cat >"$SLURM_CONF" <<CONF
ClusterName=kilntest
SlurmctldHost=localhost
SlurmctldPort=16917
SlurmdPort=16918
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge/munge.socket
StateSaveLocation=$lab/slurm/state
SlurmdSpoolDir=$lab/slurm/spool/%n
SlurmctldPidFile=$lab/slurm/run/slurmctld.pid
SlurmdPidFile=$lab/slurm/run/slurmd-%n.pid
SlurmctldLogFile=$lab/slurm/log/slurmctld.log
SlurmdLogFile=$lab/slurm/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=pmix
MailProg=/bin/true
SwitchType=switch/none
ReturnToService=2
KillOnBadExit=1
NodeName=localhost $topo State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
mungekey -c -k "$munge/munge.key" >/dev/null 2>&1 || fail "mungekey"
munged --key-file="$munge/munge.key" --socket="$munge/munge.socket" \
  --pid-file="$munge/munged.pid" --log-file="$munge/munged.log" \
  --seed-file="$munge/munged.seed" 9>&- || fail "munged did not start"
slurmctld 9>&- || fail "slurmctld did not start (log: $lab/slurm/log/slurmctld.log)"
slurmd -N localhost 9>&- || fail "slurmd did not start (log: $lab/slurm/log/slurmd-localhost.log)"
i=0
until sinfo -h -n localhost -o %T 2>/dev/null | grep -qx idle; do
  i=$((i + 1))
  [ "$i" -lt 300 ] || fail "the node did not become idle in 30 s"
  sleep 0.1
done
common="--set steps=$steps --set log_every=1 --set eval_every=0 --set checkpoint_every=0"
losses() {
  sed -n 's/.*"step":\([0-9]*\),.*"loss":\([^,}]*\).*/\1 \2/p' "$1/metrics.jsonl"
}
# shellcheck disable=SC2086
timeout -k 5 "$limit" "$kiln" train "$config" $common --output-dir "$out/one" >"$out/one.log" 2>&1 ||
  { cat "$out/one.log"; fail "the one-process run failed"; }
# shellcheck disable=SC2086
timeout -k 5 "$limit" srun -n 2 --mpi=pmix -K --time=$(((limit + 59) / 60)) \
  --export=ALL,OMP_NUM_THREADS=1,GLIBC_TUNABLES=glibc.malloc.mmap_max=0 \
  "$kiln" train "$config" $common --output-dir "$out/srun" >"$out/srun.log" 2>&1 ||
  { tail -30 "$out/srun.log"; fail "srun -n 2 kiln train failed"; }
grep -q '"ranks": *2' "$out/srun/run.json" || fail "run.json does not record 2 ranks"
losses "$out/one" >"$out/one.loss"
losses "$out/srun" >"$out/srun.loss"
[ "$(wc -l <"$out/srun.loss")" -eq "$steps" ] || fail "expected $steps losses from the srun job"
paste "$out/one.loss" "$out/srun.loss" | awk -v steps="$steps" '
  { if ($1 != $3) { print "step mismatch: " $0; bad = 1; exit }
    d = $2 - $4; if (d < 0) d = -d; a = $2; if (a < 0) a = -a; r = d / a
    if (r > worst) { worst = r; at = $1 } }
  END { if (bad) exit 1
        printf "srun -n 2 vs one process over %d steps: largest relative loss difference %.3g (step %d)\n", steps, worst, at
        if (worst > 1e-4) exit 1 }' || fail "losses differ by more than 1e-4"
# The same job through `kiln train --workers 2 --slurm` (kiln builds the srun line itself); its
# --dry-run line names srun, and the job must log the same losses as the srun run, bit for bit.
# shellcheck disable=SC2086
"$kiln" train "$config" $common --output-dir "$out/slurm" --workers 2 --slurm --dry-run \
  >"$out/dry.txt" 2>&1 || fail "kiln train --slurm --dry-run"
grep -q '^srun -n 2 --mpi=pmix -K ' "$out/dry.txt" || { cat "$out/dry.txt"; fail "dry-run line"; }
# shellcheck disable=SC2086
timeout -k 5 "$limit" "$kiln" train "$config" $common --output-dir "$out/slurm" --workers 2 \
  --slurm --job-timeout "$limit" >"$out/slurm.log" 2>&1 ||
  { tail -30 "$out/slurm.log"; fail "kiln train --workers 2 --slurm failed"; }
losses "$out/slurm" >"$out/slurm.loss"
cmp -s "$out/srun.loss" "$out/slurm.loss" || fail "kiln train --slurm logged other losses than srun"
echo "kiln train --workers 2 --slurm: the same losses as srun, bit for bit"
echo "slurm: PASS"
