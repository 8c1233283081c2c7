#include "kiln/nn/model.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::nn {
namespace {

absl::Status CheckSizes(int64_t batch, int64_t features) {
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  if (features < 1) {
    return absl::InvalidArgumentError(absl::StrCat("features must be >= 1, got ", features));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ir::Graph> BuildClassifierLossGraph(const std::string& name,
                                                   const std::vector<ParamSpec>& specs, DType dtype,
                                                   int64_t batch, int64_t features, bool with_rng,
                                                   const LogitsFn& logits) {
  absl::Status sizes = CheckSizes(batch, features);
  if (!sizes.ok()) return sizes;
  ir::Builder b(name);
  ParamValues p = AddParameters(b, specs);
  ir::Value x = b.Parameter("x", dtype, Shape{batch, features});
  ir::Value labels = b.Parameter("labels", DType::kS32, Shape{batch});
  RngInputs rng;
  if (with_rng) rng = RngInputs::AddParameters(b);
  ir::Value per_example = ir::SparseCrossEntropy(logits(p, x, rng), labels);
  ir::Value loss = ir::Mean(per_example, {0});
  // The trainer's loss is f32 whatever the compute dtype.
  b.Output("loss",
           loss.valid() && loss.dtype() != DType::kF32 ? ir::Convert(loss, DType::kF32) : loss);
  return b.Build();
}

absl::StatusOr<ir::Graph> BuildClassifierPredictGraph(const std::string& name,
                                                      const std::vector<ParamSpec>& specs,
                                                      DType dtype, int64_t batch, int64_t features,
                                                      const LogitsFn& logits) {
  absl::Status sizes = CheckSizes(batch, features);
  if (!sizes.ok()) return sizes;
  ir::Builder b(name);
  ParamValues p = AddParameters(b, specs);
  ir::Value x = b.Parameter("x", dtype, Shape{batch, features});
  ir::Value out = logits(p, x, RngInputs{});
  b.Output("logits", out);
  b.Output("prediction", ir::ArgMax(out, -1));
  return b.Build();
}

}  // namespace kiln::nn
