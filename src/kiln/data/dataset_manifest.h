// dataset.json: the manifest `kiln data import` writes last, beside the record shards it
// describes (docs/formats.md "Dataset manifest"). It holds the schema of every feature, the
// shards with their example counts, sizes and CRC32C checksums, the splits, the label vocabulary,
// per-feature statistics and a fingerprint of the source.
//
//   DatasetManifest m;  // filled by an importer
//   KILN_RETURN_IF_ERROR(WriteManifest(env, "/data/icons", m));     // temp file + rename
//   KILN_ASSIGN_OR_RETURN(DatasetManifest back, ReadManifest(env, "/data/icons"));
//   KILN_RETURN_IF_ERROR(VerifyShards(env, "/data/icons", back));   // sizes and checksums
//
// Shard file names are "<split>-<index:05>-of-<count:05>.tfrecord" (ShardFileName), each record a
// tf.train.Example (example_proto.h) framed as TFRecord (record_io.h).
#ifndef KILN_DATA_DATASET_MANIFEST_H_
#define KILN_DATA_DATASET_MANIFEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "nlohmann/json.hpp"

namespace kiln::data {

inline constexpr char kManifestFormat[] = "kiln.dataset.v1";
inline constexpr char kManifestName[] = "dataset.json";

struct FeatureSchema {
  std::string name;
  // "uint8" (one bytes_list value holding the raw elements), "float32" (float_list), "int64"
  // (int64_list) or "string" (bytes_list, one value per element).
  std::string dtype;
  std::vector<int64_t> shape;  // [] = scalar; elements in row-major order
  std::string description;
};

struct ShardEntry {
  std::string file;  // name within the dataset directory
  std::string split;
  int64_t examples = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // CRC32C (Castagnoli, unmasked) of the whole file
};

struct DatasetManifest {
  std::string kind;  // "images", "csv", "text"
  std::vector<FeatureSchema> features;
  std::string label_feature;                  // empty: no label
  std::vector<std::string> label_vocabulary;  // label id i is label_vocabulary[i]
  std::map<std::string, std::vector<std::string>> vocabularies;  // categorical features
  nlohmann::json statistics = nlohmann::json::object();          // feature -> ChannelStats summary
  std::string source_fingerprint;                                // 16 hex digits
  int64_t source_files = 0;
  uint64_t source_bytes = 0;
  std::vector<ShardEntry> shards;  // in split order, then index order
  nlohmann::json import_options = nlohmann::json::object();
  nlohmann::json skipped = nlohmann::json::array();  // [{"file":..., "error":...}]
  nlohmann::json extra = nlohmann::json::object();   // kind-specific (e.g. the tokenizer)

  // Examples per split, from the shards.
  std::map<std::string, int64_t> SplitExamples() const;
  const FeatureSchema* FindFeature(const std::string& name) const;
};

// "train-00003-of-00004.tfrecord".
std::string ShardFileName(const std::string& split, int index, int count);

nlohmann::json ManifestToJson(const DatasetManifest& m);
// `where` names the source in errors (a path).
absl::StatusOr<DatasetManifest> ManifestFromJson(const nlohmann::json& j, const std::string& where);

// DIR/dataset.json, written to a temporary name, fsynced and renamed (the directory fsynced).
absl::Status WriteManifest(Env* env, const std::string& dir, const DatasetManifest& m);
// NotFound if DIR has no dataset.json; DataLoss naming the file and key if it is malformed.
absl::StatusOr<DatasetManifest> ReadManifest(Env* env, const std::string& dir);

// CRC32C and size of a whole file.
struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};
absl::StatusOr<FileChecksum> ChecksumFile(Env* env, const std::string& path);

// Each shard's size and CRC32C against the manifest: DataLoss naming the first shard that
// differs (or NotFound if one is missing).
absl::Status VerifyShards(Env* env, const std::string& dir, const DatasetManifest& m);

}  // namespace kiln::data

#endif  // KILN_DATA_DATASET_MANIFEST_H_
