// `kiln data generate clicks`: a synthetic click log from a hidden preference model, written as an
// imported dataset (record shards + dataset.json, kind "clicks", readable as `dataset:DIR`), with
// the Bayes-optimal AUC and recall@K of its held-out split, so the achievable quality is known
// (docs/data.md "Click-log generator").
//
//   ClickLogOptions o{.out_dir = "/data/day1", .users = 500, .items = 1000, .events = 200000};
//   KILN_ASSIGN_OR_RETURN(ClickLogSummary s, GenerateClickLog(Env::Default(), o, progress));
//   s.bayes_auc;   // AUC of the true click probabilities on the held-out split
//
// The hidden model (all draws from std::mt19937_64 streams seeded from --seed and a tag, normals
// by Box-Muller over 53-bit uniforms, so a seed gives the same log on every platform):
//   user vectors u_U [dim], item vectors v_I [dim], entries N(0, dim^-1/4) (so <u, v> has
//   variance 1); item popularity b_i ~ N(0, 0.7); item log-price l_i ~ N(0, 0.5) (price e^l_i).
//   Day D > 1: u, v and b take D - 1 random-walk steps, each adding drift * the same N(...) draw
//   scale, a fresh stream per day; prices do not drift. Day 1 and day 2 of one seed share the
//   users and items and differ by one step.
//   Event: user and item uniform, hour uniform in 0..23 (a fresh stream per day);
//   score = 1.5 <u, v> + b_i - 0.6 l_i + 0.5 cos(2 pi (hour - 20) / 24) - 1;
//   p = sigmoid(score); click ~ Bernoulli(p).
// Records (tf.train.Example): "user", "item" (int64), "price", "hour" (float), "click" (int64,
// the label) and "probability" (float, the true p: for analysis, never a model input).
#ifndef KILN_DATA_IMPORT_CLICK_LOG_H_
#define KILN_DATA_IMPORT_CLICK_LOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/import/image_import.h"
#include "kiln/data/import_util.h"

namespace kiln::data {

struct ClickLogOptions {
  std::string out_dir;
  int64_t users = 1000;
  int64_t items = 1000;
  int64_t events = 100000;
  int64_t day = 1;  // >= 1
  uint64_t seed = 0;
  int64_t dim = 8;     // latent dimension of the hidden model
  double drift = 0.3;  // random-walk step per day, relative to the latents' scale
  double held_out = 0.2;
  int shards = 4;
  int64_t recall_k = 10;
  int threads = 0;  // 0: all cores
};

struct ClickLogSummary {
  ImportSummary import;
  double click_rate = 0;    // over all events
  double bayes_auc = 0;     // held-out split, scored by the true probability
  double bayes_recall = 0;  // per-user recall@recall_k of the same ranking
  int64_t held_out_examples = 0;
};

// The hidden model of one (seed, day): what generates the events (exposed for tests).
struct ClickModel {
  int64_t dim = 0;
  std::vector<double> user, item;  // [users * dim], [items * dim]
  std::vector<double> popularity, log_price;
  static ClickModel Make(const ClickLogOptions& o);
  double Score(int64_t user, int64_t item, double hour) const;
};

absl::StatusOr<ClickLogSummary> GenerateClickLog(Env* env, const ClickLogOptions& options,
                                                 const ProgressFn& progress = nullptr);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_CLICK_LOG_H_
