// The one compile path: compiler::Compile turns a graph into a CompiledModule (the optimized
// graph, its execution plan and its buffer plan); a backend only lowers that to thunks.
//
//   // In a backend's Compile(graph):
//   CompileOptions opts;
//   opts.keep_composite = [](ir::Opcode op) { return op == ir::Opcode::kSoftmax; };  // native
//   KILN_ASSIGN_OR_RETURN(CompiledModule m, compiler::Compile(graph, traits, opts, cache,
//   "cpu/avx2"));
//   ... lower m.plan.kernels to thunks over m.buffers ...
//
// Compile runs two pipelines. First ProgramPipeline, named "program": the passes that decide WHAT
// the program computes, chosen by CompileOptions::program and run with `optimize` off too:
//   mixed-precision           the precision policy (only with program.precision other than f32;
//                             passes/mixed_precision.h)
//   sharding-propagation      program.shardings written on the parameters and propagated to
//                             every value (only with program.mesh.size > 1;
//                             passes/sharding_propagation.h)
//   spmd-partitioner          the per-rank program of that mesh axis (idem;
//                             passes/spmd_partitioner.h)
// Then, unless `optimize` is off, DefaultPipeline, named "optimize": the passes of DESIGN.md §2
// that exist, in order:
//   decompose                 composites the backend lacks (keep_composite decides)
//   simplify (fixed point):   algebraic, constant-fold, cse, transpose-fold, dce
//   float-normalization       bf16 ops the backend cannot run computed in f32, bf16 storage kept
//                             (only with BackendTraits::supports_bf16;
//                             passes/float_normalization.h)
//   fusion                    loop fusion groups (only with CompileOptions::fuse_loops)
//   remat                     rematerialization (only with CompileOptions::remat enabled)
//   schedule                  memory-minimizing node order (passes/schedule.h)
//   overlap-collectives       asynchronous collectives started early, waited for late (only
//                             with BackendTraits::async_collectives; passes/schedule.h)
// Both take options.pipeline (disabled names, dumps, verification), and either may be disabled
// by any name of the other. The input is verified first; see pipeline.h for verification after each
// pass, disabling passes by name and IR dumps. The compiler reads no environment: the kiln CLI
// turns KILN_DISABLE_PASSES, KILN_VERIFY_EACH_PASS and KILN_DUMP_IR into PipelineOptions once
// (ApplyPipelineVariables).
#ifndef KILN_COMPILER_COMPILE_H_
#define KILN_COMPILER_COMPILE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/compiler/buffer_plan.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/compiler/passes/constant_fold.h"
#include "kiln/compiler/passes/float_normalization.h"
#include "kiln/compiler/passes/mixed_precision.h"
#include "kiln/compiler/passes/remat.h"
#include "kiln/compiler/passes/sharding_rules.h"
#include "kiln/compiler/pipeline.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/sharding.h"

namespace kiln::compiler {

// What the program computes, as opposed to how it is optimized: the options of the "program"
// pipeline (ProgramPipeline), which Compile runs whether or not it optimizes. The default
// changes nothing.
struct ProgramOptions {
  // The precision policy (passes/mixed_precision.h). Right for a forward (inference) graph; a
  // training step runs ProgramPipeline with it on its LOSS graph before autodiff instead, and
  // compiles the step with kF32 (see ApplyPrecisionPolicy for why).
  PrecisionPolicy precision = PrecisionPolicy::kF32;
  // Parameters the policy keeps as f32 master weights: each must be f32 (InvalidArgument).
  std::vector<std::string> master_weights;
  // Tensor parallel (SPMD): with mesh.size > 1 the parameters named in `shardings` are annotated,
  // the shardings propagated and the program partitioned into what one rank of the mesh axis
  // runs (local shapes, collectives as ops).
  sharding::Mesh mesh;
  std::map<std::string, ir::Sharding> shardings;
};

struct CompileOptions {
  // Run the "optimize" pipeline below. Off: the graph is compiled as the program pipeline leaves
  // it (verified, planned, assigned): what the reference backend wants, being the oracle the
  // optimized programs are checked against.
  bool optimize = true;
  // What the program computes (ProgramPipeline). The compile cache keys the graph this pipeline
  // produced, and CanonicalOptionsString names the options too.
  ProgramOptions program;
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

// The passes that decide what the program computes (options.program), in order, as a pipeline
// named "program" with options.pipeline: empty for the default ProgramOptions.
//
//   CompileOptions o;
//   o.program = {.precision = PrecisionPolicy::kMixedBf16, .master_weights = {"w1", "w2"}};
//   KILN_RETURN_IF_ERROR(ProgramPipeline(o)->Run(loss_graph).status());   // before autodiff
std::unique_ptr<Pipeline> ProgramPipeline(const CompileOptions& options);

// The optimization passes, in order, as a pipeline named "optimize".
std::unique_ptr<Pipeline> DefaultPipeline(const CompileOptions& options = {});

// Runs DefaultPipeline(options) on a copy of `graph` and returns the optimized graph (same
// parameters, same outputs). Errors: an invalid input graph, a pass error, an unknown name in
// options.pipeline.disabled_passes, or (with verification on) a pass producing an invalid graph.
absl::StatusOr<ir::Graph> Optimize(const ir::Graph& graph, const CompileOptions& options = {});

// Every pass name DefaultPipeline and ProgramPipeline have in some configuration (fusion, remat,
// precision and mesh on), each pipeline's in order: the optimize passes, then the program ones.
std::vector<std::string> AllPassNames();

// The pipeline's debugging switches as text, the way the kiln CLI's environment spells them
// (docs/cli.md); null: not set. The compiler never reads the environment itself: the CLI (and the
// test binaries CTest reruns with these set) pass the values in.
struct PipelineVariables {
  const char* disable_passes = nullptr;  // KILN_DISABLE_PASSES: "cse,dce" (spaces, empty items ok)
  const char* verify_each_pass = nullptr;  // KILN_VERIFY_EACH_PASS: "0" off, other non-empty on
  const char* dump_ir = nullptr;           // KILN_DUMP_IR: folder for IR dumps (non-empty)
};

// Adds the passes `vars` disables to options->disabled_passes, sets verify_each_pass where given
// and dump_dir where given and still empty. InvalidArgument when KILN_DISABLE_PASSES names no pass
// of AllPassNames(): the message names the bad name, the variable's value and the passes.
absl::Status ApplyPipelineVariables(const PipelineVariables& vars, PipelineOptions* options);

// `graph` rewritten by MixedPrecisionPass under `policy` (a copy of `graph` for kF32), no
// pipeline around it. Parameters named in `master_weights` must be f32 (InvalidArgument naming
// the first that is not: a policy keeps f32 master weights).
//
// Where it runs matters. Compile applies CompileOptions::program.precision to the graph it is
// given, right for a forward (inference) graph. A training step applies it to the LOSS graph before
// autodiff::Grad instead, and compiles the step with kF32: rewritten first, the backward pass
// inherits bf16 through convert's VJP and the optimizer update (built after autodiff) stays f32.
// Rewriting the whole step graph after autodiff is a different program: under kBf16 the
// optimizer's elementwise update and the backward elementwise math would be rewritten to bf16
// (the master weights would be updated in bf16), and gradients would be rounded at other points.
absl::StatusOr<ir::Graph> ApplyPrecisionPolicy(const ir::Graph& graph, PrecisionPolicy policy,
                                               const std::vector<std::string>& master_weights = {});

class CompileCache;  // cache.h

// What compile hands a backend: the optimized graph (fusion groups as its `fusion` attributes,
// visible in its IR text), how it runs (the kernels, reads, aliases and storage of
// execution_plan.h) and where every value lives (buffer_plan.h). Lowering reads these and
// re-derives nothing.
struct CompiledModule {
  ir::Graph graph;
  ExecutionPlan plan;
  BufferPlan buffers;
  // The bf16 ops the float-normalization pass computes in f32 (BackendTraits::supports_bf16
  // refused them), per opcode: what callers report (F32ComputeNote). Empty when none.
  std::vector<OpCount> f32_compute;
};

// The one compile path: verifies `graph`, runs ProgramPipeline(options) on it (precision policy,
// SPMD partitioning), optimizes it with DefaultPipeline for `traits` (taking
// the optimized graph from `cache` under `backend_key` when it holds it; null: no cache) unless
// options.optimize is off, then plans execution and buffers for `traits`. Errors: those of
// Optimize, and an invalid input graph.
absl::StatusOr<CompiledModule> Compile(const ir::Graph& graph, const BackendTraits& traits,
                                       const CompileOptions& options, CompileCache* cache = nullptr,
                                       const std::string& backend_key = "");

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_COMPILE_H_
