#include "kiln/cli/input_normalization.h"

namespace kiln::cli {

std::optional<InputNormalization> InputNormalizationOf(const train::TrainConfig& config,
                                                       const std::string& input) {
  const train::AugmentSection& a = config.data.augment;
  if (a.mean.empty()) return std::nullopt;
  InputNormalization n;
  n.input = input;
  n.channels = config.model.channels;
  n.height = config.model.height;
  n.width = config.model.width;
  n.mean = a.mean;
  n.std = a.std;
  return n;
}

}  // namespace kiln::cli
