#include "kiln/tensor/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
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

absl::Status IoError(int err, const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

uint64_t DecodeU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void EncodeU64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Checks the 8-byte prefix against the total size; returns the header length.
absl::StatusOr<uint64_t> CheckPrefix(const char* prefix, uint64_t total_size,
                                     const std::string& source) {
  uint64_t n = DecodeU64(prefix);
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

// RAII file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

// Reads exactly n bytes at offset; a short read is reported through *got.
absl::Status PreadFully(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path,
                        uint64_t* got) {
  uint8_t* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, p + done, std::min<uint64_t>(n - done, 1u << 30),
                        static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "cannot read", path);
    }
    if (r == 0) break;
    done += static_cast<uint64_t>(r);
  }
  *got = done;
  return absl::OkStatus();
}

absl::Status ReadExact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  uint64_t got = 0;
  KILN_RETURN_IF_ERROR(PreadFully(fd, dst, n, offset, path, &got));
  if (got != n) {
    return Corrupt(path, absl::StrCat("file ended at byte ", offset + got, " while reading ", n,
                                      " bytes at offset ", offset, " (changed while reading?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsHeader> ReadHeaderFromFd(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return Corrupt(path,
                   absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  char prefix[8];
  KILN_RETURN_IF_ERROR(ReadExact(fd, prefix, 8, 0, path));
  KILN_ASSIGN_OR_RETURN(uint64_t n, CheckPrefix(prefix, size, path));
  std::string json_text(n, '\0');
  KILN_RETURN_IF_ERROR(ReadExact(fd, json_text.data(), n, 8, path));
  return ParseHeader(json_text, 8 + n, size - 8 - n, path);
}

absl::StatusOr<int> OpenForRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(errno, "cannot open safetensors file", path);
  return fd;
}

// Serialized header: 8-byte length, JSON, space padding to a multiple of 8. Validates the request.
absl::StatusOr<std::string> BuildHeader(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        uint64_t* data_size) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    root[kMetadataKey] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) return absl::InvalidArgumentError("safetensors: empty tensor name");
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          "safetensors: '__metadata__' is reserved, not a tensor name");
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor name '", name, "' given more than once"));
    }
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(SafetensorsName(t.dtype()));
    e["shape"] = t.shape().dims();
    const uint64_t bytes = static_cast<uint64_t>(t.byte_size());
    e["data_offsets"] = {offset, offset + bytes};
    offset += bytes;
    root[name] = std::move(e);
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
  std::string out(8, '\0');
  EncodeU64(json_text.size(), out.data());
  out += json_text;
  *data_size = offset;
  return out;
}

absl::Status WriteAll(int fd, const void* data, uint64_t n, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<uint64_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "cannot write", path);
    }
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status WriteTmp(int fd, const std::string& tmp, const std::string& header,
                      const std::vector<std::pair<std::string, Tensor>>& tensors) {
  KILN_RETURN_IF_ERROR(WriteAll(fd, header.data(), header.size(), tmp));
  for (const auto& [name, t] : tensors) {
    KILN_RETURN_IF_ERROR(WriteAll(fd, t.raw_data(), static_cast<uint64_t>(t.byte_size()), tmp));
  }
  if (::fsync(fd) != 0) return IoError(errno, "cannot fsync", tmp);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(int raw_fd, OpenForRead(path));
  Fd fd(raw_fd);
  return ReadHeaderFromFd(fd.get(), path);
}

absl::StatusOr<std::map<std::string, Tensor>> ReadSafetensors(
    const std::string& path, std::map<std::string, std::string>* metadata) {
  KILN_ASSIGN_OR_RETURN(int raw_fd, OpenForRead(path));
  Fd fd(raw_fd);
  KILN_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadHeaderFromFd(fd.get(), path));
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : header.entries) {
    Tensor t(e.dtype, e.shape);
    KILN_RETURN_IF_ERROR(
        ReadExact(fd.get(), t.raw_data(), e.end - e.begin, header.data_start + e.begin, path));
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
                              const std::map<std::string, std::string>& metadata) {
  uint64_t data_size = 0;
  KILN_ASSIGN_OR_RETURN(std::string header, BuildHeader(tensors, metadata, &data_size));
  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return IoError(errno, "cannot create", tmp);
  absl::Status s = WriteTmp(fd.get(), tmp, header, tensors);
  if (s.ok() && ::close(fd.release()) != 0) s = IoError(errno, "cannot close", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = IoError(errno, "cannot rename " + tmp + " to", path);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // Make the rename itself durable.
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0 && ::fsync(dfd.get()) != 0)
    return IoError(errno, "cannot fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace kiln
