#include "kiln/base/mem_env.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"

namespace kiln {

struct MemEnv::FileData {
  std::mutex mu;
  std::string bytes;
};

namespace {

absl::Status Error(int err, const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

bool IsRoot(const std::string& p) { return p == "/" || p == "."; }

// True if `p` lies strictly under directory `dir`.
bool IsUnder(const std::string& p, const std::string& dir) {
  if (dir == "/") return p.size() > 1 && p[0] == '/';
  if (dir == ".") return !p.empty() && p[0] != '/' && p != ".";
  return p.size() > dir.size() && p.compare(0, dir.size(), dir) == 0 && p[dir.size()] == '/';
}

// The prefix that every path under `dir` starts with ("" for the relative root).
std::string ChildPrefix(const std::string& dir) {
  if (dir == ".") return "";
  if (dir == "/") return "/";
  return dir + "/";
}

std::string ParentOf(const std::string& clean) {
  std::string d = Dirname(clean);
  return d.empty() ? "." : d;
}

class MemSequentialFile final : public SequentialFile {
 public:
  explicit MemSequentialFile(std::shared_ptr<MemEnv::FileData> f) : f_(std::move(f)) {}
  absl::Status Read(size_t n, std::string_view* result, char* scratch) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    const size_t avail = pos_ < f_->bytes.size() ? f_->bytes.size() - pos_ : 0;
    const size_t k = std::min(n, avail);
    if (k > 0) std::memcpy(scratch, f_->bytes.data() + pos_, k);
    pos_ += k;
    *result = std::string_view(scratch, k);
    return absl::OkStatus();
  }
  absl::Status Skip(uint64_t n) override {
    std::lock_guard<std::mutex> lock(f_->mu);
    pos_ = std::min<uint64_t>(pos_ + n, f_->bytes.size());
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<MemEnv::FileData> f_;
  size_t pos_ = 0;
};

class MemRandomAccessFile final : public RandomAccessFile {
 public:
  explicit MemRandomAccessFile(std::shared_ptr<MemEnv::FileData> f) : f_(std::move(f)) {}
  absl::Status Read(uint64_t offset, size_t n, std::string_view* result,
                    char* scratch) const override {
    std::lock_guard<std::mutex> lock(f_->mu);
    const size_t avail = offset < f_->bytes.size() ? f_->bytes.size() - offset : 0;
    const size_t k = std::min(n, avail);
    if (k > 0) std::memcpy(scratch, f_->bytes.data() + offset, k);
    *result = std::string_view(scratch, k);
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<MemEnv::FileData> f_;
};

class MemWritableFile final : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<MemEnv::FileData> f, std::string path)
      : f_(std::move(f)), path_(std::move(path)) {}
  absl::Status Append(std::string_view data) override {
    KILN_RETURN_IF_ERROR(CheckOpen());
    std::lock_guard<std::mutex> lock(f_->mu);
    f_->bytes.append(data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status Flush() override { return CheckOpen(); }
  absl::Status Sync() override { return CheckOpen(); }
  absl::Status Close() override {
    KILN_RETURN_IF_ERROR(CheckOpen());
    closed_ = true;
    return absl::OkStatus();
  }

 private:
  absl::Status CheckOpen() const {
    if (closed_) return absl::FailedPreconditionError("file already closed: " + path_);
    return absl::OkStatus();
  }
  std::shared_ptr<MemEnv::FileData> f_;
  std::string path_;
  bool closed_ = false;
};

}  // namespace

MemEnv::MemEnv(uint64_t start_micros, uint64_t seed) : now_micros_(start_micros), rng_(seed) {}
MemEnv::~MemEnv() = default;

std::unique_ptr<MemEnv> NewMemEnv() { return std::make_unique<MemEnv>(); }

bool MemEnv::IsDirLocked(const std::string& p) const { return IsRoot(p) || dirs_.count(p) > 0; }

absl::Status MemEnv::CheckParentLocked(const std::string& p, const std::string& what) const {
  const std::string parent = ParentOf(p);
  if (IsDirLocked(parent)) return absl::OkStatus();
  return Error(files_.count(parent) ? ENOTDIR : ENOENT, what, p);
}

bool MemEnv::HasChildrenLocked(const std::string& dir) const {
  const std::string prefix = ChildPrefix(dir);
  auto f = files_.lower_bound(prefix);
  if (f != files_.end() && IsUnder(f->first, dir)) return true;
  auto d = dirs_.lower_bound(prefix);
  return d != dirs_.end() && IsUnder(*d, dir);
}

absl::StatusOr<std::unique_ptr<SequentialFile>> MemEnv::NewSequentialFile(const std::string& path) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(p);
  if (it == files_.end()) return Error(IsDirLocked(p) ? EISDIR : ENOENT, "cannot open", path);
  return std::make_unique<MemSequentialFile>(it->second);
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> MemEnv::NewRandomAccessFile(
    const std::string& path) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(p);
  if (it == files_.end()) return Error(IsDirLocked(p) ? EISDIR : ENOENT, "cannot open", path);
  return std::make_unique<MemRandomAccessFile>(it->second);
}

absl::StatusOr<std::unique_ptr<WritableFile>> MemEnv::NewWritableFile(const std::string& path) {
  return OpenForWrite(path, OpenMode::kTruncate);
}

absl::StatusOr<std::unique_ptr<WritableFile>> MemEnv::NewAppendableFile(const std::string& path) {
  return OpenForWrite(path, OpenMode::kAppend);
}

absl::StatusOr<std::unique_ptr<WritableFile>> MemEnv::NewExclusiveFile(const std::string& path) {
  return OpenForWrite(path, OpenMode::kExclusive);
}

absl::StatusOr<std::unique_ptr<WritableFile>> MemEnv::OpenForWrite(const std::string& path,
                                                                   OpenMode mode) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  if (mode == OpenMode::kExclusive && (IsDirLocked(p) || files_.count(p) > 0)) {
    return Error(EEXIST, "cannot create", path);
  }
  if (IsDirLocked(p)) return Error(EISDIR, "cannot create", path);
  KILN_RETURN_IF_ERROR(CheckParentLocked(p, "cannot create"));
  std::shared_ptr<FileData>& f = files_[p];
  if (f == nullptr) {
    f = std::make_shared<FileData>();
  } else if (mode == OpenMode::kTruncate) {
    std::lock_guard<std::mutex> flock(f->mu);
    f->bytes.clear();  // O_TRUNC: the same file, emptied
  }
  return std::make_unique<MemWritableFile>(f, path);
}

bool MemEnv::FileExists(const std::string& path) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  return files_.count(p) > 0 || IsDirLocked(p);
}

absl::StatusOr<bool> MemEnv::IsDirectory(const std::string& path) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  if (IsDirLocked(p)) return true;
  if (files_.count(p)) return false;
  return Error(ENOENT, "cannot stat", path);
}

absl::StatusOr<std::vector<std::string>> MemEnv::GetChildren(const std::string& dir) {
  const std::string d = CleanPath(dir.empty() ? "." : dir);
  std::lock_guard<std::mutex> lock(mu_);
  if (!IsDirLocked(d)) {
    return Error(files_.count(d) ? ENOTDIR : ENOENT, "cannot list directory", dir);
  }
  const std::string prefix = ChildPrefix(d);
  std::vector<std::string> names;
  auto direct = [&](const std::string& p) {
    return IsUnder(p, d) && p.find('/', prefix.size()) == std::string::npos;
  };
  for (auto it = files_.lower_bound(prefix); it != files_.end() && IsUnder(it->first, d); ++it) {
    if (direct(it->first)) names.push_back(it->first.substr(prefix.size()));
  }
  // Relative paths do not sort contiguously after "" (absolute ones come first), so scan all
  // for the relative root; otherwise the range scan above suffices.
  if (d == ".") {
    names.clear();
    for (const auto& [p, f] : files_)
      if (direct(p)) names.push_back(p);
    for (const auto& p : dirs_)
      if (direct(p)) names.push_back(p);
  } else {
    for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && IsUnder(*it, d); ++it) {
      if (direct(*it)) names.push_back(it->substr(prefix.size()));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<uint64_t> MemEnv::GetFileSize(const std::string& path) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(p);
  if (it == files_.end()) {
    if (IsDirLocked(p)) return uint64_t{0};
    return Error(ENOENT, "cannot stat", path);
  }
  std::lock_guard<std::mutex> flock(it->second->mu);
  return static_cast<uint64_t>(it->second->bytes.size());
}

absl::Status MemEnv::DeleteFile(const std::string& path) {
  const std::string p = CleanPath(path);
  std::lock_guard<std::mutex> lock(mu_);
  if (files_.erase(p) == 0) return Error(IsDirLocked(p) ? EISDIR : ENOENT, "cannot delete", path);
  return absl::OkStatus();
}

absl::Status MemEnv::CreateDir(const std::string& dir) {
  const std::string d = CleanPath(dir);
  std::lock_guard<std::mutex> lock(mu_);
  // Check every prefix first so a failure leaves nothing half-made.
  std::vector<std::string> chain;
  for (std::string p = d; !IsRoot(p); p = ParentOf(p)) chain.push_back(p);
  for (const std::string& p : chain) {
    if (files_.count(p)) return Error(ENOTDIR, "cannot create directory", p);
  }
  for (const std::string& p : chain) dirs_.insert(p);
  return absl::OkStatus();
}

absl::Status MemEnv::DeleteDir(const std::string& dir) {
  const std::string d = CleanPath(dir);
  std::lock_guard<std::mutex> lock(mu_);
  if (IsRoot(d)) return Error(EBUSY, "cannot delete directory", dir);
  if (!dirs_.count(d)) {
    return Error(files_.count(d) ? ENOTDIR : ENOENT, "cannot delete directory", dir);
  }
  const std::string prefix = ChildPrefix(d);
  for (auto it = files_.lower_bound(prefix); it != files_.end() && IsUnder(it->first, d);) {
    it = files_.erase(it);
  }
  for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && IsUnder(*it, d);) {
    it = dirs_.erase(it);
  }
  dirs_.erase(d);
  return absl::OkStatus();
}

absl::Status MemEnv::RenameFile(const std::string& from, const std::string& to) {
  const std::string f = CleanPath(from);
  const std::string t = CleanPath(to);
  const std::string what = "cannot rename " + from + " to";
  std::lock_guard<std::mutex> lock(mu_);
  const bool from_file = files_.count(f) > 0;
  const bool from_dir = !from_file && dirs_.count(f) > 0;
  if (!from_file && !from_dir) return Error(IsRoot(f) ? EBUSY : ENOENT, what, to);
  if (f == t) return absl::OkStatus();
  if (IsRoot(t)) return Error(EBUSY, what, to);
  KILN_RETURN_IF_ERROR(CheckParentLocked(t, what));
  if (from_file) {
    if (dirs_.count(t)) return Error(EISDIR, what, to);
    std::shared_ptr<FileData> data = files_[f];
    files_.erase(f);
    files_[t] = std::move(data);
    return absl::OkStatus();
  }
  // A directory.
  if (files_.count(t)) return Error(ENOTDIR, what, to);
  if (IsUnder(t, f)) return Error(EINVAL, what, to);
  if (dirs_.count(t)) {
    if (HasChildrenLocked(t)) return Error(ENOTEMPTY, what, to);
    dirs_.erase(t);
  }
  const std::string prefix = ChildPrefix(f);
  std::vector<std::pair<std::string, std::shared_ptr<FileData>>> moved_files;
  for (auto it = files_.lower_bound(prefix); it != files_.end() && IsUnder(it->first, f);) {
    moved_files.emplace_back(ChildPrefix(t) + it->first.substr(prefix.size()), it->second);
    it = files_.erase(it);
  }
  std::vector<std::string> moved_dirs;
  for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && IsUnder(*it, f);) {
    moved_dirs.push_back(ChildPrefix(t) + it->substr(prefix.size()));
    it = dirs_.erase(it);
  }
  dirs_.erase(f);
  dirs_.insert(t);
  for (auto& [p, data] : moved_files) files_[p] = std::move(data);
  for (auto& p : moved_dirs) dirs_.insert(p);
  return absl::OkStatus();
}

absl::Status MemEnv::SyncDir(const std::string& dir) {
  const std::string d = CleanPath(dir.empty() ? "." : dir);
  std::lock_guard<std::mutex> lock(mu_);
  if (!IsDirLocked(d)) {
    return Error(files_.count(d) ? ENOTDIR : ENOENT, "cannot open directory", dir);
  }
  return absl::OkStatus();
}

uint64_t MemEnv::NowMicros() {
  std::lock_guard<std::mutex> lock(mu_);
  return now_micros_;
}

void MemEnv::SleepForMicros(int64_t micros) {
  if (micros > 0) AdvanceMicros(static_cast<uint64_t>(micros));
}

uint64_t MemEnv::RandomU64() {
  std::lock_guard<std::mutex> lock(mu_);
  return rng_();
}

void MemEnv::AdvanceMicros(uint64_t micros) {
  std::lock_guard<std::mutex> lock(mu_);
  now_micros_ += micros;
}

void MemEnv::SetNowMicros(uint64_t micros) {
  std::lock_guard<std::mutex> lock(mu_);
  now_micros_ = micros;
}

uint64_t MemEnv::TotalFileBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [p, f] : files_) {
    std::lock_guard<std::mutex> flock(f->mu);
    n += f->bytes.size();
  }
  return n;
}

}  // namespace kiln
