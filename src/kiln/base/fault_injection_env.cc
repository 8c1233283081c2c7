#include "kiln/base/fault_injection_env.h"

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"

namespace kiln {
namespace {

const char* OpName(FaultInjectionEnv::Op op) {
  switch (op) {
    case FaultInjectionEnv::kCreateFile:
      return "create";
    case FaultInjectionEnv::kAppend:
      return "append to";
    case FaultInjectionEnv::kFlush:
      return "flush";
    case FaultInjectionEnv::kSync:
      return "sync";
    case FaultInjectionEnv::kClose:
      return "close";
    case FaultInjectionEnv::kDeleteFile:
      return "delete";
    case FaultInjectionEnv::kCreateDir:
      return "create directory";
    case FaultInjectionEnv::kDeleteDir:
      return "delete directory";
    case FaultInjectionEnv::kRename:
      return "rename";
    case FaultInjectionEnv::kSyncDir:
      return "sync directory";
    default:
      return "mutate";
  }
}

std::string Parent(const std::string& clean) {
  std::string d = Dirname(clean);
  return d.empty() ? "." : d;
}

bool IsUnder(const std::string& p, const std::string& dir) {
  if (dir == "/") return p.size() > 1 && p[0] == '/';
  return p.size() > dir.size() && p.compare(0, dir.size(), dir) == 0 && p[dir.size()] == '/';
}

// Rewrites `p` if it is `from` or lies under it, as a rename of `from` to `to` moves it.
void Rebase(std::string& p, const std::string& from, const std::string& to) {
  if (p == from) {
    p = to;
  } else if (IsUnder(p, from)) {
    p = to + p.substr(from == "/" ? 0 : from.size());
  }
}

}  // namespace

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionEnv* env, std::unique_ptr<WritableFile> target,
                    std::shared_ptr<FaultInjectionEnv::FileState> state, std::string path)
      : env_(env), target_(std::move(target)), state_(std::move(state)), path_(std::move(path)) {}

  ~FaultWritableFile() override {
    target_.reset();
    std::lock_guard<std::mutex> lock(env_->mu_);
    --env_->open_files_;
  }

  absl::Status Append(std::string_view data) override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    KILN_RETURN_IF_ERROR(env_->CheckFault(FaultInjectionEnv::kAppend, path_));
    KILN_RETURN_IF_ERROR(target_->Append(data));
    state_->size += data.size();
    return absl::OkStatus();
  }
  absl::Status Flush() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    KILN_RETURN_IF_ERROR(env_->CheckFault(FaultInjectionEnv::kFlush, path_));
    return target_->Flush();
  }
  absl::Status Sync() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    KILN_RETURN_IF_ERROR(env_->CheckFault(FaultInjectionEnv::kSync, path_));
    KILN_RETURN_IF_ERROR(target_->Sync());
    state_->synced = state_->size;
    return absl::OkStatus();
  }
  absl::Status Close() override {
    std::lock_guard<std::mutex> lock(env_->mu_);
    KILN_RETURN_IF_ERROR(env_->CheckFault(FaultInjectionEnv::kClose, path_));
    return target_->Close();
  }

 private:
  FaultInjectionEnv* env_;
  std::unique_ptr<WritableFile> target_;
  std::shared_ptr<FaultInjectionEnv::FileState> state_;
  std::string path_;
};

FaultInjectionEnv::FaultInjectionEnv(Env* target) : target_(target) {}
FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::FailNth(uint32_t ops, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  nth_mask_ = ops;
  nth_ = n;
  nth_seen_ = 0;
}

void FaultInjectionEnv::FailAfter(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_after_ = n;
  mutations_since_fail_after_ = 0;
}

void FaultInjectionEnv::ClearFailures() {
  std::lock_guard<std::mutex> lock(mu_);
  fail_after_ = -1;
  nth_ = -1;
  nth_mask_ = 0;
}

int64_t FaultInjectionEnv::mutation_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mutations_;
}

int64_t FaultInjectionEnv::injected_failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

absl::Status FaultInjectionEnv::CheckFault(Op op, const std::string& path) {
  ++mutations_;
  bool fail = false;
  if (fail_after_ >= 0 && mutations_since_fail_after_++ >= fail_after_) fail = true;
  if (nth_ >= 0 && (nth_mask_ & op) != 0 && nth_seen_++ == nth_) fail = true;
  if (!fail) return absl::OkStatus();
  ++injected_;
  return absl::ErrnoToStatus(EIO, absl::StrCat("injected fault: cannot ", OpName(op), " ", path));
}

uint64_t FaultInjectionEnv::SyncedBytesLocked(const std::string& path, uint64_t actual) const {
  auto it = files_.find(path);
  if (it == files_.end()) return actual;
  return std::min(actual, it->second->synced);
}

absl::StatusOr<FaultInjectionEnv::Snapshot> FaultInjectionEnv::TakeSnapshotLocked(
    const std::string& path) {
  Snapshot snap;
  KILN_ASSIGN_OR_RETURN(bool is_dir, target_->IsDirectory(path));
  snap.is_dir = is_dir;
  if (!is_dir) {
    KILN_ASSIGN_OR_RETURN(snap.file_bytes, ReadFileToString(target_, path));
    snap.file_bytes.resize(SyncedBytesLocked(path, snap.file_bytes.size()));
    return snap;
  }
  // Breadth-first walk; parents are recorded before their children.
  std::vector<std::string> queue = {""};
  for (size_t i = 0; i < queue.size(); ++i) {
    const std::string rel = queue[i];
    const std::string abs = rel.empty() ? path : JoinPath(path, rel);
    KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, target_->GetChildren(abs));
    for (const std::string& name : names) {
      const std::string child_rel = rel.empty() ? name : JoinPath(rel, name);
      const std::string child_abs = JoinPath(path, child_rel);
      KILN_ASSIGN_OR_RETURN(bool child_dir, target_->IsDirectory(child_abs));
      if (child_dir) {
        snap.dirs.push_back(child_rel);
        queue.push_back(child_rel);
      } else {
        KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(target_, child_abs));
        bytes.resize(SyncedBytesLocked(child_abs, bytes.size()));
        snap.files[child_rel] = std::move(bytes);
      }
    }
  }
  return snap;
}

absl::Status FaultInjectionEnv::RestoreSnapshotLocked(const std::string& path,
                                                      const Snapshot& snap) {
  if (!snap.is_dir) return WriteStringToFile(target_, snap.file_bytes, path, /*sync=*/true);
  KILN_RETURN_IF_ERROR(target_->CreateDir(path));
  for (const std::string& d : snap.dirs)
    KILN_RETURN_IF_ERROR(target_->CreateDir(JoinPath(path, d)));
  for (const auto& [rel, bytes] : snap.files) {
    KILN_RETURN_IF_ERROR(WriteStringToFile(target_, bytes, JoinPath(path, rel), /*sync=*/true));
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::UndoLocked(size_t index) {
  const Pending& op = pending_[index];
  const std::string where = "simulated crash: cannot undo change to " + op.path;
  switch (op.kind) {
    case Pending::kCreatedFile:
      if (target_->FileExists(op.path)) {
        KILN_RETURN_IF_ERROR(Annotate(target_->DeleteFile(op.path), where));
      }
      return absl::OkStatus();
    case Pending::kCreatedDir:
      if (target_->FileExists(op.path)) {
        KILN_RETURN_IF_ERROR(Annotate(target_->DeleteDir(op.path), where));
      }
      return absl::OkStatus();
    case Pending::kDeletedFile:
    case Pending::kDeletedDir:
      return Annotate(RestoreSnapshotLocked(op.path, op.replaced), where);
    case Pending::kRenamed: {
      KILN_RETURN_IF_ERROR(Annotate(target_->RenameFile(op.path, op.from), where));
      // Earlier changes that the rename moved name their entries by the old paths again.
      for (const Rebased& r : op.rebased) {
        for (size_t i = 0; i < index; ++i) {
          if (pending_[i].id != r.id) continue;
          pending_[i].path = r.path;
          pending_[i].from = r.from;
          pending_[i].unsynced_dirs = r.unsynced_dirs;
        }
      }
      if (op.has_replaced) {
        KILN_RETURN_IF_ERROR(Annotate(RestoreSnapshotLocked(op.path, op.replaced), where));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

size_t FaultInjectionEnv::pending_changes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

absl::Status FaultInjectionEnv::SimulateCrash(size_t keep_oldest) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_files_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("simulated crash: ", open_files_, " file(s) from this Env still open"));
  }
  // Unsynced appends are lost.
  for (const auto& [path, state] : files_) {
    if (state->synced >= state->size || !target_->FileExists(path)) continue;
    KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(target_, path));
    if (bytes.size() <= state->synced) continue;
    bytes.resize(state->synced);
    KILN_RETURN_IF_ERROR(WriteStringToFile(target_, bytes, path, /*sync=*/true));
  }
  // Undurable namespace changes are undone, newest first.
  for (size_t i = pending_.size(); i-- > keep_oldest;) KILN_RETURN_IF_ERROR(UndoLocked(i));
  pending_.clear();
  files_.clear();
  fail_after_ = -1;
  nth_ = -1;
  nth_mask_ = 0;
  return absl::OkStatus();
}

void FaultInjectionEnv::MarkAllDurable() {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.clear();
  for (auto& [path, state] : files_) state->synced = state->size;
}

absl::StatusOr<std::unique_ptr<SequentialFile>> FaultInjectionEnv::NewSequentialFile(
    const std::string& path) {
  return target_->NewSequentialFile(path);
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewRandomAccessFile(
    const std::string& path) {
  return target_->NewRandomAccessFile(path);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(
    const std::string& path) {
  return OpenForWrite(path, OpenMode::kTruncate);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewAppendableFile(
    const std::string& path) {
  return OpenForWrite(path, OpenMode::kAppend);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewExclusiveFile(
    const std::string& path) {
  return OpenForWrite(path, OpenMode::kExclusive);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::OpenForWrite(
    const std::string& path, OpenMode mode) {
  const bool append = mode == OpenMode::kAppend;
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(CheckFault(kCreateFile, path));
  const bool existed = target_->FileExists(p);
  auto state = std::make_shared<FileState>();
  if (append && existed) {
    // What is there already counts as durable, unless this Env wrote it without a Sync.
    absl::StatusOr<uint64_t> size = target_->GetFileSize(p);
    if (size.ok()) state->size = *size;
    auto it = files_.find(p);
    state->synced = it != files_.end() ? std::min(it->second->synced, state->size) : state->size;
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> opened =
      mode == OpenMode::kAppend      ? target_->NewAppendableFile(path)
      : mode == OpenMode::kExclusive ? target_->NewExclusiveFile(path)
                                     : target_->NewWritableFile(path);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, std::move(opened));
  if (!existed) AddPendingLocked(NewPending(Pending::kCreatedFile, p, {Parent(p)}));
  files_[p] = state;
  ++open_files_;
  return std::make_unique<FaultWritableFile>(this, std::move(file), std::move(state), path);
}

bool FaultInjectionEnv::FileExists(const std::string& path) { return target_->FileExists(path); }

absl::StatusOr<bool> FaultInjectionEnv::IsDirectory(const std::string& path) {
  return target_->IsDirectory(path);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::GetChildren(const std::string& dir) {
  return target_->GetChildren(dir);
}

absl::StatusOr<uint64_t> FaultInjectionEnv::GetFileSize(const std::string& path) {
  return target_->GetFileSize(path);
}

absl::Status FaultInjectionEnv::DeleteFile(const std::string& path) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(CheckFault(kDeleteFile, path));
  absl::StatusOr<bool> is_dir = target_->IsDirectory(p);
  if (!is_dir.ok() || *is_dir) return target_->DeleteFile(path);  // the target's own error
  KILN_ASSIGN_OR_RETURN(Snapshot snap, TakeSnapshotLocked(p));
  KILN_RETURN_IF_ERROR(target_->DeleteFile(path));
  Pending op = NewPending(Pending::kDeletedFile, p, {Parent(p)});
  op.has_replaced = true;
  op.replaced = std::move(snap);
  AddPendingLocked(std::move(op));
  files_.erase(p);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::CreateDir(const std::string& dir) {
  const std::string d = CleanPath(dir);
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(CheckFault(kCreateDir, dir));
  std::vector<std::string> missing;  // deepest first
  for (std::string p = d; p != "/" && p != "." && !target_->FileExists(p); p = Parent(p)) {
    missing.push_back(p);
  }
  KILN_RETURN_IF_ERROR(target_->CreateDir(dir));
  for (size_t i = missing.size(); i-- > 0;) {
    AddPendingLocked(NewPending(Pending::kCreatedDir, missing[i], {Parent(missing[i])}));
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::DeleteDir(const std::string& dir) {
  const std::string d = CleanPath(dir);
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(CheckFault(kDeleteDir, dir));
  absl::StatusOr<bool> is_dir = target_->IsDirectory(d);
  if (!is_dir.ok() || !*is_dir) return target_->DeleteDir(dir);  // the target's own error
  KILN_ASSIGN_OR_RETURN(Snapshot snap, TakeSnapshotLocked(d));
  KILN_RETURN_IF_ERROR(target_->DeleteDir(dir));
  Pending op = NewPending(Pending::kDeletedDir, d, {Parent(d)});
  op.has_replaced = true;
  op.replaced = std::move(snap);
  AddPendingLocked(std::move(op));
  for (auto it = files_.begin(); it != files_.end();) {
    it = IsUnder(it->first, d) ? files_.erase(it) : std::next(it);
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  const std::string f = CleanPath(from);
  const std::string t = CleanPath(to);
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(CheckFault(kRename, from + " to " + to));
  Pending op = NewPending(Pending::kRenamed, t, {Parent(f), Parent(t)});
  op.from = f;
  if (f != t && target_->FileExists(t) && target_->FileExists(f)) {
    absl::StatusOr<Snapshot> snap = TakeSnapshotLocked(t);
    if (snap.ok()) {
      op.has_replaced = true;
      op.replaced = std::move(*snap);
    }
  }
  KILN_RETURN_IF_ERROR(target_->RenameFile(from, to));
  if (f == t) return absl::OkStatus();
  // Move the bookkeeping of everything under `from` along with it.
  std::map<std::string, std::shared_ptr<FileState>> moved;
  for (auto it = files_.begin(); it != files_.end();) {
    if (it->first == t || IsUnder(it->first, t)) {
      it = files_.erase(it);  // replaced
    } else if (it->first == f || IsUnder(it->first, f)) {
      std::string p = it->first;
      Rebase(p, f, t);
      moved[p] = it->second;
      it = files_.erase(it);
    } else {
      ++it;
    }
  }
  files_.insert(moved.begin(), moved.end());
  for (Pending& p : pending_) {
    Rebased before{p.id, p.path, p.from, p.unsynced_dirs};
    Rebase(p.path, f, t);
    if (p.kind == Pending::kRenamed) Rebase(p.from, f, t);
    std::set<std::string> dirs;
    for (std::string d : p.unsynced_dirs) {
      Rebase(d, f, t);
      dirs.insert(std::move(d));
    }
    p.unsynced_dirs = std::move(dirs);
    if (p.path != before.path || p.from != before.from || p.unsynced_dirs != before.unsynced_dirs) {
      op.rebased.push_back(std::move(before));
    }
  }
  AddPendingLocked(std::move(op));
  return absl::OkStatus();
}

FaultInjectionEnv::Pending FaultInjectionEnv::NewPending(Pending::Kind kind, std::string path,
                                                         std::set<std::string> dirs) {
  Pending op;
  op.kind = kind;
  op.path = std::move(path);
  op.unsynced_dirs = std::move(dirs);
  return op;
}

void FaultInjectionEnv::AddPendingLocked(Pending op) {
  op.id = next_id_++;
  pending_.push_back(std::move(op));
}

absl::Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  const std::string d = CleanPath(dir.empty() ? "." : dir);
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(CheckFault(kSyncDir, dir));
  KILN_RETURN_IF_ERROR(target_->SyncDir(dir));
  for (Pending& p : pending_) p.unsynced_dirs.erase(d);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const Pending& p) { return p.unsynced_dirs.empty(); }),
                 pending_.end());
  return absl::OkStatus();
}

std::string FaultInjectionEnv::GetTempDirectory() { return target_->GetTempDirectory(); }
uint64_t FaultInjectionEnv::NowMicros() { return target_->NowMicros(); }
void FaultInjectionEnv::SleepForMicros(int64_t micros) { target_->SleepForMicros(micros); }
uint64_t FaultInjectionEnv::RandomU64() { return target_->RandomU64(); }

}  // namespace kiln
