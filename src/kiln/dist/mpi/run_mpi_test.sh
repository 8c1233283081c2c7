#!/bin/sh
# Runs a test program on NP local ranks under mpirun, bounded by timeout(1), for CTest.
# usage: run_mpi_test.sh NP LIMIT_S EXPECT PROGRAM [ARGS...]
#   EXPECT "-": pass when mpirun exits 0.
#   EXPECT a regex: pass when the output matches it and mpirun ended by itself within LIMIT_S,
#   whatever its exit code (for tests that end the job on purpose, e.g. with MPI_Abort).
# Exits 77 (CTest SKIP_RETURN_CODE) when mpirun is absent. timeout(1) signals its own process
# group, mpirun and the ranks it started, by PID: TERM at LIMIT_S, KILL 5 s later.
set -u
np=$1
limit=$2
expect=$3
shift 3
command -v mpirun >/dev/null 2>&1 || { echo "run_mpi_test: mpirun not found: skipped"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# glibc's malloc tunable: OpenMPI's per-call temporaries above 32 MiB would otherwise page-fault.
timeout -k 5 "$limit" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
  -x GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824 \
  "$@" >"$out" 2>&1
rc=$?
cat "$out"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "run_mpi_test: FAILED: still running after ${limit} s, killed"
  exit 1
fi
if [ "$expect" = "-" ]; then exit "$rc"; fi
if grep -Eq "$expect" "$out"; then exit 0; fi
echo "run_mpi_test: FAILED: output does not match /$expect/ (mpirun exit code $rc)"
exit 1
