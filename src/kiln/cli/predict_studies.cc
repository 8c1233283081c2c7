// `kiln predict MODEL --input-dir STUDIES --out FILE`: bulk classification of DICOM studies
// (docs/cli.md "kiln predict", docs/workloads.md "4. Bulk radiology classification"). A batch job:
// decoding (GDCM, the importer's preprocessing) runs on worker threads a chunk ahead of the model,
// which classifies whole batches; results stream to FILE.partial, renamed to FILE at the end.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/cli/backends.h"
#include "kiln/cli/input_normalization.h"
#include "kiln/cli/predict_cmd.h"
#include "kiln/compiler/artifact.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/import_util.h"
#include "kiln/data/shard_io.h"
#include "kiln/train/config.h"
#include "kiln/train/evaluator.h"
#include "nlohmann/json.hpp"
#ifdef KILN_HAVE_GDCM
#include "kiln/data/import/dicom/dicom_import.h"
#endif

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string ClockText(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// Wall-clock time of day `seconds` from now, HH:MM:SS (local time).
std::string TimeOfDay(double seconds_from_now) {
  const std::time_t t =
      std::time(nullptr) + static_cast<std::time_t>(std::isfinite(seconds_from_now)
                                                        ? std::max(0.0, seconds_from_now)
                                                        : 0.0);
  std::tm tm{};
  localtime_r(&t, &tm);
  return absl::StrFormat("%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

// The preprocessing and labels of the DICOM import a model was trained on.
struct Preprocess {
  int height = 0, width = 0, channels = 1;
  std::string resize = "crop";
  bool window = false;
  double window_center = 0, window_width = 0;
  std::vector<double> mean, inv_std;  // per channel, dataset.json statistics
  std::vector<std::string> labels;
};

absl::StatusOr<Preprocess> ReadPreprocess(const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(data::DatasetManifest m, data::ReadManifest(Env::Default(), dir));
  const std::string where = JoinPath(dir, data::kManifestName);
  if (m.kind != "dicom") {
    return absl::InvalidArgumentError(absl::StrCat("--input-dir classifies DICOM studies: ", where,
                                                   " is a dataset of kind '", m.kind,
                                                   "', not one `kiln data import dicom` wrote"));
  }
  Preprocess p;
  const data::FeatureSchema* f = m.FindFeature("image");
  if (f == nullptr || f->shape.size() != 3) {
    return absl::DataLossError(where + ": no [H, W, C] \"image\" feature");
  }
  p.height = static_cast<int>(f->shape[0]);
  p.width = static_cast<int>(f->shape[1]);
  p.channels = static_cast<int>(f->shape[2]);
  p.resize = m.import_options.value("resize", std::string("crop"));
  const nlohmann::json w = m.import_options.value("window", nlohmann::json());
  if (w.is_array() && w.size() == 2) {
    p.window = true;
    p.window_center = w[0].get<double>();
    p.window_width = w[1].get<double>();
  }
  p.mean.assign(p.channels, 0.0);
  p.inv_std.assign(p.channels, 1.0);
  const nlohmann::json st = m.statistics.value("image", nlohmann::json::object());
  if (st.contains("mean") && st.contains("std") && st["mean"].size() == p.mean.size()) {
    for (int c = 0; c < p.channels; ++c) {
      p.mean[c] = st["mean"][c].get<double>();
      const double sd = st["std"][c].get<double>();
      p.inv_std[c] = sd > 0 ? 1.0 / sd : 1.0;
    }
  }
  p.labels = m.label_vocabulary;
  if (p.labels.empty()) return absl::DataLossError(where + " has no label vocabulary");
  return p;
}

// The model: an exported artifact, or a run directory's newest checkpoint compiled here.
class Model {
 public:
  virtual ~Model() = default;
  int64_t batch() const { return batch_; }
  int64_t features() const { return features_; }
  int64_t classes() const { return classes_; }
  // x: f32 [batch, features]; returns the logits, f32 [batch, classes].
  virtual absl::StatusOr<Tensor> Logits(const Tensor& x) = 0;
  // The training pipeline's data.augment.normalize (input_normalization.h), applied after the
  // dataset's own normalization; nullopt when it trained without one.
  const std::optional<InputNormalization>& normalization() const { return norm_; }

 protected:
  int64_t batch_ = 0, features_ = 0, classes_ = 0;
  std::optional<InputNormalization> norm_;
};

// Index of output "logits" in `outputs`, checked to be f32 [batch, classes].
absl::StatusOr<size_t> FindLogits(const std::vector<std::string>& names,
                                  const std::vector<Shape>& shapes, const std::vector<DType>& dts,
                                  int64_t batch, const std::string& what) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != "logits") continue;
    if (dts[i] != DType::kF32 || shapes[i].rank() != 2 || shapes[i].dim(0) != batch) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": output \"logits\" is ", std::string(DTypeName(dts[i])),
                       shapes[i].ToString(), ", expected f32[", batch, ", classes]"));
    }
    return i;
  }
  return absl::InvalidArgumentError(what + " has no \"logits\" output: not a classifier");
}

class ArtifactModel final : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Open(const std::string& dir,
                                                     const std::string& backend) {
    auto m = std::unique_ptr<ArtifactModel>(new ArtifactModel());
    absl::StatusOr<compiler::Artifact> a = compiler::LoadArtifact(dir);
    if (!a.ok()) return Annotate(a.status(), "loading artifact " + dir);
    m->a_ = *std::move(a);
    const std::vector<compiler::TensorSpec> in = m->a_.signature.RuntimeInputs();
    if (in.size() != 1 || in[0].dtype != DType::kF32 || in[0].shape.rank() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact ", dir, " must take one f32 [batch, features] input (an image classifier)"));
    }
    m->input_ = in[0].name;
    KILN_ASSIGN_OR_RETURN(m->norm_, InputNormalizationOf(m->a_));
    m->batch_ = in[0].shape.dim(0);
    m->features_ = in[0].shape.dim(1);
    std::vector<std::string> names;
    std::vector<Shape> shapes;
    std::vector<DType> dts;
    for (const compiler::TensorSpec& s : m->a_.signature.outputs) {
      names.push_back(s.name);
      shapes.push_back(s.shape);
      dts.push_back(s.dtype);
    }
    KILN_ASSIGN_OR_RETURN(m->logits_, FindLogits(names, shapes, dts, m->batch_, "artifact " + dir));
    m->classes_ = shapes[m->logits_].dim(1);
    KILN_ASSIGN_OR_RETURN(m->backend_, MakeBackendByName(backend));
    absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = m->backend_->Compile(m->a_.program);
    if (!exe.ok()) return Annotate(exe.status(), "compiling the artifact's program");
    m->exe_ = *std::move(exe);
    return std::unique_ptr<Model>(std::move(m));
  }

  absl::StatusOr<Tensor> Logits(const Tensor& x) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> args, a_.BindInputs({{input_, x}}));
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> r, exe_->Run(args));
    return r[logits_].Clone();
  }

 private:
  compiler::Artifact a_;
  std::string input_;
  size_t logits_ = 0;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<runtime::Executable> exe_;
};

class RunModel final : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Open(const train::TrainConfig& config,
                                                     int64_t batch, const std::string& backend) {
    auto m = std::unique_ptr<RunModel>(new RunModel());
    train::LoadOptions lo;
    absl::StatusOr<train::LoadedRun> run = train::LoadRun(config, lo);
    if (!run.ok()) return Annotate(run.status(), "loading run " + config.output_dir);
    m->run_ = *std::move(run);
    m->norm_ = InputNormalizationOf(config, "x");
    KILN_ASSIGN_OR_RETURN(ir::Graph g, m->run_.model->PredictGraph(batch));
    KILN_ASSIGN_OR_RETURN(m->backend_, MakeBackendByName(backend));
    absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = m->backend_->Compile(g);
    if (!exe.ok()) return Annotate(exe.status(), "compiling the model's predict graph");
    m->exe_ = *std::move(exe);
    const ir::Graph& cg = m->exe_->graph();
    for (const nn::ParamSpec& spec : m->run_.model->Params()) {
      const Tensor* t = m->run_.params.Find(spec.name);
      if (t == nullptr) return absl::DataLossError("the checkpoint lacks parameter " + spec.name);
      m->params_.push_back(t);
    }
    if (cg.parameters().size() != m->params_.size() + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", config.output_dir, ": the model takes ",
                       cg.parameters().size() - m->params_.size(),
                       " data inputs; --input-dir needs an image classifier (one input x)"));
    }
    const ir::Type& xt = cg.node(cg.parameters().back()).type();
    if (xt.dtype != DType::kF32 || xt.shape.rank() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", config.output_dir, ": input x is ", std::string(DTypeName(xt.dtype)),
                       xt.shape.ToString(), ", expected f32 [batch, features]"));
    }
    m->batch_ = batch;
    m->features_ = xt.shape.dim(1);
    std::vector<std::string> names;
    std::vector<Shape> shapes;
    std::vector<DType> dts;
    for (const ir::Output& o : cg.outputs()) {
      names.push_back(o.name);
      shapes.push_back(cg.node(o.node).type().shape);
      dts.push_back(cg.node(o.node).type().dtype);
    }
    KILN_ASSIGN_OR_RETURN(m->logits_,
                          FindLogits(names, shapes, dts, batch, "run " + config.output_dir));
    m->classes_ = shapes[m->logits_].dim(1);
    return std::unique_ptr<Model>(std::move(m));
  }

  absl::StatusOr<Tensor> Logits(const Tensor& x) override {
    std::vector<Tensor> args;
    for (const Tensor* p : params_) args.push_back(*p);
    args.push_back(x);
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> r, exe_->Run(args));
    return r[logits_].Clone();
  }

 private:
  train::LoadedRun run_;
  std::vector<const Tensor*> params_;
  size_t logits_ = 0;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<runtime::Executable> exe_;
};

// "90", "90s", "10m", "1h30m", "1.5h" to seconds.
absl::StatusOr<double> ParseDeadline(const std::string& s) {
  double total = 0;
  std::string num;
  bool any = false;
  for (char c : s) {
    if ((c >= '0' && c <= '9') || c == '.') {
      num.push_back(c);
      continue;
    }
    double v = 0, unit = 0;
    if (c == 's') unit = 1;
    if (c == 'm') unit = 60;
    if (c == 'h') unit = 3600;
    if (unit == 0 || num.empty() || !absl::SimpleAtod(num, &v)) {
      return absl::InvalidArgumentError("--deadline '" + s +
                                        "' is not a duration (e.g. 90s, 10m, 1h30m)");
    }
    total += v * unit;
    num.clear();
    any = true;
  }
  if (!num.empty()) {
    double v = 0;
    if (!absl::SimpleAtod(num, &v)) {
      return absl::InvalidArgumentError("--deadline '" + s + "' is not a duration");
    }
    total += v;
    any = true;
  }
  if (!any || !(total > 0)) {
    return absl::InvalidArgumentError("--deadline '" + s + "' must be a positive duration");
  }
  return total;
}

// Every regular file under `root` (names starting with '.' skipped), relative, sorted.
absl::StatusOr<std::vector<std::string>> ListStudies(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError("--input-dir " + root + " is not a folder");
  }
  std::vector<std::string> out;
  fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec);
  if (ec) return absl::InvalidArgumentError("--input-dir " + root + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InvalidArgumentError("--input-dir " + root + ": " + ec.message());
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) out.push_back(fs::relative(it->path(), root).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string JsonString(const std::string& s) { return nlohmann::json(s).dump(); }

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q.push_back('"');
    q.push_back(c);
  }
  return q + "\"";
}

struct Study {
  std::vector<float> x;  // normalized CHW, empty on failure
  std::string error;
};

}  // namespace

int RunPredictStudies(const PredictOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const absl::Status& s) {
    err << "kiln predict: " << s.message() << "\n";
    return 1;
  };
#ifndef KILN_HAVE_GDCM
  (void)out;
  return fail(absl::UnimplementedError(
      "--input-dir decodes DICOM with GDCM, and this kiln was built without libgdcm-dev"));
#else
  const bool jsonl = absl::EndsWith(o.out, ".jsonl");
  if (o.out.empty() || (!jsonl && !absl::EndsWith(o.out, ".csv"))) {
    return fail(absl::InvalidArgumentError("--input-dir needs --out FILE.jsonl or FILE.csv"));
  }
  if (!o.input.empty() || !o.output.empty()) {
    return fail(absl::InvalidArgumentError(
        "--input-dir and --out replace --input and --output: give one pair"));
  }
  double deadline = 0;
  if (!o.deadline.empty()) {
    absl::StatusOr<double> d = ParseDeadline(o.deadline);
    if (!d.ok()) return fail(d.status());
    deadline = *d;
  }
  if (o.batch < 1) return fail(absl::InvalidArgumentError("--batch must be >= 1"));
  const auto start = Clock::now();

  // The model and the dataset whose preprocessing it was trained with.
  std::string dataset = o.dataset;
  std::unique_ptr<Model> model;
  std::error_code ec;
  const bool is_run = fs::exists(JoinPath(o.artifact, "config.yaml"), ec) &&
                      !fs::exists(JoinPath(o.artifact, "manifest.json"), ec);
  if (is_run) {
    absl::StatusOr<train::TrainConfig> config =
        train::LoadTrainConfig(JoinPath(o.artifact, "config.yaml"), {"output_dir=" + o.artifact});
    if (!config.ok()) return fail(Annotate(config.status(), "reading run " + o.artifact));
    if (dataset.empty()) {
      if (config->data.source.rfind("dataset:", 0) != 0) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("run ", o.artifact, " trained on data.source ", config->data.source,
                         ", not an imported dataset: give --dataset DIR (the DICOM import whose "
                         "preprocessing to repeat)")));
      }
      dataset = config->data.source.substr(8);
    }
    absl::StatusOr<std::unique_ptr<Model>> m = RunModel::Open(*config, o.batch, o.backend);
    if (!m.ok()) return fail(m.status());
    model = *std::move(m);
  } else {
    if (dataset.empty()) {
      return fail(absl::InvalidArgumentError(
          "--input-dir with an exported artifact needs --dataset DIR: the DICOM import the model "
          "was trained on (its dataset.json gives the size, window, channels, normalization and "
          "label names)"));
    }
    absl::StatusOr<std::unique_ptr<Model>> m = ArtifactModel::Open(o.artifact, o.backend);
    if (!m.ok()) return fail(m.status());
    model = *std::move(m);
  }
  absl::StatusOr<Preprocess> pre = ReadPreprocess(dataset);
  if (!pre.ok()) return fail(pre.status());
  const int64_t f = static_cast<int64_t>(pre->height) * pre->width * pre->channels;
  if (model->features() != f || model->classes() != static_cast<int64_t>(pre->labels.size())) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "the model takes ", model->features(), " features and gives ", model->classes(),
        " classes; the dataset ", dataset, " has ", pre->height, "x", pre->width, "x",
        pre->channels, " = ", f, " pixels and ", pre->labels.size(), " labels")));
  }
  if (const std::optional<InputNormalization>& nz = model->normalization();
      nz && (nz->channels != pre->channels || nz->height * nz->width * nz->channels != f)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("the model was trained with data.augment.normalize for ", nz->channels, "x",
                     nz->height, "x", nz->width, " inputs, but the dataset ", dataset, " gives ",
                     pre->channels, "x", pre->height, "x", pre->width)));
  }
  absl::StatusOr<std::vector<std::string>> files = ListStudies(o.input_dir);
  if (!files.ok()) return fail(files.status());
  const int64_t n = static_cast<int64_t>(files->size());
  if (n == 0) return fail(absl::InvalidArgumentError("--input-dir " + o.input_dir + " is empty"));

  data::DicomImportOptions dopt;
  dopt.height = pre->height;
  dopt.width = pre->width;
  dopt.channels = pre->channels;
  dopt.resize = pre->resize;
  if (pre->window) {
    dopt.window_center = pre->window_center;
    dopt.window_width = pre->window_width;
  }
  const int threads = data::ResolveThreads(o.threads);
  const int64_t b = model->batch();
  const int64_t hw = static_cast<int64_t>(pre->height) * pre->width;
  auto decode = [&](int64_t i) {
    Study s;
    const std::string path = JoinPath(o.input_dir, (*files)[i]);
    absl::StatusOr<std::string> bytes = ReadFileToString(Env::Default(), path);
    if (!bytes.ok()) {
      s.error = std::string(bytes.status().message());
      return s;
    }
    absl::StatusOr<std::vector<uint8_t>> px = data::DecodeDicomPixels(*bytes, (*files)[i], dopt);
    if (!px.ok()) {
      s.error = std::string(px.status().message());
      return s;
    }
    s.x.resize(f);
    for (int c = 0; c < pre->channels; ++c) {
      for (int64_t p = 0; p < hw; ++p) {
        s.x[c * hw + p] =
            static_cast<float>(((*px)[p * pre->channels + c] - pre->mean[c]) * pre->inv_std[c]);
      }
    }
    if (model->normalization()) model->normalization()->ApplyToExample(s.x.data());
    return s;
  };

  const std::string partial = o.out + ".partial";
  std::ofstream results(partial, std::ios::trunc);
  if (!results) return fail(absl::InvalidArgumentError("cannot write " + partial));
  if (!jsonl) {
    results << "path,label";
    for (const std::string& l : pre->labels) results << ",p_" << CsvField(l);
    results << ",error\n";
  }

  // Chunks of a few batches: the next chunk decodes on the worker threads while the model runs
  // this one's batches.
  const int64_t chunk = b * std::max<int64_t>(1, (4 * threads + b - 1) / b);
  std::vector<Study> current(std::min(chunk, n)), next;
  data::ParallelFor(threads, static_cast<int64_t>(current.size()),
                    [&](int64_t i) { current[i] = decode(i); });
  const bool tty = &err == &std::cerr && isatty(STDERR_FILENO);
  int64_t done = 0, classified = 0;
  std::vector<std::pair<std::string, std::string>> failures;
  auto last_progress = Clock::now() - std::chrono::hours(1);
  Tensor x(DType::kF32, Shape{b, model->features()});
  auto progress = [&](bool end) {
    const double elapsed = Seconds(Clock::now() - start);
    if (!end && Seconds(Clock::now() - last_progress) < (tty ? 0.1 : 5.0)) return;
    last_progress = Clock::now();
    const double rate = elapsed > 0 ? done / elapsed : 0;
    const double eta = rate > 0 ? (n - done) / rate : NAN;
    std::string line = absl::StrFormat("predict: %d/%d studies (%.1f%%), %.1f studies/s, %s %s",
                                       done, n, 100.0 * done / n, rate, end ? "elapsed" : "ETA",
                                       ClockText(end ? elapsed : eta));
    if (!end) {
      absl::StrAppend(&line, ", finish ~", TimeOfDay(eta));
      if (deadline > 0) {
        const bool on_time = std::isfinite(eta) && elapsed + eta <= deadline;
        absl::StrAppend(&line, " (deadline ", TimeOfDay(deadline - elapsed), ": ",
                        on_time ? "on time" : "LATE", ")");
      }
    }
    if (tty) {
      const int width = 24, fill = static_cast<int>(width * done / n);
      err << "\r[" << std::string(fill, '#') << std::string(width - fill, '.') << "] " << line
          << "\x1b[K" << (end ? "\n" : "") << std::flush;
    } else {
      err << line << "\n" << std::flush;
    }
  };

  for (int64_t base = 0; base < n; base += chunk) {
    const int64_t m = static_cast<int64_t>(current.size());
    const int64_t next_base = base + chunk;
    std::thread worker;
    if (next_base < n) {
      next.assign(std::min(chunk, n - next_base), Study());
      worker = std::thread([&] {
        data::ParallelFor(threads, static_cast<int64_t>(next.size()),
                          [&](int64_t i) { next[i] = decode(next_base + i); });
      });
    }
    // The decoded studies of this chunk, in order, batch by batch.
    std::vector<int64_t> ok;
    for (int64_t i = 0; i < m; ++i) {
      if (current[i].error.empty()) ok.push_back(i);
    }
    std::vector<std::vector<double>> probs(m);
    absl::Status run_status;
    for (size_t s = 0; s < ok.size() && run_status.ok(); s += b) {
      const int64_t take = std::min<int64_t>(b, static_cast<int64_t>(ok.size() - s));
      float* xd = x.data<float>();
      std::fill(xd, xd + x.num_elements(), 0.0f);  // the padding of a short last batch
      for (int64_t r = 0; r < take; ++r) {
        std::copy(current[ok[s + r]].x.begin(), current[ok[s + r]].x.end(),
                  xd + r * model->features());
      }
      absl::StatusOr<Tensor> logits = model->Logits(x);
      if (!logits.ok()) {
        run_status = logits.status();
        break;
      }
      const int64_t c = model->classes();
      for (int64_t r = 0; r < take; ++r) {
        const float* l = logits->data<float>() + r * c;
        const double mx = *std::max_element(l, l + c);
        std::vector<double> p(c);
        double sum = 0;
        for (int64_t k = 0; k < c; ++k) sum += p[k] = std::exp(static_cast<double>(l[k]) - mx);
        for (double& v : p) v /= sum;
        probs[ok[s + r]] = std::move(p);
      }
    }
    if (worker.joinable()) worker.join();
    if (!run_status.ok()) {
      results.close();
      return fail(Annotate(run_status, "running the model"));
    }
    for (int64_t i = 0; i < m; ++i) {
      const std::string& rel = (*files)[base + i];
      const Study& st = current[i];
      if (!st.error.empty()) {
        failures.emplace_back(rel, st.error);
        if (jsonl) {
          results << "{\"path\":" << JsonString(rel) << ",\"error\":" << JsonString(st.error)
                  << "}\n";
        } else {
          results << CsvField(rel) << ",";
          for (size_t k = 0; k < pre->labels.size(); ++k) results << ",";
          results << "," << CsvField(st.error) << "\n";
        }
        continue;
      }
      const std::vector<double>& p = probs[i];
      const size_t best = std::max_element(p.begin(), p.end()) - p.begin();
      ++classified;
      if (jsonl) {
        results << "{\"path\":" << JsonString(rel) << ",\"label\":" << JsonString(pre->labels[best])
                << ",\"probabilities\":{";
        for (size_t k = 0; k < p.size(); ++k) {
          results << (k ? "," : "") << JsonString(pre->labels[k]) << ":"
                  << absl::StrFormat("%.6g", p[k]);
        }
        results << "}}\n";
      } else {
        results << CsvField(rel) << "," << CsvField(pre->labels[best]);
        for (double v : p) results << "," << absl::StrFormat("%.6g", v);
        results << ",\n";
      }
    }
    results.flush();
    done += m;
    if (!o.quiet) progress(false);
    current.swap(next);
  }
  results.close();
  if (!results || std::rename(partial.c_str(), o.out.c_str()) != 0) {
    return fail(absl::InternalError("cannot write " + o.out));
  }
  const double wall = Seconds(Clock::now() - start);
  if (!o.quiet) progress(true);
  const bool late = deadline > 0 && wall > deadline;
  out << absl::StrFormat("classified %d of %d studies in %.2f s (%.1f studies/s, %d threads)",
                         classified, n, wall, n / wall, threads);
  out << "; wrote " << o.out << "\n";
  if (deadline > 0) {
    out << absl::StrFormat("deadline %s: %s (%.2f s of %.2f s)\n", o.deadline,
                           late ? "MISSED" : "met", wall, deadline);
  }
  if (!failures.empty()) {
    out << failures.size() << (failures.size() == 1 ? " study" : " studies")
        << " failed to decode (in " << o.out << " with the error):\n";
    for (const auto& [rel, e] : failures) {  // the decoder's messages start with the name
      out << "  " << (absl::StartsWith(e, rel + ":") ? e : rel + ": " + e) << "\n";
    }
  }
  if (late && !failures.empty()) return kPredictExitLateAndFailures;
  if (late) return kPredictExitLate;
  if (!failures.empty()) return kPredictExitFailures;
  return 0;
#endif
}

}  // namespace kiln::cli
