// --profile-steps: the FLOP count of a compiled step, the per-kernel table of the profiled window
// (from the trace's kernel events and the compiled step's execution plan), the bare rates it is
// measured against, and the report Trainer::Run prints (docs/train.md "--profile-steps A:B"); the
// classification itself is profile_analysis.h. Split from trainer.cc, which keeps the loop.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/status.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/opcode.h"
#include "kiln/train/profile_analysis.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

using Clock = std::chrono::steady_clock;

namespace {

// FLOPs of one node (0 for anything but contractions, convolutions and attention).
double NodeFlops(const ir::Graph& graph, const ir::Node& n) {
  auto elems = [&](int operand) {
    return static_cast<double>(graph.node(n.operands()[operand]).type().shape.num_elements());
  };
  auto out = static_cast<double>(n.type().shape.num_elements());
  switch (n.opcode()) {
    case ir::Opcode::kDotGeneral: {
      const Shape& lhs = graph.node(n.operands()[0]).type().shape;
      double k = 1;
      for (int64_t d : n.attr_ints("lhs_contracting")) k *= lhs[static_cast<int>(d)];
      return 2 * out * k;
    }
    case ir::Opcode::kConv2d: {  // filter OIHW: per output, 2 * I/g * kh * kw
      const Shape& w = graph.node(n.operands()[1]).type().shape;
      return 2 * out * elems(1) / static_cast<double>(w[0]);
    }
    case ir::Opcode::kConv2dBackwardInput: {  // operands grad_out, filter
      const Shape& w = graph.node(n.operands()[1]).type().shape;
      return 2 * elems(0) * elems(1) / static_cast<double>(w[0]);
    }
    case ir::Opcode::kConv2dBackwardFilter: {  // operands input, grad_out; result = filter
      const Shape& w = n.type().shape;
      return 2 * elems(1) * out / static_cast<double>(w[0]);
    }
    case ir::Opcode::kAttention: {  // q[...,Sq,D] k[...,Sk,D] v[...,Sk,Dv]: QK^T, then PV
      const Shape& q = graph.node(n.operands()[0]).type().shape;
      const Shape& k = graph.node(n.operands()[1]).type().shape;
      const double d = static_cast<double>(q[q.rank() - 1]);
      const double dv = static_cast<double>(n.type().shape[n.type().shape.rank() - 1]);
      const double sk = static_cast<double>(k[k.rank() - 2]);
      return 2 * (out / dv) * sk * d + 2 * out * sk;
    }
    default:
      return 0;
  }
}

}  // namespace

double CountMatmulFlops(const ir::Graph& graph) {
  double flops = 0;
  for (const ir::Node& n : graph.nodes()) flops += NodeFlops(graph, n);
  return flops;
}

namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Best run of `graph` on zero-filled inputs with preallocated outputs, after one untimed run:
// at least `min_reps` timed runs and until 50 ms have been timed (at most 200), so a
// microsecond-sized kernel is not judged by one run that a busy machine slowed down.
absl::StatusOr<double> BestRunSeconds(runtime::Backend& backend, const ir::Graph& graph,
                                      int min_reps) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Executable> exe, backend.Compile(graph));
  const ir::Graph& g = exe->graph();
  std::vector<Tensor> ins, outs;
  for (const ir::Node& n : g.nodes()) {
    if (n.opcode() == ir::Opcode::kParameter) ins.emplace_back(n.type().dtype, n.type().shape);
  }
  for (const ir::Output& o : g.outputs()) {
    outs.emplace_back(g.node(o.node).type().dtype, g.node(o.node).type().shape);
  }
  std::vector<const Tensor*> in_ptrs;
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : ins) in_ptrs.push_back(&t);
  for (Tensor& t : outs) out_ptrs.push_back(&t);
  KILN_RETURN_IF_ERROR(exe->RunInto(in_ptrs, out_ptrs));
  double best = 1e30, timed = 0;
  for (int rep = 0; rep < 200 && (rep < min_reps || timed < 0.05); ++rep) {
    auto start = Clock::now();
    KILN_RETURN_IF_ERROR(exe->RunInto(in_ptrs, out_ptrs));
    const double s = Seconds(Clock::now() - start);
    best = std::min(best, s);
    timed += s;
  }
  return best;
}

absl::StatusOr<double> MeasureMatmulPeak(runtime::Backend& backend, int64_t n) {
  ir::Builder b("matmul_peak");
  ir::Value x = b.Parameter("a", DType::kF32, {n, n});
  ir::Value y = b.Parameter("b", DType::kF32, {n, n});
  b.Output("c", ir::MatMul(x, y));
  KILN_ASSIGN_OR_RETURN(ir::Graph g, b.Build());
  KILN_ASSIGN_OR_RETURN(double best, BestRunSeconds(backend, g, 4));
  return 2.0 * n * n * n / best;
}

// The same dot_general (operand types and dimension numbers) alone: the bare primitive's time.
absl::StatusOr<double> BareDotSeconds(runtime::Backend& backend, const ir::Graph& graph,
                                      const ir::Node& dot) {
  // One name per shape: the compile cache warns when one graph name recompiles for new shapes.
  ir::Builder b(absl::StrCat("bare_dot_", dot.id()));
  const ir::Type& lt = graph.node(dot.operands()[0]).type();
  const ir::Type& rt = graph.node(dot.operands()[1]).type();
  ir::Value x = b.Parameter("a", lt.dtype, lt.shape);
  ir::Value y = b.Parameter("b", rt.dtype, rt.shape);
  b.Output("c", ir::DotGeneral(x, y,
                               {.lhs_batch = dot.attr_ints("lhs_batch"),
                                .rhs_batch = dot.attr_ints("rhs_batch"),
                                .lhs_contracting = dot.attr_ints("lhs_contracting"),
                                .rhs_contracting = dot.attr_ints("rhs_contracting")}));
  KILN_ASSIGN_OR_RETURN(ir::Graph g, b.Build());
  return BestRunSeconds(backend, g, 3);
}

int64_t TypeBytes(const ir::Type& t) { return t.shape.num_elements() * DTypeSize(t.dtype); }

// The node id a thunk is named after ("dot_general %12 (...)", "fusion 3 %5..%9 (...)"), or -1.
int ThunkNode(const std::string& name) {
  size_t p = name.find('%');
  if (p == std::string::npos || p + 1 >= name.size() || !std::isdigit(name[p + 1])) return -1;
  return std::atoi(name.c_str() + p + 1);
}

std::string JoinTypes(const ir::Graph& g, const std::vector<int>& ids, size_t max) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < max; ++i) {
    absl::StrAppend(&out, i ? ", " : "", g.node(ids[i]).type().ToString());
  }
  if (ids.size() > max) absl::StrAppend(&out, ", +", ids.size() - max);
  return out;
}

// One table row for one thunk: what it is, its shapes, its FLOPs and bytes per call.
struct Row {
  KernelStat stat;
  int dot = -1;  // a dot_general to measure bare, or -1
};

Row DescribeThunk(const ir::Graph& g, const compiler::ExecutionPlan& plan,
                  const std::string& name) {
  Row row;
  const size_t paren = name.find('(');
  const std::string how = paren == std::string::npos ? "" : " " + name.substr(paren);
  const int id = ThunkNode(name);
  if (id < 0 || id >= g.num_nodes() || plan.kernel_of[id] < 0) {
    row.stat.op = name;
    return row;
  }
  const std::vector<int>& members = plan.kernels[plan.kernel_of[id]].members;
  std::vector<int> reads, writes;
  int contraction = -1;
  for (int m : members) {
    for (int r : plan.reads[m]) {
      if (std::find(reads.begin(), reads.end(), r) == reads.end()) reads.push_back(r);
    }
    if (plan.needed[m]) writes.push_back(m);
    const double f = NodeFlops(g, g.node(m));
    if (f > 0 && contraction < 0) contraction = m;
    row.stat.flops += f;
  }
  for (int r : reads) row.stat.bytes += static_cast<double>(TypeBytes(g.node(r).type()));
  for (int w : writes) row.stat.bytes += static_cast<double>(TypeBytes(g.node(w).type()));
  const bool fusion = name.rfind("fusion", 0) == 0;
  row.stat.op = absl::StrCat(
      fusion ? std::string("fusion") : std::string(ir::OpcodeName(g.node(id).opcode())), how);
  if (contraction >= 0) {
    const ir::Node& c = g.node(contraction);
    row.stat.kind = KernelKind::kMatmul;
    row.stat.shapes =
        absl::StrCat(g.node(c.operands()[0]).type().ToString(), " x ",
                     g.node(c.operands()[1]).type().ToString(), " -> ", c.type().ToString());
    if (c.opcode() == ir::Opcode::kDotGeneral) row.dot = contraction;
  } else {
    row.stat.shapes = absl::StrCat(JoinTypes(g, reads, 3), reads.empty() ? "-> " : " -> ",
                                   JoinTypes(g, writes, 2));
  }
  return row;
}

// The profiled window's kernel events grouped by (description, shapes).
std::vector<Row> KernelRows(const runtime::Executable& exe, const compiler::BackendTraits& traits,
                            const std::vector<TraceEvent>& events) {
  const ir::Graph& g = exe.graph();
  const compiler::ExecutionPlan plan = compiler::PlanExecution(g, traits);
  std::vector<Row> rows;
  std::map<std::string, int> row_of_key, row_of_thunk;
  for (const TraceEvent& e : events) {
    if (e.cat != "kernel" || e.ph != 'X') continue;
    auto it = row_of_thunk.find(e.name);
    if (it == row_of_thunk.end()) {
      Row r = DescribeThunk(g, plan, e.name);
      const std::string key = absl::StrCat(r.stat.op, "|", r.stat.shapes);
      auto [k, added] = row_of_key.emplace(key, static_cast<int>(rows.size()));
      if (added) rows.push_back(std::move(r));
      it = row_of_thunk.emplace(e.name, k->second).first;
    }
    KernelStat& s = rows[it->second].stat;
    ++s.calls;
    s.seconds += static_cast<double>(e.dur_ns) * 1e-9;
  }
  return rows;
}

// Bare seconds per call for the `max_rows` matmul rows that took longest.
void MeasureBareDots(runtime::Backend& backend, const ir::Graph& g, std::vector<Row>& rows,
                     int max_rows) {
  std::vector<Row*> dots;
  for (Row& r : rows) {
    if (r.dot >= 0) dots.push_back(&r);
  }
  std::stable_sort(dots.begin(), dots.end(),
                   [](const Row* a, const Row* b) { return a->stat.seconds > b->stat.seconds; });
  for (size_t i = 0; i < dots.size() && static_cast<int>(i) < max_rows; ++i) {
    absl::StatusOr<double> s = BareDotSeconds(backend, g, g.node(dots[i]->dot));
    if (s.ok()) dots[i]->stat.bare_seconds = *s;
  }
}

// Sets of parameters and optimizer state the train step keeps resident.
constexpr int64_t kResidentSets = 1;

int64_t StoreBytes(const nn::ParamStore& store) {
  int64_t bytes = 0;
  for (int i = 0; i < store.size(); ++i) bytes += store.value(i).byte_size();
  return bytes;
}

}  // namespace

absl::Status Trainer::ReportProfile(double total, double input, double compute, int64_t steps) {
  const std::string trace_path = config_.output_dir + "/trace.json";
  if (steps == 0) {
    KILN_RETURN_IF_ERROR(profiler_.WriteJson(trace_path, run_dir_->env()));
    Log("profile: no steps fell in --profile-steps; trace.json holds only the compile events");
    return absl::OkStatus();
  }
  // The peak at the end of the profiled window: not the final checkpoint's host copy, nor the
  // operands of the measurements below.
  const int64_t peak_rss = profile_peak_rss_ >= 0 ? profile_peak_rss_ : PeakRssBytes();
  runtime::Backend& backend = *options_.backend;
  const runtime::Executable& exe = step_->executable();
  const double flops = CountMatmulFlops(exe.graph());
  const double achieved = compute > 0 ? flops * steps / compute : 0;
  std::vector<Row> rows = KernelRows(exe, backend.Traits(), profiler_.Events());
  MeasureBareDots(backend, exe.graph(), rows, /*max_rows=*/24);
  absl::StatusOr<double> peak = MeasureMatmulPeak(backend, 512);
  ProfileInputs in{.steps = steps,
                   .step_seconds = total,
                   .input_seconds = input,
                   .matmul_peak = peak.ok() ? *peak : 0,
                   .memcpy_bandwidth = MemcpyBandwidth(),
                   .prefetch_depth = data_.train->prefetch_depth(),
                   .produce_seconds = data_.train->mean_produce_seconds(),
                   .workers = data_.train->workers()};
  std::vector<KernelStat> kernels;
  for (Row& r : rows) kernels.push_back(std::move(r.stat));
  const ProfileVerdict v = ClassifyProfile(kernels, in);

  // One resident set each of parameters and optimizer state (TrainStep updates them in place);
  // one f32 gradient per parameter, inside the arena.
  MemoryBreakdown mem{.parameters = kResidentSets * StoreBytes(step_->params()),
                      .gradients = step_->params().num_elements() * int64_t{4},
                      .optimizer_state = kResidentSets * StoreBytes(step_->optimizer_state()),
                      .arena = exe.plan().arena_bytes,
                      .constants = HoistedBytes(exe),
                      .evaluation = evaluator_->resident_bytes(),
                      .checkpoint_staging = checkpoint_staging_bytes_,
                      .peak_rss = peak_rss};
  constexpr double kMiB = 1024.0 * 1024.0;
  profiler_.SetOtherData("verdict", std::string(BoundName(v.bound)));
  profiler_.SetOtherData("memory_mib/parameters", mem.parameters / kMiB);
  profiler_.SetOtherData("memory_mib/gradients", mem.gradients / kMiB);
  profiler_.SetOtherData("memory_mib/optimizer_state", mem.optimizer_state / kMiB);
  profiler_.SetOtherData("memory_mib/arena", mem.arena / kMiB);
  profiler_.SetOtherData("memory_mib/constants", mem.constants / kMiB);
  profiler_.SetOtherData("memory_mib/evaluation", mem.evaluation / kMiB);
  profiler_.SetOtherData("memory_mib/checkpoint_staging", mem.checkpoint_staging / kMiB);
  if (mem.peak_rss >= 0) {
    profiler_.SetOtherData("memory_mib/other", mem.other() / kMiB);
    profiler_.SetOtherData("memory_mib/peak_rss", mem.peak_rss / kMiB);
  }
  KILN_RETURN_IF_ERROR(profiler_.WriteJson(trace_path, run_dir_->env()));

  const double util = in.matmul_peak > 0 ? achieved / in.matmul_peak : 0;
  std::string peak_text =
      peak.ok() ? absl::StrFormat(
                      "%.1f GFLOP/s over the compute time (%.1f%% of the square f32 "
                      "matmul peak %.1f GFLOP/s)",
                      achieved / 1e9, 100 * util, *peak / 1e9)
                : absl::StrFormat("%.1f GFLOP/s (peak not measured: %s)", achieved / 1e9,
                                  std::string(peak.status().message()));
  Log(absl::StrFormat(
      "profile of %d steps: step %.3f ms, input wait %.1f%%, compute %.3f ms; matmul/conv "
      "%.3g GFLOP/step -> %s; compile %.2fs",
      steps, 1e3 * total / steps, 100 * v.input_share, 1e3 * compute / steps, flops / 1e9,
      peak_text, compile_seconds_));
  Log(v.text);
  Log(FormatTopKernels(kernels, in, 8));
  Log(FormatMemoryBreakdown(mem));
  Log(absl::StrCat("trace: ", trace_path));
  return absl::OkStatus();
}

}  // namespace kiln::train
