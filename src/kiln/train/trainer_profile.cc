// --profile-steps: the FLOP count of a compiled step, the matmul peak measured on the same
// backend, and the report Trainer::Run prints (docs/train.md "--profile-steps A:B"). Split from
// trainer.cc, which keeps the training loop.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/opcode.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

using Clock = std::chrono::steady_clock;

double CountMatmulFlops(const ir::Graph& graph) {
  double flops = 0;
  for (const ir::Node& n : graph.nodes()) {
    auto elems = [&](int operand) {
      return static_cast<double>(graph.node(n.operands()[operand]).type().shape.num_elements());
    };
    auto out = static_cast<double>(n.type().shape.num_elements());
    switch (n.opcode()) {
      case ir::Opcode::kDotGeneral: {
        const Shape& lhs = graph.node(n.operands()[0]).type().shape;
        double k = 1;
        for (int64_t d : n.attr_ints("lhs_contracting")) k *= lhs[static_cast<int>(d)];
        flops += 2 * out * k;
        break;
      }
      case ir::Opcode::kConv2d: {  // filter OIHW: per output, 2 * I/g * kh * kw
        const Shape& w = graph.node(n.operands()[1]).type().shape;
        flops += 2 * out * elems(1) / static_cast<double>(w[0]);
        break;
      }
      case ir::Opcode::kConv2dBackwardInput: {  // operands grad_out, filter
        const Shape& w = graph.node(n.operands()[1]).type().shape;
        flops += 2 * elems(0) * elems(1) / static_cast<double>(w[0]);
        break;
      }
      case ir::Opcode::kConv2dBackwardFilter: {  // operands input, grad_out; result = filter
        const Shape& w = n.type().shape;
        flops += 2 * elems(1) * out / static_cast<double>(w[0]);
        break;
      }
      default:
        break;
    }
  }
  return flops;
}

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

absl::StatusOr<double> MeasureMatmulPeak(runtime::Backend& backend, int64_t n) {
  ir::Builder b("matmul_peak");
  ir::Value x = b.Parameter("a", DType::kF32, {n, n});
  ir::Value y = b.Parameter("b", DType::kF32, {n, n});
  b.Output("c", ir::MatMul(x, y));
  KILN_ASSIGN_OR_RETURN(ir::Graph g, b.Build());
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Executable> exe, backend.Compile(g));
  Tensor a(DType::kF32, Shape{n, n}), bb(DType::kF32, Shape{n, n}), c(DType::kF32, Shape{n, n});
  for (int64_t i = 0; i < n * n; ++i) {
    a.data<float>()[i] = static_cast<float>(i % 7) * 0.1f;
    bb.data<float>()[i] = static_cast<float>(i % 5) * 0.1f;
  }
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    auto start = Clock::now();
    KILN_RETURN_IF_ERROR(exe->RunInto({&a, &bb}, {&c}));
    best = std::min(best, Seconds(Clock::now() - start));
  }
  return 2.0 * n * n * n / best;
}

}  // namespace

absl::Status Trainer::ReportProfile(double total, double input, double compute, int64_t steps) {
  KILN_RETURN_IF_ERROR(profiler_.WriteJson(config_.output_dir + "/trace.json", run_dir_->env()));
  if (steps == 0) {
    Log("profile: no steps fell in --profile-steps; trace.json holds only the compile events");
    return absl::OkStatus();
  }
  const double flops = CountMatmulFlops(step_->train_step_graph());
  const double achieved = compute > 0 ? flops * steps / compute : 0;
  const double input_share = total > 0 ? input / total : 0;
  absl::StatusOr<double> peak = MeasureMatmulPeak(*options_.backend, 512);
  const double util = peak.ok() && *peak > 0 ? achieved / *peak : 0;
  std::string verdict;
  if (input_share > 0.3) {
    verdict = "input-bound: the step waits on data; raise prefetch or simplify decoding";
  } else if (util >= 0.5) {
    verdict = "compute-bound: matmul/conv kernels run near the measured peak";
  } else {
    verdict =
        "overhead-bound: the matmuls are too small to keep the cores busy (per-op overhead, "
        "memory-bound elementwise work); a larger batch or model would raise utilization";
  }
  std::string peak_text =
      peak.ok() ? absl::StrFormat(
                      "%.1f GFLOP/s (%.1f%% of the measured f32 matmul peak %.1f "
                      "GFLOP/s)",
                      achieved / 1e9, 100 * util, *peak / 1e9)
                : absl::StrFormat("%.1f GFLOP/s (peak not measured: %s)", achieved / 1e9,
                                  std::string(peak.status().message()));
  Log(absl::StrFormat(
      "profile of %d steps: step %.3f ms, input wait %.1f%%, compute %.3f ms; matmul/conv "
      "%.3g GFLOP/step -> %s; compile %.2fs\nverdict: %s\ntrace: %s/trace.json",
      steps, 1e3 * total / steps, 100 * input_share, 1e3 * compute / steps, flops / 1e9, peak_text,
      compile_seconds_, verdict, config_.output_dir));
  return absl::OkStatus();
}

}  // namespace kiln::train
