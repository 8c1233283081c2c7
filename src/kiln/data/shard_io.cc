#include "kiln/data/shard_io.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <regex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/coding.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset.h"
#include "kiln/data/import_util.h"

namespace kiln::data {
namespace {

std::string StatePath(const std::string& dir, const std::string& file) {
  return JoinPath(JoinPath(dir, kImportStateDir), file + ".json");
}

bool IsShardName(const std::string& name) {
  static const std::regex re(R"(^\.?[A-Za-z0-9_]+-\d{5}-of-\d{5}\.tfrecord(\.partial)?$)");
  return std::regex_match(name, re);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(Env* env, const std::string& dir,
                                                                 const std::string& file) {
  std::unique_ptr<ShardWriter> w(new ShardWriter());
  w->env_ = env;
  w->dir_ = dir;
  w->file_ = file;
  w->tmp_ = JoinPath(dir, "." + file + ".partial");
  KILN_ASSIGN_OR_RETURN(w->out_, OpenAppendFile(env, w->tmp_, WriteMode::kTruncate));
  return w;
}

absl::Status ShardWriter::Write(std::string_view payload) {
  frame_.clear();
  AppendRecordHeader(payload.size(), &frame_);
  const uint32_t data_crc = crc32c::Mask(crc32c::Value(payload.data(), payload.size()));
  char footer[4];
  EncodeFixed32(footer, data_crc);
  KILN_RETURN_IF_ERROR(out_->Append(frame_));
  KILN_RETURN_IF_ERROR(out_->Append(payload));
  KILN_RETURN_IF_ERROR(out_->Append(std::string_view(footer, 4)));
  crc_ = crc32c::Extend(crc_, frame_.data(), frame_.size());
  crc_ = crc32c::Extend(crc_, payload.data(), payload.size());
  crc_ = crc32c::Extend(crc_, footer, 4);
  bytes_ += frame_.size() + payload.size() + 4;
  ++examples_;
  return absl::OkStatus();
}

absl::StatusOr<ShardEntry> ShardWriter::Finish(bool sync) {
  if (sync) KILN_RETURN_IF_ERROR(out_->Sync());
  KILN_RETURN_IF_ERROR(out_->Close());
  // No SyncDir per shard: WriteManifest's SyncDir at the end makes every rename durable, and
  // before that a lost rename only means the shard is rewritten on resume.
  KILN_RETURN_IF_ERROR(env_->RenameFile(tmp_, JoinPath(dir_, file_)));
  ShardEntry e;
  e.file = file_;
  e.examples = examples_;
  e.bytes = bytes_;
  e.crc32c = crc_;
  return e;
}

absl::Status SaveShardState(Env* env, const std::string& dir, const ShardEntry& entry,
                            const std::string& plan, const nlohmann::json& state) {
  const std::string state_dir = JoinPath(dir, kImportStateDir);
  KILN_RETURN_IF_ERROR(env->CreateDir(state_dir));
  nlohmann::json j = {{"plan", plan},         {"file", entry.file},
                      {"split", entry.split}, {"examples", entry.examples},
                      {"bytes", entry.bytes}, {"crc32c", Hex32(entry.crc32c)},
                      {"state", state}};
  const std::string path = StatePath(dir, entry.file);
  // Not fsynced: a state lost or torn in a crash only means its shard is rewritten on resume (a
  // kept shard is always re-verified against the size and CRC32C recorded here).
  KILN_RETURN_IF_ERROR(WriteStringToFile(env, j.dump() + "\n", path + ".tmp", /*sync=*/false));
  return env->RenameFile(path + ".tmp", path);
}

absl::StatusOr<std::optional<FinishedShard>> LoadShardState(Env* env, const std::string& dir,
                                                            const std::string& file,
                                                            const std::string& plan) {
  const std::string shard = JoinPath(dir, file);
  const std::string path = StatePath(dir, file);
  if (!env->FileExists(shard)) return std::optional<FinishedShard>();
  if (!env->FileExists(path)) {
    KILN_LOG(INFO) << "rewriting " << shard << ": no record that it was finished";
    return std::optional<FinishedShard>();
  }
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  FinishedShard f;
  try {
    if (j.is_discarded() || j.at("plan").get<std::string>() != plan) {
      KILN_LOG(INFO) << "rewriting " << shard
                     << ": written by an import with other inputs or options";
      return std::optional<FinishedShard>();
    }
    f.entry.file = file;
    f.entry.split = j.at("split").get<std::string>();
    f.entry.examples = j.at("examples").get<int64_t>();
    f.entry.bytes = j.at("bytes").get<uint64_t>();
    f.entry.crc32c =
        static_cast<uint32_t>(std::stoul(j.at("crc32c").get<std::string>(), nullptr, 16));
    f.state = j.at("state");
  } catch (const std::exception& e) {
    KILN_LOG(WARNING) << "rewriting " << shard << ": its state " << path << " is malformed";
    return std::optional<FinishedShard>();
  }
  KILN_ASSIGN_OR_RETURN(FileChecksum c, ChecksumFile(env, shard));
  if (c.bytes != f.entry.bytes || c.crc32c != f.entry.crc32c) {
    KILN_LOG(WARNING) << "rewriting " << shard << ": its size or CRC32C no longer matches ("
                      << c.bytes << " bytes, crc32c " << Hex32(c.crc32c) << "; expected "
                      << f.entry.bytes << ", " << Hex32(f.entry.crc32c) << ")";
    return std::optional<FinishedShard>();
  }
  return std::optional<FinishedShard>(std::move(f));
}

absl::Status RemoveStaleShards(Env* env, const std::string& dir,
                               const std::vector<std::string>& keep) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(dir));
  for (const std::string& name : names) {
    if (!IsShardName(name)) continue;
    bool kept = false;
    for (const std::string& k : keep) kept = kept || k == name;
    if (kept) continue;
    if (name[0] == '.') {
      KILN_LOG(INFO) << "removing " << JoinPath(dir, name)
                     << " (a partial shard left by an interrupted run)";
    } else {
      KILN_LOG(INFO) << "removing " << JoinPath(dir, name) << " (not part of this import)";
    }
    KILN_RETURN_IF_ERROR(env->DeleteFile(JoinPath(dir, name)));
    const std::string state = StatePath(dir, name);
    if (env->FileExists(state)) KILN_RETURN_IF_ERROR(env->DeleteFile(state));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FinishedShard>> WriteShards(Env* env, const std::string& dir,
                                                       const std::string& plan,
                                                       const std::vector<PlannedShard>& shards,
                                                       const ProduceShardFn& produce, int* kept,
                                                       const std::function<void(size_t)>& on_kept,
                                                       double* sync_seconds) {
  KILN_RETURN_IF_ERROR(env->CreateDir(dir));
  const std::string manifest = JoinPath(dir, kManifestName);
  if (env->FileExists(manifest)) KILN_RETURN_IF_ERROR(env->DeleteFile(manifest));
  std::vector<std::string> names;
  for (const PlannedShard& p : shards) names.push_back(p.file);
  KILN_RETURN_IF_ERROR(RemoveStaleShards(env, dir, names));
  std::vector<FinishedShard> out;
  int n_kept = 0;
  std::vector<std::string> written;
  for (size_t i = 0; i < shards.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::optional<FinishedShard> done,
                          LoadShardState(env, dir, shards[i].file, plan));
    if (done.has_value() && done->entry.split == shards[i].split) {
      ++n_kept;
      if (on_kept) on_kept(i);
      out.push_back(std::move(*done));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> w,
                          ShardWriter::Create(env, dir, shards[i].file));
    FinishedShard f;
    KILN_RETURN_IF_ERROR(produce(i, *w, &f.state));
    KILN_ASSIGN_OR_RETURN(f.entry, w->Finish(/*sync=*/false));
    written.push_back(JoinPath(dir, shards[i].file));
    f.entry.split = shards[i].split;
    KILN_RETURN_IF_ERROR(SaveShardState(env, dir, f.entry, plan, f.state));
    out.push_back(std::move(f));
  }
  if (kept != nullptr) *kept = n_kept;
  // fsync on a new descriptor flushes the file's data written through the closed one.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<absl::Status> synced(written.size());
  ParallelFor(std::min<int>(8, static_cast<int>(written.size())),
              static_cast<int64_t>(written.size()), [&](int64_t i) {
                absl::StatusOr<std::unique_ptr<WritableFile>> f =
                    env->NewAppendableFile(written[i]);
                synced[i] = f.ok() ? (*f)->Sync() : f.status();
                if (f.ok() && synced[i].ok()) synced[i] = (*f)->Close();
              });
  for (const absl::Status& st : synced) KILN_RETURN_IF_ERROR(st);
  if (sync_seconds != nullptr) {
    *sync_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

int ShardCount(int64_t examples, int requested, double fraction, bool train) {
  if (examples <= 0) return 0;
  int64_t n = train ? requested : static_cast<int64_t>(std::ceil(requested * fraction));
  return static_cast<int>(std::clamp<int64_t>(n, 1, examples));
}

ShardPlan PlanSplits(int64_t n, double held_out, int shards, uint64_t seed, bool sorted) {
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> perm = Permutation(n, rng);
  const int64_t n_held = std::llround(held_out * static_cast<double>(n));
  ShardPlan plan;
  for (const bool train : {true, false}) {
    std::vector<int64_t> items = train ? std::vector<int64_t>(perm.begin() + n_held, perm.end())
                                       : std::vector<int64_t>(perm.begin(), perm.begin() + n_held);
    if (sorted) std::sort(items.begin(), items.end());
    const std::string split = train ? "train" : "held_out";
    const int64_t m = static_cast<int64_t>(items.size());
    const int count = ShardCount(m, shards, held_out, train);
    for (int k = 0; k < count; ++k) {
      plan.shards.push_back({ShardFileName(split, k, count), split});
      plan.items.emplace_back(items.begin() + k * m / count, items.begin() + (k + 1) * m / count);
    }
  }
  return plan;
}

int ResolveThreads(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

absl::StatusOr<std::unique_ptr<ExampleReader>> ExampleReader::Open(Env* env,
                                                                   const std::string& path) {
  std::unique_ptr<ExampleReader> r(new ExampleReader());
  r->path_ = path;
  KILN_ASSIGN_OR_RETURN(r->reader_, RecordReader::Open(env, path));
  return r;
}

absl::StatusOr<bool> ExampleReader::NextPayload(std::string* payload) {
  absl::StatusOr<bool> got = reader_->Read(payload);
  if (got.ok()) return *got;
  if (got.status().code() == absl::StatusCode::kOutOfRange) {
    return absl::DataLossError(got.status().message());  // a finished shard never grows
  }
  return got.status();
}

absl::StatusOr<bool> ExampleReader::Next(Example* example) {
  const uint64_t at = reader_->offset();
  KILN_ASSIGN_OR_RETURN(bool got, NextPayload(&payload_));
  if (!got) return false;
  absl::StatusOr<Example> ex = DecodeExample(payload_);
  if (!ex.ok()) {
    return absl::DataLossError(
        absl::StrCat(path_, " record at offset ", at, ": ", ex.status().message()));
  }
  *example = std::move(*ex);
  return true;
}

}  // namespace kiln::data
