// The input normalization of a model trained with `data.augment.normalize` (data/augment.h): the
// input pipeline fed the model (x - mean[c]) / std[c] per channel of its C x H x W features, and
// the program does not contain it, so `kiln export` records the transform in the artifact's
// manifest (metadata key "input_normalization", docs/formats.md "Exported artifact"), and both
// `kiln predict` (docs/cli.md) and `kiln serve` (ServedModel, docs/serving.md) apply it to the
// raw inputs they are given, as the pipeline did in training. The config side (what `kiln
// export` records) is kiln/cli/input_normalization.h.
//
//   KILN_ASSIGN_OR_RETURN(std::optional<InputNormalization> m, InputNormalizationOf(artifact));
//   if (m) KILN_RETURN_IF_ERROR(m->Apply(inputs.at(m->input)));
#ifndef KILN_SERVE_INPUT_NORMALIZATION_H_
#define KILN_SERVE_INPUT_NORMALIZATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/compiler/artifact.h"
#include "kiln/tensor/tensor.h"

namespace kiln::serve {

inline constexpr char kInputNormalizationKey[] = "input_normalization";

struct InputNormalization {
  std::string input;  // the runtime input it applies to
  int64_t channels = 0, height = 0, width = 0;
  std::vector<double> mean, std;  // one per channel, std > 0

  // {"input": "x", "layout": "chw", "shape": [C, H, W], "mean": [...], "std": [...],
  //  "from": "data.augment.normalize"}
  std::string ToJson() const;
  // In place on every example of `x` (f32, [N, ...] with C*H*W values per example, CHW), in f32
  // exactly as the pipeline computes it: (v - float(mean[c])) / float(std[c]). InvalidArgument
  // naming the input when x is not f32 or its examples do not hold C*H*W values.
  absl::Status Apply(Tensor& x) const;
  void ApplyToExample(float* x) const;  // one example's C*H*W floats
};

// The artifact's recorded normalization: nullopt when it has none (exported without it, or by a
// Kiln that did not record it); InvalidArgument naming the manifest key when it is malformed or
// names no f32 runtime input of C*H*W values per example.
absl::StatusOr<std::optional<InputNormalization>> InputNormalizationOf(
    const compiler::Artifact& artifact);

}  // namespace kiln::serve

#endif  // KILN_SERVE_INPUT_NORMALIZATION_H_
