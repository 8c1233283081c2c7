#include "kiln/train/run_dir.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kiln/base/hash.h"
#include "kiln/base/status.h"
#include "kiln/train/checkpoint.h"
#include "nlohmann/json.hpp"

namespace kiln::train {
namespace {

Env* OrDefault(Env* env) { return env != nullptr ? env : Env::Default(); }

// The entries of OUTDIR that `kiln train` writes (docs/train.md "Output directory").
bool IsRunEntry(const std::string& name) {
  return name == "config.yaml" || name == "run.json" || name == "metrics.jsonl" ||
         name == "checkpoints" || name == "trace.json" || name == "config.yaml.tmp" ||
         name == "run.json.tmp" || name.rfind("events.out.tfevents.", 0) == 0;
}

std::string ReadSmallFile(Env* env, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(env, path);
  return text.ok() ? *std::move(text) : std::string();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunDirLock>> RunDirLock::Acquire(const std::string& dir, Env* env) {
  env = OrDefault(env);
  if (absl::Status s = env->CreateDir(dir); !s.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("output_dir: cannot create ", dir, ": ", s.message()));
  }
  const std::string path = JoinPath(dir, kRunLockName);
  absl::StatusOr<std::unique_ptr<FileLock>> lock = env->LockFile(path);
  if (absl::IsUnavailable(lock.status())) {
    std::string holder = ReadSmallFile(env, path);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    std::string who =
        absl::StrCat(holder.empty() ? "another process" : "process " + holder, " holds ", path);
    // A holder writes its pid just after it takes the lock, so a refusal in between reads the
    // pid of the previous holder: do not name it as the holder when no such process runs here.
    int pid = 0;
    if (absl::SimpleAtoi(holder, &pid) && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      who = absl::StrCat("another process holds ", path, "; the pid there, ", holder,
                         ", runs on no process of this machine: a previous holder, the new one "
                         "not having written its own yet, or a trainer on another machine");
      holder.clear();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " is in use by another kiln train (", who,
        "); two trainers in one folder would mix their runs. Wait for it to finish, stop it (",
        holder.empty() ? "kill it" : "kill " + holder,
        ": it checkpoints and exits 75), or choose another --output-dir"));
  }
  if (!lock.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("output_dir: cannot take the run lock ", path, ": ", lock.status().message()));
  }
  // Ours now: record the pid for the message a second trainer prints. The lock holds regardless
  // of this write; only the message of a refused trainer gets less specific if it fails.
  WriteStringToFile(env, absl::StrCat(getpid(), "\n"), path).IgnoreError();
  return std::unique_ptr<RunDirLock>(new RunDirLock(*std::move(lock), path));
}

nlohmann::json ReadRunJson(const std::string& dir, Env* env) {
  std::string text = ReadSmallFile(OrDefault(env), JoinPath(dir, "run.json"));
  nlohmann::json j = text.empty()
                         ? nlohmann::json::object()
                         : nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

std::string ReadRunJsonId(const std::string& dir, Env* env) {
  nlohmann::json j = ReadRunJson(dir, env);
  return j.contains("run_id") && j["run_id"].is_string() ? j["run_id"].get<std::string>() : "";
}

absl::StatusOr<PreviousRun> InspectRunDir(const std::string& dir, Env* env) {
  env = OrDefault(env);
  PreviousRun r;
  absl::StatusOr<bool> is_dir = env->IsDirectory(dir);
  if (!is_dir.ok() || !*is_dir) return r;
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (!names.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot list ", dir, ": ", names.status().message()));
  }
  for (const std::string& name : *names) {
    if (IsRunEntry(name)) r.entries.push_back(name);
  }
  std::sort(r.entries.begin(), r.entries.end());
  const std::string ckpts = JoinPath(dir, "checkpoints");
  if (absl::StatusOr<std::vector<std::string>> steps = env->GetChildren(ckpts); steps.ok()) {
    for (const std::string& name : *steps) {
      const int64_t step = ParseCheckpointDirName(name);
      if (step >= 0) r.steps.push_back(step);
    }
  }
  std::sort(r.steps.begin(), r.steps.end());
  // An empty checkpoints/ (or only the lock) is not a run worth protecting; any of the files a
  // run writes is.
  for (const std::string& n : r.entries) {
    if (n != "checkpoints" || !r.steps.empty()) r.exists = true;
  }
  r.run_id = ReadRunJsonId(dir, env);
  for (size_t i = r.steps.size(); r.run_id.empty() && i-- > 0;) {
    absl::StatusOr<nlohmann::json> meta =
        ReadCheckpointMetadata(JoinPath(ckpts, absl::StrCat("step_", r.steps[i])), env);
    if (meta.ok() && meta->is_object() && meta->contains("run_id") &&
        (*meta)["run_id"].is_string()) {
      r.run_id = (*meta)["run_id"].get<std::string>();
    }
  }
  return r;
}

absl::StatusOr<std::string> MoveRunAside(const std::string& dir, Env* env) {
  env = OrDefault(env);
  absl::StatusOr<PreviousRun> prev = InspectRunDir(dir, env);
  if (!prev.ok()) return prev.status();
  std::time_t now = static_cast<std::time_t>(env->NowMicros() / 1000000);
  std::tm tm = {};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  std::string aside = JoinPath(dir, absl::StrCat("replaced-", stamp));
  for (int k = 2; env->FileExists(aside); ++k) {
    aside = JoinPath(dir, absl::StrCat("replaced-", stamp, "-", k));
  }
  if (absl::Status s = env->CreateDir(aside); !s.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", aside, " to move the old run into: ", s.message()));
  }
  for (const std::string& name : prev->entries) {
    const std::string from = JoinPath(dir, name), to = JoinPath(aside, name);
    if (absl::Status s = env->RenameFile(from, to); !s.ok()) {
      return absl::InternalError(absl::StrCat("moving the old run aside: rename ", from, " -> ", to,
                                              ": ", s.message(), " (what was moved so far is in ",
                                              aside, ")"));
    }
  }
  KILN_RETURN_IF_ERROR(env->SyncDir(dir));
  return aside;
}

RunDirectory::RunDirectory(std::string dir, Env* env)
    : dir_(std::move(dir)), env_(OrDefault(env)) {}

absl::Status RunDirectory::Lock() {
  KILN_ASSIGN_OR_RETURN(lock_, RunDirLock::Acquire(dir_, env_));
  return absl::OkStatus();
}

absl::Status RunDirectory::WriteConfig(const std::string& yaml) const {
  return WriteAtomic(config_path(), yaml);
}

absl::Status RunDirectory::WriteRunJson(const nlohmann::json& info) const {
  return WriteAtomic(run_json_path(), info.dump(2) + "\n");
}

absl::Status RunDirectory::WriteAtomic(const std::string& path, const std::string& text) const {
  const std::string tmp = path + ".tmp";
  KILN_RETURN_IF_ERROR(env_->CreateDir(dir_));
  KILN_RETURN_IF_ERROR(WriteStringToFile(env_, text, tmp, /*sync=*/true));
  absl::Status s = env_->RenameFile(tmp, path);
  if (!s.ok())
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", s.message()));
  return absl::OkStatus();
}

absl::Status FreshStartRefusal(const std::string& dir, const PreviousRun& prev) {
  std::string what = prev.run_id.empty() ? "an earlier run" : "run " + prev.run_id;
  if (!prev.steps.empty()) {
    absl::StrAppend(&what, " with checkpoints step_", prev.steps.front());
    if (prev.steps.size() > 1) absl::StrAppend(&what, "..step_", prev.steps.back());
  } else {
    absl::StrAppend(&what, " (", absl::StrJoin(prev.entries, ", "), ")");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "output_dir ", dir, " already holds ", what,
      "; --no-resume there would start a second run on top of it and mix the two. Drop "
      "--no-resume to resume it, choose another --output-dir, or add --replace to move the "
      "earlier run into ",
      dir, "/replaced-<time>/ (nothing is deleted)"));
}

std::string NewRunId() {
  std::random_device rd;
  uint64_t x = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  x ^= static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  x ^= static_cast<uint64_t>(getpid()) << 17;
  return absl::StrFormat("%016x", SplitMix64(x));  // spreads the clock and pid bits
}

}  // namespace kiln::train
