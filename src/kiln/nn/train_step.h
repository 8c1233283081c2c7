// A compiled training step with parameters and optimizer state resident between steps, for any
// optimizer config (optim.h), clipping and schedules.
//
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, model.TrainLossGraph(32));
//   KILN_ASSIGN_OR_RETURN(ParamStore params, InitParams(model.Params(), seed));
//   KILN_ASSIGN_OR_RETURN(auto step, TrainStep::Create(*backend, loss, std::move(params),
//                                                      {.optimizer = adamw, .rng_seed = seed}));
//   for (...) {
//     KILN_ASSIGN_OR_RETURN(StepMetrics m, step->Run({&x, &labels}));   // m.loss, m.lr, ...
//   }
//   // Checkpoint: step->params(), step->optimizer_state(), step->step(); resume with Restore().
//
// One step is one Executable::RunInto over ONE set of parameter and state buffers: the step
// graph's new values are in_place_of the values they replace (BuildTrainStep), and the same
// tensors are passed as inputs and outputs, so the update is written in place and a step
// allocates nothing. The compiler orders each update after every other read of its parameter;
// an update it cannot write in place (executable().num_in_place_outputs() counts those it can)
// is computed in a staging buffer and copied over at the end of the step, with the same result. The
// step counter t (fed as "opt/step" and, when the loss graph has dropout, as "rng/step" with
// "rng/seed" = rng_seed) advances by one per Run; a run resumed with Restore(..., t) therefore
// computes bit-identical steps.
//
// Mixed precision: options.precision other than kF32 rewrites the loss graph before autodiff
// (the compiler's program pipeline, compiler::ProgramPipeline, with the backend's pipeline
// switches, so its "mixed-precision" pass is dumped and disabled by name: the JAX/jmp recipe).
// Matmuls and convolutions (and, under kBf16, elementwise math) compute in bf16 forward and
// backward, through convert's VJP; parameters stay f32 master weights, their gradients arrive in
// f32, and the optimizer update and its state stay f32. Reductions, softmax, norms and the loss
// stay f32. The loss graph must take f32 parameters then (InvalidArgument otherwise: a policy is
// for f32 models).
//
// Data parallel: with options.data_parallel = D > 1, each of D ranks runs the same step on its
// B/D share of the global batch, and the step graph averages the f32 gradients over the ranks
// before the norm, clipping and update: all_reduce (sum) ops, then * 1/D (exact for D a power of
// two, like the Communicator's mean). Consecutive gradients, in reverse parameter order (the
// order backward produces them), are packed into buckets of at most first_bucket_bytes (the
// first) and bucket_bytes (the rest; a larger gradient is a bucket of its own): one all_reduce
// per bucket over the concatenated, flattened gradients, in that fixed order, so every rank
// issues the same collectives and results repeat bit for bit (options.min_buckets lowers the
// caps for a small model). On a backend that runs collectives asynchronously (the cpu backend:
// compiler::BackendTraits::async_collectives) each all_reduce starts right after its bucket's
// last gradient, on the executable's communication thread, while the rest of the backward pass
// runs, and is waited for before the first kernel that reads it (the norm, the update); the
// reference backend runs them in place, synchronously. options.collectives (size D) executes them;
// Run also averages the loss over the ranks, so StepMetrics are those of the global batch
// (grad_norm is, since it is taken after the all-reduce). Other outputs (last_output) stay
// per-rank.
//
// ZeRO-1 (options.shard_state): the optimizer state is sharded over the D data ranks. The
// parameters, flattened and concatenated in order (P elements), are cut into D shards of
// S = ceil(P / D) elements (ShardRanges); rank d keeps the optimizer state of shard d only, as one
// piece per parameter the shard overlaps (optimizer_state() then holds those 1-D pieces, named as
// the whole state tensors; StatePieces() says where each lies). A step is two executables and
// two collectives: the gradient executable (forward and backward, the f32 gradients flattened
// into one f32[D S] buffer), a reduce-scatter (sum) that leaves rank d the sum of shard d, the
// squared norm of the averaged shard summed over the ranks (a 4-byte all-reduce: the global
// grad_norm, for clipping), the update executable (norm, clipping, schedule and optimizer on the
// pieces of shard d: BuildOptimizerUpdate), and an all-gather of the updated shards into the
// parameters. Per element the gradient mean and the update are those of the unsharded step; only
// the norm sums in another order. Needs f32 parameters and options.collectives (its
// ReduceScatterSum and AllGather, over the D data ranks) when D > 1.
//
// Tensor parallel: with options.model_parallel = M > 1 the parameters named in
// options.shardings (e.g. nn::Gpt::TensorParallelShardings, Megatron's layouts) are split over
// M ranks. The whole step graph (forward, backward, clipping, update) is annotated, the
// optimizer state like its parameter, and partitioned into the per-rank program by the compile
// (compiler::ProgramOptions::mesh and shardings: the "sharding-propagation" and
// "spmd-partitioner" passes of compiler::Compile's program pipeline): each rank holds and updates
// only its shards, and the program's collectives (the partitioner's all-reduces, all-gathers) run
// over the model ranks. The loss and grad_norm outputs are replicated, so they equal the
// one-process step's. With D > 1 as well (a data x model mesh) every gradient is its own
// data-parallel bucket (buckets of concatenated shards would need regathering).
#ifndef KILN_NN_TRAIN_STEP_H_
#define KILN_NN_TRAIN_STEP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/compiler/passes/mixed_precision.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/sharding.h"
#include "kiln/nn/optim.h"
#include "kiln/nn/params.h"
#include "kiln/runtime/executable.h"

namespace kiln::nn {

struct TrainStepOptions {
  OptimizerConfig optimizer;
  std::string loss_output = "loss";
  uint64_t rng_seed = 0;  // fed to "rng/seed" when the loss graph takes it
  // Compute precision of the loss and its gradient (see the header comment).
  compiler::PrecisionPolicy precision = compiler::PrecisionPolicy::kF32;
  // Data parallel (see the header comment): the ranks the gradients are averaged over, and the
  // collectives that run it (borrowed; size() must be data_parallel when it is > 1).
  int data_parallel = 1;
  runtime::Collectives* collectives = nullptr;
  int64_t bucket_bytes = 25 << 20;
  int64_t first_bucket_bytes = 1 << 20;
  // Smaller buckets for a small model, so that there is something to overlap: both caps are
  // lowered to max(kMinBucketCapBytes, ceil(total gradient bytes / min_buckets)) when that is
  // smaller (the GPT example's 471 KiB of gradients would otherwise be one bucket, which can only
  // start after the whole backward pass). 0 or 1: the caps as given.
  int min_buckets = 4;
  // ZeRO-1 (see the header comment): shard the optimizer state over the data_parallel ranks;
  // this rank is shard data_rank (0 <= data_rank < data_parallel).
  bool shard_state = false;
  int data_rank = 0;
  // Tensor parallel (see the header comment): the parameters named in `shardings`
  // (ir/sharding.h, over mesh axis "model") are split over model_parallel ranks. `collectives`
  // must then run the mesh-axis collectives over those ranks (num_shards() == model_parallel;
  // dist::MeshCollectives for a data x model mesh); model_rank is this rank's
  // place among them, used only to cut the initial values (the program is the same on every
  // rank).
  int model_parallel = 1;
  int model_rank = 0;
  std::map<std::string, ir::Sharding> shardings;
};

// ZeRO-1's partition of tensors of `sizes` elements, flattened and concatenated in order, into
// `shards` shards of ShardSize elements: the part of each tensor in shard `shard`, as the flat
// range [begin, end) of tensor `index`, at `shard_offset` in the shard (empty parts left out).
struct FlatRange {
  int index = 0;
  int64_t begin = 0, end = 0, shard_offset = 0;
};
int64_t ShardSize(const std::vector<int64_t>& sizes, int shards);  // ceil(sum / shards)
std::vector<FlatRange> ShardRanges(const std::vector<int64_t>& sizes, int shards, int shard);

// The smallest bucket cap min_buckets lowers the caps to (64 KiB: below it an all-reduce costs
// about its latency whatever its size).
inline constexpr int64_t kMinBucketCapBytes = int64_t{64} << 10;

// The gradient buckets of data-parallel training: indices into the parameter list, in the order
// the all-reduces are issued (see the header comment).
std::vector<std::vector<int>> GradientBuckets(const std::vector<int64_t>& grad_bytes,
                                              int64_t first_bucket_bytes, int64_t bucket_bytes);

struct StepMetrics {
  float loss = 0;       // before the update
  float grad_norm = 0;  // global L2 norm before clipping
  float lr = 0;         // the learning rate this update used
};

class TrainStep {
 public:
  // `loss_graph` takes the parameters in `initial` (by name, any order in the graph), data
  // inputs, and optionally "rng/seed" and "rng/step" (s64[]); it outputs `loss_output`. Every
  // parameter of `initial` is trained; the graph's other parameters are the data inputs, in
  // graph parameter order. InvalidArgument for an unknown parameter or a type mismatch.
  static absl::StatusOr<std::unique_ptr<TrainStep>> Create(runtime::Backend& backend,
                                                           const ir::Graph& loss_graph,
                                                           ParamStore initial,
                                                           const TrainStepOptions& options);

  // One update on one batch (`data` in data_inputs() order). Advances step() by one.
  absl::StatusOr<StepMetrics> Run(const std::vector<const Tensor*>& data);

  // Replaces parameters, optimizer state and the step counter (a checkpoint restore): every
  // tensor must be present by name with the resident tensor's dtype and shape; values are
  // copied into the resident buffers.
  absl::Status Restore(const ParamStore& params, const ParamStore& optimizer_state, int64_t step);

  // Tensor parallel: params() and optimizer_state() hold this rank's shards; these gather the
  // whole tensors (a collective over the model ranks: every one of them must call it) and
  // restore from whole tensors (each rank keeps its shards). With model_parallel 1 they are
  // copies of params() / optimizer_state() and Restore.
  absl::StatusOr<ParamStore> FullParams() const;
  absl::StatusOr<ParamStore> FullOptimizerState() const;
  absl::Status RestoreFull(const ParamStore& params, const ParamStore& optimizer_state,
                           int64_t step);
  // The sharding of parameter or optimizer-state tensor `name` (replicated when not split).
  ir::Sharding ShardingOfTensor(const std::string& name, int rank) const;

  const ParamStore& params() const { return params_; }
  const ParamStore& optimizer_state() const { return state_; }
  // Where each optimizer_state() tensor lies in the whole state tensor of its name: the whole
  // shape (its parameter's) and the flat range [begin, end) it holds; the whole range without
  // shard_state.
  struct StatePiece {
    std::string name;
    Shape whole;
    int64_t begin = 0, end = 0;
  };
  const std::vector<StatePiece>& state_pieces() const { return state_pieces_; }
  bool shard_state() const { return options_.shard_state; }
  // Bytes of optimizer state this rank holds (about 1/D of the whole with shard_state).
  int64_t optimizer_state_bytes() const;
  int64_t step() const { return step_; }
  // The value another output of the loss graph had in the last Run (nullptr if none by that
  // name or before the first Run).
  const Tensor* last_output(const std::string& name) const;

  const std::vector<std::string>& data_inputs() const { return data_names_; }
  const runtime::Executable& executable() const { return *exe_; }
  runtime::Executable& mutable_executable() { return *exe_; }
  const ir::Graph& train_step_graph() const { return exe_->graph(); }
  const TrainStepOptions& options() const { return options_; }
  double compile_seconds() const { return compile_seconds_; }
  // The all_reduce ops the step graph issues per step (0 unless data_parallel > 1).
  int num_gradient_buckets() const { return num_buckets_; }

 private:
  struct Zero;  // ZeRO-1's executables and buffers (train_step_zero.cc)
  TrainStep();
  // Create's steps after compiling: the resident parameters, optimizer state and counters
  // (ZeRO-1's executables too), then the input/output tables of the executable.
  absl::Status InitTensors(runtime::Backend& backend, const ir::Graph& loss,
                           const std::vector<ParamSpec>& param_specs, ParamStore initial);
  absl::Status MakeSlots();
  absl::Status CreateZero(runtime::Backend& backend, const ir::Graph& loss,
                          const std::vector<ParamSpec>& param_specs);
  absl::Status RunZero();
  void ZeroMetrics(StepMetrics& m) const;
  // Points the input/output tables at the parameter and state buffers.
  void Bind();
  absl::StatusOr<ParamStore> Gathered(const ParamStore& local) const;
  absl::StatusOr<ParamStore> Sharded(const ParamStore& full, const ParamStore& like) const;

  TrainStepOptions options_;
  std::unique_ptr<runtime::Executable> exe_;
  ParamStore params_, state_;
  int64_t step_ = 0;
  Tensor step_tensor_, rng_seed_, rng_step_;

  // Graph inputs: for each, where its tensor comes from.
  enum class Source { kParam, kState, kData, kStep, kRngSeed, kRngStep };
  struct Slot {
    Source source;
    int index;  // into the param/state store or the data list
  };
  std::vector<Slot> in_slots_;
  std::vector<Slot> out_slots_;  // kParam/kState: new value; kData: index into extra_outputs_
  std::vector<std::string> data_names_;
  std::vector<std::string> extra_names_;
  std::vector<Tensor> extra_outputs_;
  int loss_ = -1, grad_norm_ = -1, lr_ = -1;  // indices into extra_outputs_
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor*> outputs_;
  bool ran_ = false;
  double compile_seconds_ = 0;
  int num_buckets_ = 0;
  // Tensor parallel: the sharding of every split parameter and optimizer-state tensor.
  std::map<std::string, ir::Sharding> tensor_shardings_;
  std::vector<StatePiece> state_pieces_;
  std::unique_ptr<Zero> zero_;

 public:
  ~TrainStep();
};

}  // namespace kiln::nn

#endif  // KILN_NN_TRAIN_STEP_H_
