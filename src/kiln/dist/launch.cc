#include "kiln/dist/launch.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace kiln::dist {
namespace {

// The flags `kiln train` consumes itself when it launches: name -> takes a value.
struct LaunchFlag {
  absl::string_view name;
  bool has_value;
};
constexpr LaunchFlag kLaunchFlags[] = {
    {"--workers", true},      {"--hostfile", true}, {"--job-timeout", true}, {"--dry-run", false},
    {"--max-restarts", true}, {"--slurm", false},   {"--slurm-arg", true}};

// The value of `name` in env, parsed as a non-negative integer; nullopt when unset.
absl::StatusOr<std::optional<int>> ReadInt(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::optional<int>();
  int v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < 0) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", it->second,
                                                   "' is not a non-negative integer"));
  }
  return std::optional<int>(v);
}

bool SafeShellChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         absl::string_view("_./=:,+-@%").find(c) != absl::string_view::npos;
}

}  // namespace

std::vector<std::string> StripLaunchFlags(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool dropped = false;
    for (const LaunchFlag& f : kLaunchFlags) {
      if (a == f.name) {
        if (f.has_value) ++i;  // its value follows
        dropped = true;
        break;
      }
      if (f.has_value && absl::StartsWith(a, absl::StrCat(f.name, "="))) {
        dropped = true;
        break;
      }
    }
    if (!dropped) out.push_back(a);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> BuildMpirunCommand(const LaunchOptions& o) {
  if (o.workers < 1)
    return absl::InvalidArgumentError(absl::StrCat("--workers must be >= 1, got ", o.workers));
  if (o.cores < 1)
    return absl::InvalidArgumentError(absl::StrCat("launch: cores must be >= 1, got ", o.cores));
  if (o.job_timeout_s < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--job-timeout must be >= 0 seconds, got ", o.job_timeout_s));
  }
  if (o.binary.empty()) return absl::InvalidArgumentError("launch: no worker binary");
  std::vector<std::string> argv = {o.mpirun, "--bind-to", "none", "-np", std::to_string(o.workers)};
  if (!o.hostfile.empty()) {
    argv.insert(argv.end(), {"--hostfile", o.hostfile});
  }
  // Slots are counted per host from the hostfile; on this host they are its cores.
  if (o.hostfile.empty() && o.workers > o.cores) argv.push_back("--oversubscribe");
  if (o.job_timeout_s > 0) argv.insert(argv.end(), {"--timeout", std::to_string(o.job_timeout_s)});
  argv.insert(argv.end(), {"-x", "GLIBC_TUNABLES=glibc.malloc.mmap_max=0"});
  if (o.env.count("OMP_NUM_THREADS") > 0) {
    argv.insert(argv.end(), {"-x", "OMP_NUM_THREADS"});  // the caller's value, forwarded
  } else {
    argv.insert(argv.end(),
                {"-x", absl::StrCat("OMP_NUM_THREADS=", std::max(1, o.cores / o.workers))});
  }
  if (o.root) argv.push_back("--allow-run-as-root");
  argv.push_back(o.binary);
  for (std::string& a : StripLaunchFlags(o.args)) argv.push_back(std::move(a));
  return argv;
}

absl::StatusOr<std::vector<std::string>> BuildSrunCommand(const LaunchOptions& o) {
  if (o.workers < 1)
    return absl::InvalidArgumentError(absl::StrCat("--workers must be >= 1, got ", o.workers));
  if (o.job_timeout_s < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--job-timeout must be >= 0 seconds, got ", o.job_timeout_s));
  }
  if (!o.hostfile.empty()) {
    return absl::InvalidArgumentError(
        "--hostfile does not go with --slurm: Slurm places the ranks (pass --slurm-arg=--nodes=N "
        "or a partition instead)");
  }
  if (o.binary.empty()) return absl::InvalidArgumentError("launch: no worker binary");
  std::vector<std::string> argv = {o.srun, "-n", std::to_string(o.workers), "--mpi=pmix", "-K"};
  // Slurm's --time is in minutes, rounded up.
  if (o.job_timeout_s > 0) argv.push_back(absl::StrCat("--time=", (o.job_timeout_s + 59) / 60));
  std::string exports = "--export=ALL,GLIBC_TUNABLES=glibc.malloc.mmap_max=0";
  if (o.env.count("OMP_NUM_THREADS") == 0) {
    // The job's cores per rank when Slurm is asked for them, else this host's share.
    exports += absl::StrCat(",OMP_NUM_THREADS=", std::max(1, o.cores / o.workers));
  }
  argv.push_back(exports);
  for (const std::string& a : o.slurm_args) argv.push_back(a);
  argv.push_back(o.binary);
  for (std::string& a : StripLaunchFlags(o.args)) argv.push_back(std::move(a));
  return argv;
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::vector<std::string> words;
  for (const std::string& a : argv) {
    if (!a.empty() && std::all_of(a.begin(), a.end(), SafeShellChar)) {
      words.push_back(a);
      continue;
    }
    std::string q = "'";
    for (char c : a) {
      if (c == '\'') {
        q += "'\\''";
      } else {
        q += c;
      }
    }
    words.push_back(q + "'");
  }
  return absl::StrJoin(words, " ");
}

absl::StatusOr<RankInfo> DetectRank(const Environment& env) {
  struct Source {
    const char* launcher;
    const char* rank;
    std::vector<const char*> sizes;  // the first one set wins
    std::vector<const char*> locals;
  };
  const Source sources[] = {
      {"mpirun", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"}, {"OMPI_COMM_WORLD_LOCAL_RANK"}},
      {"pmix", "PMIX_RANK", {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, {"SLURM_LOCALID"}},
      {"slurm", "SLURM_PROCID", {"SLURM_NTASKS"}, {"SLURM_LOCALID"}},
  };
  for (const Source& s : sources) {
    absl::StatusOr<std::optional<int>> rank = ReadInt(env, s.rank);
    if (!rank.ok()) return rank.status();
    if (!rank->has_value()) continue;
    RankInfo info;
    info.launcher = s.launcher;
    info.rank = **rank;
    std::string size_var;
    for (const char* v : s.sizes) {
      absl::StatusOr<std::optional<int>> size = ReadInt(env, v);
      if (!size.ok()) return size.status();
      if (size->has_value()) {
        info.size = **size;
        size_var = v;
        break;
      }
    }
    if (size_var.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(s.rank, " is set but none of ",
                                                     absl::StrJoin(s.sizes, ", "),
                                                     " (the number of ranks) is"));
    }
    if (info.size < 1)
      return absl::InvalidArgumentError(absl::StrCat(size_var, " must be >= 1, got ", info.size));
    if (info.rank >= info.size) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.rank, "=", info.rank, " is not below ", size_var, "=", info.size));
    }
    for (const char* v : s.locals) {
      absl::StatusOr<std::optional<int>> local = ReadInt(env, v);
      if (!local.ok()) return local.status();
      if (!local->has_value()) continue;
      if (**local >= info.size) {
        return absl::InvalidArgumentError(
            absl::StrCat(v, "=", **local, " is not below ", size_var, "=", info.size));
      }
      info.local_rank = **local;
      break;
    }
    return info;
  }
  return RankInfo{};
}

}  // namespace kiln::dist
