#include "kiln/compiler/compile.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/cache.h"
#include "kiln/compiler/passes/algebraic.h"
#include "kiln/compiler/passes/cse.h"
#include "kiln/compiler/passes/dce.h"
#include "kiln/compiler/passes/decompose.h"
#include "kiln/compiler/passes/float_normalization.h"
#include "kiln/compiler/passes/fusion.h"
#include "kiln/compiler/passes/remat.h"
#include "kiln/compiler/passes/schedule.h"
#include "kiln/compiler/passes/sharding_propagation.h"
#include "kiln/compiler/passes/spmd_partitioner.h"
#include "kiln/compiler/passes/transpose_fold.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {

namespace {

std::vector<std::string> SplitNames(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    std::string part = s.substr(start, comma - start);
    size_t b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(part.substr(b, e - b + 1));
    start = comma + 1;
  }
  return out;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& k : names) list += (list.empty() ? "" : ", ") + k;
  return list;
}

// The program pipeline's passes, in order.
std::vector<std::string> ProgramPassNames() {
  return {MixedPrecisionPass(PrecisionPolicy::kF32).name(),
          ShardingPropagation(sharding::Mesh{}).name(), SpmdPartitioner(SpmdOptions{}).name()};
}

// Every pass name of the optimize pipeline in some configuration (fusion and remat on), in order.
std::vector<std::string> OptimizePassNames() {
  CompileOptions all;
  all.fuse_loops = true;
  all.remat.enabled = true;
  all.traits.async_collectives = true;
  all.traits.supports_bf16 = [](const ir::Node&) { return true; };
  return DefaultPipeline(all)->PassNames();
}

}  // namespace

std::unique_ptr<Pipeline> ProgramPipeline(const CompileOptions& options) {
  // One disabled list serves both pipelines: this one may name every pass of the other.
  PipelineOptions pipeline_options = options.pipeline;
  pipeline_options.optional_pass_names = ProgramPassNames();
  for (const std::string& name : OptimizePassNames())
    pipeline_options.optional_pass_names.push_back(name);
  auto p = std::make_unique<Pipeline>("program", std::move(pipeline_options));
  const ProgramOptions& program = options.program;
  // First the precision: what the program computes, on the global program.
  if (program.precision != PrecisionPolicy::kF32)
    p->Add<MixedPrecisionPass>(program.precision, program.master_weights);
  // Then the per-rank program, before any optimization (the simplifier knows partitioned
  // programs: passes/algebraic.h).
  if (program.mesh.size > 1) {
    p->Add<ShardingPropagation>(program.mesh, program.shardings);
    p->Add<SpmdPartitioner>(SpmdOptions{.mesh = program.mesh});
  }
  return p;
}

std::unique_ptr<Pipeline> DefaultPipeline(const CompileOptions& options) {
  // disabled_passes may also name the optional passes this configuration leaves out, and those
  // of the program pipeline.
  PipelineOptions pipeline_options = options.pipeline;
  pipeline_options.optional_pass_names = {FloatNormalizationPass(nullptr).name(),
                                          FusionPass().name(), RematPass().name(),
                                          OverlapCollectivesPass().name()};
  for (const std::string& name : ProgramPassNames())
    pipeline_options.optional_pass_names.push_back(name);
  auto p = std::make_unique<Pipeline>("optimize", std::move(pipeline_options));
  p->Add<DecomposePass>(options.keep_composite);
  std::vector<std::unique_ptr<Pass>> simplify;
  simplify.push_back(std::make_unique<AlgebraicSimplifierPass>());
  simplify.push_back(std::make_unique<ConstantFoldPass>(options.max_fold_elements));
  simplify.push_back(std::make_unique<CsePass>());
  simplify.push_back(std::make_unique<TransposeFoldPass>());
  simplify.push_back(std::make_unique<DcePass>());
  p->AddFixedPointGroup("simplify", std::move(simplify));
  // After the precision policy (applied before the pipeline) and simplification, before fusion:
  // the bf16 ops the backend cannot run compute in f32, and fusion then merges the converts this
  // adds into the neighbouring loops.
  if (options.traits.supports_bf16) p->Add<FloatNormalizationPass>(options.traits.supports_bf16);
  if (options.fuse_loops) p->Add<FusionPass>(FusionOptions{.can_fuse = options.traits.can_fuse});
  if (options.remat.enabled || options.remat.memory_limit_bytes > 0)
    p->Add<RematPass>(options.remat, options.traits);
  // Last: it only reorders, and keeps fusion groups contiguous.
  p->Add<SchedulePass>(options.traits);
  // Then, for a backend that runs collectives asynchronously: start each as early and wait as
  // late as the graph allows (only reorders, after the memory schedule).
  if (options.traits.async_collectives) p->Add<OverlapCollectivesPass>(options.traits);
  return p;
}

std::vector<std::string> AllPassNames() {
  std::vector<std::string> names = OptimizePassNames();
  for (const std::string& name : ProgramPassNames()) names.push_back(name);
  return names;
}

absl::Status ApplyPipelineVariables(const PipelineVariables& vars, PipelineOptions* options) {
  if (vars.disable_passes != nullptr) {
    const std::vector<std::string> known = AllPassNames();
    for (const std::string& d : SplitNames(vars.disable_passes)) {
      if (std::find(known.begin(), known.end(), d) == known.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("KILN_DISABLE_PASSES names unknown pass '", d,
                         "' (KILN_DISABLE_PASSES=", vars.disable_passes, "); the passes are ",
                         JoinNames(known), ": fix the name or unset KILN_DISABLE_PASSES"));
      }
      options->disabled_passes.push_back(d);
    }
  }
  if (vars.verify_each_pass != nullptr && *vars.verify_each_pass != '\0')
    options->verify_each_pass = std::string(vars.verify_each_pass) != "0";
  if (vars.dump_ir != nullptr && *vars.dump_ir != '\0' && options->dump_dir.empty())
    options->dump_dir = vars.dump_ir;
  return absl::OkStatus();
}

absl::StatusOr<ir::Graph> Optimize(const ir::Graph& graph, const CompileOptions& options) {
  std::unique_ptr<Pipeline> p = DefaultPipeline(options);
  ir::Graph out = graph;
  KILN_RETURN_IF_ERROR(p->Run(out).status());
  return out;
}

absl::StatusOr<ir::Graph> ApplyPrecisionPolicy(const ir::Graph& graph, PrecisionPolicy policy,
                                               const std::vector<std::string>& master_weights) {
  ir::Graph out = graph;
  MixedPrecisionPass pass(policy, master_weights);
  KILN_RETURN_IF_ERROR(pass.Run(out).status());
  return out;
}

absl::StatusOr<CompiledModule> Compile(const ir::Graph& input, const BackendTraits& traits,
                                       const CompileOptions& options, CompileCache* cache,
                                       const std::string& backend_key) {
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(input), "compile: invalid graph"));
  // The program pipeline first: it decides what the program computes (empty: as given).
  ir::Graph rewritten;
  const ir::Graph* graph_ptr = &input;
  std::unique_ptr<Pipeline> program = ProgramPipeline(options);
  if (!program->PassNames().empty()) {
    rewritten = input;
    KILN_RETURN_IF_ERROR(Annotate(program->Run(rewritten).status(), "compile: program"));
    // Also without verify_each_pass: a partitioned program is checked before it runs.
    KILN_RETURN_IF_ERROR(Annotate(ir::Verify(rewritten), "compile: after the program pipeline"));
    graph_ptr = &rewritten;
  }
  const ir::Graph& graph = *graph_ptr;
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
  m.f32_compute = FloatNormalizedOps(m.graph);  // read off the graph: cache hits have it too
  m.plan = PlanExecution(m.graph, traits);
  m.buffers = PlanBuffers(m.graph, &m.plan);
  return m;
}

}  // namespace kiln::compiler
