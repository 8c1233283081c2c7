#include "kiln/data/dataset_reader.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/import_util.h"
#include "kiln/data/record_io.h"

namespace kiln::data {
namespace {

int64_t Elements(const FeatureSchema& f) {
  int64_t n = 1;
  for (int64_t d : f.shape) n *= d;
  return n;
}

// Copies feature `f` of `ex` into slot `row` of `t`; "" on success, else what was wrong.
std::string CopyFeature(const FeatureSchema& f, const Example& ex, int64_t row, Tensor* t) {
  auto it = ex.features.find(f.name);
  if (it == ex.features.end()) return "feature '" + f.name + "' missing";
  const Feature& v = it->second;
  const int64_t n = Elements(f);
  if (f.dtype == "uint8") {
    if (v.kind != Feature::Kind::kBytes || v.bytes_list.size() != 1 ||
        static_cast<int64_t>(v.bytes_list[0].size()) != n) {
      return absl::StrCat("feature '", f.name, "' is not one bytes value of ", n, " uint8");
    }
    std::memcpy(t->data<uint8_t>() + row * n, v.bytes_list[0].data(), n);
  } else if (f.dtype == "float32") {
    if (v.kind != Feature::Kind::kFloat || static_cast<int64_t>(v.float_list.size()) != n) {
      return absl::StrCat("feature '", f.name, "' is not ", n, " floats (a ",
                          FeatureKindName(v.kind), " list)");
    }
    std::memcpy(t->data<float>() + row * n, v.float_list.data(), n * sizeof(float));
  } else if (f.dtype == "int64") {
    if (v.kind != Feature::Kind::kInt64 || static_cast<int64_t>(v.int64_list.size()) != n) {
      return absl::StrCat("feature '", f.name, "' is not ", n, " int64 (a ",
                          FeatureKindName(v.kind), " list)");
    }
    std::memcpy(t->data<int64_t>() + row * n, v.int64_list.data(), n * sizeof(int64_t));
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<DatasetReader>> DatasetReader::Open(Env* env, const std::string& dir,
                                                                   const std::string& split) {
  std::unique_ptr<DatasetReader> ds(new DatasetReader());
  ds->env_ = env;
  ds->dir_ = dir;
  KILN_ASSIGN_OR_RETURN(ds->manifest_, ReadManifest(env, dir));
  for (const ShardEntry& s : ds->manifest_.shards) {
    if (!split.empty() && s.split != split) continue;
    const std::string path = JoinPath(dir, s.file);
    KILN_ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(path));
    if (size != s.bytes) {
      return absl::DataLossError(
          absl::StrCat("shard ", path, " is ", size, " bytes; ", kManifestName, " says ", s.bytes));
    }
    const int shard = static_cast<int>(ds->paths_.size());
    ds->paths_.push_back(path);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> r, RecordReader::Open(env, path));
    std::string rec;
    int64_t n = 0;
    while (true) {
      const uint64_t at = r->offset();
      absl::StatusOr<bool> got = r->Read(&rec);
      if (!got.ok()) return absl::DataLossError(got.status().message());
      if (!*got) break;
      ds->index_.push_back({shard, at});
      ++n;
    }
    if (n != s.examples) {
      return absl::DataLossError(
          absl::StrCat(path, " holds ", n, " records; ", kManifestName, " says ", s.examples));
    }
  }
  if (ds->paths_.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, " has no shards of split '", split, "'"));
  }
  return ds;
}

std::string DatasetReader::Location(int64_t i) const {
  const Entry& e = index_[i];
  return absl::StrCat(paths_[e.shard], " record at offset ", e.offset);
}

absl::StatusOr<ExampleBatch> DatasetReader::ReadBatch(const std::vector<int64_t>& indices,
                                                      int threads) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  ExampleBatch out;
  std::vector<const FeatureSchema*> numeric;
  for (const FeatureSchema& f : manifest_.features) {
    DType dt;
    if (f.dtype == "uint8") {
      dt = DType::kU8;
    } else if (f.dtype == "float32") {
      dt = DType::kF32;
    } else if (f.dtype == "int64") {
      dt = DType::kS64;
    } else {
      continue;
    }
    std::vector<int64_t> dims = {b};
    dims.insert(dims.end(), f.shape.begin(), f.shape.end());
    out.tensors.emplace(f.name, Tensor(dt, Shape(dims)));
    numeric.push_back(&f);
  }
  for (int64_t i : indices) {
    if (i < 0 || i >= size()) {
      return absl::OutOfRangeError(absl::StrCat("example ", i, " is outside [0, ", size(), ")"));
    }
  }
  std::vector<std::string> errors(b);
  ParallelFor(threads, b, [&](int64_t row) {
    const Entry& e = index_[indices[row]];
    absl::StatusOr<std::unique_ptr<RecordReader>> r = RecordReader::Open(env_, paths_[e.shard]);
    if (!r.ok()) {
      errors[row] = std::string(r.status().message());
      return;
    }
    (*r)->Seek(e.offset);
    std::string rec;
    absl::StatusOr<bool> got = (*r)->Read(&rec);
    if (!got.ok() || !*got) {
      errors[row] = got.ok() ? "record missing" : std::string(got.status().message());
      return;
    }
    absl::StatusOr<Example> ex = DecodeExample(rec);
    if (!ex.ok()) {
      errors[row] = std::string(ex.status().message());
      return;
    }
    for (const FeatureSchema* f : numeric) {
      std::string bad = CopyFeature(*f, *ex, row, &out.tensors.at(f->name));
      if (!bad.empty()) {
        errors[row] = bad;
        return;
      }
    }
  });
  for (int64_t row = 0; row < b; ++row) {
    if (!errors[row].empty()) {
      return absl::DataLossError(absl::StrCat(Location(indices[row]), ": ", errors[row]));
    }
  }
  return out;
}

}  // namespace kiln::data
