// MakeKernel's dispatch by opcode kind, EvaluateNode, and the dtype checks every family shares.
#include "kiln/eval/kernels.h"

#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/op_traits.h"

namespace kiln::eval {

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

absl::StatusOr<Kernel> MakeKernel(const ir::Node& n, OperandTypes types) {
  if (types.size() != n.operands().size())
    return Unsupported(n, "expected " + std::to_string(n.operands().size()) + " operand types");
  using F = ir::KernelFamily;
  switch (ir::OpTraits(n.opcode()).family) {
    case F::kUnary:
    case F::kBinary:
    case F::kCompare:
    case F::kSelect:
    case F::kLogical:
    case F::kConvert:
      return MakeElementwiseKernel(n, types);  // per-element rules: ir/element_semantics
    case F::kStructural:
    case F::kIndexing:
    case F::kCollective:
      return MakeStructuralKernel(n, types);
    case F::kReduce:
    case F::kArgmax:
      return MakeReductionKernel(n, types);
    case F::kDot:
    case F::kConv:
      return MakeContractionKernel(n, types);
    case F::kPool:
    case F::kMaxPoolGrad:
      return MakePoolingKernel(n, types);
    case F::kSoftmax:
    case F::kLayerNorm:
    case F::kRmsNorm:
    case F::kCrossEntropy:
    case F::kAttention:
      return MakeCompositeKernel(n, types);
    case F::kRandom:
      return MakeRandomKernel(n, types);
    case F::kQuantized:
      return MakeQuantizedKernel(n, types);
    case F::kNone:  // parameter and constant: the caller owns their data
      break;
  }
  return absl::UnimplementedError("reference kernels: no kernel for " +
                                  std::string(ir::OpcodeName(n.opcode())));
}

absl::StatusOr<Tensor> EvaluateNode(const ir::Node& n, absl::Span<const Tensor* const> operands) {
  if (operands.size() != n.operands().size())
    return Unsupported(n, "expected " + std::to_string(n.operands().size()) + " operands, got " +
                              std::to_string(operands.size()));
  std::vector<ir::Type> types;
  std::vector<void*> buffers;
  for (size_t i = 0; i < operands.size(); ++i) {
    if (operands[i] == nullptr) return Unsupported(n, "operand " + std::to_string(i) + " is null");
    types.push_back({operands[i]->dtype(), operands[i]->shape()});
    // Kernels only read operand slots.
    buffers.push_back(const_cast<void*>(operands[i]->raw_data()));
  }
  KILN_ASSIGN_OR_RETURN(Kernel kernel, MakeKernel(n, types));
  Tensor out(n.type().dtype, n.type().shape);
  buffers.push_back(out.raw_data());
  kernel(buffers);
  return out;
}

}  // namespace kiln::eval
