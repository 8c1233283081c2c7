#include "kiln/compiler/compile.h"

#include "kiln/base/status.h"
#include "kiln/compiler/cache.h"
#include "kiln/compiler/passes/algebraic.h"
#include "kiln/compiler/passes/cse.h"
#include "kiln/compiler/passes/dce.h"
#include "kiln/compiler/passes/decompose.h"
#include "kiln/compiler/passes/fusion.h"
#include "kiln/compiler/passes/remat.h"
#include "kiln/compiler/passes/schedule.h"
#include "kiln/compiler/passes/transpose_fold.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {

std::unique_ptr<Pipeline> DefaultPipeline(const CompileOptions& options) {
  // KILN_DISABLE_PASSES may also name the optional passes this configuration leaves out.
  PipelineOptions pipeline_options = options.pipeline;
  pipeline_options.env_pass_names = {FusionPass().name(), RematPass().name()};
  auto p = std::make_unique<Pipeline>("optimize", std::move(pipeline_options));
  p->Add<DecomposePass>(options.keep_composite);
  std::vector<std::unique_ptr<Pass>> simplify;
  simplify.push_back(std::make_unique<AlgebraicSimplifierPass>());
  simplify.push_back(std::make_unique<ConstantFoldPass>(options.max_fold_elements));
  simplify.push_back(std::make_unique<CsePass>());
  simplify.push_back(std::make_unique<TransposeFoldPass>());
  simplify.push_back(std::make_unique<DcePass>());
  p->AddFixedPointGroup("simplify", std::move(simplify));
  if (options.fuse_loops) p->Add<FusionPass>(FusionOptions{.can_fuse = options.traits.can_fuse});
  if (options.remat.enabled || options.remat.memory_limit_bytes > 0)
    p->Add<RematPass>(options.remat, options.traits);
  // Last: it only reorders, and keeps fusion groups contiguous.
  p->Add<SchedulePass>(options.traits);
  return p;
}

absl::StatusOr<ir::Graph> Optimize(const ir::Graph& graph, const CompileOptions& options) {
  std::unique_ptr<Pipeline> p = DefaultPipeline(options);
  ir::Graph out = graph;
  KILN_RETURN_IF_ERROR(p->Run(out).status());
  return out;
}

absl::StatusOr<CompiledModule> Compile(const ir::Graph& graph, const BackendTraits& traits,
                                       const CompileOptions& options, CompileCache* cache,
                                       const std::string& backend_key) {
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(graph), "compile: invalid graph"));
  CompiledModule m;
  if (!options.optimize) {
    m.graph = graph;
  } else {
    CompileOptions o = options;
    o.traits = traits;
    absl::StatusOr<ir::Graph> optimized =
        cache ? cache->GetOrOptimize(graph, o, backend_key) : Optimize(graph, o);
    KILN_RETURN_IF_ERROR(Annotate(optimized.status(), "compile: optimizing"));
    m.graph = std::move(*optimized);
  }
  m.plan = PlanExecution(m.graph, traits);
  m.buffers = PlanBuffers(m.graph, &m.plan);
  return m;
}

}  // namespace kiln::compiler
