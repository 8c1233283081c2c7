// InputPipeline: sources (in-memory arrays, indexed record shards), epoch orders, batching,
// prefetch thread and iterator state. See pipeline.h.
#include "kiln/data/pipeline.h"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/coding.h"
#include "kiln/base/hash.h"
#include "kiln/base/status.h"
#include "kiln/data/digits.h"
#include "kiln/data/record_io.h"
#include "kiln/data/record_source.h"
#include "kiln/data/token_source.h"
#include "kiln/tensor/safetensors.h"
#include "nlohmann/json.hpp"

namespace kiln::data {
namespace {

using json = nlohmann::json;

constexpr char kStateFormat[] = "kiln.input_pipeline.v1";

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

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

Shape DropFirst(const Shape& s) {
  return Shape(std::vector<int64_t>(s.dims().begin() + 1, s.dims().end()));
}
Shape PrependDim(int64_t d, const Shape& s) {
  std::vector<int64_t> dims = {d};
  dims.insert(dims.end(), s.dims().begin(), s.dims().end());
  return Shape(std::move(dims));
}

// ---------------------------------------------------------------------------------------------
// Sources: N examples of fixed type, fetched by global index.

class Source {
 public:
  virtual ~Source() = default;
  int64_t size() const { return size_; }
  const TensorSpec& x_spec() const { return x_spec_; }  // one example, no batch dimension
  const TensorSpec& y_spec() const { return y_spec_; }
  // What one fetching thread keeps between calls (open files, scratch buffers): each thread that
  // calls Fetch passes its own, from NewReader (nullptr for sources that need none).
  struct Reader {
    virtual ~Reader() = default;
  };
  virtual std::unique_ptr<Reader> NewReader() const { return nullptr; }
  // Copies example i into x_dst / y_dst (x_spec / y_spec bytes). Thread-safe: any number of
  // threads may fetch at once, each with its own `reader`.
  virtual absl::Status Fetch(int64_t i, uint8_t* x_dst, uint8_t* y_dst, Reader* reader) const = 0;
  // Identifies the data (not the config): changes when the files or arrays change shape/count.
  virtual std::string FingerprintMaterial() const = 0;
  // Record sources: files and where each file's examples start (size files + 1). Empty otherwise.
  virtual const std::vector<std::string>& files() const { return no_files_; }
  virtual const std::vector<int64_t>& file_starts() const { return no_starts_; }
  // Where example i's record is, for the state JSON ("" / 0 for in-memory sources).
  virtual std::pair<std::string, uint64_t> Location(int64_t) const { return {"", 0}; }
  // Sources that come split (dataset: imports): the number of leading examples in "train"; the
  // rest are "held_out". -1: the pipeline splits by HeldOutHash.
  virtual int64_t presplit_train() const { return -1; }

 protected:
  int64_t size_ = 0;
  TensorSpec x_spec_, y_spec_;

 private:
  std::vector<std::string> no_files_;
  std::vector<int64_t> no_starts_;
};

class ArraySource final : public Source {
 public:
  // `content_id` (optional) joins the fingerprint, e.g. a hash of the bytes a text source read.
  static absl::StatusOr<std::unique_ptr<Source>> Make(Tensor x, Tensor y, const std::string& name,
                                                      const std::string& content_id = "") {
    if (x.shape().rank() < 1 || y.shape().rank() < 1)
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": tensors \"x\" and \"y\" need an example dimension first, got x ",
                       x.TypeString(), " and y ", y.TypeString()));
    if (x.shape()[0] != y.shape()[0])
      return absl::InvalidArgumentError(absl::StrCat(name, ": \"x\" has ", x.shape()[0],
                                                     " examples but \"y\" has ", y.shape()[0]));
    auto s = std::unique_ptr<ArraySource>(new ArraySource());
    s->size_ = x.shape()[0];
    s->x_spec_ = {x.dtype(), DropFirst(x.shape())};
    s->y_spec_ = {y.dtype(), DropFirst(y.shape())};
    s->name_ = name;
    s->content_id_ = content_id;
    s->x_ = std::move(x);
    s->y_ = std::move(y);
    return std::unique_ptr<Source>(std::move(s));
  }

  absl::Status Fetch(int64_t i, uint8_t* x_dst, uint8_t* y_dst, Reader*) const override {
    const int64_t xb = x_spec_.shape.num_elements() * DTypeSize(x_spec_.dtype);
    const int64_t yb = y_spec_.shape.num_elements() * DTypeSize(y_spec_.dtype);
    std::memcpy(x_dst, static_cast<const uint8_t*>(x_.raw_data()) + i * xb, xb);
    std::memcpy(y_dst, static_cast<const uint8_t*>(y_.raw_data()) + i * yb, yb);
    return absl::OkStatus();
  }

  std::string FingerprintMaterial() const override {
    std::string m =
        absl::StrCat("arrays|", size_, "|", x_spec_.ToString(), "|", y_spec_.ToString());
    if (!content_id_.empty()) absl::StrAppend(&m, "|", content_id_);
    return m;
  }

 private:
  ArraySource() = default;
  std::string name_, content_id_;
  Tensor x_, y_;
};

absl::Status CheckExampleType(const Tensor& t, const TensorSpec& want, const std::string& what,
                              const std::string& where) {
  if (t.dtype() == want.dtype && t.shape() == want.shape) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(where, ": tensor \"", what, "\" is ", t.TypeString(),
                                          " but the dataset's first record has ", want.ToString(),
                                          " (every example must have the same type)"));
}

class RecordSource final : public Source {
 public:
  static absl::StatusOr<std::unique_ptr<Source>> Make(Env* env, const std::string& pattern) {
    KILN_ASSIGN_OR_RETURN(std::vector<std::string> files, ListFiles(env, pattern));
    auto s = std::unique_ptr<RecordSource>(new RecordSource());
    s->env_ = env;
    s->files_ = files;
    s->file_starts_.push_back(0);
    std::string rec;
    bool have_spec = false;
    for (const std::string& f : files) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> r, RecordReader::Open(env, f));
      while (true) {
        const uint64_t off = r->offset();
        absl::StatusOr<bool> got = r->Read(&rec);
        if (!got.ok()) {
          if (absl::IsOutOfRange(got.status()))
            return absl::DataLossError(absl::StrCat(f, ": truncated record at offset ", off, " (",
                                                    got.status().message(), ")"));
          return Annotate(got.status(), absl::StrCat("indexing record shard ", f));
        }
        if (!*got) break;
        if (!have_spec) {
          Tensor x, y;
          KILN_RETURN_IF_ERROR(
              ParseExample(rec, absl::StrCat(f, " record at offset ", off), &x, &y));
          s->x_spec_ = {x.dtype(), x.shape()};
          s->y_spec_ = {y.dtype(), y.shape()};
          s->SetFastLayout(rec);
          have_spec = true;
        }
        s->offsets_.push_back(off);
      }
      s->file_starts_.push_back(static_cast<int64_t>(s->offsets_.size()));
    }
    s->size_ = static_cast<int64_t>(s->offsets_.size());
    if (s->size_ == 0)
      return absl::InvalidArgumentError(
          absl::StrCat("records:", pattern, ": the ", files.size(), " file(s) hold no records"));
    return std::unique_ptr<Source>(std::move(s));
  }

  // A fetching thread's open files (opened on first use) and record buffer.
  struct FileReaders final : Reader {
    std::vector<std::unique_ptr<RecordReader>> files;
    std::string scratch;
  };
  std::unique_ptr<Reader> NewReader() const override {
    auto r = std::make_unique<FileReaders>();
    r->files.resize(files_.size());
    return r;
  }

  absl::Status Fetch(int64_t i, uint8_t* x_dst, uint8_t* y_dst, Reader* reader) const override {
    auto& fr = *static_cast<FileReaders*>(reader);
    std::string& rec = fr.scratch;
    const int f = FileOf(i);
    if (!fr.files[f]) {
      KILN_ASSIGN_OR_RETURN(fr.files[f], RecordReader::Open(env_, files_[f]));
    }
    RecordReader& r = *fr.files[f];
    const uint64_t off = offsets_[i];
    r.Seek(off);
    absl::StatusOr<bool> got = r.Read(&rec);
    // Fast path: a record whose safetensors header is byte-identical to the first record's (the
    // usual case: WriteRecordShards writes them all alike) has its tensors at the same offsets.
    if (got.ok() && *got && !fast_header_.empty() && rec.size() == fast_size_ &&
        std::memcmp(rec.data(), fast_header_.data(), fast_header_.size()) == 0) {
      std::memcpy(x_dst, rec.data() + fast_x_, fast_x_bytes_);
      std::memcpy(y_dst, rec.data() + fast_y_, fast_y_bytes_);
      return absl::OkStatus();
    }
    const std::string where = absl::StrCat(files_[f], " record at offset ", off);
    if (!got.ok()) {
      if (absl::IsOutOfRange(got.status()) || absl::IsDataLoss(got.status()))
        return absl::DataLossError(absl::StrCat(where, ": ", got.status().message()));
      return Annotate(got.status(), where);
    }
    if (!*got) return absl::DataLossError(absl::StrCat(where, ": the file ends before it"));
    Tensor x, y;
    KILN_RETURN_IF_ERROR(ParseExample(rec, where, &x, &y));
    KILN_RETURN_IF_ERROR(CheckExampleType(x, x_spec_, "x", where));
    KILN_RETURN_IF_ERROR(CheckExampleType(y, y_spec_, "y", where));
    std::memcpy(x_dst, x.raw_data(), x.byte_size());
    std::memcpy(y_dst, y.raw_data(), y.byte_size());
    return absl::OkStatus();
  }

  std::string FingerprintMaterial() const override {
    std::string m = absl::StrCat("records|", x_spec_.ToString(), "|", y_spec_.ToString());
    for (size_t f = 0; f < files_.size(); ++f)
      absl::StrAppend(&m, "|", Basename(files_[f]), ":", file_starts_[f + 1] - file_starts_[f]);
    return m;
  }
  const std::vector<std::string>& files() const override { return files_; }
  const std::vector<int64_t>& file_starts() const override { return file_starts_; }
  std::pair<std::string, uint64_t> Location(int64_t i) const override {
    return {files_[FileOf(i)], offsets_[i]};
  }

 private:
  RecordSource() = default;

  int FileOf(int64_t i) const {
    return static_cast<int>(std::upper_bound(file_starts_.begin(), file_starts_.end(), i) -
                            file_starts_.begin()) -
           1;
  }

  static absl::StatusOr<std::vector<std::string>> ListFiles(Env* env, const std::string& pattern) {
    std::string dir, glob;
    absl::StatusOr<bool> is_dir = env->IsDirectory(pattern);
    if (is_dir.ok() && *is_dir) {
      dir = pattern;
      glob = "*";
    } else {
      dir = Dirname(pattern);
      if (dir.empty()) dir = ".";
      glob = Basename(pattern);
    }
    absl::StatusOr<std::vector<std::string>> children = env->GetChildren(dir);
    if (!children.ok())
      return Annotate(children.status(), absl::StrCat("records:", pattern, ": listing ", dir));
    std::vector<std::string> out;
    for (const std::string& name : *children) {
      if (name.empty() || name[0] == '.') continue;
      if (fnmatch(glob.c_str(), name.c_str(), 0) != 0) continue;
      const std::string path = JoinPath(dir, name);
      absl::StatusOr<bool> d = env->IsDirectory(path);
      if (d.ok() && *d) continue;
      out.push_back(path);
    }
    if (out.empty())
      return absl::NotFoundError(absl::StrCat("records:", pattern, ": no record files match"));
    return out;  // GetChildren is sorted, so names are in sorted order
  }

  // Records the fast path of Fetch from the first (already validated) record: its header bytes
  // and where "x" and "y" lie. Leaves the fast path off if the layout is anything unusual.
  void SetFastLayout(const std::string& rec) {
    if (rec.size() < 8) return;
    const uint64_t n = DecodeFixed64(rec.data());
    if (n > rec.size() - 8) return;
    json h = json::parse(rec.begin() + 8, rec.begin() + 8 + n, nullptr, false);
    if (h.is_discarded() || !h.is_object()) return;
    auto offsets = [&](const char* name, size_t* begin, size_t* bytes) {
      if (!h.contains(name) || !h[name].is_object() || !h[name].contains("data_offsets"))
        return false;
      const json& o = h[name]["data_offsets"];
      if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() ||
          !o[1].is_number_unsigned())
        return false;
      *begin = 8 + n + o[0].get<uint64_t>();
      *bytes = o[1].get<uint64_t>() - o[0].get<uint64_t>();
      return true;
    };
    size_t xb = 0, xn = 0, yb = 0, yn = 0;
    if (!offsets("x", &xb, &xn) || !offsets("y", &yb, &yn)) return;
    if (xn != static_cast<size_t>(x_spec_.shape.num_elements() * DTypeSize(x_spec_.dtype)) ||
        yn != static_cast<size_t>(y_spec_.shape.num_elements() * DTypeSize(y_spec_.dtype)) ||
        xb + xn > rec.size() || yb + yn > rec.size())
      return;
    fast_x_ = xb;
    fast_x_bytes_ = xn;
    fast_y_ = yb;
    fast_y_bytes_ = yn;
    fast_size_ = rec.size();
    fast_header_ = rec.substr(0, 8 + n);
  }

  Env* env_ = nullptr;
  std::string fast_header_;
  size_t fast_size_ = 0, fast_x_ = 0, fast_x_bytes_ = 0, fast_y_ = 0, fast_y_bytes_ = 0;
  std::vector<std::string> files_;
  std::vector<int64_t> file_starts_;
  std::vector<uint64_t> offsets_;  // of every record, by global index
};

// "text:PATH": the file's bytes are the tokens (byte-level tokenizer, vocabulary 256). The text is
// cut into floor(len / (seq_len + 1)) non-overlapping chunks of seq_len + 1 bytes (a trailing
// partial chunk is dropped); chunk i is example i: x = bytes [i*(S+1), i*(S+1)+S), y = the same
// window shifted by one (the next token of each position), both s32 [S].
absl::StatusOr<std::unique_ptr<Source>> MakeTextSource(const std::string& path, int64_t seq_len,
                                                       Env* env) {
  if (seq_len < 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "text:", path, ": a text source needs seq_len >= 1 (data.seq_len), got ", seq_len));
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
  const int64_t chunk = seq_len + 1;
  const int64_t n = static_cast<int64_t>(bytes.size()) / chunk;
  if (n == 0)
    return absl::InvalidArgumentError(absl::StrCat("text:", path, ": ", bytes.size(),
                                                   " bytes hold no window of seq_len + 1 = ", chunk,
                                                   " tokens"));
  Tensor x(DType::kS32, Shape{n, seq_len}), y(DType::kS32, Shape{n, seq_len});
  int32_t* xd = x.data<int32_t>();
  int32_t* yd = y.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto* c = reinterpret_cast<const unsigned char*>(bytes.data()) + i * chunk;
    for (int64_t k = 0; k < seq_len; ++k) {
      xd[i * seq_len + k] = c[k];
      yd[i * seq_len + k] = c[k + 1];
    }
  }
  return ArraySource::Make(std::move(x), std::move(y), path,
                           absl::StrCat("text|", bytes.size(), "|", Hex64(Fnv1a64(bytes))));
}

// "dataset:DIR": a folder `kiln data import` wrote (record_source.h). Its train split's examples
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
// "tokens:DIR" is the same source for a text import only (token_source.h); with
// PipelineConfig::language set it is that language's held-out examples alone (a contiguous range
// of the held_out split: the import gives each language one held-out shard).
class DatasetSource final : public Source {
 public:
  static absl::StatusOr<std::unique_ptr<Source>> Make(Env* env, const std::string& dir,
                                                      bool tokens = false,
                                                      const std::string& language = "") {
    auto s = std::unique_ptr<DatasetSource>(new DatasetSource());
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
    KILN_ASSIGN_OR_RETURN(s->train_, ExampleDataset::Open(env, dir, "train"));
    absl::StatusOr<std::unique_ptr<ExampleDataset>> held =
        ExampleDataset::Open(env, dir, "held_out");
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
    return std::unique_ptr<Source>(std::move(s));
  }

  int64_t presplit_train() const override { return n_train_; }

  absl::Status Fetch(int64_t i, uint8_t* x_dst, uint8_t* y_dst, Reader*) const override {
    const ExampleDataset& ds = i < n_train_ ? *train_ : *held_;
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

  absl::Status FetchClicks(const ExampleBatch& b, const ExampleDataset& ds, int64_t i,
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
  DatasetSource() = default;
  std::string dir_, kind_, language_;
  std::unique_ptr<ExampleDataset> train_, held_;
  int64_t n_train_ = 0;
  int64_t held_offset_ = 0;  // a language's examples start here in the held_out split
  std::vector<int64_t> hwc_;
  std::vector<double> mean_, inv_std_;
  std::vector<std::string> columns_;
  std::vector<std::string> sparse_;  // clicks
  std::vector<int64_t> tables_;
};

absl::StatusOr<std::unique_ptr<Source>> MakeExampleSource(const std::string& source,
                                                          int64_t seq_len,
                                                          const std::string& language, Env* env) {
  const size_t colon = source.find(':');
  const std::string kind = colon == std::string::npos ? "" : source.substr(0, colon);
  const std::string path = colon == std::string::npos ? "" : source.substr(colon + 1);
  if (kind.empty() || path.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("data source \"", source,
                     "\": expected \"safetensors:PATH\", \"records:GLOB_OR_DIR\", "
                     "\"dataset:DIR\", \"tokens:DIR\", \"digits:PATH\", \"csv:PATH\" or "
                     "\"text:PATH\""));
  if (!language.empty() && kind != "tokens" && kind != "dataset") {
    return absl::InvalidArgumentError("a language applies to tokens: sources only");
  }
  if (kind == "safetensors") {
    KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
    KILN_ASSIGN_OR_RETURN(auto tensors, ParseSafetensors(bytes, nullptr, path));
    auto x = tensors.find("x");
    auto y = tensors.find("y");
    if (x == tensors.end() || y == tensors.end())
      return absl::InvalidArgumentError(
          absl::StrCat(path,
                       ": a safetensors dataset needs tensors \"x\" (features) and \"y\" "
                       "(labels)"));
    return ArraySource::Make(x->second, y->second, path);
  }
  if (kind == "digits" || kind == "csv") {
    KILN_ASSIGN_OR_RETURN(Dataset d, LoadDigitsCsv(path, env));
    // csv: orders and splits differently (IsCsv), so its states do not restore into digits:.
    return ArraySource::Make(d.features, d.labels, path, kind == "csv" ? "csv" : "");
  }
  if (kind == "records") return RecordSource::Make(env, path);
  if (kind == "dataset") return DatasetSource::Make(env, path, /*tokens=*/false, language);
  if (kind == "tokens") return DatasetSource::Make(env, path, /*tokens=*/true, language);
  if (kind == "text") return MakeTextSource(path, seq_len, env);
  return absl::InvalidArgumentError(
      absl::StrCat("data source \"", source, "\": unknown kind \"", kind,
                   "\" (allowed: safetensors, records, dataset, tokens, digits, csv, text)"));
}

}  // namespace

int AutoPrefetchDepth(int current, int max_depth, double produce_max, double produce_mean,
                      double step, double wait_share) {
  int want = current;
  if (step > 0) {
    const double need = 1.0 + std::ceil(produce_max / step);
    want = std::max(want, static_cast<int>(std::min<double>(need, max_depth)));
    // Waits although production keeps up on average: bursts; one more batch of slack.
    if (wait_share > 0.02 && produce_mean < step) want = std::max(want, current + 1);
  }
  return std::max(current, std::min(want, max_depth));
}

int AutoWorkers() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 2, 1, 8);
}

double HeldOutHash(uint64_t split_seed, int64_t index) {
  const uint64_t h = SplitMix64(split_seed ^ SplitMix64(static_cast<uint64_t>(index) + 1));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// ---------------------------------------------------------------------------------------------

class InputPipeline::Impl {
 public:
  PipelineConfig config;
  Env* env = nullptr;
  std::unique_ptr<Source> source;
  // Kept global indices: ascending, except for csv: sources (their split's permuted order).
  std::vector<int64_t> ids;
  TensorSpec x_type, y_type;
  int64_t bpe = 0;  // batches per epoch (wrap: whole batches that fit in one epoch)
  uint64_t fingerprint = 0;

  // Consumer position: the next batch Next() returns starts at example `pos` of epoch `epoch`'s
  // order (drop, pad: pos = batch_in_epoch * batch_size).
  int64_t epoch = 0, pos = 0, seen = 0;
  int64_t last_real = 0;
  absl::Status sticky;

  // The next batch to hand to a worker (under mu; the caller's own when prefetch = 0 or while
  // the workers are stopped).
  int64_t p_epoch = 0, p_pos = 0;
  // The order cache, shared by the workers (under order_mu): two epochs' orders, since a wrapped
  // batch reads the end of one and the start of the next. A worker holds a reference to the
  // orders it reads, so replacing one never pulls it from under a batch being produced.
  std::mutex order_mu;
  int64_t order_epoch[2] = {-1, -1};
  std::shared_ptr<const std::vector<int64_t>> order[2];

  // Augmentation (augment.h) on the producing threads (const: each worker has its own scratch).
  std::optional<Augmenter> augmenter;

  // What one producing thread owns: its source reader (open files) and augmentation scratch.
  struct Worker {
    std::unique_ptr<Source::Reader> reader;
    std::vector<float> aug_scratch;
  };
  Worker caller;  // the caller's thread, with prefetch = 0
  std::vector<Worker> workers;
  int num_workers = 1;  // threads producing batches when prefetch > 0 (PipelineConfig::workers)

  // Prefetch queue: `slots` has room for the most batches the queue may hold (never
  // reallocated: a worker keeps a reference into it), the first `active` have their tensors.
  // With W workers the queue has depth + W - 1 slots: each worker beyond the first has one batch
  // of its own in production, so `depth` batches can still be ready ahead.
  struct Slot {
    Tensor x, y;
    int64_t real = 0;
    absl::Status status;
  };
  std::vector<Slot> slots;
  int active = 0;
  bool auto_prefetch = false;
  int depth() const { return active - (num_workers - 1); }
  // Auto sizing (kAutoPrefetch): the producer's batch times (under mu) and the consumer's time
  // between Next() calls, over a window of kAutoWindow batches.
  static constexpr int kAutoWindow = 16;
  double win_produce_max = 0, produce_sum = 0;
  int64_t produce_n = 0;
  double win_gap_sum = 0, win_wait = 0, gap_sum = 0;
  int64_t win_n = 0, gap_n = 0;
  std::chrono::steady_clock::time_point last_return;
  bool have_last_return = false;
  std::mutex mu;
  std::condition_variable cv;
  // Batches are numbered in the order they are handed out (next_seq); a finished one waits in
  // `done` (number -> slot) until the consumer reaches its number (deliver_seq), so batches come
  // out in order whichever worker finished first.
  std::deque<int> free_slots;
  std::map<int64_t, int> done;
  int64_t next_seq = 0, deliver_seq = 0;
  bool halted = false;  // a batch failed: hand out no more (the consumer stops at that one)
  bool stop = false;
  std::vector<std::thread> threads;

  ~Impl() { StopThread(); }

  int64_t M() const { return static_cast<int64_t>(ids.size()); }
  bool wrap() const { return config.remainder == "wrap"; }

  std::shared_ptr<const std::vector<int64_t>> OrderOf(int64_t e) {
    std::lock_guard<std::mutex> lock(order_mu);
    for (int k = 0; k < 2; ++k)
      if (order_epoch[k] == e) return order[k];
    const int k = order_epoch[0] < order_epoch[1] ? 0 : 1;  // replace the older one
    order[k] = std::make_shared<const std::vector<int64_t>>(ComputeOrder(e));
    order_epoch[k] = e;
    return order[k];
  }

  std::vector<int64_t> ComputeOrder(int64_t e) const {
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

  // Fills the batch at (e, pos) into x, y (already of x_type / y_type); *real = rows that are
  // examples. Wrap: rows past the epoch's end come from the start of the next epoch's order.
  // A pure function of (e, pos): any worker, in any order, fills the same bytes.
  absl::Status Produce(int64_t e, int64_t pos, Tensor& x, Tensor& y, int64_t* real, Worker& w) {
    std::shared_ptr<const std::vector<int64_t>> ord = OrderOf(e);
    const int64_t B = config.batch_size;
    const int64_t xb = x_type.shape.num_elements() / B * DTypeSize(x_type.dtype);
    const int64_t y_elems = y_type.shape.num_elements() / B;
    const int64_t yb = y_elems * DTypeSize(y_type.dtype);
    auto* xd = static_cast<uint8_t*>(x.raw_data());
    auto* yd = static_cast<uint8_t*>(y.raw_data());
    *real = 0;
    for (int64_t r = 0, p = pos; r < B; ++r, ++p) {
      if (p >= M() && wrap()) {
        ord = OrderOf(++e);
        p = 0;
      }
      if (p < M()) {
        KILN_RETURN_IF_ERROR(source->Fetch((*ord)[p], xd + r * xb, yd + r * yb, w.reader.get()));
        if (augmenter.has_value()) {
          float* row = reinterpret_cast<float*>(xd + r * xb);
          if (config.split == "held_out") {
            augmenter->ApplyEval(row, w.aug_scratch.data());
          } else {
            augmenter->ApplyTrain(row, config.seed, e, (*ord)[p], w.aug_scratch.data());
          }
        }
        ++*real;
      } else {  // pad: zero features, ignore label (-1 for signed integers, else 0)
        std::memset(xd + r * xb, 0, xb);
        std::memset(yd + r * yb, 0, yb);
        const DType t = y_type.dtype;
        if (t == DType::kS8 || t == DType::kS32 || t == DType::kS64)
          for (int64_t k = 0; k < y_elems; ++k) y.SetDouble(r * y_elems + k, -1.0);
      }
    }
    return absl::OkStatus();
  }

  void Advance(int64_t& e, int64_t& pos) const {
    pos += config.batch_size;
    if (wrap()) {
      for (; pos >= M(); pos -= M()) ++e;
    } else if (pos >= bpe * config.batch_size) {
      pos = 0;
      ++e;
    }
  }

  Worker NewWorker() const {
    Worker w;
    w.reader = source->NewReader();
    if (augmenter.has_value()) w.aug_scratch.assign(static_cast<size_t>(augmenter->floats()), 0);
    return w;
  }

  // Worker k: takes the next batch number and position and a free slot, produces the batch
  // outside the lock, and files it under its number.
  void Loop(int k) {
    Worker& w = workers[k];
    while (true) {
      int slot;
      int64_t seq, e, p;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || (!halted && !free_slots.empty()); });
        if (stop) return;
        slot = free_slots.front();
        free_slots.pop_front();
        seq = next_seq++;
        e = p_epoch;
        p = p_pos;
        Advance(p_epoch, p_pos);
      }
      Slot& s = slots[slot];
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status status = Produce(e, p, s.x, s.y, &s.real, w);
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      {
        std::lock_guard<std::mutex> lock(mu);
        // The consumer sees an error when it reaches this batch; every batch before it was
        // handed out already, so it gets those first, and nothing after it is produced.
        if (!status.ok()) halted = true;
        s.status = std::move(status);
        done[seq] = slot;
        win_produce_max = std::max(win_produce_max, took);
        produce_sum += took;
        ++produce_n;
      }
      cv.notify_all();
    }
  }

  void StartThread() {
    if (config.prefetch <= 0) return;
    p_epoch = epoch;
    p_pos = pos;
    done.clear();
    next_seq = deliver_seq = 0;
    halted = false;
    free_slots.clear();
    for (int i = 0; i < active; ++i) free_slots.push_back(i);
    have_last_return = false;  // a restore is not a step
    stop = false;
    for (int k = 0; k < num_workers; ++k) threads.emplace_back([this, k] { Loop(k); });
  }

  void StopThread() {
    if (threads.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    for (std::thread& t : threads) t.join();
    threads.clear();
  }

  json ConfigJson() const {
    json j{{"batch_size", config.batch_size},
           {"shuffle", config.shuffle},
           {"seed", config.seed},
           {"shuffle_buffer", config.shuffle_buffer},
           {"remainder", config.remainder},
           {"shard_index", config.shard_index},
           {"num_shards", config.num_shards},
           {"held_out_fraction", config.held_out_fraction},
           {"split", config.split},
           {"split_seed", config.split_seed}};
    // Only text sources read seq_len (kept out of the others' state, which predates it).
    if (config.source.rfind("text:", 0) == 0) j["seq_len"] = config.seq_len;
    if (config.augment.enabled()) j["augment"] = config.augment.ToJson();
    if (!config.language.empty()) j["language"] = config.language;
    return j;
  }

  // Gives slot k its tensors.
  void AllocateSlot(int k) {
    slots[k].x = Tensor(x_type.dtype, x_type.shape);
    slots[k].y = Tensor(y_type.dtype, y_type.shape);
    slots[k].status = absl::OkStatus();
  }

  // kAutoPrefetch, after each window of kAutoWindow batches (consumer thread): the depth that
  // covers the window's slowest batch at the consumer's pace (pipeline.h), never shrinking.
  void MaybeResize() {
    if (!auto_prefetch || win_n < kAutoWindow) return;
    double produce_max, produce_mean;
    {
      std::lock_guard<std::mutex> lock(mu);
      produce_max = win_produce_max;
      produce_mean = produce_n > 0 ? produce_sum / static_cast<double>(produce_n) : 0;
      win_produce_max = 0;
    }
    const double step = win_gap_sum / static_cast<double>(win_n);
    // W workers finish a batch every produce_mean / W seconds on average.
    const int extra = num_workers - 1;
    const int want = extra + AutoPrefetchDepth(depth(), static_cast<int>(slots.size()) - extra,
                                               produce_max, produce_mean / num_workers, step,
                                               win_gap_sum > 0 ? win_wait / win_gap_sum : 0);
    if (want > active) {
      for (int k = active; k < want; ++k) AllocateSlot(k);
      {
        std::lock_guard<std::mutex> lock(mu);
        for (int k = active; k < want; ++k) free_slots.push_back(k);
        active = want;
      }
      cv.notify_all();
    }
    win_n = 0;
    win_gap_sum = 0;
    win_wait = 0;
  }
};

InputPipeline::InputPipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InputPipeline::~InputPipeline() = default;

namespace {

bool IsCsv(const PipelineConfig& c) { return c.source.rfind("csv:", 0) == 0; }

absl::Status CheckConfig(const PipelineConfig& config) {
  if (config.batch_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("data.batch_size must be >= 1, got ", config.batch_size));
  if (config.remainder != "drop" && config.remainder != "pad" &&
      !(config.remainder == "wrap" && IsCsv(config)))
    return absl::InvalidArgumentError(
        absl::StrCat("data.remainder must be \"drop\" or \"pad\"",
                     IsCsv(config) ? " or \"wrap\"" : "", ", got \"", config.remainder, "\"",
                     config.remainder == "wrap" ? " (\"wrap\" is for csv: sources only)" : ""));
  if (config.split != "train" && config.split != "held_out")
    return absl::InvalidArgumentError(
        absl::StrCat("data.split must be \"train\" or \"held_out\", got \"", config.split, "\""));
  if (config.num_shards < 1 || config.shard_index < 0 || config.shard_index >= config.num_shards)
    return absl::InvalidArgumentError(
        absl::StrCat("data.shard_index must be in [0, num_shards), got ", config.shard_index,
                     " of ", config.num_shards));
  if (!(config.held_out_fraction >= 0.0 && config.held_out_fraction < 1.0))
    return absl::InvalidArgumentError(
        absl::StrCat("data.held_out_fraction must be in [0, 1), got ", config.held_out_fraction));
  if (config.shuffle_buffer < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("data.shuffle_buffer must be >= 0, got ", config.shuffle_buffer));
  if ((config.prefetch < 0 && config.prefetch != kAutoPrefetch) || config.prefetch > 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("data.prefetch must be auto or in [0, 1024], got ", config.prefetch));
  if ((config.workers < 1 && config.workers != kAutoWorkers) || config.workers > kMaxWorkers)
    return absl::InvalidArgumentError(absl::StrCat("data.workers must be auto or in [1, ",
                                                   kMaxWorkers, "], got ", config.workers));
  return absl::OkStatus();
}

// The global indices of the examples of this host's share of config.split, in source order (csv:
// sources: in the order of their permuted split, data::SplitExampleIndices).
absl::StatusOr<std::vector<int64_t>> SelectExamples(const PipelineConfig& config,
                                                    const Source& source) {
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

}  // namespace

absl::StatusOr<std::unique_ptr<InputPipeline>> InputPipeline::Create(const PipelineConfig& config,
                                                                     Env* env) {
  KILN_RETURN_IF_ERROR(CheckConfig(config));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->env = env;
  KILN_ASSIGN_OR_RETURN(impl->source,
                        MakeExampleSource(config.source, config.seq_len, config.language, env));
  const Source& src = *impl->source;
  KILN_ASSIGN_OR_RETURN(impl->ids, SelectExamples(config, src));
  const int64_t m = impl->M();
  const std::string what = absl::StrCat(config.source, " (split ", config.split, ", shard ",
                                        config.shard_index, " of ", config.num_shards, ")");
  if (m == 0)
    return absl::InvalidArgumentError(absl::StrCat(what, " has no examples out of ", src.size()));
  if (config.shrink_batch) impl->config.batch_size = std::min(config.batch_size, m);
  const int64_t batch = impl->config.batch_size;
  if (config.remainder != "pad" && m < batch)
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", m,
                                                   " examples, fewer than batch_size ", batch,
                                                   " (use remainder \"pad\" or a smaller batch)"));
  impl->bpe = config.remainder == "pad" ? (m + batch - 1) / batch : m / batch;
  impl->x_type = {src.x_spec().dtype, PrependDim(batch, src.x_spec().shape)};
  impl->y_type = {src.y_spec().dtype, PrependDim(batch, src.y_spec().shape)};
  impl->fingerprint = Fnv1a64(src.FingerprintMaterial());
  if (config.augment.enabled()) {
    if (src.x_spec().dtype != DType::kF32)
      return absl::InvalidArgumentError(absl::StrCat("data.augment: needs f32 image features; ",
                                                     config.source, " gives ",
                                                     src.x_spec().ToString()));
    KILN_ASSIGN_OR_RETURN(Augmenter a,
                          Augmenter::Create(config.augment, src.x_spec().shape.num_elements()));
    impl->augmenter.emplace(std::move(a));
  }
  impl->num_workers = config.workers == kAutoWorkers ? AutoWorkers() : config.workers;
  impl->caller = impl->NewWorker();
  if (config.prefetch != 0) {
    for (int k = 0; k < impl->num_workers; ++k) impl->workers.push_back(impl->NewWorker());
  } else {
    impl->num_workers = 1;  // the caller produces each batch itself
  }
  int max_slots = config.prefetch;
  if (config.prefetch == kAutoPrefetch) {
    impl->auto_prefetch = true;
    const int64_t batch_bytes =
        std::max<int64_t>(1, impl->x_type.shape.num_elements() * DTypeSize(impl->x_type.dtype) +
                                 impl->y_type.shape.num_elements() * DTypeSize(impl->y_type.dtype));
    max_slots = static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / batch_bytes, 2, 16));
    impl->config.prefetch = 2;  // the starting depth (> 0: the thread runs)
  }
  // Each worker beyond the first gets a slot of its own (see Impl::Slot).
  const int extra = impl->num_workers - 1;
  impl->slots.resize(static_cast<size_t>(std::max(max_slots, 0) + (max_slots > 0 ? extra : 0)));
  impl->active = (impl->auto_prefetch ? 2 : max_slots) + (max_slots > 0 ? extra : 0);
  for (int i = 0; i < impl->active; ++i) impl->AllocateSlot(i);
  impl->StartThread();
  return std::unique_ptr<InputPipeline>(new InputPipeline(std::move(impl)));
}

const TensorSpec& InputPipeline::feature_type() const { return impl_->x_type; }
const TensorSpec& InputPipeline::label_type() const { return impl_->y_type; }
int64_t InputPipeline::epoch() const { return impl_->epoch; }
int64_t InputPipeline::epoch_of_last_batch() const {
  return impl_->pos > 0 ? impl_->epoch : std::max<int64_t>(impl_->epoch - 1, 0);
}
int64_t InputPipeline::source_examples() const { return impl_->source->size(); }
int64_t InputPipeline::examples_seen() const { return impl_->seen; }
int64_t InputPipeline::last_real_examples() const { return impl_->last_real; }
int64_t InputPipeline::examples_per_epoch() const { return impl_->M(); }
int64_t InputPipeline::batches_per_epoch() const { return impl_->bpe; }
int InputPipeline::prefetch_depth() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->config.prefetch > 0 ? impl_->depth() : 0;
}
int InputPipeline::workers() const { return impl_->config.prefetch > 0 ? impl_->num_workers : 0; }
double InputPipeline::mean_produce_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->produce_n > 0 ? impl_->produce_sum / static_cast<double>(impl_->produce_n) : 0;
}
double InputPipeline::mean_step_seconds() const {
  return impl_->gap_n > 0 ? impl_->gap_sum / static_cast<double>(impl_->gap_n) : 0;
}

absl::Status InputPipeline::Next(Tensor& x, Tensor& y) {
  Impl& m = *impl_;
  if (!m.sticky.ok()) return m.sticky;
  if (x.dtype() != m.x_type.dtype || x.shape() != m.x_type.shape || y.dtype() != m.y_type.dtype ||
      y.shape() != m.y_type.shape)
    return absl::InvalidArgumentError(
        absl::StrCat("InputPipeline::Next: got tensors ", x.TypeString(), " and ", y.TypeString(),
                     ", expected ", m.x_type.ToString(), " and ", m.y_type.ToString()));
  int64_t real = 0;
  if (m.config.prefetch <= 0) {
    absl::Status s = m.Produce(m.epoch, m.pos, x, y, &real, m.caller);
    if (!s.ok()) {
      m.sticky = s;
      return s;
    }
  } else {
    using SteadyClock = std::chrono::steady_clock;
    const SteadyClock::time_point enter = SteadyClock::now();
    if (m.have_last_return) {  // the consumer's time since the last batch: its step
      const double gap = std::chrono::duration<double>(enter - m.last_return).count();
      m.win_gap_sum += gap;
      m.gap_sum += gap;
      ++m.win_n;
      ++m.gap_n;
    }
    int slot;
    {
      std::unique_lock<std::mutex> lock(m.mu);
      m.cv.wait(lock, [&] { return m.done.count(m.deliver_seq) > 0; });
      auto it = m.done.find(m.deliver_seq++);
      slot = it->second;
      m.done.erase(it);
    }
    const SteadyClock::time_point got = SteadyClock::now();
    m.win_wait += std::chrono::duration<double>(got - enter).count();
    Impl::Slot& s = m.slots[slot];
    if (!s.status.ok()) {
      m.sticky = s.status;
      return s.status;
    }
    std::memcpy(x.raw_data(), s.x.raw_data(), x.byte_size());
    std::memcpy(y.raw_data(), s.y.raw_data(), y.byte_size());
    real = s.real;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      m.free_slots.push_back(slot);
    }
    m.cv.notify_all();
    m.MaybeResize();
    m.last_return = SteadyClock::now();
    m.have_last_return = true;
  }
  m.seen += real;
  m.last_real = real;
  m.Advance(m.epoch, m.pos);
  return absl::OkStatus();
}

std::string InputPipeline::SaveState() const {
  const Impl& m = *impl_;
  const int64_t pos = m.pos;
  json j = {{"format", kStateFormat},
            {"source", m.config.source},
            {"fingerprint", Hex64(m.fingerprint)},
            {"config", m.ConfigJson()},
            {"epoch", m.epoch},
            {"batch_in_epoch", pos / m.config.batch_size},
            {"position_in_epoch", pos},
            {"examples_seen", m.seen},
            {"shard_index", m.config.shard_index},
            {"num_shards", m.config.num_shards},
            {"rng", {{"algorithm", "mt19937_64"}, {"seed", m.config.seed}, {"stream", m.epoch}}}};
  // Where the next batch starts reading (informational; restore recomputes it).
  if (!m.source->files().empty() && pos < m.M()) {
    std::vector<int64_t> order = m.ComputeOrder(m.epoch);
    auto [file, offset] = m.source->Location(order[pos]);
    j["next_record"] = {{"file", file}, {"offset", offset}};
  }
  return j.dump();
}

absl::Status InputPipeline::RestoreState(const std::string& text) {
  Impl& m = *impl_;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("input pipeline state: ", why));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kStateFormat)
    return bad(absl::StrCat("\"format\" is not \"", kStateFormat, "\""));
  for (const char* key : {"epoch", "batch_in_epoch", "examples_seen"})
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
      return bad(absl::StrCat("\"", key, "\" must be a non-negative integer"));
  if (!j.contains("fingerprint") || !j["fingerprint"].is_string() || !j.contains("config") ||
      !j["config"].is_object())
    return bad("missing \"fingerprint\" or \"config\"");
  if (j["fingerprint"].get<std::string>() != Hex64(m.fingerprint))
    return absl::FailedPreconditionError(absl::StrCat(
        "input pipeline state was saved for different data (source ",
        (j.contains("source") && j["source"].is_string() ? j["source"].get<std::string>() : "?"),
        ", fingerprint ", j["fingerprint"].get<std::string>(), "); this pipeline reads ",
        m.config.source, " (fingerprint ", Hex64(m.fingerprint), ")"));
  const json mine = m.ConfigJson();
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    const json& theirs = j["config"];
    if (!theirs.contains(it.key()) || theirs[it.key()] != it.value())
      return absl::FailedPreconditionError(absl::StrCat(
          "input pipeline state was saved with data.", it.key(), " = ",
          theirs.contains(it.key()) ? theirs[it.key()].dump() : std::string("(missing)"),
          " but this pipeline has ", it.value().dump()));
  }
  int64_t pos = 0;
  if (m.wrap()) {  // batches do not line up with epochs: the position is in examples
    if (!j.contains("position_in_epoch") || !j["position_in_epoch"].is_number_integer() ||
        j["position_in_epoch"].get<int64_t>() < 0 || j["position_in_epoch"].get<int64_t>() >= m.M())
      return bad(absl::StrCat("\"position_in_epoch\" must be an integer in [0, ", m.M(), ")"));
    pos = j["position_in_epoch"].get<int64_t>();
  } else {
    const int64_t b = j["batch_in_epoch"].get<int64_t>();
    if (b >= m.bpe)
      return bad(absl::StrCat("batch_in_epoch ", b, " is past the ", m.bpe, " batches per epoch"));
    pos = b * m.config.batch_size;
  }
  m.StopThread();
  m.epoch = j["epoch"].get<int64_t>();
  m.pos = pos;
  m.seen = j["examples_seen"].get<int64_t>();
  m.sticky = absl::OkStatus();
  m.StartThread();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Writing record shards.

absl::StatusOr<std::string> SerializeExample(const Tensor& x, const Tensor& y) {
  return SerializeSafetensors({{"x", x}, {"y", y}});
}

absl::Status ParseExample(const std::string& bytes, const std::string& source, Tensor* x,
                          Tensor* y) {
  absl::StatusOr<std::map<std::string, Tensor>> ts = ParseSafetensors(bytes, nullptr, source);
  if (!ts.ok()) return absl::DataLossError(std::string(ts.status().message()));
  auto xi = ts->find("x");
  auto yi = ts->find("y");
  if (xi == ts->end() || yi == ts->end())
    return absl::DataLossError(
        absl::StrCat(source, ": example record lacks tensor \"x\" or \"y\""));
  *x = xi->second;
  *y = yi->second;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> WriteRecordShards(const Tensor& x, const Tensor& y,
                                                           const std::string& dir, int num_shards,
                                                           Env* env) {
  if (x.shape().rank() < 1 || y.shape().rank() < 1 || x.shape()[0] != y.shape()[0])
    return absl::InvalidArgumentError(
        absl::StrCat("WriteRecordShards: x and y need the same first (example) dimension, got ",
                     x.TypeString(), " and ", y.TypeString()));
  const int64_t n = x.shape()[0];
  if (num_shards < 1 || num_shards > n)
    return absl::InvalidArgumentError(
        absl::StrCat("WriteRecordShards: num_shards must be in [1, ", n, "], got ", num_shards));
  KILN_RETURN_IF_ERROR(env->CreateDir(dir));
  Tensor ex(x.dtype(), DropFirst(x.shape())), ey(y.dtype(), DropFirst(y.shape()));
  const int64_t xb = ex.byte_size(), yb = ey.byte_size();
  std::vector<std::string> paths;
  for (int k = 0; k < num_shards; ++k) {
    const std::string path =
        JoinPath(dir, absl::StrFormat("data-%05d-of-%05d.tfrecord", k, num_shards));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<RecordWriter> w, RecordWriter::Open(env, path));
    for (int64_t i = k * n / num_shards; i < (k + 1) * n / num_shards; ++i) {
      std::memcpy(ex.raw_data(), static_cast<const uint8_t*>(x.raw_data()) + i * xb, xb);
      std::memcpy(ey.raw_data(), static_cast<const uint8_t*>(y.raw_data()) + i * yb, yb);
      KILN_ASSIGN_OR_RETURN(std::string rec, SerializeExample(ex, ey));
      KILN_RETURN_IF_ERROR(w->Write(rec));
    }
    KILN_RETURN_IF_ERROR(w->Close());
    paths.push_back(path);
  }
  return paths;
}

absl::StatusOr<std::vector<std::string>> WriteRecordShards(const Dataset& dataset,
                                                           const std::string& dir, int num_shards,
                                                           Env* env) {
  return WriteRecordShards(dataset.features, dataset.labels, dir, num_shards, env);
}

}  // namespace kiln::data
