#include "kiln/data/dataset.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"

namespace kiln::data {
namespace {

// Uniform integer in [0, bound) by rejection: unbiased and, unlike
// std::uniform_int_distribution, the same on every standard library.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

}  // namespace

std::vector<int64_t> Permutation(int64_t n, std::mt19937_64& rng) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

Dataset Dataset::Gather(const std::vector<int64_t>& indices) const {
  const int64_t f = num_features();
  const int64_t n = static_cast<int64_t>(indices.size());
  Dataset out;
  out.num_classes = num_classes;
  out.features = Tensor(DType::kF32, Shape{n, f});
  out.labels = Tensor(DType::kS32, Shape{n});
  const float* src = features.data<float>();
  float* dst = out.features.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * f, src + indices[i] * f, f * sizeof(float));
    out.labels.data<int32_t>()[i] = labels.data<int32_t>()[indices[i]];
  }
  return out;
}

absl::StatusOr<SplitIndices> SplitExampleIndices(int64_t n, double held_out_fraction,
                                                 uint64_t seed) {
  if (!(held_out_fraction > 0.0 && held_out_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("held-out fraction must be in (0, 1), got ", held_out_fraction));
  }
  const int64_t held = static_cast<int64_t>(std::llround(held_out_fraction * n));
  if (held < 1 || held > n - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot split ", n, " rows with held-out fraction ", held_out_fraction,
                     ": both parts must be non-empty"));
  }
  std::mt19937_64 rng(seed);
  std::vector<int64_t> order = Permutation(n, rng);
  SplitIndices split;
  split.held_out.assign(order.begin(), order.begin() + held);
  split.train.assign(order.begin() + held, order.end());
  return split;
}

absl::StatusOr<TrainTestSplit> SplitDataset(const Dataset& all, double held_out_fraction,
                                            uint64_t seed) {
  KILN_ASSIGN_OR_RETURN(SplitIndices idx, SplitExampleIndices(all.size(), held_out_fraction, seed));
  TrainTestSplit split;
  split.train = all.Gather(idx.train);
  split.held_out = all.Gather(idx.held_out);
  return split;
}

}  // namespace kiln::data
