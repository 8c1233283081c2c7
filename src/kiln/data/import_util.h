// Pieces every `kiln data import` converter shares: a parallel-for over a few threads, the
// progress callback, a 64-bit FNV-1a fingerprint and per-channel statistics.
//
//   ParallelFor(threads, n, [&](int64_t i) { decoded[i] = Decode(files[i]); });
//   ChannelStats stats(3);
//   stats.Add(pixels, n_pixels);                      // values interleaved per channel
//   nlohmann::json j = stats.ToJson();                // {"count":..,"mean":[..],"std":[..],...}
#ifndef KILN_DATA_IMPORT_UTIL_H_
#define KILN_DATA_IMPORT_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/hash.h"  // Fnv1a64, which importers use for fingerprints
#include "nlohmann/json.hpp"

namespace kiln::data {

// Runs fn(0) .. fn(n-1) on `threads` threads (the caller's included; threads <= 1 runs inline),
// each index exactly once, in no particular order; returns when all have run. fn must not throw.
void ParallelFor(int threads, int64_t n, const std::function<void(int64_t)>& fn);

// What an import reports while it runs (from one thread at a time).
struct ImportProgress {
  std::string phase;  // "decode", "tokenize", ...
  int64_t done = 0;   // items of this phase finished
  int64_t total = 0;  // items of this phase in all
  std::string unit;   // "images", "rows", "tokens", "lines"
};
using ProgressFn = std::function<void(const ImportProgress&)>;

// 16 lower-case hex digits.
std::string Hex64(uint64_t v);
// 8 lower-case hex digits.
std::string Hex32(uint32_t v);

// Count, sum, sum of squares, min and max of each of `channels` interleaved channels. Adding the
// same values in the same order gives bit-identical results (plain double sums, no threads).
class ChannelStats {
 public:
  explicit ChannelStats(int channels = 1);
  void Add(const uint8_t* values, int64_t n);  // n values, channel = index % channels
  void Add(const float* values, int64_t n);
  void Add(double value, int channel);
  void Merge(const ChannelStats& other);  // other's channels must match
  int channels() const { return static_cast<int>(sum_.size()); }
  int64_t count() const { return count_.empty() ? 0 : count_[0]; }

  // Partial sums (for resume: a kept shard's stats are read back exactly).
  nlohmann::json ToPartialJson() const;
  static ChannelStats FromPartialJson(const nlohmann::json& j);
  // {"count": n, "mean": [...], "std": [...], "min": [...], "max": [...]} (population std).
  nlohmann::json Summary() const;

 private:
  std::vector<int64_t> count_;
  std::vector<double> sum_, sumsq_, min_, max_;
};

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_UTIL_H_
