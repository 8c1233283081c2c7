#include "kiln/data/import/click_log.h"

#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kiln/base/hash.h"
#include "kiln/base/status.h"
#include "kiln/data/click_metrics.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/shard_io.h"

namespace kiln::data {
namespace {

constexpr double kPi = 3.14159265358979323846;

// One named stream of the generator: mt19937_64 (fully specified by the standard) and our own
// uniform and normal draws (std::*_distribution differ between standard libraries).
class Stream {
 public:
  Stream(uint64_t seed, const std::string& tag, int64_t day = 0)
      : rng_(SplitMix64(seed ^ Fnv1a64(tag) ^ SplitMix64(static_cast<uint64_t>(day)))) {}
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * kPi * u2);
  }
  int64_t Below(int64_t n) {  // unbiased, in [0, n)
    const uint64_t un = static_cast<uint64_t>(n);
    const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % un);
    uint64_t v;
    do v = rng_();
    while (v >= limit);
    return static_cast<int64_t>(v % un);
  }

 private:
  std::mt19937_64 rng_;
};

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

absl::Status CheckOptions(const ClickLogOptions& o) {
  auto bad = [](const std::string& flag, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("generate clicks: ", flag, " ", what));
  };
  if (o.out_dir.empty()) return bad("--out", "is required");
  if (o.users < 1 || o.users > (int64_t{1} << 24)) return bad("--users", "must be in [1, 2^24]");
  if (o.items < 1 || o.items > (int64_t{1} << 24)) return bad("--items", "must be in [1, 2^24]");
  if (o.events < 10) return bad("--events", "must be >= 10");
  if (o.day < 1) return bad("--day", "must be >= 1");
  if (o.dim < 1 || o.dim > 256) return bad("--dim", "must be in [1, 256]");
  if (!(o.drift >= 0 && o.drift <= 10)) return bad("--drift", "must be in [0, 10]");
  if (!(o.held_out > 0 && o.held_out < 1)) return bad("--held-out", "must be in (0, 1)");
  if (o.shards < 1) return bad("--shards", "must be >= 1");
  if (o.recall_k < 1) return bad("--recall-k", "must be >= 1");
  return absl::OkStatus();
}

struct Event {
  int64_t user, item;
  float hour, price, probability;
  int click;
};

}  // namespace

ClickModel ClickModel::Make(const ClickLogOptions& o) {
  ClickModel m;
  m.dim = o.dim;
  const double scale = std::pow(static_cast<double>(o.dim), -0.25);
  auto fill = [&](std::vector<double>& v, int64_t n, const std::string& tag, double sd) {
    Stream s(o.seed, tag);
    v.resize(static_cast<size_t>(n));
    for (double& x : v) x = sd * s.Normal();
    for (int64_t d = 2; d <= o.day; ++d) {  // one random-walk step per day after the first
      Stream step(o.seed, tag + "/drift", d);
      for (double& x : v) x += o.drift * sd * step.Normal();
    }
  };
  fill(m.user, o.users * o.dim, "user", scale);
  fill(m.item, o.items * o.dim, "item", scale);
  fill(m.popularity, o.items, "popularity", 0.7);
  Stream price(o.seed, "price");
  m.log_price.resize(static_cast<size_t>(o.items));
  for (double& x : m.log_price) x = 0.5 * price.Normal();
  return m;
}

double ClickModel::Score(int64_t u, int64_t i, double hour) const {
  double dot = 0;
  for (int64_t k = 0; k < dim; ++k) dot += user[u * dim + k] * item[i * dim + k];
  return 1.5 * dot + popularity[i] - 0.6 * log_price[i] +
         0.5 * std::cos(2 * kPi * (hour - 20) / 24) - 1.0;
}

namespace {

// The log's events, in order: who saw which item at what hour, and whether they clicked.
std::vector<Event> DrawEvents(const ClickLogOptions& o, const ClickModel& model) {
  std::vector<Event> events(static_cast<size_t>(o.events));
  Stream s(o.seed, "events", o.day);
  for (Event& e : events) {
    e.user = s.Below(o.users);
    e.item = s.Below(o.items);
    e.hour = static_cast<float>(s.Below(24));
    const double p = Sigmoid(model.Score(e.user, e.item, e.hour));
    e.probability = static_cast<float>(p);
    e.click = s.Uniform() < p ? 1 : 0;
    e.price = static_cast<float>(std::exp(model.log_price[e.item]));
  }
  return events;
}

// Statistics of the dense features (the dataset: source normalizes with them) over the train
// split, and the Bayes-optimal metrics of the held-out split.
void SummarizeEvents(const ShardPlan& split, const std::vector<Event>& events, int64_t recall_k,
                     ClickLogSummary* summary, ChannelStats* price, ChannelStats* hour) {
  std::vector<int64_t> users;
  std::vector<double> scores;
  std::vector<int> labels;
  int64_t clicks = 0;
  for (size_t s = 0; s < split.shards.size(); ++s) {
    const bool held = split.shards[s].split == "held_out";
    for (int64_t row : split.items[s]) {
      const Event& e = events[row];
      clicks += e.click;
      if (held) {
        users.push_back(e.user);
        scores.push_back(e.probability);
        labels.push_back(e.click);
      } else {
        price->Add(e.price, 0);
        hour->Add(e.hour, 0);
      }
    }
  }
  summary->click_rate = static_cast<double>(clicks) / static_cast<double>(events.size());
  summary->held_out_examples = static_cast<int64_t>(labels.size());
  summary->bayes_auc = Auc(scores, labels).value_or(0.5);
  summary->bayes_recall = RecallAtK(users, scores, labels, recall_k).value_or(0.0);
}

DatasetManifest ClickLogManifest(const ClickLogOptions& o, const std::string& fingerprint,
                                 const std::vector<FinishedShard>& finished,
                                 const ChannelStats& price_stats, const ChannelStats& hour_stats,
                                 const ClickLogSummary& summary) {
  DatasetManifest m;
  m.kind = "clicks";
  m.features = {
      {"user", "int64", {}, "user id in [0, users)"},
      {"item", "int64", {}, "item id in [0, items)"},
      {"price", "float32", {}, "the item's price (dense feature)"},
      {"hour", "float32", {}, "hour of the impression, 0..23 (dense feature)"},
      {"click", "int64", {}, "1: clicked (the label)"},
      {"probability", "float32", {}, "the hidden model's click probability (not a model input)"}};
  m.label_feature = "click";
  m.label_vocabulary = {"0", "1"};
  m.statistics = {{"price", price_stats.Summary()}, {"hour", hour_stats.Summary()}};
  m.source_fingerprint = fingerprint;
  m.source_files = 0;
  for (const FinishedShard& f : finished) m.shards.push_back(f.entry);
  m.import_options = {{"users", o.users},      {"items", o.items},       {"events", o.events},
                      {"day", o.day},          {"seed", o.seed},         {"dim", o.dim},
                      {"drift", o.drift},      {"held_out", o.held_out}, {"shards", o.shards},
                      {"recall_k", o.recall_k}};
  m.extra = {{"sparse", {"user", "item"}},
             {"tables", {o.users, o.items}},
             {"dense", {"price", "hour"}},
             {"day", o.day},
             {"click_rate", summary.click_rate},
             {"bayes",
              {{"split", "held_out"},
               {"examples", summary.held_out_examples},
               {"auc", summary.bayes_auc},
               {"recall_k", o.recall_k},
               {"recall_at_k", summary.bayes_recall}}}};
  return m;
}

}  // namespace

absl::StatusOr<ClickLogSummary> GenerateClickLog(Env* env, const ClickLogOptions& o,
                                                 const ProgressFn& progress) {
  KILN_RETURN_IF_ERROR(CheckOptions(o));
  const ClickModel model = ClickModel::Make(o);
  const int64_t n = o.events;
  const std::vector<Event> events = DrawEvents(o, model);
  const ShardPlan split = PlanSplits(n, o.held_out, o.shards, o.seed);
  const std::string plan_text =
      absl::StrCat("clicks|", o.users, "|", o.items, "|", o.events, "|", o.day, "|", o.seed, "|",
                   o.dim, "|", o.drift, "|", o.held_out, "|", o.shards);
  const std::string fingerprint = Hex64(Fnv1a64(plan_text));
  const int threads = ResolveThreads(o.threads);
  auto encode = [&](int64_t row) {
    const Event& e = events[row];
    Example ex;
    ex.features["user"] = Feature::Int64s({e.user});
    ex.features["item"] = Feature::Int64s({e.item});
    ex.features["price"] = Feature::Floats({e.price});
    ex.features["hour"] = Feature::Floats({e.hour});
    ex.features["click"] = Feature::Int64s({e.click});
    ex.features["probability"] = Feature::Floats({e.probability});
    return EncodeExample(ex);
  };
  int64_t done = 0;
  auto produce = [&](size_t index, ShardWriter& w, nlohmann::json* state) -> absl::Status {
    const std::vector<int64_t>& items = split.items[index];
    const int64_t block = 4096;
    for (int64_t b = 0; b < static_cast<int64_t>(items.size()); b += block) {
      const int64_t m = std::min<int64_t>(block, static_cast<int64_t>(items.size()) - b);
      std::vector<std::string> out(static_cast<size_t>(m));
      ParallelFor(threads, m, [&](int64_t i) { out[i] = encode(items[b + i]); });
      for (const std::string& p : out) KILN_RETURN_IF_ERROR(w.Write(p));
      done += m;
      if (progress) progress({"generate", done, n, "events"});
    }
    *state = nlohmann::json::object();
    return absl::OkStatus();
  };
  ClickLogSummary summary;
  KILN_ASSIGN_OR_RETURN(std::vector<FinishedShard> finished,
                        WriteShards(env, o.out_dir, fingerprint, split.shards, produce,
                                    &summary.import.shards_kept, [&](size_t i) {
                                      done += static_cast<int64_t>(split.items[i].size());
                                      if (progress) progress({"generate", done, n, "events"});
                                    }));

  ChannelStats price_stats, hour_stats;
  SummarizeEvents(split, events, o.recall_k, &summary, &price_stats, &hour_stats);

  const DatasetManifest m =
      ClickLogManifest(o, fingerprint, finished, price_stats, hour_stats, summary);
  KILN_RETURN_IF_ERROR(WriteManifest(env, o.out_dir, m));
  summary.import.shards = static_cast<int>(m.shards.size());
  summary.import.splits = m.SplitExamples();
  summary.import.examples = n;
  summary.import.units = n;
  return summary;
}

}  // namespace kiln::data
