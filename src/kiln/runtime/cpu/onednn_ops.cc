// oneDNN lowerings of memory-bound ops: eltwise unary ops, binary arithmetic, softmax,
// log_softmax, layer_norm and float converts. Each returns Unimplemented when oneDNN has no
// primitive for the dtype, and the backend then uses the loop in elementwise.cc / norm.cc.
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "kiln/ir/op_traits.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;
using dt = dnnl::memory::data_type;

bool OneDnnFloat(DType t) { return t == DType::kF32 || t == DType::kBF16; }

std::vector<int64_t> Flat(const ir::Type& t) {
  return {std::max<int64_t>(1, t.shape.num_elements())};
}

}  // namespace

std::optional<OneDnnEltwiseAlg> OneDnnEltwise(const ir::Node& n) {
  using A = dnnl::algorithm;
  switch (ir::OpTraits(n.opcode()).alg) {
    case ir::EltwiseAlg::kAbs:
      return OneDnnEltwiseAlg{A::eltwise_abs};
    case ir::EltwiseAlg::kExp:
      return OneDnnEltwiseAlg{A::eltwise_exp};
    case ir::EltwiseAlg::kGelu:
      return OneDnnEltwiseAlg{n.has_attr("approximate") && n.attr_str("approximate") == "tanh"
                                  ? A::eltwise_gelu_tanh
                                  : A::eltwise_gelu_erf};
    case ir::EltwiseAlg::kLogistic:
      return OneDnnEltwiseAlg{A::eltwise_logistic};
    case ir::EltwiseAlg::kRelu:
      return OneDnnEltwiseAlg{A::eltwise_relu};
    case ir::EltwiseAlg::kSqrt:
      return OneDnnEltwiseAlg{A::eltwise_sqrt};
    case ir::EltwiseAlg::kSwish:
      return OneDnnEltwiseAlg{A::eltwise_swish, 1.f};
    case ir::EltwiseAlg::kTanh:
      return OneDnnEltwiseAlg{A::eltwise_tanh};
    default:
      return std::nullopt;
  }
}

std::optional<dnnl::algorithm> OneDnnBinary(ir::Opcode op) {
  switch (ir::OpTraits(op).alg) {
    case ir::EltwiseAlg::kAdd:
      return dnnl::algorithm::binary_add;
    case ir::EltwiseAlg::kSub:
      return dnnl::algorithm::binary_sub;
    case ir::EltwiseAlg::kMul:
      return dnnl::algorithm::binary_mul;
    case ir::EltwiseAlg::kDiv:
      return dnnl::algorithm::binary_div;
    default:
      return std::nullopt;
  }
}

// Unary ops whose `alg` column names a oneDNN eltwise algorithm (log has none: see opcodes.def).
LowerResult LowerOneDnnUnary(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  if (!OneDnnFloat(t) || lc.operand_type(n, 0).dtype != t) return UnsupportedDType(n, t);
  std::optional<OneDnnEltwiseAlg> e = OneDnnEltwise(n);
  if (!e) return Unimplemented(n, "no oneDNN eltwise algorithm");
  const dnnl::algorithm alg = e->alg;
  const float alpha = e->alpha, beta = 0.f;
  DnnlThunkBuilder b(lc, n, "onednn eltwise");
  dnnl::memory::desc md = PlainDesc(Flat(n.type()), DnnlType(t));
  dnnl::eltwise_forward::primitive_desc pd;
  KILN_RETURN_IF_ERROR(b.Create("eltwise", [&] {
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, alg, md, alpha, beta);
    pd = dnnl::eltwise_forward::primitive_desc(d, DnnlThunkBuilder::Attr(), lc.cpu->engine());
  }));
  if (IsRefImpl(pd)) return Unimplemented(n, "oneDNN has only its reference eltwise here");
  int src = b.NodeMemory(n.operand(0), md);
  int dst = b.NodeMemory(n.id(), md);
  KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::eltwise_forward>(
      "eltwise", pd, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}}));
  return b.Finish();
}

// add sub mul div (the binary ops whose `alg` column names a oneDNN binary algorithm).
LowerResult LowerOneDnnBinary(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  const ir::Type& a = lc.operand_type(n, 0);
  const ir::Type& c = lc.operand_type(n, 1);
  if (!OneDnnFloat(t) || a != n.type() || c != n.type()) return UnsupportedDType(n, t);
  std::optional<dnnl::algorithm> binary = OneDnnBinary(n.opcode());
  if (!binary) return Unimplemented(n, "no oneDNN binary algorithm");
  const dnnl::algorithm alg = *binary;
  DnnlThunkBuilder b(lc, n, "onednn binary");
  dnnl::memory::desc md = PlainDesc(Flat(n.type()), DnnlType(t));
  dnnl::binary::primitive_desc pd;
  KILN_RETURN_IF_ERROR(b.Create("binary", [&] {
    dnnl::binary::desc d(alg, md, md, md);
    pd = dnnl::binary::primitive_desc(d, DnnlThunkBuilder::Attr(), lc.cpu->engine());
  }));
  if (IsRefImpl(pd)) return Unimplemented(n, "oneDNN has only its reference binary here");
  int s0 = b.NodeMemory(n.operand(0), md);
  int s1 = b.NodeMemory(n.operand(1), md);
  int dst = b.NodeMemory(n.id(), md);
  KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::binary>(
      "binary", pd, {{DNNL_ARG_SRC_0, s0}, {DNNL_ARG_SRC_1, s1}, {DNNL_ARG_DST, dst}}));
  return b.Finish();
}

// log_softmax is not lowered here: oneDNN 2.6's logsoftmax inherits eltwise_log's ~3e-6 error
// near 1 (log_softmax of a single class gives 1.4e-6, not 0), so it always takes the loop.
LowerResult LowerOneDnnSoftmax(const ir::Node& n, LowerContext& lc) {
  if (n.opcode() != Opcode::kSoftmax) return Unimplemented(n, "oneDNN logsoftmax is inexact");
  DType t = n.type().dtype;
  const Shape& s = n.type().shape;
  if (!OneDnnFloat(t) || s.rank() == 0) return UnsupportedDType(n, t);
  int axis = static_cast<int>(n.attr_int("axis"));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s.dim(d);
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s.dim(d);
  std::vector<int64_t> dims = inner == 1 ? std::vector<int64_t>{outer, s.dim(axis)}
                                         : std::vector<int64_t>{outer, s.dim(axis), inner};
  DnnlThunkBuilder b(lc, n, "onednn softmax");
  dnnl::memory::desc md = PlainDesc(dims, DnnlType(t));
  dnnl::primitive prim;
  dnnl::memory::desc scratch;
  bool ref = false;
  KILN_RETURN_IF_ERROR(b.Create("softmax", [&] {
    dnnl::softmax_forward::desc d(dnnl::prop_kind::forward_inference, md, 1);
    dnnl::softmax_forward::primitive_desc pd(d, DnnlThunkBuilder::Attr(), lc.cpu->engine());
    prim = dnnl::softmax_forward(pd);
    scratch = pd.scratchpad_desc();
    ref = IsRefImpl(pd);
  }));
  if (ref) return Unimplemented(n, "oneDNN has only its reference softmax here");
  int src = b.NodeMemory(n.operand(0), md);
  int dst = b.NodeMemory(n.id(), md);
  b.AddStepWithScratchpad(prim, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}}, scratch);
  return b.Finish();
}

// oneDNN's layer normalization over the last dim with separate f32 scale and shift; bf16 gamma
// and beta are reordered to f32 in the workspace first.
LowerResult LowerOneDnnLayerNorm(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  const Shape& s = n.type().shape;
  if (!OneDnnFloat(t) || s.rank() == 0) return UnsupportedDType(n, t);
  if (lc.operand_type(n, 1).dtype != t || lc.operand_type(n, 2).dtype != t)
    return UnsupportedDType(n, lc.operand_type(n, 1).dtype);
  int64_t D = s.dim(s.rank() - 1);
  int64_t rows = s.num_elements() / std::max<int64_t>(D, 1);
  float eps = static_cast<float>(n.attr_float("epsilon"));
  DnnlThunkBuilder b(lc, n, "onednn layer_norm");
  dnnl::memory::desc md = PlainDesc({rows, D}, DnnlType(t));
  dnnl::memory::desc wmd = PlainDesc({D}, DnnlType(t));
  dnnl::layer_normalization_forward::primitive_desc pd;
  KILN_RETURN_IF_ERROR(b.Create("layer normalization", [&] {
    dnnl::layer_normalization_forward::desc d(
        dnnl::prop_kind::forward_inference, md, eps,
        dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift);
    pd = dnnl::layer_normalization_forward::primitive_desc(d, DnnlThunkBuilder::Attr(),
                                                           lc.cpu->engine());
  }));
  if (IsRefImpl(pd)) return Unimplemented(n, "oneDNN has only its reference layer norm here");
  int src = b.NodeMemory(n.operand(0), md);
  KILN_ASSIGN_OR_RETURN(int scale, b.Input(n.operand(1), wmd, PlainDesc({D}, dt::f32)));
  KILN_ASSIGN_OR_RETURN(int shift, b.Input(n.operand(2), wmd, PlainDesc({D}, dt::f32)));
  int dst = b.NodeMemory(n.id(), md);
  KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::layer_normalization_forward>("layer normalization", pd,
                                                                         {{DNNL_ARG_SRC, src},
                                                                          {DNNL_ARG_SCALE, scale},
                                                                          {DNNL_ARG_SHIFT, shift},
                                                                          {DNNL_ARG_DST, dst}}));
  return b.Finish();
}

// Float-to-float (f32, bf16, f16) and small-integer-to-f32 converts as oneDNN reorders: both
// round to nearest even, like the reference. Float-to-integer (truncation, saturation) and the
// other pairs use the loop.
LowerResult LowerOneDnnConvert(const ir::Node& n, LowerContext& lc) {
  DType from = lc.operand_type(n, 0).dtype, to = n.type().dtype;
  auto is_f = [](DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; };
  bool ok =
      (is_f(from) && is_f(to)) ||
      ((from == DType::kS8 || from == DType::kU8 || from == DType::kS32) && to == DType::kF32);
  if (!ok) return UnsupportedDType(n, to);
  DnnlThunkBuilder b(lc, n, "onednn reorder");
  std::vector<int64_t> dims = Flat(n.type());
  int src = b.NodeMemory(n.operand(0), PlainDesc(dims, DnnlType(from)));
  int dst = b.NodeMemory(n.id(), PlainDesc(dims, DnnlType(to)));
  dnnl::reorder::primitive_desc pd;
  KILN_RETURN_IF_ERROR(b.Create("reorder", [&] {
    pd = dnnl::reorder::primitive_desc(lc.cpu->engine(), b.Desc(src), lc.cpu->engine(), b.Desc(dst),
                                       DnnlThunkBuilder::Attr());
  }));
  KILN_RETURN_IF_ERROR(
      b.AddPrimitive<dnnl::reorder>("reorder", pd, {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}}));
  return b.Finish();
}

}  // namespace kiln::runtime::cpu
