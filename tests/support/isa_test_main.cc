// The GoogleTest main of the CPU-dependent test binaries (kiln_cc_test ... ISA): caps the process's
// CPU ISA level at KILN_CPU_ISA (base/cpu_isa.h) before any test runs, as the kiln CLI does, so
// `KILN_CPU_ISA=avx2 ./op_table_test` runs the AVX2 paths (Kiln's kernel variants and oneDNN's)
// on any machine with AVX2 or more. The libraries read no environment; the binaries read it here.
// A level above this CPU's is a skip (exit 77, CTest's SKIP_RETURN_CODE), not a silent native run.
#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"
#include "kiln/base/cpu_isa.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* v = std::getenv("KILN_CPU_ISA"); v != nullptr && *v != '\0') {
    absl::StatusOr<kiln::CpuIsa> isa = kiln::ParseCpuIsa(v);
    if (!isa.ok()) {
      std::fprintf(stderr, "%s\n", std::string(isa.status().message()).c_str());
      return 2;
    }
    if (*isa > kiln::HostCpuIsa()) {
      std::printf("KILN_CPU_ISA=%s: this CPU runs at most %s; skipped\n", v,
                  kiln::CpuIsaName(kiln::HostCpuIsa()).c_str());
      return 77;
    }
    if (absl::Status s = kiln::SetCpuIsaCap(*isa); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  std::printf("[ cpu isa  ] %s (host %s)\n", kiln::CpuIsaName(kiln::ActiveCpuIsa()).c_str(),
              kiln::CpuIsaName(kiln::HostCpuIsa()).c_str());
  return RUN_ALL_TESTS();
}
