// The graph half of `kiln quantize` (docs/quantize.md): which matmuls and convolutions of an
// exported program can run in int8, the calibration program that exposes their inputs, per-channel
// symmetric weight quantization, and the rewrite
//
//   dot_general(x, W) -> quantized_dot(quantize(x, a), W_q, a * s)      (W_q s8 [K, N], s f32 [N])
//   conv2d(x, F)      -> quantized_conv2d(quantize(x, a), F_q, a * s)   (F_q s8 OIHW, s f32 [O])
//
// with everything after them (bias add, activation, the rest) unchanged. The program stays an
// ordinary exported program: the int8 weights and the scales are new weight parameters.
//
//   std::vector<Int8Site> sites = FindInt8Sites(a.program, WeightNames(a));
//   KILN_ASSIGN_OR_RETURN(ir::Graph calib, CalibrationProgram(a.program, sites));
//   ... run calib, ActivationScale(absmax) per site ...
//   KILN_ASSIGN_OR_RETURN(Int8Program q, RewriteInt8(a.program, a.weights, sites, scales));
#ifndef KILN_CLI_QUANTIZE_REWRITE_H_
#define KILN_CLI_QUANTIZE_REWRITE_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"
#include "kiln/tensor/tensor.h"

namespace kiln::cli {

// A dot_general or conv2d whose weights are one of the artifact's weight parameters (f32) and
// whose other operand is an f32 activation: x[..., K] . W[K, N] (or W[N, K], contracted on its
// dim 1: transposed when quantized) with no batch dims, or conv2d(x NCHW, W OIHW).
struct Int8Site {
  int node = -1;  // the dot_general / conv2d in the source program
  ir::Opcode op = ir::Opcode::kDotGeneral;
  int activation = -1;  // its activation operand
  std::string weight;   // the weight parameter's name
  bool transposed = false;
};

// In program order. `weights`: the names of the parameters bound from the artifact's weights.
std::vector<Int8Site> FindInt8Sites(const ir::Graph& program, const std::set<std::string>& weights);

// Name of the calibration output holding site k's activation.
std::string CalibrationOutput(int k);

// `program` without its fusion annotations, plus one output per site (CalibrationOutput(k)) that
// returns the site's activation.
absl::StatusOr<ir::Graph> CalibrationProgram(const ir::Graph& program,
                                             const std::vector<Int8Site>& sites);

// Symmetric s8 with scale absmax / 127 (1 when absmax is 0): the value a quantize op divides by.
float SymmetricScale(double absmax);

// Per-output-channel symmetric quantization of an f32 weight: channel scales s[c] =
// SymmetricScale(max |w| over the channel) and q = clamp(rint(w / s[c]), -127, 127) laid out as
// the int8 op reads it ([K, N] for a dot, OIHW for a conv).
struct QuantizedWeight {
  Tensor q;                   // s8
  std::vector<float> scales;  // one per output channel
  double max_abs_error = 0;   // max |w - q * s| (at most s / 2 per channel)
};
absl::StatusOr<QuantizedWeight> QuantizeWeight(const Tensor& w, const Int8Site& site);

struct Int8Layer {
  Int8Site site;
  std::string int8_weight, scale_param;  // the new weight parameters' names
  float activation_scale = 0;
  std::vector<float> weight_scales;
  double weight_max_abs_error = 0;
};

struct Int8Program {
  ir::Graph program;                      // verified; no fusion annotations
  std::map<std::string, Tensor> weights;  // the f32 weights still used, plus the int8 ones
  std::vector<Int8Layer> layers;
};

// Rewrites every site (activation_scales[k] for site k): weights that only the sites read are
// dropped, parameters are renumbered (kept ones in order, then the new ones).
absl::StatusOr<Int8Program> RewriteInt8(const ir::Graph& program,
                                        const std::map<std::string, Tensor>& weights,
                                        const std::vector<Int8Site>& sites,
                                        const std::vector<float>& activation_scales);

}  // namespace kiln::cli

#endif  // KILN_CLI_QUANTIZE_REWRITE_H_
