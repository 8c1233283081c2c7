// The fast CPU backend: lowers each node of a graph to one thunk that runs a oneDNN primitive
// (matmul, convolution, pooling, eltwise, binary, softmax, layer norm, reorders) or one of Kiln's
// own OpenMP loops (reductions, data movement, comparisons, norms, attention, ...).
//
//   std::unique_ptr<Backend> cpu = MakeCpuBackend();
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, cpu->Compile(graph));
//   KILN_RETURN_IF_ERROR(exe->RunInto({&x, &w}, {&y}));   // allocation-free
//
// Every oneDNN primitive, memory descriptor and memory object is created in Compile; at run time a
// thunk binds data pointers and executes on the executable's stream. Primitives use a user-mode
// scratchpad carved from one workspace that Compile allocates, so running allocates nothing.
//
// Compile goes through compiler::Compile (the one compile path) with this backend's traits, then
// Lower turns the CompiledModule into thunks. Compile first runs the compiler's default pipeline
// (compiler::Optimize: decompose, then the simplify group: algebraic, constant-fold, cse,
// transpose-fold, dce), keeping every composite the backend lowers natively (softmax, log_softmax,
// layer_norm, rms_norm, cross_entropy, attention). CpuBackendOptions::optimize = false compiles the
// graph as given; CpuBackendOptions::pipeline skips single passes by name, dumps IR or verifies
// after every pass (compiler/pipeline.h; the kiln CLI fills it from KILN_DISABLE_PASSES etc.). The
// executable's graph() is the optimized one, with the same parameters and outputs as the input. A
// graph compiled before with the same options skips the pipeline: the optimized graph comes from a
// compile cache (use_compile_cache).
//
// Dtypes: f32 and bf16 everywhere (bf16 computes in f32 and rounds to nearest even on store;
// oneDNN accumulates bf16 matmul/conv in f32); f16 and f64 in the loops; integers and bool where
// the op allows. Ops oneDNN cannot run for a dtype (e.g. f64 matmul/conv/pooling) give
// Unimplemented naming the op: the reference backend covers them.
#ifndef KILN_RUNTIME_CPU_CPU_BACKEND_H_
#define KILN_RUNTIME_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "kiln/base/cpu_isa.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/compiler/pipeline.h"
#include "kiln/runtime/executable.h"

namespace kiln::compiler {
class CompileCache;
}  // namespace kiln::compiler

namespace kiln::runtime {

struct CpuBackendOptions {
  // Caps the process's CPU ISA level (base/cpu_isa.h: Kiln's kernel variants and oneDNN's
  // kernels both follow it) when the first backend is made. The level is process-wide and fixed
  // once decided: a backend asking for another level than the one already running fails every
  // Compile with FailedPrecondition. Unset: the level already decided, else the host's. The kiln
  // CLI and the test support library set the cap from KILN_CPU_ISA instead.
  std::optional<CpuIsa> max_isa;
  // Use Kiln's loops instead of oneDNN for ops that have both (eltwise unary, binary arithmetic,
  // softmax, log_softmax, layer_norm, convert, matmul, avg/max pooling). For tests of the loops.
  bool prefer_loops = false;
  // Pre-pack weights that Executable::BindConstantParameters fixes (Thunk::PrepareConstants):
  // small-batch f32 matmuls run the packed gemv kernel (internal/gemv.h), at avx2 those of 9-256
  // rows the packed sgemm (internal/sgemm.h), larger ones a oneDNN matmul created for its own
  // blocked weight layout (format `any`), and forward convolutions keep their filter reordered
  // into the primitive's layout; each once, at bind time, not per run. Off: bound weights run the
  // same kernels as unbound ones (for tests and A/B benchmarks).
  bool prepack_weights = true;
  // Keep convolution and pooling activations in oneDNN's 16-channel blocked layout (nChw16c)
  // between the kernels that take it (layout.cc), instead of reordering to and from row-major
  // NCHW around every convolution. Off: every buffer row-major (for tests and A/B benchmarks).
  bool blocked_layouts = true;
  // Run compiler::Optimize before lowering. Off: lower the graph exactly as given.
  bool optimize = true;
  // Run the loop fusion pass last (with optimize): chains of cheap elementwise ops become one
  // fused loop kernel each (fused_loop.cc). Off with prefer_loops, so those tests keep checking
  // the per-op loops.
  bool fuse = true;
  // Look the optimized graph up in `compile_cache` (compiler/cache.h; borrowed, owned by the
  // caller) before running the pipeline; the key covers the graph, the compiler version, the
  // options above and oneDNN's ISA. Null: no cache. The kiln CLI makes one cache per process from
  // $KILN_CACHE_DIR / KILN_CACHE_LOG (cli/backends.h); libraries read no environment for it.
  bool use_compile_cache = true;
  compiler::CompileCache* compile_cache = nullptr;
  // Rematerialization (compiler/passes/remat.h): recompute cheap forward values next to their
  // late (backward) readers instead of keeping them alive. remat_memory_limit_bytes > 0 also
  // recomputes until the arena should fit that many bytes; a result that still does not fit is
  // logged as a warning (base/log.h).
  bool remat = false;
  int64_t remat_memory_limit_bytes = 0;
  // Run the data-parallel gradient all-reduce asynchronously (compiler::IsAsyncCollective): its
  // thunk hands it to the executable's communication thread (runtime/collective_stream.h) and a
  // wait thunk before its first reader blocks until it is done, with the kernels between (the
  // rest of the backward pass, ordered so by the overlap-collectives pass) running meanwhile.
  // Off: every collective runs synchronously in its thunk, as before (the same bits either way).
  bool async_collectives = true;
  // The pipeline's debugging options: passes disabled by name, IR dumps, verification after every
  // pass. Read by no one from the environment here: the caller fills them (the kiln CLI from
  // KILN_DISABLE_PASSES / KILN_DUMP_IR / KILN_VERIFY_EACH_PASS, cli/backends.h).
  compiler::PipelineOptions pipeline;
};

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options = {});

// How this backend runs a graph, as the compiler's execution plan needs it (reshapes are views,
// outputs live in the caller's tensors, which output fusions oneDNN takes): what its Compile
// passes to the compiler and plans its executables with.
compiler::BackendTraits CpuBackendTraits(const CpuBackendOptions& options = {});

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CPU_CPU_BACKEND_H_
