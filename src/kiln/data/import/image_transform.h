// Turning decoded images (image_codec.h) into the fixed-size, fixed-channel pixels a dataset
// stores: alpha composited over a background, channels converted, then resized.
//
//   Image rgb = ConvertChannels(decoded, /*channels=*/3, /*background=*/255);
//   Image out = ResizeImage(rgb, /*height=*/32, /*width=*/32, ResizeMode::kCrop);
//
// - Alpha: out = (v*a + background*(255-a)) / 255, rounded, per color channel.
// - Gray -> RGB copies the gray value; RGB -> gray is BT.601 luma (299 R + 587 G + 114 B) / 1000,
//   rounded.
// - kFit scales the whole image to height x width (the aspect ratio is not kept); kCrop scales it
//   so that it covers height x width with its aspect ratio kept and takes the centre.
// - Resampling per axis: area averaging (each output pixel the mean of the source area it covers,
//   partial pixels weighted by their overlap) when shrinking, bilinear with half-pixel centres
//   (TensorFlow's half_pixel_centers, PyTorch's align_corners=False) when enlarging. Same input,
//   same bytes: float arithmetic in a fixed order, no threads.
#ifndef KILN_DATA_IMPORT_IMAGE_TRANSFORM_H_
#define KILN_DATA_IMPORT_IMAGE_TRANSFORM_H_

#include <cstdint>

#include "kiln/data/import/image_codec.h"

namespace kiln::data {

enum class ResizeMode { kFit, kCrop };

// `channels` is 1 or 3; the input may have 1..4.
Image ConvertChannels(const Image& in, int channels, uint8_t background = 255);
// Any channel count; height, width >= 1; the input must not be empty.
Image ResizeImage(const Image& in, int height, int width, ResizeMode mode);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_IMAGE_TRANSFORM_H_
