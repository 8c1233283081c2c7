#include "kiln/base/status.h"

#include <cstdlib>
#include <string>

#include "kiln/base/log.h"

namespace kiln::internal {

// A failed check is logged at ERROR (the highest severity, so no minimum filters it out) with the
// place of the check, not of this function.
void CheckOkFailed(const char* file, int line, const absl::Status& s) {
  log::Write(
      log::Severity::kError, file, line,
      std::string(file) + ":" + std::to_string(line) + ": KILN_CHECK_OK failed: " + s.ToString());
  std::abort();
}

void CheckFailed(const char* file, int line, const char* cond) {
  log::Write(log::Severity::kError, file, line,
             std::string(file) + ":" + std::to_string(line) + ": KILN_CHECK failed: " + cond);
  std::abort();
}

}  // namespace kiln::internal
