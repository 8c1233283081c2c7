// Reference kernels for the composite ops, computed natively (not through their decompositions):
// this is what the decomposition pass is tested against. Everything is computed in double, one
// row at a time, and rounded once to the output dtype.
#include <cmath>
#include <limits>

#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"

namespace kiln::eval {
namespace {

using ir::Opcode;

constexpr double kInf = std::numeric_limits<double>::infinity();

// max_j x_j and log sum_j exp(x_j - max). A row of all -inf gives NaN downstream, as in PyTorch.
void LogSumExpParts(const std::vector<double>& row, double& max, double& log_sum) {
  max = -kInf;
  for (double v : row) max = (std::isnan(v) || v > max) ? v : max;
  double sum = 0;
  for (double v : row) sum += std::exp(v - max);
  log_sum = std::log(sum);
}

absl::Status CheckFloatOperands(const ir::Node& n, OperandTypes types, int count) {
  for (int k = 0; k < count; ++k)
    KILN_RETURN_IF_ERROR(
        CheckDType(n, types[k].dtype, kFloatTypes, "operand " + std::to_string(k)));
  return CheckDType(n, n.type().dtype, kFloatTypes, "result");
}

// exp(x - max) / sum exp(x - max) along `axis`.
// x - max - log sum exp(x - max) along `axis`.
absl::StatusOr<Kernel> Softmax(const ir::Node& n, OperandTypes types) {
  KILN_RETURN_IF_ERROR(CheckFloatOperands(n, types, 1));
  AxisSplit s = SplitAt(n.type().shape, static_cast<int>(n.attr_int("axis")));
  bool log = n.opcode() == Opcode::kLogSoftmax;
  DType in_t = types[0].dtype, out_t = n.type().dtype;
  int x = 0, y = ResultSlot(n);
  return Kernel([=, row = std::vector<double>(s.size)](Buffers ctx) mutable {
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        auto at = [&](int64_t k) { return (o * s.size + k) * s.inner + i; };
        for (int64_t k = 0; k < s.size; ++k) row[k] = LoadAsDouble(In(ctx, x), in_t, at(k));
        double max, log_sum;
        LogSumExpParts(row, max, log_sum);
        for (int64_t k = 0; k < s.size; ++k) {
          double v = log ? row[k] - max - log_sum : std::exp(row[k] - max - log_sum);
          StoreFromDouble(Out(ctx, y), out_t, at(k), v);
        }
      }
  });
}

// Over the last dim D: (x - mean) / sqrt(var + eps) * gamma + beta, var biased (divides by D).
// Over the last dim D: x / sqrt(mean(x^2) + eps) * gamma.
absl::StatusOr<Kernel> Norm(const ir::Node& n, OperandTypes types) {
  bool layer = n.opcode() == Opcode::kLayerNorm;
  KILN_RETURN_IF_ERROR(CheckFloatOperands(n, types, layer ? 3 : 2));
  const Shape& shape = n.type().shape;
  if (shape.rank() < 1) return Unsupported(n, "operand must have rank >= 1");
  int64_t d = shape.dim(shape.rank() - 1);
  int64_t rows = d > 0 ? shape.num_elements() / d : 0;
  double eps = n.attr_float("epsilon");
  DType x_t = types[0].dtype, g_t = types[1].dtype;
  DType b_t = layer ? types[2].dtype : g_t;
  DType out_t = n.type().dtype;
  int x = 0, gamma = 1, beta = layer ? 2 : -1, y = ResultSlot(n);
  return Kernel([=, row = std::vector<double>(d)](Buffers ctx) mutable {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < d; ++k) row[k] = LoadAsDouble(In(ctx, x), x_t, r * d + k);
      double mean = 0, denom = 0;
      if (layer) {
        for (double v : row) mean += v;
        mean /= static_cast<double>(d);
        double var = 0;
        for (double v : row) var += (v - mean) * (v - mean);
        var /= static_cast<double>(d);
        denom = std::sqrt(var + eps);
      } else {
        double ms = 0;
        for (double v : row) ms += v * v;
        denom = std::sqrt(ms / static_cast<double>(d) + eps);
      }
      for (int64_t k = 0; k < d; ++k) {
        double v = (row[k] - mean) / denom * LoadAsDouble(In(ctx, gamma), g_t, k);
        if (layer) v += LoadAsDouble(In(ctx, beta), b_t, k);
        StoreFromDouble(Out(ctx, y), out_t, r * d + k, v);
      }
    }
  });
}

// Per example: logsumexp(logits) - logits[label]. A label outside [0, C) contributes a loss of 0
// (like PyTorch's ignore_index, whose default -100 is out of range).
absl::StatusOr<Kernel> CrossEntropy(const ir::Node& n, OperandTypes types) {
  KILN_RETURN_IF_ERROR(CheckDType(n, types[0].dtype, kFloatTypes, "logits"));
  KILN_RETURN_IF_ERROR(CheckDType(n, types[1].dtype, kIntTypes, "labels"));
  KILN_RETURN_IF_ERROR(CheckDType(n, n.type().dtype, kFloatTypes, "result"));
  const Shape& ls = types[0].shape;
  if (ls.rank() < 1) return Unsupported(n, "logits must have rank >= 1");
  int64_t c = ls.dim(ls.rank() - 1);
  int64_t rows = n.type().shape.num_elements();
  DType l_t = types[0].dtype, lab_t = types[1].dtype, out_t = n.type().dtype;
  int logits = 0, labels = 1, y = ResultSlot(n);
  return Kernel([=, row = std::vector<double>(c)](Buffers ctx) mutable {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t label = LoadAsInt64(In(ctx, labels), lab_t, r);
      if (label < 0 || label >= c) {
        StoreFromDouble(Out(ctx, y), out_t, r, 0.0);
        continue;
      }
      for (int64_t k = 0; k < c; ++k) row[k] = LoadAsDouble(In(ctx, logits), l_t, r * c + k);
      double max, log_sum;
      LogSumExpParts(row, max, log_sum);
      StoreFromDouble(Out(ctx, y), out_t, r, max + log_sum - row[label]);
    }
  });
}

// softmax(q k^T * scale) v over the last two dims, leading dims are batch. With causal = 1, key j
// is masked (-inf) for query i when j > i + (Sk - Sq): the mask is aligned at the end, as for a
// decoder continuing a cached prefix. A query that sees no key gets NaN (PyTorch does the same).
absl::StatusOr<Kernel> Attention(const ir::Node& n, OperandTypes types) {
  KILN_RETURN_IF_ERROR(CheckFloatOperands(n, types, 3));
  const Shape& qs = types[0].shape;
  const Shape& ks = types[1].shape;
  const Shape& vs = types[2].shape;
  int r = qs.rank();
  if (r < 2 || ks.rank() != r || vs.rank() != r)
    return Unsupported(n, "q, k and v must have the same rank >= 2");
  int64_t sq = qs.dim(r - 2), d = qs.dim(r - 1), sk = ks.dim(r - 2), dv = vs.dim(r - 1);
  int64_t batch = 1;
  for (int i = 0; i < r - 2; ++i) batch *= qs.dim(i);
  bool causal = n.attr_int("causal") != 0;
  double scale = n.attr_float("scale");
  DType q_t = types[0].dtype, k_t = types[1].dtype;
  DType v_t = types[2].dtype, out_t = n.type().dtype;
  int q = 0, k = 1, v = 2, y = ResultSlot(n);
  return Kernel([=, p = std::vector<double>(sk)](Buffers ctx) mutable {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j) {
          if (causal && j > i + (sk - sq)) {
            p[j] = -kInf;
            continue;
          }
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += LoadAsDouble(In(ctx, q), q_t, (b * sq + i) * d + e) *
                   LoadAsDouble(In(ctx, k), k_t, (b * sk + j) * d + e);
          p[j] = dot * scale;
        }
        double max, log_sum;
        LogSumExpParts(p, max, log_sum);
        for (int64_t j = 0; j < sk; ++j) p[j] = std::exp(p[j] - max - log_sum);
        for (int64_t e = 0; e < dv; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < sk; ++j)
            acc += p[j] * LoadAsDouble(In(ctx, v), v_t, (b * sk + j) * dv + e);
          StoreFromDouble(Out(ctx, y), out_t, (b * sq + i) * dv + e, acc);
        }
      }
  });
}

}  // namespace

absl::StatusOr<Kernel> MakeCompositeKernel(const ir::Node& n, OperandTypes types) {
  switch (n.opcode()) {
    case Opcode::kSoftmax:
    case Opcode::kLogSoftmax:
      return Softmax(n, types);
    case Opcode::kLayerNorm:
    case Opcode::kRmsNorm:
      return Norm(n, types);
    case Opcode::kCrossEntropy:
      return CrossEntropy(n, types);
    case Opcode::kAttention:
      return Attention(n, types);
    default:
      return absl::InternalError("composite: unexpected op " +
                                 std::string(ir::OpcodeName(n.opcode())));
  }
}

}  // namespace kiln::eval
