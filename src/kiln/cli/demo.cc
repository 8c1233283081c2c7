#include "kiln/cli/demo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/cli/backends.h"
#include "kiln/data/dataset.h"
#include "kiln/data/digits.h"
#include "kiln/ir/printer.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/params.h"
#include "kiln/nn/sgd.h"

namespace kiln::cli {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

absl::Status ValidateOptions(const DemoOptions& o) {
  if (o.steps < 1)
    return absl::InvalidArgumentError(absl::StrCat("--steps must be >= 1, got ", o.steps));
  if (o.batch < 1)
    return absl::InvalidArgumentError(absl::StrCat("--batch must be >= 1, got ", o.batch));
  if (!(o.lr > 0) || !std::isfinite(o.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("--lr must be a positive number, got ", o.lr));
  }
  if (o.hidden.empty()) return absl::InvalidArgumentError("--hidden needs at least one width");
  for (int64_t h : o.hidden) {
    if (h < 1)
      return absl::InvalidArgumentError(absl::StrCat("--hidden widths must be >= 1, got ", h));
  }
  if (!(o.held_out_fraction > 0 && o.held_out_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--held-out must be in (0, 1), got ", o.held_out_fraction));
  }
  if (o.log_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--log-every must be >= 0, got ", o.log_every));
  }
  return absl::OkStatus();
}

// Accuracy truncated (not rounded) to 3 decimals, so "0.900" means at least 90%.
std::string FormatAccuracy(double acc) {
  return absl::StrFormat("%.3f", std::floor(acc * 1000.0 + 1e-9) / 1000.0);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  if (bytes < 1024 * 1024) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024.0));
}

constexpr char kDigitsData[] = "examples/data/digits.csv.gz";

}  // namespace

std::vector<std::string> DefaultDigitsDataCandidates() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  auto add = [&out](const fs::path& root) {
    std::string p = (root / kDigitsData).lexically_normal().string();
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  std::error_code ec;
  fs::path cwd = fs::current_path(ec);
  add(ec ? fs::path(".") : cwd);
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (int up = 0; up <= 4 && !dir.empty(); ++up) {
      add(dir);
      if (dir == dir.root_path()) break;
      dir = dir.parent_path();
    }
  }
#ifdef KILN_SOURCE_DIR
  add(fs::path(KILN_SOURCE_DIR));
#endif
  return out;
}

absl::StatusOr<std::string> FindDefaultDigitsData(const std::vector<std::string>& candidates) {
  for (const std::string& c : candidates) {
    if (Env::Default()->FileExists(c)) return c;
  }
  return absl::NotFoundError(absl::StrCat(
      "cannot find the digits data ", kDigitsData, "; looked in: ", absl::StrJoin(candidates, ", "),
      ". Run from the source tree, or pass --data FILE (a digits CSV: 64 pixels 0..16, then the "
      "label)"));
}

absl::StatusOr<DemoResult> RunDemo(const DemoOptions& options, std::ostream& out) {
  KILN_RETURN_IF_ERROR(ValidateOptions(options));
  DemoResult result;

  // ---- Data ----
  std::string data_path = options.data;
  if (data_path.empty()) {
    KILN_ASSIGN_OR_RETURN(data_path, FindDefaultDigitsData(DefaultDigitsDataCandidates()));
  }
  KILN_ASSIGN_OR_RETURN(data::Dataset all, data::LoadDigitsCsv(data_path));
  KILN_ASSIGN_OR_RETURN(data::TrainTestSplit split,
                        data::SplitDataset(all, options.held_out_fraction, options.seed));
  if (options.batch > split.train.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--batch ", options.batch,
                                                   " is larger than the training set (",
                                                   split.train.size(), " rows)"));
  }
  KILN_ASSIGN_OR_RETURN(data::BatchIterator batches,
                        data::BatchIterator::Create(split.train, options.batch, options.seed + 1));

  // ---- Model ----
  nn::MlpClassifier model({.in_features = all.num_features(),
                           .hidden = options.hidden,
                           .num_classes = all.num_classes});
  KILN_ASSIGN_OR_RETURN(nn::ParamStore params, nn::InitParams(model.Params(), options.seed));
  KILN_ASSIGN_OR_RETURN(ir::Graph loss_graph, model.LossGraph(options.batch));
  KILN_ASSIGN_OR_RETURN(ir::Graph predict_graph, model.PredictGraph(split.held_out.size()));

  out << "kiln demo: a " << model.Describe()
      << " MLP (relu) learns handwritten digits, trained end to end by the Kiln engine\n";
  out << "data:    " << data_path << ": " << all.size() << " images of " << all.num_features()
      << " pixels, " << all.num_classes << " classes -> " << split.train.size() << " train / "
      << split.held_out.size() << " held out (split seed " << options.seed << ")\n";
  out << "model:   " << params.size() << " parameter tensors, " << params.num_elements()
      << " weights, torch.nn.Linear-style init (seed " << options.seed << ")\n";

  // ---- Compile ----
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend,
                        MakeBackendByName(options.backend));
  const int64_t num_weights = params.num_elements();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<nn::SgdTrainer> trainer,
                        nn::SgdTrainer::Create(*backend, loss_graph, std::move(params)));
  const Clock::time_point eval_compile_start = Clock::now();
  absl::StatusOr<std::unique_ptr<runtime::Executable>> predict = backend->Compile(predict_graph);
  if (!predict.ok()) return Annotate(predict.status(), "compiling the evaluation graph");
  const double eval_compile_s = SecondsSince(eval_compile_start);

  const runtime::Executable& step_exe = trainer->executable();
  out << "graph:   forward + loss " << loss_graph.num_nodes() << " nodes; train step "
      << step_exe.graph().num_nodes()
      << " nodes (backward from autodiff, SGD update p -= lr * grad inside the graph)\n";
  out << "backend: " << backend->name() << ": train step compiled in "
      << absl::StrFormat("%.1f ms", trainer->compile_seconds() * 1e3) << " ("
      << step_exe.num_thunks() << " thunks, arena " << FormatBytes(step_exe.plan().arena_bytes)
      << "), evaluation graph in " << absl::StrFormat("%.1f ms", eval_compile_s * 1e3) << "\n";
  if (!options.dump_ir.empty()) {
    std::ofstream f(options.dump_ir, std::ios::binary | std::ios::trunc);
    f << ir::PrintGraph(step_exe.graph());
    f.close();
    if (!f)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write --dump-ir file ", options.dump_ir));
    out << "ir:      train step written to " << options.dump_ir << "\n";
  }

  // ---- Train ----
  const int64_t log_every =
      options.log_every > 0 ? options.log_every : std::max<int64_t>(1, options.steps / 10);
  out << "train:   " << options.steps << " steps of SGD, batch " << options.batch << ", lr "
      << options.lr << " ("
      << absl::StrFormat("%.1f", static_cast<double>(options.steps) / batches.batches_per_epoch())
      << " epochs)\n";
  Tensor x(DType::kF32, Shape{options.batch, all.num_features()});
  Tensor labels(DType::kS32, Shape{options.batch});
  double interval_sum = 0;
  int64_t interval_steps = 0;
  const Clock::time_point train_start = Clock::now();
  for (int64_t step = 1; step <= options.steps; ++step) {
    KILN_RETURN_IF_ERROR(batches.Next(x, labels));
    absl::StatusOr<float> loss = trainer->Step({&x, &labels}, static_cast<float>(options.lr));
    if (!loss.ok()) return Annotate(loss.status(), absl::StrCat("training step ", step));
    if (!std::isfinite(*loss)) {
      return absl::InternalError(
          absl::StrCat("loss became ", *loss, " at step ", step, " (try a smaller --lr)"));
    }
    if (step == 1) {
      result.first_loss = *loss;
      out << absl::StrFormat("  step %5d  loss %.4f\n", step, *loss);
      continue;
    }
    interval_sum += *loss;
    ++interval_steps;
    if (step % log_every == 0 || step == options.steps) {
      result.final_loss = interval_sum / interval_steps;
      out << absl::StrFormat("  step %5d  loss %.4f  (mean of steps %d-%d)\n", step,
                             result.final_loss, step - interval_steps + 1, step);
      interval_sum = 0;
      interval_steps = 0;
    }
  }
  if (options.steps == 1) result.final_loss = result.first_loss;
  const double train_s = SecondsSince(train_start);
  result.steps_per_second = options.steps / train_s;
  out << "trained: "
      << absl::StrFormat("%.3f s, %.0f steps/s, %.0f examples/s", train_s, result.steps_per_second,
                         result.steps_per_second * options.batch)
      << " ("
      << absl::StrFormat("%.2f", 6.0 * num_weights * options.batch * result.steps_per_second / 1e9)
      << " GFLOP/s of matmul work)\n";

  // ---- Evaluate ----
  std::map<std::string, Tensor> inputs;
  const nn::ParamStore& trained = trainer->params();
  for (int i = 0; i < trained.size(); ++i) inputs[trained.names()[i]] = trained.value(i);
  inputs["x"] = split.held_out.features;
  absl::StatusOr<std::map<std::string, Tensor>> scored = (*predict)->RunNamed(inputs);
  if (!scored.ok()) return Annotate(scored.status(), "evaluating the held-out set");
  const Tensor& prediction = scored->at("prediction");
  int64_t correct = 0;
  for (int64_t i = 0; i < split.held_out.size(); ++i) {
    correct += prediction.data<int32_t>()[i] == split.held_out.labels.data<int32_t>()[i];
  }
  result.held_out_accuracy = static_cast<double>(correct) / split.held_out.size();
  out << "held-out accuracy: " << FormatAccuracy(result.held_out_accuracy) << " (" << correct << "/"
      << split.held_out.size() << ")\n";
  return result;
}

}  // namespace kiln::cli
