#include "kiln/train/validate_first.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"

namespace kiln::train {
namespace {

constexpr int64_t kMaxEvalBatches = 8;

// A fresh folder under the Env's temporary directory, removed when this goes out of scope.
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Make(Env* env) {
    absl::StatusOr<std::string> path = CreateTempDir(env, "kiln-validate-first-");
    if (!path.ok()) {
      return absl::InternalError(absl::StrCat("--validate-first: cannot create a scratch folder: ",
                                              path.status().message()));
    }
    return ScratchDir(env, *std::move(path));
  }
  ScratchDir(ScratchDir&& o) noexcept : env_(o.env_), path_(std::move(o.path_)) { o.path_.clear(); }
  ScratchDir(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (!path_.empty()) (void)env_->DeleteDir(path_);
  }
  const std::string& path() const { return path_; }

 private:
  ScratchDir(Env* env, std::string p) : env_(env), path_(std::move(p)) {}
  Env* env_;
  std::string path_;
};

}  // namespace

ValidationReport JudgeValidation(const EvalResult& before, const EvalResult& after,
                                 const std::vector<float>& train_losses, int64_t steps,
                                 int64_t num_classes) {
  ValidationReport rep;
  rep.steps = steps;
  rep.loss_before = before.loss;
  rep.loss_after = after.loss;
  rep.accuracy_after = after.accuracy;
  rep.examples = after.examples;
  // The training loss over the first and the last fifth of the steps (different batches: the
  // means smooth their noise).
  const size_t n = train_losses.size();
  const size_t k = std::max<size_t>(1, n / 5);
  if (n > 0) {
    double first = 0, last = 0;
    for (size_t i = 0; i < k; ++i) {
      first += train_losses[i];
      last += train_losses[n - k + i];
    }
    rep.first_train_loss = first / static_cast<double>(k);
    rep.last_train_loss = last / static_cast<double>(k);
  }
  const bool classifier = num_classes >= 2;
  if (classifier) {
    rep.chance = 1.0 / static_cast<double>(num_classes);
    rep.at_chance_below =
        rep.chance + 2.0 * std::sqrt(rep.chance * (1.0 - rep.chance) /
                                     static_cast<double>(std::max<int64_t>(after.examples, 1)));
  }
  const std::string losses = absl::StrFormat(
      "training loss %.4f over the first %d steps -> %.4f over the last %d; held-out loss %.4f "
      "before step 1 -> %.4f after step %d",
      rep.first_train_loss, k, rep.last_train_loss, k, rep.loss_before, rep.loss_after, rep.steps);
  const std::string acc =
      classifier
          ? absl::StrFormat(
                "; held-out accuracy %.4f over %d examples (chance 1/%d = "
                "%.4f, counted as chance up to %.4f)",
                rep.accuracy_after, rep.examples, num_classes, rep.chance, rep.at_chance_below)
          : "";
  const double keep = 1.0 - kValidationMinLossDrop;
  const bool finite = std::isfinite(rep.loss_before) && std::isfinite(rep.loss_after) &&
                      std::isfinite(rep.first_train_loss) && std::isfinite(rep.last_train_loss);
  const bool train_fell = n >= 2 && rep.last_train_loss < rep.first_train_loss * keep;
  const bool held_out_fell = rep.loss_after < rep.loss_before * keep;
  const bool fell = finite && (train_fell || held_out_fell);
  const bool at_chance = classifier && rep.accuracy_after <= rep.at_chance_below;
  rep.passed = fell && !at_chance;
  if (!finite) {
    rep.reason = absl::StrCat("a loss is not finite: ", losses, acc);
  } else if (!fell) {
    rep.reason = absl::StrFormat(
        "neither the training nor the held-out loss fell by at least %.0f%% in %d steps: %s%s",
        100 * kValidationMinLossDrop, rep.steps, losses, acc);
  } else if (at_chance) {
    rep.reason = absl::StrCat("the held-out accuracy is at chance after ", rep.steps,
                              " steps: ", losses, acc);
  } else {
    rep.reason = absl::StrCat(losses, acc);
  }
  return rep;
}

absl::StatusOr<ValidationReport> ValidateFirst(const TrainConfig& config, int64_t steps,
                                               const TrainerOptions& options) {
  if (steps < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--validate-first needs at least 2 steps, got ", steps));
  }
  const auto start = std::chrono::steady_clock::now();
  Env* const env = options.env != nullptr ? options.env : Env::Default();
  KILN_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Make(env));
  // The real run's config (its schedule included, so every step has the rate it will have in
  // the run), stopped after `steps` steps, in a scratch folder, without periodic work.
  TrainConfig v = config;
  v.output_dir = scratch.path();
  v.checkpoint_every = 0;
  v.eval_every = 0;
  v.eval_batches =
      config.eval_batches > 0 ? std::min(config.eval_batches, kMaxEvalBatches) : kMaxEvalBatches;
  v.log_every = std::max<int64_t>(1, std::min(steps, config.steps));
  TrainerOptions o;
  o.backend = options.backend;
  o.env = env;
  o.resume = false;
  o.run_info = options.run_info;
  o.stop_after_steps = std::min(steps, config.steps);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(v, o));
  KILN_ASSIGN_OR_RETURN(EvalResult before, t->Evaluate(v.eval_batches));
  absl::StatusOr<TrainResult> run = t->Run();
  if (absl::IsAborted(run.status())) {  // divergence (divergence.h): a refusal, not a failure
    ValidationReport rep;
    rep.loss_before = before.loss;
    rep.loss_after = NAN;
    rep.reason = absl::StrCat("the scratch run diverged: ", run.status().message());
    return rep;
  }
  if (!run.ok()) return run.status();
  KILN_ASSIGN_OR_RETURN(EvalResult after, t->Evaluate(v.eval_batches));
  const DataShape& shape = t->data_shape();
  ValidationReport rep = JudgeValidation(before, after, run->losses, run->final_step,
                                         shape.language_model ? 0 : shape.num_classes);
  t.reset();  // releases the scratch folder's lock before it is removed
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!rep.passed && config.optimizer.lr > 0 && config.schedule.warmup_steps >= rep.steps) {
    absl::StrAppend(
        &rep.reason,
        absl::StrFormat(" (the %d steps are all inside schedule.warmup_steps %d, so "
                        "the rate was still ramping up: validate over more steps, "
                        "e.g. --validate-first %d)",
                        rep.steps, config.schedule.warmup_steps, 2 * config.schedule.warmup_steps));
  }
  return rep;
}

}  // namespace kiln::train
