// The input pipeline's example sources over in-memory arrays (safetensors:, digits:, csv:,
// text:) and indexed TFRecord shards (records:), and the source-spec factory. dataset: and
// tokens: live in dataset_example_source.cc. See internal/example_source.h.
#include "kiln/data/internal/example_source.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "kiln/base/coding.h"
#include "kiln/base/hash.h"
#include "kiln/base/status.h"
#include "kiln/data/digits.h"
#include "kiln/data/record_io.h"
#include "kiln/tensor/safetensors.h"
#include "nlohmann/json.hpp"

namespace kiln::data::internal {
namespace {

using json = nlohmann::json;

class ArrayExampleSource final : public ExampleSource {
 public:
  // `content_id` (optional) joins the fingerprint, e.g. a hash of the bytes a text source read.
  static absl::StatusOr<std::unique_ptr<ExampleSource>> Make(Tensor x, Tensor y,
                                                             const std::string& name,
                                                             const std::string& content_id = "") {
    if (x.shape().rank() < 1 || y.shape().rank() < 1)
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": tensors \"x\" and \"y\" need an example dimension first, got x ",
                       x.TypeString(), " and y ", y.TypeString()));
    if (x.shape()[0] != y.shape()[0])
      return absl::InvalidArgumentError(absl::StrCat(name, ": \"x\" has ", x.shape()[0],
                                                     " examples but \"y\" has ", y.shape()[0]));
    auto s = std::unique_ptr<ArrayExampleSource>(new ArrayExampleSource());
    s->size_ = x.shape()[0];
    s->x_spec_ = {x.dtype(), DropFirst(x.shape())};
    s->y_spec_ = {y.dtype(), DropFirst(y.shape())};
    s->name_ = name;
    s->content_id_ = content_id;
    s->x_ = std::move(x);
    s->y_ = std::move(y);
    return std::unique_ptr<ExampleSource>(std::move(s));
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
  ArrayExampleSource() = default;
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

class RecordExampleSource final : public ExampleSource {
 public:
  static absl::StatusOr<std::unique_ptr<ExampleSource>> Make(Env* env, const std::string& pattern) {
    KILN_ASSIGN_OR_RETURN(std::vector<std::string> files, ListFiles(env, pattern));
    auto s = std::unique_ptr<RecordExampleSource>(new RecordExampleSource());
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
    return std::unique_ptr<ExampleSource>(std::move(s));
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
  RecordExampleSource() = default;

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
absl::StatusOr<std::unique_ptr<ExampleSource>> MakeTextSource(const std::string& path,
                                                              int64_t seq_len, Env* env) {
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
  return ArrayExampleSource::Make(std::move(x), std::move(y), path,
                                  absl::StrCat("text|", bytes.size(), "|", Hex64(Fnv1a64(bytes))));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExampleSource>> OpenExampleSource(const std::string& source,
                                                                 int64_t seq_len,
                                                                 const std::string& language,
                                                                 Env* env) {
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
    return ArrayExampleSource::Make(x->second, y->second, path);
  }
  if (kind == "digits" || kind == "csv") {
    KILN_ASSIGN_OR_RETURN(Dataset d, LoadDigitsCsv(path, env));
    // csv: orders and splits differently (IsCsv), so its states do not restore into digits:.
    return ArrayExampleSource::Make(d.features, d.labels, path, kind == "csv" ? "csv" : "");
  }
  if (kind == "records") return RecordExampleSource::Make(env, path);
  if (kind == "dataset") return OpenDatasetExampleSource(env, path, /*tokens=*/false, language);
  if (kind == "tokens") return OpenDatasetExampleSource(env, path, /*tokens=*/true, language);
  if (kind == "text") return MakeTextSource(path, seq_len, env);
  return absl::InvalidArgumentError(
      absl::StrCat("data source \"", source, "\": unknown kind \"", kind,
                   "\" (allowed: safetensors, records, dataset, tokens, digits, csv, text)"));
}

}  // namespace kiln::data::internal
