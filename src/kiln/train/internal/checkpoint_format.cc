#include "kiln/train/internal/checkpoint_format.h"

#include <limits>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::train::internal {
namespace {

using ojson = nlohmann::ordered_json;

absl::Status Corrupt(const std::string& source, const std::string& what) {
  return absl::DataLossError(absl::StrCat(source, ": ", what));
}

std::string Hex(uint32_t v) { return absl::StrFormat("0x%08x", v); }

// A JSON integer in [0, max], or nullopt.
std::optional<uint64_t> AsUint(const nlohmann::json* j, uint64_t max) {
  if (j == nullptr) return std::nullopt;
  if (j->is_number_unsigned()) {
    uint64_t u = j->get<uint64_t>();
    if (u <= max) return u;
  } else if (j->is_number_integer()) {
    int64_t v = j->get<int64_t>();
    if (v >= 0 && static_cast<uint64_t>(v) <= max) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

const nlohmann::json* Field(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

constexpr uint64_t kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Product of dims times element size, or nullopt on overflow.
std::optional<uint64_t> ByteSize(const Shape& shape, DType dtype) {
  uint64_t n = static_cast<uint64_t>(DTypeSize(dtype));
  for (int64_t d : shape.dims()) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n > kMaxI64) {
      return std::nullopt;
    }
  }
  return n;
}

absl::StatusOr<Shape> ParseShape(const nlohmann::json* j, const std::string& source,
                                 const std::string& where) {
  if (j == nullptr || !j->is_array()) return Corrupt(source, where + ": \"shape\" is not an array");
  std::vector<int64_t> dims;
  for (const nlohmann::json& d : *j) {
    std::optional<uint64_t> v = AsUint(&d, kMaxI64);
    if (!v) return Corrupt(source, where + ": \"shape\" holds a non-integer or negative value");
    dims.push_back(static_cast<int64_t>(*v));
  }
  return Shape(std::move(dims));
}

absl::StatusOr<DType> ParseDType(const nlohmann::json* j, const std::string& source,
                                 const std::string& where) {
  if (j == nullptr || !j->is_string()) return Corrupt(source, where + ": \"dtype\" is missing");
  std::optional<DType> t = DTypeFromSafetensorsName(j->get<std::string>());
  if (!t) return Corrupt(source, where + ": unknown dtype '" + j->get<std::string>() + "'");
  return *t;
}

bool IsPlainFileName(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

// The trailer: "manifest_crc32c" is the CRC32C of every byte before kManifestCrcMarker.
absl::Status CheckManifestCrc(std::string_view bytes, const std::string& source) {
  const std::string_view marker(kManifestCrcMarker);
  const size_t pos = bytes.rfind(marker);
  if (pos == std::string_view::npos) {
    return Corrupt(source, "no \"manifest_crc32c\" at the end (truncated, or not a manifest)");
  }
  std::string_view tail = bytes.substr(pos + marker.size());
  uint64_t stored = 0;
  size_t digits = 0;
  while (digits < tail.size() && digits < 10 && tail[digits] >= '0' && tail[digits] <= '9') {
    stored = stored * 10 + static_cast<uint64_t>(tail[digits] - '0');
    ++digits;
  }
  if (digits == 0 || tail.substr(digits) != "\n}\n" || stored > 0xffffffffu) {
    return Corrupt(source, "malformed \"manifest_crc32c\" trailer");
  }
  const uint32_t computed = crc32c::Value(bytes.data(), pos);
  if (computed != stored) {
    return Corrupt(source, absl::StrCat("CRC32C mismatch (stored ", Hex(stored), ", computed ",
                                        Hex(computed), ")"));
  }
  return absl::OkStatus();
}

// "format", "format_version", "step", "created_micros", "ranks".
absl::Status DecodeManifestHeader(const nlohmann::json& j, const std::string& source, Manifest* m) {
  const nlohmann::json* f = Field(j, "format");
  if (f == nullptr || !f->is_string() || f->get<std::string>() != kManifestFormat) {
    return Corrupt(source, absl::StrCat("\"format\" is not \"", kManifestFormat, "\""));
  }
  std::optional<uint64_t> version = AsUint(Field(j, "format_version"), 1u << 30);
  if (!version || *version == 0) return Corrupt(source, "bad \"format_version\"");
  if (*version > 2) {
    return absl::FailedPreconditionError(
        absl::StrCat(source, ": checkpoint format version ", *version,
                     " is newer than this build reads (2); upgrade Kiln"));
  }
  m->format_version = static_cast<int>(*version);
  std::optional<uint64_t> step = AsUint(Field(j, "step"), kMaxI64);
  if (!step) return Corrupt(source, "bad \"step\"");
  m->step = static_cast<int64_t>(*step);
  m->created_micros = AsUint(Field(j, "created_micros"), ~uint64_t{0}).value_or(0);
  m->ranks = static_cast<int>(AsUint(Field(j, "ranks"), 1u << 20).value_or(0));
  return absl::OkStatus();
}

absl::Status DecodeManifestShards(const nlohmann::json& j, const std::string& source, Manifest* m) {
  const nlohmann::json* shards = Field(j, "shards");
  if (shards == nullptr || !shards->is_array()) return Corrupt(source, "\"shards\" is missing");
  std::set<std::string> files;
  for (size_t i = 0; i < shards->size(); ++i) {
    const nlohmann::json& s = (*shards)[i];
    const std::string where = absl::StrCat("shard #", i);
    if (!s.is_object()) return Corrupt(source, where + " is not an object");
    ManifestShard out;
    const nlohmann::json* file = Field(s, "file");
    if (file == nullptr || !file->is_string() || !IsPlainFileName(file->get<std::string>())) {
      return Corrupt(source, where + ": bad \"file\"");
    }
    out.file = file->get<std::string>();
    if (!files.insert(out.file).second) {
      return Corrupt(source, where + ": file '" + out.file + "' listed twice");
    }
    std::optional<uint64_t> size = AsUint(Field(s, "bytes"), kMaxI64);
    std::optional<uint64_t> crc = AsUint(Field(s, "crc32c"), 0xffffffffu);
    if (!size || !crc) return Corrupt(source, where + ": bad \"bytes\" or \"crc32c\"");
    out.bytes = *size;
    out.crc32c = static_cast<uint32_t>(*crc);
    m->shards.push_back(std::move(out));
  }
  return absl::OkStatus();
}

// What the tensors decoded so far claim, to catch duplicates and disagreeing pieces.
struct TensorNames {
  std::set<std::string> names;                        // whole tensors
  std::map<std::string, Shape> pieces;                // pieces' names -> their whole shape
  std::set<std::pair<std::string, uint64_t>> placed;  // (piece name, shard)
};

// A piece's "global_shape" and its "flat" or "slice" (format version 2).
absl::Status DecodePiece(const nlohmann::json& t, uint64_t shard, const std::string& where,
                         const std::string& source, TensorNames* seen, ManifestTensor* out) {
  KILN_ASSIGN_OR_RETURN(out->global_shape,
                        ParseShape(Field(t, "global_shape"), source, where + " global"));
  auto [it, fresh] = seen->pieces.emplace(out->name, out->global_shape);
  if (seen->names.count(out->name) > 0 ||
      (!fresh && it->second.dims() != out->global_shape.dims())) {
    return Corrupt(source, where + ": pieces disagree on the whole tensor's shape");
  }
  if (!seen->placed.insert({out->name, shard}).second) {
    return Corrupt(source, where + ": two pieces in one shard file");
  }
  const nlohmann::json* flat = Field(t, "flat");
  const nlohmann::json* box = Field(t, "slice");
  if ((flat == nullptr) == (box == nullptr)) {
    return Corrupt(source, where + ": a piece needs exactly one of \"flat\" and \"slice\"");
  }
  if (flat != nullptr) {
    std::optional<uint64_t> b, e;
    if (flat->is_array() && flat->size() == 2) {
      b = AsUint(&(*flat)[0], kMaxI64);
      e = AsUint(&(*flat)[1], kMaxI64);
    }
    if (!b || !e) return Corrupt(source, where + ": bad \"flat\"");
    out->slice = TensorSlice::Flat(static_cast<int64_t>(*b), static_cast<int64_t>(*e));
  } else {
    if (!box->is_object()) return Corrupt(source, where + ": bad \"slice\"");
    KILN_ASSIGN_OR_RETURN(Shape offs, ParseShape(Field(*box, "offsets"), source, where));
    KILN_ASSIGN_OR_RETURN(Shape sizes, ParseShape(Field(*box, "sizes"), source, where));
    out->slice = TensorSlice::Box(offs.dims(), sizes.dims());
  }
  absl::Status ok = out->slice.Check(out->global_shape);
  if (!ok.ok()) return Corrupt(source, where + ": " + std::string(ok.message()));
  return absl::OkStatus();
}

// Tensor #i of "tensors", checked against the shards already decoded into `m`.
absl::StatusOr<ManifestTensor> DecodeManifestTensor(const nlohmann::json& t, size_t i,
                                                    const Manifest& m, const std::string& source,
                                                    TensorNames* seen) {
  std::string where = absl::StrCat("tensor #", i);
  if (!t.is_object()) return Corrupt(source, where + " is not an object");
  ManifestTensor out;
  const nlohmann::json* name = Field(t, "name");
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
    return Corrupt(source, where + ": bad \"name\"");
  }
  out.name = name->get<std::string>();
  where = "tensor '" + out.name + "'";
  out.piece = Field(t, "global_shape") != nullptr;
  if (out.piece && m.format_version < 2) {
    return Corrupt(source, where + ": a piece (\"global_shape\") in a version 1 manifest");
  }
  std::optional<uint64_t> shard = AsUint(Field(t, "shard"), m.shards.size());
  if (!shard || *shard >= m.shards.size()) return Corrupt(source, where + ": bad \"shard\"");
  if (!out.piece) {
    if (!seen->names.insert(out.name).second || seen->pieces.count(out.name) > 0) {
      return Corrupt(source, where + " is listed twice");
    }
  } else {
    KILN_RETURN_IF_ERROR(DecodePiece(t, *shard, where, source, seen, &out));
  }
  out.shard = static_cast<int>(*shard);
  KILN_ASSIGN_OR_RETURN(out.dtype, ParseDType(Field(t, "dtype"), source, where));
  KILN_ASSIGN_OR_RETURN(out.shape, ParseShape(Field(t, "shape"), source, where));
  std::optional<uint64_t> offset = AsUint(Field(t, "offset"), kMaxI64);
  std::optional<uint64_t> size = AsUint(Field(t, "bytes"), kMaxI64);
  std::optional<uint64_t> crc = AsUint(Field(t, "crc32c"), 0xffffffffu);
  if (!offset || !size || !crc) {
    return Corrupt(source, where + ": bad \"offset\", \"bytes\" or \"crc32c\"");
  }
  if (out.piece && out.shape.dims() != out.slice.PieceShape().dims()) {
    return Corrupt(source, where + ": \"shape\" is not the shape of its slice");
  }
  std::optional<uint64_t> expect = ByteSize(out.shape, out.dtype);
  if (!expect || *expect != *size) {
    return Corrupt(source, where + ": \"bytes\" does not match its dtype and shape");
  }
  out.offset = *offset;
  out.bytes = *size;
  out.crc32c = static_cast<uint32_t>(*crc);
  if (out.offset > m.shards[out.shard].bytes ||
      out.bytes > m.shards[out.shard].bytes - out.offset) {
    return Corrupt(source, where + ": lies outside its shard");
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> EncodeManifest(const Manifest& m) {
  // One member per line, one shard or tensor per line: readable, and diffable, for models with
  // thousands of tensors.
  auto array = [](const std::vector<ojson>& items) {
    if (items.empty()) return std::string("[]");
    std::string out = "[\n";
    for (size_t i = 0; i < items.size(); ++i) {
      absl::StrAppend(&out, "    ", items[i].dump(), i + 1 < items.size() ? ",\n" : "\n");
    }
    return out + "  ]";
  };
  std::string text;
  try {
    std::vector<ojson> shards;
    for (const ManifestShard& s : m.shards) {
      ojson o = ojson::object();
      o["file"] = s.file;
      o["bytes"] = s.bytes;
      o["crc32c"] = s.crc32c;
      shards.push_back(std::move(o));
    }
    std::vector<ojson> tensors;
    for (const ManifestTensor& t : m.tensors) {
      ojson o = ojson::object();
      o["name"] = t.name;
      o["shard"] = t.shard;
      o["dtype"] = std::string(SafetensorsName(t.dtype));
      o["shape"] = t.shape.dims();
      o["offset"] = t.offset;
      o["bytes"] = t.bytes;
      o["crc32c"] = t.crc32c;
      if (t.piece) {
        o["global_shape"] = t.global_shape.dims();
        if (t.slice.flat) {
          o["flat"] = {t.slice.begin, t.slice.end};
        } else {
          o["slice"] = {{"offsets", t.slice.offsets}, {"sizes", t.slice.sizes}};
        }
      }
      tensors.push_back(std::move(o));
    }
    absl::StrAppend(&text, "{\n  \"format\": ", ojson(kManifestFormat).dump(),
                    ",\n  \"format_version\": ", m.format_version, ",\n  \"step\": ", m.step,
                    ",\n  \"created_micros\": ", m.created_micros,
                    m.ranks > 0 ? absl::StrCat(",\n  \"ranks\": ", m.ranks) : std::string(),
                    ",\n  \"shards\": ", array(shards), ",\n  \"tensors\": ", array(tensors),
                    ",\n  \"metadata\": ", m.metadata.dump());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint manifest: ", e.what()));
  }
  const uint32_t crc = crc32c::Value(text.data(), text.size());
  absl::StrAppend(&text, kManifestCrcMarker, crc, "\n}\n");
  return text;
}

absl::StatusOr<Manifest> DecodeManifest(std::string_view bytes, const std::string& source) {
  KILN_RETURN_IF_ERROR(CheckManifestCrc(bytes, source));
  nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Corrupt(source, "not a JSON object");

  Manifest m;
  KILN_RETURN_IF_ERROR(DecodeManifestHeader(j, source, &m));
  KILN_RETURN_IF_ERROR(DecodeManifestShards(j, source, &m));
  const nlohmann::json* tensors = Field(j, "tensors");
  if (tensors == nullptr || !tensors->is_array()) return Corrupt(source, "\"tensors\" is missing");
  TensorNames seen;
  for (size_t i = 0; i < tensors->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(ManifestTensor t,
                          DecodeManifestTensor((*tensors)[i], i, m, source, &seen));
    m.tensors.push_back(std::move(t));
  }
  const nlohmann::json* meta = Field(j, "metadata");
  m.metadata = meta == nullptr ? nlohmann::json::object() : *meta;
  return m;
}

absl::StatusOr<std::string> BuildShardHeader(const std::vector<ShardEntry>& entries,
                                             const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> st;
  st.reserve(entries.size());
  uint64_t offset = 0;
  for (const ShardEntry& e : entries) {
    st.push_back({e.name, e.dtype, e.shape, offset, offset + e.bytes});
    offset += e.bytes;
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(st, metadata);
  if (!header.ok()) return Annotate(header.status(), "checkpoint shard header");
  return header;
}

absl::Status CheckShardHeader(std::string_view header_json, uint64_t data_start, uint64_t data_size,
                              const std::vector<const ManifestTensor*>& tensors,
                              const std::string& source) {
  // The safetensors checks first (valid JSON, known dtypes, tensors tiling the data buffer),
  // then agreement with the manifest, entry by entry.
  KILN_ASSIGN_OR_RETURN(SafetensorsHeader h,
                        DecodeSafetensorsHeader(header_json, data_start, data_size, source));
  if (h.entries.size() != tensors.size()) {
    return Corrupt(source, absl::StrCat("safetensors header lists ", h.entries.size(),
                                        " tensors, the manifest ", tensors.size()));
  }
  std::map<std::string_view, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& e : h.entries) by_name.emplace(e.name, &e);
  for (const ManifestTensor* t : tensors) {
    const std::string where = "tensor '" + t->name + "'";
    auto it = by_name.find(t->name);
    if (it == by_name.end()) {
      return Corrupt(source, where + " is missing from the safetensors header");
    }
    const SafetensorsEntry& e = *it->second;
    if (e.dtype != t->dtype || e.shape.dims() != t->shape.dims() ||
        data_start + e.begin != t->offset || e.end - e.begin != t->bytes) {
      return Corrupt(source, where + ": safetensors header disagrees with the manifest");
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::train::internal
