// The cpu backend's int8 ops: quantize as an AVX-512 or SSE2 loop (quantized_loops.cc),
// quantized_dot as the packed s8 gemv (qgemv.cc: up to kQGemvMaxRows rows with the weights bound
// constant, on an AVX-512 VNNI cpu) or a oneDNN int8 matmul (s8 source, s8 weights, f32
// destination), quantized_conv2d as a oneDNN int8 convolution: that on AVX-512 VNNI and above,
// where oneDNN's int8 is exact (isa.h, OneDnnHasExactInt8). Below it oneDNN sums u8 x s8 pairs in
// saturating s16, so both ops run on Kiln's exact widening GEMM instead (quantized_exact.cc).
// The matmul takes the per-channel f32 scales as a binary-mul post-op (fallbacks: runtime output
// scales, a loop); the convolution writes unscaled f32 sums that one loop scales. Both pack their
// s8 weights into oneDNN's blocked layout once (WeightPacker: at binding for bound weights, else
// on the first run and again only when the bytes change). Every path accumulates in int32 and
// multiplies the f32-converted sum by the scale once, the reference kernels' semantics, so the
// results agree bit for bit on every CPU (the quantized rows of tests/op_table_nn.cc,
// quantized_test.cc).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/cpu/internal/qgemv.h"
#include "kiln/runtime/cpu/internal/quantized_exact.h"
#include "kiln/runtime/cpu/internal/quantized_loops.h"
#include "kiln/runtime/cpu/isa.h"

namespace kiln::runtime::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// The oneDNN int8 convolution of quantized_conv2d `n` (source and filter layouts left to oneDNN,
// f32 NHWC sums), with the filter's dims as oneDNN wants them (grouped: goihw).
struct QuantizedConvDesc {
  dnnl::convolution_forward::primitive_desc pd;
  std::vector<int64_t> wdims;
};
QuantizedConvDesc MakeQuantizedConvDesc(const ir::Node& n, const LowerContext& lc) {
  const Shape& in = lc.operand_type(n, 0).shape;
  const Shape& f = lc.operand_type(n, 1).shape;
  const Shape& out = n.type().shape;
  const std::vector<int64_t> st = n.attr_ints("strides"), pad = n.attr_ints("padding"),
                             dil = n.attr_ints("dilation");
  const int64_t groups = n.attr_int("groups");
  QuantizedConvDesc r;
  r.wdims = f.dims();
  if (groups > 1) r.wdims = {groups, f.dim(0) / groups, f.dim(1), f.dim(2), f.dim(3)};
  const dnnl::memory::dims strides = {st[0], st[1]}, dilates = {dil[0] - 1, dil[1] - 1},
                           pad_l = {pad[0], pad[2]}, pad_r = {pad[1], pad[3]};
  dnnl::convolution_forward::desc d(
      dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      dnnl::memory::desc(in.dims(), dt::s8, tag::any),
      dnnl::memory::desc(r.wdims, dt::s8, tag::any),
      dnnl::memory::desc(out.dims(), dt::f32, tag::nhwc), strides, dilates, pad_l, pad_r);
  r.pd = dnnl::convolution_forward::primitive_desc(d, DnnlThunkBuilder::Attr(), lc.cpu->engine());
  return r;
}

// Whether quantize node `q` writes its s8 result as NHWC instead of NCHW, so that the
// convolutions reading it skip oneDNN's per-run s8 reorder: q is a rank-4 kernel of its own (no
// fusion group), not a graph output, and every reader is a quantized_conv2d reading it as its
// input only, whose oneDNN primitive reads NHWC. LowerQuantize and LowerQuantizedConv both ask,
// so writer and readers agree. Never where oneDNN's int8 is inexact: the exact convolution that
// runs there instead (quantized_exact.cc) reads NCHW.
bool QuantizeWritesNhwc(int q, const LowerContext& lc) {
  if (!OneDnnHasExactInt8()) return false;
  const ir::Graph& g = lc.graph;
  const ir::Node& qn = g.node(q);
  if (qn.opcode() != ir::Opcode::kQuantize || qn.type().shape.rank() != 4 ||
      g.FusionGroupOf(q) >= 0)
    return false;
  for (const ir::Output& o : g.outputs())
    if (o.node == q) return false;
  const Shape& s = qn.type().shape;
  const auto nhwc = dnnl::memory::desc(s.dims(), dt::s8, tag::nhwc);
  int readers = 0;
  for (const ir::Node& n : g.nodes()) {
    bool reads = false;
    for (int i = 0; i < static_cast<int>(n.operands().size()); ++i) {
      if (n.operand(i) != q) continue;
      if (n.opcode() != ir::Opcode::kQuantizedConv2d || i != 0 || g.FusionGroupOf(n.id()) >= 0)
        return false;
      reads = true;
    }
    if (!reads) continue;
    ++readers;
    try {
      if (MakeQuantizedConvDesc(n, lc).pd.src_desc() != nhwc) return false;
    } catch (const dnnl::error&) {
      return false;
    }
  }
  return readers > 0;
}

LowerResult LowerQuantize(const ir::Node& n, LowerContext& lc) {
  if (lc.operand_type(n, 0).dtype != DType::kF32)
    return UnsupportedDType(n, lc.operand_type(n, 0).dtype);
  const float scale = static_cast<float>(n.attr_float("scale"));
  const int64_t count = n.type().shape.num_elements();
  const int in = n.operand(0), out = n.id();
  if (QuantizeWritesNhwc(n.id(), lc)) {
    const Shape& s = n.type().shape;
    const int64_t batch = s.dim(0), c = s.dim(1), hw = s.dim(2) * s.dim(3);
    return MakeFnThunk(
        n, std::string(QuantizeLoopIsa()) + " loop, NCHW -> NHWC for the convolution",
        [=](RunContext& ctx) {
          QuantizeNchwToNhwc(static_cast<const float*>(ctx.buffers[in]),
                             static_cast<int8_t*>(ctx.buffers[out]), scale, batch, c, hw);
        });
  }
  return MakeFnThunk(n, std::string(QuantizeLoopIsa()) + " loop", [=](RunContext& ctx) {
    const float* x = static_cast<const float*>(ctx.buffers[in]);
    int8_t* y = static_cast<int8_t*>(ctx.buffers[out]);
    ParallelFor(count, kElementwiseGrain,
                [&](int64_t b, int64_t e) { QuantizeRange(x, y, scale, b, e); });
  });
}

// y[i] *= scale[channel(i)] for the unscaled fallback: `inner` consecutive elements share a
// channel, channels cycle with period `channels`.
void ScaleChannels(float* y, const float* scale, int64_t count, int64_t channels, int64_t inner) {
  ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] *= scale[(i / inner) % channels];
  });
}

// How the per-channel scales reach the matmul, in order of preference: a binary-mul post-op on
// the f32-converted sums (oneDNN 2.6's brgemm int8 kernel takes it; runtime output scales would
// send it to the slower gemm kernel), runtime output scales, or a loop after the primitive. All
// three compute f32(int32 sum) * scale[n], one rounding each.
enum class ScaleHow { kPostOp, kRuntimeScales, kLoop };

// Packs `user` (an operand's bytes) into `packed` with `reorder`. While the operand is constant
// (Thunk::PrepareConstants: a bound weight) it is packed once, at binding, and a run that hands
// over that same constant buffer reads the pack without looking at the bytes. Otherwise the pack
// is made on the first run and again only when the bytes differ from the last packed copy
// (a memcmp of the weights per run: weights that change still give the right result).
class WeightPacker {
 public:
  WeightPacker() = default;
  WeightPacker(int node, dnnl::memory user, dnnl::memory packed, int64_t bytes)
      : node_(node), user_(std::move(user)), packed_(std::move(packed)), bytes_(bytes) {
    reorder_ = dnnl::reorder(user_, packed_);
  }
  void Prepare(const RunContext& ctx, dnnl::stream& stream) {
    constant_from_ = nullptr;
    valid_ = false;
    last_.clear();
    last_.shrink_to_fit();
    if (!IsConstant(ctx)) return;
    Reorder(ctx.buffers[node_], stream);
    constant_from_ = ctx.buffers[node_];
  }
  const dnnl::memory& Get(const RunContext& ctx, dnnl::stream& stream) {
    const void* w = ctx.buffers[node_];
    if (constant_from_ != nullptr && w == constant_from_ && IsConstant(ctx)) return packed_;
    constant_from_ = nullptr;
    if (last_.empty()) last_.resize(static_cast<size_t>(bytes_));
    if (!valid_ || std::memcmp(w, last_.data(), last_.size()) != 0) {
      Reorder(w, stream);
      std::memcpy(last_.data(), w, last_.size());
      valid_ = true;
    }
    return packed_;
  }

 private:
  bool IsConstant(const RunContext& ctx) const {
    return node_ < static_cast<int>(ctx.constant.size()) && ctx.constant[node_] &&
           ctx.buffers[node_] != nullptr;
  }
  void Reorder(const void* w, dnnl::stream& stream) {
    user_.set_data_handle(const_cast<void*>(w));
    reorder_.execute(stream, user_, packed_);
  }

  int node_ = -1;
  dnnl::memory user_, packed_;
  dnnl::reorder reorder_;
  int64_t bytes_ = 0;
  std::vector<uint8_t> last_;  // the bytes last packed (memcmp path only)
  bool valid_ = false;
  const void* constant_from_ = nullptr;  // the constant buffer packed at binding
};

// quantized_dot as a oneDNN int8 matmul on packed weights (WeightPacker), the scales as a
// binary-mul post-op.
class QuantizedDotThunk : public Thunk {
 public:
  struct Plan {
    std::string name;
    int x = -1, w = -1, scale = -1, y = -1;
    dnnl::matmul matmul;
    dnnl::memory src, dst, scale_mem, scratch;
    int64_t scratch_off = 0;
  };
  QuantizedDotThunk(std::shared_ptr<CpuContext> cpu, Plan p, WeightPacker packer)
      : cpu_(std::move(cpu)), p_(std::move(p)), packer_(std::move(packer)) {}

  void Run(RunContext& ctx) override {
    dnnl::stream& stream = cpu_->stream();
    const dnnl::memory& wei = packer_.Get(ctx, stream);
    p_.src.set_data_handle(ctx.buffers[p_.x]);
    p_.dst.set_data_handle(ctx.buffers[p_.y]);
    p_.scale_mem.set_data_handle(ctx.buffers[p_.scale]);
    p_.scratch.set_data_handle(cpu_->workspace() + p_.scratch_off);
    p_.matmul.execute(stream, {{DNNL_ARG_SRC, p_.src},
                               {DNNL_ARG_WEIGHTS, wei},
                               {DNNL_ARG_DST, p_.dst},
                               {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, p_.scale_mem},
                               {DNNL_ARG_SCRATCHPAD, p_.scratch}});
  }
  std::string name() const override { return p_.name; }
  absl::Status PrepareConstants(const RunContext& ctx) override {
    packer_.Prepare(ctx, cpu_->stream());
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<CpuContext> cpu_;
  Plan p_;
  WeightPacker packer_;
};

// The packed-weights matmul, or nullptr when oneDNN packs nothing (plain weights are what its
// kernel reads) or has only its reference kernel for it.
absl::StatusOr<std::unique_ptr<Thunk>> PackedQuantizedDot(const ir::Node& n, LowerContext& lc,
                                                          int64_t M, int64_t K, int64_t N) {
  const auto src_md = PlainDesc({M, K}, dt::s8), dst_md = PlainDesc({M, N}, dt::f32);
  const auto wei_plain = PlainDesc({K, N}, dt::s8), scale_md = PlainDesc({1, N}, dt::f32);
  const dnnl::engine& eng = lc.cpu->engine();
  dnnl::primitive_attr attr = DnnlThunkBuilder::Attr();
  dnnl::post_ops ops;
  ops.append_binary(dnnl::algorithm::binary_mul, scale_md);
  attr.set_post_ops(ops);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(
        dnnl::matmul::desc(src_md, dnnl::memory::desc({K, N}, dt::s8, tag::any), dst_md), attr,
        eng);
  } catch (const dnnl::error&) {
    return std::unique_ptr<Thunk>();
  }
  if (IsRefImpl(pd) || pd.weights_desc() == wei_plain) return std::unique_ptr<Thunk>();
  QuantizedDotThunk::Plan p;
  WeightPacker packer;
  KILN_RETURN_IF_ERROR(DnnlStatus(n, [&] {
    p.matmul = dnnl::matmul(pd);
    p.src = dnnl::memory(src_md, eng, DNNL_MEMORY_NONE);
    p.dst = dnnl::memory(dst_md, eng, DNNL_MEMORY_NONE);
    p.scale_mem = dnnl::memory(scale_md, eng, DNNL_MEMORY_NONE);
    p.scratch = dnnl::memory(pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
    packer = WeightPacker(n.operand(1), dnnl::memory(wei_plain, eng, DNNL_MEMORY_NONE),
                          dnnl::memory(pd.weights_desc(), eng),
                          static_cast<int64_t>(wei_plain.get_size()));
  }));
  WorkspaceLayout layout;
  p.scratch_off = layout.Add(static_cast<int64_t>(pd.scratchpad_desc().get_size()));
  lc.cpu->RequireWorkspace(layout.size());
  p.name = ThunkName(n, std::string("onednn int8 matmul, packed weights ") + pd.impl_info_str());
  p.x = n.operand(0);
  p.w = n.operand(1);
  p.scale = n.operand(2);
  p.y = n.id();
  return std::unique_ptr<Thunk>(new QuantizedDotThunk(lc.cpu, std::move(p), std::move(packer)));
}

LowerResult LowerQuantizedDotOneDnn(const ir::Node& n, LowerContext& lc) {
  const Shape& xs = lc.operand_type(n, 0).shape;
  const int64_t K = lc.operand_type(n, 1).shape.dim(0), N = lc.operand_type(n, 1).shape.dim(1);
  const int64_t M = K == 0 ? 0 : xs.num_elements() / K;
  if (M == 0 || K == 0 || N == 0) return Unimplemented(n, "empty quantized_dot");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Thunk> packed, PackedQuantizedDot(n, lc, M, K, N));
  if (packed) return packed;
  const auto src_md = PlainDesc({M, K}, dt::s8), dst_md = PlainDesc({M, N}, dt::f32);
  const auto wei_plain = PlainDesc({K, N}, dt::s8), scale_md = PlainDesc({1, N}, dt::f32);
  for (ScaleHow how : {ScaleHow::kPostOp, ScaleHow::kRuntimeScales, ScaleHow::kLoop}) {
    // Plain weights first (no per-run reorder); oneDNN's packed layout when plain gets its
    // reference kernel.
    for (bool packed : {false, true}) {
      dnnl::primitive_attr attr = DnnlThunkBuilder::Attr();
      if (how == ScaleHow::kRuntimeScales) attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
      if (how == ScaleHow::kPostOp) {
        dnnl::post_ops ops;
        ops.append_binary(dnnl::algorithm::binary_mul, scale_md);
        attr.set_post_ops(ops);
      }
      dnnl::matmul::primitive_desc pd;
      try {
        dnnl::memory::desc wei_md =
            packed ? dnnl::memory::desc({K, N}, dt::s8, tag::any) : wei_plain;
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_md, dst_md), attr,
                                          lc.cpu->engine());
      } catch (const dnnl::error&) {
        continue;
      }
      if (IsRefImpl(pd) && (how != ScaleHow::kLoop || !packed)) continue;
      DnnlThunkBuilder b(
          lc, n, how == ScaleHow::kLoop ? "onednn int8 matmul+scale loop" : "onednn int8 matmul");
      b.NameImpl(pd);
      const int src = b.NodeMemory(n.operand(0), src_md);
      KILN_ASSIGN_OR_RETURN(int wei, b.Input(n.operand(1), wei_plain, pd.weights_desc()));
      const int dst = b.NodeMemory(n.id(), dst_md);
      std::vector<std::pair<int, int>> args = {
          {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
      if (how == ScaleHow::kRuntimeScales)
        args.push_back(
            {DNNL_ARG_ATTR_OUTPUT_SCALES, b.NodeMemory(n.operand(2), PlainDesc({N}, dt::f32))});
      if (how == ScaleHow::kPostOp)
        args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                        b.NodeMemory(n.operand(2), scale_md)});
      b.AddStepWithScratchpad(dnnl::matmul(pd), std::move(args), pd.scratchpad_desc());
      if (how == ScaleHow::kLoop) {
        const int s = n.operand(2), y = n.id();
        b.AddLoopStep([=](RunContext& ctx, uint8_t*) {
          ScaleChannels(static_cast<float*>(ctx.buffers[y]),
                        static_cast<const float*>(ctx.buffers[s]), M * N, N, 1);
        });
      }
      return b.Finish();
    }
  }
  return Unimplemented(n, "oneDNN int8 matmul");
}

// Up to kQGemvMaxRows rows on a VNNI cpu: the packed s8 kernel (qgemv.cc) while the weights are
// bound constant, the oneDNN matmul otherwise. Without VNNI: the exact widening GEMM, every M.
LowerResult LowerQuantizedDot(const ir::Node& n, LowerContext& lc) {
  if (!OneDnnHasExactInt8()) return LowerQuantizedDotExact(n, lc);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Thunk> onednn, LowerQuantizedDotOneDnn(n, lc));
  const int64_t K = lc.operand_type(n, 1).shape.dim(0), N = lc.operand_type(n, 1).shape.dim(1);
  const int64_t M = lc.operand_type(n, 0).shape.num_elements() / K;
  if (M > kQGemvMaxRows || !QGemvSupported()) return onednn;
  QGemvSpec spec;
  spec.x = n.operand(0);
  spec.w = n.operand(1);
  spec.scale = n.operand(2);
  spec.out = n.id();
  spec.M = M;
  spec.K = K;
  spec.N = N;
  spec.name = ThunkName(n, "packed s8 gemv avx512_vnni");
  return MakeQGemvThunk(spec, std::move(onednn));
}

// quantized_conv2d as one oneDNN int8 convolution. oneDNN 2.6's int8 convolutions take no
// runtime output scales and its jit kernels want NHWC: the primitive writes the unscaled f32 sums
// as NHWC into the workspace and one loop applies the scales while writing NCHW (the same two
// roundings as the reference kernel). The filter is packed into the blocked layout with its
// compensation by a WeightPacker: once for an artifact's constant weights.
class QuantizedConvThunk : public Thunk {
 public:
  struct Plan {
    std::string name;
    int x = -1, w = -1, scale = -1, y = -1;
    dnnl::convolution_forward conv;
    dnnl::reorder src_reorder;  // null when the user layout is what the convolution reads
    dnnl::memory src_user, src, acc, scratch;
    int64_t src_off = -1, acc_off = 0, scratch_off = 0;
    int64_t n = 0, o = 0, hw = 0;
  };
  QuantizedConvThunk(std::shared_ptr<CpuContext> cpu, Plan p, WeightPacker packer)
      : cpu_(std::move(cpu)), p_(std::move(p)), packer_(std::move(packer)) {}

  void Run(RunContext& ctx) override {
    uint8_t* ws = cpu_->workspace();
    dnnl::stream& stream = cpu_->stream();
    const dnnl::memory& wei = packer_.Get(ctx, stream);
    p_.src_user.set_data_handle(ctx.buffers[p_.x]);
    if (p_.src_reorder) {
      p_.src.set_data_handle(ws + p_.src_off);
      p_.src_reorder.execute(stream, p_.src_user, p_.src);
    }
    p_.acc.set_data_handle(ws + p_.acc_off);
    p_.scratch.set_data_handle(ws + p_.scratch_off);
    p_.conv.execute(stream, {{DNNL_ARG_SRC, p_.src_reorder ? p_.src : p_.src_user},
                             {DNNL_ARG_WEIGHTS, wei},
                             {DNNL_ARG_DST, p_.acc},
                             {DNNL_ARG_SCRATCHPAD, p_.scratch}});
    ScaleNhwcToNchw(reinterpret_cast<const float*>(ws + p_.acc_off),
                    static_cast<const float*>(ctx.buffers[p_.scale]),
                    static_cast<float*>(ctx.buffers[p_.y]), p_.n, p_.o, p_.hw);
  }
  std::string name() const override { return p_.name; }
  absl::Status PrepareConstants(const RunContext& ctx) override {
    packer_.Prepare(ctx, cpu_->stream());
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<CpuContext> cpu_;
  Plan p_;
  WeightPacker packer_;
};

LowerResult LowerQuantizedConv(const ir::Node& n, LowerContext& lc) {
  if (!OneDnnHasExactInt8()) return LowerQuantizedConvExact(n, lc);
  const Shape& in = lc.operand_type(n, 0).shape;
  const Shape& out = n.type().shape;
  const int64_t groups = n.attr_int("groups");
  // The input as its writer laid it out: NHWC when a quantize wrote it for this convolution.
  const bool nhwc_input = QuantizeWritesNhwc(n.operand(0), lc);
  const auto src_user =
      nhwc_input ? dnnl::memory::desc(in.dims(), dt::s8, tag::nhwc) : PlainDesc(in.dims(), dt::s8);
  const auto acc_md = dnnl::memory::desc(out.dims(), dt::f32, tag::nhwc);
  const dnnl::engine& eng = lc.cpu->engine();
  QuantizedConvThunk::Plan p;
  WeightPacker packer;
  dnnl::convolution_forward::primitive_desc pd;
  KILN_RETURN_IF_ERROR(DnnlStatus(n, [&] {
    QuantizedConvDesc d = MakeQuantizedConvDesc(n, lc);
    pd = d.pd;
    const auto wei_user =
        groups > 1 ? dnnl::memory::desc(d.wdims, dt::s8, tag::goihw) : PlainDesc(d.wdims, dt::s8);
    p.conv = dnnl::convolution_forward(pd);
    p.src_user = dnnl::memory(src_user, eng, DNNL_MEMORY_NONE);
    packer = WeightPacker(n.operand(1), dnnl::memory(wei_user, eng, DNNL_MEMORY_NONE),
                          dnnl::memory(pd.weights_desc(), eng),
                          static_cast<int64_t>(wei_user.get_size()));
    if (pd.src_desc() != src_user) {
      p.src = dnnl::memory(pd.src_desc(), eng, DNNL_MEMORY_NONE);
      p.src_reorder = dnnl::reorder(p.src_user, p.src);
    }
    p.acc = dnnl::memory(acc_md, eng, DNNL_MEMORY_NONE);
    p.scratch = dnnl::memory(pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
  }));
  WorkspaceLayout layout;
  if (p.src_reorder) p.src_off = layout.Add(static_cast<int64_t>(pd.src_desc().get_size()));
  p.acc_off = layout.Add(static_cast<int64_t>(acc_md.get_size()));
  p.scratch_off = layout.Add(static_cast<int64_t>(pd.scratchpad_desc().get_size()));
  lc.cpu->RequireWorkspace(layout.size());
  p.name = ThunkName(n, std::string("onednn int8 convolution+scale loop ") +
                            (nhwc_input ? "NHWC input " : "") + pd.impl_info_str());
  p.x = n.operand(0);
  p.w = n.operand(1);
  p.scale = n.operand(2);
  p.y = n.id();
  p.n = out.dim(0);
  p.o = out.dim(1);
  p.hw = out.dim(2) * out.dim(3);
  return std::unique_ptr<Thunk>(new QuantizedConvThunk(lc.cpu, std::move(p), std::move(packer)));
}

}  // namespace

LowerResult LowerQuantized(const ir::Node& n, LowerContext& lc) {
  switch (n.opcode()) {
    case ir::Opcode::kQuantize:
      return LowerQuantize(n, lc);
    case ir::Opcode::kQuantizedDot:
      return LowerQuantizedDot(n, lc);
    case ir::Opcode::kQuantizedConv2d:
      return LowerQuantizedConv(n, lc);
    default:
      return Unimplemented(n, "not an int8 op");
  }
}

}  // namespace kiln::runtime::cpu
