// Ranking metrics of a binary click model: exact AUC (rank-based, ties counted half) and per-user
// recall@K over the held-out impressions (docs/train.md "Ranking metrics"). Shared by the click
// log generator (the Bayes-optimal values of its held-out split) and the trainer's evaluator.
//
//   std::optional<double> auc = Auc(scores, clicks);            // nullopt: one class only
//   std::optional<double> r = RecallAtK(users, scores, clicks, 10);
#ifndef KILN_DATA_CLICK_METRICS_H_
#define KILN_DATA_CLICK_METRICS_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace kiln::data {

// The probability that a random positive (label != 0) scores above a random negative, a tie
// counting one half: the Mann-Whitney U statistic over P * N, from the average ranks of tied
// groups (O(n log n)). nullopt when there is no positive or no negative (or the sizes differ).
std::optional<double> Auc(const std::vector<double>& scores, const std::vector<int>& labels);

// Per-user recall@K, averaged over users: for each user with at least one positive and more
// than K examples (with K or fewer every ranking scores 1), rank that user's examples by score
// (descending), take the top K, and count the positives among them over the user's positives. Ties
// at the K boundary count their expected share under a random order (a tied group of g examples
// with p positives filling the last s slots adds p * s / g). nullopt when no user qualifies (or the
// sizes differ).
std::optional<double> RecallAtK(const std::vector<int64_t>& users,
                                const std::vector<double>& scores, const std::vector<int>& labels,
                                int64_t k);

}  // namespace kiln::data

#endif  // KILN_DATA_CLICK_METRICS_H_
