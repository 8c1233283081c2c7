// Row-wise loops: softmax and log_softmax (fallback for oneDNN's), layer_norm (fallback),
// rms_norm and cross_entropy. Rows are independent: one parallel task per block of rows. All
// compute in f32 (f64 for f64), two passes over each row for numerical stability.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;

template <typename S>
std::unique_ptr<Thunk> SoftmaxThunk(const ir::Node& n, bool log) {
  using C = typename Elem<S>::C;
  const Shape& s = n.type().shape;
  int axis = static_cast<int>(n.attr_int("axis"));
  int64_t outer = 1, inner = 1, A = s.dim(axis);
  for (int d = 0; d < axis; ++d) outer *= s.dim(d);
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s.dim(d);
  int in = n.operand(0), out = n.id();
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[in]);
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(A, 1)),
                [&](int64_t b, int64_t e) {
                  for (int64_t t = b; t < e; ++t) {
                    int64_t o = t / inner, j = t % inner;
                    const S* p = x + o * A * inner + j;
                    S* q = y + o * A * inner + j;
                    C m = -std::numeric_limits<C>::infinity();
                    for (int64_t a = 0; a < A; ++a) m = std::max(m, Elem<S>::Load(p[a * inner]));
                    C sum = 0;
                    for (int64_t a = 0; a < A; ++a)
                      sum += std::exp(Elem<S>::Load(p[a * inner]) - m);
                    if (log) {
                      C lse = m + std::log(sum);
                      for (int64_t a = 0; a < A; ++a)
                        q[a * inner] = Elem<S>::Store(Elem<S>::Load(p[a * inner]) - lse);
                    } else {
                      C inv = C(1) / sum;
                      for (int64_t a = 0; a < A; ++a)
                        q[a * inner] =
                            Elem<S>::Store(std::exp(Elem<S>::Load(p[a * inner]) - m) * inv);
                    }
                  }
                });
  });
}

// Shared by layer_norm (mean-centred, with beta) and rms_norm.
template <typename S>
std::unique_ptr<Thunk> NormThunk(const ir::Node& n, bool rms) {
  using C = typename Elem<S>::C;
  const Shape& s = n.type().shape;
  int64_t D = s.dim(s.rank() - 1);
  int64_t rows = s.num_elements() / std::max<int64_t>(D, 1);
  C eps = static_cast<C>(n.attr_float("epsilon"));
  int in = n.operand(0), gamma = n.operand(1), beta = rms ? -1 : n.operand(2), out = n.id();
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[in]);
    const S* g = static_cast<const S*>(ctx.buffers[gamma]);
    const S* bt = beta >= 0 ? static_cast<const S*>(ctx.buffers[beta]) : nullptr;
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(D, 1)),
                [&](int64_t b, int64_t e) {
                  for (int64_t r = b; r < e; ++r) {
                    const S* p = x + r * D;
                    S* q = y + r * D;
                    C mean = 0;
                    if (!rms) {
                      for (int64_t i = 0; i < D; ++i) mean += Elem<S>::Load(p[i]);
                      mean /= static_cast<C>(D);
                    }
                    C ss = 0;
                    for (int64_t i = 0; i < D; ++i) {
                      C d = Elem<S>::Load(p[i]) - mean;
                      ss += d * d;
                    }
                    C inv = C(1) / std::sqrt(ss / static_cast<C>(D) + eps);
                    for (int64_t i = 0; i < D; ++i) {
                      C v = (Elem<S>::Load(p[i]) - mean) * inv * Elem<S>::Load(g[i]);
                      if (bt) v += Elem<S>::Load(bt[i]);
                      q[i] = Elem<S>::Store(v);
                    }
                  }
                });
  });
}

template <typename S>
std::unique_ptr<Thunk> CrossEntropyThunk(const ir::Node& n, LowerContext& lc) {
  using C = typename Elem<S>::C;
  const Shape& ls = lc.operand_type(n, 0).shape;
  int64_t Cn = ls.dim(ls.rank() - 1);
  int64_t rows = ls.num_elements() / std::max<int64_t>(Cn, 1);
  bool l64 = lc.operand_type(n, 1).dtype == DType::kS64;
  int logits = n.operand(0), labels = n.operand(1), out = n.id();
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[logits]);
    const void* lab = ctx.buffers[labels];
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(
        rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(Cn, 1)), [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            const S* p = x + r * Cn;
            int64_t k =
                l64 ? static_cast<const int64_t*>(lab)[r] : static_cast<const int32_t*>(lab)[r];
            if (k < 0 || k >= Cn) {  // ignored example (like PyTorch's ignore_index)
              y[r] = Elem<S>::Store(C(0));
              continue;
            }
            C lse;
            if constexpr (std::is_same_v<S, float>) {
              lse = LogSumExpRowF32(p, Cn);  // vectorized: a vocabulary-wide row is the hot case
            } else {
              C m = -std::numeric_limits<C>::infinity();
              for (int64_t i = 0; i < Cn; ++i) m = std::max(m, Elem<S>::Load(p[i]));
              C sum = 0;
              for (int64_t i = 0; i < Cn; ++i) sum += std::exp(Elem<S>::Load(p[i]) - m);
              lse = m + std::log(sum);
            }
            y[r] = Elem<S>::Store(lse - Elem<S>::Load(p[k]));
          }
        });
  });
}

}  // namespace

LowerResult LowerSoftmaxLoop(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  bool log = n.opcode() == Opcode::kLogSoftmax;
  return VisitFloat(
      t,
      [&](auto tag) -> LowerResult { return SoftmaxThunk<typename decltype(tag)::type>(n, log); },
      UnsupportedDType(n, t));
}

LowerResult LowerLayerNormLoop(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  if (lc.operand_type(n, 1).dtype != t || lc.operand_type(n, 2).dtype != t)
    return UnsupportedDType(n, lc.operand_type(n, 1).dtype);
  return VisitFloat(
      t, [&](auto tag) -> LowerResult { return NormThunk<typename decltype(tag)::type>(n, false); },
      UnsupportedDType(n, t));
}

// y = x / sqrt(mean(x^2) + epsilon) * gamma over the last dim.
LowerResult LowerRmsNorm(const ir::Node& n, LowerContext& lc) {
  DType t = n.type().dtype;
  if (lc.operand_type(n, 1).dtype != t) return UnsupportedDType(n, lc.operand_type(n, 1).dtype);
  return VisitFloat(
      t, [&](auto tag) -> LowerResult { return NormThunk<typename decltype(tag)::type>(n, true); },
      UnsupportedDType(n, t));
}

// loss = logsumexp(logits) - logits[label] per example; a label outside [0, C) gives 0.
LowerResult LowerCrossEntropy(const ir::Node& n, LowerContext& lc) {
  DType t = lc.operand_type(n, 0).dtype;
  DType lt = lc.operand_type(n, 1).dtype;
  if (lt != DType::kS32 && lt != DType::kS64) return UnsupportedDType(n, lt);
  return VisitFloat(
      t,
      [&](auto tag) -> LowerResult {
        return CrossEntropyThunk<typename decltype(tag)::type>(n, lc);
      },
      UnsupportedDType(n, t));
}

}  // namespace kiln::runtime::cpu
