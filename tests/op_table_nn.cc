// Op-table rows for contractions (dot_general, conv2d and its backward ops), pooling and the
// composite NN ops (softmax, log_softmax, layer_norm, rms_norm, cross_entropy, attention).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "op_table.h"

namespace kiln::optable {
namespace {

using ir::Opcode;
using ir::Value;

// Output spatial size of a convolution or pooling window along one axis.
int64_t WindowOut(int64_t in, int64_t pad_lo, int64_t pad_hi, int64_t k, int64_t stride,
                  int64_t dilation = 1) {
  return (in + pad_lo + pad_hi - dilation * (k - 1) - 1) / stride + 1;
}

struct ConvCase {
  std::string name;
  Shape input, filter;  // NCHW, OIHW
  ir::Conv2dOptions opts;
};

Shape ConvOutShape(const ConvCase& c) {
  const auto& o = c.opts;
  return Shape{c.input.dim(0), c.filter.dim(0),
               WindowOut(c.input.dim(2), o.padding[0], o.padding[1], c.filter.dim(2), o.strides[0],
                         o.dilation[0]),
               WindowOut(c.input.dim(3), o.padding[2], o.padding[3], c.filter.dim(3), o.strides[1],
                         o.dilation[1])};
}

ir::Conv2dOptions ConvOpts(std::vector<int64_t> strides, std::vector<int64_t> padding,
                           std::vector<int64_t> dilation, int64_t groups) {
  ir::Conv2dOptions o;
  o.strides = std::move(strides);
  o.padding = std::move(padding);
  o.dilation = std::move(dilation);
  o.groups = groups;
  return o;
}

std::vector<ConvCase> ConvCases() {
  return {
      {"3x3", Shape{2, 3, 7, 7}, Shape{4, 3, 3, 3}, ConvOpts({1, 1}, {0, 0, 0, 0}, {1, 1}, 1)},
      {"3x3_pad1", Shape{2, 3, 7, 7}, Shape{4, 3, 3, 3}, ConvOpts({1, 1}, {1, 1, 1, 1}, {1, 1}, 1)},
      {"stride2_pad1", Shape{1, 3, 9, 9}, Shape{5, 3, 3, 3},
       ConvOpts({2, 2}, {1, 1, 1, 1}, {1, 1}, 1)},
      // (8 - 3) % 2 != 0: the last input row and column reach no output.
      {"stride2_uneven", Shape{1, 2, 8, 8}, Shape{3, 2, 3, 3},
       ConvOpts({2, 2}, {0, 0, 0, 0}, {1, 1}, 1)},
      {"dilation2", Shape{1, 2, 9, 9}, Shape{3, 2, 3, 3},
       ConvOpts({1, 1}, {0, 0, 0, 0}, {2, 2}, 1)},
      {"groups2", Shape{1, 4, 6, 6}, Shape{6, 2, 3, 3}, ConvOpts({1, 1}, {0, 0, 0, 0}, {1, 1}, 2)},
      {"stride2_groups2", Shape{2, 4, 7, 7}, Shape{4, 2, 3, 3},
       ConvOpts({2, 2}, {0, 0, 0, 0}, {1, 1}, 2)},
      {"depthwise_pad1", Shape{1, 3, 7, 7}, Shape{3, 1, 3, 3},
       ConvOpts({1, 1}, {1, 1, 1, 1}, {1, 1}, 3)},
      {"asym_2x3_stride1x2_pad0_2_1_0", Shape{1, 2, 5, 6}, Shape{3, 2, 2, 3},
       ConvOpts({1, 2}, {0, 2, 1, 0}, {1, 1}, 1)},
      {"1x1", Shape{2, 5, 3, 3}, Shape{7, 5, 1, 1}, ConvOpts({1, 1}, {0, 0, 0, 0}, {1, 1}, 1)},
      {"5x5_stride2_pad2", Shape{1, 1, 17, 17}, Shape{2, 1, 5, 5},
       ConvOpts({2, 2}, {2, 2, 2, 2}, {1, 1}, 1)},
      {"dilation2_stride2_groups3_pad1", Shape{1, 3, 9, 9}, Shape{6, 1, 3, 3},
       ConvOpts({2, 2}, {1, 1, 1, 1}, {2, 2}, 3)},
      // Channel counts that take oneDNN's blocked (16-wide) kernels, with and without tails.
      {"c16_3x3_pad1", Shape{1, 16, 5, 5}, Shape{16, 16, 3, 3},
       ConvOpts({1, 1}, {1, 1, 1, 1}, {1, 1}, 1)},
      {"c17_o33_1x1_stride2", Shape{2, 17, 5, 5}, Shape{33, 17, 1, 1},
       ConvOpts({2, 2}, {0, 0, 0, 0}, {1, 1}, 1)},
      {"c32_groups4_pad1", Shape{1, 32, 6, 6}, Shape{32, 8, 3, 3},
       ConvOpts({1, 1}, {1, 1, 1, 1}, {1, 1}, 4)},
  };
}

struct PoolCase {
  std::string name;
  Shape input;
  ir::Pool2dOptions opts;
};

ir::Pool2dOptions PoolOpts(std::vector<int64_t> window, std::vector<int64_t> strides,
                           std::vector<int64_t> padding, bool count_include_pad = false) {
  ir::Pool2dOptions o;
  o.window = std::move(window);
  o.strides = std::move(strides);
  o.padding = std::move(padding);
  o.count_include_pad = count_include_pad;
  return o;
}

std::vector<PoolCase> PoolCases() {
  return {
      {"w2_s2", Shape{2, 3, 6, 6}, PoolOpts({2, 2}, {2, 2}, {0, 0, 0, 0})},
      {"w3_s2_pad1", Shape{1, 2, 7, 7}, PoolOpts({3, 3}, {2, 2}, {1, 1, 1, 1})},
      {"w3_s1_overlap", Shape{1, 2, 6, 5}, PoolOpts({3, 3}, {1, 1}, {0, 0, 0, 0})},
      {"w2x3_s1x2_pad1_0_0_1", Shape{1, 2, 5, 7}, PoolOpts({2, 3}, {1, 2}, {1, 0, 0, 1})},
      {"global_4x4", Shape{1, 3, 4, 4}, PoolOpts({4, 4}, {4, 4}, {0, 0, 0, 0})},
  };
}

Shape PoolOutShape(const PoolCase& p) {
  const auto& o = p.opts;
  return Shape{p.input.dim(0), p.input.dim(1),
               WindowOut(p.input.dim(2), o.padding[0], o.padding[1], o.window[0], o.strides[0]),
               WindowOut(p.input.dim(3), o.padding[2], o.padding[3], o.window[1], o.strides[1])};
}

// The int8 ops: integer sums, one f32 conversion and one f32 multiply, so the cpu backend's
// oneDNN int8 primitives and the reference loops agree bit for bit (exact rows).
void AppendQuantizedCases(std::vector<OpCase>& rows) {
  const Gen s8 = IntRange(-127, 127);
  const Gen scales = Uniform(1e-3, 0.1);
  // ---- quantize ----
  for (auto [shape, scale] : {std::pair{Shape{3, 17}, 0.02f}, std::pair{Shape{2, 3, 4, 5}, 0.0173f},
                              std::pair{Shape{1000}, 0.5f}}) {
    OpCase c = MakeCase(
        "quantize_" + ShapeName(shape) + "_s" + std::to_string(static_cast<int>(scale * 1e4)),
        Opcode::kQuantize, {{"x", shape, Uniform(-3, 3)}},
        [scale](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::Quantize(in[0], scale);
        },
        {DType::kF32}, false);
    c.exact = true;
    rows.push_back(std::move(c));
  }
  // ---- quantized_dot ----
  for (auto [x, w] :
       {std::pair{Shape{4, 64}, Shape{64, 10}}, std::pair{Shape{2, 3, 17}, Shape{17, 5}},
        std::pair{Shape{1, 128}, Shape{128, 64}}, std::pair{Shape{33, 7}, Shape{7, 130}},
        std::pair{Shape{64, 300}, Shape{300, 16}}}) {
    OpCase c = MakeCase(
        "quantized_dot_" + ShapeName(x) + "_" + ShapeName(w), Opcode::kQuantizedDot,
        {{"x", x, s8, DType::kS8},
         {"w", w, s8, DType::kS8},
         {"scale", Shape{w.dim(1)}, scales, DType::kF32}},
        [](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::QuantizedDot(in[0], in[1], in[2]);
        },
        {DType::kF32}, false);
    c.exact = true;
    c.reduction = w.dim(0);
    rows.push_back(std::move(c));
  }
  // ---- quantized_conv2d ----
  struct QConv {
    std::string name;
    Shape in, filter;
    ir::Conv2dOptions opts;
  };
  ir::Conv2dOptions pad1;
  pad1.padding = {1, 1, 1, 1};
  ir::Conv2dOptions odd;
  odd.strides = {2, 1};
  odd.padding = {1, 0, 0, 2};
  odd.dilation = {1, 2};
  odd.groups = 2;
  const QConv convs[] = {{"pad1_2x3x8x8_k3", Shape{2, 3, 8, 8}, Shape{8, 3, 3, 3}, pad1},
                         {"plain_1x16x8x8_k1", Shape{1, 16, 8, 8}, Shape{32, 16, 1, 1}, {}},
                         {"pad1_2x16x8x8_k3", Shape{2, 16, 8, 8}, Shape{32, 16, 3, 3}, pad1},
                         {"odd_1x4x7x6_g2", Shape{1, 4, 7, 6}, Shape{6, 2, 3, 3}, odd}};
  for (const QConv& q : convs) {
    ir::Conv2dOptions opts = q.opts;
    OpCase c = MakeCase(
        "quantized_conv2d_" + q.name, Opcode::kQuantizedConv2d,
        {{"x", q.in, s8, DType::kS8},
         {"w", q.filter, s8, DType::kS8},
         {"scale", Shape{q.filter.dim(0)}, scales, DType::kF32}},
        [opts](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::QuantizedConv2d(in[0], in[1], in[2], opts);
        },
        {DType::kF32}, false);
    c.exact = true;
    c.reduction = q.filter.dim(1) * q.filter.dim(2) * q.filter.dim(3);
    rows.push_back(std::move(c));
  }
}

}  // namespace

std::vector<OpCase> NnCases() {
  std::vector<OpCase> rows;
  const std::vector<DType> kF = FloatTypes();

  // ---- dot_general ----
  {
    struct DotCase {
      std::string name;
      Shape lhs, rhs;
      ir::DotDims dims;
      int64_t k;
    };
    const DotCase cases[] = {
        {"matmul_3x5_5x7", Shape{3, 5}, Shape{5, 7}, {{}, {}, {1}, {0}}, 5},
        {"matmul_1x1_1x1", Shape{1, 1}, Shape{1, 1}, {{}, {}, {1}, {0}}, 1},
        {"matmul_7x33_33x17", Shape{7, 33}, Shape{33, 17}, {{}, {}, {1}, {0}}, 33},
        {"matmul_17x65_65x33", Shape{17, 65}, Shape{65, 33}, {{}, {}, {1}, {0}}, 65},
        {"vector_17", Shape{17}, Shape{17}, {{}, {}, {0}, {0}}, 17},
        {"outer_3_4", Shape{3}, Shape{4}, {{}, {}, {}, {}}, 1},
        // Contracting dims not last: lhs^T x rhs^T.
        {"contract_first_5x3_7x5", Shape{5, 3}, Shape{7, 5}, {{}, {}, {0}, {1}}, 5},
        {"batch_2x3x5_2x5x4", Shape{2, 3, 5}, Shape{2, 5, 4}, {{0}, {0}, {2}, {1}}, 5},
        // q k^T style: both contract their last dim.
        {"batch_2x3x5_2x4x5", Shape{2, 3, 5}, Shape{2, 4, 5}, {{0}, {0}, {2}, {2}}, 5},
        // Batch dims in the middle and contracting dim first on the rhs.
        {"batch_mid_3x2x5_5x2x4", Shape{3, 2, 5}, Shape{5, 2, 4}, {{1}, {1}, {2}, {0}}, 5},
        {"two_contracting_3x4x5_4x5x6",
         Shape{3, 4, 5},
         Shape{4, 5, 6},
         {{}, {}, {1, 2}, {0, 1}},
         20},
        {"two_batch_2x3x4x5_2x3x5x6",
         Shape{2, 3, 4, 5},
         Shape{2, 3, 5, 6},
         {{0, 1}, {0, 1}, {3}, {2}},
         5},
    };
    for (const DotCase& d : cases) {
      ir::DotDims dims = d.dims;
      OpCase c = MakeCase(
          "dot_general_" + d.name, Opcode::kDotGeneral,
          {{"lhs", d.lhs, Uniform(-1, 1)}, {"rhs", d.rhs, Uniform(-1, 1)}},
          [dims](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::DotGeneral(in[0], in[1], dims);
          },
          kF, true);
      c.reduction = d.k;
      rows.push_back(std::move(c));
    }
    // MatMul with a rank-2 rhs broadcast over the lhs batch ([B,S,D] x [D,F]).
    OpCase mm = MakeCase(
        "dot_general_matmul_bcast_2x3x5_5x4", Opcode::kDotGeneral,
        {{"lhs", Shape{2, 3, 5}, Uniform(-1, 1)}, {"rhs", Shape{5, 4}, Uniform(-1, 1)}},
        [](ir::Builder&, const std::vector<Value>& in, DType) { return ir::MatMul(in[0], in[1]); },
        kF, true);
    mm.reduction = 5;
    rows.push_back(std::move(mm));
  }

  // ---- conv2d ----
  // ---- conv2d_backward_input ----
  // ---- conv2d_backward_filter ----
  for (const ConvCase& cc : ConvCases()) {
    const ir::Conv2dOptions opts = cc.opts;
    const Shape out = ConvOutShape(cc);
    const Shape in_shape = cc.input, f_shape = cc.filter;
    const int64_t taps = cc.filter.dim(1) * cc.filter.dim(2) * cc.filter.dim(3);
    OpCase fwd = MakeCase(
        "conv2d_" + cc.name, Opcode::kConv2d,
        {{"input", cc.input, Uniform(-1, 1)}, {"filter", cc.filter, Uniform(-1, 1)}},
        [opts](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::Conv2d(in[0], in[1], opts);
        },
        kF, true);
    fwd.reduction = taps;
    rows.push_back(std::move(fwd));

    OpCase bwd_in = MakeCase(
        "conv2d_backward_input_" + cc.name, Opcode::kConv2dBackwardInput,
        {{"grad_out", out, Uniform(-1, 1)}, {"filter", cc.filter, Uniform(-1, 1)}},
        [opts, in_shape](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::Conv2dBackwardInput(in[0], in[1], in_shape, opts);
        },
        kF, true);
    bwd_in.reduction = (cc.filter.dim(0) / opts.groups) * cc.filter.dim(2) * cc.filter.dim(3);
    rows.push_back(std::move(bwd_in));

    OpCase bwd_f = MakeCase(
        "conv2d_backward_filter_" + cc.name, Opcode::kConv2dBackwardFilter,
        {{"input", cc.input, Uniform(-1, 1)}, {"grad_out", out, Uniform(-1, 1)}},
        [opts, f_shape](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::Conv2dBackwardFilter(in[0], in[1], f_shape, opts);
        },
        kF, true);
    bwd_f.reduction = out.dim(0) * out.dim(2) * out.dim(3);
    rows.push_back(std::move(bwd_f));
  }

  // ---- avg_pool2d ----
  // ---- avg_pool2d_grad ----
  // ---- max_pool2d ----
  // ---- max_pool2d_grad ----
  for (const PoolCase& pc : PoolCases()) {
    const Shape out = PoolOutShape(pc);
    const Shape in_shape = pc.input;
    const int64_t window = pc.opts.window[0] * pc.opts.window[1];
    for (bool include_pad : {false, true}) {
      bool padded = std::any_of(pc.opts.padding.begin(), pc.opts.padding.end(),
                                [](int64_t p) { return p > 0; });
      if (include_pad && !padded) continue;
      ir::Pool2dOptions opts = pc.opts;
      opts.count_include_pad = include_pad;
      std::string suffix = pc.name + (include_pad ? "_count_pad" : "");
      OpCase avg = MakeCase(
          "avg_pool2d_" + suffix, Opcode::kAvgPool2d, {{"x", pc.input, Uniform(-2, 2)}},
          [opts](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::AvgPool2d(in[0], opts);
          },
          kF, true);
      avg.reduction = window;
      rows.push_back(std::move(avg));
      OpCase avg_grad = MakeCase(
          "avg_pool2d_grad_" + suffix, Opcode::kAvgPool2dGrad, {{"grad_out", out, Uniform(-2, 2)}},
          [opts, in_shape](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::AvgPool2dGrad(in[0], in_shape, opts);
          },
          kF, true);
      avg_grad.reduction = window;
      rows.push_back(std::move(avg_grad));
    }
    const ir::Pool2dOptions opts = pc.opts;
    // Distinct values: one maximum per window, and FD steps never change which.
    OpCase mx = MakeCase(
        "max_pool2d_" + pc.name, Opcode::kMaxPool2d, {{"x", pc.input, Distinct()}},
        [opts](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::MaxPool2d(in[0], opts);
        },
        kF, true);
    mx.exact = true;
    rows.push_back(std::move(mx));
    OpCase mx_grad = MakeCase(
        "max_pool2d_grad_" + pc.name, Opcode::kMaxPool2dGrad,
        {{"x", pc.input, Distinct()}, {"grad_out", out, Uniform(-2, 2)}},
        [opts](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::MaxPool2dGrad(in[0], in[1], opts);
        },
        // Linear in grad_out, so differentiable in principle, but autodiff has no VJP for it yet
        // (Grad returns Unimplemented: "double-backward through max_pool2d"). Flip to true when
        // it lands.
        kF, false);
    mx_grad.reduction = window;
    rows.push_back(std::move(mx_grad));
  }

  // ---- softmax ----
  // ---- log_softmax ----
  {
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, int64_t>>{{Shape{3, 17}, -1},
                                                                            {Shape{4, 5}, 0},
                                                                            {Shape{2, 3, 7}, 1},
                                                                            {Shape{1, 1}, -1},
                                                                            {Shape{2, 33}, -1}}) {
      int64_t a = axis;
      int64_t len = shape.dim(static_cast<int>(a < 0 ? a + shape.rank() : a));
      std::string suffix = ShapeName(shape) + "_a" + std::to_string(a < 0 ? a + shape.rank() : a);
      OpCase sm = MakeCase(
          "softmax_" + suffix, Opcode::kSoftmax, {{"x", shape, Uniform(-3, 3)}},
          [a](ir::Builder&, const std::vector<Value>& in, DType) { return ir::Softmax(in[0], a); },
          kF, true);
      sm.reduction = len;
      rows.push_back(std::move(sm));
      OpCase lsm = MakeCase(
          "log_softmax_" + suffix, Opcode::kLogSoftmax, {{"x", shape, Uniform(-3, 3)}},
          [a](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::LogSoftmax(in[0], a);
          },
          kF, true);
      lsm.reduction = len;
      rows.push_back(std::move(lsm));
    }
    // Large logits: exp overflows f32 unless the maximum is subtracted first.
    for (Opcode op : {Opcode::kSoftmax, Opcode::kLogSoftmax}) {
      bool log = op == Opcode::kLogSoftmax;
      OpCase big = MakeCase(
          std::string(log ? "log_softmax" : "softmax") + "_large_logits_3x17", op,
          {{"x", Shape{3, 17}, Uniform(85, 95)}},
          [log](ir::Builder&, const std::vector<Value>& in, DType) {
            return log ? ir::LogSoftmax(in[0], -1) : ir::Softmax(in[0], -1);
          },
          {DType::kF32}, true);
      big.reduction = 17;
      rows.push_back(std::move(big));
    }
  }

  // ---- layer_norm ----
  // ---- rms_norm ----
  {
    for (const auto& [shape, eps] : std::vector<std::pair<Shape, double>>{{Shape{3, 17}, 1e-5},
                                                                          {Shape{2, 3, 8}, 1e-5},
                                                                          {Shape{1, 33}, 1e-5},
                                                                          {Shape{4, 7}, 0.1}}) {
      const Shape vec{shape.dim(shape.rank() - 1)};
      const double e = eps;
      std::string suffix = ShapeName(shape) + (eps > 1e-3 ? "_eps0p1" : "");
      OpCase ln = MakeCase(
          "layer_norm_" + suffix, Opcode::kLayerNorm,
          {{"x", shape, Uniform(-2, 2)},
           {"gamma", vec, Uniform(0.5, 1.5)},
           {"beta", vec, Uniform(-0.5, 0.5)}},
          [e](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::LayerNorm(in[0], in[1], in[2], e);
          },
          kF, true);
      ln.reduction = vec.dim(0);
      rows.push_back(std::move(ln));
      OpCase rms = MakeCase(
          "rms_norm_" + suffix, Opcode::kRmsNorm,
          {{"x", shape, Uniform(-2, 2)}, {"gamma", vec, Uniform(0.5, 1.5)}},
          [e](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::RmsNorm(in[0], in[1], e);
          },
          kF, true);
      rms.reduction = vec.dim(0);
      rows.push_back(std::move(rms));
    }
  }

  // ---- cross_entropy ----
  {
    struct CeCase {
      Shape logits, labels;
      DType label_type;
    };
    for (const CeCase& ce :
         {CeCase{Shape{7, 5}, Shape{7}, DType::kS32},
          CeCase{Shape{2, 3, 17}, Shape{2, 3}, DType::kS32},
          CeCase{Shape{4, 10}, Shape{4}, DType::kS64}, CeCase{Shape{1, 1}, Shape{1}, DType::kS32},
          CeCase{Shape{33}, Shape{}, DType::kS32}}) {
      int64_t classes = ce.logits.dim(ce.logits.rank() - 1);
      OpCase c = MakeCase(
          "cross_entropy_" + ShapeName(ce.logits) + (ce.label_type == DType::kS64 ? "_s64" : ""),
          Opcode::kCrossEntropy,
          {{"logits", ce.logits, Uniform(-3, 3)},
           {"labels", ce.labels, IntRange(0, classes - 1), ce.label_type}},
          [](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::SparseCrossEntropy(in[0], in[1]);
          },
          kF, true);
      c.reduction = classes;
      rows.push_back(std::move(c));
    }
  }

  // ---- attention ----
  {
    struct AttnCase {
      std::string name;
      Shape q, k, v;
      bool causal;
      std::optional<double> scale;
    };
    const AttnCase cases[] = {
        {"sq3_sk5", Shape{2, 3, 8}, Shape{2, 5, 8}, Shape{2, 5, 4}, false, std::nullopt},
        // Sq != Sk: the mask is aligned at the end (query i sees keys j <= i + Sk - Sq).
        {"causal_sq3_sk5", Shape{2, 3, 8}, Shape{2, 5, 8}, Shape{2, 5, 4}, true, std::nullopt},
        {"causal_sq4_sk4", Shape{1, 4, 8}, Shape{1, 4, 8}, Shape{1, 4, 8}, true, std::nullopt},
        {"heads_causal_2x2x3x8", Shape{2, 2, 3, 8}, Shape{2, 2, 3, 8}, Shape{2, 2, 3, 8}, true,
         std::nullopt},
        {"sq1_sk7_scale0p5", Shape{1, 1, 3}, Shape{1, 7, 3}, Shape{1, 7, 5}, false, 0.5},
        {"nobatch_causal_sq2_sk7", Shape{2, 4}, Shape{7, 4}, Shape{7, 3}, true, std::nullopt},
    };
    for (const AttnCase& at : cases) {
      bool causal = at.causal;
      std::optional<double> scale = at.scale;
      OpCase c = MakeCase(
          "attention_" + at.name, Opcode::kAttention,
          {{"q", at.q, Uniform(-1, 1)}, {"k", at.k, Uniform(-1, 1)}, {"v", at.v, Uniform(-1, 1)}},
          [causal, scale](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::Attention(in[0], in[1], in[2], causal, scale);
          },
          kF, true);
      c.reduction = std::max(at.q.dim(at.q.rank() - 1), at.k.dim(at.k.rank() - 2));
      rows.push_back(std::move(c));
    }
  }
  AppendQuantizedCases(rows);
  return rows;
}

}  // namespace kiln::optable
