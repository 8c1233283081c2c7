// Example records (a small safetensors blob per example) and writing them as TFRecord shards
// that records: sources read. See pipeline.h.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/data/internal/example_source.h"
#include "kiln/data/pipeline.h"
#include "kiln/data/record_io.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::data {

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
  Tensor ex(x.dtype(), internal::DropFirst(x.shape())),
      ey(y.dtype(), internal::DropFirst(y.shape()));
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
