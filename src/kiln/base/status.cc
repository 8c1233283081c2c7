#include "kiln/base/status.h"

#include <cstdlib>
#include <string>

#include "kiln/base/log.h"

namespace kiln::internal {

// A failed check is logged at ERROR (never filtered out: the process is about to abort) with the
// place of the check, not of this function.
void CheckOkFailed(const char* file, int line, const absl::Status& s) {
  log::SetMinSeverity(log::Severity::kDebug);
  log::Write(
      log::Severity::kError, file, line,
      std::string(file) + ":" + std::to_string(line) + ": KILN_CHECK_OK failed: " + s.ToString());
  std::abort();
}

void CheckFailed(const char* file, int line, const char* cond) {
  log::SetMinSeverity(log::Severity::kDebug);
  log::Write(log::Severity::kError, file, line,
             std::string(file) + ":" + std::to_string(line) + ": KILN_CHECK failed: " + cond);
  std::abort();
}

}  // namespace kiln::internal
