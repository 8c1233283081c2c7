// The default optimization pipeline, and the one call a backend makes to run it.
//
//   // In a backend's Compile(graph):
//   CompileOptions opts;
//   opts.keep_composite = [](ir::Opcode op) { return op == ir::Opcode::kSoftmax; };  // native
//   KILN_ASSIGN_OR_RETURN(ir::Graph optimized, compiler::Optimize(graph, opts));
//   ... lower `optimized` to thunks ...
//
// DefaultPipeline lists the passes of DESIGN.md §2 that exist, in order:
//   decompose                 composites the backend lacks (keep_composite decides)
//   simplify (fixed point):   algebraic, constant-fold, cse, transpose-fold, dce
//   fusion                    loop fusion groups (only with CompileOptions::fuse_loops)
//   remat                     rematerialization (only with CompileOptions::remat enabled)
//   schedule                  memory-minimizing node order (passes/schedule.h)
// The input is verified first; see pipeline.h for verification after each pass, disabling passes
// by name (KILN_DISABLE_PASSES) and IR dumps (KILN_DUMP_IR).
#ifndef KILN_COMPILER_COMPILE_H_
#define KILN_COMPILER_COMPILE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/compiler/passes/constant_fold.h"
#include "kiln/compiler/passes/remat.h"
#include "kiln/compiler/pipeline.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

struct CompileOptions {
  PipelineOptions pipeline;
  // Composite ops the backend implements natively; the others are decomposed into primitives.
  // Null: decompose every composite.
  std::function<bool(ir::Opcode)> keep_composite;
  // Constant folding's result-size limit (elements).
  int64_t max_fold_elements = kDefaultMaxFoldElements;
  // Append the loop fusion pass ("fusion", passes/fusion.h): for backends that run fusion groups
  // as one kernel.
  bool fuse_loops = false;
  // Rematerialization (passes/remat.h): off unless remat.enabled or remat.memory_limit_bytes > 0.
  // Its `measure` hook is not part of compile-cache keys (it belongs to the backend's key).
  RematOptions remat;
  // How the backend runs the result (compiler/execution_plan.h): which fusion groups it can run
  // as one kernel (the fusion pass forms no other), and the memory model that remat and schedule
  // minimize. Part of the backend, so it is covered by the backend's compile-cache key.
  BackendTraits traits;
};

// The passes, in order, as a pipeline named "optimize".
std::unique_ptr<Pipeline> DefaultPipeline(const CompileOptions& options = {});

// Runs DefaultPipeline(options) on a copy of `graph` and returns the optimized graph (same
// parameters, same outputs). Errors: an invalid input graph, a pass error, an unknown name in
// options.pipeline.disabled_passes, or (with verification on) a pass producing an invalid graph.
absl::StatusOr<ir::Graph> Optimize(const ir::Graph& graph, const CompileOptions& options = {});

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_COMPILE_H_
