// TFRecord framing: the record container of TensorBoard event files and of Kiln's record shards,
// byte-compatible with TensorFlow's tf.io.TFRecordWriter / TFRecordDataset (uncompressed).
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<RecordWriter> w, RecordWriter::Open("/data/a.tfrecord"));
//   KILN_RETURN_IF_ERROR(w->Write("payload"));
//   KILN_RETURN_IF_ERROR(w->Close());                 // flush + fsync + close
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<RecordReader> r, RecordReader::Open("/data/a.tfrecord"));
//   std::string rec;
//   while (true) {
//     KILN_ASSIGN_OR_RETURN(bool got, r->Read(&rec));  // false: clean end of file
//     if (!got) break;
//     Use(rec);
//   }
//
// Each record is (docs/formats.md "TFRecord"):
//   u64 LE length | u32 LE masked CRC32C of those 8 bytes | data[length] | u32 LE masked
//   CRC32C(data)
// with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (crc32c::Mask).
//
// Reading: a CRC mismatch (or a length that the header CRC vouches for but that is absurd) is
// DataLoss naming the file and the record's byte offset. A file that ends inside a record is
// OutOfRange "truncated record at offset N": a writer may still be appending it (a live event
// file) or it was killed mid-write; the reader stays at N, so calling Read again after the file
// grows picks the record up. A clean end of file is Read() returning false.
//
// Files are reached through kiln::Env (base/env.h), so record files are tested under MemEnv and
// FaultInjectionEnv: the overloads without an Env use Env::Default(). The small AppendFile /
// ReadFile interfaces below sit between the framing and the Env; tests also use their in-memory
// string versions.
#ifndef KILN_DATA_RECORD_IO_H_
#define KILN_DATA_RECORD_IO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"

namespace kiln::data {

inline constexpr size_t kRecordHeaderBytes = 12;  // u64 length + u32 masked CRC of the length
inline constexpr size_t kRecordFooterBytes = 4;   // u32 masked CRC of the data
// Largest record the reader accepts (a guard against allocating an absurd length); TensorFlow
// has no limit, but no event or shard record comes near this.
inline constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 32;

// Sequential writer of bytes. Append may buffer; Flush hands buffered bytes to the OS; Sync makes
// everything appended so far durable (fsync); Close flushes and closes (no fsync).
class AppendFile {
 public:
  virtual ~AppendFile() = default;
  virtual absl::Status Append(std::string_view data) = 0;
  virtual absl::Status Flush() = 0;
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
  virtual const std::string& name() const = 0;
};

// Positional reader of bytes that may grow while being read (a file another process appends to).
class ReadFile {
 public:
  virtual ~ReadFile() = default;
  // Reads up to n bytes at `offset` into dst; returns how many were read (fewer at end of file).
  virtual absl::StatusOr<size_t> ReadAt(uint64_t offset, size_t n, char* dst) = 0;
  // The current size in bytes.
  virtual absl::StatusOr<uint64_t> Size() = 0;
  virtual const std::string& name() const = 0;
};

// How a file is opened for writing: created or truncated (Env::NewWritableFile), appended to
// (Env::NewAppendableFile; created if missing) or created only if absent (Env::NewExclusiveFile:
// AlreadyExists otherwise, so a writer never overwrites another's file).
enum class WriteMode { kTruncate, kAppend, kExclusive };

// `path` through `env`, opened as `mode` says. Errors carry the path.
absl::StatusOr<std::unique_ptr<AppendFile>> OpenAppendFile(Env* env, const std::string& path,
                                                           WriteMode mode = WriteMode::kTruncate);

// In-memory files for tests: the writer appends to *out (borrowed, must outlive it); the reader
// reads *bytes (borrowed, may be changed between reads to simulate a growing file).
std::unique_ptr<AppendFile> NewStringAppendFile(std::string* out, std::string name = "<memory>");
std::unique_ptr<ReadFile> NewStringReadFile(const std::string* bytes,
                                            std::string name = "<memory>");

// Adapters onto base/env.h. The reader's Size() asks env->GetFileSize(path) each time, so a
// growing file is followed.
std::unique_ptr<AppendFile> AdaptWritableFile(std::unique_ptr<WritableFile> file, std::string name);
absl::StatusOr<std::unique_ptr<ReadFile>> OpenEnvReadFile(Env* env, const std::string& path);

// The exact bytes of one framed record.
std::string FrameRecord(std::string_view data);
// Appends the 12-byte header for a record of `length` bytes to *out.
void AppendRecordHeader(uint64_t length, std::string* out);

class RecordWriter {
 public:
  // Opens `path` through `env` as `mode` says; appending, offset() starts at the file's size.
  static absl::StatusOr<std::unique_ptr<RecordWriter>> Open(Env* env, const std::string& path,
                                                            WriteMode mode = WriteMode::kTruncate);
  // The same on Env::Default(): creates (truncates) `path`, or appends to it when `append`.
  static absl::StatusOr<std::unique_ptr<RecordWriter>> Open(const std::string& path,
                                                            bool append = false);
  explicit RecordWriter(std::unique_ptr<AppendFile> file, uint64_t start_offset = 0);
  ~RecordWriter();  // closes if still open, ignoring errors: call Close() to see them

  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // Appends one record. FailedPrecondition after Close() or after an earlier write error (a
  // partially written record must not be followed by more records).
  absl::Status Write(std::string_view data);
  absl::Status Flush();
  absl::Status Sync();   // Flush + fsync
  absl::Status Close();  // Flush + fsync + close; idempotent

  // Bytes written so far (including start_offset): the offset the next record will start at.
  uint64_t offset() const { return offset_; }
  const std::string& name() const;

 private:
  std::unique_ptr<AppendFile> file_;
  uint64_t offset_ = 0;
  absl::Status sticky_error_;
  bool closed_ = false;
  std::string scratch_;
};

class RecordReader {
 public:
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(Env* env, const std::string& path);
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(const std::string& path);  // Default()
  explicit RecordReader(std::unique_ptr<ReadFile> file, uint64_t start_offset = 0);

  // Reads the next record into *record. true: got one (offset() moves past it); false: clean end
  // of file. OutOfRange: the file ends inside the record at offset(). DataLoss: a CRC mismatch
  // or bad length at offset(). On any error offset() stays at the record's start.
  absl::StatusOr<bool> Read(std::string* record);

  // Byte offset of the next record.
  uint64_t offset() const { return offset_; }
  // Moves to `offset` (must be a record boundary, e.g. a saved offset()).
  void Seek(uint64_t offset) { offset_ = offset; }
  const std::string& name() const { return file_->name(); }

 private:
  std::unique_ptr<ReadFile> file_;
  uint64_t offset_ = 0;
};

// Reads every record of `path`. A truncated final record is an error unless
// `allow_truncated_tail`, in which case the records before it are returned.
absl::StatusOr<std::vector<std::string>> ReadAllRecords(const std::string& path,
                                                        bool allow_truncated_tail = false);
absl::StatusOr<std::vector<std::string>> ReadAllRecords(Env* env, const std::string& path,
                                                        bool allow_truncated_tail = false);

}  // namespace kiln::data

#endif  // KILN_DATA_RECORD_IO_H_
