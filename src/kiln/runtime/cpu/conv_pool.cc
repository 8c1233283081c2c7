// oneDNN convolutions (forward, backward data, backward weights) and pooling (max/avg forward,
// avg backward). Convolutions let oneDNN pick its blocked layouts (format `any`) and reorder the
// plain NCHW/OIHW tensors in and out through the workspace; a forward convolution's filter, when
// bound constant, is reordered once at bind time and kept (pre-packed); bf16 runs natively where
// the ISA has it, otherwise in f32 behind the same reorders. Pooling runs on the plain layout
// (memory-bound). max_pool2d_grad is a loop (pool_loops.cc): the gradient must go to the first max,
// exactly.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct ConvGeometry {
  std::vector<int64_t> src, wei, dst;  // oneDNN dims (wei has a leading group dim when g > 1)
  std::vector<int64_t> strides, dilates, pad_l, pad_r;
};

ConvGeometry MakeConvGeometry(const ir::Node& n, const Shape& input, const Shape& filter,
                              const Shape& output) {
  ConvGeometry g;
  const auto& st = n.attr_ints("strides");
  const auto& pad = n.attr_ints("padding");
  const auto& dil = n.attr_ints("dilation");
  int64_t groups = n.attr_int("groups");
  g.src = input.dims();
  g.dst = output.dims();
  if (groups > 1) {
    g.wei = {groups, filter.dim(0) / groups, filter.dim(1), filter.dim(2), filter.dim(3)};
  } else {
    g.wei = filter.dims();
  }
  g.strides = {st[0], st[1]};
  g.dilates = {dil[0] - 1, dil[1] - 1};
  g.pad_l = {pad[0], pad[2]};
  g.pad_r = {pad[1], pad[3]};
  return g;
}

dnnl::memory::desc Any(const std::vector<int64_t>& dims, dt t) {
  return dnnl::memory::desc(dims, t, tag::any);
}

// Source and destination layouts to try before oneDNN's own choice (format `any`) for a forward
// f32 convolution. oneDNN 2.6 picks channels-last (`brgconv`) for every convolution here, which
// on narrow layers loses to its direct jit kernel on the 16-channel blocked layout (nChw16c):
// measured at batch 256 on one AVX-512 thread, including the reorders from and to NCHW, 3x3
// convolutions of 16 and 32 channels on 8x8 and 4x4 maps took 0.55-0.95x the time, and at 64 and
// 128 channels neither won. A first layer (fewer than 16 input channels) reads the plain NCHW
// input directly and writes the blocked layout: 0.3x the time (1 -> 16 channels, 8x8), and the
// convolution alone 0.3x at 3 -> 64 channels on 32x32. An input already held in nChw16c
// (AssignBlockedLayouts) is read as it is at any width. None for other dtypes or grouped ones.
std::vector<std::pair<dnnl::memory::desc, dnnl::memory::desc>> PreferredConvLayouts(
    const ir::Node& n, const ConvGeometry& g, dt compute, bool src_blocked) {
  std::vector<std::pair<dnnl::memory::desc, dnnl::memory::desc>> out;
  if (compute != dt::f32 || n.attr_int("groups") != 1 || g.src.size() != 4) return out;
  const int64_t ic = g.src[1], oc = g.dst[1], blk = ChannelBlock();
  const dnnl::memory::desc src_b(g.src, compute, BlockedTag());
  if (src_blocked && ic % blk == 0) {
    if (oc % blk == 0) out.push_back({src_b, dnnl::memory::desc(g.dst, compute, BlockedTag())});
    out.push_back({src_b, Any(g.dst, compute)});
  } else if (ic < blk) {
    out.push_back({PlainDesc(g.src, compute), Any(g.dst, compute)});
  } else if (ic % blk == 0 && oc % blk == 0 && ic <= 32 && oc <= 32) {
    out.push_back({src_b, dnnl::memory::desc(g.dst, compute, BlockedTag())});
  }
  return out;
}

// Sets the epilogue's post-ops on `attr` in the order they apply: the activation, and the residual
// add when `residual` (its descriptor, the destination's layout) is given. Returns the residual's
// post-op index, or -1.
int SetConvPostOps(const Epilogue* ep, const dnnl::memory::desc* residual,
                   dnnl::primitive_attr& attr) {
  dnnl::post_ops ops;
  int index = -1;
  auto act = [&] {
    if (ep && ep->has_act) ops.append_eltwise(1.f, ep->act, ep->alpha, 0.f);
  };
  auto res = [&] {
    if (!residual) return;
    index = ops.len();
    ops.append_binary(dnnl::algorithm::binary_add, *residual);
  };
  if (ep && ep->residual_first && ep->residual >= 0) {
    res();
    if (residual) act();  // without the residual fused the activation must wait for it
  } else {
    act();
    res();
  }
  if (ops.len() > 0) attr.set_post_ops(ops);
  return index;
}

struct ForwardConv {
  dnnl::convolution_forward::primitive_desc pd;
  int residual_index = -1;  // post-op index of the fused residual add; -1: not fused
};

// The forward (inference) convolution primitive for `n`: the preferred layouts first, each only
// with oneDNN's direct jit kernel behind it (on these layouts its fallbacks are gemm or reference
// kernels, several times slower), then oneDNN's own pick. An epilogue's residual add is a
// binary-add post-op over a tensor in the destination's layout, which must be concrete: the
// layouts are chosen without it, then the primitive is made again with it; where oneDNN has no
// such kernel the residual is left out (residual_index -1) for the caller to add.
absl::StatusOr<ForwardConv> ForwardConvPd(const ir::Node& n, const ConvGeometry& g, dt compute,
                                          const Epilogue* ep,
                                          const std::optional<dnnl::memory::desc>& bias,
                                          bool src_blocked, const LowerContext& lc) {
  std::vector<std::pair<dnnl::memory::desc, dnnl::memory::desc>> layouts =
      PreferredConvLayouts(n, g, compute, src_blocked);
  layouts.push_back({Any(g.src, compute), Any(g.dst, compute)});
  const auto wei_any = Any(g.wei, compute);
  const auto alg = dnnl::algorithm::convolution_direct;
  auto make = [&](const dnnl::memory::desc& src_md, const dnnl::memory::desc& wei_md,
                  const dnnl::memory::desc& dst_md, const dnnl::primitive_attr& attr,
                  dnnl::convolution_forward::primitive_desc& pd) {
    const dnnl::engine& eng = lc.cpu->engine();
    return DnnlStatus(lc, n, "convolution", [&] {
      if (bias) {
        dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, src_md, wei_md,
                                          *bias, dst_md, g.strides, g.dilates, g.pad_l, g.pad_r);
        pd = dnnl::convolution_forward::primitive_desc(d, attr, eng);
      } else {
        dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, src_md, wei_md,
                                          dst_md, g.strides, g.dilates, g.pad_l, g.pad_r);
        pd = dnnl::convolution_forward::primitive_desc(d, attr, eng);
      }
    });
  };
  dnnl::primitive_attr attr = DnnlThunkBuilder::Attr();
  SetConvPostOps(ep, nullptr, attr);
  ForwardConv out;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const bool last = i + 1 == layouts.size();
    absl::Status made = make(layouts[i].first, wei_any, layouts[i].second, attr, out.pd);
    if (last) KILN_RETURN_IF_ERROR(made);
    if (made.ok() && (last || std::string(out.pd.impl_info_str()).rfind("jit:", 0) == 0)) break;
  }
  if (ep && ep->residual >= 0) {
    const dnnl::memory::desc dst = out.pd.dst_desc();
    dnnl::primitive_attr with = DnnlThunkBuilder::Attr();
    const int index = SetConvPostOps(ep, &dst, with);
    dnnl::convolution_forward::primitive_desc fused;
    if (make(out.pd.src_desc(), out.pd.weights_desc(), dst, with, fused).ok() &&
        std::string(fused.impl_info_str()) == out.pd.impl_info_str()) {
      out.pd = fused;
      out.residual_index = index;
    }
  }
  return out;
}

// Whether `md` is the blocked activation layout of this ISA level (BlockedTag).
bool IsChannelBlocked(const dnnl::memory::desc& md) {
  const auto& dims = md.dims();
  return dims.size() == 4 &&
         md == dnnl::memory::desc(dims, static_cast<dt>(md.data.data_type), BlockedTag());
}

// A conv2d, with its epilogue group `ep` (null: none), as oneDNN's forward convolution.
LowerResult LowerConvForward(const ir::Node& n, LowerContext& lc, const ConvGeometry& g, dt compute,
                             dt user, const Epilogue* ep, DnnlThunkBuilder& b) {
  const auto wei_user = PlainDesc(g.wei, user);
  const auto& eng = lc.cpu->engine();
  // Epilogue (an output fusion group): bias through the primitive's bias argument, the
  // residual as a binary-add post-op and the activation as an eltwise one, in the group's
  // order; the result goes to the group's last member.
  bool has_bias = ep && ep->bias >= 0;
  dnnl::memory::desc bias_user = PlainDesc({g.dst[1]}, user);
  // Activation layouts to ask for, best first (PreferredConvLayouts), then oneDNN's own pick.
  // The node buffers' own layouts (row-major, or nChw16c where AssignBlockedLayouts kept them
  // blocked) are what the reorders around the primitive convert from and to.
  const dnnl::memory::desc src_user = NodeDesc(lc, n.operand(0), g.src, user);
  const int out_node = ep && ep->out >= 0 ? ep->out : n.id();
  const dnnl::memory::desc dst_user = NodeDesc(lc, out_node, g.dst, user);
  KILN_ASSIGN_OR_RETURN(
      ForwardConv fc,
      ForwardConvPd(n, g, compute, ep,
                    has_bias ? std::optional(WithType(bias_user, compute)) : std::nullopt,
                    lc.is_blocked(n.operand(0)), lc));
  const dnnl::convolution_forward::primitive_desc& pd = fc.pd;
  if (compute != dt::f32 && IsRefImpl(pd)) return Unimplemented(n, "reference bf16/f16 conv");
  b.NameImpl(pd);
  KILN_ASSIGN_OR_RETURN(int src, b.Input(n.operand(0), src_user, pd.src_desc()));
  // A bound constant filter is reordered into the primitive's blocked layout once, when it is
  // bound, instead of on every run (ConstantInput).
  KILN_ASSIGN_OR_RETURN(int wei, lc.options.prepack_weights
                                     ? b.ConstantInput(n.operand(1), wei_user, pd.weights_desc())
                                     : b.Input(n.operand(1), wei_user, pd.weights_desc()));
  std::vector<std::pair<int, int>> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}};
  if (has_bias) {
    KILN_ASSIGN_OR_RETURN(int bias, b.Input(ep->bias, bias_user, WithType(bias_user, compute)));
    args.push_back({DNNL_ARG_BIAS, bias});
  }
  KILN_ASSIGN_OR_RETURN(int dst, b.Output(out_node, dst_user, pd.dst_desc()));
  args.push_back({DNNL_ARG_DST, dst});
  const bool fuse_residual = ep && ep->residual >= 0 && fc.residual_index >= 0;
  if (fuse_residual) {
    // The residual in the destination's layout (no reorder when both are blocked).
    KILN_ASSIGN_OR_RETURN(int residual,
                          b.Input(ep->residual, NodeDesc(lc, ep->residual, g.dst, user),
                                  WithType(pd.dst_desc(), user)));
    args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(fc.residual_index) | DNNL_ARG_SRC_1, residual});
  }
  KILN_RETURN_IF_ERROR(
      b.AddPrimitive<dnnl::convolution_forward>("convolution", pd, std::move(args)));
  if (ep && ep->residual >= 0 && !fuse_residual) {
    // oneDNN has no kernel with the residual as a post-op here (its brgconv takes none): a
    // binary add over the result in the node's own layout, after its reorder, as the residual
    // loop would run, with the activation when it comes after the residual.
    const int result = b.NodeMemory(out_node, dst_user);
    KILN_ASSIGN_OR_RETURN(int residual,
                          b.Input(ep->residual, NodeDesc(lc, ep->residual, g.dst, user), dst_user));
    dnnl::binary::primitive_desc add;
    KILN_RETURN_IF_ERROR(b.Create("binary add", [&] {
      dnnl::primitive_attr attr2 = DnnlThunkBuilder::Attr();
      if (ep->residual_first && ep->has_act) {
        dnnl::post_ops ops;
        ops.append_eltwise(1.f, ep->act, ep->alpha, 0.f);
        attr2.set_post_ops(ops);
      }
      dnnl::binary::desc d(dnnl::algorithm::binary_add, dst_user, b.Desc(residual), dst_user);
      add = dnnl::binary::primitive_desc(d, attr2, eng);
    }));
    KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::binary>(
        "binary add", add,
        {{DNNL_ARG_SRC_0, result}, {DNNL_ARG_SRC_1, residual}, {DNNL_ARG_DST, result}},
        /*final=*/true));
    b.AppendName(", residual by a binary add");
  }
  return b.Finish();
}

// conv2d_backward_input / conv2d_backward_filter as oneDNN's backward data / weights
// convolution, with a forward primitive descriptor as the hint oneDNN asks for.
LowerResult LowerConvBackward(const ir::Node& n, LowerContext& lc, const ConvGeometry& g,
                              dt compute, dt user, DnnlThunkBuilder& b) {
  auto src_any = Any(g.src, compute), wei_any = Any(g.wei, compute), dst_any = Any(g.dst, compute);
  auto src_user = PlainDesc(g.src, user), wei_user = PlainDesc(g.wei, user),
       dst_user = PlainDesc(g.dst, user);
  auto attr = DnnlThunkBuilder::Attr();
  const auto& eng = lc.cpu->engine();
  auto alg = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc hint;
  KILN_RETURN_IF_ERROR(b.Create("convolution (backward hint)", [&] {
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, alg, src_any, wei_any,
                                      dst_any, g.strides, g.dilates, g.pad_l, g.pad_r);
    hint = dnnl::convolution_forward::primitive_desc(d, eng);
  }));
  if (n.opcode() == Opcode::kConv2dBackwardInput) {
    dnnl::convolution_backward_data::primitive_desc pd;
    KILN_RETURN_IF_ERROR(b.Create("convolution backward data", [&] {
      dnnl::convolution_backward_data::desc d(alg, src_any, wei_any, dst_any, g.strides, g.dilates,
                                              g.pad_l, g.pad_r);
      pd = dnnl::convolution_backward_data::primitive_desc(d, attr, eng, hint);
    }));
    if (compute != dt::f32 && IsRefImpl(pd)) return Unimplemented(n, "reference bf16/f16 conv");
    b.NameImpl(pd);
    KILN_ASSIGN_OR_RETURN(int ddst, b.Input(n.operand(0), dst_user, pd.diff_dst_desc()));
    KILN_ASSIGN_OR_RETURN(int wei, b.Input(n.operand(1), wei_user, pd.weights_desc()));
    KILN_ASSIGN_OR_RETURN(int dsrc, b.Output(n.id(), src_user, pd.diff_src_desc()));
    KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::convolution_backward_data>(
        "convolution backward data", pd,
        {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}}));
    return b.Finish();
  }
  dnnl::convolution_backward_weights::primitive_desc pd;
  KILN_RETURN_IF_ERROR(b.Create("convolution backward weights", [&] {
    dnnl::convolution_backward_weights::desc d(alg, src_any, wei_any, dst_any, g.strides, g.dilates,
                                               g.pad_l, g.pad_r);
    pd = dnnl::convolution_backward_weights::primitive_desc(d, attr, eng, hint);
  }));
  if (compute != dt::f32 && IsRefImpl(pd)) return Unimplemented(n, "reference bf16/f16 conv");
  b.NameImpl(pd);
  KILN_ASSIGN_OR_RETURN(int src, b.Input(n.operand(0), src_user, pd.src_desc()));
  KILN_ASSIGN_OR_RETURN(int ddst, b.Input(n.operand(1), dst_user, pd.diff_dst_desc()));
  KILN_ASSIGN_OR_RETURN(int dwei, b.Output(n.id(), wei_user, pd.diff_weights_desc()));
  KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::convolution_backward_weights>(
      "convolution backward weights", pd,
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwei}}));
  return b.Finish();
}

LowerResult ConvWithType(const ir::Node& n, LowerContext& lc, dt compute,
                         const Epilogue* ep = nullptr) {
  DType t = n.type().dtype;
  dt user = DnnlType(t);
  Shape input, filter, output;
  switch (n.opcode()) {
    case Opcode::kConv2d:
      input = lc.operand_type(n, 0).shape;
      filter = lc.operand_type(n, 1).shape;
      output = n.type().shape;
      break;
    case Opcode::kConv2dBackwardInput:
      input = n.type().shape;
      filter = lc.operand_type(n, 1).shape;
      output = lc.operand_type(n, 0).shape;
      break;
    default:
      input = lc.operand_type(n, 0).shape;
      filter = n.type().shape;
      output = lc.operand_type(n, 1).shape;
      break;
  }
  const ConvGeometry g = MakeConvGeometry(n, input, filter, output);
  DnnlThunkBuilder b(lc, n, "onednn convolution" + (ep ? ep->label : std::string()));
  if (n.opcode() == Opcode::kConv2d) return LowerConvForward(n, lc, g, compute, user, ep, b);
  return LowerConvBackward(n, lc, g, compute, user, b);
}

}  // namespace

LowerResult LowerConv(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  for (int i = 0; i < 2; ++i)
    if (lc.operand_type(n, i).dtype != t) return UnsupportedDType(n, lc.operand_type(n, i).dtype);
  if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16) return UnsupportedDType(n, t);
  if (t != DType::kF32) {
    LowerResult r = ConvWithType(n, lc, DnnlType(t));
    if (r.ok() || r.status().code() != absl::StatusCode::kUnimplemented) return r;
  }
  return ConvWithType(n, lc, dt::f32);  // f32, or narrow floats through f32
}

// ---- conv2d + bias + activation (output fusion) ----
bool CanLowerConvEpilogue(const ir::Graph& g, const std::vector<int>& members, bool prefer_loops) {
  if (members.size() < 2 || prefer_loops) return false;
  const ir::Node& conv = g.node(members[0]);
  if (conv.opcode() != Opcode::kConv2d) return false;
  DType t = conv.type().dtype;
  if (t != DType::kF32 && t != DType::kBF16) return false;
  for (int i = 0; i < 2; ++i)
    if (g.node(conv.operand(i)).type().dtype != t) return false;
  std::optional<compiler::EpilogueSteps> steps = compiler::MatchEpilogue(g, members);
  // A residual in f32 only (the binary post-op reads it in the destination's dtype).
  if (!steps || (steps->residual >= 0 && t != DType::kF32)) return false;
  return OneDnnEpilogue(*steps, g).ok();
}

LowerResult LowerConvEpilogue(const compiler::ExecutionPlan::Kernel& k, LowerContext& lc) {
  const ir::Node& conv = lc.graph.node(k.members[0]);
  KILN_ASSIGN_OR_RETURN(Epilogue ep, OneDnnEpilogue(k.epilogue, lc.graph));
  if (conv.type().dtype != DType::kF32) {
    LowerResult r = ConvWithType(conv, lc, DnnlType(conv.type().dtype), &ep);
    if (r.ok() || r.status().code() != absl::StatusCode::kUnimplemented) return r;
  }
  return ConvWithType(conv, lc, dt::f32, &ep);
}

namespace {

struct PoolGeometry {
  std::vector<int64_t> kernel, strides, pad_l, pad_r;
  dnnl::algorithm alg = dnnl::algorithm::pooling_max;
};

PoolGeometry MakePoolGeometry(const ir::Node& n) {
  const auto& window = n.attr_ints("window");
  const auto& st = n.attr_ints("strides");
  const auto& pad = n.attr_ints("padding");
  PoolGeometry p{{window[0], window[1]}, {st[0], st[1]}, {pad[0], pad[2]}, {pad[1], pad[3]}};
  if (n.opcode() != Opcode::kMaxPool2d) {
    p.alg = n.attr_int("count_include_pad") ? dnnl::algorithm::pooling_avg_include_padding
                                            : dnnl::algorithm::pooling_avg_exclude_padding;
  }
  return p;
}

absl::StatusOr<dnnl::pooling_forward::primitive_desc> ForwardPoolPd(const ir::Node& n,
                                                                    const PoolGeometry& p,
                                                                    const dnnl::memory::desc& src,
                                                                    const dnnl::memory::desc& dst,
                                                                    const LowerContext& lc) {
  dnnl::pooling_forward::primitive_desc pd;
  const dnnl::engine& eng = lc.cpu->engine();
  KILN_RETURN_IF_ERROR(DnnlStatus(lc, n, "pooling", [&] {
    dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_inference, p.alg, src, dst, p.strides,
                                  p.kernel, p.pad_l, p.pad_r);
    pd = dnnl::pooling_forward::primitive_desc(d, DnnlThunkBuilder::Attr(), eng);
  }));
  return pd;
}

}  // namespace

bool ConvWritesBlocked(const ir::Node& n, const LowerContext& lc) {
  if (n.opcode() != Opcode::kConv2d || n.type().dtype != DType::kF32 || lc.options.prefer_loops)
    return false;
  for (int i = 0; i < 2; ++i)
    if (lc.operand_type(n, i).dtype != DType::kF32) return false;
  ConvGeometry g =
      MakeConvGeometry(n, lc.operand_type(n, 0).shape, lc.operand_type(n, 1).shape, n.type().shape);
  if (g.dst.size() != 4 || g.dst[1] % ChannelBlock() != 0) return false;
  auto fc = ForwardConvPd(n, g, dt::f32, /*ep=*/nullptr, PlainDesc({g.dst[1]}, dt::f32),
                          /*src_blocked=*/false, lc);
  return fc.ok() && IsChannelBlocked(fc->pd.dst_desc());
}

bool PoolRunsBlocked(const ir::Node& n, const LowerContext& lc) {
  if ((n.opcode() != Opcode::kMaxPool2d && n.opcode() != Opcode::kAvgPool2d) ||
      n.type().dtype != DType::kF32 || lc.options.prefer_loops || n.type().shape.rank() != 4 ||
      n.type().shape.dim(1) % ChannelBlock() != 0)
    return false;
  const auto& in = lc.operand_type(n, 0).shape.dims();
  const auto& out = n.type().shape.dims();
  auto pd = ForwardPoolPd(n, MakePoolGeometry(n), dnnl::memory::desc(in, dt::f32, BlockedTag()),
                          dnnl::memory::desc(out, dt::f32, BlockedTag()), lc);
  return pd.ok() && !IsRefImpl(*pd);
}

LowerResult LowerPool(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  if (t != DType::kF32 && t != DType::kBF16) return UnsupportedDType(n, t);
  const PoolGeometry p = MakePoolGeometry(n);
  const auto& strides = p.strides;
  const auto& kernel = p.kernel;
  const auto& pad_l = p.pad_l;
  const auto& pad_r = p.pad_r;
  const dnnl::algorithm alg = p.alg;
  bool grad = n.opcode() == Opcode::kAvgPool2dGrad;
  Shape in_shape = grad ? n.type().shape : lc.operand_type(n, 0).shape;
  Shape out_shape = grad ? lc.operand_type(n, 0).shape : n.type().shape;
  auto src_md = PlainDesc(in_shape.dims(), DnnlType(t));
  auto dst_md = PlainDesc(out_shape.dims(), DnnlType(t));
  const auto& eng = lc.cpu->engine();
  DnnlThunkBuilder b(lc, n, "onednn pooling");
  if (!grad) {
    // On nChw16c when the input or the result is held blocked (AssignBlockedLayouts, which
    // checked PoolRunsBlocked), reordering the other side; row-major otherwise (memory-bound).
    const bool blocked = lc.is_blocked(n.operand(0)) || lc.is_blocked(n.id());
    const auto src_user = NodeDesc(lc, n.operand(0), in_shape.dims(), DnnlType(t));
    const auto dst_user = NodeDesc(lc, n.id(), out_shape.dims(), DnnlType(t));
    KILN_ASSIGN_OR_RETURN(
        dnnl::pooling_forward::primitive_desc pd,
        ForwardPoolPd(
            n, p, blocked ? dnnl::memory::desc(in_shape.dims(), DnnlType(t), BlockedTag()) : src_md,
            blocked ? dnnl::memory::desc(out_shape.dims(), DnnlType(t), BlockedTag()) : dst_md,
            lc));
    if (IsRefImpl(pd)) {
      if (blocked)  // the loop fallback reads row-major buffers
        return absl::InternalError(
            absl::StrCat(ThunkName(n, "onednn pooling"), ": no jit pooling on the blocked layout"));
      return Unimplemented(n, "oneDNN has only its reference pooling here");
    }
    b.NameImpl(pd);
    KILN_ASSIGN_OR_RETURN(int src, b.Input(n.operand(0), src_user, pd.src_desc()));
    KILN_ASSIGN_OR_RETURN(int dst, b.Output(n.id(), dst_user, pd.dst_desc()));
    KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::pooling_forward>(
        "pooling", pd, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}}));
    return b.Finish();
  }
  dnnl::pooling_backward::primitive_desc pd;
  KILN_RETURN_IF_ERROR(b.Create("pooling backward", [&] {
    dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, alg, src_md, dst_md, strides,
                                   kernel, pad_l, pad_r);
    dnnl::pooling_forward::primitive_desc hint(fd, eng);
    dnnl::pooling_backward::desc d(alg, src_md, dst_md, strides, kernel, pad_l, pad_r);
    pd = dnnl::pooling_backward::primitive_desc(d, DnnlThunkBuilder::Attr(), eng, hint);
  }));
  if (IsRefImpl(pd)) return Unimplemented(n, "oneDNN has only its reference pooling here");
  b.NameImpl(pd);
  int ddst = b.NodeMemory(n.operand(0), dst_md);
  int dsrc = b.NodeMemory(n.id(), src_md);
  KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::pooling_backward>(
      "pooling backward", pd, {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_SRC, dsrc}}));
  return b.Finish();
}

}  // namespace kiln::runtime::cpu
