// Sharded checkpoints (checkpoint.h SaveSharded, CheckpointReader; docs/formats.md "Sharded
// checkpoints"): every rank writes its own pieces, rank 0 commits once all are durable, and any
// slice of any tensor is read back from whatever pieces cover it.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"
#include "kiln/tensor/safetensors.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/internal/checkpoint_format.h"
#include "kiln/train/internal/shard_file.h"

namespace kiln::train {
namespace {

using internal::Manifest;
using internal::ManifestShard;
using internal::ManifestTensor;

constexpr size_t kChunk = size_t{4} << 20;

std::string RankShardName(int rank, size_t i, size_t n) {
  return absl::StrFormat("rank-%05d-shard-%05d-of-%05d.safetensors", rank, i, n);
}
std::string RankManifestName(int rank) { return absl::StrFormat("rank-%05d.json", rank); }
std::string Hex(uint32_t v) { return absl::StrFormat("0x%08x", v); }

int64_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

// An unsharded (version 1) entry as a piece covering its whole tensor.
TensorSlice SliceOf(const ManifestTensor& t) {
  return t.piece ? t.slice : TensorSlice::Whole(t.shape);
}
const Shape& WholeShape(const ManifestTensor& t) { return t.piece ? t.global_shape : t.shape; }

// Reads the bytes of entry `t` into `dst` (t.bytes of them), verifying the shard file's size and
// the entry's CRC32C.
absl::Status ReadAndCheckEntry(Env* env, const std::string& dir, const Manifest& m,
                               const ManifestTensor& t, char* dst, const std::string& where) {
  const std::string path = JoinPath(dir, m.shards[t.shard].file);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                        internal::OpenShard(env, path, m.shards[t.shard], where));
  KILN_ASSIGN_OR_RETURN(uint32_t crc, internal::ReadEntry(*file, path, t, dst, where));
  if (crc != t.crc32c) {
    return internal::ShardCorrupt(
        where, path,
        absl::StrCat("tensor '", t.name, "' ", SliceOf(t).ToString(),
                     ": CRC32C mismatch (manifest ", Hex(t.crc32c), ", data ", Hex(crc), ")"));
  }
  return absl::OkStatus();
}

// Why `p` may not join the other pieces of its name that one rank saves (`same`), or "": a rank
// may hold several disjoint boxes of one tensor (a tensor-parallel split of K groups), of one
// dtype and whole shape; a flat range stands alone.
std::string PieceClash(const std::vector<const TensorPiece*>& same, const TensorPiece& p) {
  for (const TensorPiece* q : same) {
    if (q->slice.flat || p.slice.flat) return "a flat range must be its tensor's only piece";
    if (q->dtype != p.dtype || !(q->global_shape == p.global_shape))
      return "they differ in dtype or whole shape";
    bool overlap = q->slice.offsets.size() == p.slice.offsets.size();
    for (size_t d = 0; overlap && d < p.slice.offsets.size(); ++d) {
      overlap = p.slice.offsets[d] < q->slice.offsets[d] + q->slice.sizes[d] &&
                q->slice.offsets[d] < p.slice.offsets[d] + p.slice.sizes[d];
    }
    if (overlap) return absl::StrCat(q->slice.ToString(), " and ", p.slice.ToString(), " overlap");
  }
  return "";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reading

struct CheckpointReader::Impl {
  Env* env = nullptr;
  std::string dir, where;
  Manifest manifest;
  std::vector<std::string> order;                     // names, first appearance
  std::map<std::string, std::vector<size_t>> byname;  // indices into manifest.tensors
  std::vector<std::vector<SliceRun>> runs;            // per manifest tensor
  std::vector<char> scratch;
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& step_dir, Env* env) {
  auto impl = std::make_unique<Impl>();
  impl->env = env != nullptr ? env : Env::Default();
  impl->dir = step_dir;
  impl->where = "checkpoint " + step_dir;
  const std::string path = JoinPath(step_dir, kCheckpointManifestName);
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFileToString(impl->env, path));
  KILN_ASSIGN_OR_RETURN(impl->manifest, internal::DecodeManifest(text, path));
  const std::vector<ManifestTensor>& ts = impl->manifest.tensors;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto [it, fresh] = impl->byname.emplace(ts[i].name, std::vector<size_t>());
    if (fresh) impl->order.push_back(ts[i].name);
    it->second.push_back(i);
    impl->runs.push_back(SliceRuns(SliceOf(ts[i]), WholeShape(ts[i])));
  }
  // Each tensor's pieces must tile it: same dtype, no overlap, no gap.
  for (const auto& [name, idx] : impl->byname) {
    const ManifestTensor& first = ts[idx[0]];
    std::vector<SliceRun> all;
    for (size_t i : idx) {
      if (ts[i].dtype != first.dtype) {
        return absl::DataLossError(
            absl::StrCat(impl->where, ": the pieces of '", name, "' disagree on the dtype"));
      }
      all.insert(all.end(), impl->runs[i].begin(), impl->runs[i].end());
    }
    std::sort(all.begin(), all.end(),
              [](const SliceRun& a, const SliceRun& b) { return a.start < b.start; });
    int64_t next = 0;
    for (const SliceRun& r : all) {
      if (r.start != next) {
        return absl::DataLossError(absl::StrCat(impl->where, ": the pieces of '", name, "' ",
                                                r.start > next ? "leave a gap" : "overlap",
                                                " at element ", std::min(r.start, next)));
      }
      next += r.length;
    }
    if (next != WholeShape(first).num_elements()) {
      return absl::DataLossError(absl::StrCat(impl->where, ": the pieces of '", name, "' cover ",
                                              next, " of its ", WholeShape(first).num_elements(),
                                              " elements"));
    }
  }
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

int64_t CheckpointReader::step() const { return impl_->manifest.step; }
const nlohmann::json& CheckpointReader::metadata() const { return impl_->manifest.metadata; }
bool CheckpointReader::sharded() const { return impl_->manifest.format_version >= 2; }
int CheckpointReader::ranks() const { return impl_->manifest.ranks; }
std::vector<std::string> CheckpointReader::names() const { return impl_->order; }

absl::StatusOr<std::pair<DType, Shape>> CheckpointReader::Info(const std::string& name) const {
  auto it = impl_->byname.find(name);
  if (it == impl_->byname.end()) {
    return absl::NotFoundError(absl::StrCat(impl_->where, " has no tensor '", name, "'"));
  }
  const ManifestTensor& t = impl_->manifest.tensors[it->second[0]];
  return std::make_pair(t.dtype, WholeShape(t));
}

absl::StatusOr<Tensor> CheckpointReader::ReadSlice(const std::string& name,
                                                   const TensorSlice& slice) {
  KILN_ASSIGN_OR_RETURN(auto info, Info(name));
  Tensor out(info.first, slice.PieceShape());
  KILN_RETURN_IF_ERROR(ReadSliceInto(name, slice, out));
  return out;
}

absl::Status CheckpointReader::ReadSliceInto(const std::string& name, const TensorSlice& slice,
                                             Tensor& out) {
  KILN_ASSIGN_OR_RETURN(auto info, Info(name));
  const auto& [dtype, whole] = info;
  absl::Status bad = slice.Check(whole);
  if (!bad.ok()) return Annotate(bad, absl::StrCat(impl_->where, ": tensor '", name, "'"));
  if (out.dtype() != dtype || out.shape().dims() != slice.PieceShape().dims()) {
    return absl::InvalidArgumentError(absl::StrCat(
        impl_->where, ": tensor '", name, "' slice ", slice.ToString(), " is ",
        std::string(DTypeName(dtype)), slice.PieceShape().ToString(), ", not ", out.TypeString()));
  }
  const std::vector<SliceRun> want = SliceRuns(slice, whole);
  const int64_t esize = DTypeSize(dtype);
  int64_t copied = 0;
  for (size_t i : impl_->byname[name]) {
    const ManifestTensor& t = impl_->manifest.tensors[i];
    const std::vector<SliceRun>& have = impl_->runs[i];
    // Skip pieces that do not touch the slice (without reading them).
    bool touches = false;
    for (size_t a = 0, b = 0; a < have.size() && b < want.size() && !touches;) {
      touches = std::max(have[a].start, want[b].start) <
                std::min(have[a].start + have[a].length, want[b].start + want[b].length);
      if (have[a].start + have[a].length <= want[b].start + want[b].length) {
        ++a;
      } else {
        ++b;
      }
    }
    if (!touches) continue;
    if (SliceOf(t) == slice ||
        (have.size() == 1 && want.size() == 1 && have[0].start == want[0].start &&
         have[0].length == want[0].length)) {
      KILN_RETURN_IF_ERROR(ReadAndCheckEntry(impl_->env, impl_->dir, impl_->manifest, t,
                                             static_cast<char*>(out.raw_data()), impl_->where));
      copied += slice.num_elements();
      continue;
    }
    impl_->scratch.resize(std::max<size_t>(impl_->scratch.size(), t.bytes));
    KILN_RETURN_IF_ERROR(ReadAndCheckEntry(impl_->env, impl_->dir, impl_->manifest, t,
                                           impl_->scratch.data(), impl_->where));
    copied += CopyOverlap(have, impl_->scratch.data(), want, out.raw_data(), esize);
  }
  if (copied != slice.num_elements()) {  // Open checked the tiling: a broken invariant
    return absl::InternalError(absl::StrCat(impl_->where, ": tensor '", name, "' slice ",
                                            slice.ToString(), ": read ", copied, " of ",
                                            slice.num_elements(), " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointManager::LoadPieces(const std::string& dir, Checkpoint& out) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(dir, env_));
  for (const std::string& name : reader->names()) {
    if (restore_keep_ && !restore_keep_(name)) continue;
    KILN_ASSIGN_OR_RETURN(auto info, reader->Info(name));
    Tensor target(DType::kF32, Shape{0});
    bool found = false;
    if (restore_into_ != nullptr) {
      for (const auto& [n, tensor] : *restore_into_) {
        if (n == name && tensor.dtype() == info.first && tensor.shape() == info.second) {
          target = tensor;  // shares the caller's buffer
          found = true;
          break;
        }
      }
    }
    if (!found) target = Tensor(info.first, info.second);
    KILN_RETURN_IF_ERROR(reader->ReadSliceInto(name, TensorSlice::Whole(info.second), target));
    out.tensors.emplace(name, std::move(target));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Writing

absl::Status CheckpointManager::WriteRankFiles(int64_t step, int rank, const std::string& tmp_dir,
                                               const std::vector<TensorPiece>& pieces,
                                               SaveInfo* info) {
  // Group the pieces into shard files by the byte budget, keeping their order. A rank may hold
  // several pieces of one tensor (a tensor-parallel split of K groups: one per group), and a
  // safetensors key is unique in its file: the k-th piece of a name goes to the k-th run of
  // files (every first piece in order, then every second, ...), so K groups take K files, not
  // one per piece.
  std::vector<size_t> order(pieces.size());
  {
    std::map<std::string, int> seen;
    std::vector<int> occurrence(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) occurrence[i] = seen[pieces[i].name]++;
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return occurrence[a] < occurrence[b]; });
  }
  std::vector<std::vector<size_t>> groups;
  std::set<std::string> group_names;
  uint64_t group_bytes = 0;
  for (size_t i : order) {
    const uint64_t b =
        static_cast<uint64_t>(pieces[i].slice.num_elements()) * DTypeSize(pieces[i].dtype);
    if (groups.empty() || (!groups.back().empty() && group_bytes + b > options_.shard_bytes) ||
        group_names.count(pieces[i].name) > 0) {
      groups.emplace_back();
      group_names.clear();
      group_bytes = 0;
    }
    group_names.insert(pieces[i].name);
    groups.back().push_back(i);
    group_bytes += b;
    info->bytes += b;
  }
  info->shards = static_cast<int>(groups.size());
  Manifest part;
  part.format_version = 2;
  part.step = step;
  part.created_micros = env_->NowMicros();
  part.metadata = {{"rank", rank}};
  for (size_t g = 0; g < groups.size(); ++g) {
    ManifestShard shard;
    shard.file = RankShardName(rank, g, groups.size());
    std::vector<internal::ShardEntry> entries;
    for (size_t i : groups[g]) {
      const TensorPiece& p = pieces[i];
      entries.push_back({p.name, p.dtype, p.slice.PieceShape(),
                         static_cast<uint64_t>(p.slice.num_elements()) * DTypeSize(p.dtype)});
    }
    KILN_ASSIGN_OR_RETURN(std::string header,
                          internal::BuildShardHeader(entries, {{"format", "pt"}}));
    const std::string path = JoinPath(tmp_dir, shard.file);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env_->NewWritableFile(path));
    KILN_RETURN_IF_ERROR(file->Append(header));
    uint32_t shard_crc = crc32c::Value(header.data(), header.size());
    uint64_t offset = header.size();
    for (size_t i : groups[g]) {
      const TensorPiece& p = pieces[i];
      const char* data = static_cast<const char*>(p.data);
      const uint64_t n = static_cast<uint64_t>(p.slice.num_elements()) * DTypeSize(p.dtype);
      uint32_t crc = 0;
      for (uint64_t done = 0; done < n;) {
        const size_t k = static_cast<size_t>(std::min<uint64_t>(kChunk, n - done));
        crc = crc32c::Extend(crc, data + done, k);
        KILN_RETURN_IF_ERROR(file->Append(std::string_view(data + done, k)));
        done += k;
      }
      shard_crc = crc32c::Combine(shard_crc, crc, n);
      ManifestTensor t;
      t.name = p.name;
      t.shard = static_cast<int>(g);
      t.dtype = p.dtype;
      t.shape = p.slice.PieceShape();
      t.offset = offset;
      t.bytes = n;
      t.crc32c = crc;
      t.piece = true;
      t.global_shape = p.global_shape;
      t.slice = p.slice;
      part.tensors.push_back(std::move(t));
      offset += n;
    }
    KILN_RETURN_IF_ERROR(file->Sync());
    KILN_RETURN_IF_ERROR(file->Close());
    shard.bytes = offset;
    shard.crc32c = shard_crc;
    part.shards.push_back(std::move(shard));
  }
  KILN_ASSIGN_OR_RETURN(std::string text, internal::EncodeManifest(part));
  return WriteStringToFile(env_, text, JoinPath(tmp_dir, RankManifestName(rank)), /*sync=*/true);
}

absl::Status CheckpointManager::MergeAndCommit(int64_t step, int ranks, const std::string& tmp_dir,
                                               const std::string& nonce,
                                               const nlohmann::json& metadata, SaveInfo* info) {
  Manifest merged;
  merged.format_version = 2;
  merged.step = step;
  merged.created_micros = env_->NowMicros();
  merged.metadata = metadata;
  merged.ranks = ranks;
  for (int r = 0; r < ranks; ++r) {
    const std::string path = JoinPath(tmp_dir, RankManifestName(r));
    KILN_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env_, path));
    KILN_ASSIGN_OR_RETURN(Manifest part, internal::DecodeManifest(text, path));
    if (part.step != step) {
      return absl::DataLossError(absl::StrCat(path, " is of step ", part.step, ", not ", step));
    }
    const int base = static_cast<int>(merged.shards.size());
    for (ManifestShard& s : part.shards) merged.shards.push_back(std::move(s));
    for (ManifestTensor& t : part.tensors) {
      t.shard += base;
      merged.tensors.push_back(std::move(t));
    }
  }
  KILN_ASSIGN_OR_RETURN(std::string text, internal::EncodeManifest(merged));
  // The merged manifest must decode (names, pieces in one file) before it is committed.
  KILN_RETURN_IF_ERROR(internal::DecodeManifest(text, "merged manifest").status());
  KILN_RETURN_IF_ERROR(WriteStringToFile(env_, text, JoinPath(tmp_dir, kCheckpointManifestName),
                                         /*sync=*/true));
  KILN_RETURN_IF_ERROR(env_->SyncDir(tmp_dir));
  // Commit, as WriteAndCommit does.
  const std::string final_name = absl::StrCat("step_", step);
  const std::string final_dir = JoinPath(root_, final_name);
  std::string old_dir;
  if (env_->FileExists(final_dir)) {
    old_dir = JoinPath(root_, final_name + ".old-" + nonce);
    KILN_RETURN_IF_ERROR(env_->RenameFile(final_dir, old_dir));
  }
  absl::Status s = env_->RenameFile(tmp_dir, final_dir);
  if (!s.ok()) {
    if (!old_dir.empty()) (void)env_->RenameFile(old_dir, final_dir);
    return s;
  }
  s = env_->SyncDir(root_);
  if (!s.ok()) return Annotate(s, "renamed into place, but the rename may not survive a crash");
  if (!old_dir.empty()) {
    absl::Status d = env_->DeleteDir(old_dir);
    if (!d.ok()) info->notes.push_back("could not delete the replaced checkpoint: " + d.ToString());
  }
  return ApplyRetention(step, info);
}

absl::Status CheckpointManager::SaveSharded(int64_t step, const std::vector<TensorPiece>& pieces,
                                            const nlohmann::json& metadata,
                                            dist::Communicator& comm) {
  const int rank = comm.rank(), ranks = comm.size();
  const std::string context =
      absl::StrCat("sharded checkpoint step ", step, " (rank ", rank, " of ", ranks, ")");
  const auto t0 = std::chrono::steady_clock::now();
  // Local problems are reported after the first collective, so that no rank waits out its
  // timeout for one that returned early.
  absl::Status local = ConsumePending(step);
  if (local.ok() && step < 0) {
    local = absl::InvalidArgumentError(absl::StrCat("checkpoint step ", step, " < 0"));
  }
  std::map<std::string, std::vector<const TensorPiece*>> names;
  for (const TensorPiece& p : pieces) {
    if (!local.ok()) break;
    std::vector<const TensorPiece*>& same = names[p.name];
    if (p.name.empty() || p.name == "__metadata__") {
      local =
          absl::InvalidArgumentError(absl::StrCat("checkpoint: bad tensor name '", p.name, "'"));
    } else if (const std::string clash = PieceClash(same, p); !clash.empty()) {
      local = absl::InvalidArgumentError(
          absl::StrCat("checkpoint: pieces of '", p.name, "' on one rank: ", clash));
    } else if (absl::Status c = p.slice.Check(p.global_shape); !c.ok()) {
      local = Annotate(c, "checkpoint: tensor '" + p.name + "'");
    } else if (p.data == nullptr && p.slice.num_elements() > 0) {
      local = absl::InvalidArgumentError("checkpoint: piece of '" + p.name + "' has no data");
    }
    same.push_back(&p);
  }
  nlohmann::json stamped;
  if (local.ok() && rank == 0) {
    absl::StatusOr<nlohmann::json> st = Stamp(metadata);
    if (st.ok()) {
      stamped = *std::move(st);
      try {
        (void)stamped.dump();
      } catch (const nlohmann::json::exception& e) {
        local = absl::InvalidArgumentError(absl::StrCat("checkpoint metadata: ", e.what()));
      }
    } else {
      local = st.status();
    }
  }
  // 1. Rank 0 creates the temporary directory and shares its nonce (0: it failed).
  int64_t nonce_value = 0;
  std::string tmp_dir;
  if (rank == 0 && local.ok()) {
    nonce_value = static_cast<int64_t>((env_->RandomU64() >> 1) | 1);
    tmp_dir = JoinPath(
        root_, absl::StrFormat("step_%d.tmp-%016x", step, static_cast<uint64_t>(nonce_value)));
    local = env_->CreateDir(tmp_dir);
    if (!local.ok()) nonce_value = 0;
  }
  KILN_RETURN_IF_ERROR(
      Annotate(comm.Broadcast(&nonce_value, 1, DType::kS64, 0), context + ": sharing the nonce"));
  const std::string nonce = absl::StrFormat("%016x", static_cast<uint64_t>(nonce_value));
  tmp_dir = JoinPath(root_, absl::StrFormat("step_%d.tmp-%s", step, nonce));
  // 2. Every rank writes and fsyncs its files.
  SaveInfo info;
  info.step = step;
  info.path = JoinPath(root_, absl::StrCat("step_", step));
  if (local.ok() && nonce_value != 0) local = WriteRankFiles(step, rank, tmp_dir, pieces, &info);
  // 3. The barrier: every rank's files are durable (or some rank failed).
  int32_t failed = local.ok() && nonce_value != 0 ? 0 : 1;
  KILN_RETURN_IF_ERROR(Annotate(comm.AllReduce(&failed, 1, DType::kS32, dist::ReduceOp::kMax),
                                context + ": agreeing that every rank's shards are durable"));
  // 4. Rank 0 merges and commits; every rank learns the outcome.
  absl::Status commit = absl::OkStatus();
  if (rank == 0) {
    if (failed == 0) commit = MergeAndCommit(step, ranks, tmp_dir, nonce, stamped, &info);
    if (failed != 0 || !commit.ok()) (void)env_->DeleteDir(tmp_dir);  // best effort
  }
  int32_t committed = commit.ok() && failed == 0 ? 1 : 0;
  KILN_RETURN_IF_ERROR(
      Annotate(comm.Broadcast(&committed, 1, DType::kS32, 0), context + ": sharing the commit"));
  info.write_micros = MicrosSince(t0);
  info.blocking_micros = info.write_micros;
  last_info_ = info;
  if (!local.ok()) return Annotate(local, context);
  if (!commit.ok()) return Annotate(commit, context + ": committing");
  if (committed == 0) {
    return absl::AbortedError(absl::StrCat(
        context, ": not committed: ",
        failed != 0 ? "another rank failed to write its shards" : "rank 0 failed to commit",
        " (see that rank's error); the previous checkpoint is intact"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::train
