#!/bin/sh
# cpuid_cap_test.sh ISA_CHECK LIBKILN_CPUID_CAP LEVEL: under libkiln_cpuid_cap.so at LEVEL, Kiln's
# HostCpuIsa (base/cpu_isa.h, read by kiln_isa_check) must see LEVEL, and a bogus level must stop
# the process (exit 3) rather than run unmasked. Skipped (77) where the host runs at LEVEL or below
# (nothing to mask) or cannot fault CPUID (no cpuid_fault flag).
check=$1 shim=$2 level=$3
"$check" "$level" > /dev/null
case $? in
  0) ;;
  77) echo "this CPU runs at $level or below: nothing to mask, skipped"; exit 77 ;;
  *) echo "kiln_isa_check $level failed"; exit 1 ;;
esac
if ! grep -qw cpuid_fault /proc/cpuinfo; then
  echo "this CPU or kernel cannot fault CPUID (no cpuid_fault in /proc/cpuinfo): skipped"
  exit 77
fi
out=$(KILN_CPUID_CAP=$level LD_PRELOAD=$shim "$check" "$level")
rc=$?
echo "$out"
if [ $rc -ne 77 ] || ! echo "$out" | grep -q "this CPU runs at $level;"; then
  echo "FAIL: under KILN_CPUID_CAP=$level the host level is not $level (rc $rc)"
  exit 1
fi
err=$(KILN_CPUID_CAP=bogus LD_PRELOAD=$shim "$check" "$level" 2>&1)
rc=$?
if [ $rc -ne 3 ] || ! echo "$err" | grep -q "KILN_CPUID_CAP=bogus: not a level"; then
  echo "FAIL: a bogus level gave rc $rc: $err"
  exit 1
fi
echo "ok: Kiln sees $level through libkiln_cpuid_cap"
