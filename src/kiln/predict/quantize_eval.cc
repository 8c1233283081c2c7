#include "kiln/predict/quantize_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"

namespace kiln::predict {
namespace {

using compiler::CalibrationProgram;
using compiler::Int8Site;
using compiler::SymmetricScale;

Shape WithLeading(int64_t n, const Shape& s) {
  std::vector<int64_t> dims = {n};
  dims.insert(dims.end(), s.dims().begin() + 1, s.dims().end());
  return Shape(std::move(dims));
}

// The output compared: "logits" when present, else the first f32 [B, C] output (C > 1) for
// accuracy; every f32 output for the relative MSE.
int LogitsOutput(const ir::Graph& g) {
  int found = -1;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const ir::Type& t = g.node(g.outputs()[i].node).type();
    if (t.dtype != DType::kF32 || t.shape.rank() != 2 || t.shape.dim(1) < 2) continue;
    if (g.outputs()[i].name == "logits") return static_cast<int>(i);
    if (found < 0) found = static_cast<int>(i);
  }
  return found;
}

}  // namespace

Examples SliceExamples(const Examples& ex, int64_t begin, int64_t end) {
  Examples r;
  r.n = end - begin;
  for (const auto& [name, t] : ex.inputs) {
    const int64_t per = t.num_elements() / ex.n;
    Tensor s(t.dtype(), WithLeading(r.n, t.shape()));
    const int64_t es = DTypeSize(t.dtype());
    std::memcpy(s.raw_data(), static_cast<const char*>(t.raw_data()) + begin * per * es,
                r.n * per * es);
    r.inputs[name] = std::move(s);
  }
  if (!ex.labels.empty()) r.labels.assign(ex.labels.begin() + begin, ex.labels.begin() + end);
  return r;
}

absl::StatusOr<std::unique_ptr<CompiledProgram>> CompileProgram(
    runtime::Backend& backend, ir::Graph program, const std::map<std::string, Tensor>& weights) {
  auto p = std::make_unique<CompiledProgram>();
  KILN_ASSIGN_OR_RETURN(p->exe, backend.Compile(program));
  p->program = std::move(program);
  KILN_ASSIGN_OR_RETURN(serve::FixedBatchRunner r,
                        serve::FixedBatchRunner::ForProgram(*p->exe, p->program, weights));
  p->runner.emplace(std::move(r));
  return p;
}

absl::Status RunExamples(
    CompiledProgram& p, const Examples& ex,
    const std::function<absl::Status(const std::vector<Tensor>&, int64_t)>& fn) {
  return p.runner->RunRows(
      ex.inputs, ex.n,
      [&](const std::vector<Tensor>& outs, int64_t, int64_t rows) { return fn(outs, rows); });
}

absl::StatusOr<std::vector<float>> Calibrate(runtime::Backend& backend, const ir::Graph& program,
                                             const std::map<std::string, Tensor>& weights,
                                             const std::vector<Int8Site>& sites,
                                             const Examples& calib, const CalibrationOptions& o,
                                             std::vector<double>* absmax) {
  KILN_ASSIGN_OR_RETURN(ir::Graph g, CalibrationProgram(program, sites));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CompiledProgram> r,
                        CompileProgram(backend, std::move(g), weights));
  const int64_t batch = r->batch();
  const size_t first = program.outputs().size();
  std::vector<std::vector<float>> values(sites.size());
  absmax->assign(sites.size(), 0.0);
  KILN_RETURN_IF_ERROR(RunExamples(*r, calib, [&](const std::vector<Tensor>& outs, int64_t rows) {
    for (size_t k = 0; k < sites.size(); ++k) {
      const Tensor& t = outs[first + k];
      // Only the rows that hold examples (the activation's leading dim is the batch).
      const int64_t count = t.num_elements() / batch * rows;
      const float* v = t.data<float>();
      const int64_t total = t.num_elements() / batch * calib.n;  // this site's values, all batches
      const int64_t stride = std::max<int64_t>(1, total >> 22);
      for (int64_t i = 0; i < count; ++i) {
        const float x = std::fabs(v[i]);
        if (!std::isfinite(x)) continue;
        (*absmax)[k] = std::max((*absmax)[k], static_cast<double>(x));
        if (i % stride == 0) values[k].push_back(x);
      }
    }
    return absl::OkStatus();
  }));
  std::vector<float> scales;
  for (size_t k = 0; k < sites.size(); ++k) {
    double range = (*absmax)[k];
    if (o.method == "percentile" && !values[k].empty()) {
      std::vector<float>& v = values[k];
      const size_t idx =
          std::min(v.size() - 1, static_cast<size_t>(std::ceil(o.percentile / 100.0 * v.size())) -
                                     (o.percentile > 0 ? 1 : 0));
      std::nth_element(v.begin(), v.begin() + idx, v.end());
      range = v[idx];
    }
    scales.push_back(SymmetricScale(range));
  }
  return scales;
}

absl::StatusOr<Metric> CompareMetric(CompiledProgram& f32, CompiledProgram& int8,
                                     const Examples& ev) {
  const int64_t batch = f32.batch();
  const int logits = LogitsOutput(f32.program);
  Metric m;
  if (logits >= 0 && !ev.labels.empty()) {
    m.name = "accuracy";
    const int64_t classes =
        f32.program.node(f32.program.outputs()[logits].node).type().shape.dim(1);
    for (int64_t l : ev.labels)
      if (l >= classes)
        return absl::InvalidArgumentError(
            absl::StrCat("label ", l, " is not a class of the model's ", classes, " logits"));
    int64_t offset = 0;
    int64_t right[2] = {0, 0};
    for (int which = 0; which < 2; ++which) {
      offset = 0;
      KILN_RETURN_IF_ERROR(RunExamples(
          which == 0 ? f32 : int8, ev, [&](const std::vector<Tensor>& outs, int64_t rows) {
            const float* v = outs[logits].data<float>();
            for (int64_t r = 0; r < rows; ++r) {
              const float* row = v + r * classes;
              const int64_t pred = std::max_element(row, row + classes) - row;
              right[which] += pred == ev.labels[offset + r];
            }
            offset += rows;
            return absl::OkStatus();
          }));
    }
    m.f32 = 100.0 * right[0] / ev.n;
    m.int8 = 100.0 * right[1] / ev.n;
    m.drop = m.f32 - m.int8;
    return m;
  }
  m.name = "relative_mse";
  std::vector<std::vector<Tensor>> ref;
  KILN_RETURN_IF_ERROR(RunExamples(f32, ev, [&](const std::vector<Tensor>& outs, int64_t) {
    ref.push_back(outs);
    return absl::OkStatus();
  }));
  double err = 0, norm = 0;
  size_t b = 0;
  KILN_RETURN_IF_ERROR(RunExamples(int8, ev, [&](const std::vector<Tensor>& outs, int64_t rows) {
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].dtype() != DType::kF32) continue;
      const int64_t count = outs[i].num_elements() / batch * rows;
      const float* q = outs[i].data<float>();
      const float* f = ref[b][i].data<float>();
      for (int64_t j = 0; j < count; ++j) {
        err += (double(q[j]) - f[j]) * (double(q[j]) - f[j]);
        norm += double(f[j]) * f[j];
      }
    }
    ++b;
    return absl::OkStatus();
  }));
  m.int8 = norm > 0 ? 100.0 * err / norm : (err > 0 ? 100.0 : 0.0);
  m.drop = m.int8;
  return m;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

absl::StatusOr<Latency> MeasureLatency(CompiledProgram& f32, CompiledProgram& int8,
                                       const Examples& ev, int runs) {
  Examples one = SliceExamples(ev, 0, std::min(f32.batch(), ev.n));
  Latency l;
  for (int i = -3; i < runs; ++i) {
    for (int which = 0; which < 2; ++which) {
      const auto start = std::chrono::steady_clock::now();
      KILN_RETURN_IF_ERROR(
          RunExamples(which == 0 ? f32 : int8, one,
                      [](const std::vector<Tensor>&, int64_t) { return absl::OkStatus(); }));
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (i >= 0) (which == 0 ? l.f32_ms : l.int8_ms).push_back(ms);
    }
  }
  return l;
}

}  // namespace kiln::predict
