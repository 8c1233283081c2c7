#include "kiln/train/internal/shard_file.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"

namespace kiln::train::internal {

absl::Status ShardCorrupt(const std::string& where, const std::string& path,
                          const std::string& what) {
  return absl::DataLossError(absl::StrCat(where, ": ", path, ": ", what));
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenShard(Env* env, const std::string& path,
                                                            const ManifestShard& shard,
                                                            const std::string& where) {
  absl::StatusOr<uint64_t> size = env->GetFileSize(path);
  if (!size.ok()) {
    if (size.status().code() == absl::StatusCode::kNotFound) {
      return ShardCorrupt(where, path, "shard is missing");
    }
    return Annotate(size.status(), where);
  }
  if (*size != shard.bytes) {
    return ShardCorrupt(where, path,
                        absl::StrCat(*size < shard.bytes ? "truncated: " : "wrong size: ", *size,
                                     " bytes, the manifest says ", shard.bytes));
  }
  return env->NewRandomAccessFile(path);
}

absl::StatusOr<uint32_t> ReadEntry(const RandomAccessFile& file, const std::string& path,
                                   const ManifestTensor& t, char* dst, const std::string& where,
                                   std::vector<char>* scratch) {
  std::vector<char> own;
  if (dst == nullptr) {
    if (scratch == nullptr) scratch = &own;
    scratch->resize(std::max(scratch->size(), std::min<size_t>(kShardChunkBytes, t.bytes)));
  }
  uint32_t crc = 0;
  std::string_view got;
  for (uint64_t done = 0; done < t.bytes;) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(kShardChunkBytes, t.bytes - done));
    char* d = dst != nullptr ? dst + done : scratch->data();
    KILN_RETURN_IF_ERROR(Annotate(file.Read(t.offset + done, k, &got, d), where));
    if (got.size() != k) return ShardCorrupt(where, path, "tensor '" + t.name + "' is cut short");
    if (got.data() != d) std::memcpy(d, got.data(), k);
    crc = crc32c::Extend(crc, d, k);
    done += k;
  }
  return crc;
}

}  // namespace kiln::train::internal
