// What `kiln quantize` measures (docs/quantize.md), as library code of kiln::predict (the layer
// beside kiln::serve that runs exported programs on examples offline: it uses serve, train, data,
// runtime and compiler; the cli uses it): the activation calibration of the int8 sites, the
// held-out metric of the f32 and int8 programs (accuracy, or the relative MSE without labels),
// and their latency at the artifact's batch. Programs run through serve::FixedBatchRunner (the
// last batch zero-padded, outputs trimmed).
//
//   KILN_ASSIGN_OR_RETURN(std::vector<float> scales,
//                         Calibrate(*backend, a.program, a.weights, sites, calib, {}, &absmax));
//   ... compiler::QuantizeInt8Pass(a.weights, scales) on a copy of a.program ...
//   KILN_ASSIGN_OR_RETURN(auto f32, CompileProgram(*backend, a.program, a.weights));
//   KILN_ASSIGN_OR_RETURN(auto int8, CompileProgram(*backend, q.program, q.weights));
//   KILN_ASSIGN_OR_RETURN(Metric m, CompareMetric(*f32, *int8, eval));
//   KILN_ASSIGN_OR_RETURN(Latency l, MeasureLatency(*f32, *int8, eval, 30));
#ifndef KILN_PREDICT_QUANTIZE_EVAL_H_
#define KILN_PREDICT_QUANTIZE_EVAL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/compiler/passes/quantize_int8.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/executable.h"
#include "kiln/serve/fixed_batch_runner.h"
#include "kiln/tensor/tensor.h"

namespace kiln::predict {

// Examples: one [N, ...] tensor per runtime input (by name), plus labels when the data has them.
struct Examples {
  std::map<std::string, Tensor> inputs;
  std::vector<int64_t> labels;
  int64_t n = 0;
};

// Rows [begin, end) of `ex` (copied).
Examples SliceExamples(const Examples& ex, int64_t begin, int64_t end);

// A program compiled with its weights bound, run on examples in fixed batches of its parameters'
// leading dimension.
struct CompiledProgram {
  ir::Graph program;
  std::unique_ptr<runtime::Executable> exe;
  std::optional<serve::FixedBatchRunner> runner;  // over exe
  int64_t batch() const { return runner->batch(); }
};
absl::StatusOr<std::unique_ptr<CompiledProgram>> CompileProgram(
    runtime::Backend& backend, ir::Graph program, const std::map<std::string, Tensor>& weights);

// Runs every example, a batch at a time (the last one zero-padded); fn(outputs, real rows).
absl::Status RunExamples(
    CompiledProgram& p, const Examples& ex,
    const std::function<absl::Status(const std::vector<Tensor>&, int64_t)>& fn);

struct CalibrationOptions {
  std::string method = "minmax";  // minmax | percentile
  double percentile = 99.99;      // of |x|, for percentile
};

// Runs compiler::CalibrationProgram(program, sites) on `calib` and returns one activation scale
// per site: SymmetricScale of max |x| (minmax) or of the percentile of |x| (every value up to 2^22
// per site, then a deterministic stride). *absmax gets each site's max |x|.
absl::StatusOr<std::vector<float>> Calibrate(runtime::Backend& backend, const ir::Graph& program,
                                             const std::map<std::string, Tensor>& weights,
                                             const std::vector<compiler::Int8Site>& sites,
                                             const Examples& calib,
                                             const CalibrationOptions& options,
                                             std::vector<double>* absmax);

struct Metric {
  std::string name;  // accuracy | relative_mse
  double f32 = 0, int8 = 0, drop = 0;
};

// Accuracy (percent) of both programs when the examples have labels and the program logits
// ("logits", else the first f32 [B, C > 1] output), else the relative MSE of the int8 outputs
// against the f32 ones (percent of the f32 outputs' mean square). drop: f32 - int8 accuracy
// points, or the relative MSE.
absl::StatusOr<Metric> CompareMetric(CompiledProgram& f32, CompiledProgram& int8,
                                     const Examples& ev);

struct Latency {
  std::vector<double> f32_ms, int8_ms;  // one per timed run
};

// One batch of the eval examples through each program, alternating, after 3 warm-up runs each.
absl::StatusOr<Latency> MeasureLatency(CompiledProgram& f32, CompiledProgram& int8,
                                       const Examples& ev, int runs);

double Median(std::vector<double> v);

}  // namespace kiln::predict

#endif  // KILN_PREDICT_QUANTIZE_EVAL_H_
