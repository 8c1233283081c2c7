#include "kiln/train/event_writer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "kiln/base/coding.h"
#include "kiln/base/status.h"

namespace kiln::train {
namespace {

// ---- protobuf wire format (encoding) ----

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void PutTag(uint32_t field, WireType wire, std::string* out) {
  PutVarint64(out, (uint64_t{field} << 3) | wire);
}

void PutFixed64Field(uint32_t field, uint64_t bits, std::string* out) {
  PutTag(field, kFixed64, out);
  PutFixed64(out, bits);
}

void PutFixed32Field(uint32_t field, uint32_t bits, std::string* out) {
  PutTag(field, kFixed32, out);
  PutFixed32(out, bits);
}

void PutBytesField(uint32_t field, std::string_view bytes, std::string* out) {
  PutTag(field, kLengthDelimited, out);
  PutVarint64(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// Event fields 1 (wall_time) and 2 (step), which proto3 omits when zero.
void PutEventHeader(double wall_time, int64_t step, std::string* out) {
  if (DoubleBits(wall_time) != 0) PutFixed64Field(1, DoubleBits(wall_time), out);
  if (step != 0) {
    PutTag(2, kVarint, out);
    PutVarint64(out, static_cast<uint64_t>(step));
  }
}

// ---- protobuf wire format (decoding) ----

class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& source) : p_(bytes), source_(source) {}

  bool done() const { return pos_ >= p_.size(); }

  absl::Status Varint(uint64_t* v) {
    std::string_view rest = p_.substr(pos_);
    switch (ParseVarint64(&rest, v)) {
      case VarintResult::kOk:
        pos_ = p_.size() - rest.size();
        return absl::OkStatus();
      case VarintResult::kTruncated:
        pos_ = p_.size();
        return Error("varint runs past the end");
      case VarintResult::kOverflow:
        pos_ += kMaxVarint64Bytes;
        return Error("varint overflows 64 bits");
    }
    return Error("varint");
  }

  absl::Status Fixed(int n, uint64_t* v) {
    if (p_.size() - pos_ < static_cast<size_t>(n)) return Error("fixed field runs past the end");
    *v = n == 8 ? DecodeFixed64(p_.data() + pos_) : DecodeFixed32(p_.data() + pos_);
    pos_ += n;
    return absl::OkStatus();
  }

  absl::Status Bytes(std::string_view* out) {
    uint64_t n;
    KILN_RETURN_IF_ERROR(Varint(&n));
    if (n > p_.size() - pos_) return Error("length-delimited field runs past the end");
    *out = p_.substr(pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }

  absl::Status Tag(uint32_t* field, uint32_t* wire) {
    uint64_t t;
    KILN_RETURN_IF_ERROR(Varint(&t));
    *field = static_cast<uint32_t>(t >> 3);
    *wire = static_cast<uint32_t>(t & 7);
    if (*field == 0 || (t >> 3) > 0x1fffffff) return Error("bad field number");
    return absl::OkStatus();
  }

  absl::Status Skip(uint32_t wire) {
    uint64_t v = 0;
    std::string_view s;
    switch (wire) {
      case kVarint:
        return Varint(&v);
      case kFixed64:
        return Fixed(8, &v);
      case kLengthDelimited:
        return Bytes(&s);
      case kFixed32:
        return Fixed(4, &v);
      default:
        return Error("unsupported wire type " + std::to_string(wire));
    }
  }

  absl::Status Expect(uint32_t field, uint32_t wire, uint32_t want) {
    if (wire == want) return absl::OkStatus();
    return Error("field " + std::to_string(field) + " has wire type " + std::to_string(wire) +
                 ", expected " + std::to_string(want));
  }

  absl::Status Error(const std::string& what) const {
    return absl::DataLossError(source_ + ": malformed protobuf at byte " + std::to_string(pos_) +
                               ": " + what);
  }

 private:
  std::string_view p_;
  size_t pos_ = 0;
  const std::string& source_;
};

absl::Status DecodeValue(std::string_view bytes, const std::string& source, Event* event) {
  WireReader r(bytes, source + " Summary.Value");
  std::string tag;
  float value = 0;
  bool has_simple = false;
  while (!r.done()) {
    uint32_t field, wire;
    KILN_RETURN_IF_ERROR(r.Tag(&field, &wire));
    if (field == 1) {
      KILN_RETURN_IF_ERROR(r.Expect(field, wire, kLengthDelimited));
      std::string_view s;
      KILN_RETURN_IF_ERROR(r.Bytes(&s));
      tag.assign(s.data(), s.size());
    } else if (field == 2) {
      KILN_RETURN_IF_ERROR(r.Expect(field, wire, kFixed32));
      uint64_t bits = 0;
      KILN_RETURN_IF_ERROR(r.Fixed(4, &bits));
      value = FloatFromBits(static_cast<uint32_t>(bits));
      has_simple = true;
    } else {
      KILN_RETURN_IF_ERROR(r.Skip(wire));  // metadata, tensor, image, ...: not ours
    }
  }
  if (has_simple) event->values.emplace_back(std::move(tag), value);
  return absl::OkStatus();
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i - 1 < n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const uint8_t cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

absl::Status CheckTag(std::string_view tag) {
  if (tag.empty()) return absl::InvalidArgumentError("TensorBoard scalar tag is empty");
  if (!IsValidUtf8(tag)) {
    return absl::InvalidArgumentError("TensorBoard scalar tag is not valid UTF-8: " +
                                      std::string(tag));
  }
  return absl::OkStatus();
}

double SystemNow() {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
  return static_cast<double>(us) / 1e6;
}

}  // namespace

// ---- encoding ----

std::string EncodeFileVersionEvent(double wall_time, std::string_view file_version) {
  std::string out;
  PutEventHeader(wall_time, 0, &out);
  PutBytesField(3, file_version, &out);  // in oneof `what`: always present
  return out;
}

std::string EncodeScalarsEvent(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& values) {
  std::string summary, value;
  for (const auto& [tag, v] : values) {
    value.clear();
    if (!tag.empty()) PutBytesField(1, tag, &value);  // Value.tag
    PutFixed32Field(2, FloatBits(v), &value);         // Value.simple_value (oneof: always)
    PutBytesField(1, value, &summary);                // Summary.value (repeated)
  }
  std::string out;
  PutEventHeader(wall_time, step, &out);
  PutBytesField(5, summary, &out);  // Event.summary
  return out;
}

std::string EncodeSessionLogEvent(double wall_time, int64_t step, SessionStatus status) {
  std::string log;
  if (status != SessionStatus::kUnspecified) {
    PutTag(1, kVarint, &log);  // SessionLog.status
    PutVarint64(&log, static_cast<uint64_t>(status));
  }
  std::string out;
  PutEventHeader(wall_time, step, &out);
  PutBytesField(7, log, &out);  // Event.session_log
  return out;
}

// ---- decoding ----

absl::StatusOr<Event> DecodeEvent(std::string_view bytes, const std::string& source) {
  Event e;
  WireReader r(bytes, source);
  while (!r.done()) {
    uint32_t field, wire;
    KILN_RETURN_IF_ERROR(r.Tag(&field, &wire));
    uint64_t v = 0;
    std::string_view s;
    switch (field) {
      case 1:  // wall_time
        KILN_RETURN_IF_ERROR(r.Expect(field, wire, kFixed64));
        KILN_RETURN_IF_ERROR(r.Fixed(8, &v));
        e.wall_time = DoubleFromBits(v);
        break;
      case 2:  // step
        KILN_RETURN_IF_ERROR(r.Expect(field, wire, kVarint));
        KILN_RETURN_IF_ERROR(r.Varint(&v));
        e.step = static_cast<int64_t>(v);
        break;
      case 3:  // file_version
        KILN_RETURN_IF_ERROR(r.Expect(field, wire, kLengthDelimited));
        KILN_RETURN_IF_ERROR(r.Bytes(&s));
        e.file_version.assign(s.data(), s.size());
        break;
      case 5: {  // summary
        KILN_RETURN_IF_ERROR(r.Expect(field, wire, kLengthDelimited));
        KILN_RETURN_IF_ERROR(r.Bytes(&s));
        e.has_summary = true;
        WireReader sr(s, source + " Summary");
        while (!sr.done()) {
          uint32_t f2, w2;
          KILN_RETURN_IF_ERROR(sr.Tag(&f2, &w2));
          if (f2 == 1) {
            KILN_RETURN_IF_ERROR(sr.Expect(f2, w2, kLengthDelimited));
            std::string_view value;
            KILN_RETURN_IF_ERROR(sr.Bytes(&value));
            KILN_RETURN_IF_ERROR(DecodeValue(value, source, &e));
          } else {
            KILN_RETURN_IF_ERROR(sr.Skip(w2));
          }
        }
        break;
      }
      case 7: {  // session_log
        KILN_RETURN_IF_ERROR(r.Expect(field, wire, kLengthDelimited));
        KILN_RETURN_IF_ERROR(r.Bytes(&s));
        e.has_session_log = true;
        WireReader lr(s, source + " SessionLog");
        while (!lr.done()) {
          uint32_t f2, w2;
          KILN_RETURN_IF_ERROR(lr.Tag(&f2, &w2));
          if (f2 == 1) {
            KILN_RETURN_IF_ERROR(lr.Expect(f2, w2, kVarint));
            KILN_RETURN_IF_ERROR(lr.Varint(&v));
            e.session_status = static_cast<SessionStatus>(static_cast<int>(v));
          } else {
            KILN_RETURN_IF_ERROR(lr.Skip(w2));
          }
        }
        break;
      }
      default:
        KILN_RETURN_IF_ERROR(r.Skip(wire));
    }
  }
  return e;
}

namespace {

absl::StatusOr<std::vector<Event>> DecodeEventFile(const std::string& path,
                                                   const std::vector<std::string>& records) {
  std::vector<Event> events;
  events.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Event e, DecodeEvent(records[i], path + " record " + std::to_string(i)));
    if (i == 0 && e.file_version.rfind("brain.Event:", 0) != 0) {
      return absl::DataLossError(path + ": first record is not a file_version event");
    }
    events.push_back(std::move(e));
  }
  return events;
}

}  // namespace

absl::StatusOr<std::vector<Event>> ReadEventFile(const std::string& path,
                                                 bool allow_truncated_tail) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> records,
                        data::ReadAllRecords(path, allow_truncated_tail));
  return DecodeEventFile(path, records);
}

absl::StatusOr<std::vector<Event>> ReadEventFile(Env* env, const std::string& path,
                                                 bool allow_truncated_tail) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> records,
                        data::ReadAllRecords(env, path, allow_truncated_tail));
  return DecodeEventFile(path, records);
}

// ---- EventWriter ----

std::string EventFileName(int64_t unix_seconds, const std::string& hostname,
                          const std::string& suffix) {
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%010lld", static_cast<long long>(unix_seconds));
  return std::string("events.out.tfevents.") + secs + "." + hostname + suffix;
}

EventWriter::EventWriter(std::unique_ptr<RecordWriter> writer, std::string path, Options options)
    : writer_(std::move(writer)), path_(std::move(path)), options_(std::move(options)) {}

EventWriter::~EventWriter() = default;

namespace {

double NowFor(const EventWriter::Options& options) {
  if (options.clock) return options.clock();
  if (options.env) return static_cast<double>(options.env->NowMicros()) / 1e6;
  return SystemNow();
}

// Creates `path`, or AlreadyExists if something is there (never overwrites another run's file).
absl::StatusOr<std::unique_ptr<AppendFile>> CreateNew(Env* env, const std::string& path) {
  return data::OpenAppendFile(env != nullptr ? env : Env::Default(), path,
                              data::WriteMode::kExclusive);
}

}  // namespace

double EventWriter::Now() const { return NowFor(options_); }

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& dir) {
  return Create(dir, Options());
}

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& dir,
                                                                 Options options) {
  if (dir.empty()) return absl::InvalidArgumentError("event file directory is empty");
  KILN_RETURN_IF_ERROR((options.env != nullptr ? options.env : Env::Default())->CreateDir(dir));
  if (options.hostname.empty()) {
    char host[256] = {0};
    if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
      std::snprintf(host, sizeof(host), "localhost");
    }
    options.hostname = host;
  }
  if (options.hostname.find('/') != std::string::npos ||
      options.suffix.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        "event file hostname/suffix must not contain '/': " + options.hostname + options.suffix);
  }
  double now = NowFor(options);
  std::string base =
      dir + "/" +
      EventFileName(static_cast<int64_t>(std::floor(now)), options.hostname, options.suffix);
  std::unique_ptr<AppendFile> file;
  std::string path;
  for (int attempt = 0;; ++attempt) {
    path = attempt == 0 ? base : base + "." + std::to_string(attempt);
    absl::StatusOr<std::unique_ptr<AppendFile>> f = CreateNew(options.env, path);
    if (f.ok()) {
      file = std::move(*f);
      break;
    }
    if (!absl::IsAlreadyExists(f.status()) || attempt >= 1000) return f.status();
  }
  auto writer = std::make_unique<RecordWriter>(std::move(file));
  KILN_RETURN_IF_ERROR(writer->Write(EncodeFileVersionEvent(now)));
  KILN_RETURN_IF_ERROR(writer->Flush());
  return std::unique_ptr<EventWriter>(
      new EventWriter(std::move(writer), std::move(path), std::move(options)));
}

absl::Status EventWriter::AddScalar(std::string_view tag, int64_t step, double value,
                                    double wall_time) {
  KILN_RETURN_IF_ERROR(CheckTag(tag));
  return writer_->Write(
      EncodeScalarsEvent(wall_time, step, {{std::string(tag), static_cast<float>(value)}}));
}

absl::Status EventWriter::AddScalar(std::string_view tag, int64_t step, double value) {
  return AddScalar(tag, step, value, Now());
}

absl::Status EventWriter::AddScalars(int64_t step,
                                     const std::vector<std::pair<std::string, double>>& values,
                                     double wall_time) {
  std::vector<std::pair<std::string, float>> fvalues;
  fvalues.reserve(values.size());
  for (const auto& [tag, v] : values) {
    KILN_RETURN_IF_ERROR(CheckTag(tag));
    fvalues.emplace_back(tag, static_cast<float>(v));
  }
  if (fvalues.empty()) return absl::OkStatus();
  return writer_->Write(EncodeScalarsEvent(wall_time, step, fvalues));
}

absl::Status EventWriter::AddScalars(int64_t step,
                                     const std::vector<std::pair<std::string, double>>& values) {
  return AddScalars(step, values, Now());
}

absl::Status EventWriter::AddSessionStart(int64_t step) {
  return writer_->Write(EncodeSessionLogEvent(Now(), step, SessionStatus::kStart));
}

absl::Status EventWriter::Flush() { return writer_->Flush(); }
absl::Status EventWriter::Sync() { return writer_->Sync(); }
absl::Status EventWriter::Close() { return writer_->Close(); }

}  // namespace kiln::train
