#include "kiln/data/import_util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/str_format.h"

namespace kiln::data {

void ParallelFor(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int t = static_cast<int>(std::min<int64_t>(std::max(threads, 1), n));
  if (t == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (int k = 1; k < t; ++k) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
}

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }
std::string Hex32(uint32_t v) { return absl::StrFormat("%08x", v); }

ChannelStats::ChannelStats(int channels)
    : count_(channels, 0),
      sum_(channels, 0.0),
      sumsq_(channels, 0.0),
      min_(channels, std::numeric_limits<double>::infinity()),
      max_(channels, -std::numeric_limits<double>::infinity()) {}

void ChannelStats::Add(double value, int c) {
  ++count_[c];
  sum_[c] += value;
  sumsq_[c] += value * value;
  min_[c] = std::min(min_[c], value);
  max_[c] = std::max(max_[c], value);
}

void ChannelStats::Add(const uint8_t* values, int64_t n) {
  // Exact integer sums per call, then one double add per channel: fast and order-independent
  // within the call.
  const int ch = channels();
  std::vector<uint64_t> s(ch, 0), sq(ch, 0);
  std::vector<uint8_t> lo(ch, 255), hi(ch, 0);
  std::vector<int64_t> cnt(ch, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i % ch);
    const uint8_t v = values[i];
    s[c] += v;
    sq[c] += static_cast<uint64_t>(v) * v;
    lo[c] = std::min(lo[c], v);
    hi[c] = std::max(hi[c], v);
    ++cnt[c];
  }
  for (int c = 0; c < ch; ++c) {
    if (cnt[c] == 0) continue;
    count_[c] += cnt[c];
    sum_[c] += static_cast<double>(s[c]);
    sumsq_[c] += static_cast<double>(sq[c]);
    min_[c] = std::min<double>(min_[c], lo[c]);
    max_[c] = std::max<double>(max_[c], hi[c]);
  }
}

void ChannelStats::Add(const float* values, int64_t n) {
  const int ch = channels();
  for (int64_t i = 0; i < n; ++i) Add(values[i], static_cast<int>(i % ch));
}

void ChannelStats::Merge(const ChannelStats& o) {
  for (int c = 0; c < channels() && c < o.channels(); ++c) {
    count_[c] += o.count_[c];
    sum_[c] += o.sum_[c];
    sumsq_[c] += o.sumsq_[c];
    min_[c] = std::min(min_[c], o.min_[c]);
    max_[c] = std::max(max_[c], o.max_[c]);
  }
}

nlohmann::json ChannelStats::ToPartialJson() const {
  nlohmann::json j;
  j["count"] = count_;
  j["sum"] = sum_;
  j["sumsq"] = sumsq_;
  // JSON has no infinity: an empty channel's min/max are written as null.
  nlohmann::json lo = nlohmann::json::array(), hi = nlohmann::json::array();
  for (int c = 0; c < channels(); ++c) {
    lo.push_back(count_[c] ? nlohmann::json(min_[c]) : nlohmann::json());
    hi.push_back(count_[c] ? nlohmann::json(max_[c]) : nlohmann::json());
  }
  j["min"] = lo;
  j["max"] = hi;
  return j;
}

ChannelStats ChannelStats::FromPartialJson(const nlohmann::json& j) {
  const size_t ch = j.at("count").size();
  ChannelStats s(static_cast<int>(ch));
  for (size_t c = 0; c < ch; ++c) {
    s.count_[c] = j.at("count")[c].get<int64_t>();
    s.sum_[c] = j.at("sum")[c].get<double>();
    s.sumsq_[c] = j.at("sumsq")[c].get<double>();
    if (!j.at("min")[c].is_null()) s.min_[c] = j.at("min")[c].get<double>();
    if (!j.at("max")[c].is_null()) s.max_[c] = j.at("max")[c].get<double>();
  }
  return s;
}

nlohmann::json ChannelStats::Summary() const {
  nlohmann::json j;
  j["count"] = count();
  nlohmann::json mean = nlohmann::json::array(), sd = nlohmann::json::array(),
                 lo = nlohmann::json::array(), hi = nlohmann::json::array();
  for (int c = 0; c < channels(); ++c) {
    if (count_[c] == 0) {
      mean.push_back(nullptr);
      sd.push_back(nullptr);
      lo.push_back(nullptr);
      hi.push_back(nullptr);
      continue;
    }
    const double m = sum_[c] / count_[c];
    mean.push_back(m);
    sd.push_back(std::sqrt(std::max(0.0, sumsq_[c] / count_[c] - m * m)));
    lo.push_back(min_[c]);
    hi.push_back(max_[c]);
  }
  j["mean"] = mean;
  j["std"] = sd;
  j["min"] = lo;
  j["max"] = hi;
  return j;
}

}  // namespace kiln::data
