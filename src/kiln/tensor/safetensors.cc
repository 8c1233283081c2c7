#include "kiln/tensor/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kiln/base/coding.h"
#include "kiln/base/status.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; Kiln reads it in place");

constexpr char kMetadataKey[] = "__metadata__";

absl::Status Corrupt(const std::string& source, const std::string& what) {
  return absl::DataLossError(absl::StrCat("safetensors ", source, ": ", what));
}

// Checks the 8-byte prefix against the total size; returns the header length.
absl::StatusOr<uint64_t> CheckPrefix(const char* prefix, uint64_t total_size,
                                     const std::string& source) {
  const uint64_t n = DecodeFixed64(prefix);
  if (n > kSafetensorsMaxHeaderBytes) {
    return Corrupt(source, absl::StrCat("header length ", n, " exceeds the limit of ",
                                        kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (n > total_size - 8) {
    return Corrupt(source, absl::StrCat("header length ", n, " runs past the end of the file (",
                                        total_size, " bytes)"));
  }
  return n;
}

// Reads a JSON integer as a non-negative int64.
bool AsNonNegative(const nlohmann::json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const nlohmann::json& j,
                                            uint64_t data_size, const std::string& source) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!j.is_object()) return Corrupt(source, where + " is not a JSON object");
  SafetensorsEntry e;
  e.name = name;

  auto dt = j.find("dtype");
  if (dt == j.end()) return Corrupt(source, where + " has no dtype");
  if (!dt->is_string()) return Corrupt(source, where + " has a dtype that is not a string");
  const std::string& dt_name = dt->get_ref<const std::string&>();
  std::optional<DType> dtype = DTypeFromSafetensorsName(dt_name);
  if (!dtype) return Corrupt(source, absl::StrCat(where, " has unsupported dtype '", dt_name, "'"));
  e.dtype = *dtype;

  auto sh = j.find("shape");
  if (sh == j.end()) return Corrupt(source, where + " has no shape");
  if (!sh->is_array()) return Corrupt(source, where + " has a shape that is not an array");
  std::vector<int64_t> dims;
  int64_t nonzero_product = 1;
  bool has_zero = false;
  for (const auto& d : *sh) {
    int64_t v;
    if (!AsNonNegative(d, &v)) {
      return Corrupt(source, absl::StrCat(where, " has an invalid dimension ", d.dump(),
                                          " (dimensions are non-negative integers)"));
    }
    if (v == 0) {
      has_zero = true;
    } else if (__builtin_mul_overflow(nonzero_product, v, &nonzero_product)) {
      return Corrupt(source, where + " has a shape whose element count overflows int64");
    }
    dims.push_back(v);
  }
  e.shape = Shape(std::move(dims));
  const int64_t elements = has_zero ? 0 : nonzero_product;
  int64_t expected_bytes;
  if (__builtin_mul_overflow(elements, DTypeSize(e.dtype), &expected_bytes)) {
    return Corrupt(source, where + " has a byte size that overflows int64");
  }

  auto off = j.find("data_offsets");
  if (off == j.end()) return Corrupt(source, where + " has no data_offsets");
  int64_t begin, end;
  if (!off->is_array() || off->size() != 2 || !AsNonNegative((*off)[0], &begin) ||
      !AsNonNegative((*off)[1], &end)) {
    return Corrupt(source, absl::StrCat(where, " has invalid data_offsets ", off->dump(),
                                        " (want [begin, end], non-negative integers)"));
  }
  if (begin > end) {
    return Corrupt(
        source, absl::StrCat(where, " has data_offsets [", begin, ", ", end, "] with begin > end"));
  }
  if (static_cast<uint64_t>(end) > data_size) {
    return Corrupt(source, absl::StrCat(where, " has data_offsets [", begin, ", ", end,
                                        "] past the end of the data buffer (", data_size,
                                        " bytes); the file may be truncated"));
  }
  if (end - begin != expected_bytes) {
    return Corrupt(source, absl::StrCat(where, " holds ", end - begin, " bytes but ",
                                        SafetensorsName(e.dtype).data(), e.shape.ToString(),
                                        " needs ", expected_bytes));
  }
  e.begin = static_cast<uint64_t>(begin);
  e.end = static_cast<uint64_t>(end);
  return e;
}

// Parses and validates the JSON header for a data buffer of `data_size` bytes.
absl::StatusOr<SafetensorsHeader> ParseHeader(std::string_view json_text, uint64_t data_start,
                                              uint64_t data_size, const std::string& source) {
  // nlohmann keeps the last of duplicate keys silently; the callback sees every key, so a
  // duplicate at any depth (a tensor name, or a field such as "dtype") is caught.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto cb = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open_objects.emplace_back();
    } else if (event == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == E::key && !open_objects.empty() && parsed.is_string() &&
               !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  // nlohmann's lexer stops at a NUL byte as if the input ended there; serde_json (and the spec,
  // which pads with spaces) does not allow one.
  if (size_t nul = json_text.find('\0'); nul != std::string_view::npos) {
    return Corrupt(source, absl::StrCat("header is not valid JSON: NUL byte at offset ", nul));
  }
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text.begin(), json_text.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(source, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return Corrupt(source, absl::StrCat("header is a JSON ", root.type_name(), ", not an object"));
  }
  if (!duplicate.empty()) {
    return Corrupt(source, absl::StrCat("header names '", duplicate, "' more than once"));
  }

  SafetensorsHeader header;
  header.data_start = data_start;
  header.data_size = data_size;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (it->is_null()) continue;
      if (!it->is_object()) return Corrupt(source, "__metadata__ is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Corrupt(source,
                         absl::StrCat("__metadata__ value for '", m.key(), "' is not a string"));
        }
        header.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    KILN_ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(it.key(), *it, data_size, source));
    header.entries.push_back(std::move(e));
  }

  // Coverage: sorted by offsets, each tensor starts where the previous one ended and the last
  // ends at the end of the buffer.
  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t pos = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : header.entries) {
    if (e.begin < pos) {
      return Corrupt(source,
                     absl::StrCat("tensors '", prev->name, "' [", prev->begin, ", ", prev->end,
                                  ") and '", e.name, "' [", e.begin, ", ", e.end, ") overlap"));
    }
    if (e.begin > pos) {
      return Corrupt(source,
                     absl::StrCat("data bytes [", pos, ", ", e.begin, ") belong to no tensor"));
    }
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size) {
    return Corrupt(source,
                   absl::StrCat("data bytes [", pos, ", ", data_size, ") belong to no tensor"));
  }
  return header;
}

// Normalizes BOOL bytes so compute never sees values other than 0 and 1.
void NormalizeBool(Tensor& t) {
  if (t.dtype() != DType::kBool) return;
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.num_elements(); ++i) p[i] = p[i] != 0;
}

// Reads exactly n bytes at `offset` of `file` into dst; a file that ends sooner is DataLoss.
absl::Status ReadExact(const RandomAccessFile& file, char* dst, uint64_t n, uint64_t offset,
                       const std::string& path) {
  uint64_t done = 0;
  while (done < n) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n - done, uint64_t{1} << 30));
    std::string_view got;
    KILN_RETURN_IF_ERROR(file.Read(offset + done, k, &got, dst + done));
    if (!got.empty() && got.data() != dst + done) std::memcpy(dst + done, got.data(), got.size());
    done += got.size();
    if (got.size() < k) break;
  }
  if (done != n) {
    return Corrupt(path, absl::StrCat("file ended at byte ", offset + done, " while reading ", n,
                                      " bytes at offset ", offset, " (changed while reading?)"));
  }
  return absl::OkStatus();
}

struct OpenedFile {
  std::unique_ptr<RandomAccessFile> file;
  uint64_t size = 0;
};

absl::StatusOr<OpenedFile> OpenForRead(Env* env, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(bool is_dir, env->IsDirectory(path));  // NotFound names the path
  if (is_dir) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": not a regular file"));
  }
  OpenedFile f;
  KILN_ASSIGN_OR_RETURN(f.file, env->NewRandomAccessFile(path));
  KILN_ASSIGN_OR_RETURN(f.size, env->GetFileSize(path));
  return f;
}

// The header of `tensors` laid out in order; *data_size receives the data buffer's size.
absl::StatusOr<std::string> BuildHeader(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        uint64_t* data_size) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.byte_size());
    entries.push_back({name, t.dtype(), t.shape(), offset, offset + bytes});
    offset += bytes;
  }
  *data_size = offset;
  return EncodeSafetensorsHeader(entries, metadata);
}

absl::Status WriteTmp(WritableFile& file, const std::string& header,
                      const std::vector<std::pair<std::string, Tensor>>& tensors) {
  KILN_RETURN_IF_ERROR(file.Append(header));
  for (const auto& [name, t] : tensors) {
    if (t.byte_size() == 0) continue;
    KILN_RETURN_IF_ERROR(file.Append(std::string_view(static_cast<const char*>(t.raw_data()),
                                                      static_cast<size_t>(t.byte_size()))));
  }
  KILN_RETURN_IF_ERROR(file.Sync());
  return file.Close();
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    root[kMetadataKey] = std::move(m);
  }
  std::set<std::string> names;
  for (const SafetensorsEntry& t : entries) {
    if (t.name.empty()) return absl::InvalidArgumentError("safetensors: empty tensor name");
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          "safetensors: '__metadata__' is reserved, not a tensor name");
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor name '", t.name, "' given more than once"));
    }
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(SafetensorsName(t.dtype));
    e["shape"] = t.shape.dims();
    e["data_offsets"] = {t.begin, t.end};
    root[t.name] = std::move(e);
  }
  std::string json_text;
  try {
    json_text = root.dump();
  } catch (const nlohmann::json::exception& e) {
    // Only invalid UTF-8 in a name or metadata string gets here.
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: cannot encode header: ", e.what()));
  }
  if (json_text.size() > kSafetensorsMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: header of ", json_text.size(), " bytes exceeds the limit"));
  }
  json_text.append((8 - json_text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json_text.size());
  PutFixed64(&out, json_text.size());
  out += json_text;
  return out;
}

absl::StatusOr<uint64_t> DecodeSafetensorsHeaderLength(std::string_view prefix, uint64_t file_size,
                                                       const std::string& source) {
  if (prefix.size() < 8 || file_size < 8) {
    return Corrupt(source, absl::StrCat("file is ", file_size,
                                        " bytes, shorter than the 8-byte header length"));
  }
  return CheckPrefix(prefix.data(), file_size, source);
}

absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(std::string_view json_text,
                                                          uint64_t data_start, uint64_t data_size,
                                                          const std::string& source) {
  return ParseHeader(json_text, data_start, data_size, source);
}

absl::StatusOr<std::string> ReadSafetensorsPrefix(const RandomAccessFile& file, uint64_t file_size,
                                                  const std::string& source) {
  if (file_size < 8) {
    return Corrupt(source, absl::StrCat("file is ", file_size,
                                        " bytes, shorter than the 8-byte header length"));
  }
  std::string prefix(8, '\0');
  KILN_RETURN_IF_ERROR(ReadExact(file, prefix.data(), 8, 0, source));
  KILN_ASSIGN_OR_RETURN(uint64_t n, CheckPrefix(prefix.data(), file_size, source));
  prefix.resize(8 + n);
  KILN_RETURN_IF_ERROR(ReadExact(file, prefix.data() + 8, n, 8, source));
  return prefix;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const RandomAccessFile& file,
                                                        uint64_t file_size,
                                                        const std::string& source) {
  KILN_ASSIGN_OR_RETURN(std::string prefix, ReadSafetensorsPrefix(file, file_size, source));
  const uint64_t data_start = prefix.size();
  return ParseHeader(std::string_view(prefix).substr(8), data_start, file_size - data_start,
                     source);
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path, Env* env) {
  KILN_ASSIGN_OR_RETURN(OpenedFile f, OpenForRead(env != nullptr ? env : Env::Default(), path));
  return ReadSafetensorsHeader(*f.file, f.size, path);
}

absl::StatusOr<std::map<std::string, Tensor>> ReadSafetensors(
    const std::string& path, std::map<std::string, std::string>* metadata, Env* env) {
  KILN_ASSIGN_OR_RETURN(OpenedFile f, OpenForRead(env != nullptr ? env : Env::Default(), path));
  KILN_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(*f.file, f.size, path));
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : header.entries) {
    Tensor t(e.dtype, e.shape);
    if (e.end > e.begin) {
      KILN_RETURN_IF_ERROR(ReadExact(*f.file, static_cast<char*>(t.raw_data()), e.end - e.begin,
                                     header.data_start + e.begin, path));
    }
    NormalizeBool(t);
    out.emplace(e.name, std::move(t));
  }
  if (metadata != nullptr) *metadata = std::move(header.metadata);
  return out;
}

absl::StatusOr<std::map<std::string, Tensor>> ParseSafetensors(
    std::string_view bytes, std::map<std::string, std::string>* metadata,
    const std::string& source) {
  if (bytes.size() < 8) {
    return Corrupt(source, absl::StrCat("input is ", bytes.size(),
                                        " bytes, shorter than the 8-byte header length"));
  }
  KILN_ASSIGN_OR_RETURN(uint64_t n, CheckPrefix(bytes.data(), bytes.size(), source));
  KILN_ASSIGN_OR_RETURN(SafetensorsHeader header,
                        ParseHeader(bytes.substr(8, n), 8 + n, bytes.size() - 8 - n, source));
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : header.entries) {
    Tensor t(e.dtype, e.shape);
    if (e.end > e.begin) {
      std::memcpy(t.raw_data(), bytes.data() + header.data_start + e.begin, e.end - e.begin);
    }
    NormalizeBool(t);
    out.emplace(e.name, std::move(t));
  }
  if (metadata != nullptr) *metadata = std::move(header.metadata);
  return out;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata) {
  uint64_t data_size = 0;
  KILN_ASSIGN_OR_RETURN(std::string out, BuildHeader(tensors, metadata, &data_size));
  out.reserve(out.size() + data_size);
  for (const auto& [name, t] : tensors) {
    out.append(static_cast<const char*>(t.raw_data()), static_cast<size_t>(t.byte_size()));
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata, Env* env) {
  if (env == nullptr) env = Env::Default();
  uint64_t data_size = 0;
  KILN_ASSIGN_OR_RETURN(std::string header, BuildHeader(tensors, metadata, &data_size));
  const std::string tmp = path + ".tmp";
  absl::Status s;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(tmp);
    if (!file.ok()) return file.status();
    s = WriteTmp(**file, header, tensors);
  }
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    (void)env->DeleteFile(tmp);
    return s;
  }
  // Make the rename itself durable.
  return env->SyncDir(Dirname(path));
}

}  // namespace kiln
