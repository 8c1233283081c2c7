#include "kiln/nn/train_step.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/autodiff/grad.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/base/status.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/passes/spmd_partitioner.h"
#include "kiln/compiler/pipeline.h"
#include "kiln/nn/internal/train_step_zero.h"
#include "kiln/nn/model.h"

namespace kiln::nn {
namespace {

absl::Status CheckScalarS64(const ir::Graph& g, const std::string& name) {
  const int id = g.FindParameter(name);
  if (id < 0) return absl::OkStatus();
  const ir::Type& t = g.node(id).type();
  if (t.dtype != DType::kS64 || t.shape.rank() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: the loss graph's '", name, "' must be s64[], got ", t.ToString()));
  }
  return absl::OkStatus();
}

// Checks that `from` has every tensor of `to` by name with its dtype and shape, and no other.
absl::Status CheckMatches(const ParamStore& from, const ParamStore& to, const std::string& what) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError(absl::StrCat("TrainStep::Restore: ", what, " has ",
                                                   from.size(), " tensors, expected ", to.size()));
  }
  for (int i = 0; i < to.size(); ++i) {
    const std::string& name = to.names()[i];
    const Tensor* src = from.Find(name);
    if (src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("TrainStep::Restore: ", what, " lacks '", name, "'"));
    }
    const Tensor& dst = to.value(i);
    if (src->dtype() != dst.dtype() || src->shape() != dst.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("TrainStep::Restore: ", what, " '", name,
                                                     "' is ", src->TypeString(), ", expected ",
                                                     dst.TypeString()));
    }
  }
  return absl::OkStatus();
}

// Copies `from`'s values into `to`'s buffers (CheckMatches passed); a tensor that already is the
// resident buffer (a checkpoint read in place, CheckpointManager::RestoreInto) is left alone.
void CopyInto(const ParamStore& from, ParamStore& to) {
  for (int i = 0; i < to.size(); ++i) {
    const Tensor* src = from.Find(to.names()[i]);
    if (src->raw_data() == to.value(i).raw_data()) continue;
    std::memcpy(to.value(i).raw_data(), src->raw_data(), src->byte_size());
  }
}

// The specs of the trained parameters, each checked against the loss graph's input of its name.
absl::StatusOr<std::vector<ParamSpec>> CheckedParamSpecs(const ir::Graph& loss_graph,
                                                         const ParamStore& initial) {
  std::vector<ParamSpec> param_specs;
  for (int i = 0; i < initial.size(); ++i) {
    const std::string& name = initial.names()[i];
    const int id = loss_graph.FindParameter(name);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TrainStep: parameter '", name, "' is not an input of the loss graph"));
    }
    const ir::Type& want = loss_graph.node(id).type();
    if (want.dtype != initial.value(i).dtype() || want.shape != initial.value(i).shape()) {
      return absl::InvalidArgumentError(absl::StrCat("TrainStep: parameter '", name, "' is ",
                                                     initial.value(i).TypeString(),
                                                     " but the graph takes ", want.ToString()));
    }
    param_specs.push_back({name, want.dtype, want.shape, Initializer::Zeros()});
  }
  return param_specs;
}

// Averages `grads` over the data-parallel ranks in the step graph: one all_reduce per bucket
// (GradientBuckets), then * 1/ranks. Returns the number of buckets.
int AverageGradients(std::vector<ir::Value>& grads, const TrainStepOptions& o) {
  std::vector<int64_t> bytes;
  for (const ir::Value& g : grads) bytes.push_back(g.type().byte_size());
  int64_t first_cap = o.first_bucket_bytes, cap = o.bucket_bytes;
  if (o.min_buckets > 1) {
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    const int64_t small = std::max(kMinBucketCapBytes, (total + o.min_buckets - 1) / o.min_buckets);
    first_cap = std::min(first_cap, small);
    cap = std::min(cap, small);
  }
  const std::vector<std::vector<int>> buckets = GradientBuckets(bytes, first_cap, cap);
  const double scale = 1.0 / o.data_parallel;
  for (const std::vector<int>& bucket : buckets) {
    if (bucket.size() == 1) {
      grads[bucket[0]] = ir::AllReduce(grads[bucket[0]]) * scale;
      continue;
    }
    std::vector<ir::Value> flat;
    for (int i : bucket)
      flat.push_back(ir::Reshape(grads[i], Shape{grads[i].shape().num_elements()}));
    ir::Value sum = ir::AllReduce(ir::Concatenate(flat, 0));
    int64_t offset = 0;
    for (int i : bucket) {
      const int64_t n = grads[i].shape().num_elements();
      grads[i] = ir::Reshape(ir::Slice(sum, {offset}, {offset + n}), grads[i].shape()) * scale;
      offset += n;
    }
  }
  return static_cast<int>(buckets.size());
}

// BuildTrainStep, with the data-parallel gradient averaging (AverageGradients) when
// options.data_parallel > 1; *buckets: the all-reduces it inserted.
absl::StatusOr<ir::Graph> BuildStepGraph(const ir::Graph& loss, const ParamStore& initial,
                                         const TrainStepOptions& options, int* buckets) {
  if (options.data_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: data_parallel must be >= 1, got ", options.data_parallel));
  }
  if (options.data_parallel > 1 &&
      (options.collectives == nullptr || options.collectives->size() != options.data_parallel)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: data_parallel = ", options.data_parallel,
                     " needs collectives over as many ranks, got ",
                     options.collectives == nullptr ? std::string("none")
                                                    : std::to_string(options.collectives->size())));
  }
  GradientHook hook;
  if (options.data_parallel > 1) {
    hook = [&](ir::Builder&, std::vector<ir::Value>& grads) {
      *buckets = AverageGradients(grads, options);
      return absl::OkStatus();
    };
  }
  return BuildTrainStep(loss, initial.names(), options.optimizer, options.loss_output, hook);
}

// ZeRO-1's gradient graph: the loss graph's outputs and "zero/grads", every parameter's f32
// gradient flattened and concatenated in order, zero-padded to ShardSize * data_parallel.
absl::StatusOr<ir::Graph> BuildZeroGradientGraph(const ir::Graph& loss, const ParamStore& initial,
                                                 const TrainStepOptions& options) {
  KILN_RETURN_IF_ERROR(ValidateOptimizerConfig(options.optimizer));
  if (loss.FindOutput(kZeroGradsOutput) >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: the loss graph already has an output '", kZeroGradsOutput, "'"));
  }
  KILN_ASSIGN_OR_RETURN(ir::Graph g, autodiff::Grad(loss, initial.names(), options.loss_output));
  ir::Builder b(loss.name() + "_zero_grads");
  KILN_ASSIGN_OR_RETURN(autodiff::ValueMap map, autodiff::CopyGraph(g, b));
  for (const ir::Output& o : loss.outputs()) {
    b.Output(o.name, map[g.outputs()[g.FindOutput(o.name)].node]);
  }
  std::vector<ir::Value> parts;
  std::vector<int64_t> sizes;
  for (const std::string& p : initial.names()) {
    const int gi = g.FindOutput("grad/" + p);
    if (gi < 0) return absl::InternalError(absl::StrCat("Grad produced no output grad/", p));
    ir::Value grad = map[g.outputs()[gi].node];
    if (grad.dtype() != DType::kF32) grad = ir::Convert(grad, DType::kF32);
    sizes.push_back(grad.shape().num_elements());
    parts.push_back(ir::Reshape(grad, Shape{sizes.back()}));
  }
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const int64_t pad = ShardSize(sizes, options.data_parallel) * options.data_parallel - total;
  if (pad > 0) parts.push_back(ir::BroadcastTo(b.Scalar(0.0, DType::kF32), Shape{pad}));
  b.Output(kZeroGradsOutput, parts.size() == 1 ? parts[0] : ir::Concatenate(parts, 0));
  return b.Build();
}

// Tensor parallel: checks the options and sets *tensor_shardings to options.shardings for the
// parameters and, like its parameter, for each optimizer-state tensor: what the compiler's
// program pipeline annotates and partitions the step graph with.
absl::Status StepShardings(const std::vector<ParamSpec>& specs, const ParamStore& initial,
                           const TrainStepOptions& options,
                           std::map<std::string, ir::Sharding>* tensor_shardings) {
  const runtime::Collectives* shard = options.collectives;
  if (shard == nullptr || shard->num_shards() != options.model_parallel)
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: model_parallel = ", options.model_parallel,
                     " needs collectives whose mesh axis (num_shards) has as many ranks, got ",
                     shard == nullptr ? std::string("none") : std::to_string(shard->num_shards())));
  if (options.model_rank < 0 || options.model_rank >= options.model_parallel)
    return absl::InvalidArgumentError(absl::StrCat("TrainStep: model_rank ", options.model_rank,
                                                   " is not below model_parallel ",
                                                   options.model_parallel));
  for (const auto& [name, s] : options.shardings) {
    if (!initial.Contains(name))
      return absl::InvalidArgumentError(
          absl::StrCat("TrainStep: a sharding names '", name, "', which is no parameter"));
  }
  for (const ParamSpec& spec : specs) {
    auto it = options.shardings.find(spec.name);
    if (it == options.shardings.end()) continue;
    (*tensor_shardings)[spec.name] = it->second;
    for (const ParamSpec& st : OptimizerStateSpecs(options.optimizer, {spec}))
      (*tensor_shardings)[st.name] = it->second;
  }
  return absl::OkStatus();
}

// The checks Create starts with; the trained parameters' specs.
absl::StatusOr<std::vector<ParamSpec>> CheckLossGraph(const ir::Graph& loss_graph,
                                                      const ParamStore& initial,
                                                      const TrainStepOptions& options) {
  if (loss_graph.FindOutput(options.loss_output) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: the loss graph has no output '", options.loss_output, "'"));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<ParamSpec> param_specs, CheckedParamSpecs(loss_graph, initial));
  KILN_RETURN_IF_ERROR(CheckScalarS64(loss_graph, kRngSeedInput));
  KILN_RETURN_IF_ERROR(CheckScalarS64(loss_graph, kRngStepInput));
  if (options.model_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep: model_parallel must be >= 1, got ", options.model_parallel));
  }
  if (options.shard_state && options.model_parallel > 1) {
    return absl::UnimplementedError(
        "TrainStep: shard_state (ZeRO-1) with tensor parallelism (model_parallel > 1) is not "
        "built yet; use one of them");
  }
  return param_specs;
}

// The precision policy, on the LOSS graph before autodiff, through the compiler's program
// pipeline with the backend's pipeline switches (so "mixed-precision" is dumped, verified and
// disabled by name like every pass), not through the step's compile: rewritten first, the
// backward pass inherits the bf16 compute through convert's VJP while the f32 parameters
// (master weights) get f32 gradients and the optimizer update stays f32. Applied after autodiff
// it would be another program (compiler::ApplyPrecisionPolicy, compile.h, says how). Null when
// there is nothing to rewrite (kF32).
absl::StatusOr<std::unique_ptr<ir::Graph>> PrecisionLoss(const runtime::Backend& backend,
                                                         const ir::Graph& loss_graph,
                                                         const ParamStore& initial,
                                                         const TrainStepOptions& options) {
  compiler::CompileOptions pre;
  pre.pipeline = backend.pipeline_options();
  pre.program.precision = options.precision;
  pre.program.master_weights = initial.names();
  std::unique_ptr<compiler::Pipeline> pipeline = compiler::ProgramPipeline(pre);
  if (pipeline->PassNames().empty()) return nullptr;
  auto loss = std::make_unique<ir::Graph>(loss_graph);
  KILN_RETURN_IF_ERROR(Annotate(pipeline->Run(*loss).status(), "TrainStep"));
  return loss;
}

// The step graph to compile (a ZeRO-1 gradient graph with shard_state) and, with model_parallel
// > 1, the program options that partition it: the mesh and every split tensor's sharding
// (*tensor_shardings). *buckets: the data-parallel all-reduces the graph issues.
absl::StatusOr<ir::Graph> BuildStep(const ir::Graph& loss, const std::vector<ParamSpec>& specs,
                                    const ParamStore& initial, const TrainStepOptions& options,
                                    compiler::ProgramOptions* program,
                                    std::map<std::string, ir::Sharding>* tensor_shardings,
                                    int* buckets) {
  if (options.shard_state) {
    KILN_RETURN_IF_ERROR(CheckZeroOptions(initial, options));
    return BuildZeroGradientGraph(loss, initial, options);
  }
  TrainStepOptions build_options = options;
  if (options.model_parallel > 1) {
    // One data-parallel bucket per gradient: a concatenation of differently split gradients
    // would be gathered whole by the partitioner.
    build_options.first_bucket_bytes = 0;
    build_options.bucket_bytes = 0;
  }
  KILN_ASSIGN_OR_RETURN(ir::Graph step, BuildStepGraph(loss, initial, build_options, buckets));
  if (options.model_parallel > 1) {
    KILN_RETURN_IF_ERROR(StepShardings(specs, initial, options, tensor_shardings));
    program->mesh = {"model", options.model_parallel};
    program->shardings = *tensor_shardings;
  }
  return step;
}

}  // namespace

std::vector<std::vector<int>> GradientBuckets(const std::vector<int64_t>& grad_bytes,
                                              int64_t first_bucket_bytes, int64_t bucket_bytes) {
  std::vector<std::vector<int>> buckets;
  std::vector<int> current;
  int64_t filled = 0;
  for (int i = static_cast<int>(grad_bytes.size()) - 1; i >= 0; --i) {
    const int64_t cap = buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (!current.empty() && filled + grad_bytes[i] > cap) {
      buckets.push_back(std::move(current));
      current.clear();
      filled = 0;
    }
    current.push_back(i);
    filled += grad_bytes[i];
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

absl::StatusOr<std::unique_ptr<TrainStep>> TrainStep::Create(runtime::Backend& backend,
                                                             const ir::Graph& loss_graph,
                                                             ParamStore initial,
                                                             const TrainStepOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::vector<ParamSpec> param_specs,
                        CheckLossGraph(loss_graph, initial, options));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> precision_loss,
                        PrecisionLoss(backend, loss_graph, initial, options));
  const ir::Graph& loss = precision_loss != nullptr ? *precision_loss : loss_graph;
  int buckets = 0;
  compiler::ProgramOptions program;
  std::map<std::string, ir::Sharding> tensor_shardings;
  KILN_ASSIGN_OR_RETURN(ir::Graph step_graph, BuildStep(loss, param_specs, initial, options,
                                                        &program, &tensor_shardings, &buckets));

  std::unique_ptr<TrainStep> t(new TrainStep());
  t->options_ = options;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend.Compile(step_graph, program);
  if (!exe.ok()) {
    return Annotate(exe.status(),
                    absl::StrCat("compiling the train step on backend ", backend.name()));
  }
  t->compile_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t->exe_ = std::move(exe).value();
  t->num_buckets_ = buckets;
  if (options.data_parallel > 1 || options.model_parallel > 1)
    t->exe_->set_collectives(options.collectives);
  t->tensor_shardings_ = std::move(tensor_shardings);
  KILN_RETURN_IF_ERROR(t->InitTensors(backend, loss, param_specs, std::move(initial)));
  KILN_RETURN_IF_ERROR(t->MakeSlots());
  t->inputs_.assign(t->in_slots_.size(), nullptr);
  t->outputs_.assign(t->out_slots_.size(), nullptr);
  t->Bind();
  return t;
}

absl::Status TrainStep::InitTensors(runtime::Backend& backend, const ir::Graph& loss,
                                    const std::vector<ParamSpec>& param_specs, ParamStore initial) {
  std::vector<ParamSpec> state_specs = OptimizerStateSpecs(options_.optimizer, param_specs);
  for (ParamSpec& spec : state_specs) {
    auto it = tensor_shardings_.find(spec.name);
    if (it != tensor_shardings_.end())
      spec.shape = compiler::sharding::LocalType({spec.dtype, spec.shape}, it->second,
                                                 {"model", options_.model_parallel})
                       .shape;
  }
  KILN_ASSIGN_OR_RETURN(state_, ZerosLike(state_specs));
  if (options_.model_parallel > 1) {
    KILN_ASSIGN_OR_RETURN(initial, Sharded(initial, initial));
  }
  params_ = std::move(initial);
  step_tensor_ = Tensor(DType::kS64, Shape{});
  rng_seed_ = Tensor(DType::kS64, Shape{});
  rng_step_ = Tensor(DType::kS64, Shape{});
  rng_seed_.data<int64_t>()[0] = static_cast<int64_t>(options_.rng_seed);
  if (options_.shard_state) return CreateZero(backend, loss, param_specs);
  for (int i = 0; i < state_.size(); ++i) {
    const Tensor& v = state_.value(i);
    state_pieces_.push_back({state_.names()[i], v.shape(), 0, v.num_elements()});
  }
  return absl::OkStatus();
}

absl::Status TrainStep::MakeSlots() {
  const ir::Graph& g = exe_->graph();
  for (int id : g.parameters()) {
    const std::string& name = g.node(id).attr_str("name");
    Slot slot{Source::kData, -1};
    if (params_.Contains(name)) {
      slot = {Source::kParam,
              static_cast<int>(std::find(params_.names().begin(), params_.names().end(), name) -
                               params_.names().begin())};
    } else if (state_.Contains(name)) {
      slot = {Source::kState,
              static_cast<int>(std::find(state_.names().begin(), state_.names().end(), name) -
                               state_.names().begin())};
    } else if (name == kStepInput) {
      slot = {Source::kStep, -1};
    } else if (name == kRngSeedInput) {
      slot = {Source::kRngSeed, -1};
    } else if (name == kRngStepInput) {
      slot = {Source::kRngStep, -1};
    } else {
      slot = {Source::kData, static_cast<int>(data_names_.size())};
      data_names_.push_back(name);
    }
    in_slots_.push_back(slot);
  }

  extra_outputs_.reserve(g.outputs().size());  // never reallocates: outputs_ points into it
  for (const ir::Output& out : g.outputs()) {
    Slot slot{Source::kData, -1};
    for (int i = 0; i < params_.size() && slot.index < 0; ++i) {
      if (UpdatedName(params_.names()[i]) == out.name) slot = {Source::kParam, i};
    }
    for (int i = 0; i < state_.size() && slot.index < 0; ++i) {
      if (UpdatedName(state_.names()[i]) == out.name) slot = {Source::kState, i};
    }
    if (slot.index < 0) {
      const ir::Type& type = g.node(out.node).type();
      slot = {Source::kData, static_cast<int>(extra_outputs_.size())};
      extra_outputs_.emplace_back(type.dtype, type.shape);
      extra_names_.push_back(out.name);
      if (out.name == options_.loss_output) loss_ = slot.index;
      if (out.name == kGradNormOutput) grad_norm_ = slot.index;
      if (out.name == kLearningRateOutput) lr_ = slot.index;
    }
    out_slots_.push_back(slot);
  }
  if (loss_ < 0 || (!options_.shard_state && (grad_norm_ < 0 || lr_ < 0))) {
    return absl::InternalError("TrainStep: the train step lacks its loss / grad_norm / lr outputs");
  }
  return absl::OkStatus();
}

void TrainStep::Bind() {
  for (size_t i = 0; i < in_slots_.size(); ++i) {
    const Slot& s = in_slots_[i];
    switch (s.source) {
      case Source::kParam:
        inputs_[i] = &params_.value(s.index);
        break;
      case Source::kState:
        inputs_[i] = &state_.value(s.index);
        break;
      case Source::kStep:
        inputs_[i] = &step_tensor_;
        break;
      case Source::kRngSeed:
        inputs_[i] = &rng_seed_;
        break;
      case Source::kRngStep:
        inputs_[i] = &rng_step_;
        break;
      case Source::kData:
        break;  // set per Run
    }
  }
  for (size_t i = 0; i < out_slots_.size(); ++i) {
    const Slot& s = out_slots_[i];
    if (s.source == Source::kParam) {
      outputs_[i] = &params_.value(s.index);  // in place: the step's outputs are in_place_of
    } else if (s.source == Source::kState) {  // their inputs (BuildTrainStep)
      outputs_[i] = &state_.value(s.index);
    } else {
      outputs_[i] = &extra_outputs_[s.index];
    }
  }
}

absl::StatusOr<StepMetrics> TrainStep::Run(const std::vector<const Tensor*>& data) {
  if (data.size() != data_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("TrainStep::Run takes ", data_names_.size(),
                                                   " data inputs, got ", data.size()));
  }
  for (size_t i = 0; i < in_slots_.size(); ++i) {
    if (in_slots_[i].source == Source::kData) inputs_[i] = data[in_slots_[i].index];
  }
  step_tensor_.data<int64_t>()[0] = step_;
  rng_step_.data<int64_t>()[0] = step_;
  KILN_RETURN_IF_ERROR(exe_->RunInto(inputs_, outputs_));
  if (zero_ != nullptr) KILN_RETURN_IF_ERROR(RunZero());
  ++step_;
  ran_ = true;
  StepMetrics m;
  m.loss = static_cast<float>(extra_outputs_[loss_].GetDouble(0));
  if (options_.data_parallel > 1) {
    // The global batch's loss: the mean of the ranks' losses over equal shares.
    KILN_RETURN_IF_ERROR(Annotate(options_.collectives->AllReduceSum(&m.loss, 1, DType::kF32),
                                  "averaging the loss"));
    m.loss /= static_cast<float>(options_.data_parallel);
  }
  if (zero_ != nullptr) {
    ZeroMetrics(m);
    return m;
  }
  m.grad_norm = static_cast<float>(extra_outputs_[grad_norm_].GetDouble(0));
  m.lr = static_cast<float>(extra_outputs_[lr_].GetDouble(0));
  return m;
}

absl::Status TrainStep::Restore(const ParamStore& params, const ParamStore& optimizer_state,
                                int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStep::Restore: step must be >= 0, got ", step));
  }
  // Check both before touching either, so a failed restore changes nothing.
  KILN_RETURN_IF_ERROR(CheckMatches(params, params_, "parameters"));
  KILN_RETURN_IF_ERROR(CheckMatches(optimizer_state, state_, "optimizer state"));
  CopyInto(params, params_);
  CopyInto(optimizer_state, state_);
  step_ = step;
  return absl::OkStatus();
}

const Tensor* TrainStep::last_output(const std::string& name) const {
  if (!ran_) return nullptr;
  for (size_t i = 0; i < extra_names_.size(); ++i) {
    if (extra_names_[i] == name) return &extra_outputs_[i];
  }
  return nullptr;
}

ir::Sharding TrainStep::ShardingOfTensor(const std::string& name, int rank) const {
  auto it = tensor_shardings_.find(name);
  return it != tensor_shardings_.end() ? it->second : ir::Sharding::Replicated(rank);
}

absl::StatusOr<ParamStore> TrainStep::Gathered(const ParamStore& local) const {
  if (options_.model_parallel <= 1) return local.Clone();
  runtime::Collectives* shard = options_.collectives;
  const compiler::sharding::Mesh mesh{"model", options_.model_parallel};
  ParamStore full;
  for (int i = 0; i < local.size(); ++i) {
    const std::string& name = local.names()[i];
    const Tensor& t = local.value(i);
    auto it = tensor_shardings_.find(name);
    if (it == tensor_shardings_.end()) {
      KILN_RETURN_IF_ERROR(full.Add(name, t.Clone()));
      continue;
    }
    Tensor all(t.dtype(), Shape{options_.model_parallel * t.num_elements()});
    KILN_RETURN_IF_ERROR(
        Annotate(shard->ShardAllGather(t.raw_data(), all.raw_data(), t.num_elements(), t.dtype()),
                 absl::StrCat("gathering '", name, "'")));
    std::vector<Tensor> shards;
    for (int r = 0; r < options_.model_parallel; ++r) {
      Tensor one(t.dtype(), t.shape());
      std::memcpy(one.raw_data(), static_cast<const uint8_t*>(all.raw_data()) + r * t.byte_size(),
                  static_cast<size_t>(t.byte_size()));
      shards.push_back(std::move(one));
    }
    KILN_ASSIGN_OR_RETURN(Tensor whole, compiler::Unshard(shards, it->second, mesh));
    KILN_RETURN_IF_ERROR(full.Add(name, std::move(whole)));
  }
  return full;
}

absl::StatusOr<ParamStore> TrainStep::Sharded(const ParamStore& full,
                                              const ParamStore& like) const {
  const compiler::sharding::Mesh mesh{"model", options_.model_parallel};
  ParamStore out;
  for (const std::string& name : like.names()) {
    KILN_ASSIGN_OR_RETURN(Tensor t, full.Get(name));
    auto it = tensor_shardings_.find(name);
    if (it != tensor_shardings_.end()) {
      KILN_ASSIGN_OR_RETURN(t, compiler::ShardOf(t, it->second, mesh, options_.model_rank));
    }
    KILN_RETURN_IF_ERROR(out.Add(name, std::move(t)));
  }
  return out;
}

absl::StatusOr<ParamStore> TrainStep::FullParams() const { return Gathered(params_); }

absl::StatusOr<ParamStore> TrainStep::FullOptimizerState() const { return Gathered(state_); }

absl::Status TrainStep::RestoreFull(const ParamStore& params, const ParamStore& optimizer_state,
                                    int64_t step) {
  if (options_.model_parallel <= 1) return Restore(params, optimizer_state, step);
  KILN_ASSIGN_OR_RETURN(ParamStore p, Sharded(params, params_));
  KILN_ASSIGN_OR_RETURN(ParamStore s, Sharded(optimizer_state, state_));
  return Restore(p, s, step);
}

}  // namespace kiln::nn
