#include "kiln/data/augment.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/hash.h"

namespace kiln::data {
namespace {

// Uniform in [0, n) from 32 random bits (Lemire's multiply-shift; the bias is below n / 2^32).
int64_t Below(uint32_t bits, int64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(bits) * static_cast<uint64_t>(n)) >> 32);
}

}  // namespace

nlohmann::json AugmentConfig::ToJson() const {
  return {{"chw", {channels, height, width}},
          {"random_crop", random_crop},
          {"padding", padding},
          {"flip_horizontal", flip_horizontal},
          {"mean", mean},
          {"std", std}};
}

absl::StatusOr<Augmenter> Augmenter::Create(const AugmentConfig& c, int64_t example_floats) {
  if (c.channels < 1 || c.height < 1 || c.width < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("data.augment: needs the image layout (model.channels, height, width), got ",
                     c.channels, "x", c.height, "x", c.width));
  if (c.channels * c.height * c.width != example_floats)
    return absl::InvalidArgumentError(
        absl::StrCat("data.augment: the examples have ", example_floats,
                     " features but the image layout ", c.channels, "x", c.height, "x", c.width,
                     " (model.channels x height x width) has ", c.channels * c.height * c.width));
  if (c.padding < 0 || c.padding > 4096)
    return absl::InvalidArgumentError(
        absl::StrCat("data.augment.random_crop.padding: must be in [0, 4096], got ", c.padding));
  if (c.mean.size() != c.std.size() ||
      (!c.mean.empty() && c.mean.size() != static_cast<size_t>(c.channels)))
    return absl::InvalidArgumentError(
        absl::StrCat("data.augment.normalize: mean and std need one value per channel (",
                     c.channels, "), got ", c.mean.size(), " and ", c.std.size()));
  Augmenter a(c);
  for (size_t k = 0; k < c.std.size(); ++k) {
    if (!(c.std[k] > 0) || !std::isfinite(c.std[k]) || !std::isfinite(c.mean[k]))
      return absl::InvalidArgumentError(absl::StrCat(
          "data.augment.normalize: std must be finite and > 0 and mean finite, got mean ",
          c.mean[k], " std ", c.std[k], " for channel ", k));
    a.std_f32_.push_back(static_cast<float>(c.std[k]));
  }
  return a;
}

Augmenter::Draw Augmenter::DrawFor(uint64_t seed, int64_t epoch, int64_t index) const {
  // A key of its own (the constant), so the draws are independent of the shuffle, which mixes
  // (seed, epoch) the same way.
  const uint64_t key = SplitMix64(seed ^ 0x6175676d656e7421ULL) ^
                       SplitMix64(static_cast<uint64_t>(epoch) * 0x9e3779b97f4a7c15ULL + 1);
  const uint64_t r = SplitMix64(key ^ SplitMix64(static_cast<uint64_t>(index)));
  Draw d;
  if (c_.random_crop && c_.padding > 0) {
    const int64_t span = 2 * c_.padding + 1;
    d.dy = Below(static_cast<uint32_t>(r), span);
    d.dx = Below(static_cast<uint32_t>(r >> 32), span);
  } else {
    d.dy = d.dx = c_.padding;
  }
  if (c_.flip_horizontal) d.flip = (SplitMix64(r) >> 63) != 0;
  return d;
}

void Augmenter::Apply(float* x, const Draw& d, float* scratch) const {
  const int64_t C = c_.channels, H = c_.height, W = c_.width, P = c_.padding;
  const bool moves = d.dy != P || d.dx != P || d.flip;
  if (moves) {
    // Output pixel (i, j) reads padded pixel (i + dy, j' + dx), j' = j or W-1-j when flipped;
    // padded (py, px) is source (py - P, px - P), zero outside.
    std::memcpy(scratch, x, static_cast<size_t>(C * H * W) * sizeof(float));
    for (int64_t ch = 0; ch < C; ++ch) {
      const float* src = scratch + ch * H * W;
      float* dst = x + ch * H * W;
      for (int64_t i = 0; i < H; ++i) {
        const int64_t sy = i + d.dy - P;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t sx = (d.flip ? W - 1 - j : j) + d.dx - P;
          dst[i * W + j] = sy >= 0 && sy < H && sx >= 0 && sx < W ? src[sy * W + sx] : 0.0f;
        }
      }
    }
  }
  if (!std_f32_.empty()) {  // in f32, as torchvision's Normalize: (x - mean) / std
    for (int64_t ch = 0; ch < C; ++ch) {
      const float m = static_cast<float>(c_.mean[ch]), s = std_f32_[ch];
      float* p = x + ch * H * W;
      for (int64_t k = 0; k < H * W; ++k) p[k] = (p[k] - m) / s;
    }
  }
}

void Augmenter::ApplyTrain(float* x, uint64_t seed, int64_t epoch, int64_t index,
                           float* scratch) const {
  Apply(x, DrawFor(seed, epoch, index), scratch);
}

void Augmenter::ApplyEval(float* x, float* scratch) const {
  Apply(x, Draw{c_.padding, c_.padding, false}, scratch);
}

}  // namespace kiln::data
