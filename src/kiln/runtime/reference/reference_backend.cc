#include "kiln/runtime/reference/reference_backend.h"

#include <cmath>
#include <limits>

#include "kiln/base/status.h"
#include "kiln/compiler/buffer_plan.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/reference/kernels.h"

namespace kiln::runtime {
namespace reference {

absl::Status Unsupported(const ir::Node& n, const std::string& why) {
  return absl::InvalidArgumentError(
      "reference backend: " + std::string(ir::OpcodeName(n.opcode())) + " %" +
      std::to_string(n.id()) + ": " + why);
}

absl::Status CheckDType(const ir::Node& n, DType t, unsigned allowed, const std::string& what) {
  bool ok =
      (allowed & kAnyTypes) || ((allowed & kFloatTypes) && IsFloating(t) && !IsStorageOnly(t)) ||
      ((allowed & kIntTypes) && IsInteger(t)) || ((allowed & kBoolTypes) && t == DType::kBool);
  if (ok) return absl::OkStatus();
  return Unsupported(n, "dtype " + std::string(DTypeName(t)) + " is not supported (" + what + ")");
}

namespace {

class KernelThunk : public Thunk {
 public:
  KernelThunk(std::string name, Kernel kernel)
      : name_(std::move(name)), kernel_(std::move(kernel)) {}
  void Run(RunContext& ctx) override { kernel_(ctx); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Kernel kernel_;
};

// Returns the kernel for one node; parameters and constants never get here.
absl::StatusOr<Kernel> MakeKernel(const ir::Graph& g, const ir::Node& n) {
  using ir::Opcode;
  // Elementwise ops share one kernel family: the per-element rules are in ir/element_semantics.
  if (ir::OpcodeKind(n.opcode()) == ir::OpKind::kElementwise) return MakeElementwiseKernel(g, n);
  switch (n.opcode()) {
    case Opcode::kAllGather:
    case Opcode::kAllReduce:
    case Opcode::kBroadcastInDim:
    case Opcode::kConcatenate:
    case Opcode::kGather:
    case Opcode::kIota:
    case Opcode::kPad:
    case Opcode::kReduceScatter:
    case Opcode::kReshape:
    case Opcode::kScatterAdd:
    case Opcode::kSlice:
    case Opcode::kTranspose:
      return MakeStructuralKernel(g, n);
    case Opcode::kArgmax:
    case Opcode::kReduceMax:
    case Opcode::kReduceMin:
    case Opcode::kReduceSum:
      return MakeReductionKernel(g, n);
    case Opcode::kConv2d:
    case Opcode::kConv2dBackwardFilter:
    case Opcode::kConv2dBackwardInput:
    case Opcode::kDotGeneral:
      return MakeContractionKernel(g, n);
    case Opcode::kAvgPool2d:
    case Opcode::kAvgPool2dGrad:
    case Opcode::kMaxPool2d:
    case Opcode::kMaxPool2dGrad:
      return MakePoolingKernel(g, n);
    case Opcode::kAttention:
    case Opcode::kCrossEntropy:
    case Opcode::kLayerNorm:
    case Opcode::kLogSoftmax:
    case Opcode::kRmsNorm:
    case Opcode::kSoftmax:
      return MakeCompositeKernel(g, n);
    case Opcode::kRandomBits:
      return MakeRandomKernel(g, n);
    // No kernel: the executable points their buffers at the literal and the caller's tensor.
    case Opcode::kConstant:
    case Opcode::kParameter:
    default:
      break;
  }
  return absl::InternalError("reference backend: no kernel for " +
                             std::string(ir::OpcodeName(n.opcode())));
}

class ReferenceBackend : public Backend {
 public:
  std::string name() const override { return "reference"; }

  // One plain-loop kernel per node (fusion groups a graph carries are ignored), every value in the
  // arena.
  compiler::BackendTraits Traits() const override { return {.fusion = false}; }

  // The oracle runs the graph as given: no pass at all (compiler::CompileOptions::optimize off).
  absl::StatusOr<std::unique_ptr<Executable>> Compile(const ir::Graph& graph) override {
    compiler::CompileOptions options;
    options.optimize = false;
    absl::StatusOr<compiler::CompiledModule> m = compiler::Compile(graph, Traits(), options);
    KILN_RETURN_IF_ERROR(Annotate(m.status(), "reference backend"));
    return Lower(*m);
  }

  absl::StatusOr<std::unique_ptr<Executable>> Lower(const compiler::CompiledModule& m) override {
    std::vector<std::unique_ptr<Thunk>> thunks;
    for (const compiler::ExecutionPlan::Kernel& k : m.plan.kernels) {
      const ir::Node& n = m.graph.node(k.members.back());
      KILN_ASSIGN_OR_RETURN(Kernel kernel, MakeKernel(m.graph, n));
      thunks.push_back(std::make_unique<KernelThunk>(
          std::string(ir::OpcodeName(n.opcode())) + " %" + std::to_string(n.id()),
          std::move(kernel)));
    }
    return std::make_unique<Executable>(m.graph, m.buffers, std::move(thunks), name());
  }

  nlohmann::json Describe() const override {
    return {{"backend", name()}, {"optimize", false}, {"fusion", false}};
  }
};

}  // namespace
}  // namespace reference

std::unique_ptr<Backend> MakeReferenceBackend() {
  return std::make_unique<reference::ReferenceBackend>();
}

}  // namespace kiln::runtime
