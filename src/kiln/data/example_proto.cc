#include "kiln/data/example_proto.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kiln/base/coding.h"
#include "kiln/base/status.h"

namespace kiln::data {
namespace {

// Wire types (protobuf encoding spec).
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Tag byte for field numbers 1..15.
void PutTag(uint32_t field, uint32_t wire_type, std::string* out) {
  out->push_back(static_cast<char>((field << 3) | wire_type));
}

size_t LengthDelimitedSize(size_t payload) { return 1 + VarintLength(payload) + payload; }

size_t ListSize(const Feature& f) {
  size_t n = 0;
  switch (f.kind) {
    case Feature::Kind::kNone:
      return 0;
    case Feature::Kind::kBytes:
      for (const std::string& s : f.bytes_list) n += LengthDelimitedSize(s.size());
      return n;
    case Feature::Kind::kFloat:
      return f.float_list.empty() ? 0 : LengthDelimitedSize(4 * f.float_list.size());
    case Feature::Kind::kInt64:
      for (int64_t v : f.int64_list) n += VarintLength(static_cast<uint64_t>(v));
      return f.int64_list.empty() ? 0 : LengthDelimitedSize(n);
  }
  return 0;
}

size_t FeatureSize(const Feature& f) {
  return f.kind == Feature::Kind::kNone ? 0 : LengthDelimitedSize(ListSize(f));
}

size_t EntrySize(const std::string& key, const Feature& f) {
  return LengthDelimitedSize(key.size()) + LengthDelimitedSize(FeatureSize(f));
}

void PutFeature(const Feature& f, std::string* out) {
  if (f.kind == Feature::Kind::kNone) return;
  PutTag(static_cast<uint32_t>(f.kind), kLengthDelimited, out);  // kBytes=1, kFloat=2, kInt64=3
  PutVarint64(out, ListSize(f));
  switch (f.kind) {
    case Feature::Kind::kNone:
      break;
    case Feature::Kind::kBytes:
      for (const std::string& s : f.bytes_list) {
        PutTag(1, kLengthDelimited, out);
        PutVarint64(out, s.size());
        out->append(s);
      }
      break;
    case Feature::Kind::kFloat:
      if (f.float_list.empty()) break;
      PutTag(1, kLengthDelimited, out);
      PutVarint64(out, 4 * f.float_list.size());
      for (float v : f.float_list) PutFloat32(out, v);
      break;
    case Feature::Kind::kInt64: {
      if (f.int64_list.empty()) break;
      size_t payload = 0;
      for (int64_t v : f.int64_list) payload += VarintLength(static_cast<uint64_t>(v));
      PutTag(1, kLengthDelimited, out);
      PutVarint64(out, payload);
      for (int64_t v : f.int64_list) PutVarint64(out, static_cast<uint64_t>(v));
      break;
    }
  }
}

// A cursor over one message's bytes; `base` is the message's offset in the whole Example, so
// errors name absolute byte offsets.
class Reader {
 public:
  Reader(std::string_view bytes, size_t base) : bytes_(bytes), base_(base) {}
  bool done() const { return pos_ >= bytes_.size(); }
  size_t offset() const { return base_ + pos_; }

  absl::Status Error(const std::string& what, size_t at) const {
    return absl::DataLossError(absl::StrCat("tf.train.Example: ", what, " at byte ", at));
  }

  absl::StatusOr<uint64_t> Varint() {
    const size_t start = offset();
    std::string_view rest = bytes_.substr(pos_);
    uint64_t v = 0;
    switch (ParseVarint64(&rest, &v)) {
      case VarintResult::kOk:
        pos_ = bytes_.size() - rest.size();
        return v;
      case VarintResult::kTruncated:
        return Error("truncated varint", start);
      case VarintResult::kOverflow:
        return Error("varint longer than 64 bits", start);
    }
    return Error("varint", start);
  }

  // Reads a tag; returns {field, wire_type}.
  absl::StatusOr<std::pair<uint32_t, uint32_t>> Tag() {
    const size_t start = offset();
    KILN_ASSIGN_OR_RETURN(uint64_t tag, Varint());
    const uint64_t field = tag >> 3;
    const uint32_t wire = static_cast<uint32_t>(tag & 7);
    if (field == 0 || field > 0x1fffffff) return Error("invalid field number", start);
    if (wire != kVarint && wire != kFixed64 && wire != kLengthDelimited && wire != kFixed32) {
      return Error(absl::StrCat("unsupported wire type ", wire), start);
    }
    return std::make_pair(static_cast<uint32_t>(field), wire);
  }

  // A length-delimited payload; *at receives its absolute offset.
  absl::StatusOr<std::string_view> Bytes(size_t* at) {
    const size_t start = offset();
    KILN_ASSIGN_OR_RETURN(uint64_t len, Varint());
    if (len > bytes_.size() - pos_) return Error("length-delimited field past its end", start);
    *at = offset();
    std::string_view v = bytes_.substr(pos_, len);
    pos_ += len;
    return v;
  }

  absl::StatusOr<uint32_t> Fixed32() {
    if (bytes_.size() - pos_ < 4) return Error("truncated fixed32", offset());
    const uint32_t v = DecodeFixed32(bytes_.data() + pos_);
    pos_ += 4;
    return v;
  }

  absl::Status Skip(uint32_t wire) {
    size_t at;
    switch (wire) {
      case kVarint:
        return Varint().status();
      case kFixed64:
        if (bytes_.size() - pos_ < 8) return Error("truncated fixed64", offset());
        pos_ += 8;
        return absl::OkStatus();
      case kLengthDelimited:
        return Bytes(&at).status();
      case kFixed32:
        return Fixed32().status();
    }
    return Error("unsupported wire type", offset());
  }

 private:
  std::string_view bytes_;
  size_t base_;
  size_t pos_ = 0;
};

absl::Status DecodeList(std::string_view bytes, size_t base, Feature::Kind kind, Feature* f) {
  Reader r(bytes, base);
  while (!r.done()) {
    const size_t tag_at = r.offset();
    KILN_ASSIGN_OR_RETURN(auto tag, r.Tag());
    if (tag.first != 1) {
      KILN_RETURN_IF_ERROR(r.Skip(tag.second));
      continue;
    }
    size_t at = 0;
    if (kind == Feature::Kind::kBytes) {
      if (tag.second != kLengthDelimited) return r.Error("bytes_list value not bytes", tag_at);
      KILN_ASSIGN_OR_RETURN(std::string_view v, r.Bytes(&at));
      f->bytes_list.emplace_back(v);
    } else if (kind == Feature::Kind::kFloat) {
      if (tag.second == kFixed32) {
        KILN_ASSIGN_OR_RETURN(uint32_t bits, r.Fixed32());
        f->float_list.push_back(FloatFromBits(bits));
      } else if (tag.second == kLengthDelimited) {
        KILN_ASSIGN_OR_RETURN(std::string_view v, r.Bytes(&at));
        if (v.size() % 4 != 0) return r.Error("packed float_list not a multiple of 4 bytes", at);
        Reader p(v, at);
        f->float_list.reserve(f->float_list.size() + v.size() / 4);
        while (!p.done()) {
          KILN_ASSIGN_OR_RETURN(uint32_t bits, p.Fixed32());
          f->float_list.push_back(FloatFromBits(bits));
        }
      } else {
        return r.Error("float_list value of the wrong wire type", tag_at);
      }
    } else {
      if (tag.second == kVarint) {
        KILN_ASSIGN_OR_RETURN(uint64_t v, r.Varint());
        f->int64_list.push_back(static_cast<int64_t>(v));
      } else if (tag.second == kLengthDelimited) {
        KILN_ASSIGN_OR_RETURN(std::string_view v, r.Bytes(&at));
        Reader p(v, at);
        while (!p.done()) {
          KILN_ASSIGN_OR_RETURN(uint64_t x, p.Varint());
          f->int64_list.push_back(static_cast<int64_t>(x));
        }
      } else {
        return r.Error("int64_list value of the wrong wire type", tag_at);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeFeature(std::string_view bytes, size_t base, Feature* f) {
  Reader r(bytes, base);
  while (!r.done()) {
    const size_t tag_at = r.offset();
    KILN_ASSIGN_OR_RETURN(auto tag, r.Tag());
    if (tag.first < 1 || tag.first > 3) {
      KILN_RETURN_IF_ERROR(r.Skip(tag.second));
      continue;
    }
    if (tag.second != kLengthDelimited) return r.Error("feature list not length-delimited", tag_at);
    size_t at = 0;
    KILN_ASSIGN_OR_RETURN(std::string_view v, r.Bytes(&at));
    const auto kind = static_cast<Feature::Kind>(tag.first);
    if (f->kind != kind) {  // another oneof member replaces this one
      *f = Feature();
      f->kind = kind;
    }
    KILN_RETURN_IF_ERROR(DecodeList(v, at, kind, f));
  }
  return absl::OkStatus();
}

absl::Status DecodeEntry(std::string_view bytes, size_t base, Example* ex) {
  Reader r(bytes, base);
  std::string key;
  Feature value;
  while (!r.done()) {
    const size_t tag_at = r.offset();
    KILN_ASSIGN_OR_RETURN(auto tag, r.Tag());
    if (tag.first != 1 && tag.first != 2) {
      KILN_RETURN_IF_ERROR(r.Skip(tag.second));
      continue;
    }
    if (tag.second != kLengthDelimited)
      return r.Error("map entry field not length-delimited", tag_at);
    size_t at = 0;
    KILN_ASSIGN_OR_RETURN(std::string_view v, r.Bytes(&at));
    if (tag.first == 1) {
      key.assign(v);
    } else {
      KILN_RETURN_IF_ERROR(DecodeFeature(v, at, &value));
    }
  }
  ex->features[key] = std::move(value);
  return absl::OkStatus();
}

absl::Status DecodeFeatures(std::string_view bytes, size_t base, Example* ex) {
  Reader r(bytes, base);
  while (!r.done()) {
    const size_t tag_at = r.offset();
    KILN_ASSIGN_OR_RETURN(auto tag, r.Tag());
    if (tag.first != 1) {
      KILN_RETURN_IF_ERROR(r.Skip(tag.second));
      continue;
    }
    if (tag.second != kLengthDelimited)
      return r.Error("feature map entry not length-delimited", tag_at);
    size_t at = 0;
    KILN_ASSIGN_OR_RETURN(std::string_view v, r.Bytes(&at));
    KILN_RETURN_IF_ERROR(DecodeEntry(v, at, ex));
  }
  return absl::OkStatus();
}

}  // namespace

Feature Feature::Bytes(std::vector<std::string> v) {
  Feature f;
  f.kind = Kind::kBytes;
  f.bytes_list = std::move(v);
  return f;
}
Feature Feature::Floats(std::vector<float> v) {
  Feature f;
  f.kind = Kind::kFloat;
  f.float_list = std::move(v);
  return f;
}
Feature Feature::Int64s(std::vector<int64_t> v) {
  Feature f;
  f.kind = Kind::kInt64;
  f.int64_list = std::move(v);
  return f;
}

bool Feature::operator==(const Feature& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::kNone:
      return true;
    case Kind::kBytes:
      return bytes_list == o.bytes_list;
    case Kind::kFloat:  // bitwise, so NaNs compare equal to themselves
      return float_list.size() == o.float_list.size() &&
             (float_list.empty() ||
              std::memcmp(float_list.data(), o.float_list.data(), 4 * float_list.size()) == 0);
    case Kind::kInt64:
      return int64_list == o.int64_list;
  }
  return false;
}

const char* FeatureKindName(Feature::Kind kind) {
  switch (kind) {
    case Feature::Kind::kNone:
      return "none";
    case Feature::Kind::kBytes:
      return "bytes";
    case Feature::Kind::kFloat:
      return "float";
    case Feature::Kind::kInt64:
      return "int64";
  }
  return "?";
}

void EncodeExampleTo(const Example& example, std::string* out) {
  size_t features_size = 0;
  for (const auto& [key, f] : example.features) {
    features_size += LengthDelimitedSize(EntrySize(key, f));
  }
  out->reserve(out->size() + LengthDelimitedSize(features_size));
  PutTag(1, kLengthDelimited, out);  // Example.features
  PutVarint64(out, features_size);
  for (const auto& [key, f] : example.features) {
    PutTag(1, kLengthDelimited, out);  // Features.feature (a map entry)
    PutVarint64(out, EntrySize(key, f));
    PutTag(1, kLengthDelimited, out);  // entry key
    PutVarint64(out, key.size());
    out->append(key);
    PutTag(2, kLengthDelimited, out);  // entry value
    PutVarint64(out, FeatureSize(f));
    PutFeature(f, out);
  }
}

std::string EncodeExample(const Example& example) {
  std::string out;
  EncodeExampleTo(example, &out);
  return out;
}

absl::StatusOr<Example> DecodeExample(std::string_view bytes) {
  Example ex;
  Reader r(bytes, 0);
  while (!r.done()) {
    const size_t tag_at = r.offset();
    KILN_ASSIGN_OR_RETURN(auto tag, r.Tag());
    if (tag.first != 1) {
      KILN_RETURN_IF_ERROR(r.Skip(tag.second));
      continue;
    }
    if (tag.second != kLengthDelimited) return r.Error("features not length-delimited", tag_at);
    size_t at = 0;
    KILN_ASSIGN_OR_RETURN(std::string_view v, r.Bytes(&at));
    KILN_RETURN_IF_ERROR(DecodeFeatures(v, at, &ex));  // a repeated message field merges
  }
  return ex;
}

}  // namespace kiln::data
