// Divergence checks of the training loop: a run whose loss, gradients or parameters stop being
// finite is stopped with advice instead of being "finished" and saved as a result
// (docs/train.md "Divergence").
//
//   if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) {
//     ++bad;
//     if (!AllFinite(params) || bad >= config.nonfinite_patience)
//       return DivergenceError(config, step, m.loss, m.grad_norm, bad, !AllFinite(params), last);
//   }
#ifndef KILN_TRAIN_DIVERGENCE_H_
#define KILN_TRAIN_DIVERGENCE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kiln/nn/params.h"
#include "kiln/train/config.h"

namespace kiln::train {

// True when every f32 element of every tensor of `store` is finite (other dtypes are not
// checked). One pass over the data: call it per checkpoint, not per step.
bool AllFinite(const nn::ParamStore& store);

// Aborted: "training diverged at step N: ...", what was non-finite, that no non-finite checkpoint
// was written and which one is the last good one (`last_checkpoint`, "" if none), and what to try
// (a smaller optimizer.lr, clipping, warmup), with the config's current values.
absl::Status DivergenceError(const TrainConfig& config, int64_t step, float loss, float grad_norm,
                             int64_t nonfinite_steps, bool params_nonfinite,
                             const std::string& last_checkpoint);

}  // namespace kiln::train

#endif  // KILN_TRAIN_DIVERGENCE_H_
