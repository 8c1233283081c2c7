// softmax(q k^T * scale, masked) v, computed in f32 over chunks of the batch so the score matrix
// stays bounded: per chunk one oneDNN batched matmul for q k^T (k read transposed through a
// strided descriptor), a row loop for scale + causal mask + softmax, and one batched matmul for
// the product with v. bf16/f16 operands are widened to f32 in the workspace first and the result
// rounded once at the end. Causal: query i sees keys j <= i + (Sk - Sq); a query that sees no key
// gets NaN (as PyTorch).
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kiln/base/isa_dispatch.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using dt = dnnl::memory::data_type;

// Bytes of scores per chunk we aim for.
constexpr int64_t kScoreBudget = 32 << 20;

struct MatmulCall {
  dnnl::primitive prim;
  dnnl::memory src, wei, dst, scratch;
  int64_t scratch_offset = -1;
  std::vector<dnnl_exec_arg_t> args;
};

class AttentionThunk : public Thunk {
 public:
  std::string name_;
  std::shared_ptr<CpuContext> cpu;
  DType dtype;
  int q_node, k_node, v_node, out_node;
  int64_t B, Sq, Sk, D, Dv, chunk;
  bool causal;
  float scale;
  int64_t q_off = -1, k_off = -1, v_off = -1, o_off = -1, s_off = 0;  // workspace offsets
  MatmulCall qk[2], pv[2];  // [0]: full chunk, [1]: tail chunk

  std::string name() const override { return name_; }

  void Run(RunContext& ctx) override {
    uint8_t* ws = cpu->workspace();
    const float* q = Widen(ctx.buffers[q_node], q_off, B * Sq * D, ws);
    const float* k = Widen(ctx.buffers[k_node], k_off, B * Sk * D, ws);
    const float* v = Widen(ctx.buffers[v_node], v_off, B * Sk * Dv, ws);
    float* o = o_off >= 0 ? reinterpret_cast<float*>(ws + o_off)
                          : static_cast<float*>(ctx.buffers[out_node]);
    float* s = reinterpret_cast<float*>(ws + s_off);
    dnnl_stream_t stream = cpu->stream().get();
    for (int64_t b0 = 0; b0 < B; b0 += chunk) {
      int64_t nb = std::min(chunk, B - b0);
      int which = nb == chunk ? 0 : 1;
      Exec(qk[which], q + b0 * Sq * D, k + b0 * Sk * D, s, ws, stream);
      Softmax(s, nb);
      Exec(pv[which], s, v + b0 * Sk * Dv, o + b0 * Sq * Dv, ws, stream);
    }
    if (o_off >= 0) Narrow(o, ctx.buffers[out_node], B * Sq * Dv);
  }

 private:
  static void Exec(MatmulCall& m, const void* a, const void* b, void* c, uint8_t* ws,
                   dnnl_stream_t stream) {
    dnnl_memory_set_data_handle(m.src.get(), const_cast<void*>(a));
    dnnl_memory_set_data_handle(m.wei.get(), const_cast<void*>(b));
    dnnl_memory_set_data_handle(m.dst.get(), c);
    if (m.scratch_offset >= 0) dnnl_memory_set_data_handle(m.scratch.get(), ws + m.scratch_offset);
    dnnl_primitive_execute(m.prim.get(), stream, static_cast<int>(m.args.size()), m.args.data());
  }

  const float* Widen(void* src, int64_t off, int64_t count, uint8_t* ws) const {
    if (off < 0) return static_cast<const float*>(src);
    float* dst = reinterpret_cast<float*>(ws + off);
    if (dtype == DType::kBF16) {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dst[i] = Bf16BitsToFloat(p[i]);
      });
    } else {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dst[i] = F16ToFloat(p[i]);
      });
    }
    return dst;
  }

  void Narrow(const float* src, void* out, int64_t count) const {
    uint16_t* p = static_cast<uint16_t*>(out);
    bool bf = dtype == DType::kBF16;
    ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = bf ? FloatToBf16Bits(src[i]) : FloatToF16(src[i]);
    });
  }

  void Softmax(float* s, int64_t nb) const {
    int64_t shift = Sk - Sq;
    ParallelFor(nb * Sq, std::max<int64_t>(1, 4096 / std::max<int64_t>(Sk, 1)),
                [&](int64_t b, int64_t e) {
                  for (int64_t r = b; r < e; ++r) {
                    float* row = s + r * Sk;
                    int64_t i = r % Sq;
                    int64_t visible = causal ? std::clamp<int64_t>(i + shift + 1, 0, Sk) : Sk;
                    SoftmaxRowF32(row, visible, scale);
                    // A query that sees no key gets NaN, as in the reference and PyTorch.
                    float fill = visible > 0 ? 0.f : std::numeric_limits<float>::quiet_NaN();
                    for (int64_t j = visible; j < Sk; ++j) row[j] = fill;
                  }
                });
  }
};

KILN_ALWAYS_INLINE inline void SoftmaxRowF32Body(float* row, int64_t n, float scale) {
  if (n <= 0) return;
  float mp[8];
  for (int k = 0; k < 8; ++k) mp[k] = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) {
      row[j + k] *= scale;
      mp[k] = std::max(mp[k], row[j + k]);
    }
  float m = -std::numeric_limits<float>::infinity();
  for (int k = 0; k < 8; ++k) m = std::max(m, mp[k]);
  for (; j < n; ++j) {
    row[j] *= scale;
    m = std::max(m, row[j]);
  }
  for (int64_t i = 0; i < n; ++i) row[i] = FastExp(row[i] - m);
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) part[k] += row[j + k];
  float sum =
      ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; j < n; ++j) sum += row[j];
  float inv = 1.f / sum;
  for (int64_t i = 0; i < n; ++i) row[i] *= inv;
}

KILN_ALWAYS_INLINE inline float LogSumExpRowF32Body(const float* row, int64_t n) {
  // One pass over memory: each chunk is read from memory for its max, then again from L1 for
  // its exp-sum against the running max; a larger max rescales the running sum once per chunk.
  // 32 lanes keep two AVX-512 (four AVX2) accumulators busy. A vocabulary-wide row (50257
  // floats) read twice would stream the second pass from L2 at half the speed.
  constexpr int64_t kChunk = 2048;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m = kNegInf, sum = 0.f;
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const float* x = row + c0;
    const int64_t len = std::min(kChunk, n - c0);
    float mp[32];
    for (int k = 0; k < 32; ++k) mp[k] = kNegInf;
    int64_t j = 0;
    for (; j + 32 <= len; j += 32)
      for (int k = 0; k < 32; ++k) mp[k] = std::max(mp[k], x[j + k]);
    float cm = kNegInf;
    for (int k = 0; k < 32; ++k) cm = std::max(cm, mp[k]);
    for (; j < len; ++j) cm = std::max(cm, x[j]);
    if (cm > m) {
      sum *= FastExp(m - cm);  // 0 while m is -inf
      m = cm;
    }
    float part[32] = {};
    j = 0;
    for (; j + 32 <= len; j += 32)
      for (int k = 0; k < 32; ++k) part[k] += FastExp(x[j + k] - m);
    float s = 0.f;
    for (int k = 0; k < 32; ++k) s += part[k];
    for (; j < len; ++j) s += FastExp(x[j] - m);
    sum += s;
  }
  return m + std::log(sum);
}

}  // namespace

KILN_ISA_VARIANTS(void, SoftmaxRowF32, (float* row, int64_t n, float scale), (row, n, scale))
KILN_ISA_VARIANTS(float, LogSumExpRowF32, (const float* row, int64_t n), (row, n))

namespace {

absl::Status MakeMatmul(const ir::Node& n, const LowerContext& lc, WorkspaceLayout& layout,
                        const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                        const dnnl::memory::desc& c, MatmulCall& m) {
  const CpuContext& cpu = *lc.cpu;
  return DnnlStatus(lc, n, "matmul (attention)", [&] {
    dnnl::matmul::desc d(a, b, c);
    dnnl::matmul::primitive_desc pd(d, DnnlThunkBuilder::Attr(), cpu.engine());
    m.prim = dnnl::matmul(pd);
    m.src = dnnl::memory(a, cpu.engine(), DNNL_MEMORY_NONE);
    m.wei = dnnl::memory(b, cpu.engine(), DNNL_MEMORY_NONE);
    m.dst = dnnl::memory(c, cpu.engine(), DNNL_MEMORY_NONE);
    m.args = {
        {DNNL_ARG_SRC, m.src.get()}, {DNNL_ARG_WEIGHTS, m.wei.get()}, {DNNL_ARG_DST, m.dst.get()}};
    if (pd.scratchpad_desc().get_size() > 0) {
      m.scratch = dnnl::memory(pd.scratchpad_desc(), cpu.engine(), DNNL_MEMORY_NONE);
      m.scratch_offset = layout.Add(static_cast<int64_t>(pd.scratchpad_desc().get_size()));
      m.args.push_back({DNNL_ARG_SCRATCHPAD, m.scratch.get()});
    }
  });
}

}  // namespace

LowerResult LowerAttention(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16) return UnsupportedDType(n, t);
  const Shape& qs = lc.operand_type(n, 0).shape;
  const Shape& ks = lc.operand_type(n, 1).shape;
  const Shape& vs = lc.operand_type(n, 2).shape;
  for (int i = 0; i < 3; ++i)
    if (lc.operand_type(n, i).dtype != t) return UnsupportedDType(n, lc.operand_type(n, i).dtype);
  int r = qs.rank();
  if (r < 2 || ks.rank() != r || vs.rank() != r)
    return Unimplemented(n, "q, k and v must have the same rank >= 2");
  auto t_ = std::make_unique<AttentionThunk>();
  AttentionThunk& a = *t_;
  a.name_ = ThunkName(n, "onednn matmul + softmax loop");
  a.cpu = lc.cpu;
  a.dtype = t;
  a.q_node = n.operand(0);
  a.k_node = n.operand(1);
  a.v_node = n.operand(2);
  a.out_node = n.id();
  a.B = 1;
  for (int d = 0; d < r - 2; ++d) {
    if (ks.dim(d) != qs.dim(d) || vs.dim(d) != qs.dim(d))
      return Unimplemented(n, "q, k and v must share their leading dims");
    a.B *= qs.dim(d);
  }
  a.Sq = qs.dim(r - 2);
  a.D = qs.dim(r - 1);
  a.Sk = ks.dim(r - 2);
  a.Dv = vs.dim(r - 1);
  a.causal = n.attr_int("causal") != 0;
  a.scale = static_cast<float>(n.attr_float("scale"));
  if (a.Sk == 0 || a.D == 0) return Unimplemented(n, "empty keys or head dim");

  WorkspaceLayout layout;
  if (t != DType::kF32) {
    a.q_off = layout.Add(a.B * a.Sq * a.D * 4);
    a.k_off = layout.Add(a.B * a.Sk * a.D * 4);
    a.v_off = layout.Add(a.B * a.Sk * a.Dv * 4);
    a.o_off = layout.Add(a.B * a.Sq * a.Dv * 4);
  }
  a.chunk = std::clamp<int64_t>(kScoreBudget / std::max<int64_t>(1, a.Sq * a.Sk * 4), 1, a.B);
  a.s_off = layout.Add(a.chunk * a.Sq * a.Sk * 4);
  int64_t sizes[2] = {a.chunk, a.B % a.chunk};
  for (int i = 0; i < 2; ++i) {
    int64_t nb = sizes[i];
    if (nb == 0) continue;
    auto q_md = dnnl::memory::desc({nb, a.Sq, a.D}, dt::f32, {a.Sq * a.D, a.D, 1});
    auto kt_md = dnnl::memory::desc({nb, a.D, a.Sk}, dt::f32, {a.Sk * a.D, 1, a.D});
    auto s_md = dnnl::memory::desc({nb, a.Sq, a.Sk}, dt::f32, {a.Sq * a.Sk, a.Sk, 1});
    auto v_md = dnnl::memory::desc({nb, a.Sk, a.Dv}, dt::f32, {a.Sk * a.Dv, a.Dv, 1});
    auto o_md = dnnl::memory::desc({nb, a.Sq, a.Dv}, dt::f32, {a.Sq * a.Dv, a.Dv, 1});
    KILN_RETURN_IF_ERROR(MakeMatmul(n, lc, layout, q_md, kt_md, s_md, a.qk[i]));
    KILN_RETURN_IF_ERROR(MakeMatmul(n, lc, layout, s_md, v_md, o_md, a.pv[i]));
  }
  lc.cpu->RequireWorkspace(layout.size());
  return std::unique_ptr<Thunk>(std::move(t_));
}

}  // namespace kiln::runtime::cpu
