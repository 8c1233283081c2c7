// The input pipeline's example order: which examples this host and split keep, and the order of
// each epoch (a pure function of seed and epoch; pipeline.h, docs/formats.md).
#include <algorithm>
#include <random>

#include "kiln/base/hash.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset.h"
#include "kiln/data/internal/pipeline_impl.h"

namespace kiln::data {
namespace {

// The mt19937_64 seed of epoch `epoch`'s order.
uint64_t MixSeed(uint64_t seed, uint64_t epoch) { return SplitMix64(seed ^ SplitMix64(epoch)); }

// Uniform in [0, n) by rejection (no modulo bias), the same on every standard library.
uint64_t BoundedDraw(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  while (true) {
    uint64_t r = rng();
    if (r < limit) return r % n;
  }
}

}  // namespace

double HeldOutHash(uint64_t split_seed, int64_t index) {
  const uint64_t h = SplitMix64(split_seed ^ SplitMix64(static_cast<uint64_t>(index) + 1));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

namespace internal {

absl::StatusOr<std::vector<int64_t>> SelectExamples(const PipelineConfig& config,
                                                    const ExampleSource& source) {
  const int64_t n = source.size();
  const bool want_held_out = config.split == "held_out";
  std::vector<int64_t> ids;
  auto keep = [&](int64_t i) {
    if (i % config.num_shards == config.shard_index) ids.push_back(i);
  };
  if (const int64_t n_train = source.presplit_train(); n_train >= 0) {  // the import's split
    for (int64_t i = want_held_out ? n_train : 0; i < (want_held_out ? n : n_train); ++i) keep(i);
    return ids;
  }
  if (IsCsv(config)) {
    KILN_ASSIGN_OR_RETURN(SplitIndices split,
                          SplitExampleIndices(n, config.held_out_fraction, config.split_seed));
    for (int64_t i : want_held_out ? split.held_out : split.train) keep(i);
    return ids;
  }
  for (int64_t i = 0; i < n; ++i) {
    const bool held_out = HeldOutHash(config.split_seed, i) < config.held_out_fraction;
    if (held_out == want_held_out) keep(i);
  }
  return ids;
}

}  // namespace internal

std::shared_ptr<const std::vector<int64_t>> InputPipeline::Impl::OrderOf(int64_t e) {
  std::lock_guard<std::mutex> lock(order_mu);
  for (int k = 0; k < 2; ++k)
    if (order_epoch[k] == e) return order[k];
  const int k = order_epoch[0] < order_epoch[1] ? 0 : 1;  // replace the older one
  order[k] = std::make_shared<const std::vector<int64_t>>(ComputeOrder(e));
  order_epoch[k] = e;
  return order[k];
}

std::vector<int64_t> InputPipeline::Impl::ComputeOrder(int64_t e) const {
  if (!config.shuffle) return ids;
  std::mt19937_64 rng(MixSeed(config.seed, static_cast<uint64_t>(e)));
  if (config.shuffle_buffer <= 0) {
    std::vector<int64_t> perm = Permutation(M(), rng);
    std::vector<int64_t> out(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) out[k] = ids[perm[k]];
    return out;
  }
  std::vector<int64_t> base;
  const auto& starts = source->file_starts();
  if (!starts.empty()) {
    const int64_t nf = static_cast<int64_t>(starts.size()) - 1;
    std::vector<int64_t> fperm = Permutation(nf, rng);
    base.reserve(ids.size());
    for (int64_t f : fperm) {
      auto lo = std::lower_bound(ids.begin(), ids.end(), starts[f]);
      auto hi = std::lower_bound(ids.begin(), ids.end(), starts[f + 1]);
      base.insert(base.end(), lo, hi);
    }
  } else {
    base = ids;
  }
  const size_t cap = static_cast<size_t>(config.shuffle_buffer);
  std::vector<int64_t> buf, out;
  out.reserve(base.size());
  buf.reserve(std::min(cap, base.size()));
  for (int64_t v : base) {
    if (buf.size() < cap) {
      buf.push_back(v);
      continue;
    }
    const uint64_t j = BoundedDraw(rng, buf.size());
    out.push_back(buf[j]);
    buf[j] = v;
  }
  while (!buf.empty()) {
    const uint64_t j = BoundedDraw(rng, buf.size());
    out.push_back(buf[j]);
    buf[j] = buf.back();
    buf.pop_back();
  }
  return out;
}

}  // namespace kiln::data
