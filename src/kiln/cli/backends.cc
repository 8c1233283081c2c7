#include "kiln/cli/backends.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "kiln/base/status.h"
#include "kiln/compiler/compile.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::cli {

absl::StatusOr<EnvOptions> FromEnvironment() {
  // The only getenv calls of the kiln command (docs/cli.md, "Environment").
  EnvOptions e;
  compiler::PipelineVariables vars;
  vars.disable_passes = std::getenv("KILN_DISABLE_PASSES");
  vars.verify_each_pass = std::getenv("KILN_VERIFY_EACH_PASS");
  vars.dump_ir = std::getenv("KILN_DUMP_IR");
  KILN_RETURN_IF_ERROR(compiler::ApplyPipelineVariables(vars, &e.pipeline));
  if (const char* dir = std::getenv("KILN_CACHE_DIR")) e.cache_dir = dir;
  const char* log = std::getenv("KILN_CACHE_LOG");
  e.cache_log = log != nullptr && std::string(log) == "1";
  if (const char* isa = std::getenv("KILN_CPU_ISA"); isa != nullptr && *isa != '\0') {
    KILN_ASSIGN_OR_RETURN(e.cpu_isa, ParseCpuIsa(isa));
  }
  return e;
}

absl::Status ApplyCpuIsaFromEnvironment() {
  // KILN_CPU_ISA alone: the other variables' errors belong to the command that reads them.
  const char* v = std::getenv("KILN_CPU_ISA");
  return ApplyCpuIsaSetting(v == nullptr ? "" : v, /*strict=*/false);
}

std::vector<std::string> BackendNames() { return {"cpu", "reference"}; }

compiler::CompileCache* ProcessCompileCache() {
  static compiler::CompileCache* const cache = [] {
    const absl::StatusOr<EnvOptions> env = FromEnvironment();
    compiler::CompileCacheOptions o;
    if (env.ok()) o.dir = env->cache_dir;
    o.use_disk = !o.dir.empty();
    bool verbose = o.use_disk || (env.ok() && env->cache_log);
    o.log = [verbose](const std::string& m) {
      if (verbose || m.find("WARNING") != std::string::npos)
        std::fprintf(stderr, "%s\n", m.c_str());
    };
    return new compiler::CompileCache(std::move(o));
  }();
  return cache;
}

absl::StatusOr<std::unique_ptr<runtime::Backend>> MakeBackendByName(
    const std::string& name, const BackendSettings& settings) {
  if (name == "cpu") {
    // Read per backend (a command makes one), so each command in a process that runs several
    // (the CLI tests) sees the environment it was started with.
    absl::StatusOr<EnvOptions> env = FromEnvironment();
    if (!env.ok()) return env.status();
    return runtime::MakeCpuBackend({.max_isa = env->cpu_isa,
                                    .compile_cache = ProcessCompileCache(),
                                    .remat_memory_limit_bytes = settings.memory_limit_bytes,
                                    .pipeline = env->pipeline});
  }
  if (name == "reference") return runtime::MakeReferenceBackend();
  return absl::InvalidArgumentError("unknown backend '" + name + "' (choose cpu or reference)");
}

}  // namespace kiln::cli
