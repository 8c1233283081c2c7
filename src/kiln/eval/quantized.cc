// Reference kernels for the int8 ops (quantize, quantized_dot, quantized_conv2d): the oracle the
// cpu backend's oneDNN int8 primitives are checked against, bit for bit. Sums of s8 products are
// exact integers (int64 here; shape inference bounds them to int32), converted to f32 once (round
// to nearest even) and multiplied by the channel's f32 scale once.
#include <cmath>
#include <cstdint>

#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"

namespace kiln::eval {
namespace {

using ir::Opcode;

// clamp(rint(x / scale), -127, 127) with one f32 division, half to even; NaN -> 0.
int8_t QuantizeOne(float x, float scale) {
  float q = x / scale;
  if (std::isnan(q)) return 0;
  q = std::fmin(std::fmax(q, -127.f), 127.f);
  return static_cast<int8_t>(std::nearbyint(q));
}

float Dequantize(int64_t acc, float scale) {
  return static_cast<float>(static_cast<int32_t>(acc)) * scale;
}

absl::StatusOr<Kernel> Quantize(const ir::Node& n, OperandTypes types) {
  if (types[0].dtype != DType::kF32) return Unsupported(n, "quantize takes f32");
  const float scale = static_cast<float>(n.attr_float("scale"));
  const int64_t count = n.type().shape.num_elements();
  return Kernel([=](Buffers b) {
    const float* x = static_cast<const float*>(In(b, 0));
    int8_t* y = static_cast<int8_t*>(Out(b, 1));
    for (int64_t i = 0; i < count; ++i) y[i] = QuantizeOne(x[i], scale);
  });
}

absl::StatusOr<Kernel> QuantizedDot(const ir::Node& n, OperandTypes types) {
  if (types[0].dtype != DType::kS8 || types[1].dtype != DType::kS8 || types[2].dtype != DType::kF32)
    return Unsupported(n, "quantized_dot takes s8, s8, f32");
  const int64_t k = types[1].shape.dim(0), cols = types[1].shape.dim(1);
  const int64_t rows = k == 0 ? 0 : types[0].shape.num_elements() / k;
  return Kernel([=](Buffers b) {
    const int8_t* x = static_cast<const int8_t*>(In(b, 0));
    const int8_t* w = static_cast<const int8_t*>(In(b, 1));
    const float* s = static_cast<const float*>(In(b, 2));
    float* y = static_cast<float*>(Out(b, 3));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        int64_t acc = 0;
        for (int64_t i = 0; i < k; ++i) acc += int64_t{x[r * k + i]} * int64_t{w[i * cols + c]};
        y[r * cols + c] = Dequantize(acc, s[c]);
      }
  });
}

absl::StatusOr<Kernel> QuantizedConv2d(const ir::Node& n, OperandTypes types) {
  if (types[0].dtype != DType::kS8 || types[1].dtype != DType::kS8 || types[2].dtype != DType::kF32)
    return Unsupported(n, "quantized_conv2d takes s8, s8, f32");
  const Shape& in = types[0].shape;
  const Shape& f = types[1].shape;
  const Shape& out = n.type().shape;
  const std::vector<int64_t> st = n.attr_ints("strides"), pad = n.attr_ints("padding"),
                             dil = n.attr_ints("dilation");
  const int64_t groups = n.attr_int("groups");
  const int64_t N = in.dim(0), C = in.dim(1), H = in.dim(2), W = in.dim(3);
  const int64_t O = f.dim(0), CG = f.dim(1), KH = f.dim(2), KW = f.dim(3);
  const int64_t OH = out.dim(2), OW = out.dim(3), per_group = O / groups;
  return Kernel([=](Buffers b) {
    const int8_t* x = static_cast<const int8_t*>(In(b, 0));
    const int8_t* w = static_cast<const int8_t*>(In(b, 1));
    const float* s = static_cast<const float*>(In(b, 2));
    float* y = static_cast<float*>(Out(b, 3));
    for (int64_t bn = 0; bn < N; ++bn)
      for (int64_t o = 0; o < O; ++o) {
        const int64_t c0 = (o / per_group) * CG;
        for (int64_t oy = 0; oy < OH; ++oy)
          for (int64_t ox = 0; ox < OW; ++ox) {
            int64_t acc = 0;
            for (int64_t ci = 0; ci < CG; ++ci)
              for (int64_t ky = 0; ky < KH; ++ky) {
                const int64_t iy = oy * st[0] - pad[0] + ky * dil[0];
                if (iy < 0 || iy >= H) continue;
                for (int64_t kx = 0; kx < KW; ++kx) {
                  const int64_t ix = ox * st[1] - pad[2] + kx * dil[1];
                  if (ix < 0 || ix >= W) continue;
                  acc += int64_t{x[((bn * C + c0 + ci) * H + iy) * W + ix]} *
                         int64_t{w[((o * CG + ci) * KH + ky) * KW + kx]};
                }
              }
            y[((bn * O + o) * OH + oy) * OW + ox] = Dequantize(acc, s[o]);
          }
      }
  });
}

}  // namespace

absl::StatusOr<Kernel> MakeQuantizedKernel(const ir::Node& n, OperandTypes types) {
  switch (n.opcode()) {
    case Opcode::kQuantize:
      return Quantize(n, types);
    case Opcode::kQuantizedDot:
      return QuantizedDot(n, types);
    case Opcode::kQuantizedConv2d:
      return QuantizedConv2d(n, types);
    default:
      return Unsupported(n, "not an int8 op");
  }
}

}  // namespace kiln::eval
