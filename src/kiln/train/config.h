// The `kiln train` configuration: a YAML file, `--set key.sub=value` overrides, validation that
// names the bad key (as a dotted path) and the allowed values, the resolved config as YAML, and a
// stable hash of it (recorded in run.json and every checkpoint's metadata).
//
//   KILN_ASSIGN_OR_RETURN(TrainConfig c, LoadTrainConfig("examples/mlp_digits.yaml",
//                                                        {"steps=60", "optimizer.lr=0.05"}));
//   std::string yaml = ConfigToYaml(c);   // every field, defaults filled in
//   std::string hash = ConfigHash(c);     // 16 hex digits of FNV-1a over ConfigToYaml(c)
//
// docs/train.md has the full reference. Errors look like
//   "optimizer.kind: 'adam' is not one of sgd, adamw"
//   "model.widht: unknown key (allowed: kind, hidden, widths, ...)"
// yaml-cpp throws; every exception is caught here and becomes InvalidArgument.
#ifndef KILN_TRAIN_CONFIG_H_
#define KILN_TRAIN_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"

namespace kiln::train {

struct ModelConfig {
  std::string kind = "mlp";                // mlp | cnn | vit | gpt | recommender
  std::vector<int64_t> hidden = {64};      // mlp
  std::vector<int64_t> widths = {16, 32};  // cnn
  int64_t blocks_per_stage = 1;            // cnn
  int64_t patch = 2, dim = 32, depth = 2, heads = 2, mlp_ratio = 4;  // vit
  double dropout = 0.0;                                              // vit, gpt
  // gpt (Hugging Face GPT-2 names; nn/gpt.h). n_ctx: rows of the position table, 0 = data.seq_len
  // (must be >= data.seq_len). vocab_size: 256 for the byte-level text: source (at least 256).
  int64_t n_layer = 2, n_head = 2, n_embd = 64, n_ctx = 0, vocab_size = 256;
  // The image layout of the dataset's feature vectors (cnn, vit): channels * height * width must
  // equal the number of features.
  int64_t channels = 1, height = 8, width = 8;
  // recommender (nn/recommender.h): rows of each sparse feature's embedding table (in the data's
  // id-column order; a clicks dataset's extra.tables), the embedding width, the hidden widths of
  // the bottom (dense features) and top MLPs, and the interaction (dot | concat). The dense
  // features are the data's columns after the ids.
  std::vector<int64_t> tables;
  int64_t embed_dim = 16;
  std::vector<int64_t> bottom = {32};
  std::vector<int64_t> top = {32};
  std::string interaction = "dot";
};

// data.augment (data/augment.h): image augmentation of f32 CHW features on the input pipeline's
// producing thread, laid out by model.channels/height/width.
struct AugmentSection {
  bool random_crop = false;        // data.augment.random_crop given
  std::vector<int64_t> crop_size;  // random_crop.size [H, W]: must be the model's (empty: it)
  int64_t padding = 0;             // random_crop.padding
  bool flip_horizontal = false;
  std::vector<double> mean, std;  // normalize.mean / normalize.std, one per channel
  bool enabled() const { return random_crop || flip_horizontal || !mean.empty(); }
};

struct DataConfig {
  // A labeled CSV path (.csv or .csv.gz, digits layout: 64 features then a label), loaded in
  // memory; or an input-pipeline source "digits:PATH", "records:GLOB_OR_DIR",
  // "safetensors:PATH", "text:PATH" (byte-level tokens, for model.kind gpt; data/pipeline.h).
  std::string source;
  int64_t batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  double held_out_fraction = 0.2;
  // What happens to an epoch's last partial batch: drop it, wrap (CSV path only: fill it from the
  // next epoch's first rows) or pad (pipeline sources only: zero rows with label -1). Batches
  // always have the locked shape [batch_size, features].
  std::string remainder = "drop";
  // Input-pipeline sources only (digits:, records:, safetensors:; see data/pipeline.h).
  int64_t shuffle_buffer = 0;  // 0: a full permutation per epoch
  // Batches prepared ahead on a background thread; -1 = `auto` (the default): sized from the
  // measured step and input times (data/pipeline.h).
  int prefetch = -1;
  // Threads producing the training batches (reading, decoding, augmenting); -1 = `auto` (the
  // default: half the cores, 1 to 8). Never changes which batches come out (data/pipeline.h).
  int workers = -1;
  AugmentSection augment;
  int64_t num_classes = 0;  // 0: infer (CSV labels; digits: 10)
  // text: sources (model.kind gpt): tokens per training window; each example is a non-overlapping
  // chunk of seq_len + 1 bytes of the file (data/pipeline.h).
  int64_t seq_len = 0;
};

// optimizer.param_groups[i] (nn::ParamGroup): parameters whose name matches `match` (fnmatch,
// '*' crosses '/'; the first matching group wins) train at lr * lr_scale, or not at all (freeze).
struct ParamGroupSection {
  std::string match;
  double lr_scale = 1.0;
  bool freeze = false;
};

struct OptimizerSection {
  std::string kind = "sgd";   // sgd | adamw
  double lr = 0.1;            // >= 0 (0 trains nothing: kiln train --validate-first refuses it)
  double momentum = 0.0;      // sgd
  double weight_decay = 0.0;  // sgd: L2; adamw: decoupled
  std::vector<double> betas = {0.9, 0.999};  // adamw
  double eps = 1e-8;                         // adamw
  double clip_norm = 0.0;                    // > 0: clip by global norm
  std::vector<ParamGroupSection> param_groups;
  // ZeRO-1 (docs/distributed.md): shard the optimizer state over the data-parallel ranks. How a
  // run is laid out, not what it trains: not part of the config hash.
  bool shard_state = false;
};

struct ScheduleSection {
  std::string kind = "constant";  // constant | linear_warmup | cosine
  int64_t warmup_steps = 0;
  double min_lr = 0.0;  // linear_warmup / cosine: reached at `steps`
};

// The slice as a mesh with named axes (docs/distributed.md): data x model must equal the number
// of ranks the job runs on. data 0: all the ranks. model > 1 (tensor parallel) is not built yet.
struct MeshConfig {
  int64_t data = 0;
  int64_t model = 1;
};

// Warm start from another run's checkpoint (init_from.h; docs/train.md "init_from"): parameters
// only, before step 1 of a fresh run; a run that resumes from its own checkpoint ignores it.
struct InitFromConfig {
  std::string checkpoint;                    // a run directory or its checkpoints/step_<N>; "": off
  std::vector<std::string> include = {"*"};  // fnmatch patterns over the model's parameter names
  std::vector<std::string> exclude;          // left at their fresh initialization
  std::map<std::string, std::string> rename;  // checkpoint-name prefix -> model-name prefix
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimizerSection optimizer;
  ScheduleSection schedule;
  // f32 | mixed_bf16 | bf16: the compute precision of the train step (compiler::PrecisionPolicy,
  // applied by nn::TrainStep). Parameters and optimizer state stay f32 under every policy.
  std::string precision = "f32";
  int64_t steps = 100;
  int64_t eval_every = 0;    // 0: only at the end
  int64_t eval_batches = 0;  // 0: the whole held-out split (full batches)
  // recommender: K of the per-user recall@K in every evaluation (train/evaluator.h).
  int64_t eval_recall_k = 10;
  int64_t checkpoint_every = 0;  // 0: only at the end (and on preemption)
  int keep_last = 3;
  int64_t keep_every = 0;
  int64_t log_every = 10;
  std::string output_dir = "runs/train";
  uint64_t seed = 0;  // parameter init and dropout
  // Divergence: training stops with an error once the loss or the gradient norm has been
  // non-finite (NaN/inf) this many steps in a row, or at once when the parameters themselves
  // become non-finite. A non-finite checkpoint is never committed.
  int64_t nonfinite_patience = 3;
  // > 0: the compiled train step's arena must fit in this many MiB; when it would not, the
  // compiler rematerializes (recomputes in the backward pass) cheap activations until it does
  // (compiler/passes/remat.h; results are bit-identical, so it is not part of the config hash).
  int64_t memory_limit_mib = 0;
  // Not part of the config hash: the same config trains the same examples on any mesh.
  MeshConfig mesh;
  // In the config hash only when checkpoint is set (older runs keep their hash).
  InitFromConfig init_from;
};

// Parses YAML text; `source` names it in errors. `overrides` are "dotted.key=value" strings, the
// value parsed as YAML (so `model.hidden=[128,64]` works), applied before validation.
// Errors name where the bad value came from: "SOURCE: key: ..." for the text, "--set k=v: key:
// ..." for an override, "SOURCE:LINE: ..." for a key given twice in one mapping (yaml-cpp would
// silently keep the first). When overrides shorten `steps` below schedule.warmup_steps (and do
// not set the warmup themselves), the warmup is clamped to steps / 10 and `notes` (if given)
// says so; otherwise warmup_steps >= steps is an error naming the key to set.
absl::StatusOr<TrainConfig> ParseTrainConfig(const std::string& yaml_text,
                                             const std::string& source,
                                             const std::vector<std::string>& overrides = {},
                                             std::vector<std::string>* notes = nullptr);
// Reads `path` through `env` (null: Env::Default()) and parses it. A relative data.source is
// resolved against the current directory first and then the config file's directory.
absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path,
                                            const std::vector<std::string>& overrides = {},
                                            std::vector<std::string>* notes = nullptr,
                                            Env* env = nullptr);

// Range and consistency checks (also run by Parse/Load). InvalidArgument naming the key.
absl::Status ValidateTrainConfig(const TrainConfig& config);

// The resolved config as YAML (every field of every model kind; parses back to the same config).
std::string ConfigToYaml(const TrainConfig& config);
// 16 lowercase hex digits: FNV-1a 64 of the resolved YAML with output_dir blanked (moving a run
// does not change its hash). Keys added after a model kind existed (the gpt keys for other kinds,
// data.seq_len when 0, nonfinite_patience at its default) are left out of the hashed text, so a
// run's hash is the same as before those keys existed.
std::string ConfigHash(const TrainConfig& config);

}  // namespace kiln::train

#endif  // KILN_TRAIN_CONFIG_H_
