// Int8 quantization ("quantize-int8"): post-training int8 for the matmuls and convolutions whose
// weights are weight parameters (docs/quantize.md; `kiln quantize` drives it).
//
//   dot_general(x, W) -> quantized_dot(quantize(x, a), W_q, a * s)      (W_q s8 [K, N], s f32 [N])
//   conv2d(x, F)      -> quantized_conv2d(quantize(x, a), F_q, a * s)   (F_q s8 OIHW, s f32 [O])
//
// What it rewrites: every Int8Site (FindInt8Sites: an f32 dot_general with no batch dims or an
// f32 conv2d whose weight operand is a named f32 weight and whose other operand is an f32
// activation); the weights are quantized per output channel (symmetric s8) and become new weight
// parameters with their scales. What it leaves alone: everything after the sites (bias add,
// activation, the rest), every other op, parameters that are not weights. Unlike most passes it
// renumbers parameters: weights that only the sites read are dropped, kept parameters keep their
// order, then come the int8 weights and scales; fusion annotations are dropped (the backend's
// pipeline fuses again). Idempotent: its output has no f32 site left. Cost: O(nodes + edges) plus
// one pass over each quantized weight.
//
// The calibration half lives here too: CalibrationProgram exposes each site's activation as an
// extra output, from whose |x| the caller picks the activation scales (SymmetricScale).
//
//   std::vector<Int8Site> sites = FindInt8Sites(a.program, WeightNames(a));
//   KILN_ASSIGN_OR_RETURN(ir::Graph calib, CalibrationProgram(a.program, sites));
//   ... run calib, SymmetricScale(absmax) per site ...
//   QuantizeInt8Pass pass(a.weights, scales);
//   ir::Graph g = a.program;
//   KILN_ASSIGN_OR_RETURN(bool changed, pass.Run(g));   // pass.result(): weights and layers
#ifndef KILN_COMPILER_PASSES_QUANTIZE_INT8_H_
#define KILN_COMPILER_PASSES_QUANTIZE_INT8_H_

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/compiler/pass.h"
#include "kiln/ir/graph.h"
#include "kiln/tensor/tensor.h"

namespace kiln::compiler {

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

// RewriteInt8 as a pass: the sites are FindInt8Sites(graph, the names of `weights`), site k
// quantized with activation_scales[k] (one per site, else InvalidArgument). `weights` must
// outlive the pass; after a changing Run, result() holds the rewritten program's weights and
// layers (result().program is what Run left in the graph).
class QuantizeInt8Pass : public Pass {
 public:
  QuantizeInt8Pass(const std::map<std::string, Tensor>& weights,
                   std::vector<float> activation_scales)
      : weights_(weights), activation_scales_(std::move(activation_scales)) {}
  std::string name() const override { return "quantize-int8"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;
  const Int8Program& result() const { return result_; }

 private:
  const std::map<std::string, Tensor>& weights_;
  std::vector<float> activation_scales_;
  Int8Program result_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_QUANTIZE_INT8_H_
