// Backends by name, for the command line: "cpu" (oneDNN, the default) and "reference" (plain
// loops, the oracle), and the one place the kiln command reads the environment.
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> b, MakeBackendByName("cpu"));
//
// The libraries read no environment variable: what the compiler and the compile cache take from
// the environment (docs/cli.md, "Environment") is read here, by FromEnvironment, into their
// options: once per backend the CLI makes (a command makes one) for the pipeline options, once per
// process for the compile cache.
#ifndef KILN_CLI_BACKENDS_H_
#define KILN_CLI_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/cpu_isa.h"
#include "kiln/compiler/cache.h"
#include "kiln/compiler/pipeline.h"
#include "kiln/runtime/executable.h"

namespace kiln::cli {

// The environment as the kiln command uses it.
struct EnvOptions {
  // KILN_DISABLE_PASSES=cse,dce (disabled_passes), KILN_VERIFY_EACH_PASS=1|0 (verify_each_pass),
  // KILN_DUMP_IR=dir (dump_dir): handed to the cpu backend's compiler pipeline.
  compiler::PipelineOptions pipeline;
  // KILN_CACHE_DIR: the compile cache's disk tier (empty: memory only).
  std::string cache_dir;
  // KILN_CACHE_LOG=1: log every compile-cache miss (also on with a cache dir).
  bool cache_log = false;
  // KILN_CPU_ISA=sse41|avx2|avx512|avx512_vnni|avx512_bf16|amx|native: the CPU ISA level cap
  // (base/cpu_isa.h) for Kiln's kernels and oneDNN's. Unset or empty: the host's level.
  std::optional<CpuIsa> cpu_isa;
};

// Caps the process's CPU ISA level at KILN_CPU_ISA, before anything runs a kernel: what RunKiln
// does first. InvalidArgument for a value that is no level (the message lists the levels).
absl::Status ApplyCpuIsaFromEnvironment();

// Reads the variables above. InvalidArgument when KILN_DISABLE_PASSES names something that is no
// compiler pass (the message names it, the variable's value and the passes).
absl::StatusOr<EnvOptions> FromEnvironment();

// The names MakeBackendByName accepts, default first.
std::vector<std::string> BackendNames();

// "cpu" (with ProcessCompileCache and FromEnvironment's pipeline options) or "reference".
// InvalidArgument listing the choices for an unknown name, or FromEnvironment's error.
// How a command wants its backend to compile, beyond the environment.
struct BackendSettings {
  // > 0: the cpu backend rematerializes until a graph's arena fits (CpuBackendOptions::
  // remat_memory_limit_bytes); the reference backend ignores it.
  int64_t memory_limit_bytes = 0;
};
absl::StatusOr<std::unique_ptr<runtime::Backend>> MakeBackendByName(
    const std::string& name, const BackendSettings& settings = {});

// This process's compile cache, made on first use from the environment: in memory, and on disk
// under $KILN_CACHE_DIR when that is set (misses logged then, or with KILN_CACHE_LOG=1; repeated
// recompiles always warn). Lives until the process exits.
compiler::CompileCache* ProcessCompileCache();

}  // namespace kiln::cli

#endif  // KILN_CLI_BACKENDS_H_
