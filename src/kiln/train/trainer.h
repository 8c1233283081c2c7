// The single-device training loop behind `kiln train`: builds the model and its compiled train
// step (nn/train_step.h) from a TrainConfig, feeds it batches, evaluates on the held-out split,
// logs metrics (metrics.jsonl + TensorBoard event files), checkpoints asynchronously, resumes from
// the newest good checkpoint, and stops cleanly on request (SIGTERM / SIGINT).
//
//   std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend();
//   TrainerOptions opts{.backend = cpu.get(), .log = &std::cerr};
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(config, opts));
//   KILN_ASSIGN_OR_RETURN(TrainResult r, t->Run());
//   if (r.preempted) return kExitPreempted;   // 75: a checkpoint of r.final_step was committed
//
// Output directory (docs/train.md): config.yaml (resolved), run.json (what it ran on),
// metrics.jsonl, events.out.tfevents.*, checkpoints/step_<N>/, trace.json (when profiled).
//
// Determinism: the batch order is a pure function of (data.seed, epoch) and the iterator state
// (epoch, position) is stored in every checkpoint with the step counter, so a resumed run computes
// the same losses and final weights bit for bit as an uninterrupted one (same machine, thread
// count and backend).
#ifndef KILN_TRAIN_TRAINER_H_
#define KILN_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/dist/collectives_adapter.h"
#include "kiln/dist/communicator.h"
#include "kiln/nn/model.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/executable.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/config.h"
#include "kiln/train/evaluator.h"
#include "kiln/train/mesh.h"
#include "kiln/train/metrics.h"
#include "kiln/train/model_registry.h"
#include "kiln/train/run_dir.h"
#include "kiln/train/trace.h"
#include "kiln/train/train_data.h"
#include "nlohmann/json.hpp"

namespace kiln::train {

// `kiln train` exit status when it stopped on SIGTERM/SIGINT after committing a checkpoint:
// EX_TEMPFAIL, "preempted, resumable". Re-running the same command resumes.
inline constexpr int kExitPreempted = 75;

// Installs SIGTERM and SIGINT handlers that set a process-wide flag (async-signal-safe); every
// Trainer polls it after each step. A second signal of the same kind restores the default action,
// so pressing Ctrl-C twice kills at once.
void InstallPreemptionHandlers();
bool PreemptionRequested();
void ClearPreemptionRequest();  // tests

struct TrainerOptions {
  runtime::Backend* backend = nullptr;  // borrowed; required
  std::ostream* log = nullptr;          // progress and notes; nullptr: silent
  bool tty = false;                     // one updating progress line instead of log lines
  // Profile steps [first, second) (1-based step numbers as logged): Chrome trace to
  // OUTDIR/trace.json and a breakdown on `log`.
  std::optional<std::pair<int64_t, int64_t>> profile_steps;
  bool resume = true;  // restore the newest good checkpoint of OUTDIR/checkpoints if any
  // Merged into run.json (e.g. kiln version, git commit, oneDNN version and ISA, threads: the CLI
  // knows them).
  nlohmann::json run_info;
  // Stop (as on SIGTERM) once this many steps have run in this process (0: never). Tests use it
  // to interrupt a run at a chosen step without a signal.
  int64_t stop_after_steps = 0;
  // resume = false on an OUTDIR that holds an earlier run: move that run's files to
  // OUTDIR/replaced-<UTC time>/ and start a new run (instead of refusing). Nothing is deleted.
  bool replace = false;
  // OUTDIR's files (lock, config.yaml, run.json, checkpoints, metrics, events) go through this
  // Env (borrowed; MemEnv / FaultInjectionEnv in tests); null: Env::Default(). data.source is
  // read from the real file system.
  Env* env = nullptr;
  // A multi-process job (docs/distributed.md): this rank's communicator over every rank
  // (borrowed; null or size 1: one process) and this rank's host name (run.json). The mesh comes
  // from config.mesh. Every rank builds the same step on its share of each global batch; only
  // rank 0 takes OUTDIR's lock and writes config.yaml, run.json, metrics, events, checkpoints
  // and traces, and logs (every rank runs the eval_every evaluations, so that none waits for
  // rank 0's in a collective; rank 0 alone the final one); the others resume from what rank 0
  // restored (broadcast; tensor parallel: each reads its own shards of that checkpoint).
  dist::Communicator* comm = nullptr;
  std::string host;
};

struct TrainResult {
  int64_t start_step = 0;  // restored from a checkpoint (0 on a fresh run)
  int64_t final_step = 0;
  bool preempted = false;          // stopped by a signal / RequestStop before `steps`
  std::vector<float> losses;       // the loss of each step this process ran, in order
  double examples_per_second = 0;  // over the steps this process ran (excluding the first)
  double tokens_per_second = 0;    // gpt: examples_per_second * data.seq_len; 0 otherwise
  std::optional<EvalResult> final_eval;
  std::string checkpoint;          // the last committed checkpoint directory
  std::vector<std::string> notes;  // restore notes (skipped damaged checkpoints, ...)
};

class Trainer {
 public:
  // Takes OUTDIR's lock (run_dir.h: a second trainer on the same folder is refused, naming the
  // holder's pid), loads the data, builds and compiles the model, and restores the newest good
  // checkpoint of this run (options.resume). A fresh start (resume = false) on a folder holding
  // an earlier run is refused unless options.replace. Writes config.yaml and run.json (with the
  // run id that every checkpoint of the run carries). `kiln eval` / `kiln export` use LoadRun
  // (evaluator.h) instead: no lock, no training step, no training data.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                         TrainerOptions options);
  ~Trainer();

  // Trains to config.steps (or until a stop request), then writes a final checkpoint
  // synchronously and closes the metrics sinks.
  absl::StatusOr<TrainResult> Run();

  // Asks Run to stop after the current step (thread-safe, async-signal-safe).
  void RequestStop() { stop_.store(true, std::memory_order_relaxed); }

  // Loss and accuracy on the held-out split with the current parameters (`max_batches` 0: all
  // full batches).
  absl::StatusOr<EvalResult> Evaluate(int64_t max_batches);

  const nn::TrainStep& train_step() const { return *step_; }
  const nn::Model& model() const { return *model_; }
  int64_t start_step() const { return start_step_; }
  // What Create noticed and did: skipped damaged or foreign checkpoints, the checkpoint resumed
  // from, an earlier run moved aside, ... (Run logs them).
  const std::vector<std::string>& notes() const { return notes_; }
  const std::string& run_id() const { return run_id_; }
  // The checkpoint directory restored from ("" on a fresh start).
  const std::string& restored_from() const { return restored_from_; }
  // Bytes of the asynchronous checkpoint's host copy, reserved at Create when this run will save
  // asynchronously (a checkpoint_every multiple below steps after the start step, one process);
  // 0 otherwise.
  int64_t checkpoint_staging_bytes() const { return checkpoint_staging_bytes_; }
  const Evaluator& evaluator() const { return *evaluator_; }
  const DataShape& data_shape() const { return data_.shape; }
  const Mesh& mesh() const { return mesh_; }
  // This rank's coordinates in mesh() (0, 0 in one process).
  const MeshCoords& coords() const { return coords_; }
  bool chief() const { return rank_ == 0; }

 private:
  struct Loop;  // the counters of one Run (trainer.cc)

  Trainer() = default;
  // Create, in order.
  absl::StatusOr<bool> ClaimRunDir();  // true: move an earlier run aside
  absl::Status Compile();
  absl::Status OpenCheckpoints(bool move_aside);
  absl::Status Resume();
  // init_from (init_from.h): a fresh run's parameters from another run's checkpoint; a resumed
  // run ignores it and keeps the record of its first start.
  absl::Status InitFrom();
  absl::Status EvaluateInitFrom();  // Run, before step 1 of a warm-started run
  absl::Status OpenMetrics();
  absl::Status WriteRunInfo();
  // Multi-process (trainer_dist.cc): the mesh and this rank's place in it; what rank 0 resumed
  // from, broadcast to every rank; every rank's host, gathered for run.json; this rank's share
  // of the global batch.
  absl::Status SetUpMesh();
  absl::Status SyncFromChief();
  absl::Status GatherRanks();
  absl::Status TakeShare();
  // Tensor parallel: the train step's options for this rank of the mesh, and the whole tensors
  // gathered from every model rank's shards (a collective: every rank calls it).
  absl::Status SetUpTensorParallel(nn::TrainStepOptions& step_opts, const nn::ParamStore& initial);
  absl::Status RefreshFull();
  bool tensor_parallel() const { return mesh_.model > 1; }
  // Checkpoints in pieces, every rank writing its own (any mesh of more than one rank: data
  // parallel, tensor parallel or both).
  bool sharded_saves() const { return mesh_.ranks > 1; }
  // True on every rank when any rank's `stop` is (a 4-byte max all-reduce, once per step).
  absl::StatusOr<bool> AgreeToStop(bool stop);
  absl::StatusOr<bool> AnyRank(bool flag, const std::string& what);
  // Sharded checkpoints (ranks > 1, docs/distributed.md): ranks other than 0 open OUTDIR's
  // checkpoints read-only; every rank saves its pieces (SaveShards); with shard_state every rank
  // reads its optimizer state pieces from the checkpoint resumed from (ReadStatePieces).
  absl::Status OpenCheckpointsForShards();
  absl::Status SaveShards(const nlohmann::json& meta);
  // Tensor parallel: this rank's share of the pieces of `store` (its shards), copied into `owned`.
  void TensorParallelPieces(const nn::ParamStore& store, std::deque<Tensor>& owned,
                            std::vector<TensorPiece>& pieces) const;
  absl::StatusOr<nn::ParamStore> ReadStatePieces(const std::string& checkpoint_dir);
  // Tensor parallel: this rank's shards, read from `checkpoint_dir` into the train step.
  absl::Status ReadOwnShards(const std::string& checkpoint_dir);
  bool AsyncSaveAhead() const;
  // Run, per step.
  absl::StatusOr<nn::StepMetrics> Step(int64_t number, Loop& loop);
  absl::Status CheckFinite(int64_t number, const nn::StepMetrics& m, Loop& loop);
  absl::Status Report(int64_t number, const nn::StepMetrics& m, Loop& loop);
  absl::Status MaybeEvaluate(int64_t number, Loop& loop, TrainResult& result);
  absl::Status MaybeCheckpoint(int64_t number);
  absl::Status Finish(Loop& loop, TrainResult& result);

  NamedTensors CheckpointTensors() const;
  NamedTensors ParamTensors() const;
  absl::Status Save(bool sync);
  std::string LastSavedPath() const;
  absl::Status WriteMetrics(int64_t step, const std::map<std::string, double>& scalars);
  void Log(const std::string& line);
  void Progress(int64_t step, float loss, double ex_per_s, double eta_s);
  absl::Status ReportProfile(double step_seconds_total, double input_seconds,
                             double compute_seconds, int64_t steps_profiled);

  // First member, so it (and its lock) is released last: after the checkpoint writer and the
  // metrics sinks.
  std::unique_ptr<RunDirectory> run_dir_;
  TrainConfig config_;
  TrainerOptions options_;
  std::string run_id_;
  std::string restored_from_;
  std::string hash_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<nn::TrainStep> step_;
  TrainData data_;  // data_.train feeds the steps; data_.held_out moves into evaluator_
  std::unique_ptr<Evaluator> evaluator_;
  std::unique_ptr<CheckpointManager> ckpt_;
  std::unique_ptr<MultiSink> metrics_;
  Profiler profiler_;
  int comm_track_ = -1;            // the profile's track for the communication thread (NewTrack)
  int64_t profile_peak_rss_ = -1;  // VmHWM at the end of the last profiled step (-1: none yet)
  Tensor x_, x_flat_, y_;
  // Multi-process: the mesh, this rank, its share of each batch (data parallel, mesh_.data > 1)
  // and the collectives its train step runs through.
  Mesh mesh_;
  MeshCoords coords_;
  int rank_ = 0;
  Tensor x_local_, x_local_flat_, y_local_;
  std::unique_ptr<runtime::Collectives> collectives_;
  // Tensor parallel (mesh_.model > 1): the train step holds this rank's shards; these are the
  // whole parameters and optimizer state, gathered (RefreshFull, every rank) before evaluations,
  // and what rank 0 restores a checkpoint into (checkpoints are written in pieces, SaveShards).
  nn::ParamStore full_params_, full_state_;
  nlohmann::json ranks_info_;
  nlohmann::json init_from_info_;  // run.json's "init_from" (null: none)
  bool init_from_fresh_ = false;   // weights loaded by init_from, not yet evaluated
  std::atomic<bool> stop_{false};
  int64_t start_step_ = 0;
  // The step a finished run completed (final checkpoint, evaluation and metrics all written), from
  // run.json's completed_step; -1 while the run is not finished.
  int64_t completed_step_ = -1;
  int64_t last_saved_step_ = -1;
  int64_t checkpoint_staging_bytes_ = 0;
  double compile_seconds_ = 0;
  std::vector<std::string> notes_;
  bool progress_line_open_ = false;
};

// Multiply-adds x2 of every dot_general, conv2d (forward and backward) and attention node of
// `graph` (attention: both of its products, causal or not).
double CountMatmulFlops(const ir::Graph& graph);

// The optimizer a config describes (schedule total = config.steps).
nn::OptimizerConfig BuildOptimizerConfig(const TrainConfig& config);

}  // namespace kiln::train

#endif  // KILN_TRAIN_TRAINER_H_
