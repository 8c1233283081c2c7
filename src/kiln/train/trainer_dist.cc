// The multi-process parts of the Trainer (trainer.h, docs/distributed.md): the mesh, what rank 0
// resumed from broadcast to every rank, the ranks' hosts gathered for run.json, and this rank's
// share of each global batch.
#include <unistd.h>

#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/dist/mesh_collectives.h"
#include "kiln/nn/gpt.h"
#include "kiln/nn/train_step.h"
#include "kiln/train/trainer.h"

namespace kiln::train {
namespace {

constexpr int kHostBytes = 256;

// Rank 0's bytes on every rank (`text` is read on rank 0 and replaced elsewhere).
absl::Status BroadcastString(dist::Communicator& comm, std::string& text) {
  int64_t size = static_cast<int64_t>(text.size());
  KILN_RETURN_IF_ERROR(comm.Broadcast(&size, 1, DType::kS64, 0));
  text.resize(static_cast<size_t>(size));
  if (size == 0) return absl::OkStatus();
  return comm.Broadcast(text.data(), size, DType::kU8, 0);
}

}  // namespace

absl::Status Trainer::SetUpMesh() {
  dist::Communicator* comm = options_.comm;
  const int ranks = comm != nullptr ? comm->size() : 1;
  rank_ = comm != nullptr ? comm->rank() : 0;
  KILN_ASSIGN_OR_RETURN(mesh_, ResolveMesh(config_.mesh, ranks, config_.data.batch_size));
  coords_ = CoordsOf(mesh_, rank_);
  if (!chief()) {
    options_.log = nullptr;  // rank 0 logs for the job
    options_.profile_steps.reset();
  }
  return absl::OkStatus();
}

// Rank 0 restored (or not) the newest checkpoint; every other rank takes its run id, step,
// parameters, optimizer state and data position, so that all ranks start from the same state.
absl::Status Trainer::SyncFromChief() {
  dist::Communicator& comm = *options_.comm;
  nlohmann::json state;
  if (chief()) {
    state = {{"run_id", run_id_},
             {"start_step", start_step_},
             {"last_saved_step", last_saved_step_},
             {"completed_step", completed_step_},
             {"restored_from", restored_from_},
             {"init_from_fresh", init_from_fresh_},  // every rank joins the step-0 evaluation
             {"data", start_step_ > 0 ? data_.train->State() : nlohmann::json()}};
  }
  std::string text = chief() ? state.dump() : std::string();
  KILN_RETURN_IF_ERROR(Annotate(BroadcastString(comm, text), "sharing rank 0's resume state"));
  if (!chief()) {
    state = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (state.is_discarded() || !state.is_object()) {
      return absl::InternalError("rank 0's resume state is not a JSON object");
    }
    run_id_ = state.value("run_id", std::string());
    start_step_ = state.value("start_step", int64_t{0});
    last_saved_step_ = state.value("last_saved_step", int64_t{-1});
    completed_step_ = state.value("completed_step", int64_t{-1});
    restored_from_ = state.value("restored_from", std::string());
    init_from_fresh_ = state.value("init_from_fresh", false);
  }
  if (tensor_parallel() && !restored_from_.empty()) {
    // Every rank reads its own shards from the checkpoint rank 0 resumed from (nothing is
    // broadcast); the ranks then agree that all of them could.
    absl::Status read = chief() ? absl::OkStatus() : ReadOwnShards(restored_from_);
    KILN_ASSIGN_OR_RETURN(bool failed,
                          AnyRank(!read.ok(), "agreeing that every rank read its shards"));
    if (!read.ok()) return read;
    if (failed)
      return absl::AbortedError(absl::StrCat("another rank could not read its shards from ",
                                             restored_from_, " (see that rank's error)"));
    if (!chief() && !state["data"].is_null())
      KILN_RETURN_IF_ERROR(data_.train->Restore(state["data"]));
    return absl::OkStatus();
  }
  // With shard_state each rank holds its own optimizer state pieces: only the parameters are
  // rank 0's; every rank reads its state from the checkpoint below.
  const bool zero = step_->shard_state();
  for (const auto& [name, tensor] : zero ? ParamTensors() : CheckpointTensors()) {
    Tensor t = tensor;  // shares the resident buffer
    KILN_RETURN_IF_ERROR(
        Annotate(comm.Broadcast(t, 0), absl::StrCat("broadcasting '", name, "' from rank 0")));
  }
  if (chief()) return absl::OkStatus();
  if (tensor_parallel()) {
    // A fresh start or init_from: the broadcast wrote the whole tensors; each rank keeps its
    // shards of them.
    KILN_RETURN_IF_ERROR(step_->RestoreFull(full_params_, full_state_, start_step_));
    if (!state["data"].is_null()) KILN_RETURN_IF_ERROR(data_.train->Restore(state["data"]));
    return absl::OkStatus();
  }
  nn::ParamStore state_pieces;
  if (zero && !restored_from_.empty()) {
    KILN_ASSIGN_OR_RETURN(state_pieces, ReadStatePieces(restored_from_));
  }
  // The broadcast wrote the resident parameters (and, without shard_state, the state).
  KILN_RETURN_IF_ERROR(step_->Restore(
      step_->params(), state_pieces.size() > 0 ? state_pieces : step_->optimizer_state(),
      start_step_));
  if (!state["data"].is_null()) KILN_RETURN_IF_ERROR(data_.train->Restore(state["data"]));
  return absl::OkStatus();
}

// Tensor parallel: this rank's shards of every parameter and optimizer-state tensor, read as
// boxes (TensorParallelBoxes) from whatever pieces of `checkpoint_dir` cover them (a checkpoint
// of any mesh, sharded or not), into the train step. full_params_ / full_state_ keep their
// values until the next RefreshFull (every evaluation starts with one).
absl::Status Trainer::ReadOwnShards(const std::string& checkpoint_dir) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(checkpoint_dir, run_dir_->env()));
  auto read = [&](const nn::ParamStore& like, nn::ParamStore& out) -> absl::Status {
    for (int i = 0; i < like.size(); ++i) {
      const std::string& name = like.names()[i];
      const Tensor& resident = like.value(i);
      Tensor local(resident.dtype(), resident.shape());
      const ir::Sharding sharding = step_->ShardingOfTensor(name, resident.shape().rank());
      Shape whole;
      for (const TensorParallelBox& box :
           TensorParallelBoxes(sharding, resident.shape(), mesh_.model, coords_.model, &whole)) {
        absl::StatusOr<Tensor> piece = reader->ReadSlice(name, box.global);
        if (!piece.ok())
          return Annotate(piece.status(), absl::StrCat("restoring this rank's shard of '", name,
                                                       "' from ", checkpoint_dir));
        CopyOverlap(SliceRuns(box.local, resident.shape()), piece->raw_data(),
                    SliceRuns(TensorSlice::Whole(resident.shape()), resident.shape()),
                    local.raw_data(), DTypeSize(resident.dtype()));
      }
      KILN_RETURN_IF_ERROR(out.Add(name, std::move(local)));
    }
    return absl::OkStatus();
  };
  nn::ParamStore p, s;
  KILN_RETURN_IF_ERROR(read(step_->params(), p));
  KILN_RETURN_IF_ERROR(read(step_->optimizer_state(), s));
  return Annotate(step_->Restore(p, s, start_step_),
                  absl::StrCat("restoring this rank's shards from ", checkpoint_dir));
}

// Every rank's host, pid and mesh coordinates, in rank order, for run.json.
absl::Status Trainer::GatherRanks() {
  dist::Communicator& comm = *options_.comm;
  std::vector<char> mine(kHostBytes, 0), all(static_cast<size_t>(kHostBytes) * mesh_.ranks, 0);
  std::memcpy(mine.data(), options_.host.data(),
              std::min<size_t>(options_.host.size(), kHostBytes - 1));
  KILN_RETURN_IF_ERROR(
      Annotate(comm.AllGather(mine.data(), all.data(), kHostBytes, DType::kU8), "gathering hosts"));
  int64_t pid = getpid();
  std::vector<int64_t> pids(mesh_.ranks, 0);
  KILN_RETURN_IF_ERROR(
      Annotate(comm.AllGather(&pid, pids.data(), 1, DType::kS64), "gathering process ids"));
  int64_t state_bytes = step_->optimizer_state_bytes();
  std::vector<int64_t> states(mesh_.ranks, 0);
  KILN_RETURN_IF_ERROR(Annotate(comm.AllGather(&state_bytes, states.data(), 1, DType::kS64),
                                "gathering optimizer state sizes"));
  ranks_info_ = nlohmann::json::array();
  for (int r = 0; r < mesh_.ranks; ++r) {
    const MeshCoords at = CoordsOf(mesh_, r);
    ranks_info_.push_back({{"rank", r},
                           {"host", std::string(all.data() + static_cast<size_t>(r) * kHostBytes)},
                           {"pid", pids[r]},
                           {"data", at.data},
                           {"model", at.model},
                           {"optimizer_state_bytes", states[r]}});
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::AgreeToStop(bool stop) {
  int32_t flag = stop ? 1 : 0;
  KILN_RETURN_IF_ERROR(
      Annotate(options_.comm->AllReduce(&flag, 1, DType::kS32, dist::ReduceOp::kMax),
               "agreeing on a stop request"));
  return flag != 0;
}

absl::StatusOr<bool> Trainer::AnyRank(bool flag, const std::string& what) {
  int32_t f = flag ? 1 : 0;
  KILN_RETURN_IF_ERROR(
      Annotate(options_.comm->AllReduce(&f, 1, DType::kS32, dist::ReduceOp::kMax), what));
  return f != 0;
}

absl::Status Trainer::OpenCheckpointsForShards() {
  if (!sharded_saves()) return absl::OkStatus();
  CheckpointOptions copts;
  copts.keep_last = config_.keep_last;
  copts.keep_every = config_.keep_every;
  copts.env = run_dir_->env();
  copts.read_only = true;  // rank 0 creates the root, cleans up and commits
  KILN_ASSIGN_OR_RETURN(ckpt_, CheckpointManager::Open(run_dir_->checkpoints_path(), copts));
  return absl::OkStatus();
}

// This rank's pieces: the flat shard mesh_.data cuts out of the parameters (every rank holds them
// all: each writes 1/D), and of the optimizer state (with shard_state, exactly the pieces it
// holds; without, the same cut of the whole state), so that the ranks together write each tensor
// once. Tensor parallel: see TensorParallelPieces.
absl::Status Trainer::SaveShards(const nlohmann::json& meta) {
  if (tensor_parallel()) {
    std::deque<Tensor> owned;  // the pieces' bytes, alive for the call
    std::vector<TensorPiece> pieces;
    TensorParallelPieces(step_->params(), owned, pieces);
    TensorParallelPieces(step_->optimizer_state(), owned, pieces);
    return ckpt_->SaveSharded(step_->step(), pieces, meta, *options_.comm);
  }
  const int d = static_cast<int>(coords_.data), n = static_cast<int>(mesh_.data);
  std::vector<TensorPiece> pieces;
  auto cut = [&](const nn::ParamStore& store, const std::vector<Shape>& wholes) {
    std::vector<int64_t> sizes;
    for (int i = 0; i < store.size(); ++i) sizes.push_back(store.value(i).num_elements());
    for (const nn::FlatRange& r : nn::ShardRanges(sizes, n, d)) {
      const Tensor& t = store.value(r.index);
      pieces.push_back({store.names()[r.index], t.dtype(), wholes[r.index],
                        TensorSlice::Flat(r.begin, r.end),
                        static_cast<const char*>(t.raw_data()) + r.begin * DTypeSize(t.dtype())});
    }
  };
  const nn::ParamStore& p = step_->params();
  std::vector<Shape> shapes;
  for (int i = 0; i < p.size(); ++i) shapes.push_back(p.value(i).shape());
  cut(p, shapes);
  const nn::ParamStore& s = step_->optimizer_state();
  const auto& where = step_->state_pieces();
  if (step_->shard_state()) {
    for (int i = 0; i < s.size(); ++i) {
      pieces.push_back({s.names()[i], DType::kF32, where[i].whole,
                        TensorSlice::Flat(where[i].begin, where[i].end), s.value(i).raw_data()});
    }
  } else {
    shapes.clear();
    for (int i = 0; i < s.size(); ++i) shapes.push_back(s.value(i).shape());
    cut(s, shapes);
  }
  return ckpt_->SaveSharded(step_->step(), pieces, meta, *options_.comm);
}

// Tensor parallel: a rank holds, of each tensor split along a dimension, its model coordinate's
// block of every group of that dimension (TensorParallelBoxes); the D ranks of its model column
// hold the same blocks, and every rank holds the replicated tensors. Each holder writes a share
// of the rows (dimension 0) of every block it holds: replica i of R writes rows
// [i n / R, (i + 1) n / R), so the ranks together write every element once and the data-axis
// replicas nothing twice. The pieces are boxes of the whole tensor (copied out of the local
// shard into `owned`, since a block of an inner dimension is not contiguous in it).
void Trainer::TensorParallelPieces(const nn::ParamStore& store, std::deque<Tensor>& owned,
                                   std::vector<TensorPiece>& pieces) const {
  for (int i = 0; i < store.size(); ++i) {
    const std::string& name = store.names()[i];
    const Tensor& local = store.value(i);
    const ir::Sharding sharding = step_->ShardingOfTensor(name, local.shape().rank());
    const bool split = sharding.split_dim() >= 0;
    const int replicas = split ? mesh_.data : mesh_.ranks;
    const int index = split ? coords_.data : rank_;
    Shape whole;
    for (TensorParallelBox box :
         TensorParallelBoxes(sharding, local.shape(), mesh_.model, coords_.model, &whole)) {
      if (local.shape().rank() == 0) {
        if (index != 0) continue;  // a scalar: the first replica writes it
      } else {
        const int64_t rows = box.global.sizes[0];
        const int64_t lo = rows * index / replicas, hi = rows * (index + 1) / replicas;
        if (hi == lo) continue;
        box.global.offsets[0] += lo;
        box.local.offsets[0] += lo;
        box.global.sizes[0] = box.local.sizes[0] = hi - lo;
      }
      Tensor& piece = owned.emplace_back(local.dtype(), box.global.PieceShape());
      CopyOverlap(SliceRuns(TensorSlice::Whole(local.shape()), local.shape()), local.raw_data(),
                  SliceRuns(box.local, local.shape()), piece.raw_data(), DTypeSize(local.dtype()));
      pieces.push_back({name, local.dtype(), whole, box.global, piece.raw_data()});
    }
  }
}

// With shard_state: this rank's optimizer state pieces, read from whatever pieces (or whole
// tensors) of `checkpoint_dir` cover them: a checkpoint of any mesh, sharded or not.
absl::StatusOr<nn::ParamStore> Trainer::ReadStatePieces(const std::string& checkpoint_dir) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(checkpoint_dir, run_dir_->env()));
  const auto& where = step_->state_pieces();
  const nn::ParamStore& like = step_->optimizer_state();
  nn::ParamStore out;
  for (int i = 0; i < like.size(); ++i) {
    absl::StatusOr<Tensor> t =
        reader->ReadSlice(like.names()[i], TensorSlice::Flat(where[i].begin, where[i].end));
    if (!t.ok()) {
      return Annotate(t.status(),
                      absl::StrCat("restoring this rank's optimizer state from ", checkpoint_dir));
    }
    KILN_RETURN_IF_ERROR(out.Add(like.names()[i], *std::move(t)));
  }
  return out;
}

// Tensor parallel (docs/distributed.md "Tensor parallel"): Megatron's layouts of the model, the
// mesh's collectives (data group: the gradient all-reduce; model group: the partitioner's), and
// the whole tensors the checkpoints and evaluations use.
absl::Status Trainer::SetUpTensorParallel(nn::TrainStepOptions& step_opts,
                                          const nn::ParamStore& initial) {
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model_.get());
  if (gpt == nullptr)
    return absl::UnimplementedError(
        absl::StrCat("mesh.model = ", mesh_.model,
                     ": tensor-parallel layouts exist for the gpt model only, not ",
                     config_.model.kind, "; use mesh.model: 1 (data parallel)"));
  KILN_ASSIGN_OR_RETURN(step_opts.shardings, gpt->TensorParallelShardings(mesh_.model));
  // One communicator per mesh axis: the model group's collectives run among the M ranks of this
  // data row, the gradient all-reduce among the D ranks of this model column.
  KILN_ASSIGN_OR_RETURN(collectives_,
                        dist::MeshCollectives::Create(*options_.comm, mesh_.data, mesh_.model));
  step_opts.collectives = collectives_.get();
  step_opts.data_parallel = mesh_.data;
  step_opts.model_parallel = mesh_.model;
  step_opts.model_rank = coords_.model;
  full_params_ = initial.Clone();
  KILN_ASSIGN_OR_RETURN(full_state_, nn::ZerosLike(nn::OptimizerStateSpecs(
                                         BuildOptimizerConfig(config_), model_->Params())));
  return absl::OkStatus();
}

absl::Status Trainer::RefreshFull() {
  KILN_ASSIGN_OR_RETURN(nn::ParamStore p, step_->FullParams());
  KILN_ASSIGN_OR_RETURN(nn::ParamStore s, step_->FullOptimizerState());
  // Into the existing buffers: a checkpoint's staging and restore point at them.
  for (int i = 0; i < p.size(); ++i) {
    Tensor* to = full_params_.Find(p.names()[i]);
    if (to == nullptr || to->byte_size() != p.value(i).byte_size())
      return absl::InternalError("RefreshFull: parameter '" + p.names()[i] + "' differs");
    std::memcpy(to->raw_data(), p.value(i).raw_data(), static_cast<size_t>(to->byte_size()));
  }
  for (int i = 0; i < s.size(); ++i) {
    Tensor* to = full_state_.Find(s.names()[i]);
    if (to == nullptr || to->byte_size() != s.value(i).byte_size())
      return absl::InternalError("RefreshFull: optimizer state '" + s.names()[i] + "' differs");
    std::memcpy(to->raw_data(), s.value(i).raw_data(), static_cast<size_t>(to->byte_size()));
  }
  return absl::OkStatus();
}

absl::Status Trainer::TakeShare() {
  KILN_RETURN_IF_ERROR(SliceBatch(x_, coords_.data, mesh_.data, x_local_));
  return SliceBatch(y_, coords_.data, mesh_.data, y_local_);
}

}  // namespace kiln::train
