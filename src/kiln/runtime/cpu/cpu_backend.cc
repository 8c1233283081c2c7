#include "kiln/runtime/cpu/cpu_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/compile.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/buffer_plan.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime {
namespace cpu {
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

LowerResult LowerNode(const ir::Node& n, LowerContext& lc) {
  switch (n.opcode()) {
    case Opcode::kDotGeneral:
      return LowerDotGeneral(n, lc);
    case Opcode::kConv2d:
    case Opcode::kConv2dBackwardInput:
    case Opcode::kConv2dBackwardFilter:
      return LowerConv(n, lc);
    case Opcode::kMaxPool2d:
    case Opcode::kAvgPool2d:
    case Opcode::kAvgPool2dGrad:
      return OneDnnOrLoop(n, lc, LowerPool, LowerPoolLoop);
    case Opcode::kMaxPool2dGrad:
      return LowerMaxPoolGrad(n, lc);

    case Opcode::kAbs:
    case Opcode::kExp:
    case Opcode::kGelu:
    case Opcode::kLog:
    case Opcode::kRelu:
    case Opcode::kSigmoid:
    case Opcode::kSilu:
    case Opcode::kSqrt:
    case Opcode::kTanh:
      return OneDnnOrLoop(n, lc, LowerOneDnnUnary, LowerUnaryLoop);
    case Opcode::kCos:
    case Opcode::kErf:
    case Opcode::kNeg:
    case Opcode::kRsqrt:
    case Opcode::kSign:
    case Opcode::kSin:
      return LowerUnaryLoop(n, lc);
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
      return OneDnnOrLoop(n, lc, LowerOneDnnBinary, LowerBinaryLoop);
    case Opcode::kMax:
    case Opcode::kMin:
    case Opcode::kPow:
      return LowerBinaryLoop(n, lc);
    case Opcode::kCompare:
      return LowerCompare(n, lc);
    case Opcode::kSelect:
      return LowerSelect(n, lc);
    case Opcode::kLogicalAnd:
    case Opcode::kLogicalOr:
    case Opcode::kLogicalNot:
      return LowerLogical(n, lc);
    case Opcode::kConvert:
      return OneDnnOrLoop(n, lc, LowerOneDnnConvert, LowerConvertLoop);

    case Opcode::kBroadcastInDim:
    case Opcode::kConcatenate:
    case Opcode::kPad:
    case Opcode::kReshape:
    case Opcode::kSlice:
    case Opcode::kTranspose:
      return LowerStructural(n, lc);
    case Opcode::kGather:
    case Opcode::kIota:
    case Opcode::kScatterAdd:
      return LowerIndexing(n, lc);

    case Opcode::kReduceMax:
    case Opcode::kReduceMin:
    case Opcode::kReduceSum:
      return LowerReduce(n, lc);
    case Opcode::kArgmax:
      return LowerArgmax(n, lc);

    case Opcode::kSoftmax:
    case Opcode::kLogSoftmax:
      return OneDnnOrLoop(n, lc, LowerOneDnnSoftmax, LowerSoftmaxLoop);
    case Opcode::kLayerNorm:
      return OneDnnOrLoop(n, lc, LowerOneDnnLayerNorm, LowerLayerNormLoop);
    case Opcode::kRmsNorm:
      return LowerRmsNorm(n, lc);
    case Opcode::kCrossEntropy:
      return LowerCrossEntropy(n, lc);
    case Opcode::kAttention:
      return LowerAttention(n, lc);

    case Opcode::kRandomBits:
    case Opcode::kAllReduce:
    case Opcode::kAllGather:
    case Opcode::kReduceScatter:
      return LowerMisc(n, lc);

    case Opcode::kParameter:
    case Opcode::kConstant:
      return std::unique_ptr<Thunk>();
  }
  return Unimplemented(n, "no lowering");
}

// The composites LowerNode handles itself (oneDNN or a dedicated loop); the compiler leaves them
// whole instead of decomposing them into primitives.
bool LowersNatively(Opcode op) {
  switch (op) {
    case Opcode::kSoftmax:
    case Opcode::kLogSoftmax:
    case Opcode::kLayerNorm:
    case Opcode::kRmsNorm:
    case Opcode::kCrossEntropy:
    case Opcode::kAttention:
      return true;
    default:
      return false;
  }
}

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {}

  std::string name() const override { return "cpu"; }

  absl::StatusOr<std::unique_ptr<Executable>> Compile(const ir::Graph& input) override {
    KILN_RETURN_IF_ERROR(Annotate(ir::Verify(input), "cpu backend: invalid graph"));
    if (!options_.optimize) return Lower(input);
    compiler::CompileOptions copts;
    copts.keep_composite = LowersNatively;
    absl::StatusOr<ir::Graph> optimized = compiler::Optimize(input, copts);
    KILN_RETURN_IF_ERROR(Annotate(optimized.status(), "cpu backend: optimizing"));
    return Lower(*optimized);
  }

 private:
  absl::StatusOr<std::unique_ptr<Executable>> Lower(const ir::Graph& graph) {
    auto ctx = std::make_shared<CpuContext>();
    LowerContext lc{graph, ctx, options_};
    std::vector<std::unique_ptr<Thunk>> thunks;
    for (const ir::Node& n : graph.nodes()) {
      if (n.opcode() == Opcode::kParameter || n.opcode() == Opcode::kConstant) continue;
      if (n.type().shape.num_elements() == 0) continue;  // nothing to compute
      if (n.type().shape.rank() > kMaxRank)
        return Unimplemented(n, absl::StrCat("rank above ", kMaxRank));
      for (int op : n.operands())
        if (graph.node(op).type().shape.rank() > kMaxRank)
          return Unimplemented(n, absl::StrCat("operand rank above ", kMaxRank));
      LowerResult thunk;
      try {
        thunk = LowerNode(n, lc);
      } catch (const dnnl::error& e) {
        thunk = Unimplemented(n, absl::StrCat("oneDNN: ", e.what()));
      }
      if (!thunk.ok()) return thunk.status();
      if (*thunk) thunks.push_back(std::move(*thunk));
    }
    ctx->AllocateWorkspace();
    return std::make_unique<Executable>(graph, PlanBuffers(graph), std::move(thunks), "cpu");
  }

  CpuBackendOptions options_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace kiln::runtime
