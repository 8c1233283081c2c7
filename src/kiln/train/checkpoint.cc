#include "kiln/train/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/status.h"
#include "kiln/tensor/safetensors.h"
#include "kiln/train/internal/checkpoint_format.h"
#include "kiln/train/internal/shard_file.h"

namespace kiln::train {
namespace {

using internal::Manifest;
using internal::ManifestShard;
using internal::ManifestTensor;

constexpr char kStepPrefix[] = "step_";
constexpr char kTmpInfix[] = ".tmp-";
constexpr char kOldInfix[] = ".old-";
// Bytes checksummed and written per Append: large enough for full-speed writes, small enough
// that the CRC pass leaves the chunk in cache for the write.
constexpr size_t kWriteChunk = size_t{4} << 20;

std::string StepDirName(int64_t step) { return absl::StrCat(kStepPrefix, step); }

std::string Hex(uint32_t v) { return absl::StrFormat("0x%08x", v); }

// Where Restore reads tensor `t`: the tensor of `into` with its name, dtype and shape (sharing
// its storage), else a fresh one.
Tensor RestoreTarget(const NamedTensors* into, const ManifestTensor& t) {
  if (into != nullptr) {
    for (const auto& [name, tensor] : *into) {
      if (name == t.name && tensor.dtype() == t.dtype && tensor.shape() == t.shape) return tensor;
    }
  }
  return Tensor(t.dtype, t.shape);
}

int64_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

// For "step_<N>.tmp-<x>" / "step_<N>.old-<x>": the step, else -1.
int64_t ParseSideName(const std::string& name, const char* infix) {
  const size_t pos = name.find(infix);
  if (pos == std::string::npos) return -1;
  return ParseCheckpointDirName(name.substr(0, pos));
}

std::string ShardFileName(size_t i, size_t n) {
  return absl::StrFormat("shard-%05d-of-%05d.safetensors", i, n);
}

}  // namespace

int64_t ParseCheckpointDirName(const std::string& name) {
  const size_t p = std::strlen(kStepPrefix);
  if (name.size() <= p || name.compare(0, p, kStepPrefix) != 0) return -1;
  const std::string digits = name.substr(p);
  if (digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return -1;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

struct CheckpointManager::Job {
  int64_t step = 0;
  const NamedTensors* tensors = nullptr;
  nlohmann::json metadata;
  int64_t blocking_micros = 0;
};

CheckpointManager::CheckpointManager(std::string root, CheckpointOptions options)
    : root_(std::move(root)),
      options_(options),
      env_(options.env != nullptr ? options.env : Env::Default()) {}

CheckpointManager::~CheckpointManager() { Join(); }

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    const std::string& root, CheckpointOptions options) {
  if (root.empty()) return absl::InvalidArgumentError("checkpoint root directory is empty");
  if (options.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint keep_last must be >= 1, got ", options.keep_last));
  }
  if (options.keep_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint keep_every must be >= 0, got ", options.keep_every));
  }
  if (options.shard_bytes == 0) {
    return absl::InvalidArgumentError("checkpoint shard_bytes must be > 0");
  }
  std::unique_ptr<CheckpointManager> m(new CheckpointManager(CleanPath(root), options));
  if (options.read_only) return m;
  // Create the root, and make each new directory's entry durable: otherwise a crash could take
  // the root, and every checkpoint in it, away after saves had returned OK.
  std::vector<std::string> created;
  for (std::string p = m->root_; !p.empty() && p != "/" && p != "." && !m->env_->FileExists(p);
       p = Dirname(p)) {
    created.push_back(p);
  }
  KILN_RETURN_IF_ERROR(m->env_->CreateDir(m->root_));
  for (const std::string& p : created) {
    const std::string parent = Dirname(p);
    KILN_RETURN_IF_ERROR(m->env_->SyncDir(parent.empty() ? "." : parent));
  }
  KILN_RETURN_IF_ERROR(Annotate(m->Recover(), "checkpoint directory " + m->root_));
  return m;
}

absl::Status CheckpointManager::Recover() {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->GetChildren(root_));
  const std::set<std::string> present(names.begin(), names.end());
  std::set<std::string> restored;
  bool changed = false;
  for (const std::string& name : names) {
    const std::string path = JoinPath(root_, name);
    if (ParseSideName(name, kTmpInfix) >= 0) {
      // An interrupted save.
      KILN_ASSIGN_OR_RETURN(bool is_dir, env_->IsDirectory(path));
      KILN_RETURN_IF_ERROR(is_dir ? env_->DeleteDir(path) : env_->DeleteFile(path));
      open_notes_.push_back("removed " + name + ", left by an interrupted save");
      changed = true;
      continue;
    }
    const int64_t step = ParseSideName(name, kOldInfix);
    if (step < 0) continue;
    // A checkpoint that was being replaced: put it back unless its replacement committed.
    const std::string final_name = StepDirName(step);
    if (present.count(final_name) || restored.count(final_name)) {
      KILN_RETURN_IF_ERROR(env_->DeleteDir(path));
      open_notes_.push_back("removed " + name + ", replaced by a newer " + final_name);
    } else {
      KILN_RETURN_IF_ERROR(env_->RenameFile(path, JoinPath(root_, final_name)));
      restored.insert(final_name);
      open_notes_.push_back("restored " + final_name + " from " + name +
                            " (its replacement was interrupted)");
    }
    changed = true;
  }
  if (changed) KILN_RETURN_IF_ERROR(env_->SyncDir(root_));
  return absl::OkStatus();
}

void CheckpointManager::Join() {
  if (!worker_.joinable()) return;
  worker_.join();
}

absl::Status CheckpointManager::ConsumePending(int64_t next_step) {
  Join();
  if (pending_status_.ok()) return absl::OkStatus();
  absl::Status s =
      Annotate(pending_status_, absl::StrCat("previous checkpoint save (step ", pending_step_,
                                             ") failed, so step ", next_step, " was not saved"));
  pending_status_ = absl::OkStatus();
  return s;
}

absl::Status CheckpointManager::Wait() {
  Join();
  absl::Status s = pending_status_;
  pending_status_ = absl::OkStatus();
  return s;
}

absl::Status CheckpointManager::ValidateRequest(int64_t step, const NamedTensors& tensors,
                                                const nlohmann::json& metadata,
                                                std::string* metadata_text) const {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("checkpoint step ", step, " < 0"));
  std::set<std::string> names;
  nlohmann::json all_names = nlohmann::json::array();
  for (const auto& [name, t] : tensors) {
    if (name.empty()) return absl::InvalidArgumentError("checkpoint: empty tensor name");
    if (name == "__metadata__") {
      return absl::InvalidArgumentError("checkpoint: '__metadata__' is not a tensor name");
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: tensor name '", name, "' given more than once"));
    }
    all_names.push_back(name);
  }
  try {
    (void)all_names.dump();
    *metadata_text = metadata.dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: tensor names and metadata must be valid UTF-8: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointManager::Save(int64_t step, const NamedTensors& tensors,
                                     const nlohmann::json& metadata) {
  KILN_RETURN_IF_ERROR(ConsumePending(step));
  std::string metadata_text;
  KILN_RETURN_IF_ERROR(ValidateRequest(step, tensors, metadata, &metadata_text));
  Job job;
  job.step = step;
  job.tensors = &tensors;
  KILN_ASSIGN_OR_RETURN(job.metadata, Stamp(metadata));
  SaveInfo info;
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = WriteAndCommit(job, &info);
  info.write_micros = MicrosSince(t0);
  info.blocking_micros = info.write_micros;
  last_info_ = std::move(info);
  return s;
}

absl::Status CheckpointManager::SaveAsync(int64_t step, const NamedTensors& tensors,
                                          const nlohmann::json& metadata) {
  KILN_RETURN_IF_ERROR(ConsumePending(step));
  std::string metadata_text;
  KILN_RETURN_IF_ERROR(ValidateRequest(step, tensors, metadata, &metadata_text));
  KILN_ASSIGN_OR_RETURN(nlohmann::json stamped, Stamp(metadata));
  const auto t0 = std::chrono::steady_clock::now();
  EnsureStaging(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& src = tensors[i].second;
    if (src.byte_size() > 0) {
      std::memcpy(staging_[i].second.raw_data(), src.raw_data(),
                  static_cast<size_t>(src.byte_size()));
    }
  }
  Job job;
  job.step = step;
  job.tensors = &staging_;
  job.metadata = std::move(stamped);
  job.blocking_micros = MicrosSince(t0);
  pending_step_ = step;
  try {
    worker_ = std::thread([this, job = std::move(job)] {
      SaveInfo info;
      const auto w0 = std::chrono::steady_clock::now();
      absl::Status s = WriteAndCommit(job, &info);
      info.write_micros = MicrosSince(w0);
      info.blocking_micros = job.blocking_micros;
      // Only the owner thread reads these, after joining.
      pending_status_ = std::move(s);
      last_info_ = std::move(info);
    });
  } catch (const std::system_error& e) {
    return absl::InternalError(
        absl::StrCat("checkpoint step ", step, ": cannot start the writer thread: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> CheckpointManager::Stamp(const nlohmann::json& metadata) const {
  if (options_.run_id.empty()) return metadata;
  if (!metadata.is_object()) {
    return absl::InvalidArgumentError(
        "checkpoint: metadata must be a JSON object when CheckpointOptions::run_id is set");
  }
  nlohmann::json m = metadata;
  m["run_id"] = options_.run_id;
  return m;
}

bool CheckpointManager::OfThisRun(int64_t step, std::string* other) {
  other->clear();
  if (options_.run_id.empty()) return true;
  absl::StatusOr<nlohmann::json> meta =
      ReadCheckpointMetadata(JoinPath(root_, StepDirName(step)), env_);
  if (!meta.ok()) {
    *other = "(unreadable manifest)";
    return false;
  }
  const std::string id = CheckpointRunId(*meta);
  if (id.empty() || id == options_.run_id) return true;
  *other = id;
  return false;
}

void CheckpointManager::EnsureStaging(const NamedTensors& like) {
  // Reuse each buffer whose dtype and shape still fit; allocate the others.
  staging_.resize(like.size());
  for (size_t i = 0; i < like.size(); ++i) {
    const Tensor& src = like[i].second;
    auto& [name, dst] = staging_[i];
    name = like[i].first;
    if (dst.dtype() != src.dtype() || dst.shape().dims() != src.shape().dims()) {
      dst = Tensor(src.dtype(), src.shape());
    }
  }
}

void CheckpointManager::ReserveStaging(const NamedTensors& like) {
  Join();
  EnsureStaging(like);
}

absl::Status CheckpointManager::WriteAndCommit(const Job& job, SaveInfo* info) {
  const NamedTensors& tensors = *job.tensors;
  const std::string final_name = StepDirName(job.step);
  const std::string final_dir = JoinPath(root_, final_name);
  const std::string nonce = absl::StrFormat("%016x", env_->RandomU64());
  const std::string tmp_dir = JoinPath(root_, final_name + kTmpInfix + nonce);
  const std::string context = "checkpoint step " + std::to_string(job.step);
  info->step = job.step;
  info->path = final_dir;

  // Group tensors into shards by the byte budget, keeping their order.
  std::vector<std::vector<size_t>> groups;
  uint64_t group_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = static_cast<uint64_t>(tensors[i].second.byte_size());
    if (groups.empty() || (!groups.back().empty() && group_bytes + b > options_.shard_bytes)) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(i);
    group_bytes += b;
    info->bytes += b;
  }
  info->shards = static_cast<int>(groups.size());

  Manifest manifest;
  manifest.format_version = kCheckpointFormatVersion;
  manifest.step = job.step;
  manifest.created_micros = env_->NowMicros();
  manifest.metadata = job.metadata;

  auto write_tmp = [&]() -> absl::Status {
    KILN_RETURN_IF_ERROR(env_->CreateDir(tmp_dir));
    for (size_t g = 0; g < groups.size(); ++g) {
      ManifestShard shard;
      shard.file = ShardFileName(g, groups.size());
      std::vector<internal::ShardEntry> entries;
      for (size_t i : groups[g]) {
        const Tensor& t = tensors[i].second;
        entries.push_back(
            {tensors[i].first, t.dtype(), t.shape(), static_cast<uint64_t>(t.byte_size())});
      }
      KILN_ASSIGN_OR_RETURN(std::string header,
                            internal::BuildShardHeader(entries, {{"format", "pt"}}));
      const std::string path = JoinPath(tmp_dir, shard.file);
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env_->NewWritableFile(path));
      KILN_RETURN_IF_ERROR(file->Append(header));
      uint32_t shard_crc = crc32c::Value(header.data(), header.size());
      uint64_t offset = header.size();
      for (size_t i : groups[g]) {
        const Tensor& t = tensors[i].second;
        const char* p = static_cast<const char*>(t.raw_data());
        const uint64_t n = static_cast<uint64_t>(t.byte_size());
        uint32_t crc = 0;
        for (uint64_t done = 0; done < n;) {
          const size_t k = static_cast<size_t>(std::min<uint64_t>(kWriteChunk, n - done));
          crc = crc32c::Extend(crc, p + done, k);
          KILN_RETURN_IF_ERROR(file->Append(std::string_view(p + done, k)));
          done += k;
        }
        shard_crc = crc32c::Combine(shard_crc, crc, n);
        manifest.tensors.push_back(
            {tensors[i].first, static_cast<int>(g), t.dtype(), t.shape(), offset, n, crc});
        offset += n;
      }
      KILN_RETURN_IF_ERROR(file->Sync());
      KILN_RETURN_IF_ERROR(file->Close());
      shard.bytes = offset;
      shard.crc32c = shard_crc;
      manifest.shards.push_back(std::move(shard));
    }
    KILN_ASSIGN_OR_RETURN(std::string manifest_text, internal::EncodeManifest(manifest));
    KILN_RETURN_IF_ERROR(WriteStringToFile(env_, manifest_text,
                                           JoinPath(tmp_dir, kCheckpointManifestName),
                                           /*sync=*/true));
    return env_->SyncDir(tmp_dir);
  };

  absl::Status s = write_tmp();
  if (!s.ok()) {
    (void)env_->DeleteDir(tmp_dir);  // best effort; Open() removes it otherwise
    return Annotate(s, context);
  }

  // Commit. Replacing a checkpoint of the same step goes through a side name that Open() puts
  // back if the process dies between the two renames.
  std::string old_dir;
  if (env_->FileExists(final_dir)) {
    old_dir = JoinPath(root_, final_name + kOldInfix + nonce);
    s = env_->RenameFile(final_dir, old_dir);
    if (!s.ok()) {
      (void)env_->DeleteDir(tmp_dir);
      return Annotate(s, context);
    }
  }
  s = env_->RenameFile(tmp_dir, final_dir);
  if (!s.ok()) {
    if (!old_dir.empty()) (void)env_->RenameFile(old_dir, final_dir);
    (void)env_->DeleteDir(tmp_dir);
    return Annotate(s, context);
  }
  s = env_->SyncDir(root_);
  if (!s.ok()) {
    return Annotate(s, context + " (renamed into place, but the rename may not survive a crash)");
  }
  if (!old_dir.empty()) {
    absl::Status d = env_->DeleteDir(old_dir);
    if (!d.ok()) info->notes.push_back("could not delete the replaced checkpoint: " + d.ToString());
  }
  KILN_RETURN_IF_ERROR(ApplyRetention(job.step, info));
  return absl::OkStatus();
}

absl::Status CheckpointManager::ApplyRetention(int64_t just_saved, SaveInfo* info) {
  absl::StatusOr<std::vector<int64_t>> steps = Steps();
  if (!steps.ok()) {
    info->notes.push_back("retention skipped: " + steps.status().ToString());
    return absl::OkStatus();
  }
  // Only this run's checkpoints count and can go: another run's (or one whose manifest cannot be
  // read, so whose run is unknown) is never deleted by this one.
  std::vector<int64_t> own;
  std::string other;
  for (int64_t step : *steps) {
    if (step == just_saved || OfThisRun(step, &other)) own.push_back(step);
  }
  const size_t n = own.size();
  const size_t keep_from =
      n > static_cast<size_t>(options_.keep_last) ? n - static_cast<size_t>(options_.keep_last) : 0;
  bool deleted = false;
  for (size_t i = 0; i < keep_from; ++i) {
    const int64_t step = own[i];
    if (step == just_saved) continue;
    if (options_.keep_every > 0 && step % options_.keep_every == 0) continue;
    absl::Status s = env_->DeleteDir(JoinPath(root_, StepDirName(step)));
    if (s.ok()) {
      info->deleted_steps.push_back(step);
      deleted = true;
    } else {
      info->notes.push_back(
          absl::StrCat("retention: could not delete step ", step, ": ", s.ToString()));
    }
  }
  if (deleted) {
    absl::Status s = env_->SyncDir(root_);
    if (!s.ok()) info->notes.push_back("retention: " + s.ToString());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CheckpointManager::Steps() {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->GetChildren(root_));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    const int64_t step = ParseCheckpointDirName(name);
    if (step >= 0) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<Checkpoint> CheckpointManager::Restore(int64_t step) {
  Join();
  return Load(step);
}

absl::StatusOr<Checkpoint> CheckpointManager::RestoreLatest() {
  Join();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> steps, Steps());
  if (steps.empty()) return absl::NotFoundError("no checkpoints in " + root_);
  std::vector<std::string> notes;
  bool damaged = false;
  for (size_t i = steps.size(); i-- > 0;) {
    std::string other;
    if (!OfThisRun(steps[i], &other) && other != "(unreadable manifest)") {
      notes.push_back(absl::StrCat("skipped ", StepDirName(steps[i]), ": it belongs to run ", other,
                                   ", not to this run (", options_.run_id, ")"));
      continue;
    }
    absl::StatusOr<Checkpoint> c = Load(steps[i]);
    if (c.ok()) {
      c->notes = std::move(notes);
      return c;
    }
    const absl::StatusCode code = c.status().code();
    if (code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kNotFound) {
      return c.status();
    }
    notes.push_back("skipped " + StepDirName(steps[i]) + ": " + c.status().ToString());
    damaged = true;
  }
  std::string all;
  for (const std::string& n : notes) absl::StrAppend(&all, "\n  ", n);
  if (!damaged) return absl::NotFoundError("no checkpoints of this run in " + root_ + ":" + all);
  return absl::DataLossError("no checkpoint in " + root_ + " verifies:" + all);
}

absl::StatusOr<Checkpoint> CheckpointManager::Load(int64_t step) {
  const std::string dir = JoinPath(root_, StepDirName(step));
  const std::string where = absl::StrCat("checkpoint step ", step, " (", dir, ")");
  if (!env_->FileExists(dir)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint of step ", step, " in ", root_));
  }
  const std::string manifest_path = JoinPath(dir, kCheckpointManifestName);
  absl::StatusOr<std::string> text = ReadFileToString(env_, manifest_path);
  if (!text.ok()) {
    if (text.status().code() == absl::StatusCode::kNotFound) {
      return absl::DataLossError(where + ": " + manifest_path + " is missing");
    }
    return Annotate(text.status(), where);
  }
  KILN_ASSIGN_OR_RETURN(Manifest m, internal::DecodeManifest(*text, manifest_path));
  if (m.step != step) {
    return absl::DataLossError(
        absl::StrCat(where, ": the manifest says step ", m.step, ", the directory ", step));
  }
  Checkpoint out;
  out.step = step;
  out.path = dir;
  out.metadata = std::move(m.metadata);
  if (m.format_version >= 2) {
    KILN_RETURN_IF_ERROR(LoadPieces(dir, out));
    return out;
  }

  std::vector<char> scratch;  // for the tensors not kept
  std::vector<std::vector<const ManifestTensor*>> by_shard(m.shards.size());
  for (const ManifestTensor& t : m.tensors) by_shard[t.shard].push_back(&t);
  for (size_t si = 0; si < m.shards.size(); ++si) {
    const ManifestShard& shard = m.shards[si];
    const std::string path = JoinPath(dir, shard.file);
    auto corrupt = [&](const std::string& what) {
      return internal::ShardCorrupt(where, path, what);
    };
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                          internal::OpenShard(env_, path, shard, where));
    // The safetensors prefix: its length, and the header JSON.
    KILN_ASSIGN_OR_RETURN(std::string header,
                          ReadSafetensorsPrefix(*file, shard.bytes, where + ": " + path));
    const uint64_t n = header.size() - 8;
    std::vector<const ManifestTensor*>& ts = by_shard[si];
    std::sort(ts.begin(), ts.end(), [](const ManifestTensor* a, const ManifestTensor* b) {
      return a->offset < b->offset;
    });
    // Tensors must tile the data buffer in order, so the shard CRC can be built from theirs.
    uint64_t expect_offset = 8 + n;
    for (const ManifestTensor* t : ts) {
      if (t->offset != expect_offset) {
        return corrupt("tensor '" + t->name + "' is not where the manifest's layout puts it");
      }
      expect_offset += t->bytes;
    }
    KILN_RETURN_IF_ERROR(internal::CheckShardHeader(std::string_view(header).substr(8), 8 + n,
                                                    shard.bytes - 8 - n, ts, where + ": " + path));
    uint32_t shard_crc = crc32c::Value(header.data(), header.size());
    for (const ManifestTensor* t : ts) {
      // A tensor the caller does not keep is verified through one chunk-sized buffer.
      const bool keep = !restore_keep_ || restore_keep_(t->name);
      Tensor tensor = keep ? RestoreTarget(restore_into_, *t) : Tensor();
      char* dst = keep ? static_cast<char*>(tensor.raw_data()) : nullptr;
      KILN_ASSIGN_OR_RETURN(uint32_t crc,
                            internal::ReadEntry(*file, path, *t, dst, where, &scratch));
      if (crc != t->crc32c) {
        return corrupt(absl::StrCat("tensor '", t->name, "': CRC32C mismatch (manifest ",
                                    Hex(t->crc32c), ", data ", Hex(crc), ")"));
      }
      shard_crc = crc32c::Combine(shard_crc, crc, t->bytes);
      if (keep) out.tensors.emplace(t->name, std::move(tensor));
    }
    if (shard_crc != shard.crc32c) {
      return corrupt(absl::StrCat("shard CRC32C mismatch (manifest ", Hex(shard.crc32c), ", file ",
                                  Hex(shard_crc), "): the header is damaged"));
    }
  }
  return out;
}

absl::StatusOr<nlohmann::json> ReadCheckpointMetadata(const std::string& step_dir, Env* env) {
  if (env == nullptr) env = Env::Default();
  const std::string path = JoinPath(step_dir, kCheckpointManifestName);
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  KILN_ASSIGN_OR_RETURN(Manifest m, internal::DecodeManifest(text, path));
  return std::move(m.metadata);
}

std::string CheckpointRunId(const nlohmann::json& metadata) {
  if (!metadata.is_object()) return "";
  auto it = metadata.find("run_id");
  if (it == metadata.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

}  // namespace kiln::train
