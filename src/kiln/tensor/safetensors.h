// Reading and writing safetensors files: the weight and checkpoint format of Kiln (and of Hugging
// Face), so files move both ways between Kiln and PyTorch/JAX tooling.
//
//   std::vector<std::pair<std::string, Tensor>> ts = {{"w", w}, {"b", b}};
//   KILN_RETURN_IF_ERROR(WriteSafetensors("/ckpt/model.safetensors", ts, {{"step", "100"}}));
//
//   std::map<std::string, std::string> meta;
//   KILN_ASSIGN_OR_RETURN(auto tensors, ReadSafetensors("/ckpt/model.safetensors", &meta));
//   const Tensor& w2 = tensors.at("w");
//
// Layout (byte by byte in docs/formats.md): an 8-byte little-endian u64 N, then N bytes of UTF-8
// JSON, then the data buffer. The JSON object maps each tensor name to
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} (offsets relative to the start
// of the data buffer, end exclusive), plus an optional "__metadata__": {string: string}.
//
// Files are reached through an Env (base/env.h; null: Env::Default()), so tests and checkpoints
// use in-memory and fault-injecting ones. Under the file functions sits a byte codec
// (EncodeSafetensorsHeader, DecodeSafetensorsHeaderLength, DecodeSafetensorsHeader) for callers
// that frame the bytes themselves: checkpoint shards (train/checkpoint.cc) are safetensors files
// whose headers are built and checked with it.
//
// Writing: tensors are laid out in the order given (the header lists them in that order, after
// "__metadata__"), the header is padded with spaces so the data starts 8-byte aligned, and the
// file is written to `path + ".tmp"`, synced and renamed over `path` (then the directory synced):
// readers see the old file or the whole new one, never a torn one.
//
// Reading is strict, like the Rust reference: every tensor's bytes must lie inside the buffer, no
// two tensors may overlap, and the tensors together must cover the whole buffer with no gap. A
// malformed or truncated file is DataLoss (naming the file and the problem), never a crash; a
// file that cannot be opened keeps the errno-derived code (NotFound, PermissionDenied, ...). The
// returned map is sorted by name. BOOL bytes other than 0/1 are read as true (1).
#ifndef KILN_TENSOR_SAFETENSORS_H_
#define KILN_TENSOR_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/shape.h"
#include "kiln/tensor/tensor.h"

namespace kiln {

// Largest header Kiln accepts, as the Rust reference (a guard against absurd allocations).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor's entry in a safetensors header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, end exclusive
  uint64_t end = 0;
};

// A validated header: entries in data-offset order, the metadata, and where the data buffer
// starts in the file (8 + header length).
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
  uint64_t data_size = 0;
};

// ---- the byte codec ----

// The header bytes (8-byte little-endian length, JSON, spaces to a multiple of 8) listing
// `entries` in the order given, each at its [begin, end) data offsets, after "__metadata__" when
// `metadata` is not empty. InvalidArgument for an empty, reserved ("__metadata__") or repeated
// name, invalid UTF-8, or a header over the limit.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata = {});
// The header length N from the first 8 bytes of a file of `file_size` bytes: DataLoss (naming
// `source`) when the file is shorter than 8 bytes, or N is over the limit or runs past the end.
absl::StatusOr<uint64_t> DecodeSafetensorsHeaderLength(std::string_view prefix, uint64_t file_size,
                                                       const std::string& source);
// Parses and validates the N bytes of header JSON of a file whose data buffer starts at
// `data_start` (8 + N) and holds `data_size` bytes, with the strict checks described above.
absl::StatusOr<SafetensorsHeader> DecodeSafetensorsHeader(std::string_view json_text,
                                                          uint64_t data_start, uint64_t data_size,
                                                          const std::string& source);

// ---- files ----

// Reads the whole file. `metadata`, if given, receives "__metadata__" (empty if absent).
absl::StatusOr<std::map<std::string, Tensor>> ReadSafetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr,
    Env* env = nullptr);

// Reads and validates only the header (cheap: does not touch the data buffer beyond its size).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path,
                                                        Env* env = nullptr);
// The first 8 + N bytes of a file already open, of `file_size` bytes (the length and the header
// JSON, N checked as DecodeSafetensorsHeaderLength does); `source` names it in errors.
absl::StatusOr<std::string> ReadSafetensorsPrefix(const RandomAccessFile& file, uint64_t file_size,
                                                  const std::string& source);
// ReadSafetensorsHeader for a file already open.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const RandomAccessFile& file,
                                                        uint64_t file_size,
                                                        const std::string& source);

// In-memory variants. `source` names the bytes in error messages.
absl::StatusOr<std::map<std::string, Tensor>> ParseSafetensors(
    std::string_view bytes, std::map<std::string, std::string>* metadata = nullptr,
    const std::string& source = "<memory>");

// Writes `tensors` (names unique, non-empty, not "__metadata__", valid UTF-8) atomically.
// InvalidArgument for a bad request, the I/O error (with the path) otherwise.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              Env* env = nullptr);

// The exact bytes WriteSafetensors would write.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln

#endif  // KILN_TENSOR_SAFETENSORS_H_
