// Opening and verifying a checkpoint's shard files through Env: the one place that checks a
// shard against its manifest entry (present, of the size the manifest says) and reads a tensor
// entry's bytes with their CRC32C. Private to train/checkpoint.cc (whole-tensor checkpoints)
// and train/checkpoint_sharded.cc (pieces); docs/formats.md "Checkpoints" has the layout.
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f,
//                         OpenShard(env, JoinPath(dir, shard.file), shard, where));
//   KILN_ASSIGN_OR_RETURN(uint32_t crc, ReadEntry(*f, path, t, dst, where));
//   if (crc != t.crc32c) return ...;   // the caller words the mismatch
#ifndef KILN_TRAIN_INTERNAL_SHARD_FILE_H_
#define KILN_TRAIN_INTERNAL_SHARD_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/train/internal/checkpoint_format.h"

namespace kiln::train::internal {

// Bytes read (and written) per call: bounds the scratch a verify-only read needs.
inline constexpr size_t kShardChunkBytes = size_t{4} << 20;

// DataLoss "<where>: <path>: <what>".
absl::Status ShardCorrupt(const std::string& where, const std::string& path,
                          const std::string& what);

// Opens the shard file at `path` after checking it against `shard`: DataLoss "shard is missing"
// when it is not there, "truncated: N bytes, the manifest says M" (or "wrong size: ...") when its
// size differs; other I/O errors keep their code, annotated with `where`.
absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenShard(Env* env, const std::string& path,
                                                            const ManifestShard& shard,
                                                            const std::string& where);

// Reads entry `t`'s t.bytes bytes at t.offset of `file` (the shard at `path`) chunk by chunk
// into `dst`, or, with dst null, through `scratch` (grown to one chunk; the bytes are only
// checksummed). Returns their CRC32C. DataLoss "tensor '<name>' is cut short" on a short read.
absl::StatusOr<uint32_t> ReadEntry(const RandomAccessFile& file, const std::string& path,
                                   const ManifestTensor& t, char* dst, const std::string& where,
                                   std::vector<char>* scratch = nullptr);

}  // namespace kiln::train::internal

#endif  // KILN_TRAIN_INTERNAL_SHARD_FILE_H_
