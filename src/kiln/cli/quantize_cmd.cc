#include "kiln/cli/quantize_cmd.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kiln/base/cpu_isa.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/cli/backends.h"
#include "kiln/compiler/artifact.h"
#include "kiln/compiler/passes/quantize_int8.h"
#include "kiln/data/csv.h"
#include "kiln/data/digits.h"
#include "kiln/predict/quantize_eval.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using compiler::FindInt8Sites;
using compiler::Int8Layer;
using compiler::Int8Program;
using compiler::Int8Site;
using compiler::TensorSpec;

using predict::Examples;

using data::ParseCsvDouble;

Shape WithLeading(int64_t n, const Shape& s) {
  std::vector<int64_t> dims = {n};
  dims.insert(dims.end(), s.dims().begin() + 1, s.dims().end());
  return Shape(std::move(dims));
}

int64_t PerExample(const TensorSpec& s) { return s.shape.num_elements() / s.shape.dim(0); }

// The label column of a CSV row with `fields` fields: -1 for none.
absl::StatusOr<int64_t> LabelColumn(const std::string& spec, int64_t fields) {
  if (spec == "none") return -1;
  if (spec == "last") return fields - 1;
  if (spec == "first") return 0;
  int64_t c = -1;
  auto r = std::from_chars(spec.data(), spec.data() + spec.size(), c);
  if (r.ec != std::errc() || r.ptr != spec.data() + spec.size() || c < 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "--labels-column ", spec, ": expected last, first, none or a 0-based column index"));
  if (c >= fields)
    return absl::InvalidArgumentError(
        absl::StrCat("--labels-column ", c, " is past the row's ", fields, " columns"));
  return c;
}

absl::StatusOr<Examples> ReadCsvExamples(const std::string& path,
                                         const std::vector<TensorSpec>& inputs,
                                         const std::string& labels_column) {
  KILN_ASSIGN_OR_RETURN(std::string text, data::ReadMaybeGzippedFile(path));
  int64_t features = 0;
  for (const TensorSpec& s : inputs) features += PerExample(s);
  const int64_t want = features + (labels_column == "none" ? 0 : 1);
  std::vector<std::vector<double>> rows;
  std::vector<int64_t> labels;
  data::CsvOptions csv;
  csv.quoting = false;  // rows of plain numbers
  csv.trim = true;
  KILN_ASSIGN_OR_RETURN(std::vector<data::CsvRecord> records, data::ParseCsv(text, path, csv));
  for (const data::CsvRecord& record : records) {
    const int64_t line_no = record.line;
    const std::vector<std::string>& fields = record.fields;
    std::vector<double> values(fields.size());
    bool any_number = false;
    for (size_t i = 0; i < fields.size(); ++i) any_number |= ParseCsvDouble(fields[i], &values[i]);
    if (rows.empty() && labels.empty() && !any_number) continue;  // a header
    if (static_cast<int64_t>(fields.size()) != want)
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": expected ", want, " columns (", features, " input values",
          want > features ? " and a label" : "", "), got ", fields.size()));
    KILN_ASSIGN_OR_RETURN(int64_t label_col, LabelColumn(labels_column, want));
    std::vector<double> row;
    for (int64_t i = 0; i < want; ++i) {
      if (!ParseCsvDouble(fields[i], &values[i]) || !std::isfinite(values[i]))
        return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": column ", i + 1,
                                                       " ('", std::string(fields[i]),
                                                       "') is not a number"));
      if (i == label_col) {
        if (values[i] != std::floor(values[i]) || values[i] < 0)
          return absl::InvalidArgumentError(absl::StrCat(
              path, ":", line_no, ": label column ", i + 1, " ('", std::string(fields[i]),
              "') is not a class index (a non-negative integer)"));
        labels.push_back(static_cast<int64_t>(values[i]));
      } else {
        row.push_back(values[i]);
      }
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows"));
  Examples ex;
  ex.n = static_cast<int64_t>(rows.size());
  ex.labels = std::move(labels);
  int64_t col = 0;
  for (const TensorSpec& s : inputs) {
    Tensor t(s.dtype, WithLeading(ex.n, s.shape));
    const int64_t per = PerExample(s);
    for (int64_t r = 0; r < ex.n; ++r)
      for (int64_t j = 0; j < per; ++j) t.SetDouble(r * per + j, rows[r][col + j]);
    col += per;
    ex.inputs[s.name] = std::move(t);
  }
  return ex;
}

absl::StatusOr<Examples> ReadTensorExamples(const std::string& path,
                                            const std::vector<TensorSpec>& inputs,
                                            const std::string& labels_column) {
  KILN_ASSIGN_OR_RETURN(auto tensors, ReadSafetensors(path));
  Examples ex;
  ex.n = -1;
  for (const TensorSpec& s : inputs) {
    auto it = tensors.find(s.name);
    if (it == tensors.end())
      return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor '", s.name, "'"));
    const Tensor& t = it->second;
    if (t.dtype() != s.dtype || t.shape().rank() != s.shape.rank() || t.shape().rank() == 0 ||
        WithLeading(t.shape().dim(0), s.shape) != t.shape())
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", s.name, "' is ", t.TypeString(), ", expected N examples of ",
          std::string(DTypeName(s.dtype)), s.shape.ToString()));
    if (ex.n >= 0 && t.shape().dim(0) != ex.n)
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", s.name, "' holds ",
                                                     t.shape().dim(0),
                                                     " examples, the inputs before it ", ex.n));
    ex.n = t.shape().dim(0);
    ex.inputs[s.name] = t;
  }
  auto l = tensors.find("labels");
  if (labels_column != "none" && l != tensors.end()) {
    const Tensor& t = l->second;
    if (!IsInteger(t.dtype()) || t.shape() != Shape{ex.n})
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor 'labels' is ", t.TypeString(),
                                                     ", expected integer class indices [", ex.n,
                                                     "]"));
    for (int64_t i = 0; i < ex.n; ++i) ex.labels.push_back(LoadAsInt64(t.raw_data(), t.dtype(), i));
  }
  if (ex.n <= 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return ex;
}

absl::StatusOr<Examples> ReadExamples(const std::string& path, const std::vector<TensorSpec>& in,
                                      const QuantizeOptions& o) {
  absl::StatusOr<Examples> ex;
  if (absl::EndsWith(path, ".safetensors")) {
    ex = ReadTensorExamples(path, in, o.labels_column);
  } else if (absl::EndsWith(path, ".csv") || absl::EndsWith(path, ".csv.gz")) {
    ex = ReadCsvExamples(path, in, o.labels_column);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a .safetensors file or CSV rows (.csv or .csv.gz)"));
  }
  if (!ex.ok() || o.input_scale == 1.0) return ex;
  for (auto& [name, t] : ex->inputs) {
    if (!IsFloating(t.dtype())) continue;
    for (int64_t i = 0; i < t.num_elements(); ++i) t.SetDouble(i, t.GetDouble(i) * o.input_scale);
  }
  return ex;
}

int64_t WeightBytes(const std::map<std::string, Tensor>& w) {
  int64_t b = 0;
  for (const auto& [name, t] : w) b += t.byte_size();
  return b;
}

nlohmann::json LayerJson(const Int8Layer& l, const ir::Graph& g, double absmax) {
  const auto [lo, hi] = std::minmax_element(l.weight_scales.begin(), l.weight_scales.end());
  return {{"op", std::string(ir::OpcodeName(l.site.op))},
          {"node", l.site.node},
          {"weight", l.site.weight},
          {"weight_shape", g.node(g.FindParameter(l.site.weight)).type().shape.dims()},
          {"int8_weight", l.int8_weight},
          {"scale_parameter", l.scale_param},
          {"activation_absmax", absmax},
          {"activation_scale", l.activation_scale},
          {"weight_scales", l.weight_scales},
          {"weight_scale_min", lo == l.weight_scales.end() ? 0.f : *lo},
          {"weight_scale_max", hi == l.weight_scales.end() ? 0.f : *hi},
          {"weight_max_abs_error", l.weight_max_abs_error}};
}

absl::Status CheckOptions(const QuantizeOptions& o) {
  if (o.method != "minmax" && o.method != "percentile")
    return absl::InvalidArgumentError("--method " + o.method + ": expected minmax or percentile");
  if (!(o.percentile > 0 && o.percentile <= 100))
    return absl::InvalidArgumentError(
        absl::StrCat("--percentile ", o.percentile, ": expected a value in (0, 100]"));
  if (!std::isfinite(o.budget))
    return absl::InvalidArgumentError("--budget must be a finite number");
  if (!std::isfinite(o.input_scale))
    return absl::InvalidArgumentError("--input-scale must be a finite number");
  if (o.calibration_rows < 0 || o.latency_runs < 1)
    return absl::InvalidArgumentError("--calibration-rows must be >= 0, --latency-runs >= 1");
  if (o.out.empty()) return absl::InvalidArgumentError("--out is required");
  std::error_code ec;
  if (fs::exists(o.out, ec) && !o.overwrite)
    return absl::AlreadyExistsError(o.out + " exists (pass --overwrite to replace it)");
  if (fs::weakly_canonical(o.out, ec) == fs::weakly_canonical(o.artifact, ec))
    return absl::InvalidArgumentError("--out must not be the input artifact");
  return absl::OkStatus();
}

// The eval examples: --eval, or the calibration file's rows after the calibration rows.
absl::StatusOr<std::pair<Examples, Examples>> LoadData(const QuantizeOptions& o,
                                                       const std::vector<TensorSpec>& inputs,
                                                       std::string* eval_source) {
  KILN_ASSIGN_OR_RETURN(Examples all, ReadExamples(o.calibration, inputs, o));
  const int64_t nc = o.calibration_rows == 0 ? all.n : std::min(all.n, o.calibration_rows);
  Examples calib = predict::SliceExamples(all, 0, nc);
  if (!o.eval.empty()) {
    KILN_ASSIGN_OR_RETURN(Examples ev, ReadExamples(o.eval, inputs, o));
    *eval_source = o.eval;
    return std::make_pair(std::move(calib), std::move(ev));
  }
  if (nc >= all.n)
    return absl::InvalidArgumentError(absl::StrCat(
        o.calibration, ": all ", all.n, " examples calibrate (--calibration-rows ",
        o.calibration_rows, "); pass --eval DATA or fewer --calibration-rows to hold some out"));
  *eval_source = absl::StrCat(o.calibration, " rows ", nc + 1, "-", all.n);
  return std::make_pair(std::move(calib), predict::SliceExamples(all, nc, all.n));
}

void PrintReport(const nlohmann::json& r, std::ostream& out) {
  const bool acc = r["metric"] == "accuracy";
  out << absl::StrFormat("int8: %d of %d matmul/conv layers (%s calibration on %d examples)\n",
                         static_cast<int>(r["layers"].size()), r["sites"].get<int>(),
                         r["method"].get<std::string>(), r["calibration_examples"].get<int64_t>());
  if (acc) {
    out << absl::StrFormat(
        "accuracy: f32 %.2f%%  int8 %.2f%%  drop %.2f points (budget %.2f) on %d "
        "held-out examples\n",
        r["f32"].get<double>(), r["int8"].get<double>(), r["drop"].get<double>(),
        r["budget"].get<double>(), r["eval_examples"].get<int64_t>());
  } else {
    out << absl::StrFormat(
        "relative MSE of the int8 outputs vs f32: %.4f%% (budget %.4f%%) on %d "
        "examples\n",
        r["drop"].get<double>(), r["budget"].get<double>(), r["eval_examples"].get<int64_t>());
  }
  const nlohmann::json& l = r["latency_ms"];
  out << absl::StrFormat(
      "latency at batch %d (median of %d): f32 %.4f ms  int8 %.4f ms  (f32/int8 %.2fx)\n",
      l["batch"].get<int64_t>(), l["runs"].get<int>(), l["f32_median"].get<double>(),
      l["int8_median"].get<double>(), l["f32_over_int8"].get<double>());
  if (r.contains("cpu")) {
    const nlohmann::json& c = r["cpu"];
    out << absl::StrFormat("int8 kernels: %s at %s\n",
                           c["int8_exact_in_onednn"].get<bool>()
                               ? "oneDNN's int8 (AVX-512 VNNI dot products)"
                               : "Kiln's exact widening GEMM (s8 widened to s16; no VNNI)",
                           c["isa"].get<std::string>());
  }
  out << Int8SpeedNote(r);
  const nlohmann::json& w = r["weight_bytes"];
  out << absl::StrFormat("weights: f32 %d bytes  int8 artifact %d bytes\n", w["f32"].get<int64_t>(),
                         w["int8"].get<int64_t>());
}

}  // namespace

std::string Int8SpeedNote(const nlohmann::json& r) {
  const nlohmann::json& l = r["latency_ms"];
  const double ratio = l["f32_over_int8"].get<double>();
  if (!(ratio > 0 && ratio < 1)) return "";
  std::string why;
  if (r.contains("cpu")) {
    const nlohmann::json& c = r["cpu"];
    // Without VNNI an int8 multiply-add is no cheaper than an f32 one: the exact kernels widen
    // both operands to s16 (pmaddwd), about f32's rate per instruction, and int8 only wins where
    // reading the weights bounds the time. Say so, naming the level, so nobody hunts for a bug.
    why = c["int8_exact_in_onednn"].get<bool>()
              ? absl::StrFormat(" even with AVX-512 VNNI (this CPU runs at %s)",
                                c["isa_description"].get<std::string>())
              : absl::StrFormat(
                    ": this CPU runs at %s, without AVX-512 VNNI, where int8 products are widened "
                    "to 16 bits for exact sums (Kiln's widening GEMM: about f32's multiply rate, "
                    "no faster), so int8 gains only where reading the weights bounds the time",
                    c["isa_description"].get<std::string>());
  }
  return absl::StrFormat(
      "note: the int8 program is slower than f32 on this machine at batch %d (%.2fx its time)%s; "
      "it still reads fewer weight bytes, but where latency matters serve the f32 artifact\n",
      l["batch"].get<int64_t>(), 1 / ratio, why);
}

absl::StatusOr<QuantizeResult> RunQuantize(const QuantizeOptions& o, std::ostream& out) {
  KILN_RETURN_IF_ERROR(CheckOptions(o));
  KILN_ASSIGN_OR_RETURN(compiler::Artifact a, compiler::LoadArtifact(o.artifact));
  const std::vector<TensorSpec> inputs = a.signature.RuntimeInputs();
  int64_t batch = 0;
  for (const TensorSpec& s : inputs) {
    if (s.shape.rank() == 0 || (batch != 0 && s.shape.dim(0) != batch))
      return absl::InvalidArgumentError(o.artifact +
                                        ": its inputs do not share a leading batch dimension");
    batch = s.shape.dim(0);
  }
  if (batch <= 0) return absl::InvalidArgumentError(o.artifact + ": the artifact takes no inputs");
  std::string eval_source;
  KILN_ASSIGN_OR_RETURN(auto data, LoadData(o, inputs, &eval_source));
  const Examples& calib = data.first;
  const Examples& ev = data.second;
  std::set<std::string> weight_names;
  for (const auto& [name, t] : a.weights) weight_names.insert(name);
  const std::vector<Int8Site> sites = FindInt8Sites(a.program, weight_names);
  if (sites.empty())
    return absl::InvalidArgumentError(o.artifact +
                                      ": no matmul or convolution reads an artifact weight");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend, MakeBackendByName(o.backend));
  std::vector<double> absmax;
  KILN_ASSIGN_OR_RETURN(
      std::vector<float> scales,
      predict::Calibrate(*backend, a.program, a.weights, sites, calib,
                         {.method = o.method, .percentile = o.percentile}, &absmax));
  compiler::QuantizeInt8Pass int8_pass(a.weights, scales);
  ir::Graph int8_program = a.program;
  KILN_RETURN_IF_ERROR(int8_pass.Run(int8_program).status());
  const Int8Program& q = int8_pass.result();
  KILN_ASSIGN_OR_RETURN(auto f32, predict::CompileProgram(*backend, a.program, a.weights));
  KILN_ASSIGN_OR_RETURN(auto int8, predict::CompileProgram(*backend, q.program, q.weights));
  KILN_ASSIGN_OR_RETURN(predict::Metric m, predict::CompareMetric(*f32, *int8, ev));
  KILN_ASSIGN_OR_RETURN(predict::Latency lat,
                        predict::MeasureLatency(*f32, *int8, ev, o.latency_runs));

  QuantizeResult res;
  res.accepted = m.drop <= o.budget;
  nlohmann::json& r = res.report;
  r = {{"artifact", o.artifact},
       {"out", o.out},
       {"backend", o.backend},
       {"method", o.method},
       {"calibration", o.calibration},
       {"input_scale", o.input_scale},
       {"calibration_examples", calib.n},
       {"eval", eval_source},
       {"eval_examples", ev.n},
       {"metric", m.name},
       {"f32", m.f32},
       {"int8", m.int8},
       {"drop", m.drop},
       {"budget", o.budget},
       {"accepted", res.accepted},
       {"sites", static_cast<int>(sites.size())}};
  if (o.method == "percentile") r["percentile"] = o.percentile;
  const double f32_med = predict::Median(lat.f32_ms), int8_med = predict::Median(lat.int8_ms);
  r["latency_ms"] = {{"batch", batch},
                     {"runs", o.latency_runs},
                     {"f32_median", f32_med},
                     {"int8_median", int8_med},
                     {"f32_min", *std::min_element(lat.f32_ms.begin(), lat.f32_ms.end())},
                     {"f32_max", *std::max_element(lat.f32_ms.begin(), lat.f32_ms.end())},
                     {"int8_min", *std::min_element(lat.int8_ms.begin(), lat.int8_ms.end())},
                     {"int8_max", *std::max_element(lat.int8_ms.begin(), lat.int8_ms.end())},
                     {"f32_over_int8", int8_med > 0 ? f32_med / int8_med : 0.0}};
  // Which int8 kernels ran, and why: oneDNN's are exact only with AVX-512 VNNI (isa.h), below it
  // Kiln's widening GEMM runs them (runtime/cpu/internal/quantized_exact.h).
  if (o.backend == "cpu")
    r["cpu"] = {{"isa", CpuIsaName(ActiveCpuIsa())},
                {"isa_description", runtime::CpuIsaDescription()},
                {"int8_exact_in_onednn", runtime::OneDnnHasExactInt8()}};
  int64_t site_f32_bytes = 0;
  for (const Int8Site& s : sites) site_f32_bytes += a.weights.at(s.weight).byte_size();
  r["weight_bytes"] = {{"f32", WeightBytes(a.weights)},
                       {"int8", WeightBytes(q.weights)},
                       {"quantized_layers_f32", site_f32_bytes}};
  r["layers"] = nlohmann::json::array();
  for (size_t k = 0; k < q.layers.size(); ++k)
    r["layers"].push_back(LayerJson(q.layers[k], a.program, absmax[k]));
  PrintReport(r, out);
  if (!res.accepted) return res;

  // What the cpu backend's pipeline makes of the rewritten program (fusion of the bias adds and
  // activations after the int8 ops), as `kiln export` stores it.
  const ir::Graph& program = int8->exe->graph();
  compiler::ArtifactOptions ao;
  ao.backend = a.backend;
  ao.metadata = a.metadata;
  ao.metadata["quantized"] = "int8";
  ao.metadata["quantize_method"] = o.method;
  ao.metadata["quantized_from"] = a.program_sha256;
  ao.overwrite = o.overwrite;
  KILN_RETURN_IF_ERROR(compiler::WriteArtifact(o.out, program, q.weights, ao));
  KILN_RETURN_IF_ERROR(
      WriteStringToFile(Env::Default(), r.dump(2) + "\n", o.out + "/quantize.json", false));
  out << "wrote " << o.out << " (and " << o.out << "/quantize.json)\n";
  return res;
}

QuantizeCommand::QuantizeCommand(CLI::App& app) {
  cmd_ = app.add_subcommand(
      "quantize",
      "Post-training int8 of an artifact's matmuls and convolutions, written only when the "
      "held-out metric drops by at most --budget (docs/quantize.md)");
  cmd_->add_option("artifact", options_.artifact, "The f32 artifact directory (`kiln export`)")
      ->required();
  cmd_->add_option("--calibration", options_.calibration,
                   "Calibration examples: .csv/.csv.gz rows (inputs then a label) or .safetensors")
      ->required();
  cmd_->add_option("--out", options_.out, "Where to write the int8 artifact")->required();
  cmd_->add_option("--eval", options_.eval,
                   "Held-out examples (default: the calibration file's rows after "
                   "--calibration-rows)");
  cmd_->add_option("--budget", options_.budget,
                   "Largest allowed drop: accuracy points, or relative MSE in percent")
      ->capture_default_str();
  cmd_->add_option("--method", options_.method, "Activation calibration: minmax or percentile")
      ->check(CLI::IsMember({"minmax", "percentile"}))
      ->capture_default_str();
  cmd_->add_option("--percentile", options_.percentile, "Percentile of |x| for --method percentile")
      ->capture_default_str();
  cmd_->add_option("--labels-column", options_.labels_column,
                   "CSV label column: last, first, none or a 0-based index")
      ->capture_default_str();
  cmd_->add_option("--calibration-rows", options_.calibration_rows,
                   "Examples of --calibration that calibrate (0: all)")
      ->capture_default_str();
  cmd_->add_option("--input-scale", options_.input_scale,
                   "Multiply every float input value read by this (the data pipeline's scaling; "
                   "digits: 0.0625)")
      ->capture_default_str();
  cmd_->add_option("--latency-runs", options_.latency_runs, "Timed runs per program")
      ->capture_default_str();
  cmd_->add_flag("--overwrite", options_.overwrite, "Replace --out if it exists");
  cmd_->add_option("--backend", options_.backend, "Backend: cpu (oneDNN) or reference")
      ->check(CLI::IsMember(BackendNames()))
      ->capture_default_str();
}

int QuantizeCommand::Run(std::ostream& out, std::ostream& err) {
  if (!*cmd_) return -1;
  absl::StatusOr<QuantizeResult> r = RunQuantize(options_, out);
  if (!r.ok()) {
    err << "kiln quantize: " << r.status().message() << "\n";
    return 1;
  }
  if (r->accepted) return 0;
  const nlohmann::json& j = r->report;
  err << absl::StrFormat(
      "kiln quantize: refused: the %s drop of %.4f exceeds the budget of %.4f (f32 %.4f, int8 "
      "%.4f); nothing written to %s\n",
      j["metric"].get<std::string>(), j["drop"].get<double>(), j["budget"].get<double>(),
      j["f32"].get<double>(), j["int8"].get<double>(), options_.out);
  return 1;
}

}  // namespace kiln::cli
