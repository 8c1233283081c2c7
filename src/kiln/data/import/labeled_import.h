// What the importers of labeled files (`kiln data import images`, `... dicom`) share after each
// item is decoded: the train/held_out split and shard plan (PlanSplits), decoding in blocks on a
// thread pool, the error policy, per-shard resume state (statistics, label counts, source CRCs,
// skipped items) and, from the finished shards, the manifest's shards, statistics, label counts
// and skipped list. DecodeLabeledFile is the per-item prologue and epilogue they share around their
// own pixel decoder: read the file, CRC it, count the pixels' statistics, encode the record.
//
//   LabeledImport li;
//   li.out_dir = o.out_dir; li.items = files.size(); li.num_labels = labels.size(); ...
//   li.key = [&](int64_t i) { return files[i].rel; };
//   li.label = [&](int64_t i) { return files[i].label; };
//   li.decode = [&](int64_t i) {
//     return DecodeLabeledFile(env, o.src_dir, files[i].rel, o.channels, files[i].label,
//                              files[i].rel, [&](const std::string& bytes) { ... pixels ... });
//   };
//   KILN_ASSIGN_OR_RETURN(LabeledShards s, WriteLabeledShards(env, li, progress));
//   DatasetManifest m;  ... kind, features, labels, import options ...
//   s.FillManifest(&m);
#ifndef KILN_DATA_IMPORT_LABELED_IMPORT_H_
#define KILN_DATA_IMPORT_LABELED_IMPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/import/image_import.h"
#include "kiln/data/import_util.h"
#include "nlohmann/json.hpp"

namespace kiln::data {

// One decoded item: its record (empty when `error` is set), its source's CRC32C and statistics.
struct LabeledDecode {
  std::string payload, error;
  uint32_t crc = 0;
  ChannelStats stats;
};

// Turns a source file's bytes into its HWC pixels (height x width x channels of the import).
using PixelDecoder = std::function<absl::StatusOr<std::vector<uint8_t>>(const std::string& bytes)>;

// Reads src_dir/rel, keeps its CRC32C, decodes it with `pixels`, adds the pixels to the item's
// statistics (`channels` interleaved) and encodes the record {"image": the pixels, "label",
// "path"}. A read or decode failure is the LabeledDecode's error (its status message).
LabeledDecode DecodeLabeledFile(Env* env, const std::string& src_dir, const std::string& rel,
                                int channels, int64_t label, const std::string& path,
                                const PixelDecoder& pixels);

struct LabeledImport {
  std::string out_dir;
  int64_t items = 0;  // numbered 0..items-1, in the importer's sorted order
  size_t num_labels = 0;
  int channels = 1;  // of the statistics
  int shards = 4;
  double held_out = 0.1;
  uint64_t seed = 0;
  int threads = 1;
  std::string on_error = "fail";  // "fail" or "skip"
  int64_t block_per_thread = 32;  // items decoded per thread between writes
  std::string plan_fingerprint;   // identifies the plan: a changed one rewrites every shard
  std::function<std::string(int64_t)> key;  // the source's name: CRC map key, in `skipped`
  std::function<int64_t(int64_t)> label;
  std::function<LabeledDecode(int64_t)> decode;  // thread-safe
  // The `skipped` entry of an item that failed (default: {"file": key, "error": error}).
  std::function<nlohmann::json(int64_t, const std::string&)> skip_entry;
};

struct LabeledShards {
  std::vector<ShardEntry> shards;
  ChannelStats stats;
  nlohmann::json label_counts = nlohmann::json::object();  // split -> counts per label
  std::map<std::string, uint32_t> crc_of;                  // key -> the source's CRC32C
  nlohmann::json skipped = nlohmann::json::array();
  int kept = 0;  // shards finished by an earlier run and verified

  // m.shards, m.skipped (appended), m.statistics["image"] and ["label"].
  void FillManifest(DatasetManifest* m) const;
};

// Plans, writes (or keeps) the shards under out_dir and gathers their states. With on_error
// "fail" the first decode error is InvalidArgument naming it; with "skip" it is logged and listed.
absl::StatusOr<LabeledShards> WriteLabeledShards(Env* env, const LabeledImport& import,
                                                 const ProgressFn& progress);

// The summary of a written manifest (examples per split, shards, skipped).
void SummarizeManifest(const DatasetManifest& m, ImportSummary* summary);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_LABELED_IMPORT_H_
