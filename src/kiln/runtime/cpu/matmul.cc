// Lowered to one (batched) oneDNN matmul [B,M,K] x [B,K,N] -> [B,M,N]. Each operand's batch,
// free and contracting dims are collapsed into one dim each; when a group collapses (its dims are
// adjacent in memory in the order the attributes list them) the operand is passed in place with a
// strided memory descriptor (so transposed operands cost nothing), otherwise it is first copied
// into the canonical layout in the workspace. If oneDNN would only run a strided layout with its
// reference kernel, both operands are copied to plain layouts instead. Types oneDNN's matmul lacks
// (f64, integers) run a loop over precomputed offset tables.
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "kiln/ir/op_traits.h"
#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/cpu/internal/gemv.h"
#include "kiln/runtime/cpu/internal/sgemm.h"

namespace kiln::runtime::cpu {
namespace {

// One operand's view: dims grouped as (batch, free, contracting) in attribute order.
struct OperandGroups {
  std::vector<int64_t> batch, free, contract;  // dim indices
};

struct DotPlan {
  int64_t B = 1, M = 1, K = 1, N = 1;
  OperandGroups lhs, rhs;
  std::vector<int64_t> lhs_dims, rhs_dims;
};

DotPlan MakePlan(const ir::Node& n, const ir::Type& lt, const ir::Type& rt) {
  DotPlan p;
  p.lhs_dims = lt.shape.dims();
  p.rhs_dims = rt.shape.dims();
  p.lhs.batch = n.attr_ints("lhs_batch");
  p.rhs.batch = n.attr_ints("rhs_batch");
  p.lhs.contract = n.attr_ints("lhs_contracting");
  p.rhs.contract = n.attr_ints("rhs_contracting");
  auto free_dims = [](int rank, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    std::vector<int64_t> f;
    for (int64_t d = 0; d < rank; ++d)
      if (std::find(a.begin(), a.end(), d) == a.end() &&
          std::find(b.begin(), b.end(), d) == b.end())
        f.push_back(d);
    return f;
  };
  p.lhs.free = free_dims(lt.shape.rank(), p.lhs.batch, p.lhs.contract);
  p.rhs.free = free_dims(rt.shape.rank(), p.rhs.batch, p.rhs.contract);
  for (int64_t d : p.lhs.batch) p.B *= p.lhs_dims[d];
  for (int64_t d : p.lhs.free) p.M *= p.lhs_dims[d];
  for (int64_t d : p.lhs.contract) p.K *= p.lhs_dims[d];
  for (int64_t d : p.rhs.free) p.N *= p.rhs_dims[d];
  return p;
}

// The single stride of a group of dims if they collapse into one (ignoring unit dims), 0 for a
// group of total size 1, nullopt when they do not collapse.
std::optional<int64_t> GroupStride(const std::vector<int64_t>& dims,
                                   const std::vector<int64_t>& strides,
                                   const std::vector<int64_t>& group) {
  std::vector<int64_t> nonunit;
  for (int64_t d : group)
    if (dims[d] != 1) nonunit.push_back(d);
  if (nonunit.empty()) return int64_t{0};
  for (size_t i = 0; i + 1 < nonunit.size(); ++i)
    if (strides[nonunit[i]] != strides[nonunit[i + 1]] * dims[nonunit[i + 1]]) return std::nullopt;
  return strides[nonunit.back()];
}

// Row-major offsets of every index of a group (in attribute order), for the loop path and for
// checking layouts.
std::vector<int64_t> GroupOffsets(const std::vector<int64_t>& dims,
                                  const std::vector<int64_t>& strides,
                                  const std::vector<int64_t>& group) {
  std::vector<int64_t> offs{0};
  for (int64_t d : group) {
    std::vector<int64_t> next;
    next.reserve(offs.size() * dims[d]);
    for (int64_t o : offs)
      for (int64_t i = 0; i < dims[d]; ++i) next.push_back(o + i * strides[d]);
    offs = std::move(next);
  }
  return offs;
}

// Strides for a 3-D view [g0, g1, g2] given each group's collapsed stride (0 = unit group): unit
// groups get the stride a dense layout would give them, so oneDNN sees a sane descriptor.
std::vector<int64_t> ViewStrides(const int64_t sizes[3], const int64_t gs[3]) {
  std::vector<int64_t> s(gs, gs + 3);
  // Fill unit groups from the inside out.
  int64_t extent = 1;
  for (int i = 0; i < 3; ++i)
    if (gs[i] != 0) extent = std::max(extent, gs[i] * sizes[i]);
  for (int i = 2; i >= 0; --i)
    if (s[i] == 0) s[i] = extent;  // size-1 dim: any stride is valid, pick the outermost
  return s;
}

// An operand's [g0, g1, g2] view: strided when its groups collapse, else a copy plan into a
// row-major temp.
struct OperandView {
  int64_t sizes[3];
  bool in_place = true;
  std::vector<int64_t> strides;  // when in_place
  CopyPlan copy;                 // when !in_place
};

OperandView MakeView(const std::vector<int64_t>& dims, DType dt,
                     const std::vector<int64_t>* groups[3], bool force_copy) {
  OperandView v;
  std::vector<int64_t> strides = RowMajorStrides(dims);
  int64_t gs[3];
  for (int g = 0; g < 3; ++g) {
    v.sizes[g] = 1;
    for (int64_t d : *groups[g]) v.sizes[g] *= dims[d];
    std::optional<int64_t> s = GroupStride(dims, strides, *groups[g]);
    if (!s) v.in_place = false;
    gs[g] = s.value_or(0);
  }
  if (v.in_place) {
    v.strides = ViewStrides(v.sizes, gs);
    // "Plain" (row-major [g0,g1,g2]) or a transposed inner pair are the fast oneDNN layouts.
    std::vector<int64_t> plain = RowMajorStrides({v.sizes[0], v.sizes[1], v.sizes[2]});
    bool is_plain = true;
    for (int g = 0; g < 3; ++g)
      if (v.sizes[g] != 1 && v.strides[g] != plain[g]) is_plain = false;
    if (is_plain) v.strides = plain;
    if (!force_copy || is_plain) return v;
    v.in_place = false;
  }
  // Copy: iterate the groups' dims in order, read with the operand's strides, write row-major.
  std::vector<int64_t> cdims, cin;
  for (int g = 0; g < 3; ++g)
    for (int64_t d : *groups[g]) {
      cdims.push_back(dims[d]);
      cin.push_back(strides[d]);
    }
  v.copy = PlanStridedCopy(cdims, cin, RowMajorStrides(cdims), DTypeSize(dt));
  return v;
}

// Memory for an operand view, in data type `compute` (reordering when the node's dtype differs).
absl::StatusOr<int> OperandMemory(DnnlThunkBuilder& b, int node, const OperandView& v,
                                  dnnl::memory::data_type user_dt, dnnl::memory::data_type compute,
                                  bool batched) {
  std::vector<int64_t> sizes(v.sizes + (batched ? 0 : 1), v.sizes + 3);
  if (v.in_place) {
    std::vector<int64_t> strides(v.strides.begin() + (batched ? 0 : 1), v.strides.end());
    dnnl::memory::desc md(sizes, user_dt, strides);
    return b.Input(node, md, WithType(md, compute));
  }
  int t = b.TempMemory(PlainDesc(sizes, user_dt));
  int64_t off = b.TempOffset(t);
  CopyPlan plan = v.copy;
  b.AddLoopStep([plan, node, off](RunContext& ctx, uint8_t* ws) {
    RunStridedCopy(plan, ctx.buffers[node], ws + off);
  });
  return b.Reorder(t, PlainDesc(sizes, compute));
}

// Long contractions: oneDNN 2.6's matmul primitive always picks its brgemm kernel for dense f32
// operands, and on row-major [M,K] x [K,N] with K well above M and N (the GPT LM head's
// dX = dlogits . W, [512,50257] x [50257,768], and the MLP's second matmul [512,3072] x
// [3072,768] with its bias and residual) that kernel runs 15-25% below oneDNN's own jit sgemm on
// the same data (bench/matmul_benchmark.cc --shapes=gpt2). Those run through dnnl::sgemm
// instead: f32, one 2-D problem, both operands in place and row-major, no activation. A bias
// and/or residual epilogue is written into the output first (residual + bias, an M x N pass on one
// thread, small next to the M x N x K product) and the sgemm accumulates onto it (beta = 1), as
// oneDNN's `sum` post-op would.
bool PreferSgemm(const DotPlan& p, DType dt, const OperandView& lv, const OperandView& rv,
                 const Epilogue& ep) {
  if (dt != DType::kF32 || p.B != 1 || p.M < 1 || p.N < 1 || ep.has_act) return false;
  if (!lv.in_place || !rv.in_place) return false;
  auto row_major = [](const OperandView& v) {
    return (v.sizes[1] == 1 || v.strides[1] == v.sizes[2]) &&
           (v.sizes[2] == 1 || v.strides[2] == 1);
  };
  return row_major(lv) && row_major(rv) && p.K >= 2 * std::max(p.M, p.N);
}

std::unique_ptr<Thunk> SgemmMatmul(const ir::Node& n, const DotPlan& p, const Epilogue& ep) {
  const int lhs = n.operand(0), rhs = n.operand(1), out = ep.out >= 0 ? ep.out : n.id();
  const int bias = ep.bias, residual = ep.residual;
  const int64_t M = p.M, N = p.N, K = p.K;
  return MakeFnThunk(n, "onednn matmul" + ep.label + " sgemm:jit", [=](RunContext& ctx) {
    float* o = static_cast<float*>(ctx.buffers[out]);
    const float* r = residual >= 0 ? static_cast<const float*>(ctx.buffers[residual]) : nullptr;
    const float* c = bias >= 0 ? static_cast<const float*>(ctx.buffers[bias]) : nullptr;
    // One thread: an OpenMP loop here made the sgemm after it ~20% slower than after a memcpy
    // (M=512 K=3072 N=768), and this pass is small next to the product.
    if (r && r != o) std::memcpy(o, r, static_cast<size_t>(M * N) * sizeof(float));
    if (c) {
      for (int64_t i = 0; i < M; ++i) {
        float* orow = o + i * N;
        if (r)
          for (int64_t j = 0; j < N; ++j) orow[j] += c[j];
        else
          std::memcpy(orow, c, static_cast<size_t>(N) * sizeof(float));
      }
    }
    dnnl::sgemm('N', 'N', M, N, K, 1.f, static_cast<const float*>(ctx.buffers[lhs]), K,
                static_cast<const float*>(ctx.buffers[rhs]), N, c || r ? 1.f : 0.f, o, N);
  });
}

// `pack_weights`: the variant that runs while the weight is bound constant. The primitive is
// created with the weight's layout left to oneDNN (format `any`: its blocked layout), and the
// weight is reordered into that layout once, when it is bound (DnnlThunkBuilder::ConstantInput),
// instead of oneDNN copying the plain weight into it on every call. Unimplemented when the weight
// is not a strided view of its node, or oneDNN would run its reference kernel.
absl::StatusOr<std::unique_ptr<Thunk>> OneDnnMatmulImpl(const ir::Node& n, LowerContext& lc,
                                                        const DotPlan& p, bool force_copy,
                                                        const Epilogue& ep,
                                                        bool pack_weights = false) {
  const ir::Type& lt = lc.operand_type(n, 0);
  const ir::Type& rt = lc.operand_type(n, 1);
  DType odt = n.type().dtype;
  auto user_dt = DnnlType(lt.dtype);
  if (lt.dtype != rt.dtype || lt.dtype != odt ||
      (lt.dtype != DType::kF32 && lt.dtype != DType::kBF16 && lt.dtype != DType::kF16))
    return UnsupportedDType(n, lt.dtype);

  const std::vector<int64_t>* lg[3] = {&p.lhs.batch, &p.lhs.free, &p.lhs.contract};
  const std::vector<int64_t>* rg[3] = {&p.rhs.batch, &p.rhs.contract, &p.rhs.free};
  OperandView lv = MakeView(p.lhs_dims, lt.dtype, lg, force_copy);
  OperandView rv = MakeView(p.rhs_dims, rt.dtype, rg, force_copy);
  if (pack_weights && (!rv.in_place || p.B != 1))
    return Unimplemented(n, "pre-packed weights need a 2-D strided weight view");
  if (!pack_weights && PreferSgemm(p, lt.dtype, lv, rv, ep)) return SgemmMatmul(n, p, ep);
  bool batched = p.B > 1;
  std::vector<int64_t> dst_dims =
      batched ? std::vector<int64_t>{p.B, p.M, p.N} : std::vector<int64_t>{p.M, p.N};

  // bf16 computes natively (f32 accumulation inside oneDNN); f16 only where the ISA has it, else
  // through f32 with reorders.
  const int out_node = ep.out >= 0 ? ep.out : n.id();
  std::vector<int64_t> bias_dims(dst_dims.size(), 1);
  bias_dims.back() = p.N;
  for (auto compute : {user_dt, dnnl::memory::data_type::f32}) {
    DnnlThunkBuilder b(lc, n, "onednn matmul" + ep.label);
    KILN_ASSIGN_OR_RETURN(int src, OperandMemory(b, n.operand(0), lv, user_dt, compute, batched));
    int wei = -1;
    dnnl::memory::desc wei_md;  // what the primitive is created with
    if (pack_weights) {
      wei_md = dnnl::memory::desc({p.K, p.N}, compute, dnnl::memory::format_tag::any);
    } else {
      KILN_ASSIGN_OR_RETURN(wei, OperandMemory(b, n.operand(1), rv, user_dt, compute, batched));
      wei_md = b.Desc(wei);
    }
    dnnl::memory::desc dst_md = PlainDesc(dst_dims, compute);
    int bias = -1, residual = -1;
    dnnl::primitive_attr attr = DnnlThunkBuilder::Attr();
    dnnl::post_ops ops;
    int residual_index = -1;
    if (ep.has_act) ops.append_eltwise(1.f, ep.act, ep.alpha, 0.f);
    if (ep.residual >= 0) {
      residual_index = ops.len();
      ops.append_binary(dnnl::algorithm::binary_add, PlainDesc(dst_dims, user_dt));
      residual = b.NodeMemory(ep.residual, PlainDesc(dst_dims, user_dt));
    }
    if (ops.len() > 0) attr.set_post_ops(ops);
    if (ep.bias >= 0) {
      dnnl::memory::desc user_bias = PlainDesc(bias_dims, user_dt);
      KILN_ASSIGN_OR_RETURN(bias, b.Input(ep.bias, user_bias, WithType(user_bias, compute)));
    }
    dnnl::matmul::primitive_desc pd;
    absl::Status made = b.Create("matmul", [&] {
      if (bias >= 0) {
        dnnl::matmul::desc desc(b.Desc(src), wei_md, b.Desc(bias), dst_md);
        pd = dnnl::matmul::primitive_desc(desc, attr, lc.cpu->engine());
      } else {
        dnnl::matmul::desc desc(b.Desc(src), wei_md, dst_md);
        pd = dnnl::matmul::primitive_desc(desc, attr, lc.cpu->engine());
      }
    });
    if (!made.ok()) {
      if (compute != dnnl::memory::data_type::f32) continue;  // retry in f32
      return made;                                            // Unimplemented: the loop runs it
    }
    if (IsRefImpl(pd)) {
      // Narrow floats: compute in f32 instead. Strided operands: copy them to plain layouts.
      if (compute != dnnl::memory::data_type::f32) continue;
      if (pack_weights) return Unimplemented(n, "oneDNN has only its reference matmul here");
      if (!force_copy && (lv.in_place || rv.in_place))
        return OneDnnMatmulImpl(n, lc, p, /*force_copy=*/true, ep);
    }
    if (pack_weights) {
      // The weight as the node holds it ([K, N] with the view's strides), in the node's dtype.
      dnnl::memory::desc user({p.K, p.N}, user_dt, {rv.strides[1], rv.strides[2]});
      KILN_ASSIGN_OR_RETURN(wei, b.ConstantInput(n.operand(1), user, pd.weights_desc()));
    }
    b.NameImpl(pd);
    KILN_ASSIGN_OR_RETURN(int dst, b.Output(out_node, PlainDesc(dst_dims, user_dt), dst_md));
    std::vector<std::pair<int, int>> args = {
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
    if (bias >= 0) args.push_back({DNNL_ARG_BIAS, bias});
    if (residual >= 0)
      args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(residual_index) | DNNL_ARG_SRC_1, residual});
    KILN_RETURN_IF_ERROR(b.AddPrimitive<dnnl::matmul>("matmul", pd, std::move(args)));
    return b.Finish();
  }
  return Unimplemented(n, "oneDNN matmul");
}

// Whether node `id` can be fixed for the executable's life (Executable::BindConstantParameters):
// a constant, or a parameter no output is computed in place of (a training step's weights are
// updated in place, so they never are), seen through reshapes. Only for such weights is a
// pre-packed variant worth building.
bool MayBeConstant(const ir::Graph& g, int id) {
  while (g.node(id).opcode() == ir::Opcode::kReshape) id = g.node(id).operand(0);
  const ir::Node& n = g.node(id);
  if (n.opcode() == ir::Opcode::kConstant) return true;
  if (n.opcode() != ir::Opcode::kParameter) return false;
  const int64_t index = n.attr_int("index");
  for (const ir::Output& o : g.outputs())
    if (o.in_place_of == index) return false;
  return true;
}

// Runs `packed` (a matmul over the pre-packed weight) while the weight is bound constant, and
// `fallback` (the same matmul on the plain weight) otherwise: a training step, an unbound run, or
// a run handed another weight buffer than the one packed.
class ConstantWeightThunk : public Thunk {
 public:
  ConstantWeightThunk(int weight, std::unique_ptr<Thunk> packed, std::unique_ptr<Thunk> fallback)
      : weight_(weight), packed_(std::move(packed)), fallback_(std::move(fallback)) {}

  std::string name() const override { return live_ ? packed_->name() : fallback_->name(); }

  absl::Status PrepareConstants(const RunContext& ctx) override {
    live_ = false;
    packed_from_ = nullptr;
    KILN_RETURN_IF_ERROR(fallback_->PrepareConstants(ctx));
    KILN_RETURN_IF_ERROR(packed_->PrepareConstants(ctx));
    if (IsConstant(ctx) && ctx.buffers[weight_] != nullptr) {
      live_ = true;
      packed_from_ = ctx.buffers[weight_];
    }
    return absl::OkStatus();
  }

  void Run(RunContext& ctx) override {
    if (live_ && ctx.buffers[weight_] == packed_from_ && IsConstant(ctx)) {
      packed_->Run(ctx);
    } else {
      fallback_->Run(ctx);
    }
  }

 private:
  bool IsConstant(const RunContext& ctx) const {
    return weight_ < static_cast<int>(ctx.constant.size()) && ctx.constant[weight_];
  }

  int weight_;
  std::unique_ptr<Thunk> packed_, fallback_;
  bool live_ = false;
  const void* packed_from_ = nullptr;
};

// The oneDNN matmul, wrapped for bound f32 weights in the packed-weight kernels: the gemv
// (gemv.cc) for small batches, and at AVX2 the blocked sgemm (sgemm.cc) up to
// kPackedSgemmMaxRows, where oneDNN's gemm:jit would re-pack the plain weight on every call (and
// there also weights that are not constant, packed on each run). Other bound weights (an epilogue
// the kernels lack, more rows, AVX-512) run a oneDNN matmul over the weight pre-packed into
// oneDNN's blocked layout where oneDNN has one. Either takes over when the weight is bound
// constant, and the plain oneDNN matmul runs otherwise.
absl::StatusOr<std::unique_ptr<Thunk>> OneDnnMatmul(const ir::Node& n, LowerContext& lc,
                                                    const DotPlan& p, bool force_copy,
                                                    const Epilogue& ep = {}) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Thunk> onednn, OneDnnMatmulImpl(n, lc, p, force_copy, ep));
  if (!lc.options.prepack_weights) return onednn;
  const ir::Type& lt = lc.operand_type(n, 0);
  const ir::Type& rt = lc.operand_type(n, 1);
  const bool f32 =
      lt.dtype == DType::kF32 && rt.dtype == DType::kF32 && n.type().dtype == DType::kF32;
  const bool act_ok = !ep.has_act || (ep.act == dnnl::algorithm::eltwise_relu && ep.alpha == 0.f);
  const bool gemv = p.M <= kGemvMaxRows;
  const bool packed_ok =
      f32 && act_ok && p.B == 1 && p.M >= 1 && p.N >= 1 &&
      (gemv || (p.M <= kPackedSgemmMaxRows && PackedSgemmRunsAt(ActiveKernelLevel())));
  if (packed_ok) {
    const std::vector<int64_t>* lg[3] = {&p.lhs.batch, &p.lhs.free, &p.lhs.contract};
    const std::vector<int64_t>* rg[3] = {&p.rhs.batch, &p.rhs.contract, &p.rhs.free};
    OperandView lv = MakeView(p.lhs_dims, lt.dtype, lg, /*force_copy=*/false);
    OperandView rv = MakeView(p.rhs_dims, rt.dtype, rg, /*force_copy=*/false);
    if (lv.in_place && rv.in_place) {
      GemvSpec s;
      s.lhs = n.operand(0);
      s.rhs = n.operand(1);
      s.out = ep.out >= 0 ? ep.out : n.id();
      s.M = p.M;
      s.K = p.K;
      s.N = p.N;
      s.x_row_stride = lv.strides[1];
      s.x_col_stride = lv.strides[2];
      s.w_k_stride = rv.strides[1];
      s.w_n_stride = rv.strides[2];
      s.bias = ep.bias;
      s.relu = ep.has_act;
      s.residual = ep.residual;
      s.name = ThunkName(n, (gemv ? "packed gemv" : "packed sgemm") + ep.label);
      // A weight that is not constant (training, or weights passed as inputs) is packed on every
      // run where gemm:jit runs at half rate: up to K = 1024. avx2, 2 threads, M x K x N,
      // GFLOP/s of pack + sgemm against gemm:jit: 256x1024x1024 167 vs 101, 64x1024x1024 122 vs
      // 98, 128x768x3072 153 vs 99; but 256x3072x768 176 vs 198, where gemm:jit is at rate. At
      // least 64 columns: a narrow product (a classifier head, a long contraction into a few
      // outputs: sgemm:jit) would compute mostly zero padding in 16-column panels.
      s.pack_per_run = !gemv && p.K <= 1024 && p.N >= 64;
      s.per_run_name = ThunkName(n, "packed sgemm" + ep.label + ", weight packed per run");
      return MakeGemvThunk(s, std::move(onednn));
    }
    if (gemv) return onednn;
  }
  if (!MayBeConstant(lc.graph, n.operand(1))) return onednn;
  LowerResult packed = OneDnnMatmulImpl(n, lc, p, force_copy, ep, /*pack_weights=*/true);
  if (!packed.ok()) {
    if (packed.status().code() == absl::StatusCode::kUnimplemented) return onednn;
    return packed.status();
  }
  return std::unique_ptr<Thunk>(
      new ConstantWeightThunk(n.operand(1), std::move(*packed), std::move(onednn)));
}

// The loop path: any dtype with arithmetic (floats accumulate in their compute type, integers in
// int64 and wrap on store).
template <typename S>
std::unique_ptr<Thunk> LoopMatmul(const ir::Node& n, const DotPlan& p) {
  auto ls = RowMajorStrides(p.lhs_dims), rs = RowMajorStrides(p.rhs_dims);
  auto lb = GroupOffsets(p.lhs_dims, ls, p.lhs.batch),
       lm = GroupOffsets(p.lhs_dims, ls, p.lhs.free),
       lk = GroupOffsets(p.lhs_dims, ls, p.lhs.contract);
  auto rb = GroupOffsets(p.rhs_dims, rs, p.rhs.batch),
       rn = GroupOffsets(p.rhs_dims, rs, p.rhs.free),
       rk = GroupOffsets(p.rhs_dims, rs, p.rhs.contract);
  int lhs = n.operand(0), rhs = n.operand(1), out = n.id();
  int64_t M = p.M, N = p.N, K = p.K, B = p.B;
  using C = typename Elem<S>::C;
  using Acc = std::conditional_t<std::is_integral_v<C>, int64_t, C>;
  return MakeFnThunk(n, "loop matmul", [=](RunContext& ctx) {
    const S* a = static_cast<const S*>(ctx.buffers[lhs]);
    const S* w = static_cast<const S*>(ctx.buffers[rhs]);
    S* o = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(B * M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, N * K)),
                [&](int64_t begin, int64_t end) {
                  for (int64_t bm = begin; bm < end; ++bm) {
                    int64_t bi = bm / M, m = bm % M;
                    const S* arow = a + lb[bi] + lm[m];
                    const S* wb = w + rb[bi];
                    for (int64_t j = 0; j < N; ++j) {
                      Acc acc = 0;
                      for (int64_t k = 0; k < K; ++k)
                        acc += static_cast<Acc>(Elem<S>::Load(arow[lk[k]])) *
                               static_cast<Acc>(Elem<S>::Load(wb[rk[k] + rn[j]]));
                      o[bm * N + j] = Elem<S>::Store(static_cast<C>(acc));
                    }
                  }
                });
  });
}

}  // namespace

LowerResult LowerDotGeneral(const ir::Node& n, LowerContext& lc) {
  const ir::Type& lt = lc.operand_type(n, 0);
  const ir::Type& rt = lc.operand_type(n, 1);
  DotPlan p = MakePlan(n, lt, rt);
  int out = n.id();
  int64_t bytes = n.type().byte_size();
  if (p.K == 0) {  // empty contraction: zeros
    return MakeFnThunk(n, "zeros",
                       [=](RunContext& ctx) { std::memset(ctx.buffers[out], 0, bytes); });
  }
  if (lt.dtype != rt.dtype || lt.dtype != n.type().dtype)
    return Unimplemented(n, absl::StrCat("mixed dtypes ", lt.ToString(), " x ", rt.ToString()));
  if (!lc.options.prefer_loops) {
    LowerResult r = OneDnnMatmul(n, lc, p, /*force_copy=*/false);
    if (r.ok() || r.status().code() != absl::StatusCode::kUnimplemented) return r;
  }
  return VisitNumeric(
      lt.dtype,
      [&](auto tag) -> LowerResult { return LoopMatmul<typename decltype(tag)::type>(n, p); },
      UnsupportedDType(n, lt.dtype));
}

// ---- dot_general + bias + activation + residual (output fusion) ----
absl::StatusOr<Epilogue> OneDnnEpilogue(const compiler::EpilogueSteps& steps, const ir::Graph& g) {
  Epilogue ep;
  ep.out = steps.out;
  if (steps.bias >= 0) {
    ep.bias = steps.bias;
    ep.label += "+bias";
  }
  if (steps.activation >= 0) {
    const ir::Node& m = g.node(steps.activation);
    std::optional<OneDnnEltwiseAlg> act = OneDnnEltwise(m);
    if (!act) return Unimplemented(m, "no oneDNN eltwise post-op for this activation");
    ep.has_act = true;
    ep.act = act->alg;
    ep.alpha = act->alpha;
    ep.label += "+" + std::string(ir::OpcodeName(m.opcode()));
  }
  if (steps.residual >= 0) {
    ep.residual = steps.residual;
    ep.residual_first = steps.residual_first;
    // In the order they apply: "+bias+residual+relu" or "+bias+relu+residual".
    if (ep.residual_first && ep.has_act) {
      const size_t act_at = ep.label.rfind('+');
      ep.label.insert(act_at, "+residual");
    } else {
      ep.label += "+residual";
    }
  }
  return ep;
}

bool CanLowerMatmulEpilogue(const ir::Graph& g, const std::vector<int>& members,
                            bool prefer_loops) {
  if (members.size() < 2 || prefer_loops) return false;
  const ir::Node& dot = g.node(members[0]);
  if (dot.opcode() != ir::Opcode::kDotGeneral) return false;
  DType dt = dot.type().dtype;
  if (dt != DType::kF32 && dt != DType::kBF16) return false;
  DotPlan p = MakePlan(dot, g.node(dot.operand(0)).type(), g.node(dot.operand(1)).type());
  // The bias runs along the matmul's N: the output's last dim must be all of N.
  if (p.K <= 0 || dot.type().shape.rank() < 1 || dot.type().shape.dims().back() != p.N)
    return false;
  std::optional<compiler::EpilogueSteps> steps = compiler::MatchEpilogue(g, members);
  // The matmul adds its residual after the activation only.
  return steps && !steps->residual_first && OneDnnEpilogue(*steps, g).ok();
}

LowerResult LowerMatmulEpilogue(const compiler::ExecutionPlan::Kernel& k, LowerContext& lc) {
  const ir::Graph& g = lc.graph;
  const ir::Node& dot = g.node(k.members[0]);
  KILN_ASSIGN_OR_RETURN(Epilogue ep, OneDnnEpilogue(k.epilogue, g));
  DotPlan p = MakePlan(dot, g.node(dot.operand(0)).type(), g.node(dot.operand(1)).type());
  return OneDnnMatmul(dot, lc, p, /*force_copy=*/false, ep);
}

}  // namespace kiln::runtime::cpu
