// Training checkpoints: crash-safe, checksummed, asynchronous.
//
// A checkpoint is a directory `<root>/step_<N>/` holding safetensors shards (loadable by any
// safetensors reader) and `manifest.json`, which lists every tensor with its shard, dtype, shape,
// place and CRC32C, each shard's size and CRC32C, and the caller's metadata (RNG counters,
// iterator state, ...). The byte-level format is in docs/formats.md ("Checkpoints").
//
//   CheckpointOptions opts;
//   opts.keep_last = 3;        // plus every 1000th step
//   opts.keep_every = 1000;
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointManager> ckpt,
//                         CheckpointManager::Open("/runs/gpt/checkpoints", opts));
//   absl::StatusOr<Checkpoint> last = ckpt->RestoreLatest();      // NotFound on a fresh run
//   ...
//   // Each N steps: blocks only for a copy to host memory.
//   KILN_RETURN_IF_ERROR(ckpt->SaveAsync(step, named_tensors, {{"rng", rng_counter}}));
//   ...
//   KILN_RETURN_IF_ERROR(ckpt->Wait());                            // before exit
//
// Commit protocol: shards and manifest are written into `step_<N>.tmp-<nonce>`, each file is
// fsynced, then the directory, then it is renamed to `step_<N>` and the root is fsynced. A crash
// at any instant leaves every earlier committed checkpoint intact; a save that returned OK
// survives a crash. Open() deletes the leftovers of interrupted saves.
//
// Restore verifies everything it reads (manifest checksum, shard sizes, safetensors headers
// against the manifest, every tensor's CRC32C, every shard's CRC32C). Damage is DataLoss naming
// the checkpoint, the file and the tensor; RestoreLatest then falls back to the next newest
// checkpoint and says so in Checkpoint::notes.
//
// Thread-compatible: use one manager from one thread (the background writer is internal).
#ifndef KILN_TRAIN_CHECKPOINT_H_
#define KILN_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/dist/communicator.h"
#include "kiln/tensor/tensor.h"
#include "kiln/train/tensor_slice.h"
#include "nlohmann/json.hpp"

namespace kiln::train {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kCheckpointManifestName[] = "manifest.json";

struct CheckpointOptions {
  Env* env = nullptr;  // nullptr: Env::Default()
  // Retention after each save: the newest `keep_last` checkpoints, plus every step divisible by
  // `keep_every` (0: none), plus the one just written. keep_last >= 1.
  int keep_last = 3;
  int64_t keep_every = 0;
  // A shard is closed before a tensor that would take it past this many data bytes (a larger
  // tensor gets a shard of its own).
  uint64_t shard_bytes = uint64_t{1} << 30;
  // The run this manager belongs to (docs/train.md "One folder, one run"). When non-empty, every
  // save stamps it into the metadata as "run_id" (the metadata must then be a JSON object),
  // RestoreLatest skips checkpoints stamped with another run id (saying so in its notes), and
  // retention counts and deletes only this run's checkpoints. A checkpoint without a run id
  // (written before run ids existed) counts as this run's. Restore(step) loads any checkpoint.
  std::string run_id;
  // Open neither creates `root` nor cleans up interrupted saves: for readers (`kiln eval`,
  // `kiln export`) that must not change a run they only look at.
  bool read_only = false;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// One rank's piece of a tensor, for SaveSharded: `data` holds slice.num_elements() elements of
// `dtype`, row-major in the slice's own shape (slice.PieceShape()); borrowed for the call.
struct TensorPiece {
  std::string name;
  DType dtype = DType::kF32;
  Shape global_shape;
  TensorSlice slice;
  const void* data = nullptr;
};

// A restored checkpoint.
struct Checkpoint {
  int64_t step = 0;
  std::string path;                       // the step_<N> directory
  std::map<std::string, Tensor> tensors;  // by name
  nlohmann::json metadata;                // as given to Save
  // What RestoreLatest skipped on the way here, e.g.
  // "skipped step_300: DataLoss: checkpoint .../step_300: tensor 'w' in shard-00000-of-00002...".
  std::vector<std::string> notes;
};

// What the last finished save did.
struct SaveInfo {
  int64_t step = -1;
  std::string path;
  uint64_t bytes = 0;  // tensor data bytes
  int shards = 0;
  int64_t blocking_micros = 0;         // time the caller was blocked (the host copy, for SaveAsync)
  int64_t write_micros = 0;            // write + fsync + commit time
  std::vector<int64_t> deleted_steps;  // by retention
  std::vector<std::string> notes;      // retention problems (the checkpoint itself is committed)
};

class CheckpointManager {
 public:
  // Creates `root` if needed and deletes leftovers of interrupted saves (`step_*.tmp-*`); a
  // checkpoint caught mid-replacement (`step_<N>.old-*` without `step_<N>`) is put back.
  static absl::StatusOr<std::unique_ptr<CheckpointManager>> Open(const std::string& root,
                                                                 CheckpointOptions options = {});
  // Waits for an in-flight save (its error, if any, is lost here: call Wait() first).
  ~CheckpointManager();

  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Writes and commits a checkpoint of `tensors` (names unique and non-empty) and `metadata`
  // (any JSON value) at `step` >= 0, then applies retention. Returns once it is durable.
  // Replaces an existing checkpoint of the same step atomically. Waits for an in-flight async
  // save first, and returns its error instead of saving if it failed.
  absl::Status Save(int64_t step, const NamedTensors& tensors,
                    const nlohmann::json& metadata = nlohmann::json::object());

  // Like Save, but returns once `tensors` are copied into host staging buffers (reused from save
  // to save, so steady-state saves do not allocate); the caller may then change or free them.
  // Writing happens on a background thread. At most one save is in flight: this first waits for
  // the previous one, and if that one failed, returns its error (annotated) and does not start
  // this one; calling again retries. Bad arguments are reported at once.
  absl::Status SaveAsync(int64_t step, const NamedTensors& tensors,
                         const nlohmann::json& metadata = nlohmann::json::object());

  // A sharded save (docs/formats.md "Sharded checkpoints"): every rank of `comm` calls it with the
  // same step and its own pieces; rank 0's `metadata` is the checkpoint's. Each rank writes only
  // its pieces (files rank-<r>-shard-*.safetensors and its part of the manifest, rank-<r>.json,
  // each fsynced) into the step's temporary directory, which rank 0 creates; the ranks then agree
  // (an all-reduce, the barrier) that every rank's files are durable, and only then does rank 0
  // merge the parts into manifest.json and commit as Save does. A rank that fails or dies at any
  // moment leaves every committed checkpoint intact; every rank returns the same outcome (its
  // own error, or Aborted naming the failure elsewhere). Synchronous: collectives run on the
  // caller's thread. Ranks other than 0 may use a read_only manager (they never commit or
  // clean up). The pieces of one tensor, over all ranks, must tile it (checked when read). A rank
  // may pass several pieces of one tensor only as disjoint boxes (a tensor-parallel split of K
  // groups); anything else is InvalidArgument on that rank (it writes nothing; nothing commits).
  absl::Status SaveSharded(int64_t step, const std::vector<TensorPiece>& pieces,
                           const nlohmann::json& metadata, dist::Communicator& comm);

  // Allocates the SaveAsync staging buffers for tensors like these (same names, dtypes and
  // shapes) now, so the first SaveAsync only copies: call it once at startup, where the page
  // faults of a fresh allocation (about 10 us per 4 KiB page on the VMs measured) do not land in
  // a training step. Waits for an in-flight save (without consuming its status).
  void ReserveStaging(const NamedTensors& like);

  // Waits for the in-flight save, if any, and returns its status (OK if none). Each error is
  // returned exactly once, by Wait or by the next Save/SaveAsync.
  absl::Status Wait();
  bool SaveInFlight() const { return worker_.joinable(); }

  // Committed steps, ascending (directories named step_<N>; not verified).
  absl::StatusOr<std::vector<int64_t>> Steps();

  // Reads and verifies the checkpoint of `step`. NotFound if there is none; DataLoss if it is
  // damaged. Waits for an in-flight save to finish first (without consuming its status).
  absl::StatusOr<Checkpoint> Restore(int64_t step);
  // The newest checkpoint that verifies, skipping damaged ones (DataLoss or a missing file),
  // noted in Checkpoint::notes. NotFound if there are no checkpoints; DataLoss listing every
  // failure if none verifies. Other errors (permissions, I/O) are returned as they are.
  absl::StatusOr<Checkpoint> RestoreLatest();
  // Until called again with nullptr, Restore and RestoreLatest read each tensor into the tensor
  // of `into` with its name, dtype and shape (Checkpoint::tensors then shares its storage), the
  // others into fresh tensors: a trainer resumes into its resident buffers without a second copy
  // in memory. A failed restore may leave them partly overwritten. `into` is borrowed.
  void RestoreInto(const NamedTensors* into) { restore_into_ = into; }
  // Until called again with nullptr, Restore and RestoreLatest verify every tensor as always but
  // keep only those `keep` accepts (e.g. `kiln eval` drops the optimizer state unread into memory).
  void RestoreOnly(std::function<bool(const std::string& name)> keep) {
    restore_keep_ = std::move(keep);
  }

  const std::string& root() const { return root_; }
  // What Open cleaned up.
  const std::vector<std::string>& open_notes() const { return open_notes_; }
  // The last save that finished (successfully or not; Wait() first for an async one).
  const SaveInfo& last_save_info() const { return last_info_; }

 private:
  struct Job;

  CheckpointManager(std::string root, CheckpointOptions options);
  absl::Status Recover();
  // Joins the worker; its status is kept for the next Wait().
  void Join();
  absl::Status ConsumePending(int64_t next_step);
  absl::Status ValidateRequest(int64_t step, const NamedTensors& tensors,
                               const nlohmann::json& metadata, std::string* metadata_text) const;
  absl::Status WriteAndCommit(const Job& job, SaveInfo* info);
  absl::Status ApplyRetention(int64_t just_saved, SaveInfo* info);
  absl::StatusOr<Checkpoint> Load(int64_t step);
  // Load's half for a sharded (version 2) checkpoint: assembles every tensor from its pieces.
  absl::Status LoadPieces(const std::string& dir, Checkpoint& out);
  absl::Status WriteRankFiles(int64_t step, int rank, const std::string& tmp_dir,
                              const std::vector<TensorPiece>& pieces, SaveInfo* info);
  absl::Status MergeAndCommit(int64_t step, int ranks, const std::string& tmp_dir,
                              const std::string& nonce, const nlohmann::json& metadata,
                              SaveInfo* info);
  // Whether checkpoint `step` belongs to options_.run_id (see CheckpointOptions::run_id); sets
  // `other` to the run id it has when it does not. Unreadable manifests belong to no run.
  bool OfThisRun(int64_t step, std::string* other);
  absl::StatusOr<nlohmann::json> Stamp(const nlohmann::json& metadata) const;
  void EnsureStaging(const NamedTensors& like);

  std::string root_;
  CheckpointOptions options_;
  Env* env_;
  std::vector<std::string> open_notes_;

  std::thread worker_;
  absl::Status pending_status_;  // of the last joined async save, not yet reported
  int64_t pending_step_ = -1;
  SaveInfo last_info_;
  NamedTensors staging_;  // host copies for SaveAsync, reused
  const NamedTensors* restore_into_ = nullptr;
  std::function<bool(const std::string&)> restore_keep_;
};

// Reads any slice of any tensor of one checkpoint directory, whatever mesh wrote it: the pieces
// of a sharded checkpoint (or the whole tensors of an unsharded one) that overlap the slice are
// read, their CRC32C verified, and the overlap copied out. This is how a checkpoint written by N
// ranks restores onto another mesh (4 ranks -> 2, N -> one process, data parallel -> tensor
// parallel): each rank reads the slices it holds.
//
//   KILN_ASSIGN_OR_RETURN(auto r, CheckpointReader::Open(".../checkpoints/step_100"));
//   KILN_ASSIGN_OR_RETURN(Tensor w, r->ReadSlice("w1", TensorSlice::Box({0, 64}, {128, 64})));
//   KILN_ASSIGN_OR_RETURN(Tensor m, r->ReadSlice("opt/m/w1", TensorSlice::Flat(0, 4096)));
class CheckpointReader {
 public:
  // Reads and verifies the manifest (checksum, schema, and that each tensor's pieces tile it
  // exactly: DataLoss otherwise). NotFound when there is no manifest.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& step_dir,
                                                                Env* env = nullptr);
  ~CheckpointReader();

  int64_t step() const;
  const nlohmann::json& metadata() const;
  // Whether the checkpoint was written in pieces (format version 2), and by how many ranks.
  bool sharded() const;
  int ranks() const;
  // Every tensor's name, in manifest order (each once).
  std::vector<std::string> names() const;
  // A tensor's dtype and whole shape; NotFound for an unknown name.
  absl::StatusOr<std::pair<DType, Shape>> Info(const std::string& name) const;

  // The slice of tensor `name` (a tensor of slice.PieceShape()). NotFound for an unknown name,
  // InvalidArgument for a slice outside the tensor, DataLoss for damage.
  absl::StatusOr<Tensor> ReadSlice(const std::string& name, const TensorSlice& slice);
  // The same into `out`, which must have the tensor's dtype and slice.PieceShape().
  absl::Status ReadSliceInto(const std::string& name, const TensorSlice& slice, Tensor& out);

 private:
  struct Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "step_<N>" for a committed checkpoint directory name; -1 for anything else.
int64_t ParseCheckpointDirName(const std::string& name);

// The metadata of the checkpoint in directory `step_dir`, from its manifest (whose checksum is
// verified; the shards are not read). DataLoss if the manifest is damaged, NotFound if missing.
absl::StatusOr<nlohmann::json> ReadCheckpointMetadata(const std::string& step_dir,
                                                      Env* env = nullptr);

// The "run_id" of checkpoint metadata; "" when there is none.
std::string CheckpointRunId(const nlohmann::json& metadata);

}  // namespace kiln::train

#endif  // KILN_TRAIN_CHECKPOINT_H_
