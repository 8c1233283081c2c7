// The input pipeline's dataset: and tokens: example sources: a folder `kiln data import` wrote,
// decoded into training tensors by the manifest's kind. See internal/example_source.h.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/dataset_reader.h"
#include "kiln/data/internal/example_source.h"
#include "kiln/data/token_dataset.h"
#include "nlohmann/json.hpp"

namespace kiln::data::internal {
namespace {

// "dataset:DIR": a folder `kiln data import` wrote (dataset_reader.h). Its train split's examples
// come first, then its held_out split's (presplit_train: the pipeline keeps the import's split).
// x and y by the manifest's kind:
//   images, dicom  x = f32 [C*H*W]: the "image" feature's HWC bytes transposed to CHW (the layout
//                  the cnn and vit models read) and normalized per channel with the manifest's
//                  statistics, (v - mean[c]) / std[c] (std 0 -> 1); y = s32 label.
//   csv            x = f32 [F]: every float32 feature but the label, in manifest order, each
//                  normalized with its manifest statistics, (v - mean) / std (std 0 -> 1);
//                  y = s32 label.
//   text           x = s32 [L], y = s32 [L]: a record's L + 1 "tokens", shifted by one.
//   clicks         x = f32 [S + D]: the sparse ids (exact floats) then the dense features
//                  normalized as for csv (OpenClicks below); y = s32 click.
//
// "tokens:DIR" is the same source for a text import only (token_dataset.h); with
// PipelineConfig::language set it is that language's held-out examples alone (a contiguous range
// of the held_out split: the import gives each language one held-out shard).
class DatasetExampleSource final : public ExampleSource {
 public:
  static absl::StatusOr<std::unique_ptr<ExampleSource>> Make(Env* env, const std::string& dir,
                                                             bool tokens = false,
                                                             const std::string& language = "") {
    auto s = std::unique_ptr<DatasetExampleSource>(new DatasetExampleSource());
    s->dir_ = dir;
    const std::string kind = tokens ? "tokens:" : "dataset:";
    if (tokens) {
      KILN_ASSIGN_OR_RETURN(DatasetManifest m, ReadManifest(env, dir));
      if (m.kind != "text") {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokens:", dir, ": ", dir, "/", kManifestName, " is a dataset of kind '", m.kind,
            "'; tokens: reads the token shards `kiln data import text` writes"));
      }
    } else if (!language.empty()) {
      return absl::InvalidArgumentError("a language applies to tokens: sources only");
    }
    KILN_ASSIGN_OR_RETURN(s->train_, DatasetReader::Open(env, dir, "train"));
    absl::StatusOr<std::unique_ptr<DatasetReader>> held = DatasetReader::Open(env, dir, "held_out");
    if (held.ok()) s->held_ = *std::move(held);
    const DatasetManifest& m = s->train_->manifest();
    s->kind_ = m.kind;
    s->n_train_ = s->train_->size();
    s->size_ = s->n_train_ + (s->held_ ? s->held_->size() : 0);
    if (!language.empty()) {
      KILN_ASSIGN_OR_RETURN(TokenLanguage l, FindTokenLanguage(m, dir, language));
      if (!s->held_ || l.held_out_begin + l.held_out_examples > s->held_->size()) {
        return absl::DataLossError(absl::StrCat(kind, dir, ": language ", language,
                                                "'s held-out shard is not in the held_out split"));
      }
      s->language_ = language;
      s->held_offset_ = l.held_out_begin;
      s->n_train_ = 0;
      s->size_ = l.held_out_examples;
    }
    if (m.kind == "images" || m.kind == "dicom") {
      const FeatureSchema* f = m.FindFeature("image");
      if (f == nullptr || f->shape.size() != 3)
        return absl::DataLossError(dir + "/dataset.json: no [H, W, C] \"image\" feature");
      s->hwc_ = f->shape;
      const int64_t c = f->shape[2];
      s->mean_.assign(c, 0.0);
      s->inv_std_.assign(c, 1.0);
      const nlohmann::json& st = m.statistics.value("image", nlohmann::json::object());
      if (st.contains("mean") && st.contains("std") &&
          st["mean"].size() == static_cast<size_t>(c)) {
        for (int64_t k = 0; k < c; ++k) {
          s->mean_[k] = st["mean"][k].get<double>();
          const double sd = st["std"][k].get<double>();
          s->inv_std_[k] = sd > 0 ? 1.0 / sd : 1.0;
        }
      }
      s->x_spec_ = {DType::kF32, Shape{f->shape[0] * f->shape[1] * c}};
      s->y_spec_ = {DType::kS32, Shape{}};
    } else if (m.kind == "csv") {
      for (const FeatureSchema& f : m.features) {
        if (f.name == m.label_feature || f.dtype != "float32" || !f.shape.empty()) continue;
        s->columns_.push_back(f.name);
        const nlohmann::json& st = m.statistics.value(f.name, nlohmann::json::object());
        double mean = 0, sd = 0;
        if (st.contains("mean") && st.contains("std") && !st["mean"].empty()) {
          mean = st["mean"][0].get<double>();
          sd = st["std"][0].get<double>();
        }
        s->mean_.push_back(mean);
        s->inv_std_.push_back(sd > 0 ? 1.0 / sd : 1.0);
      }
      if (s->columns_.empty())
        return absl::DataLossError(dir + "/dataset.json: no float32 feature to train on");
      s->x_spec_ = {DType::kF32, Shape{static_cast<int64_t>(s->columns_.size())}};
      s->y_spec_ = {DType::kS32, Shape{}};
    } else if (m.kind == "clicks") {
      KILN_RETURN_IF_ERROR(s->OpenClicks(dir, m));
    } else if (m.kind == "text") {
      const FeatureSchema* f = m.FindFeature("tokens");
      if (f == nullptr || f->shape.size() != 1 || f->shape[0] < 2)
        return absl::DataLossError(dir + "/dataset.json: no [L + 1] \"tokens\" feature");
      s->x_spec_ = {DType::kS32, Shape{f->shape[0] - 1}};
      s->y_spec_ = {DType::kS32, Shape{f->shape[0] - 1}};
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset:", dir, ": a dataset of kind '", m.kind, "' cannot be trained on"));
    }
    if (m.kind != "text" && m.label_feature.empty())
      return absl::InvalidArgumentError(absl::StrCat("dataset:", dir, " has no label feature"));
    return std::unique_ptr<ExampleSource>(std::move(s));
  }

  int64_t presplit_train() const override { return n_train_; }

  absl::Status Fetch(int64_t i, uint8_t* x_dst, uint8_t* y_dst, Reader*) const override {
    const DatasetReader& ds = i < n_train_ ? *train_ : *held_;
    KILN_ASSIGN_OR_RETURN(ExampleBatch b,
                          ds.ReadBatch({i < n_train_ ? i : i - n_train_ + held_offset_}));
    float* x = reinterpret_cast<float*>(x_dst);
    int32_t* y = reinterpret_cast<int32_t*>(y_dst);
    const DatasetManifest& m = train_->manifest();
    if (kind_ == "text") {
      const Tensor& t = b.tensors.at("tokens");
      const int64_t* v = t.data<int64_t>();
      const int64_t l = y_spec_.shape.num_elements();
      for (int64_t k = 0; k < l; ++k) {
        reinterpret_cast<int32_t*>(x_dst)[k] = static_cast<int32_t>(v[k]);
        y[k] = static_cast<int32_t>(v[k + 1]);
      }
      return absl::OkStatus();
    }
    *y = static_cast<int32_t>(b.tensors.at(m.label_feature).data<int64_t>()[0]);
    if (kind_ == "clicks") return FetchClicks(b, ds, i < n_train_ ? i : i - n_train_, x);
    if (!columns_.empty()) {
      for (size_t k = 0; k < columns_.size(); ++k) {
        const double v = b.tensors.at(columns_[k]).data<float>()[0];
        x[k] = static_cast<float>((v - mean_[k]) * inv_std_[k]);
      }
      return absl::OkStatus();
    }
    const uint8_t* px = b.tensors.at("image").data<uint8_t>();
    const int64_t h = hwc_[0], w = hwc_[1], c = hwc_[2];
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < h * w; ++p)
        x[ch * h * w + p] = static_cast<float>((px[p * c + ch] - mean_[ch]) * inv_std_[ch]);
    return absl::OkStatus();
  }

  // kind "clicks" (data/click_log.h): x = [the sparse ids as exact floats, then the dense
  // features normalized with the manifest's statistics], in the manifest's extra.sparse and
  // extra.dense order. An id outside [0, extra.tables[k]) is DataLoss naming the record.
  absl::Status OpenClicks(const std::string& dir, const DatasetManifest& m) {
    const nlohmann::json& e = m.extra;
    if (!e.is_object() || !e.contains("sparse") || !e.contains("dense") || !e.contains("tables") ||
        !e["sparse"].is_array() || !e["dense"].is_array() || !e["tables"].is_array() ||
        e["tables"].size() != e["sparse"].size()) {
      return absl::DataLossError(
          dir + "/dataset.json: a clicks dataset needs extra.sparse, extra.tables and extra.dense");
    }
    for (size_t k = 0; k < e["sparse"].size(); ++k) {
      sparse_.push_back(e["sparse"][k].get<std::string>());
      tables_.push_back(e["tables"][k].get<int64_t>());
    }
    for (const auto& d : e["dense"]) {
      const std::string name = d.get<std::string>();
      columns_.push_back(name);
      const nlohmann::json& st = m.statistics.value(name, nlohmann::json::object());
      double mean = 0, sd = 0;
      if (st.contains("mean") && st.contains("std") && !st["mean"].empty()) {
        mean = st["mean"][0].get<double>();
        sd = st["std"][0].get<double>();
      }
      mean_.push_back(mean);
      inv_std_.push_back(sd > 0 ? 1.0 / sd : 1.0);
    }
    x_spec_ = {DType::kF32, Shape{static_cast<int64_t>(sparse_.size() + columns_.size())}};
    y_spec_ = {DType::kS32, Shape{}};
    return absl::OkStatus();
  }

  absl::Status FetchClicks(const ExampleBatch& b, const DatasetReader& ds, int64_t i,
                           float* x) const {
    for (size_t k = 0; k < sparse_.size(); ++k) {
      const int64_t id = b.tensors.at(sparse_[k]).data<int64_t>()[0];
      if (id < 0 || id >= tables_[k]) {
        return absl::DataLossError(absl::StrCat(ds.Location(i), ": ", sparse_[k], " id ", id,
                                                " is outside [0, ", tables_[k], ")"));
      }
      x[k] = static_cast<float>(id);
    }
    const size_t s = sparse_.size();
    for (size_t k = 0; k < columns_.size(); ++k) {
      const double v = b.tensors.at(columns_[k]).data<float>()[0];
      x[s + k] = static_cast<float>((v - mean_[k]) * inv_std_[k]);
    }
    return absl::OkStatus();
  }

  std::string FingerprintMaterial() const override {
    std::string m = absl::StrCat("dataset|", train_->manifest().source_fingerprint, "|", size_, "|",
                                 x_spec_.ToString(), "|", y_spec_.ToString());
    if (!language_.empty()) absl::StrAppend(&m, "|language ", language_);
    return m;
  }

 private:
  DatasetExampleSource() = default;
  std::string dir_, kind_, language_;
  std::unique_ptr<DatasetReader> train_, held_;
  int64_t n_train_ = 0;
  int64_t held_offset_ = 0;  // a language's examples start here in the held_out split
  std::vector<int64_t> hwc_;
  std::vector<double> mean_, inv_std_;
  std::vector<std::string> columns_;
  std::vector<std::string> sparse_;  // clicks
  std::vector<int64_t> tables_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExampleSource>> OpenDatasetExampleSource(
    Env* env, const std::string& dir, bool tokens, const std::string& language) {
  return DatasetExampleSource::Make(env, dir, tokens, language);
}

}  // namespace kiln::data::internal
