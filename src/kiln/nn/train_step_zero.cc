// ZeRO-1 for TrainStep (train_step.h, "ZeRO-1"): the shard update executable and the step's
// reduce-scatter, norm, update and all-gather.
#include "kiln/nn/internal/train_step_zero.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"

namespace kiln::nn {

TrainStep::TrainStep() = default;
TrainStep::~TrainStep() = default;

int64_t ShardSize(const std::vector<int64_t>& sizes, int shards) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  return shards <= 0 ? total : (total + shards - 1) / shards;
}

std::vector<FlatRange> ShardRanges(const std::vector<int64_t>& sizes, int shards, int shard) {
  const int64_t s = ShardSize(sizes, shards);
  const int64_t lo = s * shard, hi = s * (shard + 1);
  std::vector<FlatRange> out;
  int64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t a = std::max(lo, offset), b = std::min(hi, offset + sizes[i]);
    if (a < b) out.push_back({static_cast<int>(i), a - offset, b - offset, a - lo});
    offset += sizes[i];
  }
  return out;
}

absl::Status CheckZeroOptions(const ParamStore& initial, const TrainStepOptions& o) {
  const int d = o.data_parallel;
  if (d < 1 || o.data_rank < 0 || o.data_rank >= d) {
    return absl::InvalidArgumentError(absl::StrCat("TrainStep: shard_state needs 0 <= data_rank (",
                                                   o.data_rank, ") < data_parallel (", d, ")"));
  }
  if (d > 1 && o.collectives == nullptr) {
    return absl::InvalidArgumentError(
        "TrainStep: shard_state needs collectives for its reduce-scatter and all-gather "
        "(runtime::Collectives, e.g. dist::CommunicatorCollectives)");
  }
  for (const ParamGroup& g : o.optimizer.param_groups) {
    if (g.freeze) {
      return absl::UnimplementedError(absl::StrCat(
          "TrainStep: shard_state with a frozen parameter group (optimizer.param_groups match '",
          g.match,
          "', freeze: true) is not built yet: ZeRO-1 shards every parameter's update; "
          "drop shard_state or the freeze (lr_scale groups work)"));
    }
  }
  std::vector<int64_t> sizes;
  for (int i = 0; i < initial.size(); ++i) {
    if (initial.value(i).dtype() != DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("TrainStep: shard_state needs f32 parameters; '", initial.names()[i],
                       "' is ", initial.value(i).TypeString()));
    }
    sizes.push_back(initial.value(i).num_elements());
  }
  for (int r = 0; r < d; ++r) {
    if (ShardRanges(sizes, d, r).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TrainStep: shard_state: ", initial.num_elements(), " parameter elements are too few to ",
          "give each of ", d, " data ranks a shard (rank ", r, " would hold none)"));
    }
  }
  return absl::OkStatus();
}

absl::Status TrainStep::CreateZero(runtime::Backend& backend, const ir::Graph& loss,
                                   const std::vector<ParamSpec>& param_specs) {
  (void)loss;
  auto z = std::make_unique<Zero>();
  z->ranks = options_.data_parallel;
  z->rank = options_.data_rank;
  if (z->ranks > 1) z->collectives = options_.collectives;
  int64_t offset = 0;
  for (int i = 0; i < params_.size(); ++i) {
    z->param_offsets.push_back(offset);
    z->param_sizes.push_back(params_.value(i).num_elements());
    offset += z->param_sizes.back();
  }
  z->shard = ShardSize(z->param_sizes, z->ranks);
  z->pieces = ShardRanges(z->param_sizes, z->ranks, z->rank);
  for (const FlatRange& r : z->pieces) z->used += r.end - r.begin;

  // This rank's optimizer state: one 1-D piece per parameter its shard overlaps.
  std::vector<ParamSpec> piece_specs;
  for (const FlatRange& r : z->pieces) {
    piece_specs.push_back(
        {param_specs[r.index].name, DType::kF32, Shape{r.end - r.begin}, Initializer::Zeros()});
  }
  const std::vector<ParamSpec> state_specs = OptimizerStateSpecs(options_.optimizer, piece_specs);
  KILN_ASSIGN_OR_RETURN(state_, ZerosLike(state_specs));
  const size_t slots = piece_specs.empty() ? 0 : state_specs.size() / piece_specs.size();
  for (size_t k = 0; k < slots; ++k) {
    for (size_t j = 0; j < z->pieces.size(); ++j) {
      const FlatRange& r = z->pieces[j];
      state_pieces_.push_back(
          {state_specs[k * z->pieces.size() + j].name, param_specs[r.index].shape, r.begin, r.end});
    }
  }

  // The update graph over this rank's shard.
  const int64_t s = z->shard;
  ir::Builder b("zero_update");
  ir::Value pshard = b.Parameter("zero/param_shard", DType::kF32, Shape{s});
  ir::Value gshard = b.Parameter("zero/grad_shard", DType::kF32, Shape{s});
  ir::Value norm = b.Parameter("zero/grad_norm", DType::kF32, Shape{});
  ir::Value step = b.Parameter(kStepInput, DType::kS64, Shape{});
  std::vector<ir::Value> state;
  for (const ParamSpec& spec : state_specs)
    state.push_back(b.Parameter(spec.name, spec.dtype, spec.shape));
  std::vector<std::string> names;
  std::vector<int> ranks;
  std::vector<ir::Value> values, grads;
  const double scale = 1.0 / z->ranks;
  for (const FlatRange& r : z->pieces) {
    const int64_t lo = r.shard_offset, hi = r.shard_offset + (r.end - r.begin);
    names.push_back(param_specs[r.index].name);
    ranks.push_back(param_specs[r.index].shape.rank());
    values.push_back(ir::Slice(pshard, {lo}, {hi}));
    ir::Value g = ir::Slice(gshard, {lo}, {hi});
    // The mean, as the unsharded data-parallel step takes it (all_reduce, then * 1/D).
    grads.push_back(z->ranks > 1 ? g * scale : g);
  }
  KILN_ASSIGN_OR_RETURN(OptimizerUpdate update,
                        BuildOptimizerUpdate(b, options_.optimizer, names, ranks, values,
                                             std::move(grads), state, step, norm));
  std::vector<ir::Value> parts = update.values;
  if (z->used < s) parts.push_back(ir::Slice(pshard, {z->used}, {s}));
  b.Output("new/zero/param_shard", parts.size() == 1 ? parts[0] : ir::Concatenate(parts, 0),
           pshard);
  for (size_t i = 0; i < state.size(); ++i)
    b.Output(UpdatedName(state_specs[i].name), update.state[i], state[i]);
  KILN_ASSIGN_OR_RETURN(ir::Graph g, b.Build());
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend.Compile(g);
  if (!exe.ok()) {
    return Annotate(exe.status(),
                    absl::StrCat("compiling the ZeRO-1 shard update on backend ", backend.name()));
  }
  z->update = std::move(exe).value();

  z->grad_shard = Tensor(DType::kF32, Shape{s});
  z->param_shard = Tensor(DType::kF32, Shape{s});
  z->flat_params = Tensor(DType::kF32, Shape{s * z->ranks});
  z->grad_norm = Tensor(DType::kF32, Shape{});
  z->norm_out = Tensor(DType::kF32, Shape{});
  z->lr_out = Tensor(DType::kF32, Shape{});
  const ir::Graph& ug = z->update->graph();
  for (int id : ug.parameters()) {
    const std::string& name = ug.node(id).attr_str("name");
    const Tensor* t = nullptr;
    if (name == "zero/param_shard") {
      t = &z->param_shard;
    } else if (name == "zero/grad_shard") {
      t = &z->grad_shard;
    } else if (name == "zero/grad_norm") {
      t = &z->grad_norm;
    } else if (name == kStepInput) {
      t = &step_tensor_;
    } else {
      t = state_.Find(name);
    }
    if (t == nullptr) return absl::InternalError("ZeRO-1 update: unknown input '" + name + "'");
    z->inputs.push_back(t);
  }
  for (const ir::Output& out : ug.outputs()) {
    Tensor* t = nullptr;
    if (out.name == "new/zero/param_shard") {
      t = &z->param_shard;
    } else if (out.name == kGradNormOutput) {
      t = &z->norm_out;
    } else if (out.name == kLearningRateOutput) {
      t = &z->lr_out;
    } else if (out.name.rfind("new/", 0) == 0) {
      t = state_.Find(out.name.substr(4));
    }
    if (t == nullptr)
      return absl::InternalError("ZeRO-1 update: unknown output '" + out.name + "'");
    z->outputs.push_back(t);
  }
  zero_ = std::move(z);
  return absl::OkStatus();
}

absl::Status TrainStep::RunZero() {
  Zero& z = *zero_;
  if (z.grads < 0) {
    for (size_t i = 0; i < extra_names_.size(); ++i) {
      if (extra_names_[i] == kZeroGradsOutput) z.grads = static_cast<int>(i);
    }
    if (z.grads < 0) return absl::InternalError("ZeRO-1: the gradient executable has no gradients");
  }
  const float* flat = extra_outputs_[z.grads].data<float>();
  float* gs = z.grad_shard.data<float>();
  const int64_t s = z.shard;
  // 1. Rank d gets the sum over the ranks of shard d of the gradients.
  if (z.collectives != nullptr) {
    KILN_RETURN_IF_ERROR(Annotate(z.collectives->ReduceScatterSum(flat, gs, s, DType::kF32),
                                  "ZeRO-1 gradient reduce-scatter"));
  } else {
    std::memcpy(gs, flat, static_cast<size_t>(s) * sizeof(float));
  }
  // 2. The global norm of the mean gradient: this shard's squares, summed over the ranks.
  const float scale = static_cast<float>(1.0 / z.ranks);
  double acc = 0;
  for (int64_t i = 0; i < z.used; ++i) {
    const float g = z.ranks > 1 ? gs[i] * scale : gs[i];
    acc += static_cast<double>(g) * g;
  }
  float sumsq = static_cast<float>(acc);
  if (z.collectives != nullptr) {
    KILN_RETURN_IF_ERROR(Annotate(z.collectives->AllReduceSum(&sumsq, 1, DType::kF32),
                                  "ZeRO-1 gradient norm all-reduce"));
  }
  z.grad_norm.data<float>()[0] = std::sqrt(sumsq);
  // 3. This rank's parameters, updated with its optimizer state.
  float* ps = z.param_shard.data<float>();
  for (const FlatRange& r : z.pieces) {
    std::memcpy(ps + r.shard_offset, params_.value(r.index).data<float>() + r.begin,
                static_cast<size_t>(r.end - r.begin) * sizeof(float));
  }
  KILN_RETURN_IF_ERROR(Annotate(z.update->RunInto(z.inputs, z.outputs), "ZeRO-1 shard update"));
  // 4. Every rank's updated shard into the parameters.
  float* all = z.flat_params.data<float>();
  if (z.collectives != nullptr) {
    KILN_RETURN_IF_ERROR(
        Annotate(z.collectives->AllGather(ps, all, s, DType::kF32), "ZeRO-1 parameter all-gather"));
  } else {
    std::memcpy(all, ps, static_cast<size_t>(s) * sizeof(float));
  }
  for (int i = 0; i < params_.size(); ++i) {
    std::memcpy(params_.value(i).data<float>(), all + z.param_offsets[i],
                static_cast<size_t>(z.param_sizes[i]) * sizeof(float));
  }
  return absl::OkStatus();
}

void TrainStep::ZeroMetrics(StepMetrics& m) const {
  m.grad_norm = zero_->norm_out.data<float>()[0];
  m.lr = zero_->lr_out.data<float>()[0];
}

int64_t TrainStep::optimizer_state_bytes() const {
  int64_t n = 0;
  for (int i = 0; i < state_.size(); ++i) n += state_.value(i).byte_size();
  return n;
}

}  // namespace kiln::nn
