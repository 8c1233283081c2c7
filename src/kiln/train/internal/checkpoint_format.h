// The bytes of a Kiln checkpoint (docs/formats.md "Checkpoints"): manifest encoding with its
// trailing checksum, and safetensors shard headers. Private to train/checkpoint.cc; split out so
// the format can be tested without a file system.
#ifndef KILN_TRAIN_INTERNAL_CHECKPOINT_FORMAT_H_
#define KILN_TRAIN_INTERNAL_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/shape.h"
#include "kiln/train/tensor_slice.h"
#include "nlohmann/json.hpp"

namespace kiln::train::internal {

inline constexpr char kManifestFormat[] = "kiln.checkpoint";
// The text that introduces the manifest's own checksum, the last member of the object.
inline constexpr char kManifestCrcMarker[] = ",\n  \"manifest_crc32c\": ";

struct ManifestShard {
  std::string file;     // a plain file name inside the checkpoint directory
  uint64_t bytes = 0;   // file size
  uint32_t crc32c = 0;  // of the whole file
};

struct ManifestTensor {
  std::string name;
  int shard = 0;  // index into Manifest::shards
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t offset = 0;  // of the first data byte in the shard file
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // of the tensor's bytes
  // Format version 2: this entry is one piece of a larger tensor (a sharded checkpoint). `shape`
  // is then the piece's own shape (slice.PieceShape()), `global_shape` the whole tensor's, and
  // `slice` where the piece lies in it. A name may then have several entries (its pieces).
  bool piece = false;
  Shape global_shape;
  TensorSlice slice;
};

struct Manifest {
  int format_version = 1;
  int64_t step = 0;
  uint64_t created_micros = 0;
  std::vector<ManifestShard> shards;
  std::vector<ManifestTensor> tensors;  // shard by shard, in file order
  nlohmann::json metadata;
  int ranks = 0;  // version 2: how many ranks wrote the pieces (0: not recorded)
};

// The manifest file: pretty-printed JSON whose last member is "manifest_crc32c", the CRC32C of
// every byte before kManifestCrcMarker. Throws nothing: bad UTF-8 in names or metadata (which
// callers validate first) is InvalidArgument.
absl::StatusOr<std::string> EncodeManifest(const Manifest& m);
// Checks the checksum and the schema. DataLoss (naming `source`) for damage; FailedPrecondition
// for a format version newer than this build reads.
absl::StatusOr<Manifest> DecodeManifest(std::string_view bytes, const std::string& source);

// One tensor of a shard, for building its header.
struct ShardEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t bytes;
};
// The safetensors prefix of a shard: 8-byte length, JSON header (metadata first, then tensors in
// the given order with contiguous data offsets), spaces to a multiple of 8. Byte-identical to
// what SerializeSafetensors writes for the same tensors and metadata.
absl::StatusOr<std::string> BuildShardHeader(const std::vector<ShardEntry>& entries,
                                             const std::map<std::string, std::string>& metadata);

// Checks a shard's header text (the JSON after the 8-byte length) against the manifest's
// tensors for that shard: the same names, dtypes, shapes and places (data starting at
// `data_start` in the file), covering the data buffer of `data_size` bytes with no gap.
// DataLoss naming `source` and the tensor otherwise.
absl::Status CheckShardHeader(std::string_view header_json, uint64_t data_start, uint64_t data_size,
                              const std::vector<const ManifestTensor*>& tensors,
                              const std::string& source);

}  // namespace kiln::train::internal

#endif  // KILN_TRAIN_INTERNAL_CHECKPOINT_FORMAT_H_
