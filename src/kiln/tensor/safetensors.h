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
// Writing: tensors are laid out in the order given (the header lists them in that order, after
// "__metadata__"), the header is padded with spaces so the data starts 8-byte aligned, and the
// file is written to `path + ".tmp"`, fsynced and renamed over `path`: readers see the old file
// or the whole new one, never a torn one.
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

// Reads the whole file. `metadata`, if given, receives "__metadata__" (empty if absent).
absl::StatusOr<std::map<std::string, Tensor>> ReadSafetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Reads and validates only the header (cheap: does not touch the data buffer beyond its size).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// In-memory variants. `source` names the bytes in error messages.
absl::StatusOr<std::map<std::string, Tensor>> ParseSafetensors(
    std::string_view bytes, std::map<std::string, std::string>* metadata = nullptr,
    const std::string& source = "<memory>");

// Writes `tensors` (names unique, non-empty, not "__metadata__", valid UTF-8) atomically.
// InvalidArgument for a bad request, the I/O error (with the path) otherwise.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The exact bytes WriteSafetensors would write.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln

#endif  // KILN_TENSOR_SAFETENSORS_H_
