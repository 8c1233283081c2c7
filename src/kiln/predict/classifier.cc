#include "kiln/predict/classifier.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/artifact.h"
#include "kiln/train/evaluator.h"

namespace kiln::predict {
namespace {

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

}  // namespace

absl::StatusOr<std::unique_ptr<Classifier>> Classifier::OpenArtifact(
    const std::string& dir, std::unique_ptr<runtime::Backend> backend) {
  auto m = std::unique_ptr<Classifier>(new Classifier());
  absl::StatusOr<compiler::Artifact> a = compiler::LoadArtifact(dir);
  if (!a.ok()) return Annotate(a.status(), "loading artifact " + dir);
  const std::vector<compiler::TensorSpec> in = a->signature.RuntimeInputs();
  if (in.size() != 1 || in[0].dtype != DType::kF32 || in[0].shape.rank() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact ", dir, " must take one f32 [batch, features] input (an image classifier)"));
  }
  KILN_ASSIGN_OR_RETURN(m->norm_, serve::InputNormalizationOf(*a));
  const int64_t batch = in[0].shape.dim(0);
  m->features_ = in[0].shape.dim(1);
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<DType> dts;
  for (const compiler::TensorSpec& s : a->signature.outputs) {
    names.push_back(s.name);
    shapes.push_back(s.shape);
    dts.push_back(s.dtype);
  }
  KILN_ASSIGN_OR_RETURN(m->logits_, FindLogits(names, shapes, dts, batch, "artifact " + dir));
  m->classes_ = shapes[m->logits_].dim(1);
  m->backend_ = std::move(backend);
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = m->backend_->Compile(a->program);
  if (!exe.ok()) return Annotate(exe.status(), "compiling the artifact's program");
  m->exe_ = *std::move(exe);
  KILN_ASSIGN_OR_RETURN(serve::FixedBatchRunner r,
                        serve::FixedBatchRunner::ForArtifact(*m->exe_, *a));
  m->runner_.emplace(std::move(r));
  return m;
}

absl::StatusOr<std::unique_ptr<Classifier>> Classifier::OpenRun(
    const train::TrainConfig& config, int64_t batch, std::unique_ptr<runtime::Backend> backend,
    std::optional<serve::InputNormalization> normalization) {
  auto m = std::unique_ptr<Classifier>(new Classifier());
  train::LoadOptions lo;
  absl::StatusOr<train::LoadedRun> run = train::LoadRun(config, lo);
  if (!run.ok()) return Annotate(run.status(), "loading run " + config.output_dir);
  m->norm_ = std::move(normalization);
  KILN_ASSIGN_OR_RETURN(ir::Graph g, run->model->PredictGraph(batch));
  m->backend_ = std::move(backend);
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = m->backend_->Compile(g);
  if (!exe.ok()) return Annotate(exe.status(), "compiling the model's predict graph");
  m->exe_ = *std::move(exe);
  const ir::Graph& cg = m->exe_->graph();
  std::vector<Tensor> args;
  for (const nn::ParamSpec& spec : run->model->Params()) {
    const Tensor* t = run->params.Find(spec.name);
    if (t == nullptr) return absl::DataLossError("the checkpoint lacks parameter " + spec.name);
    args.push_back(*t);  // shares the checkpoint's storage
  }
  if (cg.parameters().size() != args.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run ", config.output_dir, ": the model takes ", cg.parameters().size() - args.size(),
        " data inputs; --input-dir needs an image classifier (one input x)"));
  }
  const ir::Type& xt = cg.node(cg.parameters().back()).type();
  if (xt.dtype != DType::kF32 || xt.shape.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("run ", config.output_dir, ": input x is ", std::string(DTypeName(xt.dtype)),
                     xt.shape.ToString(), ", expected f32 [batch, features]"));
  }
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
  const int x_arg = static_cast<int>(args.size());
  args.emplace_back(xt.dtype, xt.shape);
  KILN_ASSIGN_OR_RETURN(serve::FixedBatchRunner r,
                        serve::FixedBatchRunner::Create(*m->exe_, std::move(args), {x_arg}, {"x"}));
  m->runner_.emplace(std::move(r));
  return m;
}

absl::StatusOr<std::vector<std::vector<double>>> Classifier::Classify(
    const std::vector<const float*>& rows) {
  std::vector<std::vector<double>> probs;
  const int64_t b = batch(), n = static_cast<int64_t>(rows.size());
  const int64_t row_bytes = features_ * static_cast<int64_t>(sizeof(float));
  for (int64_t s = 0; s < n; s += b) {
    const int64_t take = std::min(b, n - s);
    for (int64_t r = 0; r < take; ++r)
      KILN_RETURN_IF_ERROR(runner_->Stage(0, r, 1, rows[s + r], row_bytes));
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, runner_->Run(take));  // zero-padded
    const Tensor& logits = outs[logits_];
    for (int64_t r = 0; r < take; ++r) {
      const float* l = logits.data<float>() + r * classes_;
      const double mx = *std::max_element(l, l + classes_);
      std::vector<double> p(classes_);
      double sum = 0;
      for (int64_t k = 0; k < classes_; ++k) sum += p[k] = std::exp(static_cast<double>(l[k]) - mx);
      for (double& v : p) v /= sum;
      probs.push_back(std::move(p));
    }
  }
  return probs;
}

}  // namespace kiln::predict
