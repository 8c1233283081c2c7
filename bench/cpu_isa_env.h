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
#ifndef KILN_BENCH_CPU_ISA_ENV_H_
#define KILN_BENCH_CPU_ISA_ENV_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/base/cpu_isa.h"

namespace kiln::bench {

inline int ApplyCpuIsaEnvironment(const char* program) {
  const char* v = std::getenv("KILN_CPU_ISA");
  if (v == nullptr || *v == '\0') return 0;
  absl::StatusOr<CpuIsa> isa = ParseCpuIsa(v);
  if (!isa.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(isa.status().message()).c_str());
    return 2;
  }
  if (*isa > HostCpuIsa()) {
    std::fprintf(stderr, "%s: KILN_CPU_ISA=%s, but this CPU runs at most %s\n", program, v,
                 CpuIsaName(HostCpuIsa()).c_str());
    return 2;
  }
  if (absl::Status s = SetCpuIsaCap(*isa); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(s.message()).c_str());
    return 2;
  }
  return 0;
}

}  // namespace kiln::bench

#endif  // KILN_BENCH_CPU_ISA_ENV_H_
