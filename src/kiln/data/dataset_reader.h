// Reads a dataset directory written by `kiln data import` (dataset.json + tf.train.Example
// shards) as batches of host tensors: what the training input pipeline uses for `kiln train` on
// imported data.
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<DatasetReader> ds,
//                         DatasetReader::Open(Env::Default(), "/data/icons", "train"));
//   ds->size();                                     // examples in the split
//   KILN_ASSIGN_OR_RETURN(ExampleBatch b, ds->ReadBatch({0, 5, 9}, /*threads=*/2));
//   b.tensors.at("image");                          // u8 [3, 32, 32, 3]
//   b.tensors.at("label");                          // s64 [3]
//
// Open reads dataset.json, checks every shard's size against it and indexes the split's records
// (one pass over its shards: each record's framing CRCs are checked and its offset kept), so
// damage is reported before training starts. Examples are numbered 0..size()-1 in shard order.
// ReadBatch decodes the requested examples on `threads` threads and stacks each numeric feature
// into one tensor [batch, ...shape]: uint8 -> u8, float32 -> f32, int64 -> s64 (string features
// are skipped). A record whose feature is missing, of another list kind or another element count
// is DataLoss naming the shard and the record's byte offset.
#ifndef KILN_DATA_DATASET_READER_H_
#define KILN_DATA_DATASET_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/tensor/tensor.h"

namespace kiln::data {

struct ExampleBatch {
  std::map<std::string, Tensor> tensors;  // feature name -> [batch, ...shape]
};

class DatasetReader {
 public:
  // `split`: "train", "held_out", or "" for every shard.
  static absl::StatusOr<std::unique_ptr<DatasetReader>> Open(Env* env, const std::string& dir,
                                                             const std::string& split);

  const DatasetManifest& manifest() const { return manifest_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  // Where example i lives: the shard's path and the record's byte offset.
  std::string Location(int64_t i) const;

  // Decodes and stacks examples `indices` (each in [0, size())). Thread-safe.
  absl::StatusOr<ExampleBatch> ReadBatch(const std::vector<int64_t>& indices,
                                         int threads = 1) const;

 private:
  struct Entry {
    int shard = 0;
    uint64_t offset = 0;
  };
  Env* env_ = nullptr;
  std::string dir_;
  DatasetManifest manifest_;
  std::vector<std::string> paths_;  // per shard of the split
  std::vector<Entry> index_;
};

}  // namespace kiln::data

#endif  // KILN_DATA_DATASET_READER_H_
