#include "kiln/train/config.h"

#include <cctype>
#include <cmath>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kiln/base/hash.h"
#include "kiln/base/status.h"
#include "kiln/compiler/passes/mixed_precision.h"
#include "yaml-cpp/yaml.h"

namespace kiln::train {
namespace {

absl::Status KeyError(const std::string& key, const std::string& message) {
  return absl::InvalidArgumentError(key + ": " + message);
}

// Reads the fields of one mapping, remembering which keys it consumed so the rest can be
// reported as unknown.
class Section {
 public:
  Section(YAML::Node node, std::string path) : node_(node), path_(std::move(path)) {}

  std::string Key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }

  template <typename T>
  absl::Status Get(const std::string& key, T* out) {
    known_.push_back(key);
    if (!node_.IsDefined() || node_.IsNull()) return absl::OkStatus();
    KILN_RETURN_IF_ERROR(CheckMap());
    YAML::Node v = node_[key];
    if (!v.IsDefined() || v.IsNull()) return absl::OkStatus();
    try {
      *out = v.as<T>();
    } catch (const std::exception&) {
      return KeyError(Key(key), absl::StrCat("expected ", TypeName<T>(), ", got '", Dump(v), "'"));
    }
    return absl::OkStatus();
  }

  absl::Status GetEnum(const std::string& key, const std::vector<std::string>& allowed,
                       std::string* out) {
    KILN_RETURN_IF_ERROR(Get(key, out));
    for (const std::string& a : allowed) {
      if (*out == a) return absl::OkStatus();
    }
    return KeyError(Key(key),
                    absl::StrCat("'", *out, "' is not one of ", absl::StrJoin(allowed, ", ")));
  }

  YAML::Node Child(const std::string& key) {
    known_.push_back(key);
    if (!node_.IsDefined() || node_.IsNull() || !node_.IsMap()) return YAML::Node();
    return node_[key];
  }

  // A section given as a scalar or a list (`--set optimizer=5`) is an error naming the section,
  // not a yaml-cpp subscript exception.
  absl::Status CheckMap() const {
    if (!node_.IsDefined() || node_.IsNull() || node_.IsMap()) return absl::OkStatus();
    return KeyError(path_.empty() ? "(top level)" : path_,
                    absl::StrCat("expected a mapping of keys (like ",
                                 path_.empty() ? "steps: 100" : path_ + ": {kind: ...}", "), got '",
                                 Dump(node_), "'"));
  }

  absl::Status CheckMapAndUnknown() const {
    if (!node_.IsDefined() || node_.IsNull()) return absl::OkStatus();
    KILN_RETURN_IF_ERROR(CheckMap());
    for (const auto& kv : node_) {
      std::string k = kv.first.as<std::string>();
      if (std::find(known_.begin(), known_.end(), k) == known_.end()) {
        return KeyError(Key(k),
                        absl::StrCat("unknown key (allowed: ", absl::StrJoin(known_, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

 private:
  static std::string Dump(const YAML::Node& n) {
    YAML::Emitter e;
    e << YAML::Flow << n;
    return e.c_str();
  }
  template <typename T>
  static std::string TypeName() {
    if constexpr (std::is_same_v<T, bool>)
      return "true or false";
    else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>)
      return absl::StrCat("a non-negative integer (0 to ", std::numeric_limits<T>::max(), ")");
    else if constexpr (std::is_integral_v<T>)
      return "an integer";
    else if constexpr (std::is_floating_point_v<T>)
      return "a number";
    else if constexpr (std::is_same_v<T, std::string>)
      return "a string";
    else if constexpr (std::is_same_v<T, std::vector<std::string>>)
      return "a list of strings";
    else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>)
      return "a mapping of strings to strings";
    else
      return "a list of numbers";
  }

  YAML::Node node_;
  std::string path_;
  std::vector<std::string> known_;
};

absl::Status ApplyOverride(YAML::Node& root, const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set '", text, "': expected key=value (e.g. optimizer.lr=0.01)"));
  }
  std::string key = text.substr(0, eq);
  std::string value = text.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) {
    if (p.empty()) return KeyError(key, "empty component in --set key");
    parts.push_back(p);
  }
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const std::exception& e) {
    return KeyError(key, absl::StrCat("cannot parse --set value '", value, "': ", e.what()));
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  // yaml-cpp nodes are handles: walk down by reassigning a handle, never by operator= on a
  // node (which would overwrite it).
  std::vector<YAML::Node> chain = {root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    } else if (!next.IsMap()) {
      return KeyError(key, absl::StrCat("'", parts[i], "' is not a section"));
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = parsed;
  return absl::OkStatus();
}

// The recommender's model keys (nn/recommender.h).
absl::Status RecommenderFromYaml(Section& s, ModelConfig* m) {
  KILN_RETURN_IF_ERROR(s.Get("tables", &m->tables));
  KILN_RETURN_IF_ERROR(s.Get("embed_dim", &m->embed_dim));
  KILN_RETURN_IF_ERROR(s.Get("bottom", &m->bottom));
  KILN_RETURN_IF_ERROR(s.Get("top", &m->top));
  return s.GetEnum("interaction", {"dot", "concat"}, &m->interaction);
}

// The init_from section (init_from.h).
absl::Status InitFromFromYaml(Section& top, InitFromConfig* c) {
  Section s(top.Child("init_from"), "init_from");
  KILN_RETURN_IF_ERROR(s.Get("checkpoint", &c->checkpoint));
  KILN_RETURN_IF_ERROR(s.Get("include", &c->include));
  KILN_RETURN_IF_ERROR(s.Get("exclude", &c->exclude));
  KILN_RETURN_IF_ERROR(s.Get("rename", &c->rename));
  return s.CheckMapAndUnknown();
}

// A key that is `auto` (-1 in *out) or an integer number of `unit`: true when a number was
// read (its range is the caller's to check); an absent or null key leaves *out unchanged.
absl::StatusOr<bool> AutoOrIntFromYaml(YAML::Node node, const char* key, const char* unit,
                                       int* out) {
  if (!node.IsDefined() || node.IsNull()) return false;
  if (node.IsScalar() && node.Scalar() == "auto") {
    *out = -1;
    return false;
  }
  try {
    *out = node.as<int>();
  } catch (const std::exception&) {
    YAML::Emitter e;
    e << YAML::Flow << node;
    return KeyError(key,
                    absl::StrCat("expected auto or a number of ", unit, ", got '", e.c_str(), "'"));
  }
  return true;
}

// data.prefetch: `auto` (-1) or a number of batches.
absl::Status PrefetchFromYaml(YAML::Node node, int* out) {
  KILN_ASSIGN_OR_RETURN(const bool number,
                        AutoOrIntFromYaml(node, "data.prefetch", "batches", out));
  if (number && *out < 0) {
    return KeyError("data.prefetch", absl::StrCat("must be auto or >= 0, got ", *out));
  }
  return absl::OkStatus();
}

// data.workers: `auto` (-1) or a number of threads, 1..64.
absl::Status WorkersFromYaml(YAML::Node node, int* out) {
  KILN_ASSIGN_OR_RETURN(const bool number, AutoOrIntFromYaml(node, "data.workers", "threads", out));
  if (number && (*out < 1 || *out > 64)) {
    return KeyError("data.workers", absl::StrCat("must be auto or in [1, 64], got ", *out));
  }
  return absl::OkStatus();
}

// data.augment: {random_crop: {size: [H, W], padding: P}, flip_horizontal: B,
// normalize: {mean: [...], std: [...]}}.
absl::Status AugmentFromYaml(YAML::Node node, AugmentSection* a) {
  Section s(node, "data.augment");
  KILN_RETURN_IF_ERROR(s.CheckMap());
  YAML::Node crop = s.Child("random_crop");
  if (crop.IsDefined() && !crop.IsNull()) {
    a->random_crop = true;
    Section c(crop, "data.augment.random_crop");
    KILN_RETURN_IF_ERROR(c.Get("size", &a->crop_size));
    KILN_RETURN_IF_ERROR(c.Get("padding", &a->padding));
    KILN_RETURN_IF_ERROR(c.CheckMapAndUnknown());
  }
  KILN_RETURN_IF_ERROR(s.Get("flip_horizontal", &a->flip_horizontal));
  Section n(s.Child("normalize"), "data.augment.normalize");
  KILN_RETURN_IF_ERROR(n.Get("mean", &a->mean));
  KILN_RETURN_IF_ERROR(n.Get("std", &a->std));
  KILN_RETURN_IF_ERROR(n.CheckMapAndUnknown());
  return s.CheckMapAndUnknown();
}

// optimizer.param_groups: a list of {match, lr_scale, freeze} mappings.
absl::Status ParamGroupsFromYaml(YAML::Node node, std::vector<ParamGroupSection>* out) {
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  if (!node.IsSequence()) {
    return KeyError("optimizer.param_groups",
                    "expected a list of groups (like [{match: \"blocks/*\", lr_scale: 0.1}, "
                    "{match: \"patch_embed/*\", freeze: true}])");
  }
  out->clear();
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string key = absl::StrCat("optimizer.param_groups[", i, "]");
    Section g(node[i], key);
    if (!node[i].IsMap()) KILN_RETURN_IF_ERROR(g.CheckMap());
    ParamGroupSection pg;
    KILN_RETURN_IF_ERROR(g.Get("match", &pg.match));
    KILN_RETURN_IF_ERROR(g.Get("lr_scale", &pg.lr_scale));
    KILN_RETURN_IF_ERROR(g.Get("freeze", &pg.freeze));
    KILN_RETURN_IF_ERROR(g.CheckMapAndUnknown());
    out->push_back(pg);
  }
  return absl::OkStatus();
}

absl::Status FromYaml(YAML::Node root, TrainConfig* c) {
  Section top(root, "");
  {
    Section s(top.Child("model"), "model");
    KILN_RETURN_IF_ERROR(
        s.GetEnum("kind", {"mlp", "cnn", "vit", "gpt", "recommender"}, &c->model.kind));
    KILN_RETURN_IF_ERROR(s.Get("hidden", &c->model.hidden));
    KILN_RETURN_IF_ERROR(s.Get("widths", &c->model.widths));
    KILN_RETURN_IF_ERROR(s.Get("blocks_per_stage", &c->model.blocks_per_stage));
    KILN_RETURN_IF_ERROR(s.Get("patch", &c->model.patch));
    KILN_RETURN_IF_ERROR(s.Get("dim", &c->model.dim));
    KILN_RETURN_IF_ERROR(s.Get("depth", &c->model.depth));
    KILN_RETURN_IF_ERROR(s.Get("heads", &c->model.heads));
    KILN_RETURN_IF_ERROR(s.Get("mlp_ratio", &c->model.mlp_ratio));
    KILN_RETURN_IF_ERROR(s.Get("dropout", &c->model.dropout));
    KILN_RETURN_IF_ERROR(s.Get("channels", &c->model.channels));
    KILN_RETURN_IF_ERROR(s.Get("height", &c->model.height));
    KILN_RETURN_IF_ERROR(s.Get("width", &c->model.width));
    KILN_RETURN_IF_ERROR(s.Get("n_layer", &c->model.n_layer));
    KILN_RETURN_IF_ERROR(s.Get("n_head", &c->model.n_head));
    KILN_RETURN_IF_ERROR(s.Get("n_embd", &c->model.n_embd));
    KILN_RETURN_IF_ERROR(s.Get("n_ctx", &c->model.n_ctx));
    KILN_RETURN_IF_ERROR(s.Get("vocab_size", &c->model.vocab_size));
    KILN_RETURN_IF_ERROR(RecommenderFromYaml(s, &c->model));
    KILN_RETURN_IF_ERROR(s.CheckMapAndUnknown());
  }
  {
    Section s(top.Child("data"), "data");
    KILN_RETURN_IF_ERROR(s.Get("source", &c->data.source));
    KILN_RETURN_IF_ERROR(s.Get("batch_size", &c->data.batch_size));
    KILN_RETURN_IF_ERROR(s.Get("shuffle", &c->data.shuffle));
    KILN_RETURN_IF_ERROR(s.Get("seed", &c->data.seed));
    KILN_RETURN_IF_ERROR(s.Get("held_out_fraction", &c->data.held_out_fraction));
    KILN_RETURN_IF_ERROR(s.GetEnum("remainder", {"drop", "wrap", "pad"}, &c->data.remainder));
    KILN_RETURN_IF_ERROR(s.Get("shuffle_buffer", &c->data.shuffle_buffer));
    KILN_RETURN_IF_ERROR(PrefetchFromYaml(s.Child("prefetch"), &c->data.prefetch));
    KILN_RETURN_IF_ERROR(WorkersFromYaml(s.Child("workers"), &c->data.workers));
    KILN_RETURN_IF_ERROR(AugmentFromYaml(s.Child("augment"), &c->data.augment));
    KILN_RETURN_IF_ERROR(s.Get("num_classes", &c->data.num_classes));
    KILN_RETURN_IF_ERROR(s.Get("seq_len", &c->data.seq_len));
    KILN_RETURN_IF_ERROR(s.CheckMapAndUnknown());
  }
  {
    Section s(top.Child("optimizer"), "optimizer");
    KILN_RETURN_IF_ERROR(s.GetEnum("kind", {"sgd", "adamw"}, &c->optimizer.kind));
    KILN_RETURN_IF_ERROR(s.Get("lr", &c->optimizer.lr));
    KILN_RETURN_IF_ERROR(s.Get("momentum", &c->optimizer.momentum));
    KILN_RETURN_IF_ERROR(s.Get("weight_decay", &c->optimizer.weight_decay));
    KILN_RETURN_IF_ERROR(s.Get("betas", &c->optimizer.betas));
    KILN_RETURN_IF_ERROR(s.Get("eps", &c->optimizer.eps));
    KILN_RETURN_IF_ERROR(s.Get("clip_norm", &c->optimizer.clip_norm));
    KILN_RETURN_IF_ERROR(ParamGroupsFromYaml(s.Child("param_groups"), &c->optimizer.param_groups));
    KILN_RETURN_IF_ERROR(s.Get("shard_state", &c->optimizer.shard_state));
    KILN_RETURN_IF_ERROR(s.CheckMapAndUnknown());
  }
  {
    Section s(top.Child("schedule"), "schedule");
    KILN_RETURN_IF_ERROR(
        s.GetEnum("kind", {"constant", "linear_warmup", "cosine"}, &c->schedule.kind));
    KILN_RETURN_IF_ERROR(s.Get("warmup_steps", &c->schedule.warmup_steps));
    KILN_RETURN_IF_ERROR(s.Get("min_lr", &c->schedule.min_lr));
    KILN_RETURN_IF_ERROR(s.CheckMapAndUnknown());
  }
  {
    Section s(top.Child("mesh"), "mesh");
    KILN_RETURN_IF_ERROR(s.Get("data", &c->mesh.data));
    KILN_RETURN_IF_ERROR(s.Get("model", &c->mesh.model));
    KILN_RETURN_IF_ERROR(s.CheckMapAndUnknown());
  }
  KILN_RETURN_IF_ERROR(top.GetEnum("precision", {"f32", "mixed_bf16", "bf16"}, &c->precision));
  KILN_RETURN_IF_ERROR(top.Get("steps", &c->steps));
  KILN_RETURN_IF_ERROR(top.Get("eval_every", &c->eval_every));
  KILN_RETURN_IF_ERROR(top.Get("eval_batches", &c->eval_batches));
  KILN_RETURN_IF_ERROR(top.Get("eval_recall_k", &c->eval_recall_k));
  KILN_RETURN_IF_ERROR(top.Get("checkpoint_every", &c->checkpoint_every));
  KILN_RETURN_IF_ERROR(top.Get("keep_last", &c->keep_last));
  KILN_RETURN_IF_ERROR(top.Get("keep_every", &c->keep_every));
  KILN_RETURN_IF_ERROR(top.Get("log_every", &c->log_every));
  KILN_RETURN_IF_ERROR(top.Get("output_dir", &c->output_dir));
  KILN_RETURN_IF_ERROR(top.Get("seed", &c->seed));
  KILN_RETURN_IF_ERROR(top.Get("nonfinite_patience", &c->nonfinite_patience));
  KILN_RETURN_IF_ERROR(top.Get("memory_limit_mib", &c->memory_limit_mib));
  KILN_RETURN_IF_ERROR(InitFromFromYaml(top, &c->init_from));
  return top.CheckMapAndUnknown();
}

absl::Status Positive(const std::string& key, int64_t v) {
  if (v < 1) return KeyError(key, absl::StrCat("must be >= 1, got ", v));
  return absl::OkStatus();
}
absl::Status NonNegative(const std::string& key, int64_t v) {
  if (v < 0) return KeyError(key, absl::StrCat("must be >= 0, got ", v));
  return absl::OkStatus();
}
absl::Status NonNegative(const std::string& key, double v) {
  if (!(v >= 0) || !std::isfinite(v)) {
    return KeyError(key, absl::StrCat("must be a finite number >= 0, got ", v));
  }
  return absl::OkStatus();
}

absl::Status ValidateAugment(const TrainConfig& c) {
  const AugmentSection& a = c.data.augment;
  if (!a.enabled()) return absl::OkStatus();
  if (c.model.kind == "gpt") {
    return KeyError("data.augment", "is for image models (cnn, vit, mlp on images), not gpt");
  }
  if (a.random_crop) {
    if (!a.crop_size.empty() && (a.crop_size.size() != 2 || a.crop_size[0] != c.model.height ||
                                 a.crop_size[1] != c.model.width)) {
      return KeyError(
          "data.augment.random_crop.size",
          absl::StrCat("must be the model's image size [", c.model.height, ", ", c.model.width,
                       "] (model.height, model.width): the crop is taken from the "
                       "image padded by random_crop.padding, so examples keep "
                       "their shape"));
    }
    if (a.padding < 0 || a.padding > 4096) {
      return KeyError("data.augment.random_crop.padding",
                      absl::StrCat("must be in [0, 4096], got ", a.padding));
    }
  }
  if (a.mean.size() != a.std.size() ||
      (!a.mean.empty() && a.mean.size() != static_cast<size_t>(c.model.channels))) {
    return KeyError(
        "data.augment.normalize",
        absl::StrCat("mean and std need one value per channel (model.channels ", c.model.channels,
                     "), got ", a.mean.size(), " and ", a.std.size()));
  }
  for (double v : a.std) {
    if (!(v > 0) || !std::isfinite(v)) {
      return KeyError("data.augment.normalize.std", absl::StrCat("must be > 0, got ", v));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::Status ValidateRecommender(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  KILN_RETURN_IF_ERROR(Positive("eval_recall_k", c.eval_recall_k));
  if (m.kind != "recommender") return absl::OkStatus();
  if (m.tables.empty()) {
    return KeyError("model.tables",
                    "needs the rows of each sparse feature's table, e.g. [users, items] (a clicks "
                    "dataset's dataset.json lists them as extra.tables)");
  }
  for (int64_t t : m.tables) KILN_RETURN_IF_ERROR(Positive("model.tables", t));
  KILN_RETURN_IF_ERROR(Positive("model.embed_dim", m.embed_dim));
  for (int64_t w : m.bottom) KILN_RETURN_IF_ERROR(Positive("model.bottom", w));
  for (int64_t w : m.top) KILN_RETURN_IF_ERROR(Positive("model.top", w));
  return absl::OkStatus();
}

absl::Status ValidateInitFrom(const InitFromConfig& f) {
  if (f.checkpoint.empty()) return absl::OkStatus();
  if (f.include.empty()) {
    return KeyError("init_from.include", "needs at least one pattern (\"*\": every parameter)");
  }
  for (const auto* list : {&f.include, &f.exclude}) {
    for (const std::string& p : *list) {
      if (p.empty()) {
        return KeyError(list == &f.include ? "init_from.include" : "init_from.exclude",
                        "an empty pattern matches nothing");
      }
    }
  }
  for (const auto& [from, to] : f.rename) {
    if (from.empty() && to.empty()) return KeyError("init_from.rename", "an empty entry");
  }
  return absl::OkStatus();
}

// model.kind gpt: its shape keys and a text: or tokens: source that fits them.
absl::Status ValidateGpt(const TrainConfig& c, bool text) {
  const ModelConfig& m = c.model;
  KILN_RETURN_IF_ERROR(Positive("model.n_layer", m.n_layer));
  KILN_RETURN_IF_ERROR(Positive("model.n_head", m.n_head));
  KILN_RETURN_IF_ERROR(Positive("model.n_embd", m.n_embd));
  KILN_RETURN_IF_ERROR(NonNegative("model.n_ctx", m.n_ctx));
  if (m.n_embd % m.n_head != 0) {
    return KeyError("model.n_embd", absl::StrCat("must be a multiple of model.n_head (", m.n_head,
                                                 "), got ", m.n_embd));
  }
  const bool tokens = c.data.source.rfind("tokens:", 0) == 0;
  if (tokens ? m.vocab_size < 0 : m.vocab_size < 256) {
    return KeyError("model.vocab_size",
                    tokens ? absl::StrCat("must be the tokenizer's vocabulary size, or 0 to "
                                          "take it from the tokens: dataset, got ",
                                          m.vocab_size)
                           : absl::StrCat("must be >= 256 (the byte-level tokenizer of text: "
                                          "sources emits tokens 0..255), got ",
                                          m.vocab_size));
  }
  if (!(m.dropout >= 0 && m.dropout < 1)) {
    return KeyError("model.dropout", absl::StrCat("must be in [0, 1), got ", m.dropout));
  }
  if (!text && !tokens) {
    return KeyError("data.source",
                    absl::StrCat("model.kind gpt needs a \"text:PATH\" source (byte-level "
                                 "tokens) or \"tokens:DIR\" (a kiln data import text "
                                 "dataset), got '",
                                 c.data.source, "'"));
  }
  // tokens: 0 takes the import's --seq-len (data/source.cc checks a given one against it).
  if (!tokens) KILN_RETURN_IF_ERROR(Positive("data.seq_len", c.data.seq_len));
  if (m.n_ctx > 0 && c.data.seq_len > 0 && m.n_ctx < c.data.seq_len) {
    return KeyError("model.n_ctx", absl::StrCat("must be 0 (= data.seq_len) or >= data.seq_len (",
                                                c.data.seq_len, "), got ", m.n_ctx));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  const bool text = c.data.source.rfind("text:", 0) == 0;
  if (m.kind == "gpt") {
    KILN_RETURN_IF_ERROR(ValidateGpt(c, text));
  } else if (text) {
    return KeyError("data.source",
                    absl::StrCat("a text: source needs model.kind gpt (got '", m.kind, "')"));
  }
  KILN_RETURN_IF_ERROR(NonNegative("data.seq_len", c.data.seq_len));
  if (m.kind == "mlp") {
    if (m.hidden.empty()) return KeyError("model.hidden", "needs at least one width");
    for (int64_t h : m.hidden) KILN_RETURN_IF_ERROR(Positive("model.hidden", h));
  }
  if (m.kind == "cnn") {
    if (m.widths.empty()) return KeyError("model.widths", "needs at least one width");
    for (int64_t w : m.widths) KILN_RETURN_IF_ERROR(Positive("model.widths", w));
    KILN_RETURN_IF_ERROR(Positive("model.blocks_per_stage", m.blocks_per_stage));
  }
  if (m.kind == "vit") {
    KILN_RETURN_IF_ERROR(Positive("model.patch", m.patch));
    KILN_RETURN_IF_ERROR(Positive("model.dim", m.dim));
    KILN_RETURN_IF_ERROR(Positive("model.depth", m.depth));
    KILN_RETURN_IF_ERROR(Positive("model.heads", m.heads));
    KILN_RETURN_IF_ERROR(Positive("model.mlp_ratio", m.mlp_ratio));
    if (!(m.dropout >= 0 && m.dropout < 1)) {
      return KeyError("model.dropout", absl::StrCat("must be in [0, 1), got ", m.dropout));
    }
  }
  KILN_RETURN_IF_ERROR(Positive("model.channels", m.channels));
  KILN_RETURN_IF_ERROR(Positive("model.height", m.height));
  KILN_RETURN_IF_ERROR(Positive("model.width", m.width));
  return absl::OkStatus();
}

absl::Status ValidateData(const TrainConfig& c) {
  if (c.data.source.empty())
    return KeyError("data.source", "is required (a labeled CSV file or a pipeline source)");
  KILN_RETURN_IF_ERROR(Positive("data.batch_size", c.data.batch_size));
  KILN_RETURN_IF_ERROR(NonNegative("data.shuffle_buffer", c.data.shuffle_buffer));
  if (c.data.prefetch < -1) {
    return KeyError("data.prefetch", absl::StrCat("must be auto or >= 0, got ", c.data.prefetch));
  }
  if (c.data.workers != -1 && (c.data.workers < 1 || c.data.workers > 64)) {
    return KeyError("data.workers",
                    absl::StrCat("must be auto or in [1, 64], got ", c.data.workers));
  }
  KILN_RETURN_IF_ERROR(ValidateAugment(c));
  KILN_RETURN_IF_ERROR(NonNegative("data.num_classes", c.data.num_classes));
  if (!(c.data.held_out_fraction > 0 && c.data.held_out_fraction < 1)) {
    return KeyError("data.held_out_fraction",
                    absl::StrCat("must be in (0, 1), got ", c.data.held_out_fraction));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const TrainConfig& c) {
  const OptimizerSection& o = c.optimizer;
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) {
    return KeyError("optimizer.lr", absl::StrCat("must be a finite number >= 0, got ", o.lr));
  }
  for (size_t i = 0; i < o.param_groups.size(); ++i) {
    const std::string key = absl::StrCat("optimizer.param_groups[", i, "]");
    if (o.param_groups[i].match.empty()) {
      return KeyError(key + ".match", "is required (a name pattern such as \"blocks/*\")");
    }
    KILN_RETURN_IF_ERROR(NonNegative(key + ".lr_scale", o.param_groups[i].lr_scale));
  }
  KILN_RETURN_IF_ERROR(NonNegative("optimizer.momentum", o.momentum));
  if (o.momentum >= 1) return KeyError("optimizer.momentum", "must be < 1");
  KILN_RETURN_IF_ERROR(NonNegative("optimizer.weight_decay", o.weight_decay));
  if (o.betas.size() != 2) {
    return KeyError("optimizer.betas",
                    absl::StrCat("expected two numbers [beta1, beta2], got ", o.betas.size()));
  }
  for (double b : o.betas) {
    if (!(b >= 0 && b < 1)) {
      return KeyError("optimizer.betas", absl::StrCat("each must be in [0, 1), got ", b));
    }
  }
  if (!(o.eps > 0)) return KeyError("optimizer.eps", absl::StrCat("must be > 0, got ", o.eps));
  KILN_RETURN_IF_ERROR(NonNegative("optimizer.clip_norm", o.clip_norm));
  return absl::OkStatus();
}

absl::Status ValidateSchedule(const TrainConfig& c) {
  const OptimizerSection& o = c.optimizer;
  KILN_RETURN_IF_ERROR(NonNegative("schedule.warmup_steps", c.schedule.warmup_steps));
  KILN_RETURN_IF_ERROR(NonNegative("schedule.min_lr", c.schedule.min_lr));
  if (c.schedule.min_lr > o.lr) {
    return KeyError("schedule.min_lr",
                    absl::StrCat("must be <= optimizer.lr (", o.lr, "), got ", c.schedule.min_lr));
  }
  if (c.schedule.kind != "constant" && c.schedule.warmup_steps >= c.steps && c.steps >= 1) {
    return KeyError("schedule.warmup_steps",
                    absl::StrCat("must be < steps (", c.steps, ") for a ", c.schedule.kind,
                                 " schedule, got ", c.schedule.warmup_steps,
                                 "; set it lower (e.g. --set "
                                 "schedule.warmup_steps=",
                                 c.steps / 10, ") or use schedule.kind constant"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTrainConfig(const TrainConfig& c) {
  KILN_RETURN_IF_ERROR(ValidateInitFrom(c.init_from));
  KILN_RETURN_IF_ERROR(ValidateRecommender(c));
  KILN_RETURN_IF_ERROR(ValidateModel(c));
  KILN_RETURN_IF_ERROR(ValidateData(c));
  KILN_RETURN_IF_ERROR(ValidateOptimizer(c));
  KILN_RETURN_IF_ERROR(ValidateSchedule(c));
  // The policy keeps the parameters f32 (master weights; the models are built in f32, there is no
  // model dtype key) and rewrites the compute (compiler/passes/mixed_precision.h).
  if (!compiler::ParsePrecisionPolicy(c.precision).ok()) {
    return KeyError("precision",
                    absl::StrCat("'", c.precision, "' is not one of f32, mixed_bf16, bf16"));
  }
  KILN_RETURN_IF_ERROR(Positive("steps", c.steps));
  KILN_RETURN_IF_ERROR(NonNegative("eval_every", c.eval_every));
  KILN_RETURN_IF_ERROR(NonNegative("eval_batches", c.eval_batches));
  KILN_RETURN_IF_ERROR(NonNegative("checkpoint_every", c.checkpoint_every));
  KILN_RETURN_IF_ERROR(Positive("keep_last", c.keep_last));
  KILN_RETURN_IF_ERROR(NonNegative("keep_every", c.keep_every));
  KILN_RETURN_IF_ERROR(Positive("log_every", c.log_every));
  KILN_RETURN_IF_ERROR(Positive("nonfinite_patience", c.nonfinite_patience));
  KILN_RETURN_IF_ERROR(NonNegative("memory_limit_mib", c.memory_limit_mib));
  KILN_RETURN_IF_ERROR(NonNegative("mesh.data", c.mesh.data));
  KILN_RETURN_IF_ERROR(Positive("mesh.model", c.mesh.model));
  if (c.output_dir.empty()) return KeyError("output_dir", "must not be empty");
  return absl::OkStatus();
}

namespace {

// yaml-cpp keeps every pair of a mapping but answers lookups with the first one, so a key given
// twice would silently lose the second value: reject it, naming both lines.
absl::Status CheckDuplicateKeys(const YAML::Node& node, const std::string& path,
                                const std::string& source) {
  if (node.IsMap()) {
    std::map<std::string, int> line_of;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) continue;
      const std::string key = kv.first.Scalar();
      const std::string dotted = path.empty() ? key : path + "." + key;
      const int line = kv.first.Mark().line + 1;
      auto [it, fresh] = line_of.emplace(key, line);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ":", line, ": ", dotted, ": given twice (line ", it->second, " and line ", line,
            "); YAML keeps only one of them, so delete the line you do not mean"));
      }
      KILN_RETURN_IF_ERROR(CheckDuplicateKeys(kv.second, dotted, source));
    }
  } else if (node.IsSequence()) {
    for (const auto& item : node) KILN_RETURN_IF_ERROR(CheckDuplicateKeys(item, path, source));
  }
  return absl::OkStatus();
}

// The key of an override ("optimizer.lr=0.1" -> "optimizer.lr"), or "" if it has none.
std::string OverrideKey(const std::string& text) {
  size_t eq = text.find('=');
  return eq == std::string::npos ? "" : text.substr(0, eq);
}

// Which override an error about `key` comes from: one that set the key, a section holding it, or
// a key inside it. "" when the error is about the text itself.
std::string BlameOverride(const std::string& key, const std::vector<std::string>& overrides) {
  std::string best;
  for (const std::string& o : overrides) {
    const std::string k = OverrideKey(o);
    if (k.empty()) continue;
    const bool covers = key == k || key.rfind(k + ".", 0) == 0 || k.rfind(key + ".", 0) == 0;
    if (covers) best = o;  // the last one wins, as it does when applied
  }
  return best;
}

// The dotted key an error message starts with ("optimizer.lr: must be ..." -> "optimizer.lr").
std::string ErrorKey(absl::string_view message) {
  size_t colon = message.find(": ");
  if (colon == absl::string_view::npos) return "";
  std::string key(message.substr(0, colon));
  for (char ch : key) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.')) return "";
  }
  return key;
}

bool OverridesKey(const std::vector<std::string>& overrides, const std::string& key) {
  for (const std::string& o : overrides) {
    if (OverrideKey(o) == key) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<TrainConfig> ParseTrainConfig(const std::string& yaml_text,
                                             const std::string& source,
                                             const std::vector<std::string>& overrides,
                                             std::vector<std::string>* notes) {
  TrainConfig c;
  absl::Status s;
  try {
    YAML::Node root = YAML::Load(yaml_text);
    s = CheckDuplicateKeys(root, "", source);
    if (!s.ok()) return s;
    for (const std::string& o : overrides) {
      s = ApplyOverride(root, o);
      if (!s.ok()) {
        if (s.message().rfind("--set", 0) == 0) return s;
        return absl::Status(s.code(), absl::StrCat("--set ", o, ": ", s.message()));
      }
    }
    s = FromYaml(root, &c);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  // Shortening a run with --set steps=N below its warmup: clamp the warmup rather than refuse.
  if (s.ok() && c.schedule.kind != "constant" && c.steps >= 1 &&
      c.schedule.warmup_steps >= c.steps && OverridesKey(overrides, "steps") &&
      !OverridesKey(overrides, "schedule.warmup_steps") && !OverridesKey(overrides, "schedule")) {
    const int64_t was = c.schedule.warmup_steps;
    c.schedule.warmup_steps = c.steps / 10;
    if (notes != nullptr) {
      notes->push_back(
          absl::StrCat("note: schedule.warmup_steps ", was, " of ", source, " is not below steps ",
                       c.steps, " (set by --set): using warmup_steps ", c.schedule.warmup_steps,
                       " (a tenth of the run); --set schedule.warmup_steps=N chooses another"));
    }
  }
  if (s.ok()) s = ValidateTrainConfig(c);
  if (s.ok()) return c;
  const std::string blamed = BlameOverride(ErrorKey(s.message()), overrides);
  return absl::Status(s.code(),
                      absl::StrCat(blamed.empty() ? source : "--set " + blamed, ": ", s.message()));
}

absl::StatusOr<TrainConfig> LoadTrainConfig(const std::string& path,
                                            const std::vector<std::string>& overrides,
                                            std::vector<std::string>* notes, Env* env) {
  if (env == nullptr) env = Env::Default();
  if (absl::StatusOr<bool> dir = env->IsDirectory(path); dir.ok() && *dir) {
    const std::string inside = JoinPath(path, "config.yaml");
    return absl::InvalidArgumentError(
        absl::StrCat("config: ", path, " is a directory, not a YAML config file",
                     env->FileExists(inside)
                         ? absl::StrCat("; to train that run again, pass its config: ", inside)
                         : "; pass a file such as examples/mlp_digits.yaml"));
  }
  absl::StatusOr<std::string> text = ReadFileToString(env, path);
  if (!text.ok()) {
    if (!env->FileExists(path))
      return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
    return absl::Status(text.status().code(), absl::StrCat("cannot read config file ", path, ": ",
                                                           text.status().message()));
  }
  absl::StatusOr<TrainConfig> c = ParseTrainConfig(*text, path, overrides, notes);
  if (!c.ok()) return c.status();
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!c->init_from.checkpoint.empty() && fs::path(c->init_from.checkpoint).is_relative()) {
    // Absolute in the resolved config (config.yaml), like data.source.
    fs::path abs = fs::absolute(c->init_from.checkpoint, ec);
    if (!ec) c->init_from.checkpoint = abs.lexically_normal().string();
  }
  std::string prefix, file = c->data.source;
  for (const char* p : {"digits:", "safetensors:", "records:", "dataset:", "tokens:", "text:"}) {
    if (file.rfind(p, 0) == 0) {
      prefix = p;
      file = file.substr(prefix.size());
    }
  }
  if (fs::path(file).is_relative()) {
    const std::string alt = JoinPath(Dirname(path), file);
    if (!env->FileExists(file) && env->FileExists(alt)) file = alt;
    // Absolute in the resolved config, so `kiln eval RUNDIR` works from any directory.
    fs::path abs = fs::absolute(file, ec);
    if (!ec) c->data.source = prefix + abs.lexically_normal().string();
  }
  return c;
}

namespace {

// Hashed only when set: a run without init_from keeps the hash it had before the key existed.
void EmitInitFrom(YAML::Emitter& e, const InitFromConfig& f, bool hash_form) {
  if (hash_form && f.checkpoint.empty()) return;
  auto strings = [&](const std::vector<std::string>& v) {
    e << YAML::Flow << YAML::BeginSeq;
    for (const std::string& x : v) e << YAML::DoubleQuoted << x;
    e << YAML::EndSeq;
  };
  e << YAML::Key << "init_from" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "checkpoint" << YAML::Value << f.checkpoint;
  e << YAML::Key << "include" << YAML::Value;
  strings(f.include);
  e << YAML::Key << "exclude" << YAML::Value;
  strings(f.exclude);
  e << YAML::Key << "rename" << YAML::Value << YAML::Flow << YAML::BeginMap;
  for (const auto& [from, to] : f.rename) {
    e << YAML::Key << YAML::DoubleQuoted << from << YAML::Value << YAML::DoubleQuoted << to;
  }
  e << YAML::EndMap;
  e << YAML::EndMap;
}

void EmitInts(YAML::Emitter& e, const std::vector<int64_t>& v) {
  e << YAML::Flow << YAML::BeginSeq;
  for (int64_t x : v) e << x;
  e << YAML::EndSeq;
}

std::string Num(double v) { return absl::StrFormat("%.17g", v); }

void EmitModel(YAML::Emitter& e, const TrainConfig& c, bool hash_form) {
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << c.model.kind;
  e << YAML::Key << "hidden" << YAML::Value;
  EmitInts(e, c.model.hidden);
  e << YAML::Key << "widths" << YAML::Value;
  EmitInts(e, c.model.widths);
  e << YAML::Key << "blocks_per_stage" << YAML::Value << c.model.blocks_per_stage;
  e << YAML::Key << "patch" << YAML::Value << c.model.patch;
  e << YAML::Key << "dim" << YAML::Value << c.model.dim;
  e << YAML::Key << "depth" << YAML::Value << c.model.depth;
  e << YAML::Key << "heads" << YAML::Value << c.model.heads;
  e << YAML::Key << "mlp_ratio" << YAML::Value << c.model.mlp_ratio;
  e << YAML::Key << "dropout" << YAML::Value << Num(c.model.dropout);
  e << YAML::Key << "channels" << YAML::Value << c.model.channels;
  e << YAML::Key << "height" << YAML::Value << c.model.height;
  e << YAML::Key << "width" << YAML::Value << c.model.width;
  // The gpt keys are hashed only for gpt (so older configs keep their hash).
  if (!hash_form || c.model.kind == "gpt") {
    e << YAML::Key << "n_layer" << YAML::Value << c.model.n_layer;
    e << YAML::Key << "n_head" << YAML::Value << c.model.n_head;
    e << YAML::Key << "n_embd" << YAML::Value << c.model.n_embd;
    e << YAML::Key << "n_ctx" << YAML::Value << c.model.n_ctx;
    e << YAML::Key << "vocab_size" << YAML::Value << c.model.vocab_size;
  }
  // The recommender keys are hashed only for the recommender (older configs keep their hash).
  if (!hash_form || c.model.kind == "recommender") {
    e << YAML::Key << "tables" << YAML::Value;
    EmitInts(e, c.model.tables);
    e << YAML::Key << "embed_dim" << YAML::Value << c.model.embed_dim;
    e << YAML::Key << "bottom" << YAML::Value;
    EmitInts(e, c.model.bottom);
    e << YAML::Key << "top" << YAML::Value;
    EmitInts(e, c.model.top);
    e << YAML::Key << "interaction" << YAML::Value << c.model.interaction;
  }
  e << YAML::EndMap;
}

// Emitted (and hashed) only when on.
void EmitAugment(YAML::Emitter& e, const TrainConfig& c) {
  if (!c.data.augment.enabled()) return;
  const AugmentSection& a = c.data.augment;
  e << YAML::Key << "augment" << YAML::Value << YAML::BeginMap;
  if (a.random_crop) {
    e << YAML::Key << "random_crop" << YAML::Value << YAML::Flow << YAML::BeginMap;
    e << YAML::Key << "size" << YAML::Value << YAML::Flow << YAML::BeginSeq << c.model.height
      << c.model.width << YAML::EndSeq;
    e << YAML::Key << "padding" << YAML::Value << a.padding;
    e << YAML::EndMap;
  }
  e << YAML::Key << "flip_horizontal" << YAML::Value << a.flip_horizontal;
  if (!a.mean.empty()) {
    e << YAML::Key << "normalize" << YAML::Value << YAML::Flow << YAML::BeginMap;
    e << YAML::Key << "mean" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (double v : a.mean) e << Num(v);
    e << YAML::EndSeq;
    e << YAML::Key << "std" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (double v : a.std) e << Num(v);
    e << YAML::EndSeq;
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
}

void EmitData(YAML::Emitter& e, const TrainConfig& c, bool hash_form) {
  e << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "source" << YAML::Value << c.data.source;
  e << YAML::Key << "batch_size" << YAML::Value << c.data.batch_size;
  e << YAML::Key << "shuffle" << YAML::Value << c.data.shuffle;
  e << YAML::Key << "seed" << YAML::Value << c.data.seed;
  e << YAML::Key << "held_out_fraction" << YAML::Value << Num(c.data.held_out_fraction);
  e << YAML::Key << "remainder" << YAML::Value << c.data.remainder;
  e << YAML::Key << "shuffle_buffer" << YAML::Value << c.data.shuffle_buffer;
  // prefetch changes when batches are ready, never which: `auto` hashes as the old default 2, so
  // runs started before auto existed keep their hash.
  if (c.data.prefetch == -1) {
    if (hash_form) {
      e << YAML::Key << "prefetch" << YAML::Value << 2;
    } else {
      e << YAML::Key << "prefetch" << YAML::Value << "auto";
    }
  } else {
    e << YAML::Key << "prefetch" << YAML::Value << c.data.prefetch;
  }
  // workers changes who produces the batches, never which: not hashed.
  if (!hash_form) {
    if (c.data.workers == -1) {
      e << YAML::Key << "workers" << YAML::Value << "auto";
    } else {
      e << YAML::Key << "workers" << YAML::Value << c.data.workers;
    }
  }
  e << YAML::Key << "num_classes" << YAML::Value << c.data.num_classes;
  if (!hash_form || c.data.seq_len != 0 || c.model.kind == "gpt") {
    e << YAML::Key << "seq_len" << YAML::Value << c.data.seq_len;
  }
  EmitAugment(e, c);
  e << YAML::EndMap;
}

void EmitOptimizer(YAML::Emitter& e, const TrainConfig& c, bool hash_form) {
  e << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << c.optimizer.kind;
  e << YAML::Key << "lr" << YAML::Value << Num(c.optimizer.lr);
  e << YAML::Key << "momentum" << YAML::Value << Num(c.optimizer.momentum);
  e << YAML::Key << "weight_decay" << YAML::Value << Num(c.optimizer.weight_decay);
  e << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double b : c.optimizer.betas) e << Num(b);
  e << YAML::EndSeq;
  e << YAML::Key << "eps" << YAML::Value << Num(c.optimizer.eps);
  e << YAML::Key << "clip_norm" << YAML::Value << Num(c.optimizer.clip_norm);
  if (!c.optimizer.param_groups.empty()) {  // hashed only when given (older runs keep their hash)
    e << YAML::Key << "param_groups" << YAML::Value << YAML::BeginSeq;
    for (const ParamGroupSection& g : c.optimizer.param_groups) {
      e << YAML::Flow << YAML::BeginMap;
      e << YAML::Key << "match" << YAML::Value << YAML::DoubleQuoted << g.match;
      e << YAML::Key << "lr_scale" << YAML::Value << Num(g.lr_scale);
      e << YAML::Key << "freeze" << YAML::Value << g.freeze;
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  if (!hash_form && c.optimizer.shard_state) {  // how it runs, not what it trains
    e << YAML::Key << "shard_state" << YAML::Value << true;
  }
  e << YAML::EndMap;
}

// hash_form: the text ConfigHash hashes, without the keys added after a run's format was fixed
// (see config.h), so adding a key never changes an existing run's hash.
std::string EmitYaml(const TrainConfig& c, bool hash_form) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  EmitModel(e, c, hash_form);
  EmitData(e, c, hash_form);
  EmitOptimizer(e, c, hash_form);
  e << YAML::Key << "schedule" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << c.schedule.kind;
  e << YAML::Key << "warmup_steps" << YAML::Value << c.schedule.warmup_steps;
  e << YAML::Key << "min_lr" << YAML::Value << Num(c.schedule.min_lr);
  e << YAML::EndMap;
  e << YAML::Key << "precision" << YAML::Value << c.precision;
  e << YAML::Key << "steps" << YAML::Value << c.steps;
  e << YAML::Key << "eval_every" << YAML::Value << c.eval_every;
  e << YAML::Key << "eval_batches" << YAML::Value << c.eval_batches;
  if (!hash_form || c.eval_recall_k != TrainConfig().eval_recall_k) {
    e << YAML::Key << "eval_recall_k" << YAML::Value << c.eval_recall_k;
  }
  e << YAML::Key << "checkpoint_every" << YAML::Value << c.checkpoint_every;
  e << YAML::Key << "keep_last" << YAML::Value << c.keep_last;
  e << YAML::Key << "keep_every" << YAML::Value << c.keep_every;
  e << YAML::Key << "log_every" << YAML::Value << c.log_every;
  e << YAML::Key << "output_dir" << YAML::Value << c.output_dir;
  e << YAML::Key << "seed" << YAML::Value << c.seed;
  if (!hash_form || c.nonfinite_patience != TrainConfig().nonfinite_patience) {
    e << YAML::Key << "nonfinite_patience" << YAML::Value << c.nonfinite_patience;
  }
  if (!hash_form && c.memory_limit_mib != 0) {  // changes memory, not what is trained
    e << YAML::Key << "memory_limit_mib" << YAML::Value << c.memory_limit_mib;
  }
  if (!hash_form) {  // where it runs, not what it trains
    e << YAML::Key << "mesh" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "data" << YAML::Value << c.mesh.data;
    e << YAML::Key << "model" << YAML::Value << c.mesh.model;
    e << YAML::EndMap;
  }
  EmitInitFrom(e, c.init_from, hash_form);
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace

std::string ConfigToYaml(const TrainConfig& c) { return EmitYaml(c, /*hash_form=*/false); }

std::string ConfigHash(const TrainConfig& config) {
  TrainConfig c = config;
  c.output_dir.clear();
  std::string text = EmitYaml(c, /*hash_form=*/true);
  // FNV-1a from 1469598103934665603, a digit short of the standard offset basis: a slip kept
  // on purpose, since run.json files and checkpoints already hold these hashes.
  return absl::StrFormat("%016x", Fnv1a64(text, 1469598103934665603ULL));
}

}  // namespace kiln::train
