// Decoding JPEG (libjpeg-turbo) and PNG (libpng) files into 8-bit pixels, and encoding them (the
// tests write their own images with these). What `kiln data import images` reads.
//
//   KILN_ASSIGN_OR_RETURN(Image img, DecodeImage(bytes, "cats/01.png"));
//   // img.channels: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA; img.pixels: HWC row-major
//
// How each kind of file is decoded (docs/data.md "Images"):
// - JPEG: grayscale files give 1 channel, YCbCr/RGB files 3 (libjpeg's YCbCr->RGB), CMYK/YCCK
//   files are read as Adobe-inverted CMYK and converted R = C*K/255 (and so on). Any libjpeg
//   warning about corrupt data (a truncated file, a bad Huffman code) is an error, not a gray fill.
// - PNG: palette images are expanded to RGB, a tRNS chunk becomes an alpha channel, gray below
//   8 bits is scaled to 8, 16-bit samples are scaled to 8 bits with rounding (v*255/65535);
//   interlaced files are de-interlaced. gAMA/iCCP/sRGB chunks are ignored: values are taken as
//   stored. Ancillary-chunk CRC errors are ignored (libpng's default); critical ones are errors.
// The format is found from the first bytes (FF D8 FF: JPEG; 89 50 4E 47: PNG), not the name.
// Images above 2^28 pixels (or, for PNG, 32768 pixels a side) are refused, not allocated.
// Errors are InvalidArgument naming `name`.
#ifndef KILN_DATA_IMPORT_IMAGE_CODEC_H_
#define KILN_DATA_IMPORT_IMAGE_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::data {

struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;             // 1, 2, 3 or 4
  std::vector<uint8_t> pixels;  // height * width * channels, row-major, channels interleaved
  std::string format;           // "jpeg" or "png", with what the file held: "png rgba 16-bit"
};

absl::StatusOr<Image> DecodeImage(std::string_view bytes, const std::string& name);

// The same, for a caller that will shrink the image to at most min_width x min_height: a JPEG
// is decoded with libjpeg's scaled IDCT at 1/2, 1/4 or 1/8 of its size, the smallest scale whose
// result is still at least 2 * min_width x 2 * min_height (much faster for big photos; the area
// resampling that follows does the rest). PNGs and 0 hints decode at full size. Deterministic.
absl::StatusOr<Image> DecodeImage(std::string_view bytes, const std::string& name, int min_width,
                                  int min_height);

// A PNG of the given libpng color type (PNG_COLOR_TYPE_GRAY=0, RGB=2, PALETTE=3, GRAY_ALPHA=4,
// RGBA=6) and bit depth. `rows`: height rows of packed samples as PNG stores them (16-bit samples
// big-endian, sub-byte gray packed from the high bit). `palette`: RGB triples; `trns`: the tRNS
// chunk bytes (alpha per palette entry, or one 16-bit gray / three 16-bit RGB sample values).
struct PngSpec {
  int width = 0, height = 0;
  int color_type = 2;
  int bit_depth = 8;
  std::string rows;
  std::string palette;
  std::string trns;
  bool interlaced = false;
};
absl::StatusOr<std::string> EncodePng(const PngSpec& spec);
// Baseline JPEG of a 1- or 3-channel image.
absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality = 90);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_IMAGE_CODEC_H_
