#include "kiln/nn/optim.h"

#include <fnmatch.h>

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/autodiff/grad.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/base/status.h"

namespace kiln::nn {
namespace {

constexpr double kPi = 3.14159265358979323846;

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError("optimizer config: " + field + " " + why);
}

}  // namespace

std::string OptimizerStateName(const std::string& slot, const std::string& param) {
  return "opt/" + slot + "/" + param;
}

int MatchParamGroup(const std::vector<ParamGroup>& groups, const std::string& param) {
  for (size_t i = 0; i < groups.size(); ++i) {
    if (fnmatch(groups[i].match.c_str(), param.c_str(), 0) == 0) return static_cast<int>(i);
  }
  return -1;
}

bool IsFrozen(const OptimizerConfig& config, const std::string& param) {
  const int g = MatchParamGroup(config.param_groups, param);
  return g >= 0 && config.param_groups[g].freeze;
}

double LrScale(const OptimizerConfig& config, const std::string& param) {
  const int g = MatchParamGroup(config.param_groups, param);
  return g >= 0 ? config.param_groups[g].lr_scale : 1.0;
}

absl::Status CheckParamGroups(const OptimizerConfig& config,
                              const std::vector<std::string>& params) {
  const std::vector<ParamGroup>& groups = config.param_groups;
  std::vector<int> taken(groups.size(), 0);
  int trained = 0;
  for (const std::string& p : params) {
    const int g = MatchParamGroup(groups, p);
    if (g >= 0) ++taken[g];
    if (g < 0 || !groups[g].freeze) ++trained;
  }
  auto some_names = [&] {
    std::string s;
    for (size_t i = 0; i < params.size() && i < 8; ++i)
      absl::StrAppend(&s, i ? ", " : "", params[i]);
    if (params.size() > 8) absl::StrAppend(&s, ", ... (", params.size(), " in all)");
    return s;
  };
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].match.empty())
      return absl::InvalidArgumentError(absl::StrCat("param_groups[", i, "]: match is empty"));
    if (!(groups[i].lr_scale >= 0) || !std::isfinite(groups[i].lr_scale))
      return absl::InvalidArgumentError(absl::StrCat("param_groups[", i, "] (match '",
                                                     groups[i].match,
                                                     "'): lr_scale must be a finite number >= 0, "
                                                     "got ",
                                                     groups[i].lr_scale));
    if (taken[i] == 0)
      return absl::InvalidArgumentError(
          absl::StrCat("param_groups[", i, "] (match '", groups[i].match, "') matches no parameter",
                       i > 0 ? " that an earlier group does not already take" : "",
                       " (first match wins; the model's parameters: ", some_names(), ")"));
  }
  if (trained == 0 && !params.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("param_groups freeze every parameter of the model (", some_names(),
                     "): nothing would train"));
  return absl::OkStatus();
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  const ScheduleOptions& s = c.schedule;
  if (!(s.lr >= 0.0)) return Bad("schedule.lr", absl::StrCat("must be >= 0, got ", s.lr));
  if (s.warmup_steps < 0) {
    return Bad("schedule.warmup_steps", absl::StrCat("must be >= 0, got ", s.warmup_steps));
  }
  if (s.kind != ScheduleKind::kConstant) {
    if (s.total_steps <= s.warmup_steps) {
      return Bad("schedule.total_steps", absl::StrCat("must be > warmup_steps (", s.warmup_steps,
                                                      ") for a decaying "
                                                      "schedule, got ",
                                                      s.total_steps));
    }
    if (!(s.min_lr >= 0.0 && s.min_lr <= s.lr)) {
      return Bad("schedule.min_lr", absl::StrCat("must be in [0, lr=", s.lr, "], got ", s.min_lr));
    }
  }
  if (!(c.clip_norm >= 0.0))
    return Bad("clip_norm", absl::StrCat("must be >= 0, got ", c.clip_norm));
  if (c.kind == OptimizerKind::kSgd) {
    const SgdOptions& o = c.sgd;
    if (!(o.momentum >= 0.0))
      return Bad("sgd.momentum", absl::StrCat("must be >= 0, got ", o.momentum));
    if (!(o.dampening >= 0.0 && o.dampening <= 1.0)) {
      return Bad("sgd.dampening", absl::StrCat("must be in [0, 1], got ", o.dampening));
    }
    if (!(o.weight_decay >= 0.0)) {
      return Bad("sgd.weight_decay", absl::StrCat("must be >= 0, got ", o.weight_decay));
    }
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
      return Bad("sgd.nesterov", "needs momentum > 0 and dampening 0");
    }
  } else {
    const AdamWOptions& o = c.adamw;
    if (!(o.beta1 >= 0.0 && o.beta1 < 1.0)) {
      return Bad("adamw.beta1", absl::StrCat("must be in [0, 1), got ", o.beta1));
    }
    if (!(o.beta2 >= 0.0 && o.beta2 < 1.0)) {
      return Bad("adamw.beta2", absl::StrCat("must be in [0, 1), got ", o.beta2));
    }
    if (!(o.eps > 0.0)) return Bad("adamw.eps", absl::StrCat("must be > 0, got ", o.eps));
    if (!(o.weight_decay >= 0.0)) {
      return Bad("adamw.weight_decay", absl::StrCat("must be >= 0, got ", o.weight_decay));
    }
  }
  return absl::OkStatus();
}

double LearningRate(const ScheduleOptions& s, int64_t step) {
  const double t = static_cast<double>(step);
  if (step < s.warmup_steps) return s.lr * (t + 1.0) / static_cast<double>(s.warmup_steps);
  if (s.kind == ScheduleKind::kConstant) return s.lr;
  const double span = static_cast<double>(s.total_steps - s.warmup_steps);
  const double p = std::min(1.0, std::max(0.0, (t - static_cast<double>(s.warmup_steps)) / span));
  if (s.kind == ScheduleKind::kLinear) return s.min_lr + (s.lr - s.min_lr) * (1.0 - p);
  return s.min_lr + (s.lr - s.min_lr) * 0.5 * (1.0 + std::cos(kPi * p));
}

ir::Value ScheduledLearningRate(const ScheduleOptions& s, ir::Value step) {
  if (!step.valid() || !step.builder()->status().ok()) return step;
  ir::Builder& b = *step.builder();
  auto f64 = [&b](double v) { return b.Scalar(v, DType::kF64); };
  ir::Value t = ir::Convert(step, DType::kF64);
  ir::Value after;
  if (s.kind == ScheduleKind::kConstant) {
    after = f64(s.lr);
  } else {
    const double span = static_cast<double>(s.total_steps - s.warmup_steps);
    ir::Value p = (t - static_cast<double>(s.warmup_steps)) / (span > 0 ? span : 1.0);
    p = ir::Min(ir::Max(p, f64(0.0)), f64(1.0));
    ir::Value shape = s.kind == ScheduleKind::kLinear ? 1.0 - p : 0.5 * (1.0 + ir::Cos(p * kPi));
    after = s.min_lr + (s.lr - s.min_lr) * shape;
  }
  if (s.warmup_steps <= 0) return after;
  const double w = static_cast<double>(s.warmup_steps);
  ir::Value warm = (t + 1.0) * (s.lr / w);
  return ir::Select(ir::Lt(t, f64(w)), warm, after);
}

std::vector<ParamSpec> OptimizerStateSpecs(const OptimizerConfig& config,
                                           const std::vector<ParamSpec>& params) {
  std::vector<std::string> slots;
  if (config.kind == OptimizerKind::kAdamW) {
    slots = {"m", "v"};
  } else if (config.sgd.momentum != 0.0) {
    slots = {"momentum"};
  }
  std::vector<ParamSpec> specs;
  for (const std::string& slot : slots) {
    for (const ParamSpec& p : params) {
      if (IsFrozen(config, p.name)) continue;
      specs.push_back(
          {OptimizerStateName(slot, p.name), DType::kF32, p.shape, Initializer::Zeros()});
    }
  }
  return specs;
}

// The names the train step adds (its inputs and outputs) must be free in the loss graph.
absl::Status CheckAddedNamesFree(const ir::Graph& loss_graph,
                                 const std::vector<ParamSpec>& param_specs,
                                 const std::vector<ParamSpec>& state_specs) {
  std::set<std::string> added_inputs = {kStepInput};
  std::set<std::string> added_outputs = {kGradNormOutput, kLearningRateOutput};
  for (const ParamSpec& s : state_specs) added_inputs.insert(s.name);
  for (const ParamSpec& s : param_specs) added_outputs.insert(UpdatedName(s.name));
  for (const ParamSpec& s : state_specs) added_outputs.insert(UpdatedName(s.name));
  for (const std::string& name : added_inputs) {
    if (loss_graph.FindParameter(name) >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the loss graph already has a parameter named '", name, "' (the train step adds it)"));
    }
  }
  for (const std::string& name : added_outputs) {
    if (loss_graph.FindOutput(name) >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("the loss graph already has an output named '",
                                                     name, "' (the train step adds it)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OptimizerUpdate> BuildOptimizerUpdate(ir::Builder& b, const OptimizerConfig& config,
                                                     const std::vector<std::string>& param_names,
                                                     const std::vector<int>& param_ranks,
                                                     const std::vector<ir::Value>& values,
                                                     std::vector<ir::Value> grads,
                                                     const std::vector<ir::Value>& state,
                                                     ir::Value step, ir::Value norm) {
  const size_t slots = config.kind == OptimizerKind::kAdamW ? 2 : config.sgd.momentum != 0.0;
  if (param_names.size() != values.size() || param_ranks.size() != values.size() ||
      grads.size() != values.size() || state.size() != slots * values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer update: ", values.size(), " values with ", param_names.size(),
                     " names, ", param_ranks.size(), " ranks, ", grads.size(), " gradients and ",
                     state.size(), " state tensors (expected ", slots * values.size(), ")"));
  }

  // ---- global norm and clipping ----
  if (!norm.valid()) {
    ir::Value sumsq = b.Scalar(0.0, DType::kF32);
    for (const ir::Value& grad : grads) {
      ir::Value sq = grad * grad;
      std::vector<int64_t> all(grad.rank());
      for (int d = 0; d < grad.rank(); ++d) all[d] = d;
      sumsq = sumsq + (all.empty() ? sq : ir::ReduceSum(sq, all));
    }
    norm = ir::Sqrt(sumsq);
  }
  b.Output(kGradNormOutput, norm);
  if (config.clip_norm > 0) {
    ir::Value coef = ir::Min(config.clip_norm / (norm + 1e-6), b.Scalar(1.0, DType::kF32));
    for (ir::Value& grad : grads) grad = grad * coef;
  }

  // ---- schedule (f64 scalars, rounded to f32 where they meet tensors) ----
  ir::Value lr64 = ScheduledLearningRate(config.schedule, step);
  ir::Value lr = ir::Convert(lr64, DType::kF32);
  b.Output(kLearningRateOutput, lr);
  auto decays = [&](size_t i) { return param_ranks[i] >= config.weight_decay_min_rank; };

  const size_t n = values.size();
  // Per-group rates: the scale applies in f64, before the rounding to f32.
  std::vector<double> scale(n);
  for (size_t i = 0; i < n; ++i) scale[i] = LrScale(config, param_names[i]);
  auto lr_of = [&](size_t i) {
    return scale[i] == 1.0 ? lr : ir::Convert(lr64 * scale[i], DType::kF32);
  };
  std::vector<ir::Value> new_values(n), new_state(state.size());
  if (config.kind == OptimizerKind::kAdamW) {
    // ---- adamw ----
    const AdamWOptions& o = config.adamw;
    ir::Value t1 = ir::Convert(step, DType::kF64) + 1.0;
    ir::Value bc1 = 1.0 - ir::Pow(b.Scalar(o.beta1, DType::kF64), t1);
    ir::Value bc2 = 1.0 - ir::Pow(b.Scalar(o.beta2, DType::kF64), t1);
    ir::Value step_size = ir::Convert(lr64 / bc1, DType::kF32);
    ir::Value bc2_sqrt = ir::Convert(ir::Sqrt(bc2), DType::kF32);
    ir::Value decay = ir::Convert(1.0 - lr64 * o.weight_decay, DType::kF32);
    for (size_t i = 0; i < n; ++i) {
      const bool scaled = scale[i] != 1.0;
      ir::Value p = values[i];
      if (o.weight_decay != 0.0 && decays(i)) {
        p = p * (scaled ? ir::Convert(1.0 - lr64 * scale[i] * o.weight_decay, DType::kF32) : decay);
      }
      ir::Value m = state[i] * o.beta1 + grads[i] * (1.0 - o.beta1);
      ir::Value v = state[n + i] * o.beta2 + grads[i] * grads[i] * (1.0 - o.beta2);
      ir::Value denom = ir::Sqrt(v) / bc2_sqrt + o.eps;
      new_values[i] =
          p - (scaled ? ir::Convert(lr64 * scale[i] / bc1, DType::kF32) : step_size) * (m / denom);
      new_state[i] = m;
      new_state[n + i] = v;
    }
  } else {
    // ---- sgd ----
    const SgdOptions& o = config.sgd;
    ir::Value first = ir::Eq(step, b.Scalar(0.0, DType::kS64));
    for (size_t i = 0; i < n; ++i) {
      ir::Value d = grads[i];
      if (o.weight_decay != 0.0 && decays(i)) d = d + values[i] * o.weight_decay;
      if (o.momentum != 0.0) {
        ir::Value buf = ir::Select(first, d, state[i] * o.momentum + d * (1.0 - o.dampening));
        new_state[i] = buf;
        d = o.nesterov ? d + buf * o.momentum : buf;
      }
      new_values[i] = values[i] - lr_of(i) * d;
    }
  }

  return OptimizerUpdate{std::move(new_values), std::move(new_state)};
}

absl::StatusOr<ir::Graph> BuildTrainStep(const ir::Graph& loss_graph,
                                         const std::vector<std::string>& all_params,
                                         const OptimizerConfig& config,
                                         const std::string& loss_output,
                                         const GradientHook& gradient_hook) {
  KILN_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  KILN_RETURN_IF_ERROR(CheckParamGroups(config, all_params));
  // Frozen parameters stay plain inputs of the step: no gradient, no update, no state.
  std::vector<std::string> params;
  for (const std::string& p : all_params) {
    if (loss_graph.FindParameter(p) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("train step: '", p, "' is not a parameter of the loss graph"));
    }
    if (!IsFrozen(config, p)) params.push_back(p);
  }
  // The trained parameters' specs (their types come from the loss graph).
  std::vector<ParamSpec> param_specs;
  for (const std::string& p : params) {
    const int id = loss_graph.FindParameter(p);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("train step: '", p, "' is not a parameter of the loss graph"));
    }
    param_specs.push_back({p, loss_graph.node(id).type().dtype, loss_graph.node(id).type().shape,
                           Initializer::Zeros()});
  }
  const std::vector<ParamSpec> state_specs = OptimizerStateSpecs(config, param_specs);
  KILN_RETURN_IF_ERROR(CheckAddedNamesFree(loss_graph, param_specs, state_specs));
  KILN_ASSIGN_OR_RETURN(ir::Graph g, autodiff::Grad(loss_graph, params, loss_output));

  ir::Builder b(loss_graph.name() + "_train_step");
  KILN_ASSIGN_OR_RETURN(autodiff::ValueMap map, autodiff::CopyGraph(g, b));
  std::vector<ir::Value> state;
  for (const ParamSpec& s : state_specs) state.push_back(b.Parameter(s.name, s.dtype, s.shape));
  ir::Value step = b.Parameter(kStepInput, DType::kS64, Shape{});
  for (const ir::Output& o : loss_graph.outputs()) {
    b.Output(o.name, map[g.outputs()[g.FindOutput(o.name)].node]);
  }

  // Gradients and values in f32.
  const size_t n = params.size();
  std::vector<ir::Value> grads(n), values(n);
  for (size_t i = 0; i < n; ++i) {
    const int gi = g.FindOutput("grad/" + params[i]);
    if (gi < 0)
      return absl::InternalError(absl::StrCat("Grad produced no output grad/", params[i]));
    auto f32 = [](ir::Value v) {
      return v.dtype() == DType::kF32 ? v : ir::Convert(v, DType::kF32);
    };
    grads[i] = f32(map[g.outputs()[gi].node]);
    values[i] = f32(map[g.FindParameter(params[i])]);
  }
  if (gradient_hook) KILN_RETURN_IF_ERROR(gradient_hook(b, grads));
  std::vector<int> ranks(n);
  for (size_t i = 0; i < n; ++i) ranks[i] = values[i].rank();
  KILN_ASSIGN_OR_RETURN(OptimizerUpdate update,
                        BuildOptimizerUpdate(b, config, params, ranks, values, std::move(grads),
                                             state, step, ir::Value()));
  const std::vector<ir::Value>& new_values = update.values;
  const std::vector<ir::Value>& new_state = update.state;

  // Each new value is computed in place of the one it replaces (ir::Output::in_place_of), so a
  // step can keep one set of parameters and state (TrainStep passes the same tensors).
  for (size_t i = 0; i < n; ++i) {
    const DType dtype = param_specs[i].dtype;
    ir::Value v = new_values[i];
    b.Output(UpdatedName(params[i]), dtype == DType::kF32 ? v : ir::Convert(v, dtype),
             map[g.FindParameter(params[i])]);
  }
  for (size_t i = 0; i < state.size(); ++i)
    b.Output(UpdatedName(state_specs[i].name), new_state[i], state[i]);
  return b.Build();
}

}  // namespace kiln::nn
