// In-memory classification datasets: a feature matrix and a label vector, and a deterministic
// shuffled split. Batches come from the input pipeline (pipeline.h; train_data.h for a trainer).
//
//   KILN_ASSIGN_OR_RETURN(Dataset all, LoadDigitsCsv("examples/data/digits.csv.gz"));
//   KILN_ASSIGN_OR_RETURN(TrainTestSplit split, SplitDataset(all, /*held_out_fraction=*/0.2,
//                                                            /*seed=*/0));
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

// SplitDataset's split as row indices of an n-row dataset: held_out = the first
// round(held_out_fraction * n) of Permutation(n, mt19937_64(seed)), train = the rest, each in
// that permuted order. The same errors as SplitDataset.
struct SplitIndices {
  std::vector<int64_t> train, held_out;
};
absl::StatusOr<SplitIndices> SplitExampleIndices(int64_t n, double held_out_fraction,
                                                 uint64_t seed);

// A permutation of 0..n-1 from `rng` (Fisher-Yates with an unbiased bounded draw).
std::vector<int64_t> Permutation(int64_t n, std::mt19937_64& rng);

}  // namespace kiln::data

#endif  // KILN_DATA_DATASET_H_
