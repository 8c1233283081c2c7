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
  const char* v = std::getenv("KILN_CPU_ISA");
  if (absl::Status s = kiln::ApplyCpuIsaSetting(v == nullptr ? "" : v, /*strict=*/true); !s.ok()) {
    const bool above = s.code() == absl::StatusCode::kOutOfRange;
    std::fprintf(above ? stdout : stderr, "%s%s\n", std::string(s.message()).c_str(),
                 above ? "; skipped" : "");
    return above ? 77 : 2;
  }
  std::printf("[ cpu isa  ] %s (host %s)\n", kiln::CpuIsaName(kiln::ActiveCpuIsa()).c_str(),
              kiln::CpuIsaName(kiln::HostCpuIsa()).c_str());
  return RUN_ALL_TESTS();
}
