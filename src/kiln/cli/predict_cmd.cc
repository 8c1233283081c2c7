#include "kiln/cli/predict_cmd.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/cli/backends.h"
#include "kiln/cli/input_normalization.h"
#include "kiln/compiler/artifact.h"
#include "kiln/data/csv.h"
#include "kiln/data/digits.h"
#include "kiln/serve/fixed_batch_runner.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using compiler::TensorSpec;

// absl's string_view is not std::string_view in every build: StrCat gets std::string.
std::string TypeName(DType t) { return std::string(DTypeName(t)); }

std::string SpecString(const TensorSpec& s) {
  return absl::StrCat(s.name, ": ", TypeName(s.dtype), s.shape.ToString());
}

std::string SpecList(const std::vector<TensorSpec>& specs) {
  std::vector<std::string> parts;
  for (const TensorSpec& s : specs) parts.push_back(SpecString(s));
  return absl::StrJoin(parts, ", ");
}

// The artifact's shape minus its batch dimension: one example of `s`.
Shape ExampleShape(const TensorSpec& s) {
  return Shape(std::vector<int64_t>(s.shape.dims().begin() + 1, s.shape.dims().end()));
}

// `example` with a leading dimension n.
Shape WithLeading(int64_t n, const Shape& example) {
  std::vector<int64_t> dims = {n};
  dims.insert(dims.end(), example.dims().begin(), example.dims().end());
  return Shape(std::move(dims));
}

// How the runtime inputs split into examples: every one has the same leading dimension, the
// artifact's batch size. An artifact whose inputs do not (a scalar input, or two batch sizes) runs
// only on inputs of exactly its shapes.
struct Layout {
  std::vector<TensorSpec> inputs;
  int64_t batch = 0;     // 0: not batched
  int64_t features = 0;  // CSV columns per example: the inputs' per-example values, summed
};

Layout LayoutOf(const compiler::Artifact& a) {
  Layout l;
  l.inputs = a.signature.RuntimeInputs();
  for (const TensorSpec& s : l.inputs) {
    if (s.shape.rank() == 0 || s.shape.dim(0) < 1 || (l.batch != 0 && s.shape.dim(0) != l.batch)) {
      l.batch = 0;
      break;
    }
    l.batch = s.shape.dim(0);
  }
  if (l.batch > 0)
    for (const TensorSpec& s : l.inputs) l.features += ExampleShape(s).num_elements();
  return l;
}

// ---- Reading the input ----

// Tensors from a safetensors file: exactly the runtime inputs, each of the artifact's shape or
// [N, rest]; returns them as [N, rest] (or the exact shapes, with *n = 0, when not batched).
absl::StatusOr<std::map<std::string, Tensor>> ReadTensorInput(const std::string& path,
                                                              const Layout& l,
                                                              const compiler::Artifact& a,
                                                              int64_t* n) {
  KILN_ASSIGN_OR_RETURN(auto tensors, ReadSafetensors(path));
  for (const auto& [name, t] : tensors) {
    bool known = false;
    for (const TensorSpec& s : l.inputs) known = known || s.name == name;
    if (!known && a.weights.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", name,
          "' is one of the artifact's weights (bound from its weights.safetensors), not an "
          "input; its inputs: ",
          SpecList(l.inputs)));
    }
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name,
                       "' is not an input of the artifact (its inputs: ", SpecList(l.inputs), ")"));
    }
  }
  *n = -1;
  std::map<std::string, Tensor> out;
  for (const TensorSpec& s : l.inputs) {
    auto it = tensors.find(s.name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": no tensor '", s.name, "' (the artifact's inputs: ", SpecList(l.inputs), ")"));
    }
    const Tensor& t = it->second;
    if (t.dtype() != s.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", s.name, "' is ",
                                                     t.TypeString(), ", the artifact takes ",
                                                     SpecString(s), " (dtypes must match)"));
    }
    int64_t rows = -1;
    if (l.batch > 0 && t.shape().rank() == s.shape.rank() &&
        WithLeading(t.shape().dim(0), ExampleShape(s)) == t.shape()) {
      rows = t.shape().dim(0);
    } else if (t.shape() == s.shape) {
      rows = 0;  // exact shape of an unbatched artifact
    } else {
      std::string want = l.batch > 0 ? absl::StrCat("[N", s.shape.rank() > 1 ? "," : "",
                                                    absl::StrJoin(ExampleShape(s).dims(), ","),
                                                    "] (N examples of ", SpecString(s), ")")
                                     : SpecString(s);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", s.name, "' is ", t.TypeString(), ", expected ", want));
    }
    if (*n >= 0 && rows != *n) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", s.name, "' holds ", rows,
                                                     " examples but the inputs before it hold ", *n,
                                                     " (all must agree)"));
    }
    *n = rows;
    out[s.name] = t;
  }
  if (*n == 0 && l.batch > 0)
    return absl::InvalidArgumentError(absl::StrCat(path, ": no examples (N = 0)"));
  return out;
}

using data::ParseCsvDouble;

bool ParseInt(std::string_view s, int64_t* v) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Stores `field` as element `i` of `t`, or says why it cannot be.
absl::Status StoreField(std::string_view field, Tensor& t, int64_t i) {
  const DType dt = t.dtype();
  if (dt == DType::kBool) {
    if (field == "0" || field == "false") {
      StoreFromInt64(t.raw_data(), dt, i, 0);
    } else if (field == "1" || field == "true") {
      StoreFromInt64(t.raw_data(), dt, i, 1);
    } else {
      return absl::InvalidArgumentError("is not a bool (0, 1, false or true)");
    }
    return absl::OkStatus();
  }
  if (IsInteger(dt)) {
    int64_t v = 0;
    if (!ParseInt(field, &v)) return absl::InvalidArgumentError("is not an integer");
    auto [lo, hi] = IntegerRange(dt);
    if (v < lo || v > hi)
      return absl::InvalidArgumentError(absl::StrCat("is out of range [", lo, ", ", hi, "]"));
    StoreFromInt64(t.raw_data(), dt, i, v);
    return absl::OkStatus();
  }
  double v = 0;
  if (!ParseCsvDouble(field, &v)) return absl::InvalidArgumentError("is not a number");
  t.SetDouble(i, v);
  return absl::OkStatus();
}

// CSV rows -> one [N, rest] tensor per runtime input.
absl::StatusOr<std::map<std::string, Tensor>> ReadCsvInput(const std::string& path, const Layout& l,
                                                           int64_t* n) {
  if (l.batch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CSV input needs an artifact whose inputs share a leading batch dimension; this one takes ",
        SpecList(l.inputs), ": pass a .safetensors --input instead"));
  }
  KILN_ASSIGN_OR_RETURN(std::string text, data::ReadMaybeGzippedFile(path));
  data::CsvOptions csv;
  csv.quoting = false;  // rows of plain values
  csv.trim = true;
  KILN_ASSIGN_OR_RETURN(std::vector<data::CsvRecord> rows, data::ParseCsv(text, path, csv));
  if (!rows.empty()) {
    bool any_number = false;
    for (const std::string& f : rows.front().fields) {
      double d;
      any_number = any_number || ParseCsvDouble(f, &d);
    }
    if (!any_number) rows.erase(rows.begin());  // a header
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows"));
  *n = static_cast<int64_t>(rows.size());

  std::map<std::string, Tensor> out;
  std::vector<Tensor*> targets;
  for (const TensorSpec& s : l.inputs) {
    Tensor& t = out[s.name] = Tensor(s.dtype, WithLeading(*n, ExampleShape(s)));
    targets.push_back(&t);
  }
  std::vector<std::string> per_input;
  for (const TensorSpec& s : l.inputs) {
    per_input.push_back(absl::StrCat(s.name, ": ", ExampleShape(s).num_elements(), " ",
                                     TypeName(s.dtype), " values"));
  }
  for (int64_t r = 0; r < *n; ++r) {
    const int64_t line_no = rows[r].line;
    const std::vector<std::string>& fields = rows[r].fields;
    if (static_cast<int64_t>(fields.size()) != l.features) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": expected ", l.features,
                                                     " columns (", absl::StrJoin(per_input, ", "),
                                                     " per example), got ", fields.size()));
    }
    int64_t col = 0;
    for (size_t k = 0; k < l.inputs.size(); ++k) {
      const int64_t per = ExampleShape(l.inputs[k]).num_elements();
      for (int64_t j = 0; j < per; ++j, ++col) {
        absl::Status s = StoreField(fields[col], *targets[k], r * per + j);
        if (!s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", line_no, ": column ", col + 1, ": '", std::string(fields[col]), "' ",
              s.message(), " (it feeds ", l.inputs[k].name, " element ", j, ", ",
              TypeName(l.inputs[k].dtype), ")"));
        }
      }
    }
  }
  return out;
}

// ---- Writing the outputs ----

std::string FormatValue(const Tensor& t, int64_t i) {
  const DType dt = t.dtype();
  if (IsInteger(dt) || dt == DType::kBool) return absl::StrCat(LoadAsInt64(t.raw_data(), dt, i));
  // The shortest text that reads back as the same f32 (every float dtype here fits in f32).
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(t.GetDouble(i)));
  return std::string(buf, r.ptr);
}

std::string OutputsCsv(const std::vector<TensorSpec>& specs, const std::vector<Tensor>& outs,
                       int64_t n) {
  std::vector<std::string> header;
  std::vector<int64_t> per(outs.size());
  for (size_t k = 0; k < outs.size(); ++k) {
    per[k] = outs[k].num_elements() / n;
    if (per[k] == 1) {
      header.push_back(specs[k].name);
    } else {
      for (int64_t j = 0; j < per[k]; ++j) header.push_back(absl::StrCat(specs[k].name, "_", j));
    }
  }
  std::string csv = absl::StrJoin(header, ",") + "\n";
  for (int64_t r = 0; r < n; ++r) {
    bool first = true;
    for (size_t k = 0; k < outs.size(); ++k) {
      for (int64_t j = 0; j < per[k]; ++j) {
        if (!first) csv += ',';
        first = false;
        csv += FormatValue(outs[k], r * per[k] + j);
      }
    }
    csv += '\n';
  }
  return csv;
}

// True when `a` and `b` name the same existing file, or `b` lies inside directory `a`.
bool SameOrInside(const std::string& a, const std::string& b) {
  std::error_code ec;
  fs::path pa = fs::weakly_canonical(a, ec);
  if (ec) return false;
  fs::path pb = fs::weakly_canonical(b, ec);
  if (ec) return false;
  auto [ai, bi] = std::mismatch(pa.begin(), pa.end(), pb.begin(), pb.end());
  return ai == pa.end();
}

// The flags' paths: an --input and --output of known kinds that overwrite neither the input nor
// the artifact.
absl::Status CheckPaths(const PredictOptions& o) {
  const bool csv_in = absl::EndsWith(o.input, ".csv") || absl::EndsWith(o.input, ".csv.gz");
  const bool tensors_in = absl::EndsWith(o.input, ".safetensors");
  if (!csv_in && !tensors_in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input ", o.input,
                     ": expected a .safetensors file (tensors by input name) or CSV rows "
                     "(.csv or .csv.gz)"));
  }
  const bool csv_out = absl::EndsWith(o.output, ".csv");
  if (!o.output.empty() && !csv_out && !absl::EndsWith(o.output, ".safetensors")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output ", o.output, ": expected a file ending in .csv or .safetensors"));
  }
  if (!o.output.empty() && SameOrInside(o.input, o.output)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output ", o.output, " is the --input file; choose another name"));
  }
  if (!o.output.empty() && SameOrInside(o.artifact, o.output)) {
    return absl::InvalidArgumentError(absl::StrCat("--output ", o.output,
                                                   " is inside the artifact ", o.artifact,
                                                   "; write predictions somewhere else"));
  }
  if (!o.output.empty() && fs::is_directory(o.output)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output ", o.output, " is a directory; name a file"));
  }
  return absl::OkStatus();
}

// Compiles the artifact's program and runs it: once on an unbatched artifact's exact shapes
// (n = 0), else n examples in batches of l.batch (serve::FixedBatchRunner: the last one padded
// with zeros, its outputs trimmed). Sets result->batches.
absl::StatusOr<std::vector<Tensor>> RunArtifact(const PredictOptions& o,
                                                const compiler::Artifact& a, const Layout& l,
                                                const std::map<std::string, Tensor>& inputs,
                                                int64_t n, PredictResult* result) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend, MakeBackendByName(o.backend));
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend->Compile(a.program);
  if (!exe.ok()) return Annotate(exe.status(), "compiling the artifact's program");
  std::vector<Tensor> outs;
  if (n == 0) {
    KILN_ASSIGN_OR_RETURN(std::vector<Tensor> args, a.BindInputs(inputs));
    absl::StatusOr<std::vector<Tensor>> r = (*exe)->Run(args);
    if (!r.ok()) return Annotate(r.status(), "running the artifact");
    for (const Tensor& t : *r) outs.push_back(t.Clone());
    result->batches = 1;
    return outs;
  }
  // Every output must carry the batch dimension to be split back into examples.
  for (const TensorSpec& s : a.signature.outputs) {
    if (s.shape.rank() == 0 || s.shape.dim(0) != l.batch) {
      return absl::InvalidArgumentError(absl::StrCat("output ", SpecString(s),
                                                     " has no leading batch dimension of ", l.batch,
                                                     ", so it cannot be split into examples"));
    }
  }
  KILN_ASSIGN_OR_RETURN(serve::FixedBatchRunner runner,
                        serve::FixedBatchRunner::ForArtifact(**exe, a));
  KILN_ASSIGN_OR_RETURN(outs, runner.RunAll(inputs, n));
  result->batches = (n + l.batch - 1) / l.batch;
  return outs;
}

// The outputs as CSV on `out` (no --output), or into --output (.csv or .safetensors) with a
// summary line on `out`.
absl::Status WriteOutputs(const PredictOptions& o, const std::vector<TensorSpec>& specs,
                          const std::vector<Tensor>& outs, int64_t n, const Layout& l,
                          const PredictResult& result, std::ostream& out) {
  // An unbatched artifact's outputs are one CSV row (its exact shapes are one "example").
  const int64_t rows = n == 0 ? 1 : n;
  if (o.output.empty()) {
    out << OutputsCsv(specs, outs, rows);
    return absl::OkStatus();
  }
  if (absl::EndsWith(o.output, ".csv")) {
    const std::string tmp = o.output + ".tmp";
    absl::Status s = WriteStringToFile(Env::Default(), OutputsCsv(specs, outs, rows), tmp);
    if (s.ok()) s = Env::Default()->RenameFile(tmp, o.output);
    if (!s.ok()) return Annotate(s, "writing --output " + o.output);
  } else {
    std::vector<std::pair<std::string, Tensor>> named;
    for (size_t k = 0; k < outs.size(); ++k) named.emplace_back(specs[k].name, outs[k]);
    absl::Status s = WriteSafetensors(o.output, named, {{"format", "kiln.predictions"}});
    if (!s.ok()) return Annotate(s, "writing --output " + o.output);
  }
  std::vector<std::string> names;
  for (size_t k = 0; k < outs.size(); ++k)
    names.push_back(absl::StrCat(specs[k].name, " ", outs[k].TypeString()));
  out << "predicted " << rows << (rows == 1 ? " example" : " examples") << " in " << result.batches
      << (result.batches == 1 ? " run" : " runs");
  if (n > 0) out << " of batch " << l.batch;
  if (result.normalized) out << " (inputs normalized as in training: data.augment.normalize)";
  out << "; wrote " << absl::StrJoin(names, ", ") << " to " << o.output << "\n";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PredictResult> RunPredict(const PredictOptions& o, std::ostream& out) {
  KILN_RETURN_IF_ERROR(CheckPaths(o));
  const bool csv_in = absl::EndsWith(o.input, ".csv") || absl::EndsWith(o.input, ".csv.gz");
  absl::StatusOr<compiler::Artifact> artifact = compiler::LoadArtifact(o.artifact);
  if (!artifact.ok()) return Annotate(artifact.status(), "loading artifact " + o.artifact);
  const compiler::Artifact& a = *artifact;
  const Layout l = LayoutOf(a);
  if (l.inputs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact ", o.artifact, " takes no runtime inputs (every input is a weight)"));
  }

  int64_t n = 0;  // examples; 0 for one run on an unbatched artifact's exact shapes
  absl::StatusOr<std::map<std::string, Tensor>> inputs =
      csv_in ? ReadCsvInput(o.input, l, &n) : ReadTensorInput(o.input, l, a, &n);
  if (!inputs.ok()) return inputs.status();
  // The normalization the input pipeline applied in training (data.augment.normalize), which
  // the program does not contain: applied to the raw inputs unless they come normalized.
  absl::StatusOr<std::optional<InputNormalization>> norm = InputNormalizationOf(a);
  if (!norm.ok()) return Annotate(norm.status(), "loading artifact " + o.artifact);
  PredictResult result;
  if (norm->has_value() && !o.no_normalize) {
    const InputNormalization& nz = **norm;
    absl::Status s = nz.Apply(inputs->at(nz.input));
    if (!s.ok()) return Annotate(s, "--input " + o.input);
    result.normalized = true;
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, RunArtifact(o, a, l, *inputs, n, &result));
  result.examples = n;
  KILN_RETURN_IF_ERROR(WriteOutputs(o, a.signature.outputs, outs, n, l, result, out));
  return result;
}

PredictCommand::PredictCommand(CLI::App& app) {
  cmd_ = app.add_subcommand(
      "predict",
      "Run an artifact from `kiln export` on examples (safetensors or CSV rows) and print or write "
      "its outputs");
  cmd_->add_option("artifact", options_.artifact,
                   "Artifact directory (manifest.json, program.ir, weights.safetensors)")
      ->required();
  cmd_->add_option("--input", options_.input,
                   "Examples: a .safetensors file (tensors by input name, [N, ...]) or CSV rows "
                   "(.csv/.csv.gz, one example per row, the inputs' values in order)");
  cmd_->add_option("--input-dir", options_.input_dir,
                   "Bulk DICOM classification: every file under this folder is one study "
                   "(the positional argument may then be a run directory)");
  cmd_->add_option("--out", options_.out,
                   "--input-dir: results, one line per study (.jsonl or .csv)");
  cmd_->add_option("--dataset", options_.dataset,
                   "--input-dir: the DICOM import the model was trained on (default: a run's "
                   "data.source)");
  cmd_->add_option("--deadline", options_.deadline,
                   "--input-dir: the time the job must finish in (90s, 10m, 1h30m)");
  cmd_->add_option("--threads", options_.threads, "--input-dir: decoding threads (0: all cores)")
      ->capture_default_str();
  cmd_->add_option("--batch", options_.batch, "--input-dir with a run directory: batch size")
      ->capture_default_str();
  cmd_->add_flag("--quiet", options_.quiet, "--input-dir: no progress lines");
  cmd_->add_option("--output", options_.output,
                   "Write the outputs here (.csv or .safetensors, replaced) instead of printing "
                   "them as CSV");
  cmd_->add_flag("--no-normalize", options_.no_normalize,
                 "--input is already normalized: do not apply the artifact's input_normalization "
                 "(the training pipeline's data.augment.normalize)");
  cmd_->add_option("--backend", options_.backend, "Backend: cpu (oneDNN) or reference")
      ->check(CLI::IsMember(BackendNames()))
      ->capture_default_str();
}

int PredictCommand::Run(std::ostream& out, std::ostream& err) {
  if (!*cmd_) return -1;
  if (!options_.input_dir.empty()) return RunPredictStudies(options_, out, err);
  if (options_.input.empty()) {
    err << "kiln predict: --input FILE (or --input-dir STUDIES --out FILE) is required\n";
    return 1;
  }
  absl::StatusOr<PredictResult> r = RunPredict(options_, out);
  if (r.ok()) return 0;
  err << "kiln predict: " << r.status().message() << "\n";
  return 1;
}

}  // namespace kiln::cli
