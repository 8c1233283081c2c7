#include "kiln/cli/backends.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::cli {

std::vector<std::string> BackendNames() { return {"cpu", "reference"}; }

compiler::CompileCache* ProcessCompileCache() {
  // Read once: the environment is the CLI's to read, not the libraries'.
  static compiler::CompileCache* const cache = [] {
    const char* dir = std::getenv("KILN_CACHE_DIR");
    const char* log = std::getenv("KILN_CACHE_LOG");
    compiler::CompileCacheOptions o;
    o.use_disk = dir != nullptr && *dir != '\0';
    bool verbose = o.use_disk || (log != nullptr && std::string(log) == "1");
    o.log = [verbose](const std::string& m) {
      if (verbose || m.find("WARNING") != std::string::npos)
        std::fprintf(stderr, "%s\n", m.c_str());
    };
    return new compiler::CompileCache(std::move(o));
  }();
  return cache;
}

absl::StatusOr<std::unique_ptr<runtime::Backend>> MakeBackendByName(const std::string& name) {
  if (name == "cpu") return runtime::MakeCpuBackend({.compile_cache = ProcessCompileCache()});
  if (name == "reference") return runtime::MakeReferenceBackend();
  return absl::InvalidArgumentError("unknown backend '" + name + "' (choose cpu or reference)");
}

}  // namespace kiln::cli
