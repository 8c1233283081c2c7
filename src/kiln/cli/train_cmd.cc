#include "kiln/cli/train_cmd.h"

#include <omp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kiln/base/status.h"
#include "kiln/cli/app.h"
#include "kiln/cli/backends.h"
#include "kiln/cli/input_normalization.h"
#include "kiln/compiler/artifact.h"
#include "kiln/dist/launch.h"
#ifdef KILN_HAVE_MPI
#include "kiln/dist/mpi/mpi_communicator.h"
#endif
#include "kiln/ir/printer.h"
#include "kiln/nn/gpt.h"
#include "kiln/runtime/cpu/machine.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/config.h"
#include "kiln/train/supervisor.h"
#include "kiln/train/trainer.h"
#include "kiln/train/validate_first.h"
#include "oneapi/dnnl/dnnl.h"

extern char** environ;

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

// `text` as a YAML double-quoted scalar, so a --set value that is a path stays a string whatever
// characters it holds (a leading '*', ': ', '#', ...).
std::string YamlQuoted(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// The process environment, read once (libraries take it as a map).
dist::Environment ReadEnvironment() {
  dist::Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = std::string(eq + 1);
  }
  return env;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

std::string SelfExe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

// The mpirun child of `kiln train --workers`: SIGTERM / SIGINT sent to kiln go to it (mpirun
// forwards them to the ranks).
volatile sig_atomic_t g_launched_pid = 0;
void ForwardToLauncher(int sig) {
  if (g_launched_pid > 0) kill(static_cast<pid_t>(g_launched_pid), sig);
}

// Runs argv and returns its exit status (128 + signal when killed); -1 with `error` set when it
// cannot start.
int RunChild(const std::vector<std::string>& argv, std::string* error) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, cargv[0], nullptr, nullptr, cargv.data(), environ);
  if (rc != 0) {
    *error = absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc));
    if (rc == ENOENT) absl::StrAppend(error, " (install OpenMPI: openmpi-bin)");
    return -1;
  }
  g_launched_pid = pid;
  struct sigaction sa = {}, old_term = {}, old_int = {};
  sa.sa_handler = ForwardToLauncher;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGINT, &sa, &old_int);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  g_launched_pid = 0;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int Fail(std::ostream& err, const std::string& command, const absl::Status& s) {
  err << "kiln " << command << ": " << s.message() << "\n";
  return 1;
}

// HEAD of the git checkout the command runs in; "" outside one.
std::string GitCommit() {
  FILE* p = popen("git rev-parse HEAD 2>/dev/null", "r");
  if (p == nullptr) return "";
  char buf[128] = {0};
  std::string out;
  if (fgets(buf, sizeof(buf), p) != nullptr) out = buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.size() == 40 ? out : "";
}

nlohmann::json RunInfo(const runtime::Backend& backend, const std::string& precision) {
  const dnnl_version_t* v = dnnl_version();
  nlohmann::json j;
  j["kiln_version"] = KilnVersion();
  j["onednn_version"] = absl::StrFormat("%d.%d.%d", v->major, v->minor, v->patch);
  if (v->hash != nullptr) j["onednn_hash"] = v->hash;
  j["isa"] = runtime::OneDnnIsaName();
  // The process's level (docs/compiler.md, "CPU ISA levels"), and the CPU's when capped below it.
  j["cpu_isa"] = CpuIsaName(ActiveCpuIsa());
  if (CpuIsaCapped()) j["cpu_isa_host"] = CpuIsaName(HostCpuIsa());
  j["threads"] = omp_get_max_threads();
  j["hardware_threads"] = std::thread::hardware_concurrency();
  if (std::string commit = GitCommit(); !commit.empty()) j["git_commit"] = commit;
  // What the backend says it compiles with (Backend::Describe: the reference backend runs no pass
  // at all, docs/compiler.md), including the passes disabled by name (KILN_DISABLE_PASSES, read
  // into the backend's options by FromEnvironment). The precision policy comes from the config.
  nlohmann::json options = backend.Describe();
  if (!options.contains("disabled_passes")) options["disabled_passes"] = nlohmann::json::array();
  options["precision"] = precision;
  j["compiler_options"] = options;
  return j;
}

absl::StatusOr<std::pair<int64_t, int64_t>> ParseRange(const std::string& text) {
  size_t colon = text.find(':');
  int64_t a = 0, b = 0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("");
    size_t pa = 0, pb = 0;
    a = std::stoll(text.substr(0, colon), &pa);
    b = std::stoll(text.substr(colon + 1), &pb);
    if (pa != colon || pb != text.size() - colon - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile-steps: expected A:B (first step, step after the last), got '", text, "'"));
  }
  if (a < 1 || b <= a) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile-steps: need 1 <= A < B, got '", text, "'"));
  }
  return std::make_pair(a, b);
}

// An integer flag's lower bound, with a message naming it (CLI11's NonNegativeNumber prints the
// largest double, 309 digits, as the upper end of the range).
CLI::Validator IntAtLeast(int64_t min) {
  return CLI::Validator(
      [min](std::string& v) -> std::string {
        size_t used = 0;
        long long x = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != v.size()) return "expected an integer, got '" + v + "'";
        if (x < min) return absl::StrCat("must be >= ", min, ", got ", v);
        return "";
      },
      absl::StrCat("INT>=", min));
}

// What `kiln eval` / `kiln export` read.
struct Source {
  std::string run_dir;    // OUTDIR (config.yaml, checkpoints/); for a loose checkpoint its parent
  int64_t step = -1;      // -1: the newest checkpoint of the run
  std::string loose_dir;  // a step_N folder outside any run directory (needs --config)
  std::string config;     // the config file to load
};

// OUTDIR (holding config.yaml), OUTDIR/checkpoints/step_N, or a step_N folder copied out of its
// run (with --config).
absl::StatusOr<Source> ResolveCheckpoint(const std::string& path, const std::string& config) {
  std::error_code ec;
  fs::path p = fs::path(path);
  Source s;
  s.config = config;
  if (fs::exists(p / "config.yaml", ec)) {
    s.run_dir = p.string();
    if (s.config.empty()) s.config = (p / "config.yaml").string();
    return s;
  }
  fs::path norm = p.lexically_normal();
  if (norm.filename().empty()) norm = norm.parent_path();
  int64_t step = train::ParseCheckpointDirName(norm.filename().string());
  if (step >= 0) {
    fs::path outdir = norm.parent_path().parent_path();
    if (outdir.empty()) outdir = ".";
    const bool in_run =
        norm.parent_path().filename() == "checkpoints" && fs::exists(outdir / "config.yaml", ec);
    if (in_run) {
      s.run_dir = outdir.string();
      s.step = step;
      if (s.config.empty()) s.config = (outdir / "config.yaml").string();
      return s;
    }
    if (!fs::exists(norm / train::kCheckpointManifestName, ec)) {
      return absl::NotFoundError(absl::StrCat("'", path, "' has no ",
                                              train::kCheckpointManifestName,
                                              ": it is not a checkpoint directory"));
    }
    if (s.config.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", path,
          "' is a checkpoint outside a run directory (no ../../config.yaml next to it); pass the "
          "config it was trained with: --config RUNDIR/config.yaml"));
    }
    s.loose_dir = norm.string();
    s.run_dir = norm.parent_path().empty() ? "." : norm.parent_path().string();
    s.step = step;
    return s;
  }
  return absl::NotFoundError(
      absl::StrCat("'", path,
                   "' is neither a run directory (with config.yaml) nor a checkpoint directory "
                   "(.../checkpoints/step_N)"));
}

// The restore notes of a loaded run (skipped damaged or foreign checkpoints), on stderr.
void PrintRestoreNotes(std::ostream& err, const std::string& command, const train::LoadedRun& r) {
  for (const std::string& n : r.notes) err << "kiln " << command << ": note: " << n << "\n";
  if (!r.notes.empty()) {
    err << "kiln " << command << ": using " << r.restored_from
        << " (the newest checkpoint of the run that verifies)\n";
  }
}

train::LoadOptions LoadOptionsFor(const Source& where) {
  train::LoadOptions o;
  o.restore_step = where.step;
  o.restore_path = where.loose_dir;
  return o;
}

// True when `inner` is `outer` or lies inside it (both absolute and normalized).
bool Within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

fs::path Resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

// The files an export of `format` writes into --out, manifest (the file that makes it valid) last.
std::vector<std::string> ExportFiles(const std::string& format) {
  if (format == "hf") return {"model.safetensors", "config.json"};
  return {"weights.safetensors", "program.ir", "manifest.json"};
}

// Whether `dir` holds an earlier export of `format` (its own manifest / config says so).
bool IsPreviousExport(const fs::path& dir, const std::string& format) {
  std::ifstream f(dir / (format == "hf" ? "config.json" : "manifest.json"), std::ios::binary);
  if (!f) return false;
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (format == "hf") return j.value("model_type", std::string()) == "gpt2";
  return j.value("format", std::string()) == compiler::kArtifactFormat;
}

// Checks --out before anything is written: never the run it reads (or a folder holding it), never
// an existing file, never a non-empty folder that is not an earlier export unless --overwrite may
// add the export's files there without replacing anything Kiln did not write. Sets *exists.
absl::Status CheckExportTarget(const std::string& out, const Source& src, const std::string& format,
                               bool overwrite, bool* exists) {
  const fs::path o = Resolved(out);
  std::vector<fs::path> protect = {Resolved(src.run_dir)};
  if (!src.loose_dir.empty()) protect = {Resolved(src.loose_dir)};
  for (const fs::path& r : protect) {
    if (Within(o, r) || Within(r, o)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--out ", out, o == r ? " is " : (Within(o, r) ? " is inside " : " contains "),
          "the run it exports (", r.string(),
          "); an export never writes into the run it reads. Choose a folder outside it, e.g. "
          "--out ",
          r.string(), "-export"));
    }
  }
  std::error_code ec;
  *exists = fs::exists(o, ec);
  if (!*exists) return absl::OkStatus();
  if (!fs::is_directory(o, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out ", out,
        " is an existing file, not a folder; nothing was written. Choose a folder path (an "
        "export is a directory of files)"));
  }
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(o, ec))
    entries.push_back(e.path().filename().string());
  if (entries.empty()) return absl::OkStatus();
  std::sort(entries.begin(), entries.end());
  const bool previous = IsPreviousExport(o, format);
  std::vector<std::string> clashes;  // the export's file names already taken by other files
  for (const std::string& f : ExportFiles(format)) {
    if (fs::exists(o / f, ec) && !previous) clashes.push_back(f);
  }
  if (overwrite && clashes.empty()) return absl::OkStatus();
  std::string listing =
      absl::StrJoin(std::vector<std::string>(entries.begin(),
                                             entries.begin() + std::min<size_t>(5, entries.size())),
                    ", ");
  if (entries.size() > 5) absl::StrAppend(&listing, ", ...");
  if (previous) {
    return absl::AlreadyExistsError(
        absl::StrCat("--out ", out,
                     " holds an earlier export; nothing was written. Pass --overwrite to "
                     "replace that export's files (",
                     absl::StrJoin(ExportFiles(format), ", "),
                     "; nothing else there is touched), or choose another folder"));
  }
  if (!clashes.empty()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "--out ", out, " is not an earlier export and already has ", absl::StrJoin(clashes, ", "),
        ", which kiln export did not write and will not replace; nothing was written. Choose a "
        "new or empty folder"));
  }
  return absl::AlreadyExistsError(absl::StrCat(
      "--out ", out, " is not empty (", entries.size(),
      entries.size() == 1 ? " entry: " : " entries: ", listing,
      ") and is not an earlier export; nothing was written. Choose a new or empty folder, or pass "
      "--overwrite to add the export's files (",
      absl::StrJoin(ExportFiles(format), ", "), ") next to what is there"));
}

// Writes an export into --out: straight into a new folder, or, for an existing one, into a
// private staging folder inside it whose files are then renamed over the export's own names (the
// manifest last); nothing else in the folder is touched.
absl::Status WriteExport(const std::string& out, bool exists, const std::string& format,
                         const std::function<absl::Status(const std::string&)>& write) {
  if (!exists) return write(out);
  const fs::path stage =
      fs::path(out) / absl::StrFormat(".kiln-export-%d-%016x", getpid(),
                                      static_cast<uint64_t>(std::random_device()()) << 20);
  absl::Status s = write(stage.string());
  std::error_code ec;
  for (const std::string& f : ExportFiles(format)) {
    if (!s.ok()) break;
    fs::rename(stage / f, fs::path(out) / f, ec);
    if (ec)
      s = absl::InternalError(absl::StrCat("rename ", (stage / f).string(), ": ", ec.message()));
  }
  fs::remove_all(stage, ec);  // ours: created by this export, emptied above when all went well
  return s;
}

}  // namespace

TrainCommands::TrainCommands(CLI::App& app) {
  train_ = app.add_subcommand(
      "train",
      "Train a model from a YAML config (docs/train.md); resumes from OUTDIR/checkpoints. Exit "
      "75 = stopped by SIGTERM/SIGINT with a checkpoint committed (rerun to resume)");
  train_->add_option("config", config_path_, "YAML config file")->required();
  train_->add_option("--set", sets_, "Override a config key: --set optimizer.lr=0.01 (repeatable)")
      ->take_all();
  train_
      ->add_option("--max-restarts", max_restarts_,
                   "Supervise: restart the worker from the latest checkpoint when it dies, up "
                   "to N times")
      ->check(IntAtLeast(0));
  train_->add_option("--profile-steps", profile_steps_,
                     "Profile steps A..B-1 (A:B): OUTDIR/trace.json and a time breakdown");
  train_->add_option("--output-dir", output_dir_, "Output directory (overrides output_dir)");
  train_->add_option("--init-from", init_from_,
                     "Warm start: parameters from a run directory (its latest checkpoint) or "
                     "its checkpoints/step_N (= --set init_from.checkpoint=DIR)");
  train_->add_option("--backend", backend_, "Backend: cpu (oneDNN) or reference")
      ->check(CLI::IsMember(BackendNames()))
      ->capture_default_str();
  train_
      ->add_option("--validate-first", validate_first_,
                   "Train a scratch copy for N steps first and refuse the run (exit 3) when the "
                   "loss does not fall or the held-out accuracy stays at chance")
      ->check(IntAtLeast(2));
  CLI::Option* no_resume = train_->add_flag(
      "--no-resume", no_resume_,
      "Start a new run from step 0; refused on a folder holding an earlier run unless --replace");
  train_
      ->add_flag("--replace", replace_,
                 "With --no-resume: move an earlier run in the folder to OUTDIR/replaced-<time>/ "
                 "(nothing is deleted)")
      ->needs(no_resume);
  CLI::Option* workers =
      train_
          ->add_option("--workers", workers_,
                       "Launch N worker ranks through mpirun (data parallel over mesh.data; "
                       "docs/distributed.md) and return mpirun's exit status")
          ->check(IntAtLeast(1));
  train_->add_option("--hostfile", hostfile_, "With --workers: mpirun --hostfile (ranks on hosts)")
      ->needs(workers);
  train_
      ->add_option("--job-timeout", job_timeout_s_,
                   "With --workers: mpirun --timeout, the whole job is killed after S seconds "
                   "(0: none)")
      ->check(IntAtLeast(0))
      ->needs(workers);
  train_
      ->add_flag("--dry-run", dry_run_,
                 "With --workers: print the mpirun (or srun) command and exit 0")
      ->needs(workers);
  CLI::Option* slurm =
      train_
          ->add_flag("--slurm", slurm_,
                     "With --workers: start the ranks with Slurm's srun -n N --mpi=pmix -K "
                     "(inside an sbatch/salloc allocation, or asking Slurm for one) instead of "
                     "mpirun")
          ->needs(workers);
  train_
      ->add_option("--slurm-arg", slurm_args_,
                   "With --slurm: one more srun argument, e.g. --slurm-arg=--partition=gpu "
                   "(repeatable)")
      ->needs(slurm);
  train_
      ->add_option("--collective-timeout", collective_timeout_s_,
                   "In a multi-rank job: a collective that has not completed after S seconds "
                   "(a dead or hung peer) fails the job")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  eval_ = app.add_subcommand("eval", "Held-out loss and accuracy of a checkpoint");
  eval_->add_option("checkpoint", checkpoint_, "Run directory (latest checkpoint) or step_N dir")
      ->required();
  eval_->add_option("--config", eval_config_, "Config (default: RUNDIR/config.yaml)");
  eval_->add_option("--set", eval_sets_, "Override a config key (repeatable)")->take_all();
  eval_->add_option("--batches", eval_batches_, "Evaluate at most N batches (0: all)");

  export_ = app.add_subcommand(
      "export", "Export a checkpoint's predict graph and weights as a Kiln artifact");
  export_->add_option("checkpoint", checkpoint_, "Run directory (latest checkpoint) or step_N dir")
      ->required();
  export_->add_option("--out", export_out_, "Artifact directory to write")->required();
  export_
      ->add_option("--format", export_format_,
                   "kiln: the compiler artifact (manifest.json, program.ir, "
                   "weights.safetensors); hf: a Hugging Face GPT-2 directory (config.json, "
                   "model.safetensors) for GPT models")
      ->check(CLI::IsMember({"kiln", "hf"}));
  export_->add_option("--batch", export_batch_, "Batch size of the exported program")
      ->check(IntAtLeast(1))
      ->capture_default_str();
  export_->add_option("--config", eval_config_, "Config (default: RUNDIR/config.yaml)");
  export_->add_flag("--overwrite", export_overwrite_,
                    "Replace the files of an earlier export in --out (or add the export's files to "
                    "a non-empty folder); nothing else there is touched");
}

int TrainCommands::Run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (*train_) return RunTrain(args, out, err);
  if (*eval_) return RunEval(out, err);
  if (*export_) return RunExport(out, err);
  return -1;
}

int TrainCommands::Launch(const std::vector<std::string>& args, std::ostream& out,
                          std::ostream& err) {
  dist::LaunchOptions lo;
  lo.workers = workers_;
  lo.hostfile = hostfile_;
  lo.job_timeout_s = job_timeout_s_;
  lo.cores = std::max(1u, std::thread::hardware_concurrency());
  lo.root = geteuid() == 0;
  lo.binary = SelfExe();
  if (lo.binary.empty()) lo.binary = args.empty() ? "kiln" : args[0];
  lo.args.assign(args.begin() + (args.empty() ? 0 : 1), args.end());
  lo.env = ReadEnvironment();
  lo.slurm_args = slurm_args_;
  absl::StatusOr<std::vector<std::string>> argv =
      slurm_ ? dist::BuildSrunCommand(lo) : dist::BuildMpirunCommand(lo);
  if (!argv.ok()) return Fail(err, "train", argv.status());
  if (dry_run_) {
    out << dist::ShellJoin(*argv) << "\n";
    return 0;
  }
  std::string error;
  const int rc = RunChild(*argv, &error);
  if (rc < 0) return Fail(err, "train", absl::FailedPreconditionError(error));
  if (rc != 0 && rc != train::kExitPreempted) {
    err << "kiln train: the " << workers_ << "-worker job failed (" << (slurm_ ? "srun" : "mpirun")
        << " exit status " << rc << ")\n";
  }
  // Supervised (--max-restarts): a rank killed by a signal makes mpirun exit 128 + signal; die of
  // that signal too, so that the supervisor restarts the job from the latest checkpoint.
  if (rc > 128 && rc < 128 + 32 && train::IsSupervisedWorker(std::getenv(train::kWorkerEnvVar))) {
    err << std::flush;
    signal(rc - 128, SIG_DFL);
    raise(rc - 128);
  }
  return rc;
}

int TrainCommands::RunTrain(const std::vector<std::string>& args, std::ostream& out,
                            std::ostream& err) {
  if (max_restarts_ > 0 && !train::IsSupervisedWorker(std::getenv(train::kWorkerEnvVar))) {
    train::SupervisorOptions so;
    so.max_restarts = max_restarts_;
    return train::RunSupervised(args, so, err);
  }
  const dist::Environment env = ReadEnvironment();
  absl::StatusOr<dist::RankInfo> me = dist::DetectRank(env);
  if (!me.ok()) return Fail(err, "train", me.status());
  if (workers_ > 0) {
    if (me->size > 1) {
      return Fail(err, "train",
                  absl::InvalidArgumentError(
                      absl::StrCat("this process is already rank ", me->rank, " of ", me->size,
                                   " (started by ", me->launcher,
                                   "); drop --workers when starting kiln train with mpirun or "
                                   "srun yourself")));
    }
    return Launch(args, out, err);
  }
  std::unique_ptr<dist::Communicator> comm;
  if (me->size > 1) {
#ifdef KILN_HAVE_MPI
    absl::StatusOr<std::unique_ptr<dist::MpiCommunicator>> c = dist::MpiCommunicator::Create(
        std::chrono::milliseconds(static_cast<int64_t>(collective_timeout_s_ * 1000)));
    if (!c.ok()) return Fail(err, "train", c.status());
    comm = *std::move(c);
#else
    return Fail(err, "train",
                absl::FailedPreconditionError(
                    absl::StrCat("started as rank ", me->rank, " of ", me->size,
                                 " but this kiln was built without OpenMPI (libopenmpi-dev)")));
#endif
  }
  int rc = RunRank(args, comm.get(), out, err);
  // After a collective timed out the job's state is unknown: end every rank now (no peer then
  // waits for this one), instead of MPI_Finalize waiting on the collective still in flight.
  if (rc != 0 && comm != nullptr && comm->broken()) comm->Abort(rc);
  return rc;
}

// --validate-first N: -1 to go on with the run, else the exit status (3: refused, 1: failed).
int TrainCommands::ValidateBeforeRun(const train::TrainConfig& config,
                                     const train::TrainerOptions& opts, dist::Communicator* comm,
                                     std::ostream& out, std::ostream& err) {
  if (comm != nullptr && comm->size() > 1) {
    return Fail(err, "train",
                absl::InvalidArgumentError(
                    "--validate-first runs in one process: validate without --workers (or "
                    "mpirun/srun) first, then start the multi-rank run without it"));
  }
  out << "validate-first: training a scratch copy for " << validate_first_ << " steps\n"
      << std::flush;
  absl::StatusOr<train::ValidationReport> v = train::ValidateFirst(config, validate_first_, opts);
  if (!v.ok()) return Fail(err, "train", Annotate(v.status(), "--validate-first"));
  if (!v->passed) {
    err << "kiln train: --validate-first " << validate_first_ << " refused the run: " << v->reason
        << ". Nothing was written to " << config.output_dir << " (exit "
        << train::kExitValidationRefused << ")\n";
    return train::kExitValidationRefused;
  }
  out << absl::StrFormat("validate-first: passed in %.1fs: %s; starting the run\n", v->seconds,
                         v->reason)
      << std::flush;
  return -1;
}

int TrainCommands::RunRank(const std::vector<std::string>& args, dist::Communicator* comm,
                           std::ostream& out, std::ostream& err) {
  const bool chief = comm == nullptr || comm->rank() == 0;
  const std::string who =
      comm == nullptr ? "train"
                      : absl::StrCat("train (rank ", comm->rank(), " of ", comm->size(), ")");
  std::vector<std::string> sets = sets_;
  if (!output_dir_.empty()) sets.push_back("output_dir=" + output_dir_);
  if (!init_from_.empty()) sets.push_back("init_from.checkpoint=" + YamlQuoted(init_from_));
  std::vector<std::string> config_notes;
  absl::StatusOr<train::TrainConfig> config =
      train::LoadTrainConfig(config_path_, sets, &config_notes);
  if (!config.ok()) return Fail(err, who, config.status());
  if (chief)
    for (const std::string& n : config_notes) out << n << "\n";
  train::TrainerOptions opts;
  opts.comm = comm;
  opts.host = HostName();
  if (!profile_steps_.empty()) {
    absl::StatusOr<std::pair<int64_t, int64_t>> r = ParseRange(profile_steps_);
    if (!r.ok()) return Fail(err, "train", r.status());
    opts.profile_steps = *r;
  }
  absl::StatusOr<std::unique_ptr<runtime::Backend>> backend =
      MakeBackendByName(backend_, {.memory_limit_bytes = config->memory_limit_mib << 20});
  if (!backend.ok()) return Fail(err, "train", backend.status());
  opts.backend = backend->get();
  opts.log = &out;
  // A rank's stdout is mpirun's pseudo-terminal: log lines, not a progress line, there.
  opts.tty = comm == nullptr && &out == &std::cout && isatty(STDOUT_FILENO);
  opts.resume = !no_resume_;
  opts.replace = replace_;
  opts.run_info = RunInfo(**backend, config->precision);
  // A bf16 policy on a CPU where oneDNN's bf16 matmul is slower than f32 (no AMX), or where it
  // has none (below avx512_core: bf16 values compute in f32): say so once, with the rates
  // measured now (~0.1 s), and record them (docs/compiler.md).
  if (backend_ == "cpu" && config->precision != "f32") {
    absl::StatusOr<runtime::MatmulRates> rates = runtime::MeasureMatmulRates(1024, 3);
    if (!rates.ok()) {
      err << "kiln train: warning: could not measure the matmul rates: " << rates.status().message()
          << "\n";
    } else {
      opts.run_info["matmul_gflops"] = {{"f32", rates->f32 * 1e-9},
                                        {"bf16", rates->bf16 * 1e-9},
                                        {"bf16_computes_in_f32", rates->bf16_computes_in_f32},
                                        {"n", rates->n}};
      std::string warning = runtime::Bf16SlowerWarning(*rates, config->precision);
      if (!warning.empty()) err << "kiln train: warning: " << warning << "\n";
    }
  }
  train::InstallPreemptionHandlers();
  if (validate_first_ > 0) {
    const int rc = ValidateBeforeRun(*config, opts, comm, out, err);
    if (rc >= 0) return rc;
  }
  absl::StatusOr<std::unique_ptr<train::Trainer>> trainer = train::Trainer::Create(*config, opts);
  if (!trainer.ok()) return Fail(err, who, trainer.status());
  absl::StatusOr<train::TrainResult> r = (*trainer)->Run();
  if (!r.ok()) return Fail(err, who, r.status());
  return r->preempted ? train::kExitPreempted : 0;
}

int TrainCommands::RunEval(std::ostream& out, std::ostream& err) {
  absl::StatusOr<Source> where = ResolveCheckpoint(checkpoint_, eval_config_);
  if (!where.ok()) return Fail(err, "eval", where.status());
  std::vector<std::string> sets = eval_sets_;
  sets.push_back("output_dir=" + where->run_dir);
  absl::StatusOr<train::TrainConfig> config = train::LoadTrainConfig(where->config, sets);
  if (!config.ok()) return Fail(err, "eval", config.status());
  absl::StatusOr<std::unique_ptr<runtime::Backend>> backend = MakeBackendByName("cpu");
  if (!backend.ok()) return Fail(err, "eval", backend.status());
  // Only the held-out split is read, and only the loss and predict graphs are compiled.
  const train::ModelKind* kind = train::FindModelKind(config->model.kind);
  absl::StatusOr<train::TrainData> held =
      train::OpenTrainData(*config, kind != nullptr && kind->language_model, /*with_train=*/false);
  if (!held.ok()) return Fail(err, "eval", held.status());
  train::LoadOptions lo = LoadOptionsFor(*where);
  lo.shape = &held->shape;
  absl::StatusOr<train::LoadedRun> run = train::LoadRun(*config, lo);
  if (!run.ok()) return Fail(err, "eval", run.status());
  PrintRestoreNotes(err, "eval", *run);
  absl::StatusOr<std::unique_ptr<train::Evaluator>> evaluator =
      train::Evaluator::Create(**backend, *run->model, *held);
  if (!evaluator.ok()) return Fail(err, "eval", evaluator.status());
  (*evaluator)->set_recall_k(config->eval_recall_k);
  absl::StatusOr<train::EvalResult> e = (*evaluator)->Run(run->params, eval_batches_);
  if (!e.ok()) return Fail(err, "eval", e.status());
  out << absl::StrFormat("step %d: held-out loss %.4f accuracy %.4f", run->step, e->loss,
                         e->accuracy);
  if (e->perplexity > 0)
    out << absl::StrFormat(" perplexity %.2f", e->perplexity);  // language models
  out << train::RankingText(*e);  // two-class classifiers: auc; the recommender: recall@K
  out << absl::StrFormat(" (%d examples)\n", e->examples);
  for (const train::LanguageEval& l : e->languages) {  // multilingual tokens: sources
    out << absl::StrFormat("  %s: held-out loss %.4f accuracy %.4f perplexity %.2f (%d examples)\n",
                           l.language, l.loss, l.accuracy, l.perplexity, l.examples);
  }
  return 0;
}

int TrainCommands::RunExport(std::ostream& out, std::ostream& err) {
  absl::StatusOr<Source> where = ResolveCheckpoint(checkpoint_, eval_config_);
  if (!where.ok()) return Fail(err, "export", where.status());
  bool out_exists = false;
  absl::Status target =
      CheckExportTarget(export_out_, *where, export_format_, export_overwrite_, &out_exists);
  if (!target.ok()) return Fail(err, "export", target);
  absl::StatusOr<train::TrainConfig> config =
      train::LoadTrainConfig(where->config, {"output_dir=" + where->run_dir});
  if (!config.ok()) return Fail(err, "export", config.status());
  absl::StatusOr<std::unique_ptr<runtime::Backend>> backend = MakeBackendByName("cpu");
  if (!backend.ok()) return Fail(err, "export", backend.status());
  // The model and its parameters only: no data is read and no training step compiled.
  absl::StatusOr<train::LoadedRun> run = train::LoadRun(*config, LoadOptionsFor(*where));
  if (!run.ok()) return Fail(err, "export", run.status());
  PrintRestoreNotes(err, "export", *run);
  if (export_format_ == "hf") {
    const auto* gpt = dynamic_cast<const nn::Gpt*>(&(*run->model));
    if (gpt == nullptr)
      return Fail(err, "export",
                  absl::InvalidArgumentError("--format hf exports GPT models only; this run is " +
                                             (*run->model).Describe()));
    absl::Status s = WriteExport(export_out_, out_exists, "hf", [&](const std::string& dir) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) return absl::InternalError("cannot create " + dir + ": " + ec.message());
      return gpt->ExportHuggingFace(run->params, dir);
    });
    if (!s.ok()) return Fail(err, "export", s);
    out << "exported step " << run->step << " of " << (*run->model).Describe() << " to "
        << export_out_
        << " (config.json, model.safetensors: GPT2LMHeadModel.from_pretrained loads it)\n";
    return 0;
  }
  absl::StatusOr<ir::Graph> predict = (*run->model).PredictGraph(export_batch_);
  if (!predict.ok()) return Fail(err, "export", predict.status());
  // The artifact holds the optimized program: what the cpu backend's pipeline makes of the
  // predict graph (an executable's graph() is its optimized graph, same parameters and outputs).
  absl::StatusOr<std::unique_ptr<runtime::Executable>> compiled = (*backend)->Compile(*predict);
  if (!compiled.ok()) return Fail(err, "export", compiled.status());
  const ir::Graph* program = &(*compiled)->graph();
  std::map<std::string, Tensor> weights;
  const nn::ParamStore& p = run->params;
  for (int i = 0; i < p.size(); ++i) weights[p.names()[i]] = p.value(i);
  compiler::ArtifactOptions ao;
  ao.backend = "cpu/" + runtime::OneDnnIsaName();  // the compile-cache key of the cpu backend
  ao.metadata = {{"model", (*run->model).Describe()},
                 {"step", std::to_string(run->step)},
                 {"config_hash", train::ConfigHash(*config)},
                 {"kiln_version", KilnVersion()}};
  // data.augment.normalize is the input pipeline's, outside the program: record it for kiln
  // predict to apply to raw inputs (input_normalization.h). It applies to the f32 image input.
  std::vector<std::string> weight_names;
  for (const auto& [name, t] : weights) weight_names.push_back(name);
  for (const compiler::TensorSpec& in :
       compiler::SignatureOf(*program, weight_names).RuntimeInputs()) {
    if (in.dtype != DType::kF32) continue;
    if (std::optional<InputNormalization> n = InputNormalizationOf(*config, in.name)) {
      ao.metadata[kInputNormalizationKey] = n->ToJson();
    }
    break;
  }
  absl::Status s = WriteExport(export_out_, out_exists, "kiln", [&](const std::string& dir) {
    return compiler::WriteArtifact(dir, *program, weights, ao);
  });
  if (!s.ok()) return Fail(err, "export", s);
  out << "exported step " << run->step << " of " << (*run->model).Describe() << " to "
      << export_out_ << " (manifest.json, program.ir, weights.safetensors)\n";
  return 0;
}

}  // namespace kiln::cli
