#include "kiln/data/import/image_transform.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::data {
namespace {

// Source taps of one output pixel along one axis.
struct Taps {
  int first = 0;
  std::vector<float> weights;
};

// Output pixel i of m covers the source interval [start + i*len/m, start + (i+1)*len/m) of an
// axis of n pixels.
std::vector<Taps> AxisTaps(int n, double start, double len, int m) {
  std::vector<Taps> taps(m);
  const double scale = len / m;
  for (int i = 0; i < m; ++i) {
    Taps& t = taps[i];
    if (scale > 1.0) {
      const double lo = start + i * scale, hi = lo + scale;
      const int j0 = std::max(0, static_cast<int>(std::floor(lo)));
      const int j1 = std::min(n, static_cast<int>(std::ceil(hi)));
      t.first = j0;
      for (int j = j0; j < j1; ++j) {
        const double overlap = std::min<double>(hi, j + 1) - std::max<double>(lo, j);
        t.weights.push_back(static_cast<float>(std::max(0.0, overlap) / scale));
      }
    } else {
      const double x = std::clamp(start + (i + 0.5) * scale - 0.5, 0.0, n - 1.0);
      const int j0 = static_cast<int>(std::floor(x));
      const float f = static_cast<float>(x - j0);
      t.first = j0;
      t.weights.push_back(1.0f - f);
      if (j0 + 1 < n) t.weights.push_back(f);
    }
  }
  return taps;
}

uint8_t ToByte(float v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); }

}  // namespace

Image ConvertChannels(const Image& in, int channels, uint8_t background) {
  Image out;
  out.width = in.width;
  out.height = in.height;
  out.channels = channels;
  out.format = in.format;
  const size_t n = static_cast<size_t>(in.width) * in.height;
  out.pixels.resize(n * channels);
  const bool alpha = in.channels == 2 || in.channels == 4;
  const int color = alpha ? in.channels - 1 : in.channels;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = in.pixels.data() + i * in.channels;
    unsigned rgb[3];
    for (int c = 0; c < 3; ++c) rgb[c] = p[color == 1 ? 0 : c];
    if (alpha) {
      const unsigned a = p[in.channels - 1];
      for (unsigned& v : rgb) v = (v * a + background * (255 - a) + 127) / 255;
    }
    uint8_t* q = out.pixels.data() + i * channels;
    if (channels == 1) {
      q[0] = color == 1
                 ? static_cast<uint8_t>(rgb[0])
                 : static_cast<uint8_t>((299 * rgb[0] + 587 * rgb[1] + 114 * rgb[2] + 500) / 1000);
    } else {
      for (int c = 0; c < 3; ++c) q[c] = static_cast<uint8_t>(rgb[c]);
    }
  }
  return out;
}

Image ResizeImage(const Image& in, int height, int width, ResizeMode mode) {
  double x0 = 0, y0 = 0, lw = in.width, lh = in.height;
  if (mode == ResizeMode::kCrop) {
    const double s =
        std::max(static_cast<double>(height) / in.height, static_cast<double>(width) / in.width);
    lw = width / s;
    lh = height / s;
    x0 = (in.width - lw) / 2;
    y0 = (in.height - lh) / 2;
  }
  const std::vector<Taps> tx = AxisTaps(in.width, x0, lw, width);
  const std::vector<Taps> ty = AxisTaps(in.height, y0, lh, height);
  const int ch = in.channels;
  // Horizontal pass over every source row, then vertical.
  std::vector<float> mid(static_cast<size_t>(in.height) * width * ch);
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* row = in.pixels.data() + static_cast<size_t>(y) * in.width * ch;
    float* dst = mid.data() + static_cast<size_t>(y) * width * ch;
    for (int x = 0; x < width; ++x) {
      const Taps& t = tx[x];
      for (int c = 0; c < ch; ++c) {
        float acc = 0;
        for (size_t k = 0; k < t.weights.size(); ++k)
          acc += t.weights[k] * row[(t.first + k) * ch + c];
        dst[x * ch + c] = acc;
      }
    }
  }
  Image out;
  out.width = width;
  out.height = height;
  out.channels = ch;
  out.format = in.format;
  out.pixels.resize(static_cast<size_t>(height) * width * ch);
  const size_t stride = static_cast<size_t>(width) * ch;
  for (int y = 0; y < height; ++y) {
    const Taps& t = ty[y];
    uint8_t* dst = out.pixels.data() + y * stride;
    for (size_t i = 0; i < stride; ++i) {
      float acc = 0;
      for (size_t k = 0; k < t.weights.size(); ++k)
        acc += t.weights[k] * mid[(t.first + k) * stride + i];
      dst[i] = ToByte(acc);
    }
  }
  return out;
}

}  // namespace kiln::data
