// Optimizers, gradient clipping and learning-rate schedules as graph code: BuildTrainStep turns a
// loss graph into ONE graph that runs forward, backward (autodiff::Grad), clipping, the schedule
// and the optimizer update, like a jitted train step. TrainStep (train_step.h) compiles and runs
// it with parameters and optimizer state resident between steps.
//
//   OptimizerConfig opt{.kind = OptimizerKind::kAdamW,
//                       .schedule = {.kind = ScheduleKind::kCosine, .lr = 3e-4,
//                                    .warmup_steps = 100, .total_steps = 5000, .min_lr = 3e-5},
//                       .clip_norm = 1.0};
//   KILN_ASSIGN_OR_RETURN(ir::Graph step, BuildTrainStep(loss_graph, param_names, opt));
//   // step(<loss graph's parameters>..., opt/m/<p>..., opt/v/<p>..., opt/step s64[])
//   //   -> {<loss graph's outputs>..., "grad_norm", "lr", new/<p>..., new/opt/m/<p>...,
//   //       new/opt/v/<p>...}
//   // each new/<x> output is in_place_of its input <x> (ir::Output): one set of buffers can hold
//   // the parameters and state, updated in place (TrainStep does so)
//
// Step numbering: the input "opt/step" is t, the number of updates already applied (0 on the
// first step). The schedule is computed IN THE GRAPH from t (in f64, then rounded to f32), so a
// checkpoint needs only t; LearningRate() is the same formula on the host for logging and tests.
//
// Semantics match PyTorch 1.13 (tests pin them to torch.optim numbers):
//   clipping  torch.nn.utils.clip_grad_norm_: n = sqrt(sum of all squared gradients);
//             g *= min(1, clip_norm / (n + 1e-6)). "grad_norm" is n before clipping (also
//             output when clipping is off).
//   SGD       torch.optim.SGD: g += wd * p; momentum buffer b = g on the first step (t == 0),
//             else b = momentum * b + (1 - dampening) * g; nesterov: g += momentum * b, else
//             g = b; p -= lr * g. State "opt/momentum/<p>" only when momentum != 0.
//   AdamW     torch.optim.AdamW: p *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//             p -= lr / (1 - b1^(t+1)) * m / (sqrt(v) / sqrt(1 - b2^(t+1)) + eps).
//             State "opt/m/<p>", "opt/v/<p>".
//   schedule  lr(t) = peak * (t + 1) / warmup for t < warmup (torch LinearLR with
//             start_factor = 1 / warmup, total_iters = warmup - 1); after warmup, with
//             p = min(1, (t - warmup) / (total - warmup)): constant: peak; linear:
//             floor + (peak - floor) (1 - p); cosine: floor + (peak - floor) (1 + cos(pi p)) / 2
//             (torch CosineAnnealingLR with T_max = total - warmup, eta_min = floor).
// Optimizer state is f32 whatever the parameter dtype; updates compute in f32 and round to the
// parameter's dtype.
//
// Parameter groups (OptimizerConfig::param_groups, torch's param_groups by name pattern): each
// parameter takes the first group whose `match` (fnmatch(3) without FNM_PATHNAME, so `*` also
// matches '/': "blocks/*" covers "blocks/0/attn/qkv/weight") matches its name; a parameter that
// no group matches trains at the full rate. A group's lr_scale multiplies the scheduled rate of
// its parameters in f64 before the rounding to f32 (so SGD at lr L with lr_scale s is bit for bit
// SGD at lr L*s; AdamW's decoupled decay scales with it, as torch's per-group lr does). A frozen
// group (freeze: true, torch's requires_grad = False) takes no gradient, no update and no
// optimizer state: the step graph differentiates only the other parameters, its frozen inputs
// have no new/ output, and the norm that clipping and "grad_norm" use is over the trained ones.
#ifndef KILN_NN_OPTIM_H_
#define KILN_NN_OPTIM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"
#include "kiln/nn/params.h"

namespace kiln::nn {

enum class OptimizerKind { kSgd, kAdamW };
enum class ScheduleKind { kConstant, kLinear, kCosine };

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;      // needs momentum > 0 and dampening == 0 (as torch)
  double weight_decay = 0.0;  // L2, added to the gradient
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled
};

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kConstant;
  double lr = 1e-3;          // the peak learning rate
  int64_t warmup_steps = 0;  // linear warmup from lr / warmup_steps up to lr
  int64_t total_steps = 0;   // kLinear / kCosine: the step at which min_lr is reached
  double min_lr = 0.0;       // kLinear / kCosine: the floor
};

// One parameter group (see the top of this file).
struct ParamGroup {
  std::string match;      // fnmatch pattern over parameter names
  double lr_scale = 1.0;  // >= 0
  bool freeze = false;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  SgdOptions sgd;
  AdamWOptions adamw;
  ScheduleOptions schedule;
  double clip_norm = 0.0;  // > 0: clip gradients to this global L2 norm
  // Weight decay applies to parameters of rank >= this (2: matrices and conv filters only, the
  // usual exclusion of biases and norm scales; 0: all, as torch's default).
  int weight_decay_min_rank = 0;
  // First match wins; parameters no group matches train at lr_scale 1.
  std::vector<ParamGroup> param_groups;
};

// The index of the first group of `groups` that matches `param` (-1: none).
int MatchParamGroup(const std::vector<ParamGroup>& groups, const std::string& param);
// Whether `param` is frozen (its group has freeze) and its lr scale (1 without a group).
bool IsFrozen(const OptimizerConfig& config, const std::string& param);
double LrScale(const OptimizerConfig& config, const std::string& param);
// Checks the groups against the parameter names: every group must match at least one parameter
// that no earlier group took (a typo would otherwise silently train everything at full rate), and
// at least one parameter must stay trained. InvalidArgument naming the group
// ("param_groups[1] (match 'blocks/*') ...") and listing some of the names.
absl::Status CheckParamGroups(const OptimizerConfig& config,
                              const std::vector<std::string>& params);

// The output name of a parameter's (or optimizer state's) updated value in a train-step graph.
inline std::string UpdatedName(const std::string& param) { return "new/" + param; }

// The names of the train-step graph's extra inputs and outputs.
inline constexpr char kStepInput[] = "opt/step";
inline constexpr char kGradNormOutput[] = "grad_norm";
inline constexpr char kLearningRateOutput[] = "lr";
// "opt/m/<param>", "opt/v/<param>", "opt/momentum/<param>".
std::string OptimizerStateName(const std::string& slot, const std::string& param);

// InvalidArgument naming the bad field: a negative rate, betas outside [0, 1), eps <= 0,
// nesterov without momentum or with dampening, a warmup or total of < 0, a decaying schedule
// whose total_steps is not > warmup_steps, min_lr > lr, clip_norm < 0.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

// The learning rate used by update t (0-based), on the host in double.
double LearningRate(const ScheduleOptions& schedule, int64_t step);
// The same in the graph: step s64[] -> lr f64[].
ir::Value ScheduledLearningRate(const ScheduleOptions& schedule, ir::Value step);

// The optimizer state for `params` (zeros, f32, each param's shape), in the order the train step
// takes it: for AdamW all opt/m/* then all opt/v/*; for SGD with momentum opt/momentum/*; none
// for plain SGD. Frozen parameters (param_groups) have none.
std::vector<ParamSpec> OptimizerStateSpecs(const OptimizerConfig& config,
                                           const std::vector<ParamSpec>& params);

// Builds the train step described at the top of this file. `params` are the parameters of
// `loss_graph` (floating; every other parameter is a data input passed through); those a frozen
// group matches are inputs without gradient, update or state. Errors: an
// invalid config, those of autodiff::Grad, a loss that is not a floating scalar, or a name clash
// with the inputs/outputs the step adds.
// `gradient_hook`, when set, is called with the step's builder and the f32 gradients (in `params`
// order) before the norm, clipping and update, and may replace them: data-parallel training
// averages them over the ranks there (train_step.h).
using GradientHook = std::function<absl::Status(ir::Builder&, std::vector<ir::Value>& grads)>;
absl::StatusOr<ir::Graph> BuildTrainStep(const ir::Graph& loss_graph,
                                         const std::vector<std::string>& params,
                                         const OptimizerConfig& config,
                                         const std::string& loss_output = "loss",
                                         const GradientHook& gradient_hook = nullptr);

// The update half of BuildTrainStep (global norm, clipping, schedule, optimizer), for callers
// that build the gradients themselves: ZeRO-1 updates only this rank's shard of the flattened
// parameters, one piece per parameter it overlaps (train_step.h). `values` and `grads` are f32;
// `param_names` and `param_ranks` are those of the parameter each value is (a piece of): weight
// decay follows the parameter's rank, not the piece's. `state` is in OptimizerStateSpecs order
// over the values. `norm` is the global L2 norm of the gradients when the caller already has it
// (ZeRO-1 sums the squares over the ranks); invalid (ir::Value()): computed from `grads`. Adds
// the outputs "grad_norm" and "lr"; returns the new values and state (not yet outputs).
struct OptimizerUpdate {
  std::vector<ir::Value> values;
  std::vector<ir::Value> state;
};
absl::StatusOr<OptimizerUpdate> BuildOptimizerUpdate(ir::Builder& b, const OptimizerConfig& config,
                                                     const std::vector<std::string>& param_names,
                                                     const std::vector<int>& param_ranks,
                                                     const std::vector<ir::Value>& values,
                                                     std::vector<ir::Value> grads,
                                                     const std::vector<ir::Value>& state,
                                                     ir::Value step, ir::Value norm);

}  // namespace kiln::nn

#endif  // KILN_NN_OPTIM_H_
