#include "kiln/serve/input_normalization.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kiln::serve {

std::string InputNormalization::ToJson() const {
  return nlohmann::json{{"input", input}, {"layout", "chw"}, {"shape", {channels, height, width}},
                        {"mean", mean},   {"std", std},      {"from", "data.augment.normalize"}}
      .dump();
}

void InputNormalization::ApplyToExample(float* x) const {
  const int64_t hw = height * width;
  for (int64_t c = 0; c < channels; ++c) {
    const float m = static_cast<float>(mean[c]), s = static_cast<float>(std[c]);
    float* p = x + c * hw;
    for (int64_t k = 0; k < hw; ++k) p[k] = (p[k] - m) / s;
  }
}

absl::Status InputNormalization::Apply(Tensor& x) const {
  const int64_t per = channels * height * width;
  if (x.dtype() != DType::kF32 || x.shape().rank() < 1 || per <= 0 ||
      x.num_elements() != x.shape().dim(0) * per) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input '", input, "' is ", x.TypeString(), ", but the artifact's ", kInputNormalizationKey,
        " needs f32 examples of ", channels, "x", height, "x", width, " = ", per, " values"));
  }
  float* d = x.data<float>();
  for (int64_t n = 0; n < x.shape().dim(0); ++n) ApplyToExample(d + n * per);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<InputNormalization>> InputNormalizationOf(
    const compiler::Artifact& artifact) {
  auto it = artifact.metadata.find(kInputNormalizationKey);
  if (it == artifact.metadata.end()) return std::optional<InputNormalization>();
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("the artifact's manifest metadata \"", kInputNormalizationKey, "\" ", why));
  };
  const nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  InputNormalization n;
  try {
    if (j.is_discarded() || !j.is_object()) return bad("is not a JSON object");
    if (j.value("layout", std::string()) != "chw") return bad("has no \"layout\": \"chw\"");
    n.input = j.at("input").get<std::string>();
    const std::vector<int64_t> shape = j.at("shape").get<std::vector<int64_t>>();
    if (shape.size() != 3 || shape[0] < 1 || shape[1] < 1 || shape[2] < 1)
      return bad("\"shape\" must be [C, H, W] of positive sizes");
    n.channels = shape[0];
    n.height = shape[1];
    n.width = shape[2];
    n.mean = j.at("mean").get<std::vector<double>>();
    n.std = j.at("std").get<std::vector<double>>();
  } catch (const std::exception& e) {
    return bad(absl::StrCat("is malformed: ", e.what()));
  }
  if (n.mean.size() != static_cast<size_t>(n.channels) || n.std.size() != n.mean.size())
    return bad(absl::StrCat("needs one mean and std per channel (", n.channels, "), has ",
                            n.mean.size(), " and ", n.std.size()));
  for (size_t c = 0; c < n.std.size(); ++c) {
    if (!(n.std[c] > 0) || !std::isfinite(n.std[c]) || !std::isfinite(n.mean[c]))
      return bad(absl::StrCat("channel ", c, ": std must be finite and > 0, mean finite"));
  }
  for (const compiler::TensorSpec& s : artifact.signature.RuntimeInputs()) {
    if (s.name != n.input) continue;
    if (s.dtype != DType::kF32 || s.shape.rank() < 1 || s.shape.dim(0) < 1 ||
        s.shape.num_elements() / s.shape.dim(0) != n.channels * n.height * n.width) {
      return bad(absl::StrCat("is for ", n.channels, "x", n.height, "x", n.width,
                              " f32 examples, but input '", n.input, "' is ",
                              std::string(DTypeName(s.dtype)), s.shape.ToString()));
    }
    return std::optional<InputNormalization>(std::move(n));
  }
  return bad(absl::StrCat("names input '", n.input, "', which is not a runtime input"));
}

}  // namespace kiln::serve
