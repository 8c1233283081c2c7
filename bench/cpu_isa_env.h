// The benchmarks' KILN_CPU_ISA, as the kiln CLI and the ISA test binaries read it: main() calls
// this before anything else, so `KILN_CPU_ISA=avx2 build/bench/train_bench` measures the AVX2
// paths (Kiln's kernel variants and oneDNN's) on a bigger CPU (base/cpu_isa.h).
//
//   int main(int argc, char** argv) {
//     if (int rc = kiln::bench::ApplyCpuIsaEnvironment("train_bench"); rc != 0) return rc;
//     ...
//   }
//
// Returns 0 (unset, or applied), or 2 after printing why to stderr: a bad name, or a level above
// this CPU's (a benchmark that silently ran natively would report the wrong machine).
//
// The peers (PyTorch with OpenBLAS, ONNX Runtime) have no such cap: below the host's level every
// program the benchmark starts preloads libkiln_cpuid_cap.so (tests/support/cpuid_cap.cc), which
// shows it a CPU of that level through CPUID, so both sides run the kernels that CPU would get.
// Where the CPU cannot fault CPUID the peers run natively, and the benchmark says so.
#ifndef KILN_BENCH_CPU_ISA_ENV_H_
#define KILN_BENCH_CPU_ISA_ENV_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "bench/peer_blas.h"
#include "kiln/base/cpu_isa.h"

namespace kiln::bench {

// Every program started from here on sees a CPU of `isa` (a level below the host's).
inline void CapPeersCpuid(const char* program, CpuIsa isa) {
#ifdef KILN_CPUID_CAP_LIBRARY
  if (!ReadCpuInfo().Has("cpuid_fault")) {
    std::fprintf(stderr,
                 "%s: this CPU cannot fault CPUID: the peers run at %s, Kiln at %s (ratios compare "
                 "different kernels)\n",
                 program, CpuIsaName(HostCpuIsa()).c_str(), CpuIsaName(isa).c_str());
    return;
  }
  const char* old = std::getenv("LD_PRELOAD");
  std::string preload = KILN_CPUID_CAP_LIBRARY;
  if (old != nullptr && *old != '\0') preload += std::string(":") + old;
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("KILN_CPUID_CAP", CpuIsaName(isa).c_str(), 1);
  std::fprintf(stderr, "%s: the peers see a %s CPU (libkiln_cpuid_cap.so)\n", program,
               CpuIsaName(isa).c_str());
#else
  (void)program;
  (void)isa;
#endif
}

inline int ApplyCpuIsaEnvironment(const char* program) {
  const char* v = std::getenv("KILN_CPU_ISA");
  if (v == nullptr || *v == '\0') return 0;
  if (absl::Status s = ApplyCpuIsaSetting(v, /*strict=*/true); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(s.message()).c_str());
    return 2;
  }
  if (CpuIsaCapped()) CapPeersCpuid(program, ActiveCpuIsa());
  return 0;
}

}  // namespace kiln::bench

#endif  // KILN_BENCH_CPU_ISA_ENV_H_
