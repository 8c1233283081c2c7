// Image augmentation for the input pipeline (pipeline.h): random crop with zero padding,
// horizontal flip and per-channel normalization of an example's f32 features laid out CHW (what
// the cnn and vit models read), applied on the thread that produces the batch (the pipeline's
// prefetch thread; the caller's with prefetch 0).
//
//   AugmentConfig a{.channels = 1, .height = 8, .width = 8, .random_crop = true, .padding = 1,
//                   .flip_horizontal = true, .mean = {0.5}, .std = {0.25}};
//   KILN_ASSIGN_OR_RETURN(Augmenter aug, Augmenter::Create(a, /*example_floats=*/64));
//   aug.ApplyTrain(x, /*seed=*/0, /*epoch=*/3, /*index=*/17, scratch);   // in place
//   aug.ApplyEval(y, scratch);                                          // centre crop + normalize
//
// Training, in this order (torchvision's RandomCrop(padding) -> RandomHorizontalFlip ->
// Normalize): the C x H x W image is padded with `padding` zeros on every side and a window of
// the crop size (= H x W: the output keeps the example's shape) is taken at offset (dy, dx),
// dy, dx uniform in [0, 2 * padding]; then, with probability 1/2, mirrored left-right; then
// x' = (x - mean[c]) / std[c]. Evaluation (the held_out split): the centre window (dy = dx =
// padding, i.e. the image itself) and the normalization, never a flip.
//
// The draws are counter-based: (dy, dx, flip) are a fixed function (SplitMix64) of (seed, epoch,
// the example's global index), not a stream's state. So any batch can be recomputed on its own:
// a resumed run, a different prefetch depth or another thread sees exactly the same augmented
// examples (DrawFor gives them, for tests and tools).
#ifndef KILN_DATA_AUGMENT_H_
#define KILN_DATA_AUGMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kiln::data {

struct AugmentConfig {
  // The layout of an example's features: C x H x W floats (the model's channels/height/width).
  int64_t channels = 0, height = 0, width = 0;
  bool random_crop = false;
  int64_t padding = 0;  // random_crop: zeros added on each side before the crop
  bool flip_horizontal = false;
  // Per-channel normalization (both empty: none; else one value per channel, std > 0).
  std::vector<double> mean, std;

  bool enabled() const { return random_crop || flip_horizontal || !mean.empty(); }
  // For the pipeline's state JSON (a state saved with other augmentation does not restore).
  nlohmann::json ToJson() const;
};

class Augmenter {
 public:
  // InvalidArgument (naming data.augment keys) when the layout does not match example_floats,
  // or for bad padding / mean / std.
  static absl::StatusOr<Augmenter> Create(const AugmentConfig& config, int64_t example_floats);

  struct Draw {
    int64_t dy = 0, dx = 0;  // crop offset in the padded image, each in [0, 2 * padding]
    bool flip = false;
  };
  Draw DrawFor(uint64_t seed, int64_t epoch, int64_t index) const;

  // In place on one example's C*H*W floats; `scratch` holds C*H*W floats.
  void ApplyTrain(float* x, uint64_t seed, int64_t epoch, int64_t index, float* scratch) const;
  void ApplyEval(float* x, float* scratch) const;

  int64_t floats() const { return c_.channels * c_.height * c_.width; }
  const AugmentConfig& config() const { return c_; }

 private:
  explicit Augmenter(AugmentConfig c) : c_(std::move(c)) {}
  void Apply(float* x, const Draw& d, float* scratch) const;
  AugmentConfig c_;
  std::vector<float> std_f32_;
};

}  // namespace kiln::data

#endif  // KILN_DATA_AUGMENT_H_
