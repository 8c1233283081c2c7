#include "kiln/base/status.h"

#include <cstdio>
#include <cstdlib>

namespace kiln::internal {

void CheckOkFailed(const char* file, int line, const absl::Status& s) {
  std::fprintf(stderr, "%s:%d: KILN_CHECK_OK failed: %s\n", file, line, s.ToString().c_str());
  std::abort();
}

void CheckFailed(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "%s:%d: KILN_CHECK failed: %s\n", file, line, cond);
  std::abort();
}

}  // namespace kiln::internal
