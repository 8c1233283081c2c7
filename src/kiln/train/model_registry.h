// Model kinds by name: `model.kind` in a config picks a builder here. Each entry says whether the
// kind is a language model (tokens -> next tokens; the data gives s32 [batch, seq] tokens) or a
// classifier (f32 features -> s32 labels).
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<nn::Model> m, BuildModel(config.model, 64, 10));
//   RegisterModelKind({.kind = "mine", .build = BuildMine});   // a new kind, before
//   Trainer::Create
#ifndef KILN_TRAIN_MODEL_REGISTRY_H_
#define KILN_TRAIN_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/data/train_data.h"
#include "kiln/nn/model.h"
#include "kiln/train/config.h"

namespace kiln::train {

struct ModelKind {
  std::string kind;
  bool language_model = false;
  // `features` inputs per example and `classes` classes (language models: the sequence length and
  // the vocabulary size). The registry validates the model it returns.
  std::function<absl::StatusOr<std::unique_ptr<nn::Model>>(const ModelConfig&, int64_t features,
                                                           int64_t classes)>
      build;
};

// The kind named `kind`; nullptr if none is registered. Built in: mlp, cnn, vit, gpt, recommender.
const ModelKind* FindModelKind(const std::string& kind);
// Adds or replaces a kind (thread-safe; call before the trainers that use it are created).
void RegisterModelKind(ModelKind kind);
// Registered kinds in registration order.
std::vector<std::string> ModelKinds();

// Builds and validates the model a config describes, for `num_features` inputs and `num_classes`
// classes (gpt: num_features = the sequence length, num_classes = the vocabulary size).
absl::StatusOr<std::unique_ptr<nn::Model>> BuildModel(const ModelConfig& config,
                                                      int64_t num_features, int64_t num_classes);

// Whether `model` can read data of `shape`: a recommender needs 2 classes and, where the data
// says (a clicks dataset), as many tables as sparse features, each with at least its ids' rows.
// InvalidArgument naming the key otherwise; OK for other kinds.
absl::Status CheckModelFitsData(const nn::Model& model, const data::DataShape& shape);

}  // namespace kiln::train

#endif  // KILN_TRAIN_MODEL_REGISTRY_H_
