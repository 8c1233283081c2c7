#include "kiln/cli/train_cmd.h"

#include <omp.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/cli/app.h"
#include "kiln/cli/backends.h"
#include "kiln/compiler/artifact.h"
#include "kiln/ir/printer.h"
#include "kiln/nn/gpt.h"
#include "kiln/runtime/cpu/machine.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/config.h"
#include "kiln/train/supervisor.h"
#include "kiln/train/trainer.h"
#include "oneapi/dnnl/dnnl.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

int Fail(std::ostream& err, const std::string& command, const absl::Status& s) {
  err << "kiln " << command << ": " << s.message() << "\n";
  return 1;
}

nlohmann::json RunInfo(const std::string& backend, const std::string& precision) {
  const dnnl_version_t* v = dnnl_version();
  nlohmann::json j;
  j["kiln_version"] = KilnVersion();
  j["onednn_version"] = absl::StrFormat("%d.%d.%d", v->major, v->minor, v->patch);
  if (v->hash != nullptr) j["onednn_hash"] = v->hash;
  j["isa"] = runtime::OneDnnIsaName();
  j["threads"] = omp_get_max_threads();
  j["hardware_threads"] = std::thread::hardware_concurrency();
  // The cpu backend's defaults (runtime/cpu/cpu_backend.h): the optimize pipeline with loop and
  // matmul-epilogue fusion; the precision policy comes from the config.
  j["compiler_options"] = {{"backend", backend},
                           {"precision", precision},
                           {"optimize", true},
                           {"fusion", backend == "cpu"}};
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

// OUTDIR (holding config.yaml) or OUTDIR/checkpoints/step_N -> (OUTDIR, N or -1 for latest).
absl::StatusOr<std::pair<std::string, int64_t>> ResolveCheckpoint(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::path(path);
  if (fs::exists(p / "config.yaml", ec)) return std::make_pair(p.string(), int64_t{-1});
  fs::path norm = p.lexically_normal();
  if (norm.filename().empty()) norm = norm.parent_path();
  int64_t step = train::ParseCheckpointDirName(norm.filename().string());
  if (step >= 0) {
    fs::path outdir = norm.parent_path().parent_path();
    if (outdir.empty()) outdir = ".";
    return std::make_pair(outdir.string(), step);
  }
  return absl::NotFoundError(
      absl::StrCat("'", path,
                   "' is neither a run directory (with config.yaml) nor a checkpoint directory "
                   "(.../checkpoints/step_N)"));
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
      ->check(CLI::NonNegativeNumber);
  train_->add_option("--profile-steps", profile_steps_,
                     "Profile steps A..B-1 (A:B): OUTDIR/trace.json and a time breakdown");
  train_->add_option("--output-dir", output_dir_, "Output directory (overrides output_dir)");
  train_->add_option("--backend", backend_, "Backend: cpu (oneDNN) or reference")
      ->check(CLI::IsMember(BackendNames()))
      ->capture_default_str();
  train_->add_flag("--no-resume", no_resume_, "Ignore existing checkpoints (start from step 0)");

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
  export_->add_option("--format", export_format_,
                      "kiln: the compiler artifact (manifest.json, program.ir, "
                      "weights.safetensors); hf: a Hugging Face GPT-2 directory (config.json, "
                      "model.safetensors) for GPT models")
      ->check(CLI::IsMember({"kiln", "hf"}));
  export_->add_option("--batch", export_batch_, "Batch size of the exported program")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  export_->add_option("--config", eval_config_, "Config (default: RUNDIR/config.yaml)");
}

int TrainCommands::Run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (*train_) return RunTrain(args, out, err);
  if (*eval_) return RunEval(out, err);
  if (*export_) return RunExport(out, err);
  return -1;
}

int TrainCommands::RunTrain(const std::vector<std::string>& args, std::ostream& out,
                            std::ostream& err) {
  if (max_restarts_ > 0 && !train::IsSupervisedWorker()) {
    train::SupervisorOptions so;
    so.max_restarts = max_restarts_;
    return train::RunSupervised(args, so, err);
  }
  std::vector<std::string> sets = sets_;
  if (!output_dir_.empty()) sets.push_back("output_dir=" + output_dir_);
  absl::StatusOr<train::TrainConfig> config = train::LoadTrainConfig(config_path_, sets);
  if (!config.ok()) return Fail(err, "train", config.status());
  train::TrainerOptions opts;
  if (!profile_steps_.empty()) {
    absl::StatusOr<std::pair<int64_t, int64_t>> r = ParseRange(profile_steps_);
    if (!r.ok()) return Fail(err, "train", r.status());
    opts.profile_steps = *r;
  }
  absl::StatusOr<std::unique_ptr<runtime::Backend>> backend = MakeBackendByName(backend_);
  if (!backend.ok()) return Fail(err, "train", backend.status());
  opts.backend = backend->get();
  opts.log = &out;
  opts.tty = &out == &std::cout && isatty(STDOUT_FILENO);
  opts.resume = !no_resume_;
  opts.run_info = RunInfo(backend_, config->precision);
  // A bf16 policy on a CPU where oneDNN's bf16 matmul is slower than f32 (no AMX): say so once,
  // with both rates measured now (~0.1 s), and record them (docs/compiler.md).
  if (backend_ == "cpu" && config->precision != "f32") {
    runtime::MatmulRates rates = runtime::MeasureMatmulRates(1024, 3);
    opts.run_info["matmul_gflops"] = {
        {"f32", rates.f32 * 1e-9}, {"bf16", rates.bf16 * 1e-9}, {"n", rates.n}};
    std::string warning = runtime::Bf16SlowerWarning(rates, config->precision);
    if (!warning.empty()) err << "kiln train: warning: " << warning << "\n";
  }
  train::InstallPreemptionHandlers();
  absl::StatusOr<std::unique_ptr<train::Trainer>> trainer = train::Trainer::Create(*config, opts);
  if (!trainer.ok()) return Fail(err, "train", trainer.status());
  absl::StatusOr<train::TrainResult> r = (*trainer)->Run();
  if (!r.ok()) return Fail(err, "train", r.status());
  return r->preempted ? train::kExitPreempted : 0;
}

int TrainCommands::RunEval(std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::pair<std::string, int64_t>> where = ResolveCheckpoint(checkpoint_);
  if (!where.ok()) return Fail(err, "eval", where.status());
  std::vector<std::string> sets = eval_sets_;
  sets.push_back("output_dir=" + where->first);
  std::string cfg = eval_config_.empty() ? where->first + "/config.yaml" : eval_config_;
  absl::StatusOr<train::TrainConfig> config = train::LoadTrainConfig(cfg, sets);
  if (!config.ok()) return Fail(err, "eval", config.status());
  absl::StatusOr<std::unique_ptr<runtime::Backend>> backend = MakeBackendByName("cpu");
  if (!backend.ok()) return Fail(err, "eval", backend.status());
  train::TrainerOptions opts;
  opts.backend = backend->get();
  opts.read_only = true;
  opts.restore_step = where->second;
  absl::StatusOr<std::unique_ptr<train::Trainer>> t = train::Trainer::Create(*config, opts);
  if (!t.ok()) return Fail(err, "eval", t.status());
  absl::StatusOr<train::EvalResult> e = (*t)->Evaluate(eval_batches_);
  if (!e.ok()) return Fail(err, "eval", e.status());
  out << absl::StrFormat("step %d: held-out loss %.4f accuracy %.4f", (*t)->train_step().step(),
                         e->loss, e->accuracy);
  if (e->perplexity > 0) out << absl::StrFormat(" perplexity %.2f", e->perplexity);  // language models
  out << absl::StrFormat(" (%d examples)\n", e->examples);
  return 0;
}

int TrainCommands::RunExport(std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::pair<std::string, int64_t>> where = ResolveCheckpoint(checkpoint_);
  if (!where.ok()) return Fail(err, "export", where.status());
  std::string cfg = eval_config_.empty() ? where->first + "/config.yaml" : eval_config_;
  absl::StatusOr<train::TrainConfig> config =
      train::LoadTrainConfig(cfg, {"output_dir=" + where->first});
  if (!config.ok()) return Fail(err, "export", config.status());
  absl::StatusOr<std::unique_ptr<runtime::Backend>> backend = MakeBackendByName("cpu");
  if (!backend.ok()) return Fail(err, "export", backend.status());
  train::TrainerOptions opts;
  opts.backend = backend->get();
  opts.read_only = true;
  opts.restore_step = where->second;
  absl::StatusOr<std::unique_ptr<train::Trainer>> t = train::Trainer::Create(*config, opts);
  if (!t.ok()) return Fail(err, "export", t.status());
  if (export_format_ == "hf") {
    const auto* gpt = dynamic_cast<const nn::Gpt*>(&(*t)->model());
    if (gpt == nullptr)
      return Fail(err, "export",
                  absl::InvalidArgumentError("--format hf exports GPT models only; this run is " +
                                             (*t)->model().Describe()));
    std::error_code ec;
    std::filesystem::create_directories(export_out_, ec);
    if (ec)
      return Fail(err, "export",
                  absl::InternalError("cannot create " + export_out_ + ": " + ec.message()));
    absl::Status s = gpt->ExportHuggingFace((*t)->train_step().params(), export_out_);
    if (!s.ok()) return Fail(err, "export", s);
    out << "exported step " << (*t)->train_step().step() << " of " << (*t)->model().Describe()
        << " to " << export_out_
        << " (config.json, model.safetensors: GPT2LMHeadModel.from_pretrained loads it)\n";
    return 0;
  }
  absl::StatusOr<ir::Graph> predict = (*t)->model().PredictGraph(export_batch_);
  if (!predict.ok()) return Fail(err, "export", predict.status());
  // The artifact holds the optimized program: what the cpu backend's pipeline makes of the
  // predict graph (an executable's graph() is its optimized graph, same parameters and outputs).
  absl::StatusOr<std::unique_ptr<runtime::Executable>> compiled = (*backend)->Compile(*predict);
  if (!compiled.ok()) return Fail(err, "export", compiled.status());
  const ir::Graph* program = &(*compiled)->graph();
  std::map<std::string, Tensor> weights;
  const nn::ParamStore& p = (*t)->train_step().params();
  for (int i = 0; i < p.size(); ++i) weights[p.names()[i]] = p.value(i);
  compiler::ArtifactOptions ao;
  ao.backend = "cpu";
  ao.overwrite = true;
  ao.metadata = {{"model", (*t)->model().Describe()},
                 {"step", std::to_string((*t)->train_step().step())},
                 {"config_hash", train::ConfigHash(*config)},
                 {"kiln_version", KilnVersion()}};
  absl::Status s = compiler::WriteArtifact(export_out_, *program, weights, ao);
  if (!s.ok()) return Fail(err, "export", s);
  out << "exported step " << (*t)->train_step().step() << " of " << (*t)->model().Describe()
      << " to " << export_out_ << " (manifest.json, program.ir, weights.safetensors)\n";
  return 0;
}

}  // namespace kiln::cli
