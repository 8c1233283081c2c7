#include "kiln/cli/demo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/cli/backends.h"
#include "kiln/data/pipeline.h"
#include "kiln/ir/printer.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/optim.h"
#include "kiln/nn/params.h"
#include "kiln/nn/train_step.h"

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

namespace {

// The digits CSV as the input pipeline's csv: source: shuffled training batches, and the whole
// held-out split (split seed = options.seed) as one batch.
struct DemoData {
  std::unique_ptr<data::InputPipeline> train, held_out;
  int64_t examples = 0, features = 0;
};

absl::StatusOr<DemoData> OpenDemoData(const std::string& path, const DemoOptions& o) {
  data::PipelineConfig pc;
  pc.source = "csv:" + path;
  pc.held_out_fraction = o.held_out_fraction;
  pc.split_seed = o.seed;
  pc.split = "held_out";
  pc.shuffle = false;
  pc.prefetch = 0;
  pc.batch_size = std::numeric_limits<int64_t>::max();
  pc.shrink_batch = true;
  DemoData d;
  KILN_ASSIGN_OR_RETURN(d.held_out, data::InputPipeline::Create(pc));
  d.examples = d.held_out->source_examples();
  d.features = d.held_out->feature_type().shape[1];
  const int64_t train_size = d.examples - d.held_out->examples_per_epoch();
  if (o.batch > train_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch ", o.batch, " is larger than the training set (", train_size, " rows)"));
  }
  pc.split = "train";
  pc.shuffle = true;
  pc.seed = o.seed + 1;
  pc.prefetch = 2;
  pc.batch_size = o.batch;
  pc.shrink_batch = false;
  KILN_ASSIGN_OR_RETURN(d.train, data::InputPipeline::Create(pc));
  return d;
}

// Plain SGD at a constant rate: p -= lr * grad, in the graph.
nn::TrainStepOptions SgdOptions(double lr) {
  nn::TrainStepOptions o;
  o.optimizer.kind = nn::OptimizerKind::kSgd;
  o.optimizer.schedule.kind = nn::ScheduleKind::kConstant;
  o.optimizer.schedule.lr = lr;
  return o;
}

absl::Status DescribeCompile(const DemoOptions& options, const runtime::Backend& backend,
                             const ir::Graph& loss_graph, const nn::TrainStep& step,
                             double eval_compile_s, std::ostream& out) {
  const runtime::Executable& step_exe = step.executable();
  out << "graph:   forward + loss " << loss_graph.num_nodes() << " nodes; train step "
      << step_exe.graph().num_nodes()
      << " nodes (backward from autodiff, SGD update p -= lr * grad inside the graph)\n";
  out << "backend: " << backend.name() << ": train step compiled in "
      << absl::StrFormat("%.1f ms", step.compile_seconds() * 1e3) << " (" << step_exe.num_thunks()
      << " thunks, arena " << FormatBytes(step_exe.plan().arena_bytes) << "), evaluation graph in "
      << absl::StrFormat("%.1f ms", eval_compile_s * 1e3) << "\n";
  if (!options.dump_ir.empty()) {
    if (!WriteStringToFile(Env::Default(), ir::PrintGraph(step_exe.graph()), options.dump_ir).ok())
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write --dump-ir file ", options.dump_ir));
    out << "ir:      train step written to " << options.dump_ir << "\n";
  }
  return absl::OkStatus();
}

// Runs options.steps updates, printing the first loss and the mean loss of every log interval.
absl::Status Train(const DemoOptions& options, data::InputPipeline& batches, nn::TrainStep& step,
                   DemoResult& result, std::ostream& out) {
  const int64_t log_every =
      options.log_every > 0 ? options.log_every : std::max<int64_t>(1, options.steps / 10);
  out << "train:   " << options.steps << " steps of SGD, batch " << options.batch << ", lr "
      << options.lr << " ("
      << absl::StrFormat("%.1f", static_cast<double>(options.steps) / batches.batches_per_epoch())
      << " epochs)\n";
  Tensor x(batches.feature_type().dtype, batches.feature_type().shape);
  Tensor labels(batches.label_type().dtype, batches.label_type().shape);
  double interval_sum = 0;
  int64_t interval_steps = 0;
  for (int64_t i = 1; i <= options.steps; ++i) {
    KILN_RETURN_IF_ERROR(batches.Next(x, labels));
    absl::StatusOr<nn::StepMetrics> m = step.Run({&x, &labels});
    if (!m.ok()) return Annotate(m.status(), absl::StrCat("training step ", i));
    const float loss = m->loss;
    if (!std::isfinite(loss)) {
      return absl::InternalError(
          absl::StrCat("loss became ", loss, " at step ", i, " (try a smaller --lr)"));
    }
    if (i == 1) {
      result.first_loss = loss;
      out << absl::StrFormat("  step %5d  loss %.4f\n", i, loss);
      continue;
    }
    interval_sum += loss;
    ++interval_steps;
    if (i % log_every == 0 || i == options.steps) {
      result.final_loss = interval_sum / interval_steps;
      out << absl::StrFormat("  step %5d  loss %.4f  (mean of steps %d-%d)\n", i, result.final_loss,
                             i - interval_steps + 1, i);
      interval_sum = 0;
      interval_steps = 0;
    }
  }
  if (options.steps == 1) result.final_loss = result.first_loss;
  return absl::OkStatus();
}

// Scores the whole held-out split (one batch) with the trained parameters.
absl::Status Evaluate(runtime::Executable& predict, const nn::ParamStore& trained,
                      data::InputPipeline& held_out, DemoResult& result, std::ostream& out) {
  std::map<std::string, Tensor> inputs;
  for (int i = 0; i < trained.size(); ++i) inputs[trained.names()[i]] = trained.value(i);
  Tensor x(held_out.feature_type().dtype, held_out.feature_type().shape);
  Tensor labels(held_out.label_type().dtype, held_out.label_type().shape);
  KILN_RETURN_IF_ERROR(held_out.Next(x, labels));
  inputs["x"] = x;
  absl::StatusOr<std::map<std::string, Tensor>> scored = predict.RunNamed(inputs);
  if (!scored.ok()) return Annotate(scored.status(), "evaluating the held-out set");
  const Tensor& prediction = scored->at("prediction");
  const int64_t n = labels.num_elements();
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    correct += prediction.data<int32_t>()[i] == labels.data<int32_t>()[i];
  }
  result.held_out_accuracy = static_cast<double>(correct) / n;
  out << "held-out accuracy: " << FormatAccuracy(result.held_out_accuracy) << " (" << correct << "/"
      << n << ")\n";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DemoResult> RunDemo(const DemoOptions& options, std::ostream& out) {
  KILN_RETURN_IF_ERROR(ValidateOptions(options));
  DemoResult result;

  std::string data_path = options.data;
  if (data_path.empty()) {
    KILN_ASSIGN_OR_RETURN(data_path, FindDefaultDigitsData(DefaultDigitsDataCandidates()));
  }
  KILN_ASSIGN_OR_RETURN(DemoData data, OpenDemoData(data_path, options));
  const int64_t num_classes = 10;  // the digits layout
  const int64_t held = data.held_out->examples_per_epoch();

  nn::MlpClassifier model(
      {.in_features = data.features, .hidden = options.hidden, .num_classes = num_classes});
  KILN_ASSIGN_OR_RETURN(nn::ParamStore params, nn::InitParams(model.Params(), options.seed));
  KILN_ASSIGN_OR_RETURN(ir::Graph loss_graph, model.LossGraph(options.batch));
  KILN_ASSIGN_OR_RETURN(ir::Graph predict_graph, model.PredictGraph(held));

  out << "kiln demo: a " << model.Describe()
      << " MLP (relu) learns handwritten digits, trained end to end by the Kiln engine\n";
  out << "data:    " << data_path << ": " << data.examples << " images of " << data.features
      << " pixels, " << num_classes << " classes -> " << data.examples - held << " train / " << held
      << " held out (split seed " << options.seed << ")\n";
  out << "model:   " << params.size() << " parameter tensors, " << params.num_elements()
      << " weights, torch.nn.Linear-style init (seed " << options.seed << ")\n";

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend,
                        MakeBackendByName(options.backend));
  const int64_t num_weights = params.num_elements();
  KILN_ASSIGN_OR_RETURN(
      std::unique_ptr<nn::TrainStep> step,
      nn::TrainStep::Create(*backend, loss_graph, std::move(params), SgdOptions(options.lr)));
  const Clock::time_point eval_compile_start = Clock::now();
  absl::StatusOr<std::unique_ptr<runtime::Executable>> predict = backend->Compile(predict_graph);
  if (!predict.ok()) return Annotate(predict.status(), "compiling the evaluation graph");
  KILN_RETURN_IF_ERROR(
      DescribeCompile(options, *backend, loss_graph, *step, SecondsSince(eval_compile_start), out));

  const Clock::time_point train_start = Clock::now();
  KILN_RETURN_IF_ERROR(Train(options, *data.train, *step, result, out));
  const double train_s = SecondsSince(train_start);
  result.steps_per_second = options.steps / train_s;
  out << "trained: "
      << absl::StrFormat("%.3f s, %.0f steps/s, %.0f examples/s", train_s, result.steps_per_second,
                         result.steps_per_second * options.batch)
      << " ("
      << absl::StrFormat("%.2f", 6.0 * num_weights * options.batch * result.steps_per_second / 1e9)
      << " GFLOP/s of matmul work)\n";

  KILN_RETURN_IF_ERROR(Evaluate(**predict, step->params(), *data.held_out, result, out));
  return result;
}

}  // namespace kiln::cli
