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
#include "kiln/compiler/cache.h"
#include "kiln/runtime/executable.h"

namespace kiln::cli {

// The names MakeBackendByName accepts, default first.
std::vector<std::string> BackendNames();

// InvalidArgument listing the choices for an unknown name.
// "cpu" (with ProcessCompileCache) or "reference".
absl::StatusOr<std::unique_ptr<runtime::Backend>> MakeBackendByName(const std::string& name);

// This process's compile cache, made on first use from the environment: in memory, and on disk
// under $KILN_CACHE_DIR when that is set (misses logged then, or with KILN_CACHE_LOG=1; repeated
// recompiles always warn). Lives until the process exits.
compiler::CompileCache* ProcessCompileCache();

}  // namespace kiln::cli

#endif  // KILN_CLI_BACKENDS_H_
