// Writing and reading the record shards of a dataset directory (dataset_manifest.h), and the
// per-shard state that makes an import resumable after a kill.
//
//   KILN_ASSIGN_OR_RETURN(auto w, ShardWriter::Create(env, dir, "train-00000-of-00002.tfrecord"));
//   KILN_RETURN_IF_ERROR(w->Write(EncodeExample(ex)));
//   KILN_ASSIGN_OR_RETURN(ShardEntry e, w->Finish());   // DIR/.NAME.partial -> DIR/NAME
//   KILN_RETURN_IF_ERROR(SaveShardState(env, dir, e, plan, state));
//
//   // On a rerun: the shard is kept only if its state names the same plan and the file's size
//   // and CRC32C match what was recorded when it was finished.
//   KILN_ASSIGN_OR_RETURN(std::optional<FinishedShard> done, LoadShardState(env, dir, name, plan));
//
//   KILN_ASSIGN_OR_RETURN(auto r, ExampleReader::Open(env, dir +
//   "/train-00000-of-00002.tfrecord")); Example ex; while (true) { KILN_ASSIGN_OR_RETURN(bool got,
//   r->Next(&ex)); if (!got) break; ... }
//
// A shard is written to ".NAME.partial" and renamed to NAME only once it is complete, so a kill
// leaves either no NAME or a whole one (WriteShards fsyncs the shards together at the end, before
// the manifest; a power loss before that is caught by the CRC check on resume). Its state goes
// to ".kiln-import/NAME.json" after the rename.
#ifndef KILN_DATA_SHARD_IO_H_
#define KILN_DATA_SHARD_IO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/record_io.h"
#include "nlohmann/json.hpp"

namespace kiln::data {

inline constexpr char kImportStateDir[] = ".kiln-import";

class ShardWriter {
 public:
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Create(Env* env, const std::string& dir,
                                                             const std::string& file);
  // Appends one framed record.
  absl::Status Write(std::string_view payload);
  // fsyncs (unless !sync), closes and renames the file into place; the entry has no split set.
  absl::StatusOr<ShardEntry> Finish(bool sync = true);
  int64_t examples() const { return examples_; }

 private:
  ShardWriter() = default;
  Env* env_ = nullptr;
  std::string dir_, file_, tmp_;
  std::unique_ptr<AppendFile> out_;
  std::string frame_;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  int64_t examples_ = 0;
};

struct FinishedShard {
  ShardEntry entry;
  nlohmann::json state;  // what the importer saved with it (partial statistics, ...)
};

// Writes DIR/.kiln-import/<entry.file>.json: the entry, the plan fingerprint and `state`.
absl::Status SaveShardState(Env* env, const std::string& dir, const ShardEntry& entry,
                            const std::string& plan, const nlohmann::json& state);
// The finished shard `file` if its state exists, names `plan`, and the file's size and CRC32C
// match it; nullopt otherwise (logging why when a shard file was there but is not kept).
absl::StatusOr<std::optional<FinishedShard>> LoadShardState(Env* env, const std::string& dir,
                                                            const std::string& file,
                                                            const std::string& plan);

// Removes files in DIR named like shards ("<split>-NNNNN-of-NNNNN.tfrecord") or partial shards
// that are not in `keep` (left over from an import with another plan), with their states.
absl::Status RemoveStaleShards(Env* env, const std::string& dir,
                               const std::vector<std::string>& keep);

// Runs the shards of an import in order. Each planned shard that LoadShardState keeps is taken as
// it is; every other one is written by produce(index, writer, &state) and then finished and its
// state saved. Before that, DIR is created, an old dataset.json removed (the manifest is written
// last, so its presence means a complete import) and RemoveStaleShards run. `kept` (optional)
// receives how many shards were kept; on_kept(index) is called for each. The shards written are
// fsynced together at the end, in parallel (a crash before that only means rewrites on resume:
// kept shards are re-verified); `sync_seconds` (optional) receives how long that took.
struct PlannedShard {
  std::string file;
  std::string split;
};
using ProduceShardFn =
    std::function<absl::Status(size_t index, ShardWriter& writer, nlohmann::json* state)>;
absl::StatusOr<std::vector<FinishedShard>> WriteShards(
    Env* env, const std::string& dir, const std::string& plan,
    const std::vector<PlannedShard>& shards, const ProduceShardFn& produce, int* kept = nullptr,
    const std::function<void(size_t)>& on_kept = nullptr, double* sync_seconds = nullptr);

// How many shards a split of `examples` examples gets: the train split `requested` (at most
// one per example), the held-out split ceil(requested * fraction) (at least 1), none if empty.
int ShardCount(int64_t examples, int requested, double fraction, bool train);

// The split and shard plan every importer uses: items 0..n-1 permuted with
// std::mt19937_64(seed) (data::Permutation); the first round(held_out * n) form split "held_out",
// the rest "train" (each in permuted order, or ascending when `sorted`); each split is cut into
// ShardCount contiguous slices. shards[k] is written from items[k].
struct ShardPlan {
  std::vector<PlannedShard> shards;
  std::vector<std::vector<int64_t>> items;
};
ShardPlan PlanSplits(int64_t n, double held_out, int shards, uint64_t seed, bool sorted = false);

// Threads to use for `requested` (0 or less: all cores).
int ResolveThreads(int requested);

// Reads the tf.train.Example records of one shard. Every error is DataLoss naming the file and
// the record's byte offset (a truncated record included: a finished shard is never appended to).
class ExampleReader {
 public:
  static absl::StatusOr<std::unique_ptr<ExampleReader>> Open(Env* env, const std::string& path);
  // false: clean end of the file.
  absl::StatusOr<bool> Next(Example* example);
  // Like Next but returns the undecoded payload.
  absl::StatusOr<bool> NextPayload(std::string* payload);
  uint64_t offset() const { return reader_->offset(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<RecordReader> reader_;
  std::string payload_;
};

}  // namespace kiln::data

#endif  // KILN_DATA_SHARD_IO_H_
