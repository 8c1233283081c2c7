#include "kiln/runtime/cpu/cpu_backend.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/compiler/cache.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/ir/op_traits.h"
#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/cpu/internal/fused_loop.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/runtime/cpu/machine.h"

namespace kiln::runtime {
namespace cpu {
LowerResult LowerQuantized(const ir::Node& n, LowerContext& lc);  // quantized.cc (int8 ops)
namespace {

using ir::Opcode;

// Runs the oneDNN lowering unless loops are preferred; falls back to the loop when oneDNN cannot
// run the op (Unimplemented: dtype or shape it lacks).
LowerResult OneDnnOrLoop(const ir::Node& n, LowerContext& lc,
                         LowerResult (*onednn)(const ir::Node&, LowerContext&),
                         LowerResult (*loop)(const ir::Node&, LowerContext&)) {
  if (!lc.options.prefer_loops) {
    LowerResult r = onednn(n, lc);
    if (r.ok() || r.status().code() != absl::StatusCode::kUnimplemented) return r;
  }
  return loop(n, lc);
}

// Dispatches on the op's kernel family (opcodes.def); an elementwise op with a library algorithm
// (its `alg` column) tries oneDNN first.
LowerResult LowerNode(const ir::Node& n, LowerContext& lc) {
  using F = ir::KernelFamily;
  const ir::OpInfo& t = ir::OpTraits(n.opcode());
  // exp and tanh run Kiln's vector kernels (vector_math.cc) whether fused or not, so that a value
  // computes the same bits either way; oneDNN's versions round differently.
  const bool shared_kernel = n.opcode() == Opcode::kExp || n.opcode() == Opcode::kTanh;
  const bool onednn = t.alg != ir::EltwiseAlg::kNone && !shared_kernel;
  switch (t.family) {
    case F::kDot:
      return LowerDotGeneral(n, lc);
    case F::kConv:
      return LowerConv(n, lc);
    case F::kPool:
      return OneDnnOrLoop(n, lc, LowerPool, LowerPoolLoop);
    case F::kMaxPoolGrad:
      return LowerMaxPoolGrad(n, lc);
    case F::kUnary:
      return onednn ? OneDnnOrLoop(n, lc, LowerOneDnnUnary, LowerUnaryLoop) : LowerUnaryLoop(n, lc);
    case F::kBinary:
      return onednn ? OneDnnOrLoop(n, lc, LowerOneDnnBinary, LowerBinaryLoop)
                    : LowerBinaryLoop(n, lc);
    case F::kCompare:
      return LowerCompare(n, lc);
    case F::kSelect:
      return LowerSelect(n, lc);
    case F::kLogical:
      return LowerLogical(n, lc);
    case F::kConvert:
      return OneDnnOrLoop(n, lc, LowerOneDnnConvert, LowerConvertLoop);
    case F::kStructural:
      return LowerStructural(n, lc);
    case F::kIndexing:
      return LowerIndexing(n, lc);
    case F::kReduce:
      return LowerReduce(n, lc);
    case F::kArgmax:
      return LowerArgmax(n, lc);
    case F::kSoftmax:
      return OneDnnOrLoop(n, lc, LowerOneDnnSoftmax, LowerSoftmaxLoop);
    case F::kLayerNorm:
      return OneDnnOrLoop(n, lc, LowerOneDnnLayerNorm, LowerLayerNormLoop);
    case F::kRmsNorm:
      return LowerRmsNorm(n, lc);
    case F::kCrossEntropy:
      return LowerCrossEntropy(n, lc);
    case F::kAttention:
      return LowerAttention(n, lc);
    case F::kRandom:
    case F::kCollective:
      return LowerMisc(n, lc);
    case F::kQuantized:
      return LowerQuantized(n, lc);  // quantized.cc
    case F::kNone:                   // parameter, constant
      return std::unique_ptr<Thunk>();
  }
  return Unimplemented(n, "no lowering");
}

// The composites LowerNode handles itself (oneDNN or a dedicated loop): today every composite's
// family has a cpu kernel. The compiler leaves them whole instead of decomposing them.
bool LowersNatively(Opcode op) {
  using F = ir::KernelFamily;
  if (!ir::IsComposite(op)) return false;
  switch (ir::OpTraits(op).family) {
    case F::kSoftmax:
    case F::kLayerNorm:
    case F::kRmsNorm:
    case F::kCrossEntropy:
    case F::kAttention:
      return true;
    default:
      return false;
  }
}

}  // namespace
}  // namespace cpu

namespace cpu {
namespace {
// The ops whose only fast kernel is oneDNN's (their loops are plain scalar code): below
// avx512_core oneDNN has no bf16 form of them, so they compute in f32 (float-normalization)
// instead of relying on per-primitive reorders. The other bf16 ops run as they are: the
// elementwise, reduction, normalization and pooling loops (and max_pool2d_grad's) compute bf16
// in f32 registers themselves, attention widens its operands to f32, and a oneDNN eltwise,
// binary, softmax, layer norm or pooling that oneDNN refuses falls back to its loop.
bool Bf16OnlyThroughOneDnn(Opcode op) {
  using F = ir::KernelFamily;
  const F family = ir::OpTraits(op).family;
  return family == F::kDot || family == F::kConv;
}
}  // namespace
}  // namespace cpu

// Reshapes are views, graph outputs are computed into the caller's tensors, an output fusion
// runs as one oneDNN primitive only where oneDNN takes its post-ops, and bf16 contractions run
// in bf16 only where oneDNN has bf16 kernels (OneDnnHasBf16).
compiler::BackendTraits CpuBackendTraits(const CpuBackendOptions& options) {
  using cpu::CanLowerConvEpilogue;
  using cpu::CanLowerMatmulEpilogue;
  compiler::BackendTraits t;
  t.alias_reshapes = true;
  t.outputs_outside_arena = true;
  t.hoist_constants = true;
  t.async_collectives = options.async_collectives;
  const bool prefer_loops = options.prefer_loops;
  t.can_fuse = [prefer_loops](const ir::Graph& g, ir::FusionKind kind,
                              const std::vector<int>& members) {
    switch (kind) {
      case ir::FusionKind::kMatmulEpilogue:
        return CanLowerMatmulEpilogue(g, members, prefer_loops);
      case ir::FusionKind::kConvEpilogue:
        return CanLowerConvEpilogue(g, members, prefer_loops);
      case ir::FusionKind::kLoop:
      case ir::FusionKind::kReduction:
        break;
    }
    return true;  // a loop group: the fused loop kernel runs every loop-fusible op
  };
  // Always set, so the float-normalization pass is in the pipeline (and can be disabled or dumped
  // by name) on every CPU; it changes nothing where oneDNN has bf16 kernels.
  const bool bf16 = OneDnnHasBf16();
  t.supports_bf16 = [bf16](const ir::Node& n) {
    return bf16 || !cpu::Bf16OnlyThroughOneDnn(n.opcode());
  };
  if (!bf16) t.bf16_note = kOneDnnNoBf16;
  return t;
}

namespace cpu {
namespace {

class CpuBackend : public Backend {
 public:
  CpuBackend(const CpuBackendOptions& options, absl::Status isa_status)
      : options_(options), isa_status_(std::move(isa_status)) {}

  std::string name() const override { return "cpu"; }

  compiler::BackendTraits Traits() const override { return CpuBackendTraits(options_); }

  compiler::PipelineOptions pipeline_options() const override { return options_.pipeline; }

  using Backend::Compile;
  absl::StatusOr<std::unique_ptr<Executable>> Compile(
      const ir::Graph& input, const compiler::ProgramOptions& program) override {
    KILN_RETURN_IF_ERROR(Annotate(isa_status_, "cpu backend"));
    compiler::CompileOptions copts;
    copts.optimize = options_.optimize;
    copts.program = program;
    copts.pipeline = options_.pipeline;
    copts.keep_composite = LowersNatively;
    copts.fuse_loops = options_.fuse && !options_.prefer_loops;
    copts.remat.enabled = options_.remat || options_.remat_memory_limit_bytes > 0;
    copts.remat.memory_limit_bytes = options_.remat_memory_limit_bytes;
    // Optimize's result depends on the ISA (float-normalization computes bf16 contractions in
    // f32 below avx512_core), so the ISA is in the cache key.
    static const std::string backend_key = "cpu/" + OneDnnIsaName();
    compiler::CompileCache* cache = options_.use_compile_cache ? options_.compile_cache : nullptr;
    absl::StatusOr<compiler::CompiledModule> m =
        compiler::Compile(input, Traits(), copts, cache, backend_key);
    KILN_RETURN_IF_ERROR(Annotate(m.status(), "cpu backend"));
    absl::StatusOr<std::unique_ptr<Executable>> exe = Lower(*m);
    if (exe.ok() && options_.remat_memory_limit_bytes > 0 &&
        (*exe)->plan().arena_bytes > options_.remat_memory_limit_bytes) {
      KILN_LOG(WARNING) << absl::StrFormat(
          "cpu backend: graph '%s' needs a %.1f MiB arena, over the remat memory limit of %.1f "
          "MiB: nothing left worth recomputing",
          input.name(), (*exe)->plan().arena_bytes / 1048576.0,
          options_.remat_memory_limit_bytes / 1048576.0);
    }
    return exe;
  }

  nlohmann::json Describe() const override {
    // Passes disabled by name only matter when the pipeline runs.
    std::vector<std::string> disabled;
    if (options_.optimize) disabled = options_.pipeline.disabled_passes;
    const bool fusion_disabled =
        std::find(disabled.begin(), disabled.end(), "fusion") != disabled.end();
    return {{"backend", "cpu/" + OneDnnIsaName()},
            {"isa", CpuIsaDescription()},
            {"optimize", options_.optimize},
            {"fusion",
             options_.optimize && options_.fuse && !options_.prefer_loops && !fusion_disabled},
            {"prefer_loops", options_.prefer_loops},
            {"remat", options_.remat || options_.remat_memory_limit_bytes > 0},
            {"compile_cache", options_.use_compile_cache && options_.compile_cache != nullptr},
            {"disabled_passes", disabled}};
  }

  absl::StatusOr<std::unique_ptr<Executable>> Lower(const compiler::CompiledModule& m) override {
    const ir::Graph& graph = m.graph;
    const compiler::ExecutionPlan& plan = m.plan;
    auto ctx = std::make_shared<CpuContext>();
    LowerContext lc{graph, ctx, options_, {}};
    if (options_.blocked_layouts) lc.blocked = AssignBlockedLayouts(plan, lc);
    const int n = graph.num_nodes();
    for (const ir::Node& node : graph.nodes()) {
      if (node.type().shape.rank() > kMaxRank)
        return Unimplemented(node, absl::StrCat("rank above ", kMaxRank));
    }

    // How the graph runs (fusion groups, views, aliases, what is stored where): the plan the
    // compiler's schedule and remat passes saw too.
    FusionReads reads;
    for (const compiler::ExecutionPlan::Kernel& k : plan.kernels) {
      if (k.kind == compiler::ExecutionPlan::KernelKind::kNode) continue;
      for (int m : k.members) {
        std::vector<FusionReads::Read>& r = reads.by_member[m];
        for (const compiler::ExecutionPlan::Read& read : plan.operand_reads[m])
          r.push_back(
              {read.node, read.broadcast < 0
                              ? nullptr
                              : &graph.node(read.broadcast).attr_ints("broadcast_dimensions")});
      }
    }

    std::vector<std::unique_ptr<Thunk>> thunks, init_thunks;
    // Asynchronous collectives' wait thunks, by the step of the kernel they go before.
    std::map<int, std::vector<std::unique_ptr<Thunk>>> waits;
    for (const compiler::ExecutionPlan::Kernel& k : plan.kernels) {
      const ir::Node& node = graph.node(k.members.back());
      if (auto w = waits.find(node.id()); w != waits.end()) {
        for (std::unique_ptr<Thunk>& t : w->second) thunks.push_back(std::move(t));
        waits.erase(w);
      }
      if (k.kind == compiler::ExecutionPlan::KernelKind::kNode && plan.done_step[node.id()] >= 0) {
        AsyncThunks async = LowerAsyncAllReduce(node, lc);  // misc.cc
        thunks.push_back(std::move(async.start));
        waits[plan.done_step[node.id()]].push_back(std::move(async.wait));
        continue;
      }
      if (k.kind == compiler::ExecutionPlan::KernelKind::kNode) {
        for (int op : node.operands())
          if (graph.node(op).type().shape.rank() > kMaxRank)
            return Unimplemented(node, absl::StrCat("operand rank above ", kMaxRank));
      }
      // Every oneDNN call of the lowerings goes through DnnlStatus already; this one catches
      // what a lowering might still let through (memory objects), with the same message.
      LowerResult thunk;
      absl::Status made = DnnlStatus(lc, node, "lowering", [&] {
        switch (k.kind) {
          case compiler::ExecutionPlan::KernelKind::kLoop:
            thunk = LowerFusedLoop(k.members, reads, plan.needed, lc);
            break;
          case compiler::ExecutionPlan::KernelKind::kConvEpilogue:
            thunk = LowerConvEpilogue(k, lc);
            break;
          case compiler::ExecutionPlan::KernelKind::kMatmulEpilogue:
            thunk = LowerMatmulEpilogue(k, lc);
            break;
          case compiler::ExecutionPlan::KernelKind::kNode:
            thunk = LowerNode(node, lc);
            break;
        }
      });
      if (!made.ok()) return made;
      if (!thunk.ok()) return thunk.status();
      if (*thunk) (plan.hoisted[node.id()] ? init_thunks : thunks).push_back(std::move(*thunk));
    }
    // Waits for results only the end of the run reads (graph outputs).
    for (auto& [step, ws] : waits)
      for (std::unique_ptr<Thunk>& t : ws) thunks.push_back(std::move(t));
    ctx->AllocateWorkspace();
    compiler::BufferPlan buffers = m.buffers;
    for (int id = 0; id < n; ++id)
      if (plan.alias_of[id] != id) buffers.aliases.push_back({id, plan.alias_of[id]});
    // Graph outputs computed by a kernel live in the caller's tensors, not in the arena.
    buffers.outside_arena = plan.outside_arena;
    buffers.in_place_outputs = plan.in_place_outputs;
    for (int id = 0; id < n; ++id)
      if (plan.hoisted[id]) buffers.hoisted.push_back(id);
    return std::make_unique<Executable>(graph, std::move(buffers), std::move(thunks), "cpu",
                                        std::move(init_thunks));
  }

  CpuBackendOptions options_;
  absl::Status isa_status_;  // SetCpuIsaCap's answer to options_.max_isa
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  // The ISA level is decided, and oneDNN capped, before anything compiles; a cap the process
  // can no longer take is the error of every Compile.
  absl::Status isa = options.max_isa ? SetCpuIsaCap(*options.max_isa) : absl::OkStatus();
  EnsureOneDnnIsa();
  return std::make_unique<cpu::CpuBackend>(options, std::move(isa));
}

}  // namespace kiln::runtime
