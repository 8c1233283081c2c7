#include "kiln/data/dataset.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

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

absl::StatusOr<TrainTestSplit> SplitDataset(const Dataset& all, double held_out_fraction,
                                            uint64_t seed) {
  const int64_t n = all.size();
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
  std::vector<int64_t> held_idx(order.begin(), order.begin() + held);
  std::vector<int64_t> train_idx(order.begin() + held, order.end());
  TrainTestSplit split;
  split.train = all.Gather(train_idx);
  split.held_out = all.Gather(held_idx);
  return split;
}

BatchIterator::BatchIterator(Dataset dataset, int64_t batch_size, uint64_t seed)
    : dataset_(std::move(dataset)), batch_size_(batch_size), rng_(seed) {
  order_ = Permutation(dataset_.size(), rng_);
}

absl::StatusOr<BatchIterator> BatchIterator::Create(const Dataset& dataset, int64_t batch_size,
                                                    uint64_t seed) {
  if (batch_size < 1 || batch_size > dataset.size()) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be in [1, ", dataset.size(),
                                                   "] (the dataset size), got ", batch_size));
  }
  return BatchIterator(dataset, batch_size, seed);
}

absl::Status BatchIterator::Next(Tensor& features, Tensor& labels) {
  const int64_t f = dataset_.num_features();
  if (features.dtype() != DType::kF32 || features.shape() != Shape{batch_size_, f}) {
    return absl::InvalidArgumentError(absl::StrCat("batch features must be f32[", batch_size_, ",",
                                                   f, "], got ", features.TypeString()));
  }
  if (labels.dtype() != DType::kS32 || labels.shape() != Shape{batch_size_}) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch labels must be s32[", batch_size_, "], got ", labels.TypeString()));
  }
  if (position_ + batch_size_ > dataset_.size()) {
    order_ = Permutation(dataset_.size(), rng_);
    position_ = 0;
    ++epoch_;
  }
  const float* src = dataset_.features.data<float>();
  const int32_t* src_labels = dataset_.labels.data<int32_t>();
  float* dst = features.data<float>();
  int32_t* dst_labels = labels.data<int32_t>();
  for (int64_t i = 0; i < batch_size_; ++i) {
    const int64_t row = order_[position_ + i];
    std::memcpy(dst + i * f, src + row * f, f * sizeof(float));
    dst_labels[i] = src_labels[row];
  }
  position_ += batch_size_;
  return absl::OkStatus();
}

}  // namespace kiln::data
