#include "kiln/data/dataset_manifest.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"

namespace kiln::data {
namespace {

absl::Status Malformed(const std::string& where, const std::string& what) {
  return absl::DataLossError(absl::StrCat(where, ": malformed dataset manifest: ", what));
}

// Reads j[key] as T; DataLoss naming the key when it is missing or of the wrong type.
template <typename T>
absl::Status Get(const nlohmann::json& j, const char* key, const std::string& where, T* out) {
  if (!j.is_object() || !j.contains(key))
    return Malformed(where, absl::StrCat("missing \"", key, "\""));
  try {
    *out = j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    return Malformed(where, absl::StrCat("\"", key, "\": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, int64_t> DatasetManifest::SplitExamples() const {
  std::map<std::string, int64_t> out;
  for (const ShardEntry& s : shards) out[s.split] += s.examples;
  return out;
}

const FeatureSchema* DatasetManifest::FindFeature(const std::string& name) const {
  for (const FeatureSchema& f : features) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string ShardFileName(const std::string& split, int index, int count) {
  return absl::StrFormat("%s-%05d-of-%05d.tfrecord", split, index, count);
}

nlohmann::json ManifestToJson(const DatasetManifest& m) {
  nlohmann::json j;
  j["format"] = kManifestFormat;
  j["kind"] = m.kind;
  nlohmann::json features = nlohmann::json::array();
  for (const FeatureSchema& f : m.features) {
    nlohmann::json e = {{"name", f.name}, {"dtype", f.dtype}, {"shape", f.shape}};
    if (!f.description.empty()) e["description"] = f.description;
    features.push_back(e);
  }
  j["features"] = features;
  if (!m.label_feature.empty()) {
    j["label"] = {{"feature", m.label_feature}, {"vocabulary", m.label_vocabulary}};
  }
  j["vocabularies"] = m.vocabularies;
  j["statistics"] = m.statistics;
  j["source"] = {
      {"fingerprint", m.source_fingerprint}, {"files", m.source_files}, {"bytes", m.source_bytes}};
  nlohmann::json splits = nlohmann::json::object();
  std::map<std::string, int> shard_counts;
  for (const ShardEntry& s : m.shards) ++shard_counts[s.split];
  for (const auto& [name, n] : m.SplitExamples()) {
    splits[name] = {{"examples", n}, {"shards", shard_counts[name]}};
  }
  j["splits"] = splits;
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardEntry& s : m.shards) {
    shards.push_back({{"file", s.file},
                      {"split", s.split},
                      {"examples", s.examples},
                      {"bytes", s.bytes},
                      {"crc32c", absl::StrFormat("%08x", s.crc32c)}});
  }
  j["shards"] = shards;
  j["import"] = m.import_options;
  j["skipped"] = m.skipped;
  j["extra"] = m.extra;
  return j;
}

absl::StatusOr<DatasetManifest> ManifestFromJson(const nlohmann::json& j,
                                                 const std::string& where) {
  DatasetManifest m;
  std::string format;
  KILN_RETURN_IF_ERROR(Get(j, "format", where, &format));
  if (format != kManifestFormat) {
    return Malformed(where, absl::StrCat("format \"", format, "\" is not ", kManifestFormat));
  }
  KILN_RETURN_IF_ERROR(Get(j, "kind", where, &m.kind));
  nlohmann::json features, shards, source;
  KILN_RETURN_IF_ERROR(Get(j, "features", where, &features));
  if (!features.is_array()) return Malformed(where, "\"features\" is not an array");
  for (size_t i = 0; i < features.size(); ++i) {
    const std::string at = absl::StrCat(where, " features[", i, "]");
    FeatureSchema f;
    KILN_RETURN_IF_ERROR(Get(features[i], "name", at, &f.name));
    KILN_RETURN_IF_ERROR(Get(features[i], "dtype", at, &f.dtype));
    KILN_RETURN_IF_ERROR(Get(features[i], "shape", at, &f.shape));
    if (f.dtype != "uint8" && f.dtype != "float32" && f.dtype != "int64" && f.dtype != "string") {
      return Malformed(at, absl::StrCat("unknown dtype \"", f.dtype, "\""));
    }
    if (features[i].contains("description")) {
      KILN_RETURN_IF_ERROR(Get(features[i], "description", at, &f.description));
    }
    m.features.push_back(std::move(f));
  }
  if (j.contains("label") && !j["label"].is_null()) {
    KILN_RETURN_IF_ERROR(Get(j["label"], "feature", where + " label", &m.label_feature));
    KILN_RETURN_IF_ERROR(Get(j["label"], "vocabulary", where + " label", &m.label_vocabulary));
  }
  if (j.contains("vocabularies"))
    KILN_RETURN_IF_ERROR(Get(j, "vocabularies", where, &m.vocabularies));
  if (j.contains("statistics")) m.statistics = j["statistics"];
  KILN_RETURN_IF_ERROR(Get(j, "source", where, &source));
  KILN_RETURN_IF_ERROR(Get(source, "fingerprint", where + " source", &m.source_fingerprint));
  KILN_RETURN_IF_ERROR(Get(source, "files", where + " source", &m.source_files));
  KILN_RETURN_IF_ERROR(Get(source, "bytes", where + " source", &m.source_bytes));
  KILN_RETURN_IF_ERROR(Get(j, "shards", where, &shards));
  if (!shards.is_array()) return Malformed(where, "\"shards\" is not an array");
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string at = absl::StrCat(where, " shards[", i, "]");
    ShardEntry s;
    std::string crc;
    KILN_RETURN_IF_ERROR(Get(shards[i], "file", at, &s.file));
    KILN_RETURN_IF_ERROR(Get(shards[i], "split", at, &s.split));
    KILN_RETURN_IF_ERROR(Get(shards[i], "examples", at, &s.examples));
    KILN_RETURN_IF_ERROR(Get(shards[i], "bytes", at, &s.bytes));
    KILN_RETURN_IF_ERROR(Get(shards[i], "crc32c", at, &crc));
    if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return Malformed(at, absl::StrCat("crc32c \"", crc, "\" is not 8 hex digits"));
    }
    s.crc32c = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
    if (s.file.empty() || s.file.find('/') != std::string::npos || s.file[0] == '.') {
      return Malformed(at, absl::StrCat("shard file name \"", s.file, "\" is not a plain name"));
    }
    m.shards.push_back(std::move(s));
  }
  if (j.contains("import")) m.import_options = j["import"];
  if (j.contains("skipped")) m.skipped = j["skipped"];
  if (j.contains("extra")) m.extra = j["extra"];
  return m;
}

absl::Status WriteManifest(Env* env, const std::string& dir, const DatasetManifest& m) {
  const std::string path = JoinPath(dir, kManifestName);
  const std::string tmp = JoinPath(dir, std::string(".") + kManifestName + ".tmp");
  KILN_RETURN_IF_ERROR(
      WriteStringToFile(env, ManifestToJson(m).dump(1) + "\n", tmp, /*sync=*/true));
  KILN_RETURN_IF_ERROR(env->RenameFile(tmp, path));
  return env->SyncDir(dir);
}

absl::StatusOr<DatasetManifest> ReadManifest(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestName);
  if (!env->FileExists(path)) {
    return absl::NotFoundError(absl::StrCat(dir, " has no ", kManifestName,
                                            " (not a dataset written by `kiln data import`)"));
  }
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Malformed(path, "not valid JSON");
  return ManifestFromJson(j, path);
}

absl::StatusOr<FileChecksum> ChecksumFile(Env* env, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> f, env->NewSequentialFile(path));
  FileChecksum c;
  std::string scratch(1 << 20, '\0');
  while (true) {
    std::string_view got;
    KILN_RETURN_IF_ERROR(f->Read(scratch.size(), &got, scratch.data()));
    if (got.empty()) break;
    c.crc32c = crc32c::Extend(c.crc32c, got.data(), got.size());
    c.bytes += got.size();
  }
  return c;
}

absl::Status VerifyShards(Env* env, const std::string& dir, const DatasetManifest& m) {
  for (const ShardEntry& s : m.shards) {
    const std::string path = JoinPath(dir, s.file);
    if (!env->FileExists(path)) {
      return absl::NotFoundError(
          absl::StrCat("shard ", path, " listed in ", kManifestName, " is missing"));
    }
    KILN_ASSIGN_OR_RETURN(FileChecksum c, ChecksumFile(env, path));
    if (c.bytes != s.bytes) {
      return absl::DataLossError(absl::StrCat("shard ", path, " is ", c.bytes, " bytes; ",
                                              kManifestName, " says ", s.bytes));
    }
    if (c.crc32c != s.crc32c) {
      return absl::DataLossError(absl::StrFormat("shard %s: CRC32C %08x does not match %s (%08x)",
                                                 path, c.crc32c, kManifestName, s.crc32c));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::data
