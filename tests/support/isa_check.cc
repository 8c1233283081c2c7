// kiln_isa_check LEVEL: exit 0 when LEVEL (base/cpu_isa.h names) is below this CPU's level, so a
// capped rerun of a test proves something the native run does not; 77 (CTest's skip code) when
// LEVEL is this CPU's level or above; 2 for a name that is no level. The CTest `isa` entries
// (cmake/kiln.cmake, kiln_isa_tests) run it before the test they wrap.
#include <cstdio>

#include "kiln/base/cpu_isa.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_isa_check LEVEL\n");
    return 2;
  }
  absl::StatusOr<kiln::CpuIsa> isa = kiln::ParseCpuIsa(argv[1]);
  if (!isa.ok()) {
    std::fprintf(stderr, "%s\n", std::string(isa.status().message()).c_str());
    return 2;
  }
  const kiln::CpuIsa host = kiln::HostCpuIsa();
  if (*isa >= host) {
    std::printf("cpu isa %s: this CPU runs at %s; the native run covers it, skipped\n", argv[1],
                kiln::CpuIsaName(host).c_str());
    return 77;
  }
  return 0;
}
