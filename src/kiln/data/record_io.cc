#include "kiln/data/record_io.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/coding.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"

namespace kiln::data {
namespace {

// ---- in-memory files ----

class StringAppendFile final : public AppendFile {
 public:
  StringAppendFile(std::string* out, std::string name) : out_(out), name_(std::move(name)) {}
  absl::Status Append(std::string_view data) override {
    out_->append(data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status Flush() override { return absl::OkStatus(); }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }
  const std::string& name() const override { return name_; }

 private:
  std::string* out_;
  std::string name_;
};

class StringReadFile final : public ReadFile {
 public:
  StringReadFile(const std::string* bytes, std::string name)
      : bytes_(bytes), name_(std::move(name)) {}
  absl::StatusOr<size_t> ReadAt(uint64_t offset, size_t n, char* dst) override {
    if (offset >= bytes_->size()) return size_t{0};
    size_t k = std::min<uint64_t>(n, bytes_->size() - offset);
    std::memcpy(dst, bytes_->data() + offset, k);
    return k;
  }
  absl::StatusOr<uint64_t> Size() override { return static_cast<uint64_t>(bytes_->size()); }
  const std::string& name() const override { return name_; }

 private:
  const std::string* bytes_;
  std::string name_;
};

// ---- Env adapters ----

class EnvAppendFile final : public AppendFile {
 public:
  EnvAppendFile(std::unique_ptr<WritableFile> file, std::string name)
      : file_(std::move(file)), name_(std::move(name)) {}
  absl::Status Append(std::string_view data) override { return file_->Append(data); }
  absl::Status Flush() override { return file_->Flush(); }
  absl::Status Sync() override { return file_->Sync(); }
  absl::Status Close() override {
    if (closed_) return absl::OkStatus();
    closed_ = true;
    return file_->Close();
  }
  const std::string& name() const override { return name_; }

 private:
  std::unique_ptr<WritableFile> file_;
  std::string name_;
  bool closed_ = false;
};

class EnvReadFile final : public ReadFile {
 public:
  EnvReadFile(Env* env, std::unique_ptr<RandomAccessFile> file, std::string path)
      : env_(env), file_(std::move(file)), path_(std::move(path)) {}
  absl::StatusOr<size_t> ReadAt(uint64_t offset, size_t n, char* dst) override {
    size_t done = 0;
    while (done < n) {
      std::string_view got;
      KILN_RETURN_IF_ERROR(file_->Read(offset + done, n - done, &got, dst + done));
      if (got.empty()) break;
      if (got.data() != dst + done) std::memmove(dst + done, got.data(), got.size());
      done += got.size();
    }
    return done;
  }
  absl::StatusOr<uint64_t> Size() override { return env_->GetFileSize(path_); }
  const std::string& name() const override { return path_; }

 private:
  Env* env_;
  std::unique_ptr<RandomAccessFile> file_;
  std::string path_;
};

}  // namespace

std::unique_ptr<AppendFile> AdaptWritableFile(std::unique_ptr<WritableFile> file,
                                              std::string name) {
  return std::make_unique<EnvAppendFile>(std::move(file), std::move(name));
}

absl::StatusOr<std::unique_ptr<ReadFile>> OpenEnvReadFile(Env* env, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  return std::unique_ptr<ReadFile>(new EnvReadFile(env, std::move(file), path));
}

absl::StatusOr<std::unique_ptr<AppendFile>> OpenAppendFile(Env* env, const std::string& path,
                                                           WriteMode mode) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      mode == WriteMode::kAppend      ? env->NewAppendableFile(path)
      : mode == WriteMode::kExclusive ? env->NewExclusiveFile(path)
                                      : env->NewWritableFile(path);
  KILN_RETURN_IF_ERROR(file.status());
  return AdaptWritableFile(*std::move(file), path);
}

std::unique_ptr<AppendFile> NewStringAppendFile(std::string* out, std::string name) {
  return std::make_unique<StringAppendFile>(out, std::move(name));
}

std::unique_ptr<ReadFile> NewStringReadFile(const std::string* bytes, std::string name) {
  return std::make_unique<StringReadFile>(bytes, std::move(name));
}

void AppendRecordHeader(uint64_t length, std::string* out) {
  size_t at = out->size();
  PutFixed64(out, length);
  PutFixed32(out, crc32c::Mask(crc32c::Value(out->data() + at, 8)));
}

std::string FrameRecord(std::string_view data) {
  std::string out;
  out.reserve(kRecordHeaderBytes + data.size() + kRecordFooterBytes);
  AppendRecordHeader(data.size(), &out);
  out.append(data.data(), data.size());
  PutFixed32(&out, crc32c::Mask(crc32c::Value(data.data(), data.size())));
  return out;
}

// ---- RecordWriter ----

absl::StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Open(const std::string& path,
                                                                 bool append) {
  return Open(Env::Default(), path, append ? WriteMode::kAppend : WriteMode::kTruncate);
}

absl::StatusOr<std::unique_ptr<RecordWriter>> RecordWriter::Open(Env* env, const std::string& path,
                                                                 WriteMode mode) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<AppendFile> file, OpenAppendFile(env, path, mode));
  uint64_t start = 0;
  if (mode == WriteMode::kAppend) {
    KILN_ASSIGN_OR_RETURN(start, env->GetFileSize(path));
  }
  return std::make_unique<RecordWriter>(std::move(file), start);
}

RecordWriter::RecordWriter(std::unique_ptr<AppendFile> file, uint64_t start_offset)
    : file_(std::move(file)), offset_(start_offset) {}

RecordWriter::~RecordWriter() {
  if (!closed_) (void)file_->Close();
}

const std::string& RecordWriter::name() const { return file_->name(); }

absl::Status RecordWriter::Write(std::string_view data) {
  if (closed_) return absl::FailedPreconditionError("write to closed record file " + name());
  KILN_RETURN_IF_ERROR(sticky_error_);
  scratch_.clear();
  AppendRecordHeader(data.size(), &scratch_);
  absl::Status s = file_->Append(scratch_);
  if (s.ok()) s = file_->Append(data);
  if (s.ok()) {
    scratch_.clear();
    PutFixed32(&scratch_, crc32c::Mask(crc32c::Value(data.data(), data.size())));
    s = file_->Append(scratch_);
  }
  if (!s.ok()) {
    sticky_error_ = Annotate(
        s, "record at offset " + std::to_string(offset_) + " of " + name() + " left incomplete");
    return sticky_error_;
  }
  offset_ += kRecordHeaderBytes + data.size() + kRecordFooterBytes;
  return absl::OkStatus();
}

absl::Status RecordWriter::Flush() {
  if (closed_) return absl::FailedPreconditionError("flush of closed record file " + name());
  KILN_RETURN_IF_ERROR(sticky_error_);
  return file_->Flush();
}

absl::Status RecordWriter::Sync() {
  if (closed_) return absl::FailedPreconditionError("sync of closed record file " + name());
  KILN_RETURN_IF_ERROR(sticky_error_);
  return file_->Sync();
}

absl::Status RecordWriter::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  absl::Status s = sticky_error_.ok() ? file_->Sync() : sticky_error_;
  absl::Status c = file_->Close();
  return s.ok() ? c : s;
}

// ---- RecordReader ----

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(const std::string& path) {
  return Open(Env::Default(), path);
}

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(Env* env,
                                                                 const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ReadFile> file, OpenEnvReadFile(env, path));
  return std::make_unique<RecordReader>(std::move(file));
}

RecordReader::RecordReader(std::unique_ptr<ReadFile> file, uint64_t start_offset)
    : file_(std::move(file)), offset_(start_offset) {}

absl::StatusOr<bool> RecordReader::Read(std::string* record) {
  const std::string where = name() + ": ";
  const std::string at = " at offset " + std::to_string(offset_);
  char header[kRecordHeaderBytes];
  KILN_ASSIGN_OR_RETURN(size_t got, file_->ReadAt(offset_, sizeof(header), header));
  if (got == 0) return false;
  if (got < sizeof(header)) {
    return absl::OutOfRangeError(where + "truncated record" + at + " (" + std::to_string(got) +
                                 " of 12 header bytes)");
  }
  const uint64_t length = DecodeFixed64(header);
  const uint32_t want_len_crc = DecodeFixed32(header + 8);
  const uint32_t len_crc = crc32c::Mask(crc32c::Value(header, 8));
  if (len_crc != want_len_crc) {
    return absl::DataLossError(where + "corrupt record length" + at + " (length CRC mismatch)");
  }
  if (length > kMaxRecordBytes) {
    return absl::DataLossError(where + "record" + at + " has length " + std::to_string(length) +
                               ", over the limit of " + std::to_string(kMaxRecordBytes));
  }
  const uint64_t end = offset_ + kRecordHeaderBytes + length + kRecordFooterBytes;
  KILN_ASSIGN_OR_RETURN(uint64_t size, file_->Size());
  if (size < end) {
    return absl::OutOfRangeError(where + "truncated record" + at + " (needs " +
                                 std::to_string(end - offset_) + " bytes, file has " +
                                 std::to_string(size > offset_ ? size - offset_ : 0) + ")");
  }
  record->resize(length + kRecordFooterBytes);
  KILN_ASSIGN_OR_RETURN(
      size_t body, file_->ReadAt(offset_ + kRecordHeaderBytes, record->size(), record->data()));
  if (body < record->size()) {  // the file shrank between Size() and the read
    return absl::OutOfRangeError(where + "truncated record" + at);
  }
  const uint32_t want_data_crc = DecodeFixed32(record->data() + length);
  record->resize(length);
  if (crc32c::Mask(crc32c::Value(record->data(), length)) != want_data_crc) {
    return absl::DataLossError(where + "corrupt record" + at + " (data CRC mismatch, " +
                               std::to_string(length) + " bytes)");
  }
  offset_ = end;
  return true;
}

namespace {

absl::StatusOr<std::vector<std::string>> ReadAll(RecordReader& reader, bool allow_truncated_tail) {
  std::vector<std::string> out;
  std::string rec;
  while (true) {
    absl::StatusOr<bool> got = reader.Read(&rec);
    if (!got.ok()) {
      if (allow_truncated_tail && absl::IsOutOfRange(got.status())) break;
      return got.status();
    }
    if (!*got) break;
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadAllRecords(const std::string& path,
                                                        bool allow_truncated_tail) {
  return ReadAllRecords(Env::Default(), path, allow_truncated_tail);
}

absl::StatusOr<std::vector<std::string>> ReadAllRecords(Env* env, const std::string& path,
                                                        bool allow_truncated_tail) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> reader, RecordReader::Open(env, path));
  return ReadAll(*reader, allow_truncated_tail);
}

}  // namespace kiln::data
