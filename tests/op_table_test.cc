// The op-consistency test (DESIGN.md §3, convention 6): every row of the op table (op_table.h)
// runs on the reference backend (the oracle) and the cpu backend.
//
//   OpTable/OpForward.Check/<row>_<dtype>     reference vs cpu (oneDNN, and prefer_loops) on the
//                                             same inputs: f32 within ~1e-5 relative (grown with
//                                             the summation length), bf16 within ~1e-2, integer,
//                                             bool and data-movement outputs bit for bit; plus
//                                             the row's own definition check, if any
//   OpTable/OpDecomposed.Check/<row>_<dtype>  composites decomposed (DecomposeComposites): no
//                                             composite op is left, and the reference and cpu
//                                             runs of the decomposed graph match the reference
//                                             run of the original
//   OpTable/OpGradient.Check/<row>_f32        d sum(out * c)/d input for a fixed random c:
//                                             cpu vs reference in f32 (also decomposed), and the
//                                             reference in f64 vs central finite differences in
//                                             f64 (~1e-6 relative)
//   OpTableCoverage.*                         every opcode has rows; rows build and contain
//                                             their op; names are unique
#include "op_table.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/compiler/passes/decompose.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/opcode.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/executable.h"
#include "kiln/runtime/reference/reference_backend.h"
#include "tests/support/pass_sweep.h"

namespace kiln::optable {
namespace {

using runtime::Backend;
using runtime::Executable;

Backend& Reference() {
  static Backend* b = runtime::MakeReferenceBackend().release();
  return *b;
}

// The cpu backends run the compiler with the pipeline options of the CTest pass sweeps
// (KILN_DISABLE_PASSES etc., tests/support/pass_sweep.h).
Backend& Cpu() {
  static Backend* b = runtime::MakeCpuBackend(testing::SweepCpuOptions()).release();
  return *b;
}

// The cpu backend with Kiln's own loops where it would otherwise call oneDNN.
Backend& CpuLoops() {
  static Backend* b = [] {
    runtime::CpuBackendOptions o = testing::SweepCpuOptions();
    o.prefer_loops = true;
    return runtime::MakeCpuBackend(o).release();
  }();
  return *b;
}

// A sweep entry (op_table_test_without_<pass>) really runs without its pass.
TEST(OpTablePassSweep, TheSweepReachesTheBackend) { EXPECT_TRUE(testing::SweepReaches(Cpu())); }

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(OP_TABLE_CONCAT_(op_table_so_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)        \
  auto tmp = (expr);                                      \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.status(); \
  lhs = std::move(tmp).value()
#define OP_TABLE_CONCAT_IMPL_(a, b) a##b
#define OP_TABLE_CONCAT_(a, b) OP_TABLE_CONCAT_IMPL_(a, b)

absl::StatusOr<std::vector<Tensor>> CompileAndRun(Backend& backend, const ir::Graph& g,
                                                  const std::vector<Tensor>& inputs) {
  absl::StatusOr<std::unique_ptr<Executable>> exe = backend.Compile(g);
  if (!exe.ok()) {
    return absl::Status(exe.status().code(),
                        backend.name() + " compile: " + std::string(exe.status().message()));
  }
  absl::StatusOr<std::vector<Tensor>> out = (*exe)->Run(inputs);
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        backend.name() + " run: " + std::string(out.status().message()));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparison.

// KILN_OP_TABLE_VERBOSE=1 prints the worst error-to-tolerance ratio of every comparison (for
// judging how much headroom a tolerance leaves).
bool Verbose() {
  static const bool v = [] {
    const char* e = std::getenv("KILN_OP_TABLE_VERBOSE");
    return e != nullptr && e[0] != '\0' && e[0] != '0';
  }();
  return v;
}

struct Tolerance {
  double rtol = 0;  // relative to |expected|
  double atol = 0;  // relative to the rms of the expected tensor (cancellation in sums)
  bool exact = false;
};

bool IsExactDType(DType t) { return !IsFloating(t) || IsStorageOnly(t); }

// Forward tolerance of `c` for an output of dtype `out`: |got - want| <= rtol |want| + atol rms.
// f32: 1e-5 times sqrt(reduction) (the backends sum in different orders); bf16: 1e-2, about one
// bf16 ulp (both sides round nearly equal f32 values), growing only past 16 summed terms.
Tolerance ForwardTolerance(const OpCase& c, DType out) {
  Tolerance t;
  if (c.exact || IsExactDType(out)) {
    t.exact = true;
    return t;
  }
  double growth = std::sqrt(static_cast<double>(std::max<int64_t>(c.reduction, 1)));
  double base = out == DType::kBF16 ? 1e-2 : out == DType::kF16 ? 2e-3 : 1e-5;
  t.rtol = base * std::max(1.0, out == DType::kF32 ? growth : growth / 4);
  t.atol = t.rtol;
  return t;
}

std::string Describe(const Tensor& t, int64_t i) {
  std::vector<int64_t> idx(t.shape().rank());
  int64_t r = i;
  for (int d = t.shape().rank() - 1; d >= 0; --d) {
    idx[d] = r % t.shape().dim(d);
    r /= t.shape().dim(d);
  }
  std::string s = "[";
  for (size_t d = 0; d < idx.size(); ++d) s += (d ? "," : "") + std::to_string(idx[d]);
  return s + "]";
}

// Expected vs actual, elementwise; names the worst element and counts failures.
::testing::AssertionResult Close(const Tensor& want, const Tensor& got, const Tolerance& tol,
                                 const std::string& what) {
  if (want.dtype() != got.dtype() || want.shape() != got.shape()) {
    return ::testing::AssertionFailure()
           << what << ": type " << got.TypeString() << ", expected " << want.TypeString();
  }
  const int64_t n = want.num_elements();
  if (tol.exact) {
    int64_t bad = 0, first = -1;
    const int64_t size = DTypeSize(want.dtype());
    const auto* a = static_cast<const uint8_t*>(want.raw_data());
    const auto* b = static_cast<const uint8_t*>(got.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      if (std::memcmp(a + i * size, b + i * size, size) != 0) {
        if (first < 0) first = i;
        ++bad;
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": " << bad << " of " << n << " elements differ (bitwise); first at "
           << Describe(want, first) << ": got " << got.GetDouble(first) << ", expected "
           << want.GetDouble(first);
  }
  double sum_sq = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    double w = want.GetDouble(i);
    if (std::isfinite(w)) {
      sum_sq += w * w;
      ++finite;
    }
  }
  const double rms = finite ? std::sqrt(sum_sq / finite) : 0.0;
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (int64_t i = 0; i < n; ++i) {
    double w = want.GetDouble(i), g = got.GetDouble(i);
    double ratio;
    if (!std::isfinite(w) || !std::isfinite(g)) {
      bool same = (std::isnan(w) && std::isnan(g)) || w == g;
      ratio = same ? 0.0 : INFINITY;
    } else {
      double bound = tol.rtol * std::abs(w) + tol.atol * rms;
      double err = std::abs(g - w);
      ratio = err == 0 ? 0.0 : bound == 0 ? INFINITY : err / bound;
    }
    if (ratio > 1) ++bad;
    if (ratio > worst_ratio || worst < 0) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (Verbose()) {
    printf("  %-40s worst error/tolerance %.3g at %s\n", what.c_str(), worst_ratio,
           worst >= 0 ? Describe(want, worst).c_str() : "-");
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  double w = want.GetDouble(worst), g = got.GetDouble(worst);
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << n << " elements out of tolerance (rtol " << tol.rtol
         << ", atol " << tol.atol << " x rms " << rms << "); worst at " << Describe(want, worst)
         << ": got " << g << ", expected " << w << ", |diff| " << std::abs(g - w) << " ("
         << (std::abs(w) > 0 ? std::abs(g - w) / std::abs(w) : INFINITY) << " relative)";
}

// ---------------------------------------------------------------------------------------------
// Parameters.

struct RowParam {
  const OpCase* c;
  DType dt;
};

std::string ParamName(const ::testing::TestParamInfo<RowParam>& info) {
  return info.param.c->name + "_" + std::string(DTypeName(info.param.dt));
}

std::vector<RowParam> ForwardParams() {
  std::vector<RowParam> out;
  for (const OpCase& c : AllOpCases())
    for (DType dt : c.dtypes) out.push_back({&c, dt});
  return out;
}

// The operands a gradient is taken for: those with the row's (floating) dtype.
std::vector<std::string> DiffOperands(const OpCase& c) {
  std::vector<std::string> names;
  for (const Operand& o : c.operands)
    if (!o.dtype.has_value()) names.push_back(o.name);
  return names;
}

std::vector<RowParam> GradientParams() {
  std::vector<RowParam> out;
  for (const OpCase& c : AllOpCases())
    if (c.differentiable && !DiffOperands(c).empty()) out.push_back({&c, DType::kF32});
  return out;
}

absl::StatusOr<ir::Graph> Decomposed(const ir::Graph& g) {
  absl::StatusOr<ir::Graph> d = compiler::DecomposeComposites(g);
  if (!d.ok()) return d.status();
  for (const ir::Node& n : d->nodes()) {
    if (ir::IsComposite(n.opcode())) {
      return absl::InternalError("DecomposeComposites left a " +
                                 std::string(ir::OpcodeName(n.opcode())) + " node (%" +
                                 std::to_string(n.id()) + ")");
    }
  }
  absl::Status v = ir::Verify(*d);
  if (!v.ok()) return absl::InternalError("decomposed graph fails Verify: " + v.ToString());
  return d;
}

// ---------------------------------------------------------------------------------------------
// (a) Forward: reference vs cpu.

class OpForward : public ::testing::TestWithParam<RowParam> {};

TEST_P(OpForward, Check) {
  const OpCase& c = *GetParam().c;
  const DType dt = GetParam().dt;
  ASSERT_OK_AND_ASSIGN(ir::Graph g, BuildCaseGraph(c, dt, /*with_loss=*/false));
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  std::vector<Tensor> inputs = MakeInputs(c, dt);
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> want, CompileAndRun(Reference(), g, inputs));
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> got, CompileAndRun(Cpu(), g, inputs));
  ASSERT_EQ(want.size(), 1u);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> loops, CompileAndRun(CpuLoops(), g, inputs));
  const Tolerance tol = ForwardTolerance(c, want[0].dtype());
  EXPECT_TRUE(Close(want[0], got[0], tol, "cpu vs reference"));
  EXPECT_TRUE(Close(want[0], loops[0], tol, "cpu(prefer_loops) vs reference"));
  if (c.check) {
    {
      SCOPED_TRACE("definition check of the reference output");
      c.check(inputs, want[0]);
    }
    {
      SCOPED_TRACE("definition check of the cpu output");
      c.check(inputs, got[0]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, OpForward, ::testing::ValuesIn(ForwardParams()), ParamName);

// ---------------------------------------------------------------------------------------------
// (c) Composites decomposed.

class OpDecomposed : public ::testing::TestWithParam<RowParam> {};

TEST_P(OpDecomposed, Check) {
  const OpCase& c = *GetParam().c;
  const DType dt = GetParam().dt;
  ASSERT_OK_AND_ASSIGN(ir::Graph g, BuildCaseGraph(c, dt, /*with_loss=*/false));
  ASSERT_OK_AND_ASSIGN(ir::Graph d, Decomposed(g));
  std::vector<Tensor> inputs = MakeInputs(c, dt);
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> want, CompileAndRun(Reference(), g, inputs));
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> ref_d, CompileAndRun(Reference(), d, inputs));
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> cpu_d, CompileAndRun(Cpu(), d, inputs));
  const Tolerance tol = ForwardTolerance(c, want[0].dtype());
  EXPECT_TRUE(Close(want[0], ref_d[0], tol, "reference(decomposed) vs reference"));
  EXPECT_TRUE(Close(want[0], cpu_d[0], tol, "cpu(decomposed) vs reference"));
}

INSTANTIATE_TEST_SUITE_P(OpTable, OpDecomposed, ::testing::ValuesIn(ForwardParams()), ParamName);

// ---------------------------------------------------------------------------------------------
// (b) Gradients.

class OpGradient : public ::testing::TestWithParam<RowParam> {};

// Inputs of the loss graph: the row's operands, then the cotangent.
std::vector<Tensor> LossInputs(const OpCase& c, DType dt, const ir::Graph& g) {
  std::vector<Tensor> inputs = MakeInputs(c, dt);
  const ir::Type& cot_type = g.node(g.parameters().back()).type();
  std::mt19937_64 rng(HashName(c.name + "/cotangent"));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(cot_type.shape.num_elements());
  for (double& x : v) x = u(rng);
  inputs.push_back(Tensor::FromDoubles(cot_type.dtype, cot_type.shape, v));
  return inputs;
}

// The gradient outputs of a Grad graph run, by parameter name.
std::map<std::string, Tensor> GradOutputs(const ir::Graph& g, const std::vector<Tensor>& outs,
                                          const std::vector<std::string>& wrt) {
  std::map<std::string, Tensor> m;
  for (const std::string& name : wrt) {
    int i = g.FindOutput("grad/" + name);
    if (i >= 0) m[name] = outs[i];
  }
  return m;
}

// The elements a finite-difference check perturbs: all of a small operand, a fixed random sample
// of a large one (two loss evaluations per element).
constexpr int64_t kMaxFdElements = 128;
std::vector<int64_t> FdSample(int64_t n, uint64_t seed) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), int64_t{0});
  if (n <= kMaxFdElements) return idx;
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(kMaxFdElements);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST_P(OpGradient, Check) {
  const OpCase& c = *GetParam().c;
  const std::vector<std::string> wrt = DiffOperands(c);

  // cpu vs reference in f32, plain and decomposed.
  {
    ASSERT_OK_AND_ASSIGN(ir::Graph f, BuildCaseGraph(c, DType::kF32, /*with_loss=*/true));
    ASSERT_OK_AND_ASSIGN(ir::Graph g, autodiff::Grad(f, wrt, "loss"));
    ASSERT_TRUE(ir::Verify(g).ok()) << "Grad output fails Verify: " << ir::Verify(g);
    std::vector<Tensor> inputs = LossInputs(c, DType::kF32, f);
    ASSERT_OK_AND_ASSIGN(std::vector<Tensor> want_outs, CompileAndRun(Reference(), g, inputs));
    ASSERT_OK_AND_ASSIGN(std::vector<Tensor> got_outs, CompileAndRun(Cpu(), g, inputs));
    ASSERT_OK_AND_ASSIGN(ir::Graph d, Decomposed(g));
    ASSERT_OK_AND_ASSIGN(std::vector<Tensor> dec_outs, CompileAndRun(Cpu(), d, inputs));
    auto want = GradOutputs(g, want_outs, wrt), got = GradOutputs(g, got_outs, wrt),
         dec = GradOutputs(d, dec_outs, wrt);
    Tolerance tol;
    // A VJP is about as deep as the op and sums over broadcast and reduced dims.
    tol.rtol = tol.atol =
        1e-5 * std::max(4.0, std::sqrt(static_cast<double>(std::max<int64_t>(c.reduction, 1))) * 4);
    for (const std::string& name : wrt) {
      ASSERT_EQ(want.count(name), 1u) << "no output grad/" << name;
      ASSERT_EQ(dec.count(name), 1u) << "decomposed: no output grad/" << name;
      EXPECT_TRUE(Close(want[name], got[name], tol, "f32 grad/" + name + " cpu vs reference"));
      EXPECT_TRUE(
          Close(want[name], dec[name], tol, "f32 grad/" + name + " cpu(decomposed) vs reference"));
    }
  }

  // Reference in f64 vs central finite differences of the loss in f64.
  ASSERT_OK_AND_ASSIGN(ir::Graph f, BuildCaseGraph(c, DType::kF64, /*with_loss=*/true));
  ASSERT_OK_AND_ASSIGN(ir::Graph g, autodiff::Grad(f, wrt, "loss"));
  std::vector<Tensor> inputs = LossInputs(c, DType::kF64, f);
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> outs, CompileAndRun(Reference(), g, inputs));
  std::map<std::string, Tensor> grads = GradOutputs(g, outs, wrt);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Executable> loss_exe, Reference().Compile(f));
  const int loss_index = f.FindOutput("loss");
  ASSERT_GE(loss_index, 0);
  auto loss_at = [&](const std::vector<Tensor>& in) -> double {
    absl::StatusOr<std::vector<Tensor>> r = loss_exe->Run(in);
    if (!r.ok()) {
      ADD_FAILURE() << "f64 loss run: " << r.status();
      return NAN;
    }
    return (*r)[loss_index].GetDouble(0);
  };
  for (size_t p = 0; p < c.operands.size(); ++p) {
    const std::string& name = c.operands[p].name;
    if (c.operands[p].dtype.has_value()) continue;
    ASSERT_EQ(grads.count(name), 1u) << "no output grad/" << name;
    const Tensor& grad = grads[name];
    ASSERT_EQ(grad.dtype(), DType::kF64) << "grad/" << name;
    // Elements not sampled keep the analytic value, so they compare equal.
    Tensor fd = grad.Clone();
    std::vector<Tensor> perturbed = inputs;
    perturbed[p] = inputs[p].Clone();
    bool all_zero = true;
    for (int64_t i : FdSample(fd.num_elements(), HashName(c.name + "/" + name))) {
      const double x = inputs[p].GetDouble(i);
      const double eps = 1e-6 * std::max(1.0, std::abs(x));
      perturbed[p].SetDouble(i, x + eps);
      double lp = loss_at(perturbed);
      perturbed[p].SetDouble(i, x - eps);
      double lm = loss_at(perturbed);
      perturbed[p].SetDouble(i, x);
      fd.SetDouble(i, (lp - lm) / (2 * eps));
      all_zero &= std::abs(fd.GetDouble(i)) < 1e-9;
    }
    Tolerance tol;
    tol.rtol = 1e-6;
    tol.atol = 1e-6;
    // Absolute floor for all-zero gradients (sign, a parameter the loss ignores).
    if (all_zero) {
      for (int64_t i = 0; i < grad.num_elements(); ++i)
        EXPECT_LT(std::abs(grad.GetDouble(i)), 1e-9) << "grad/" << name << Describe(grad, i);
      continue;
    }
    EXPECT_TRUE(Close(fd, grad, tol, "f64 grad/" + name + " vs finite differences"));
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, OpGradient, ::testing::ValuesIn(GradientParams()), ParamName);

// ---------------------------------------------------------------------------------------------
// Coverage and table hygiene.

TEST(OpTableCoverage, EveryOpcodeHasARow) {
  std::vector<int> rows(ir::kNumOpcodes, 0);
  for (const OpCase& c : AllOpCases()) ++rows[static_cast<int>(c.opcode)];
  std::string missing;
  for (int i = 0; i < ir::kNumOpcodes; ++i)
    if (rows[i] == 0) missing += " " + std::string(ir::OpcodeName(static_cast<ir::Opcode>(i)));
  EXPECT_TRUE(missing.empty()) << "opcodes without an op-table row:" << missing;
}

TEST(OpTableCoverage, EveryCompositeAndDifferentiableOpHasAGradientRow) {
  std::vector<int> grad_rows(ir::kNumOpcodes, 0);
  for (const RowParam& p : GradientParams()) ++grad_rows[static_cast<int>(p.c->opcode)];
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    auto op = static_cast<ir::Opcode>(i);
    ir::OpKind kind = ir::OpcodeKind(op);
    if (kind == ir::OpKind::kComposite || kind == ir::OpKind::kContraction) {
      EXPECT_GT(grad_rows[i], 0) << ir::OpcodeName(op) << " has no gradient row";
    }
  }
}

TEST(OpTableCoverage, NamesAreUniqueAndWellFormed) {
  std::map<std::string, int> seen;
  for (const OpCase& c : AllOpCases()) {
    EXPECT_EQ(++seen[c.name], 1) << "duplicate row name " << c.name;
    EXPECT_EQ(c.name.rfind(std::string(ir::OpcodeName(c.opcode)), 0), 0u)
        << c.name << " does not start with its op name " << ir::OpcodeName(c.opcode);
    for (char ch : c.name) EXPECT_TRUE(std::isalnum(ch) || ch == '_') << c.name;
    EXPECT_FALSE(c.dtypes.empty()) << c.name;
  }
}

TEST(OpTableCoverage, EveryRowBuildsAndContainsItsOp) {
  for (const OpCase& c : AllOpCases()) {
    for (DType dt : c.dtypes) {
      absl::StatusOr<ir::Graph> g = BuildCaseGraph(c, dt, false);
      ASSERT_TRUE(g.ok()) << c.name << " " << DTypeName(dt) << ": " << g.status();
      bool found = false;
      for (const ir::Node& n : g->nodes()) found |= n.opcode() == c.opcode;
      EXPECT_TRUE(found) << c.name << " " << DTypeName(dt) << " has no " << ir::OpcodeName(c.opcode)
                         << " node";
    }
  }
}

// random_bits is stateless: the same (seed, counter) gives the same bits on both backends and a
// different counter or seed gives different bits.
TEST(OpTableRandomBits, SeedAndCounterSelectTheStream) {
  const OpCase* row = nullptr;
  for (const OpCase& c : AllOpCases())
    if (c.name == "random_bits_3x17") row = &c;
  ASSERT_NE(row, nullptr);
  ASSERT_OK_AND_ASSIGN(ir::Graph g, BuildCaseGraph(*row, DType::kS32, false));
  auto run = [&](int64_t seed, int64_t counter) {
    std::vector<Tensor> in = {Tensor::FromVector<int64_t>(Shape{}, {seed}),
                              Tensor::FromVector<int64_t>(Shape{}, {counter})};
    absl::StatusOr<std::vector<Tensor>> r = CompileAndRun(Reference(), g, in);
    absl::StatusOr<std::vector<Tensor>> c = CompileAndRun(Cpu(), g, in);
    EXPECT_TRUE(r.ok() && c.ok());
    if (!r.ok() || !c.ok()) return Tensor();
    EXPECT_TRUE((*r)[0].BitwiseEquals((*c)[0])) << "seed " << seed << " counter " << counter;
    return (*r)[0];
  };
  Tensor a = run(7, 0), b = run(7, 0), c = run(7, 1), d = run(8, 0);
  EXPECT_TRUE(a.BitwiseEquals(b));
  EXPECT_FALSE(a.BitwiseEquals(c));
  EXPECT_FALSE(a.BitwiseEquals(d));
}

}  // namespace
}  // namespace kiln::optable
