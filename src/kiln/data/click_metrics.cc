#include "kiln/data/click_metrics.h"

#include <algorithm>
#include <numeric>

namespace kiln::data {

std::optional<double> Auc(const std::vector<double>& scores, const std::vector<int>& labels) {
  const size_t n = scores.size();
  if (labels.size() != n) return std::nullopt;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0;
  int64_t positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;  // 1-based
    for (size_t t = i; t < j; ++t) {
      if (labels[order[t]] != 0) {
        positive_rank_sum += rank;
        ++positives;
      }
    }
    i = j;
  }
  const int64_t negatives = static_cast<int64_t>(n) - positives;
  if (positives == 0 || negatives == 0) return std::nullopt;
  const double p = static_cast<double>(positives);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
}

std::optional<double> RecallAtK(const std::vector<int64_t>& users,
                                const std::vector<double>& scores, const std::vector<int>& labels,
                                int64_t k) {
  const size_t n = scores.size();
  if (users.size() != n || labels.size() != n || k < 1) return std::nullopt;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  // By user, then by score descending.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (users[a] != users[b]) return users[a] < users[b];
    return scores[a] > scores[b];
  });
  double sum = 0;
  int64_t counted = 0;
  for (size_t u = 0; u < n;) {
    size_t end = u;
    int64_t positives = 0;
    while (end < n && users[order[end]] == users[order[u]]) {
      positives += labels[order[end]] != 0;
      ++end;
    }
    if (positives > 0 && static_cast<int64_t>(end - u) > k) {
      double hits = 0;
      int64_t slots = k;
      for (size_t i = u; i < end && slots > 0;) {
        size_t j = i;
        int64_t tied_positives = 0;
        while (j < end && scores[order[j]] == scores[order[i]]) {
          tied_positives += labels[order[j]] != 0;
          ++j;
        }
        const int64_t g = static_cast<int64_t>(j - i);
        const int64_t take = std::min(g, slots);
        hits += static_cast<double>(tied_positives) * static_cast<double>(take) / g;
        slots -= take;
        i = j;
      }
      sum += hits / static_cast<double>(positives);
      ++counted;
    }
    u = end;
  }
  if (counted == 0) return std::nullopt;
  return sum / static_cast<double>(counted);
}

}  // namespace kiln::data
