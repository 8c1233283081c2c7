// The input pipeline's example sources (pipeline.h): what a source spec ("records:DIR",
// "dataset:DIR", ...) opens, N examples of one fixed type fetched by global index 0..N-1. The
// pipeline's engine (pipeline.cc) orders, splits and batches them; it never sees a file format.
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExampleSource> s,
//                         OpenExampleSource("records:/data/digits", 0, "", env));
//   std::unique_ptr<ExampleSource::Reader> r = s->NewReader();   // one per fetching thread
//   KILN_RETURN_IF_ERROR(s->Fetch(7, x_bytes, y_bytes, r.get()));  // example 7, no batch dim
#ifndef KILN_DATA_INTERNAL_EXAMPLE_SOURCE_H_
#define KILN_DATA_INTERNAL_EXAMPLE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "kiln/base/env.h"
#include "kiln/base/hash.h"
#include "kiln/data/pipeline.h"
#include "kiln/tensor/shape.h"

namespace kiln::data::internal {

// A fingerprint (FNV-1a 64, base/hash.h) as its 16-hex-digit spelling in the state JSON.
inline std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

inline Shape DropFirst(const Shape& s) {
  return Shape(std::vector<int64_t>(s.dims().begin() + 1, s.dims().end()));
}
inline Shape PrependDim(int64_t d, const Shape& s) {
  std::vector<int64_t> dims = {d};
  dims.insert(dims.end(), s.dims().begin(), s.dims().end());
  return Shape(std::move(dims));
}

// N examples of fixed type, fetched by global index: what a source spec opens.

class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
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

// Opens a source spec (PipelineConfig::source; the kinds are listed in pipeline.h). `seq_len`
// applies to text: specs, `language` to tokens: (and dataset:, which refuses it).
absl::StatusOr<std::unique_ptr<ExampleSource>> OpenExampleSource(const std::string& spec,
                                                                 int64_t seq_len,
                                                                 const std::string& language,
                                                                 Env* env);

// "dataset:DIR" (tokens = false) and "tokens:DIR" (tokens = true): dataset_example_source.cc.
absl::StatusOr<std::unique_ptr<ExampleSource>> OpenDatasetExampleSource(
    Env* env, const std::string& dir, bool tokens, const std::string& language);

}  // namespace kiln::data::internal

#endif  // KILN_DATA_INTERNAL_EXAMPLE_SOURCE_H_
