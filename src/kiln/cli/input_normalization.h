// The input normalization of a model trained with `data.augment.normalize`, from its config: what
// `kiln export` records in the artifact's manifest (metadata key "input_normalization",
// docs/formats.md "Exported artifact"). The artifact side, which `kiln predict` and `kiln serve`
// both apply to raw inputs (the struct, Apply, reading it back from an artifact), is
// kiln/serve/input_normalization.h; its names are used here as kiln::cli's.
//
//   std::optional<InputNormalization> n = InputNormalizationOf(config, "x");   // at export
//   if (n) metadata[kInputNormalizationKey] = n->ToJson();
//   ...
//   KILN_ASSIGN_OR_RETURN(std::optional<InputNormalization> m, InputNormalizationOf(artifact));
//   if (m) KILN_RETURN_IF_ERROR(m->Apply(inputs.at(m->input)));                // at predict
#ifndef KILN_CLI_INPUT_NORMALIZATION_H_
#define KILN_CLI_INPUT_NORMALIZATION_H_

#include <optional>
#include <string>

#include "kiln/serve/input_normalization.h"
#include "kiln/train/config.h"

namespace kiln::cli {

using serve::InputNormalization;
using serve::InputNormalizationOf;
using serve::kInputNormalizationKey;

// The config's normalization (nullopt when data.augment.normalize is not set), for `input`.
std::optional<InputNormalization> InputNormalizationOf(const train::TrainConfig& config,
                                                       const std::string& input);

}  // namespace kiln::cli

#endif  // KILN_CLI_INPUT_NORMALIZATION_H_
