// The training input pipeline: reads examples from a safetensors file, TFRecord shards or the
// digits CSV, keeps this host's share (per-host sharding) and one split (train / held_out),
// shuffles deterministically by (seed, epoch), batches with locked shapes, produces batches ahead
// on worker threads, and saves / restores its position so a resumed run sees exactly the batches
// an uninterrupted one would have seen.
//
//   PipelineConfig cfg;
//   cfg.source = "records:/data/digits";  // or "safetensors:/d.safetensors", "digits:...",
//                                          // "text:/usr/share/common-licenses/GPL-3" + seq_len
//   cfg.batch_size = 64; cfg.shuffle = true; cfg.seed = 1;
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<InputPipeline> p, InputPipeline::Create(cfg));
//   Tensor x(p->feature_type().dtype, p->feature_type().shape);   // allocated once
//   Tensor y(p->label_type().dtype, p->label_type().shape);
//   KILN_RETURN_IF_ERROR(p->Next(x, y));            // never ends: epochs roll over
//   std::string state = p->SaveState();             // store it in the checkpoint
//   ...
//   KILN_RETURN_IF_ERROR(p2->RestoreState(state));  // p2 now continues where p stopped
//
// Vocabulary (one name per concept, across data/ and its callers):
//   source spec     the "kind:PATH" string that says where examples come from
//                   (PipelineConfig::source, a trainer's data.source); the kinds are below.
//   example source  what a source spec opens: N examples of one fixed type, fetched by global
//                   index (internal/example_source.h, private to the pipeline).
//   dataset         a folder `kiln data import` wrote (dataset.json + tf.train.Example shards),
//                   read by DatasetReader (dataset_reader.h); a token dataset is a text import
//                   (token_dataset.h). Importers, in data/import/, write datasets.
//   record shards   TFRecord files of examples: a dataset's shards, or WriteRecordShards' own
//                   safetensors-per-record shards that "records:" reads (record_shards.cc).
//   train data      what a trainer gets from its data section: a Batcher of training batches
//                   and the held-out EvalData, each an InputPipeline (train_data.h).
// The pipeline itself, by concern: the engine (pipeline.cc: workers, prefetch, Next), epoch
// order and splits (pipeline_order.cc), saved state (pipeline_state.cc), example sources
// (example_source.cc, dataset_example_source.cc) and record shard writing (record_shards.cc).
//
// Source specs (PipelineConfig::source):
//   "safetensors:PATH"  tensors "x" (features, [N, ...]) and "y" (labels, [N, ...]) with the same
//                       first dimension N = number of examples. Any dtypes.
//   "records:GLOB|DIR"  TFRecord shards (record_io.h). A directory means every file in it (names
//                       starting with '.' skipped); otherwise the last path component may hold
//                       '*' / '?' wildcards. Files are taken in sorted name order. Each record is
//                       one example: a small safetensors blob (tensor/safetensors.h) with tensors
//                       "x" and "y" WITHOUT the example dimension (docs/formats.md "Dataset
//                       records and iterator state"). All records must have the same dtypes and
//                       shapes as the first one.
//   "dataset:DIR"       a folder `kiln data import` wrote (dataset_reader.h; docs/data.md "Training
//                       on an imported dataset"): its train split's examples, then its held_out
//                       split's, and the pipeline keeps that split (held_out_fraction does not
//                       apply). Images/DICOM: x f32 [C*H*W] (CHW, normalized per channel by the
//                       manifest's statistics); CSV: x f32 [F] (float columns z-scored); y s32
//                       the label. Text: x, y s32 [L] from each record's L + 1 tokens.
//   "tokens:DIR"        a text import (token_dataset.h): as "dataset:DIR" of kind text, and
//                       refused for any other kind; with `language` set, only that language's
//                       held-out shard.
//   "digits:PATH"       the digits CSV (digits.h): x f32 [N, 64], y s32 [N].
//   "csv:PATH"          the same file, split and batched as a trainer's plain CSV path always was
//                       (train_data.h): the held-out split is data::SplitDataset's (the first
//                       round(held_out_fraction * N) examples of a permutation drawn from
//                       mt19937_64(split_seed); train is the rest), each split's "source order"
//                       is that permuted order, and remainder may also be "wrap".
//   "text:PATH"         any file as a token stream for language models, with a byte-level
//                       tokenizer (token = byte value 0..255, vocabulary 256; no special tokens).
//                       Needs seq_len = S >= 1. The bytes are cut into N = floor(size / (S + 1))
//                       non-overlapping chunks of S + 1 tokens (a trailing partial chunk is
//                       dropped); chunk i is example i: x = s32 [S] its first S tokens, y = s32 [S]
//                       its last S (the next token of each position of x). Chunks are then
//                       sharded, split, shuffled and batched like any other examples.
//
// Example numbering: examples are numbered 0..N-1 in source order (for records: the files in
// sorted order, records in file order). Example i belongs to this host when
// i % num_shards == shard_index, and to the held-out split when
// HeldOutHash(split_seed, i) < held_out_fraction (a fixed hash of the index, so the split does not
// depend on sharding or on which process asks; about held_out_fraction of the examples, not
// exactly; csv: sources split as described above). The examples kept (this host, this split)
// make one epoch, M examples.
//
// Order within an epoch (a pure function of seed and epoch number, see docs/formats.md):
//   shuffle=false                 the kept examples in source order, every epoch.
//   shuffle, shuffle_buffer=0     a full uniform permutation drawn from mt19937_64 seeded by
//                                 MixSeed(seed, epoch).
//   shuffle, shuffle_buffer=B>0   streaming semantics: the base sequence (for records: the files in
//                                 an order permuted by (seed, epoch), each file's kept records in
//                                 order; otherwise source order) passes through a B-slot shuffle
//                                 buffer (fill B, then emit a random slot and refill it; drain in
//                                 random order at the end), as tf.data's shuffle does.
//
// Batching with locked shapes: every batch has shape [batch_size, ...example shape]
// (feature_type(), label_type()).
//   remainder="drop"  an epoch yields floor(M / batch_size) batches; the last M % batch_size
//                     examples of the epoch's order are skipped. Needs M >= batch_size.
//   remainder="wrap"  (csv: sources only) batches run on across epochs: a batch that reaches the
//                     end of an epoch's order continues with the start of the next epoch's, so no
//                     example is skipped. Needs M >= batch_size; batches_per_epoch() is
//                     floor(M / batch_size) and the state's position is in examples.
//   remainder="pad"   an epoch yields ceil(M / batch_size) batches; the missing rows of the last
//                     one have all-zero features and every label element -1 (signed-integer
//                     labels; 0 for unsigned, bool and floating-point labels). -1 is the "ignore"
//                     label: the cross_entropy op gives a label outside [0, C) loss 0 and no
//                     gradient. A mean over the batch still divides by batch_size, so the last
//                     batch's loss is scaled by last_real_examples() / batch_size.
//
// Prefetch: with prefetch = P > 0 a background thread keeps up to P finished batches ready. The
// state saved is always that of the last batch Next() returned: prefetched-but-unconsumed batches
// are not counted, and RestoreState discards them and refills from the restored position.
// prefetch = kAutoPrefetch (-1, `data.prefetch: auto`) sizes the queue from what it measures:
// it starts at 2 batches and, after every 16 batches Next() returned, sets the depth to
// 1 + ceil(longest batch production in the window / mean time between Next() calls), at least
// 2, one more if Next() waited in the window although production was on average faster than the
// consumer (bursts; with W workers a batch is finished every mean production time / W), never
// shrinking, at most 16 batches and 256 MiB of batches (and at least 2).
// A deeper queue absorbs slow batches (a shard opening, a page-cache miss); it cannot help when
// production is slower than the step on average: then the profile's verdict says input-bound.
// The depth never changes which batches come out, only when they are ready.
//
// Workers: with prefetch > 0, `workers` = W threads produce batches (reading, decoding and
// augmenting every example of a batch), each a whole batch at a time: batch numbers and
// positions are handed out in order, each batch is a pure function of (epoch, position) (the
// order of an epoch is shared, augmentation draws are keyed by example, every worker has its own
// open files), and finished batches wait until the consumer reaches their number, so the
// batches are bit-identical for any W and any timing. The queue then holds depth + W - 1
// batches (each extra worker has one in production). kAutoWorkers (`data.workers: auto`) is
// AutoWorkers(): half the cores, 1 to 8. workers = 1 is one producer thread, as before workers
// existed. With prefetch = 0 the caller produces every batch itself and workers does not apply.
//
// Augmentation (augment.h, PipelineConfig::augment): random crop, flip and normalization of
// f32 CHW features, on the worker threads; the train split gets the random draws, keyed by
// (seed, epoch, global example index) so a resumed pipeline repeats them exactly; the held_out
// split gets the centre crop and normalization only.
//
// Errors: a bad source is InvalidArgument / NotFound at Create; a record that fails its CRC or
// does not parse is DataLoss naming the file and the record's byte offset (found at Create, which
// indexes every shard, or at Next). A batch that fails in a worker is returned by the Next that
// reaches it (the batches before it come out first; no batch after it is produced). After Next
// fails, it keeps returning the same error.
//
// Thread-safety: one thread calls Next / SaveState / RestoreState; the worker threads are private.
#ifndef KILN_DATA_PIPELINE_H_
#define KILN_DATA_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/augment.h"
#include "kiln/data/dataset.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/shape.h"
#include "kiln/tensor/tensor.h"

namespace kiln::data {

// PipelineConfig::prefetch: size the prefetch queue from measured times (see above).
inline constexpr int kAutoPrefetch = -1;
// PipelineConfig::workers: AutoWorkers() threads; at most kMaxWorkers.
inline constexpr int kAutoWorkers = -1;
inline constexpr int kMaxWorkers = 64;

struct PipelineConfig {
  // "safetensors:PATH", "records:GLOB_OR_DIR", "dataset:DIR", "tokens:DIR", "digits:PATH",
  // "csv:PATH" or "text:PATH" (see the top of this file).
  std::string source;
  int64_t seq_len = 0;  // text: sources only: tokens per example window (required, >= 1)
  // tokens: sources only: just this language's held-out examples (a multilingual import's
  // dataset.json "languages"; split must be "held_out"). Empty: every example.
  std::string language;
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t seed = 0;
  // 0: a full in-memory permutation per epoch; B > 0: a B-slot streaming shuffle buffer.
  int64_t shuffle_buffer = 0;
  std::string remainder = "drop";  // "drop" | "pad" | "wrap" (csv: sources only)
  // A split with fewer than batch_size examples gives batches of all of them (feature_type()
  // then has that batch size): for evaluating a small held-out split whole.
  bool shrink_batch = false;
  int prefetch = 2;       // batches prepared ahead on the workers; 0: none; kAutoPrefetch
  int workers = 1;        // threads producing batches (prefetch > 0); kAutoWorkers
  AugmentConfig augment;  // off unless it asks for something (augment.h)
  int shard_index = 0;    // per-host sharding: keep examples i % num_shards == shard_index
  int num_shards = 1;
  // Fraction of the examples in the held-out split (0: no held-out split; train is everything).
  double held_out_fraction = 0.0;
  std::string split = "train";  // "train" | "held_out"
  // Seeds the train/held_out assignment; keep it equal for the train and held_out pipelines.
  uint64_t split_seed = 0;
};

// The dtype and full batch shape of a pipeline output.
struct TensorSpec {
  DType dtype = DType::kF32;
  Shape shape;
  std::string ToString() const { return std::string(DTypeName(dtype)) + shape.ToString(); }
  bool operator==(const TensorSpec& o) const { return dtype == o.dtype && shape == o.shape; }
};

class InputPipeline {
 public:
  static absl::StatusOr<std::unique_ptr<InputPipeline>> Create(const PipelineConfig& config,
                                                               Env* env = Env::Default());
  ~InputPipeline();  // stops the prefetch thread

  InputPipeline(const InputPipeline&) = delete;
  InputPipeline& operator=(const InputPipeline&) = delete;

  // Locked batch types: features [batch_size, ...], labels [batch_size, ...].
  const TensorSpec& feature_type() const;
  const TensorSpec& label_type() const;

  // Fills x and y, which must already have feature_type() / label_type() (InvalidArgument
  // otherwise). Never ends: after the last batch of an epoch comes the first of the next.
  absl::Status Next(Tensor& x, Tensor& y);

  // Completed epochs at the last batch returned (0 during the first epoch): 1 as soon as the
  // last batch of the first epoch has been returned.
  int64_t epoch() const;
  // The epoch the last row of the last batch returned belongs to (0 before any): the epoch of
  // that batch, which epoch() has already moved past at an epoch's end.
  int64_t epoch_of_last_batch() const;
  // Examples in the source before sharding and splitting (N above).
  int64_t source_examples() const;
  // Real (not padding) examples returned so far, over all epochs.
  int64_t examples_seen() const;
  // Rows of the last batch returned that are real examples (batch_size except for a padded one).
  int64_t last_real_examples() const;
  // Examples per epoch on this host and split (M above), and batches per epoch.
  int64_t examples_per_epoch() const;
  int64_t batches_per_epoch() const;
  // Batches the prefetch queue holds now (0 without prefetch; grows under kAutoPrefetch), and
  // what the sizing measured: mean production time per batch and mean time between Next() calls
  // (0 before it measured any).
  int prefetch_depth() const;
  double mean_produce_seconds() const;
  // Threads producing batches (0 without prefetch: the caller's thread produces them).
  int workers() const;
  double mean_step_seconds() const;

  // Small JSON (docs/formats.md "Dataset records and iterator state"): source fingerprint,
  // epoch, position in the epoch, shard and next record's file/offset, RNG counters.
  std::string SaveState() const;
  // Moves to a state from SaveState of a pipeline with the same source and config (otherwise
  // FailedPrecondition naming what differs; malformed JSON is InvalidArgument). The batches that
  // follow are exactly those the saved pipeline would have returned next.
  absl::Status RestoreState(const std::string& json);

  class Impl;

 private:
  explicit InputPipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The kAutoPrefetch rule (see the top of this file): the depth after a window in which the
// slowest batch took `produce_max` seconds to produce, a batch was finished every
// `produce_mean` seconds on average (the mean production time / workers), the consumer
// `step` seconds between Next() calls on average and waited `wait_share` of that time. Never
// below `current`, never above `max_depth`.
int AutoPrefetchDepth(int current, int max_depth, double produce_max, double produce_mean,
                      double step, double wait_share);

// kAutoWorkers: half the cores (std::thread::hardware_concurrency), at least 1, at most 8.
int AutoWorkers();

// The hash behind the train / held_out split: a value in [0, 1) for example `index`.
double HeldOutHash(uint64_t split_seed, int64_t index);

// Writes `x` ([N, ...]) and `y` ([N, ...]) as num_shards TFRecord shards in `dir` (created if
// missing), named "data-00000-of-00004.tfrecord", ...: shard k holds the contiguous examples
// [k*N/num_shards, (k+1)*N/num_shards), so reading the shards in name order gives the examples in
// their original order. Each record is the example's safetensors blob ("x", "y", no example
// dimension). Returns the paths written.
absl::StatusOr<std::vector<std::string>> WriteRecordShards(const Tensor& x, const Tensor& y,
                                                           const std::string& dir, int num_shards,
                                                           Env* env = Env::Default());
// The same for an in-memory classification dataset (x = features f32 [N, F], y = labels s32 [N]).
absl::StatusOr<std::vector<std::string>> WriteRecordShards(const Dataset& dataset,
                                                           const std::string& dir, int num_shards,
                                                           Env* env = Env::Default());

// One example as a record payload, and back (used by WriteRecordShards and the reader).
absl::StatusOr<std::string> SerializeExample(const Tensor& x, const Tensor& y);
absl::Status ParseExample(const std::string& bytes, const std::string& source, Tensor* x,
                          Tensor* y);

}  // namespace kiln::data

#endif  // KILN_DATA_PIPELINE_H_
