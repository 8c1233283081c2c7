#include "kiln/base/env.h"

#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/status.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<WritableFile>> Env::NewAppendableFile(const std::string& path) {
  return absl::UnimplementedError("this Env cannot append to existing files: " + path);
}

absl::StatusOr<std::unique_ptr<WritableFile>> Env::NewExclusiveFile(const std::string& path) {
  return absl::UnimplementedError("this Env cannot create files exclusively: " + path);
}

std::string Env::GetTempDirectory() { return "/tmp"; }

absl::StatusOr<std::string> CreateTempDir(Env* env, const std::string& prefix) {
  const std::string root = env->GetTempDirectory();
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string path = JoinPath(root, prefix + absl::StrFormat("%016x", env->RandomU64()));
    if (env->FileExists(path)) continue;
    KILN_RETURN_IF_ERROR(env->CreateDir(path));
    return path;
  }
  return absl::InternalError(absl::StrCat("cannot find a fresh folder name like ",
                                          JoinPath(root, prefix + "XXXXXXXXXXXXXXXX")));
}

namespace {

// Paths held through Env::LockFile's default, per Env.
std::mutex g_locks_mu;
std::set<std::pair<const Env*, std::string>>& HeldLocks() {
  static auto* held = new std::set<std::pair<const Env*, std::string>>();
  return *held;
}

class TableLock final : public FileLock {
 public:
  explicit TableLock(std::pair<const Env*, std::string> key) : key_(std::move(key)) {}
  ~TableLock() override {
    std::lock_guard<std::mutex> l(g_locks_mu);
    HeldLocks().erase(key_);
  }

 private:
  std::pair<const Env*, std::string> key_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FileLock>> Env::LockFile(const std::string& path) {
  if (!FileExists(path)) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, NewAppendableFile(path));
    KILN_RETURN_IF_ERROR(f->Close());
  }
  std::pair<const Env*, std::string> key(this, CleanPath(path));
  std::lock_guard<std::mutex> l(g_locks_mu);
  if (!HeldLocks().insert(key).second) {
    return absl::UnavailableError("lock " + path + " is held in this process");
  }
  return std::unique_ptr<FileLock>(new TableLock(std::move(key)));
}

absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file, env->NewSequentialFile(path));
  std::string out;
  constexpr size_t kChunk = 1 << 20;
  std::vector<char> scratch(kChunk);
  for (;;) {
    std::string_view got;
    KILN_RETURN_IF_ERROR(file->Read(kChunk, &got, scratch.data()));
    if (got.empty()) break;
    out.append(got.data(), got.size());
  }
  return out;
}

absl::Status WriteStringToFile(Env* env, std::string_view data, const std::string& path,
                               bool sync) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  KILN_RETURN_IF_ERROR(file->Append(data));
  if (sync) KILN_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

std::string CleanPath(const std::string& path) {
  if (path.empty()) return path;
  const bool absolute = path[0] == '/';
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    if (!part.empty() && part != ".") parts.push_back(std::move(part));
    i = j + 1;
  }
  std::string out = absolute ? "/" : "";
  for (size_t k = 0; k < parts.size(); ++k) {
    if (k > 0) out += '/';
    out += parts[k];
  }
  if (out.empty()) return std::string(1, '.');
  return out;
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  if (b[0] == '/') return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

namespace {
// `path` without trailing slashes (but "/" stays "/").
std::string StripTrailingSlashes(const std::string& path) {
  size_t n = path.size();
  while (n > 1 && path[n - 1] == '/') --n;
  return path.substr(0, n);
}
}  // namespace

std::string Dirname(const std::string& path) {
  const std::string p = StripTrailingSlashes(path);
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string Basename(const std::string& path) {
  const std::string p = StripTrailingSlashes(path);
  if (p == "/") return p;
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace kiln
