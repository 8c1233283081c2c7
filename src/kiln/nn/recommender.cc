#include "kiln/nn/recommender.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::nn {

Recommender::Recommender(RecommenderOptions options) : options_(std::move(options)) {
  const int64_t d = options_.embed_dim;
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    Embedding e(absl::StrCat("tables/", t), options_.tables[t], d);
    // N(0, 1/sqrt(d)): a dot of two rows starts with variance 1/d, not d (torch's N(0, 1)).
    e.set_init(Initializer::Normal(1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(d, 1)))));
    tables_.push_back(std::move(e));
  }
  if (options_.dense > 0) {
    int64_t in = options_.dense;
    int i = 0;
    for (int64_t w : options_.bottom) {
      bottom_.emplace_back(absl::StrCat("bottom/", i++), in, w);
      in = w;
    }
    bottom_.emplace_back(absl::StrCat("bottom/", i), in, d);
  }
  int64_t in = interaction_width();
  int i = 0;
  for (int64_t w : options_.top) {
    top_.emplace_back(absl::StrCat("top/", i++), in, w);
    in = w;
  }
  top_.emplace_back(absl::StrCat("top/", i), in, 1);
}

int64_t Recommender::interaction_width() const {
  const int64_t s = static_cast<int64_t>(options_.tables.size());
  const int64_t vectors = s + (options_.dense > 0 ? 1 : 0);
  if (options_.interaction == "concat") return vectors * options_.embed_dim;
  // dot: the bottom output itself (when there are dense features) and every pair's dot.
  return (options_.dense > 0 ? options_.embed_dim : 0) + vectors * (vectors - 1) / 2;
}

absl::Status Recommender::Validate() const {
  const RecommenderOptions& o = options_;
  if (o.tables.empty()) {
    return absl::InvalidArgumentError("recommender: needs at least one sparse feature (tables)");
  }
  for (int64_t rows : o.tables) {
    if (rows < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("recommender: every table needs >= 1 row, got ", rows));
    }
  }
  if (o.dense < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("recommender: dense must be >= 0, got ", o.dense));
  if (o.embed_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("recommender: embed_dim must be >= 1, got ", o.embed_dim));
  }
  for (const auto* widths : {&o.bottom, &o.top}) {
    for (int64_t w : *widths) {
      if (w < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("recommender: ", widths == &o.bottom ? "bottom" : "top",
                         " widths must be >= 1, got ", w));
      }
    }
  }
  if (o.interaction != "dot" && o.interaction != "concat") {
    return absl::InvalidArgumentError(
        absl::StrCat("recommender: interaction '", o.interaction, "' is not one of dot, concat"));
  }
  if (interaction_width() < 1) {
    return absl::InvalidArgumentError(
        "recommender: a dot interaction of one sparse feature and no dense features has nothing "
        "to interact: add dense features or a table, or use interaction concat");
  }
  return absl::OkStatus();
}

std::vector<ParamSpec> Recommender::Params() const {
  std::vector<ParamSpec> specs;
  for (const Embedding& e : tables_)
    for (ParamSpec& s : e.Params()) specs.push_back(std::move(s));
  for (const Linear& l : bottom_)
    for (ParamSpec& s : l.Params()) specs.push_back(std::move(s));
  for (const Linear& l : top_)
    for (ParamSpec& s : l.Params()) specs.push_back(std::move(s));
  return specs;
}

ir::Value Recommender::Logit(const ParamValues& params, ir::Value x) const {
  const int64_t batch = x.shape()[0];
  const int64_t s = static_cast<int64_t>(tables_.size());
  std::vector<ir::Value> vectors;
  for (int64_t t = 0; t < s; ++t) {
    ir::Value column = ir::Reshape(ir::Slice(x, {0, t}, {batch, t + 1}), Shape{batch});
    vectors.push_back(tables_[t].Apply(params, ir::Convert(column, DType::kS32)));
  }
  ir::Value h;
  if (options_.dense > 0) {
    h = ir::Slice(x, {0, s}, {batch, s + options_.dense});
    for (const Linear& l : bottom_) h = ir::Relu(l.Apply(params, h));
    vectors.push_back(h);
  }
  ir::Value z;
  if (options_.interaction == "concat") {
    z = vectors.size() == 1 ? vectors[0] : ir::Concatenate(vectors, 1);
  } else {
    std::vector<ir::Value> parts;
    if (h.valid()) parts.push_back(h);
    for (size_t a = 0; a < vectors.size(); ++a) {
      for (size_t b = a + 1; b < vectors.size(); ++b) {
        parts.push_back(ir::Reshape(ir::ReduceSum(vectors[a] * vectors[b], {1}), Shape{batch, 1}));
      }
    }
    z = parts.size() == 1 ? parts[0] : ir::Concatenate(parts, 1);
  }
  for (size_t i = 0; i < top_.size(); ++i) {
    z = top_[i].Apply(params, z);
    if (i + 1 < top_.size()) z = ir::Relu(z);
  }
  return z;
}

namespace {

// [0, logit]: two-class logits whose softmax cross-entropy is sigmoid BCE of the logit.
ir::Value TwoClassLogits(ir::Value logit) { return ir::Concatenate({logit * 0.0, logit}, 1); }

}  // namespace

absl::StatusOr<ir::Graph> Recommender::LossGraph(int64_t batch) const {
  return BuildClassifierLossGraph("recommender_loss", Params(), DType::kF32, batch, num_features(),
                                  /*with_rng=*/false,
                                  [this](const ParamValues& p, ir::Value x, const RngInputs&) {
                                    return TwoClassLogits(Logit(p, x));
                                  });
}

absl::StatusOr<ir::Graph> Recommender::PredictGraph(int64_t batch) const {
  return BuildClassifierPredictGraph("recommender_predict", Params(), DType::kF32, batch,
                                     num_features(),
                                     [this](const ParamValues& p, ir::Value x, const RngInputs&) {
                                       return TwoClassLogits(Logit(p, x));
                                     });
}

std::string Recommender::Describe() const {
  return absl::StrCat("recommender tables ", absl::StrJoin(options_.tables, "-"), " dim ",
                      options_.embed_dim, " dense ", options_.dense, " bottom ",
                      absl::StrJoin(options_.bottom, "-"), " top ",
                      absl::StrJoin(options_.top, "-"), " ", options_.interaction, " -> 1");
}

}  // namespace kiln::nn
