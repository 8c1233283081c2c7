#include "kiln/train/model_registry.h"

#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/mutex.h"
#include "kiln/base/status.h"
#include "kiln/nn/gpt.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/recommender.h"
#include "kiln/nn/vision.h"

namespace kiln::train {
namespace {

using Built = absl::StatusOr<std::unique_ptr<nn::Model>>;

absl::Status CheckImageSize(const ModelConfig& m, int64_t features) {
  if (m.channels * m.height * m.width == features) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model.channels * model.height * model.width = ", m.channels * m.height * m.width,
      " but the data has ", features, " features per example"));
}

Built BuildMlp(const ModelConfig& m, int64_t features, int64_t classes) {
  return std::make_unique<nn::MlpClassifier>(
      nn::MlpOptions{.in_features = features, .hidden = m.hidden, .num_classes = classes});
}

Built BuildCnn(const ModelConfig& m, int64_t features, int64_t classes) {
  if (absl::Status s = CheckImageSize(m, features); !s.ok()) return s;
  return std::make_unique<nn::ResNetCnn>(nn::ResNetOptions{.in_channels = m.channels,
                                                           .height = m.height,
                                                           .width = m.width,
                                                           .num_classes = classes,
                                                           .widths = m.widths,
                                                           .blocks_per_stage = m.blocks_per_stage});
}

Built BuildVit(const ModelConfig& m, int64_t features, int64_t classes) {
  if (absl::Status s = CheckImageSize(m, features); !s.ok()) return s;
  return std::make_unique<nn::VisionTransformer>(nn::VitOptions{.in_channels = m.channels,
                                                                .height = m.height,
                                                                .width = m.width,
                                                                .patch = m.patch,
                                                                .dim = m.dim,
                                                                .depth = m.depth,
                                                                .heads = m.heads,
                                                                .mlp_ratio = m.mlp_ratio,
                                                                .num_classes = classes,
                                                                .dropout = m.dropout});
}

// features = the sequence length, classes = the vocabulary.
Built BuildGpt(const ModelConfig& m, int64_t features, int64_t classes) {
  return std::make_unique<nn::Gpt>(nn::GptConfig{.vocab_size = classes,
                                                 .context = m.n_ctx > 0 ? m.n_ctx : features,
                                                 .dim = m.n_embd,
                                                 .layers = m.n_layer,
                                                 .heads = m.n_head,
                                                 .seq_len = features,
                                                 .dropout = m.dropout});
}

// The dense features are the columns after the ids.
Built BuildRecommender(const ModelConfig& m, int64_t features, int64_t /*classes*/) {
  const int64_t sparse = static_cast<int64_t>(m.tables.size());
  if (features < sparse) {
    return absl::InvalidArgumentError(absl::StrCat("model.tables lists ", sparse,
                                                   " sparse features but the data has only ",
                                                   features, " features per example"));
  }
  return std::make_unique<nn::Recommender>(nn::RecommenderOptions{.tables = m.tables,
                                                                  .dense = features - sparse,
                                                                  .embed_dim = m.embed_dim,
                                                                  .bottom = m.bottom,
                                                                  .top = m.top,
                                                                  .interaction = m.interaction});
}

struct Registry {
  Mutex mu;
  // A deque: the pointers FindModelKind returns stay valid as kinds are added.
  std::deque<ModelKind> kinds ABSL_GUARDED_BY(mu) = {{"mlp", false, BuildMlp},
                                                     {"cnn", false, BuildCnn},
                                                     {"vit", false, BuildVit},
                                                     {"gpt", true, BuildGpt},
                                                     {"recommender", false, BuildRecommender}};
};

Registry& GetRegistry() {
  static auto* r = new Registry();
  return *r;
}

}  // namespace

const ModelKind* FindModelKind(const std::string& kind) {
  Registry& r = GetRegistry();
  MutexLock l(r.mu);
  for (const ModelKind& k : r.kinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

void RegisterModelKind(ModelKind kind) {
  Registry& r = GetRegistry();
  MutexLock l(r.mu);
  for (ModelKind& k : r.kinds) {
    if (k.kind == kind.kind) {
      k = std::move(kind);
      return;
    }
  }
  r.kinds.push_back(std::move(kind));
}

std::vector<std::string> ModelKinds() {
  Registry& r = GetRegistry();
  MutexLock l(r.mu);
  std::vector<std::string> names;
  for (const ModelKind& k : r.kinds) names.push_back(k.kind);
  return names;
}

absl::Status CheckModelFitsData(const nn::Model& model, const data::DataShape& shape) {
  const auto* rec = dynamic_cast<const nn::Recommender*>(&model);
  if (rec == nullptr) return absl::OkStatus();
  if (shape.num_classes != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.kind recommender predicts clicks (2 classes: 0 and 1) but the data has ",
        shape.num_classes, " classes"));
  }
  const std::vector<int64_t>& tables = rec->options().tables;
  const std::vector<int64_t>& ids = shape.categorical_sizes;
  if (ids.empty()) return absl::OkStatus();  // a source that does not say
  if (ids.size() != tables.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.tables lists ", tables.size(), " tables but the data has ", ids.size(),
                     " sparse features (with ", absl::StrJoin(ids, ", "), " ids)"));
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    if (tables[k] < ids[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.tables[", k, "] is ", tables[k], " rows but sparse feature ", k,
                       " of the data has ", ids[k], " ids (set model.tables to [",
                       absl::StrJoin(ids, ", "), "])"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<nn::Model>> BuildModel(const ModelConfig& m, int64_t features,
                                                      int64_t classes) {
  const ModelKind* kind = FindModelKind(m.kind);
  if (kind == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.kind: '", m.kind,
                     "' is not trainable here; allowed: ", absl::StrJoin(ModelKinds(), ", ")));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<nn::Model> model, kind->build(m, features, classes));
  absl::Status s = model->Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("model: ", s.message()));
  return model;
}

}  // namespace kiln::train
