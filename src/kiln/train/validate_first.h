// `kiln train --validate-first N`: before a real run, train a fresh copy of the config for N steps
// in a scratch folder and refuse the run when it shows no sign of learning, so a broken config
// (a learning rate of 0, frozen everything that matters, labels that do not match the inputs)
// fails in seconds instead of after hours.
//
//   KILN_ASSIGN_OR_RETURN(ValidationReport v, ValidateFirst(config, 20, options));
//   if (!v.passed) { std::cerr << v.reason; return kExitValidationRefused; }   // 3
//
// What runs: the real run's config, schedule included (each step has the rate it will have in the
// run), stopped after N steps (the "slice": the first N batches of the run's data order), with no
// periodic checkpoints or evaluations, evaluating at most 8 held-out batches before the first
// step and after the last, in a temporary folder that is deleted afterwards (nothing is written
// to the real output_dir). The run is refused when
//   - neither the training loss (mean of the last fifth of the steps against the first fifth)
//     nor the held-out loss fell by at least 1% (relative), or a loss is not finite, or it
//     diverged (divergence.h), or
//   - for a classifier, the held-out accuracy after N steps is at chance: at most
//     1/C + 2 * sqrt((1/C)(1 - 1/C) / n) (two standard errors above 1/C, C = num_classes,
//     n = held-out examples evaluated).
// Language models are judged by the losses alone. N inside a long warmup may be refused only
// because the rate has not ramped up yet: the reason says so. The real run then starts from a
// fresh state (or resumes its own checkpoints), exactly as without the flag.
#ifndef KILN_TRAIN_VALIDATE_FIRST_H_
#define KILN_TRAIN_VALIDATE_FIRST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/train/config.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

// `kiln train` exit status when --validate-first refused the run.
inline constexpr int kExitValidationRefused = 3;

struct ValidationReport {
  bool passed = false;
  std::string reason;  // why it was refused, or what it saw when it passed (one line)
  int64_t steps = 0;
  double loss_before = 0, loss_after = 0;  // held-out
  double accuracy_after = 0;
  double chance = 0;           // 1 / num_classes (0 for language models)
  double at_chance_below = 0;  // the accuracy at or under which it counts as chance
  int64_t examples = 0;        // held-out examples evaluated
  double first_train_loss = 0, last_train_loss = 0;  // means over the first / last fifth
  double seconds = 0;
};

// The minimum relative fall of the held-out loss.
inline constexpr double kValidationMinLossDrop = 0.01;

// The decision from the evaluations before the first step and after the last (num_classes 0: a
// language model, judged by the loss alone). ValidateFirst's second half; tested on its own.
ValidationReport JudgeValidation(const EvalResult& before, const EvalResult& after,
                                 const std::vector<float>& train_losses, int64_t steps,
                                 int64_t num_classes);

// Runs the check described above. `options` are the real run's (backend, log, ...): the scratch
// run uses its backend and env, logs nothing, never resumes and is not profiled. Errors are those
// of building or running the scratch trainer (bad config, missing data).
absl::StatusOr<ValidationReport> ValidateFirst(const TrainConfig& config, int64_t steps,
                                               const TrainerOptions& options);

}  // namespace kiln::train

#endif  // KILN_TRAIN_VALIDATE_FIRST_H_
