// Backends by name, for the command line: "cpu" (oneDNN, the default) and "reference" (plain
// loops, the oracle).
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> b, MakeBackendByName("cpu"));
#ifndef KILN_CLI_BACKENDS_H_
#define KILN_CLI_BACKENDS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/runtime/executable.h"

namespace kiln::cli {

// The names MakeBackendByName accepts, default first.
std::vector<std::string> BackendNames();

// InvalidArgument listing the choices for an unknown name.
absl::StatusOr<std::unique_ptr<runtime::Backend>> MakeBackendByName(const std::string& name);

}  // namespace kiln::cli

#endif  // KILN_CLI_BACKENDS_H_
