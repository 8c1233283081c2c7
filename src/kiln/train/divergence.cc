#include "kiln/train/divergence.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln::train {

bool AllFinite(const nn::ParamStore& store) {
  for (int i = 0; i < store.size(); ++i) {
    const Tensor& t = store.value(i);
    if (t.dtype() != DType::kF32) continue;
    const float* p = t.data<float>();
    const int64_t n = t.num_elements();
    // Branch-free accumulation vectorizes; x - x is 0 for finite x and NaN for NaN and +-inf.
    float acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += p[j] - p[j];
    if (!(acc == 0)) return false;
  }
  return true;
}

absl::Status DivergenceError(const TrainConfig& c, int64_t step, float loss, float grad_norm,
                             int64_t nonfinite_steps, bool params_nonfinite,
                             const std::string& last_checkpoint) {
  std::string what;
  if (params_nonfinite) {
    what = absl::StrFormat(
        "the parameters are no longer finite (loss %g, grad_norm %g), so no later step can "
        "recover",
        loss, grad_norm);
  } else {
    what = absl::StrFormat(
        "the loss or the gradient norm was non-finite %d steps in a row (loss %g, grad_norm %g; "
        "nonfinite_patience: %d)",
        nonfinite_steps, loss, grad_norm, c.nonfinite_patience);
  }
  std::string saved =
      last_checkpoint.empty()
          ? "no checkpoint was committed by this run"
          : absl::StrCat("no non-finite checkpoint was written; the last good one is ",
                         last_checkpoint);
  std::string advice =
      absl::StrFormat("try a smaller optimizer.lr (now %g; e.g. --set optimizer.lr=%g)",
                      c.optimizer.lr, c.optimizer.lr / 10);
  if (c.optimizer.clip_norm == 0) advice += ", gradient clipping (--set optimizer.clip_norm=1)";
  if (c.schedule.warmup_steps == 0) {
    advice += ", or a warmup (schedule.kind linear_warmup or cosine with schedule.warmup_steps)";
  }
  return absl::AbortedError(absl::StrCat("training diverged at step ", step, ": ", what, "; ",
                                         saved, ". To fix it, ", advice,
                                         "; then rerun (it resumes from the last good checkpoint, "
                                         "if any; --no-resume --replace starts over)"));
}

}  // namespace kiln::train
