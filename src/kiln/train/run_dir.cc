#include "kiln/train/run_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kiln/base/status.h"
#include "kiln/train/checkpoint.h"
#include "nlohmann/json.hpp"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;

// The entries of OUTDIR that `kiln train` writes (docs/train.md "Output directory").
bool IsRunEntry(const std::string& name) {
  return name == "config.yaml" || name == "run.json" || name == "metrics.jsonl" ||
         name == "checkpoints" || name == "trace.json" || name == "config.yaml.tmp" ||
         name == "run.json.tmp" || name.rfind("events.out.tfevents.", 0) == 0;
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunDirLock>> RunDirLock::Acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("output_dir: cannot create ", dir, ": ", ec.message()));
  }
  const std::string path = (fs::path(dir) / kRunLockName).string();
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("output_dir: cannot open the run lock ", path, ": ", strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = ReadSmallFile(path);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    close(fd);
    if (err == EWOULDBLOCK) {
      std::string who = holder.empty() ? "another process" : "process " + holder;
      return absl::FailedPreconditionError(absl::StrCat(
          dir, " is in use by another kiln train (", who, " holds ", path,
          "); two trainers in one folder would mix their runs. Wait for it to finish, stop it (",
          holder.empty() ? "kill it" : "kill " + holder,
          ": it checkpoints and exits 75), or choose another --output-dir"));
    }
    return absl::InternalError(absl::StrCat("cannot lock ", path, ": ", strerror(err)));
  }
  // Ours now: record the pid for the message a second trainer prints.
  std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The lock holds regardless; only the message of a refused trainer gets less specific.
  }
  return std::unique_ptr<RunDirLock>(new RunDirLock(fd, path));
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) close(fd_);  // drops the flock
}

std::string ReadRunJsonId(const std::string& dir) {
  std::string text = ReadSmallFile((fs::path(dir) / "run.json").string());
  if (text.empty()) return "";
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("run_id") || !j["run_id"].is_string()) {
    return "";
  }
  return j["run_id"].get<std::string>();
}

absl::StatusOr<PreviousRun> InspectRunDir(const std::string& dir) {
  PreviousRun r;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return r;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (IsRunEntry(name)) r.entries.push_back(name);
  }
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  }
  std::sort(r.entries.begin(), r.entries.end());
  const fs::path ckpts = fs::path(dir) / "checkpoints";
  for (const auto& e : fs::directory_iterator(ckpts, ec)) {
    const int64_t step = ParseCheckpointDirName(e.path().filename().string());
    if (step >= 0) r.steps.push_back(step);
  }
  std::sort(r.steps.begin(), r.steps.end());
  // An empty checkpoints/ (or only the lock) is not a run worth protecting; any of the files a
  // run writes is.
  for (const std::string& n : r.entries) {
    if (n != "checkpoints" || !r.steps.empty()) r.exists = true;
  }
  r.run_id = ReadRunJsonId(dir);
  for (size_t i = r.steps.size(); r.run_id.empty() && i-- > 0;) {
    absl::StatusOr<nlohmann::json> meta =
        ReadCheckpointMetadata((ckpts / absl::StrCat("step_", r.steps[i])).string());
    if (meta.ok() && meta->is_object() && meta->contains("run_id") &&
        (*meta)["run_id"].is_string()) {
      r.run_id = (*meta)["run_id"].get<std::string>();
    }
  }
  return r;
}

absl::StatusOr<std::string> MoveRunAside(const std::string& dir) {
  absl::StatusOr<PreviousRun> prev = InspectRunDir(dir);
  if (!prev.ok()) return prev.status();
  std::time_t now = std::time(nullptr);
  std::tm tm = {};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  fs::path aside = fs::path(dir) / absl::StrCat("replaced-", stamp);
  std::error_code ec;
  for (int k = 2; fs::exists(aside, ec); ++k) {
    aside = fs::path(dir) / absl::StrCat("replaced-", stamp, "-", k);
  }
  fs::create_directory(aside, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", aside.string(),
                                                    " to move the old run into: ", ec.message()));
  }
  for (const std::string& name : prev->entries) {
    fs::rename(fs::path(dir) / name, aside / name, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("moving the old run aside: rename ", (fs::path(dir) / name).string(), " -> ",
                       (aside / name).string(), ": ", ec.message(),
                       " (what was moved so far is in ", aside.string(), ")"));
    }
  }
  return aside.string();
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
  // SplitMix64 finalizer: spreads the clock and pid bits.
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return absl::StrFormat("%016x", x);
}

}  // namespace kiln::train
