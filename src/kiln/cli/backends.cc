#include "kiln/cli/backends.h"

#include "absl/status/status.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::cli {

std::vector<std::string> BackendNames() { return {"cpu", "reference"}; }

absl::StatusOr<std::unique_ptr<runtime::Backend>> MakeBackendByName(const std::string& name) {
  if (name == "cpu") return runtime::MakeCpuBackend();
  if (name == "reference") return runtime::MakeReferenceBackend();
  return absl::InvalidArgumentError("unknown backend '" + name + "' (choose cpu or reference)");
}

}  // namespace kiln::cli
