// In-memory classification datasets: a feature matrix and a label vector, a deterministic
// shuffled split, and a batch iterator that refills caller-owned tensors (no allocation per step).
//
//   KILN_ASSIGN_OR_RETURN(Dataset all, LoadDigitsCsv("examples/data/digits.csv.gz"));
//   KILN_ASSIGN_OR_RETURN(TrainTestSplit split, SplitDataset(all, /*held_out_fraction=*/0.2,
//                                                            /*seed=*/0));
//   KILN_ASSIGN_OR_RETURN(BatchIterator it, BatchIterator::Create(split.train, 64, /*seed=*/1));
//   Tensor x(DType::kF32, Shape{64, 64}), y(DType::kS32, Shape{64});
//   it.Next(x, y);                      // one batch; reshuffles at each epoch boundary
//
// Determinism: shuffles use std::mt19937_64 (fully specified by the standard) with our own
// bounded-integer draw, so a seed gives the same order on every platform and standard library.
#ifndef KILN_DATA_DATASET_H_
#define KILN_DATA_DATASET_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/tensor/tensor.h"

namespace kiln::data {

struct Dataset {
  Tensor features;  // f32 [N, F]
  Tensor labels;    // s32 [N], each in [0, num_classes)
  int64_t num_classes = 0;

  int64_t size() const { return labels.num_elements(); }
  int64_t num_features() const { return features.shape().rank() == 2 ? features.shape()[1] : 0; }
  // The rows `indices` (in that order) as a new dataset.
  Dataset Gather(const std::vector<int64_t>& indices) const;
};

struct TrainTestSplit {
  Dataset train;
  Dataset held_out;
};

// Shuffles the rows with `seed` and puts round(held_out_fraction * N) of them in held_out, the
// rest in train. The same seed always gives the same split. The fraction must leave both parts
// non-empty.
absl::StatusOr<TrainTestSplit> SplitDataset(const Dataset& all, double held_out_fraction,
                                            uint64_t seed);

// A permutation of 0..n-1 from `rng` (Fisher-Yates with an unbiased bounded draw).
std::vector<int64_t> Permutation(int64_t n, std::mt19937_64& rng);

// Fixed-size batches over a dataset, epoch by epoch, each epoch in a fresh shuffled order. The last
// partial batch of an epoch is dropped so every batch has the same (static) shape.
class BatchIterator {
 public:
  // batch_size must be in [1, dataset.size()].
  static absl::StatusOr<BatchIterator> Create(const Dataset& dataset, int64_t batch_size,
                                              uint64_t seed);

  // Fills features (f32 [batch, F]) and labels (s32 [batch]); both must already have those types
  // (InvalidArgument otherwise).
  absl::Status Next(Tensor& features, Tensor& labels);

  int64_t batch_size() const { return batch_size_; }
  int64_t epoch() const { return epoch_; }  // completed epochs
  int64_t batches_per_epoch() const { return dataset_.size() / batch_size_; }

 private:
  BatchIterator(Dataset dataset, int64_t batch_size, uint64_t seed);

  Dataset dataset_;
  int64_t batch_size_;
  std::mt19937_64 rng_;
  std::vector<int64_t> order_;
  int64_t position_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace kiln::data

#endif  // KILN_DATA_DATASET_H_
