// Unit-level check of the cpu backend: every op against the reference backend on a few shapes
// (odd sizes, broadcasting, parallel-sized), in f32 and bf16 (plus integer/bool dtypes where the
// op takes them), through both the default lowering (oneDNN where it applies) and the loops
// (CpuBackendOptions::prefer_loops). The full op-consistency table lives in tests/.
#include "kiln/runtime/cpu/cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/parser.h"
#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/cpu/isa.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::runtime {
namespace {

using ir::Builder;
using ir::Value;

// How to draw one input.
struct In {
  Shape shape;
  double lo = -2, hi = 2;
  std::optional<DType> dtype;  // fixed dtype (indices, predicates); else the case's dtype
  enum Kind { kUniform, kInt, kBool, kGrid } kind = kUniform;
};
In U(Shape s, double lo = -2, double hi = 2) { return In{std::move(s), lo, hi}; }
In Ints(Shape s, int64_t lo, int64_t hi, DType t = DType::kS32) {
  return In{std::move(s), double(lo), double(hi), t, In::kInt};
}
In Bools(Shape s) { return In{std::move(s), 0, 1, DType::kBool, In::kBool}; }
// Values on a coarse grid (ties on purpose: max, argmax, pooling, compare).
In Grid(Shape s) { return In{std::move(s), -2, 2, std::nullopt, In::kGrid}; }

using BuildFn = std::function<Value(Builder&, const std::vector<Value>&)>;

Tensor Draw(const In& in, DType dt, std::mt19937& rng) {
  DType t = in.dtype.value_or(dt);
  std::vector<double> v(in.shape.num_elements());
  for (double& x : v) {
    switch (in.kind) {
      case In::kUniform:
        x = std::uniform_real_distribution<double>(in.lo, in.hi)(rng);
        break;
      case In::kInt:
        x = double(std::uniform_int_distribution<int64_t>(int64_t(in.lo), int64_t(in.hi))(rng));
        break;
      case In::kBool:
        x = rng() % 2;
        break;
      case In::kGrid:
        x = double(int(rng() % 9) - 4) * 0.5;
        break;
    }
    if (in.kind == In::kUniform && !IsFloating(t)) x = std::round(4 * x);
  }
  return Tensor::FromDoubles(t, in.shape, v);
}

struct Tol {
  double f32 = 1e-5;
  double bf16 = 1e-2;
};

// Compares got against want: floats within atol + rtol * |want| (atol scaled by the output's
// magnitude), NaN matching NaN; integers and bool exactly.
void ExpectClose(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.TypeString(), want.TypeString()) << what;
  std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  double scale = 1;
  for (double x : w)
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 5; ++i) {
    bool ok;
    if (!IsFloating(want.dtype()))
      ok = g[i] == w[i];
    else if (std::isnan(w[i]))
      ok = std::isnan(g[i]);
    else if (std::isinf(w[i]))
      ok = g[i] == w[i];
    else
      ok = std::fabs(g[i] - w[i]) <= rtol * scale + rtol * std::fabs(w[i]);
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " got " << g[i] << " want " << w[i];
    }
  }
}

// Builds the op for each dtype, runs it on the reference backend and the cpu backend (default
// and loops-only), and compares every output.
void Check(const std::string& name, const std::vector<In>& ins, const BuildFn& build,
           std::vector<DType> dtypes = {DType::kF32, DType::kBF16}, Tol tol = {}) {
  for (DType dt : dtypes) {
    std::string what = name + " " + std::string(DTypeName(dt));
    SCOPED_TRACE(what);
    Builder b(name);
    std::vector<Value> params;
    for (size_t i = 0; i < ins.size(); ++i)
      params.push_back(
          b.Parameter("p" + std::to_string(i), ins[i].dtype.value_or(dt), ins[i].shape));
    b.Output("y", build(b, params));
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    std::mt19937 rng(1234);
    std::vector<Tensor> inputs;
    for (const In& in : ins) inputs.push_back(Draw(in, dt, rng));

    auto ref_exe = MakeReferenceBackend()->Compile(*g);
    ASSERT_TRUE(ref_exe.ok()) << ref_exe.status();
    auto want = (*ref_exe)->Run(inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    double rtol = dt == DType::kF32 ? tol.f32 : dt == DType::kBF16 ? tol.bf16 : 1e-3;
    for (bool loops : {false, true}) {
      auto exe = MakeCpuBackend({.prefer_loops = loops})->Compile(*g);
      ASSERT_TRUE(exe.ok()) << exe.status();
      auto got = (*exe)->Run(inputs);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), want->size());
      for (size_t i = 0; i < got->size(); ++i)
        ExpectClose((*got)[i], (*want)[i], rtol, what + (loops ? " (loops)" : " (default)"));
    }
  }
}

const std::vector<DType> kFloats = {DType::kF32, DType::kBF16};
const std::vector<DType> kAllFloats = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64};

// ---- Elementwise ----

TEST(CpuBackendTest, UnaryOps) {
  using F = Value (*)(Value);
  struct UnaryCase {
    const char* name;
    F f;
    double lo, hi;
  };
  for (const UnaryCase& u : std::vector<UnaryCase>{{"abs", ir::Abs, -2, 2},
                                                   {"cos", ir::Cos, -3, 3},
                                                   {"erf", ir::Erf, -2, 2},
                                                   {"exp", ir::Exp, -3, 3},
                                                   {"log", ir::Log, 0.1, 4},
                                                   {"neg", ir::Neg, -2, 2},
                                                   {"relu", ir::Relu, -2, 2},
                                                   {"rsqrt", ir::Rsqrt, 0.1, 4},
                                                   {"sigmoid", ir::Sigmoid, -4, 4},
                                                   {"sign", ir::Sign, -2, 2},
                                                   {"silu", ir::Silu, -4, 4},
                                                   {"sin", ir::Sin, -3, 3},
                                                   {"sqrt", ir::Sqrt, 0.1, 4},
                                                   {"tanh", ir::Tanh, -3, 3}}) {
    Check(
        u.name, {U({7, 13}, u.lo, u.hi)}, [&](Builder&, auto& p) { return u.f(p[0]); }, kAllFloats);
    Check(u.name, {U({2, 20001}, u.lo, u.hi)}, [&](Builder&, auto& p) { return u.f(p[0]); });
  }
  for (bool tanh : {false, true})
    Check(
        tanh ? "gelu_tanh" : "gelu", {U({5, 37}, -4, 4)},
        [&](Builder&, auto& p) { return ir::Gelu(p[0], tanh); }, kAllFloats);
  // Integer unary ops.
  for (auto f : {ir::Abs, ir::Neg, ir::Sign, ir::Relu})
    Check("int unary", {U({9, 11})}, [&](Builder&, auto& p) { return f(p[0]); },
          {DType::kS32, DType::kS8, DType::kS64});
}

TEST(CpuBackendTest, BinaryOpsWithBroadcasting) {
  using F = Value (*)(Value, Value);
  struct BinaryCase {
    const char* name;
    F f;
    double lo, hi;
  };
  for (const BinaryCase& op : std::vector<BinaryCase>{{"add", ir::Add, -2, 2},
                                                      {"sub", ir::Sub, -2, 2},
                                                      {"mul", ir::Mul, -2, 2},
                                                      {"div", ir::Div, 0.5, 3},
                                                      {"max", ir::Max, -2, 2},
                                                      {"min", ir::Min, -2, 2},
                                                      {"pow", ir::Pow, 0.2, 2}}) {
    Check(
        op.name, {U({3, 1, 33}, op.lo, op.hi), U({4, 33}, op.lo, op.hi)},
        [&](Builder&, auto& p) { return op.f(p[0], p[1]); }, kAllFloats);
    Check(op.name, {U({2, 50000}, op.lo, op.hi), U({2, 50000}, op.lo, op.hi)},
          [&](Builder&, auto& p) { return op.f(p[0], p[1]); });
    // Integers: small values, zeros included (x / 0 = -1).
    Check(op.name, {Ints({6, 7}, -5, 5, DType::kS32), Ints({6, 7}, -3, 3, DType::kS32)},
          [&](Builder&, auto& p) { return op.f(p[0], p[1]); }, {DType::kS32});
  }
  Check("max_ties", {Grid({5, 9}), Grid({5, 9})},
        [](Builder&, auto& p) { return ir::Max(p[0], p[1]); });
}

TEST(CpuBackendTest, CompareSelectLogical) {
  for (auto dir :
       {ir::CompareDirection::kEq, ir::CompareDirection::kNe, ir::CompareDirection::kLt,
        ir::CompareDirection::kLe, ir::CompareDirection::kGt, ir::CompareDirection::kGe}) {
    Check("compare", {Grid({6, 11}), Grid({6, 11})},
          [&](Builder&, auto& p) { return ir::Compare(p[0], p[1], dir); },
          {DType::kF32, DType::kBF16, DType::kS32, DType::kF64});
  }
  Check("select", {Bools({5, 17}), U({5, 17}), U({1, 17})},
        [](Builder&, auto& p) { return ir::Select(p[0], p[1], p[2]); },
        {DType::kF32, DType::kBF16, DType::kS32, DType::kS64, DType::kS8});
  Check("logical_and", {Bools({70001}), Bools({70001})},
        [](Builder&, auto& p) { return ir::LogicalAnd(p[0], p[1]); });
  Check("logical_or", {Bools({7, 3}), Bools({7, 3})},
        [](Builder&, auto& p) { return ir::LogicalOr(p[0], p[1]); });
  Check("logical_not", {Bools({7, 3})}, [](Builder&, auto& p) { return ir::LogicalNot(p[0]); });
  Check("logical_int", {Ints({7, 3}, -2, 2), Ints({7, 3}, -2, 2)},
        [](Builder&, auto& p) { return ir::LogicalOr(p[0], ir::LogicalNot(p[1])); });
}

TEST(CpuBackendTest, Convert) {
  struct ConvertCase {
    DType from, to;
    double lo, hi;
  };
  for (const ConvertCase& c : std::vector<ConvertCase>{{DType::kF32, DType::kBF16, -3, 3},
                                                       {DType::kBF16, DType::kF32, -3, 3},
                                                       {DType::kF32, DType::kF16, -3, 3},
                                                       {DType::kF16, DType::kBF16, -3, 3},
                                                       {DType::kF32, DType::kS32, -300, 300},
                                                       {DType::kF32, DType::kU8, -300, 300},
                                                       {DType::kBF16, DType::kS8, -300, 300},
                                                       {DType::kS32, DType::kF32, -300, 300},
                                                       {DType::kS32, DType::kBF16, -300, 300},
                                                       {DType::kS32, DType::kS8, -300, 300},
                                                       {DType::kS64, DType::kF32, -300, 300},
                                                       {DType::kU8, DType::kF32, 0, 60},
                                                       {DType::kF32, DType::kBool, -1, 1},
                                                       {DType::kBool, DType::kF32, 0, 1},
                                                       {DType::kF64, DType::kBF16, -3, 3},
                                                       {DType::kF32, DType::kF8E4M3, -3, 3}}) {
    In in = U({5, 13}, c.lo, c.hi);
    in.dtype = c.from;
    if (c.from == DType::kBool) in = Bools({5, 13});
    if (!IsFloating(c.from) && c.from != DType::kBool) in.kind = In::kInt;
    DType to = c.to;
    Check("convert " + std::string(DTypeName(c.from)) + "->" + std::string(DTypeName(to)), {in},
          [to](Builder&, auto& p) { return ir::Convert(p[0], to); }, {DType::kF32});
  }
}

// ---- Data movement ----

TEST(CpuBackendTest, Structural) {
  Check("transpose2d", {U({67, 130})}, [](Builder&, auto& p) {
    return ir::Transpose(p[0], {1, 0});
  });
  Check("transpose3d", {U({3, 5, 7})},
        [](Builder&, auto& p) {
          return ir::Transpose(p[0], {2, 0, 1});
        },
        {DType::kF32, DType::kBF16, DType::kS64, DType::kS8});
  Check("transpose4d", {U({2, 33, 3, 40})}, [](Builder&, auto& p) {
    return ir::Transpose(p[0], {0, 2, 3, 1});
  });
  Check("broadcast_in_dim", {U({3, 1, 5})}, [](Builder&, auto& p) {
    return ir::BroadcastInDim(p[0], Shape{2, 3, 4, 5}, {1, 2, 3});
  });
  Check("broadcast_scalar", {U({})}, [](Builder&, auto& p) {
    return ir::BroadcastInDim(p[0], Shape{3, 70000}, {});
  });
  Check("reshape", {U({6, 35})}, [](Builder&, auto& p) {
    return ir::Reshape(p[0], Shape{5, 7, 6});
  });
  Check("slice", {U({9, 20, 5})}, [](Builder&, auto& p) {
    return ir::Slice(p[0], {1, 2, 0}, {8, 19, 5}, {3, 4, 1});
  });
  Check("concatenate", {U({2, 3, 4}), U({2, 5, 4}), U({2, 1, 4})},
        [](Builder&, auto& p) {
          return ir::Concatenate({p[0], p[1], p[2]}, 1);
        },
        {DType::kF32, DType::kBF16, DType::kS32});
  Check("pad", {U({3, 4})},
        [](Builder&, auto& p) {
          return ir::Pad(p[0], {1, 0}, {2, 3}, {1, 2}, 1.5);
        },
        {DType::kF32, DType::kBF16, DType::kS32});
  Check("gather", {U({11, 6}), Ints({4, 3}, -2, 13)},
        [](Builder&, auto& p) { return ir::Gather(p[0], p[1], 0); });
  Check("gather_axis1", {U({3, 11, 2}), Ints({5}, 0, 10, DType::kS64)},
        [](Builder&, auto& p) { return ir::Gather(p[0], p[1], 1); });
  Check("scatter_add", {U({10, 7}), Ints({6}, -1, 10), U({6, 7})},
        [](Builder&, auto& p) { return ir::ScatterAdd(p[0], p[1], p[2], 0); },
        {DType::kF32, DType::kBF16, DType::kS32});
  // The operand is an intermediate that dies here: the kernel scatters over it in place.
  Check("scatter_add_over_dying_operand", {U({10, 7}), Ints({6}, -1, 10), U({6, 7})},
        [](Builder&, auto& p) { return ir::ScatterAdd(-p[0], p[1], p[2], 0); },
        {DType::kF32, DType::kBF16});
  Check("scatter_add_axis1", {U({2, 10, 3}), Ints({4}, 0, 3), U({2, 4, 3})},
        [](Builder&, auto& p) { return ir::ScatterAdd(p[0], p[1], p[2], 1); });
  Check("iota", {U({2})},
        [](Builder& b, auto& p) {
          Value i = b.Iota(p[0].dtype(), Shape{4, 300}, 1);
          return i + ir::BroadcastInDim(ir::ReduceSum(p[0], {0}), Shape{4, 300}, {});
        },
        {DType::kF32, DType::kBF16, DType::kS32});
}

// ---- Reductions ----

TEST(CpuBackendTest, Reductions) {
  using F = Value (*)(Value, std::vector<int64_t>);
  for (F f : {F(ir::ReduceSum), F(ir::ReduceMax), F(ir::ReduceMin)}) {
    for (std::vector<int64_t> dims :
         std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}}) {
      Check("reduce", {U({5, 7, 9})}, [&](Builder&, auto& p) { return f(p[0], dims); },
            {DType::kF32, DType::kBF16, DType::kS32, DType::kF64});
    }
    Check("reduce_big_rows", {U({3, 100001})}, [&](Builder&, auto& p) { return f(p[0], {1}); },
          kFloats, {1e-5, 2e-2});
    Check("reduce_big_cols", {U({2001, 67})}, [&](Builder&, auto& p) { return f(p[0], {0}); },
          kFloats, {1e-5, 2e-2});
    Check("reduce_all", {U({200003})}, [&](Builder&, auto& p) { return f(p[0], {0}); }, kFloats,
          {1e-5, 2e-2});
    Check("reduce_empty", {U({3, 0})}, [&](Builder&, auto& p) { return f(p[0], {1}); });
  }
  for (int axis : {0, 1, 2})
    Check("argmax", {Grid({4, 6, 5})}, [&](Builder&, auto& p) { return ir::ArgMax(p[0], axis); },
          {DType::kF32, DType::kBF16, DType::kS32});
}

// ---- Contractions ----

TEST(CpuBackendTest, DotGeneral) {
  Tol tol{1e-5, 1e-2};
  Check(
      "matmul", {U({17, 33}), U({33, 9})}, [](Builder&, auto& p) { return ir::MatMul(p[0], p[1]); },
      kAllFloats, tol);
  Check(
      "matmul_rank3_x_rank2", {U({2, 5, 8}), U({8, 3})},
      [](Builder&, auto& p) { return ir::MatMul(p[0], p[1]); }, kFloats, tol);
  Check(
      "batched", {U({3, 7, 5}), U({3, 5, 4})},
      [](Builder&, auto& p) { return ir::MatMul(p[0], p[1]); }, kFloats, tol);
  // rhs transposed: contract rhs dim 1.
  Check(
      "nt", {U({6, 10}), U({12, 10})},
      [](Builder&, auto& p) {
        return ir::DotGeneral(p[0], p[1], {{}, {}, {1}, {1}});
      },
      kFloats, tol);
  // lhs transposed: contract lhs dim 0.
  Check(
      "tn", {U({10, 6}), U({10, 12})},
      [](Builder&, auto& p) {
        return ir::DotGeneral(p[0], p[1], {{}, {}, {0}, {0}});
      },
      kFloats, tol);
  // Batch dim in the middle of lhs, last of rhs; two contracting dims in swapped order.
  Check(
      "odd_layout", {U({4, 3, 5, 2}), U({2, 5, 6, 3})},
      [](Builder&, auto& p) {
        return ir::DotGeneral(p[0], p[1], {{1}, {3}, {3, 2}, {0, 1}});
      },
      kFloats, tol);
  // Attention-like [B, H, S, D] x [B, H, S, D] -> [B, H, S, S].
  Check(
      "bhsd", {U({2, 3, 9, 8}), U({2, 3, 11, 8})},
      [](Builder&, auto& p) {
        return ir::DotGeneral(p[0], p[1], {{0, 1}, {0, 1}, {3}, {3}});
      },
      kFloats, tol);
  Check(
      "matvec", {U({7, 19}), U({19})}, [](Builder&, auto& p) { return ir::MatMul(p[0], p[1]); },
      kFloats, tol);
  Check("int_matmul", {U({5, 6}), U({6, 4})},
        [](Builder&, auto& p) { return ir::MatMul(p[0], p[1]); }, {DType::kS32, DType::kS64});
  Check("big", {U({96, 257}), U({257, 130})},
        [](Builder&, auto& p) { return ir::MatMul(p[0], p[1]); }, kFloats, {2e-5, 1e-2});
}

TEST(CpuBackendTest, Convolutions) {
  Tol tol{2e-5, 1e-2};
  ir::Conv2dOptions o;
  o.strides = {2, 1};
  o.padding = {1, 0, 2, 1};
  o.dilation = {1, 2};
  for (int64_t groups : {1, 2}) {
    o.groups = groups;
    Check(
        "conv2d", {U({2, 4, 9, 11}), U({6, 4 / groups, 3, 3})},
        [&](Builder&, auto& p) { return ir::Conv2d(p[0], p[1], o); }, kFloats, tol);
    Shape out{2, 6, 4, 10};
    Check(
        "conv2d_backward_input", {U(out), U({6, 4 / groups, 3, 3})},
        [&](Builder&, auto& p) {
          return ir::Conv2dBackwardInput(p[0], p[1], Shape{2, 4, 9, 11}, o);
        },
        kFloats, tol);
    Check(
        "conv2d_backward_filter", {U({2, 4, 9, 11}), U(out)},
        [&](Builder&, auto& p) {
          return ir::Conv2dBackwardFilter(p[0], p[1], Shape{6, 4 / groups, 3, 3}, o);
        },
        kFloats, tol);
  }
  Check(
      "conv2d_1x1", {U({3, 16, 7, 7}), U({32, 16, 1, 1})},
      [](Builder&, auto& p) { return ir::Conv2d(p[0], p[1]); }, kFloats, tol);
}

TEST(CpuBackendTest, Pooling) {
  ir::Pool2dOptions o;
  o.window = {3, 2};
  o.strides = {2, 2};
  o.padding = {1, 1, 0, 1};
  Shape in{2, 3, 9, 8};
  Check("max_pool2d", {Grid(in)}, [&](Builder&, auto& p) { return ir::MaxPool2d(p[0], o); });
  Check(
      "max_pool2d_grad", {Grid(in), U({2, 3, 5, 4})},
      [&](Builder&, auto& p) { return ir::MaxPool2dGrad(p[0], p[1], o); }, kAllFloats);
  for (bool include : {false, true}) {
    o.count_include_pad = include;
    Check("avg_pool2d", {U(in)}, [&](Builder&, auto& p) { return ir::AvgPool2d(p[0], o); });
    Check(
        "avg_pool2d_grad", {U({2, 3, 5, 4})},
        [&](Builder&, auto& p) { return ir::AvgPool2dGrad(p[0], in, o); }, kAllFloats);
  }
  // Overlapping windows, no padding, more planes.
  ir::Pool2dOptions q;
  q.window = {3, 3};
  q.strides = {1, 1};
  Check("max_pool2d_overlap", {Grid({2, 16, 6, 6})},
        [&](Builder&, auto& p) { return ir::MaxPool2d(p[0], q); });
  Check("max_pool2d_grad_overlap", {Grid({2, 16, 6, 6}), U({2, 16, 4, 4})},
        [&](Builder&, auto& p) { return ir::MaxPool2dGrad(p[0], p[1], q); });
}

// ---- Composites ----

TEST(CpuBackendTest, NormsAndSoftmax) {
  Tol tol{1e-5, 1e-2};
  for (int axis : {-1, 0, 1}) {
    Check(
        "softmax", {U({6, 37}, -4, 4)},
        [&](Builder&, auto& p) { return ir::Softmax(p[0], axis % 2); }, kAllFloats, tol);
    Check(
        "log_softmax", {U({3, 7, 37}, -4, 4)},
        [&](Builder&, auto& p) { return ir::LogSoftmax(p[0], axis); }, kAllFloats, tol);
  }
  Check(
      "layer_norm", {U({2, 5, 37}), U({37}), U({37})},
      [](Builder&, auto& p) { return ir::LayerNorm(p[0], p[1], p[2], 1e-5); }, kAllFloats, tol);
  Check(
      "rms_norm", {U({2, 5, 37}), U({37})},
      [](Builder&, auto& p) { return ir::RmsNorm(p[0], p[1], 1e-6); }, kAllFloats, tol);
  Check(
      "cross_entropy", {U({4, 3, 10}, -3, 3), Ints({4, 3}, -1, 10)},
      [](Builder&, auto& p) { return ir::SparseCrossEntropy(p[0], p[1]); }, kAllFloats, tol);
  // Rows over several of the f32 kernel's 2048-float chunks, their maxima anywhere: the running
  // sum is rescaled whenever a later chunk holds a larger value.
  Check(
      "cross_entropy_long_rows", {U({5, 5000}, -8, 8), Ints({5}, 0, 5000)},
      [](Builder&, auto& p) { return ir::SparseCrossEntropy(p[0], p[1]); }, {DType::kF32}, tol);
}

TEST(CpuBackendTest, Attention) {
  Tol tol{1e-5, 1e-2};
  for (bool causal : {false, true}) {
    Check(
        "attention", {U({2, 3, 7, 8}), U({2, 3, 7, 8}), U({2, 3, 7, 5})},
        [&](Builder&, auto& p) { return ir::Attention(p[0], p[1], p[2], causal); }, kFloats, tol);
    // Sq != Sk: the causal mask aligns at the end; Sq > Sk leaves queries with no key (NaN).
    Check(
        "attention_sq_lt_sk", {U({2, 4, 8}), U({2, 9, 8}), U({2, 9, 6})},
        [&](Builder&, auto& p) { return ir::Attention(p[0], p[1], p[2], causal, 0.3); }, kFloats,
        tol);
    Check(
        "attention_sq_gt_sk", {U({1, 6, 4}), U({1, 3, 4}), U({1, 3, 4})},
        [&](Builder&, auto& p) { return ir::Attention(p[0], p[1], p[2], causal); }, kFloats, tol);
  }
}

// ---- Randomness and collectives ----

TEST(CpuBackendTest, RandomBitsMatchBitForBit) {
  for (DType t : {DType::kS32, DType::kF32}) {
    Check("random_bits", {Ints({}, 0, 1000000, DType::kS64), Ints({}, 0, 1000, DType::kS64)},
          [t](Builder&, auto& p) {
            return ir::RandomBits(p[0], p[1], t, Shape{3, 33});
          },
          {DType::kF32}, {0, 0});
  }
}

TEST(CpuBackendTest, Collectives) {
  Check("all_reduce", {U({5, 3})}, [](Builder&, auto& p) { return ir::AllReduce(p[0]); });
  Check("all_gather", {U({5, 3})}, [](Builder&, auto& p) { return ir::AllGather(p[0], 0, 1); });
  Check("reduce_scatter", {U({5, 3})},
        [](Builder&, auto& p) { return ir::ReduceScatter(p[0], 1, 1); });
}

// ---- Executable behaviour ----

TEST(CpuBackendTest, RunIntoIsRepeatableAndChainsOps) {
  Builder b("mlp");
  Value x = b.Parameter("x", DType::kF32, {8, 16});
  Value w1 = b.Parameter("w1", DType::kF32, {16, 32});
  Value w2 = b.Parameter("w2", DType::kF32, {32, 4});
  Value h = ir::Relu(ir::MatMul(x, w1) + 0.5);
  Value y = ir::Softmax(ir::MatMul(h, w2), -1);
  b.Output("y", y);
  b.Output("loss", ir::ReduceSum(y * y, {0, 1}));
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937 rng(7);
  std::vector<Tensor> in = {Draw(U({8, 16}), DType::kF32, rng), Draw(U({16, 32}), DType::kF32, rng),
                            Draw(U({32, 4}), DType::kF32, rng)};
  auto want = MakeReferenceBackend()->Compile(*g).value()->Run(in).value();
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->backend_name(), "cpu");
  Tensor y_out(DType::kF32, Shape{8, 4}), loss(DType::kF32, Shape{});
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_TRUE((*exe)->RunInto({&in[0], &in[1], &in[2]}, {&y_out, &loss}).ok());
    ExpectClose(y_out, want[0], 1e-5, "y");
    ExpectClose(loss, want[1], 1e-5, "loss");
  }
  // Thunk names say how each node runs.
  bool saw_matmul = false;
  for (int i = 0; i < (*exe)->num_thunks(); ++i)
    saw_matmul |= (*exe)->thunk(i).name().find("onednn matmul") != std::string::npos;
  EXPECT_TRUE(saw_matmul);
}

// The hot ops run as oneDNN primitives in f32 and bf16 (natively, not through fallbacks), and
// prefer_loops really switches the dual-implementation ones to loops.
TEST(CpuBackendTest, HotOpsLowerToOneDnn) {
  for (DType dt : kFloats) {
    Builder b("cnn");
    Value x = b.Parameter("x", dt, {2, 8, 12, 12});
    Value w = b.Parameter("w", dt, {16, 8, 3, 3});
    Value g = b.Parameter("g", dt, {16});
    Value h = ir::Relu(ir::Conv2d(x, w));  // conv, eltwise
    h = ir::MaxPool2d(h);                  // pooling
    Value f = ir::Reshape(h, Shape{2, 16 * 5 * 5});
    Value wd = b.Parameter("wd", dt, {16 * 5 * 5, 16});
    Value y = ir::MatMul(f, wd);        // matmul
    y = ir::LayerNorm(y, g, g) + y;     // layer_norm, binary
    b.Output("p", ir::Softmax(y, -1));  // softmax
    b.Output("c", ir::Convert(y, dt == DType::kF32 ? DType::kBF16 : DType::kF32));  // reorder
    auto graph = b.Build();
    ASSERT_TRUE(graph.ok()) << graph.status();
    for (bool loops : {false, true}) {
      // Without fusion: fused elementwise groups replace the per-op relu/add/convert thunks.
      auto exe = MakeCpuBackend({.prefer_loops = loops, .fuse = false})->Compile(*graph);
      ASSERT_TRUE(exe.ok()) << exe.status();
      std::string names;
      for (int i = 0; i < (*exe)->num_thunks(); ++i) names += (*exe)->thunk(i).name() + "\n";
      std::vector<std::string> dual = {"relu %",       "add %",        "softmax %",
                                       "layer_norm %", "max_pool2d %", "convert %"};
      // oneDNN 2.6 has no bf16 primitives below avx512_core: those ops run the loops there.
      const bool onednn_takes_dtype = dt != DType::kBF16 || OneDnnHasBf16();
      for (const std::string& op : dual) {
        size_t at = names.find(op);
        ASSERT_NE(at, std::string::npos) << op << " in\n" << names;
        std::string line = names.substr(at, names.find('\n', at) - at);
        // A convert between f32 and bf16 is a oneDNN reorder at every level.
        const bool want = !loops && (onednn_takes_dtype || op == "convert %");
        EXPECT_EQ(line.find("onednn") != std::string::npos, want) << line;
      }
      for (std::string op : {"conv2d %", "dot_general %"}) {
        size_t at = names.find(op);
        ASSERT_NE(at, std::string::npos) << op << " in\n" << names;
        std::string line = names.substr(at, names.find('\n', at) - at);
        if (!loops || op == "conv2d %") {
          EXPECT_NE(line.find("onednn"), std::string::npos) << line;
        }
      }
    }
  }
}

TEST(CpuBackendTest, UnsupportedDTypeIsUnimplementedNamingTheOp) {
  Builder b("f64conv");
  Value x = b.Parameter("x", DType::kF64, {1, 2, 5, 5});
  Value w = b.Parameter("w", DType::kF64, {3, 2, 3, 3});
  b.Output("y", ir::Conv2d(x, w));
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(exe.status().message()).find("conv2d"), std::string::npos) << exe.status();
}

}  // namespace
}  // namespace kiln::runtime

namespace kiln::runtime {
namespace {

// Compile runs the compiler pipeline unless told not to: x * 1 + 0 simplifies to x.
// True when KILN_DISABLE_PASSES names `pass` (CTest reruns suites that way): tests of what a pass
// does then skip their structural checks, the numeric ones still run.
bool DisabledByEnv(const std::string& pass) {
  const char* v = std::getenv("KILN_DISABLE_PASSES");
  if (v == nullptr) return false;
  std::string list = std::string(",") + v + ",";
  return list.find("," + pass + ",") != std::string::npos;
}

TEST(CpuBackendOptimizeTest, PipelineRunsUnlessDisabled) {
  if (DisabledByEnv("algebraic") || DisabledByEnv("fusion"))
    GTEST_SKIP() << "counts the thunks the algebraic and fusion passes leave";
  ir::Builder b("identity_math");
  ir::Value x = b.Parameter("x", DType::kF32, {3, 5});
  b.Output("y", ir::Exp(x * 1.0 + 0.0));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto optimized = MakeCpuBackend()->Compile(*g);
  auto plain = MakeCpuBackend({.optimize = false})->Compile(*g);
  ASSERT_TRUE(optimized.ok()) << optimized.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*optimized)->num_thunks(), 1);  // exp only
  EXPECT_GT((*plain)->num_thunks(), 1);      // the multiply and add (and broadcasts) stay
  Tensor in = Tensor::FromVector<float>(Shape{3, 5}, std::vector<float>(15, 0.5f));
  auto a = (*optimized)->Run({in});
  auto p = (*plain)->Run({in});
  ASSERT_TRUE(a.ok() && p.ok());
  EXPECT_TRUE((*a)[0].BitwiseEquals((*p)[0]));
}

// The masked row sum that picks each row's label logit (autodiff's cross-entropy gradient) runs
// as a gather of one logit per row (the algebraic pass's label-pick rule), with the masked sum's
// results: 0 for labels outside [0, C), and an inf elsewhere in a row does not leak in.
TEST(CpuBackendOptimizeTest, LabelPickRunsAsAGather) {
  ir::Builder b("pick");
  ir::Value x = b.Parameter("x", DType::kF32, {2, 3, 6});
  ir::Value labels = b.Parameter("labels", DType::kS32, {2, 3});
  const Shape s{2, 3, 6};
  ir::Value classes = ir::BroadcastInDim(b.Iota(DType::kF32, Shape{6}, 0), s, {2});
  ir::Value hit = ir::Eq(classes, ir::BroadcastInDim(ir::Convert(labels, DType::kF32), s, {0, 1}));
  b.Output("picked", ir::ReduceSum(ir::Select(hit, x, b.Scalar(0.0, DType::kF32)), {2}));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto cpu = MakeCpuBackend()->Compile(*g);
  auto ref = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(ref.ok()) << ref.status();
  if (!DisabledByEnv("algebraic")) {
    int gathers = 0, sums = 0;
    for (const ir::Node& n : (*cpu)->graph().nodes()) {
      gathers += n.opcode() == ir::Opcode::kGather;
      sums += n.opcode() == ir::Opcode::kReduceSum;
    }
    EXPECT_EQ(gathers, 1);
    EXPECT_EQ(sums, 0);
  }
  std::vector<float> xv(36);
  for (int i = 0; i < 36; ++i) xv[i] = 0.25f * static_cast<float>(i) - 4.f;
  xv[4] = std::numeric_limits<float>::infinity();  // row 0, not its label
  xv[6 + 1] = -0.f;                                // row 1's label logit
  const std::vector<int32_t> lv = {2, 1, -1, 5, 6, 0};
  std::vector<Tensor> in = {Tensor::FromVector<float>(s, xv),
                            Tensor::FromVector<int32_t>(Shape{2, 3}, lv)};
  auto a = (*cpu)->Run(in);
  auto want = (*ref)->Run(in);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(want.ok()) << want.status();
  for (int r = 0; r < 6; ++r) {
    const double expect = lv[r] < 0 || lv[r] >= 6 ? 0.0 : xv[r * 6 + lv[r]];
    EXPECT_EQ((*a)[0].GetDouble(r), expect) << "row " << r;
    EXPECT_EQ((*want)[0].GetDouble(r), expect) << "row " << r;
  }
}

// Reshapes are aliases of their operand's buffer (no copy, no arena bytes), including chains of
// them and reshapes of parameters; a reshape that is a graph output keeps its own buffer.
TEST(CpuBackendFusionTest, ReshapesAreAliases) {
  Check("reshape_alias", {U({4, 6}), U({6, 3})}, [](Builder&, const std::vector<Value>& p) {
    Value r = ir::Reshape(ir::Reshape(p[0], Shape{24}), Shape{6, 4});
    Value e = ir::Exp(r) + r;
    Value z = ir::MatMul(ir::Reshape(e, Shape{4, 6}), p[1]);
    return ir::Reshape(z, Shape{12});
  });
  Builder b("alias");
  Value x = b.Parameter("x", DType::kF32, {4, 6});
  b.Output("y", ir::Exp(ir::Reshape(x, Shape{24})));
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->num_thunks(), 1);  // the exp; the reshape is an alias of x
  EXPECT_EQ((*exe)->plan().aliases.size(), 1u);
}

// Reductions fused into loop groups: full, over the last dims (rows), over the leading dims
// (columns) and over middle dims, in one block and across many blocks and threads.
TEST(CpuBackendFusionTest, FusedReductions) {
  if (DisabledByEnv("fusion")) GTEST_SKIP() << "tests the fusion pass";
  for (Shape shape : {Shape{3, 5, 7}, Shape{64, 40, 33}}) {
    for (std::vector<int64_t> dims :
         std::vector<std::vector<int64_t>>{{0, 1, 2}, {2}, {1, 2}, {0}, {0, 1}, {1}}) {
      Check("fused_reduce", {U(shape), U(shape)}, [dims](Builder&, const std::vector<Value>& p) {
        Value prod = p[0] * p[1] + p[0];
        return ir::ReduceSum(prod, dims);
      });
    }
  }
  Builder b("norm");
  Value g = b.Parameter("g", DType::kF32, {64, 64});
  b.Output("n", ir::Sqrt(ir::ReduceSum(g * g, {0, 1})));
  auto graph = b.Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto exe = MakeCpuBackend()->Compile(*graph);
  ASSERT_TRUE(exe.ok()) << exe.status();
  // One kernel squares and sums (the squares are never stored), one takes the square root.
  EXPECT_EQ((*exe)->num_thunks(), 2);
}

// Graph outputs live in the caller's tensors, not the arena; an output tensor that is also an
// input (an in-place update) is computed in a staging buffer and copied, with the same result.
TEST(CpuBackendFusionTest, OutputsOutsideTheArena) {
  if (DisabledByEnv("fusion")) GTEST_SKIP() << "tests the fusion pass";
  Builder b("sgd");
  Value w = b.Parameter("w", DType::kF32, {64, 64});
  Value g = b.Parameter("g", DType::kF32, {64, 64});
  Value h = ir::MatMul(w, g);
  b.Output("w", w - g * 0.5);
  b.Output("h", h);
  b.Output("h_again", h);
  auto graph = b.Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto exe = MakeCpuBackend()->Compile(*graph);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->plan().arena_bytes, 0);  // both results go straight to the caller
  std::mt19937 rng(3);
  Tensor wt = Draw(U(Shape{64, 64}), DType::kF32, rng),
         gt = Draw(U(Shape{64, 64}), DType::kF32, rng);
  auto want = (*exe)->Run({wt, gt});
  ASSERT_TRUE(want.ok()) << want.status();
  for (int rep = 0; rep < 2; ++rep) {
    Tensor w_inout = wt.Clone(), h(DType::kF32, Shape{64, 64}), h2(DType::kF32, Shape{64, 64});
    ASSERT_TRUE((*exe)->RunInto({&w_inout, &gt}, {&w_inout, &h, &h2}).ok());
    EXPECT_TRUE(w_inout.BitwiseEquals((*want)[0]));
    EXPECT_TRUE(h.BitwiseEquals((*want)[1]));
    EXPECT_TRUE(h2.BitwiseEquals((*want)[2]));
  }
}

// An update declared in place of its parameter (ir::Output::in_place_of) is written over the
// caller's tensor: the schedule runs the other reader (the matmul, built after the update) first,
// no staging buffer is needed, and the result is the out-of-place one bit for bit.
TEST(CpuBackendFusionTest, InPlaceOutputsWriteOverTheirParameter) {
  Builder b("sgd_in_place");
  Value w = b.Parameter("w", DType::kF32, {64, 64});
  Value g = b.Parameter("g", DType::kF32, {64, 64});
  b.Output("w", w - g * 0.5, w);
  b.Output("h", ir::MatMul(w, g));
  auto graph = b.Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto exe = MakeCpuBackend()->Compile(*graph);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->num_in_place_outputs(), 1);
  std::mt19937 rng(5);
  Tensor wt = Draw(U(Shape{64, 64}), DType::kF32, rng),
         gt = Draw(U(Shape{64, 64}), DType::kF32, rng);
  auto want = (*exe)->Run({wt, gt});
  ASSERT_TRUE(want.ok()) << want.status();
  Tensor w_inout = wt.Clone(), h(DType::kF32, Shape{64, 64});
  for (int rep = 0; rep < 2; ++rep) {
    Tensor w_before = w_inout.Clone();
    ASSERT_TRUE((*exe)->RunInto({&w_inout, &gt}, {&w_inout, &h}).ok());
    auto again = (*exe)->Run({w_before, gt});
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(w_inout.BitwiseEquals((*again)[0])) << "rep " << rep;
    EXPECT_TRUE(h.BitwiseEquals((*again)[1])) << "rep " << rep;
    if (rep == 0) {
      EXPECT_TRUE(w_inout.BitwiseEquals((*want)[0]));
    }
  }
  EXPECT_EQ((*exe)->staging_bytes_allocated(), 0);
}

// A constant too big to fold (a 128 x 128 causal mask from two iotas) is computed once, when the
// executable is made: no thunk of a run computes it, and every run reads the same right values.
TEST(CpuBackendTest, ConstantValuedKernelsRunOnce) {
  Builder b("masked");
  Value x = b.Parameter("x", DType::kF32, {2, 128, 128});
  Value mask =
      ir::Le(b.Iota(DType::kS64, Shape{128, 128}, 1), b.Iota(DType::kS64, Shape{128, 128}, 0));
  Value zero = ir::BroadcastInDim(b.Scalar(0.0, DType::kF32), Shape{2, 128, 128}, {});
  b.Output("y", ir::Select(ir::BroadcastInDim(mask, Shape{2, 128, 128}, {1, 2}), x * 2.0, zero));
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_FALSE((*exe)->plan().hoisted.empty());
  for (int i = 0; i < (*exe)->num_thunks(); ++i) {
    const std::string name = (*exe)->thunk(i).name();
    EXPECT_EQ(name.find("iota"), std::string::npos) << name;
    EXPECT_EQ(name.find("compare"), std::string::npos) << name;
  }
  std::mt19937 rng(8);
  Tensor xt = Draw(U(Shape{2, 128, 128}), DType::kF32, rng);
  auto want = MakeReferenceBackend()->Compile(*g).value()->Run({xt}).value();
  for (int rep = 0; rep < 2; ++rep) {
    auto got = (*exe)->Run({xt});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE((*got)[0].BitwiseEquals(want[0])) << "run " << rep;
  }
}

// An output in place of a parameter its kernel reads other elements of (a transpose) is not
// written in place: it is staged and copied over the input, with the right result.
TEST(CpuBackendFusionTest, InPlaceRefusedForATranspose) {
  Builder b("transpose_in_place");
  Value w = b.Parameter("w", DType::kF32, {32, 32});
  b.Output("w", ir::Transpose(w, {1, 0}), w);
  auto graph = b.Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto exe = MakeCpuBackend()->Compile(*graph);
  ASSERT_TRUE(exe.ok()) << exe.status();
  EXPECT_EQ((*exe)->num_in_place_outputs(), 0);
  std::mt19937 rng(6);
  Tensor wt = Draw(U(Shape{32, 32}), DType::kF32, rng);
  auto want = (*exe)->Run({wt});
  ASSERT_TRUE(want.ok());
  Tensor w_inout = wt.Clone();
  ASSERT_TRUE((*exe)->RunInto({&w_inout}, {&w_inout}).ok());
  EXPECT_TRUE(w_inout.BitwiseEquals((*want)[0]));
  EXPECT_EQ((*exe)->staging_bytes_allocated(), 32 * 32 * 4);
}

// The vectorizable exp of the attention softmax: within 2 ulp of libm over its range, exact
// limits outside it.
TEST(CpuBackendFusionTest, FastExpMatchesLibm) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    double want = std::exp(static_cast<double>(x));
    double got = cpu::FastExp(x);
    worst = std::max(worst, std::fabs(got - want) / want);
  }
  EXPECT_LT(worst, 2.5e-7);  // 2 ulp of f32
  EXPECT_EQ(cpu::FastExp(0.f), 1.f);
  EXPECT_EQ(cpu::FastExp(-200.f), 0.f);
  EXPECT_EQ(cpu::FastExp(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_TRUE(std::isinf(cpu::FastExp(100.f)));
  EXPECT_TRUE(std::isnan(cpu::FastExp(std::numeric_limits<float>::quiet_NaN())));
}

// Hand-written groups: a group the backend cannot run as one kernel (a bare dot_general
// "epilogue") runs node by node, with the same results. A malformed group (members not
// consecutive: a graph rewritten after fusion without GraphEditor) is invalid IR, rejected with
// the node and group named.
TEST(CpuBackendFusionTest, HandWrittenGroupsTheBackendRefusesRunNodeByNode) {
  absl::StatusOr<ir::Graph> bad = ir::ParseGraph(R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[40]
      %1 = neg(%0) {fusion=0}
      %2 = exp(%1)
      %3 = add(%1, %2) {fusion=0}
      return y=%3
    })");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("node %3 (add): fusion group 0 (loop): members must be "
                                        "consecutive"),
            std::string_view::npos)
      << bad.status();
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(R"(
    graph @g {
      fusion 0 kind=loop
      fusion 1 kind=matmul_epilogue
      %0 = parameter() {index=0, name="x"} : f32[40]
      %1 = neg(%0) {fusion=0}
      %2 = add(%1, %0) {fusion=0}
      %3 = exp(%2)
      %4 = dot_general(%3, %3) {fusion=1, lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[0]}
      return y=%2, z=%4
    })");
  ASSERT_TRUE(g.ok()) << g.status();
  auto plain = MakeCpuBackend({.optimize = false})->Compile(*g);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::mt19937 rng(5);
  Tensor x = Draw(U(Shape{40}), DType::kF32, rng);
  auto got = (*plain)->Run({x});
  auto want = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(got.ok() && want.ok());
  auto ref = (*want)->Run({x});
  ASSERT_TRUE(ref.ok());
  ExpectClose((*got)[0], (*ref)[0], 1e-5, "y");
  ExpectClose((*got)[1], (*ref)[1], 1e-5, "z");
}

// Output fusion: matmul + bias + activation + residual as one oneDNN matmul with post-ops,
// checked against the reference backend (and the per-op loops) like every op.
TEST(CpuBackendFusionTest, MatmulEpilogues) {
  if (DisabledByEnv("fusion")) GTEST_SKIP() << "tests the fusion pass";
  Check("dense_bias_relu", {U({8, 32}), U({32, 16}), U({16})},
        [](Builder&, const std::vector<Value>& p) {
          return ir::Relu(ir::MatMul(p[0], p[1]) + p[2]);
        });
  Check("dense_bias_gelu_residual", {U({8, 32}), U({32, 32}), U({32}), U({8, 32})},
        [](Builder&, const std::vector<Value>& p) {
          return ir::Gelu(ir::MatMul(p[0], p[1]) + p[2]) + p[3];
        });
  Check("batched_bias_tanh", {U({2, 8, 16}), U({16, 8}), U({8})},
        [](Builder&, const std::vector<Value>& p) {
          return ir::Tanh(ir::MatMul(p[0], p[1]) + p[2]);
        });
  Check("conv_bias_relu", {U({2, 3, 9, 9}), U({8, 3, 3, 3}), U({8})},
        [](Builder&, const std::vector<Value>& p) {
          Value c = ir::Conv2d(p[0], p[1]);
          return ir::Relu(c + ir::BroadcastInDim(p[2], c.shape(), {1}));
        });
  Check("conv_tanh", {U({2, 3, 9, 9}), U({4, 3, 3, 3})},
        [](Builder&, const std::vector<Value>& p) { return ir::Tanh(ir::Conv2d(p[0], p[1])); });
  Check("residual_only", {U({8, 16}), U({16, 16}), U({8, 16})},
        [](Builder&, const std::vector<Value>& p) { return p[2] + ir::MatMul(p[0], p[1]); });

  Builder b("mlp");
  Value x = b.Parameter("x", DType::kF32, {8, 32});
  Value w = b.Parameter("w", DType::kF32, {32, 16});
  Value bias = b.Parameter("b", DType::kF32, {16});
  b.Output("y", ir::Relu(ir::MatMul(x, w) + bias));
  auto g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  ASSERT_EQ((*exe)->num_thunks(), 1);
  EXPECT_NE((*exe)->thunk(0).name().find("onednn matmul+bias+relu"), std::string::npos)
      << (*exe)->thunk(0).name();

  Builder cb("cnn");
  Value cx = cb.Parameter("x", DType::kF32, {2, 3, 9, 9});
  Value cw = cb.Parameter("w", DType::kF32, {8, 3, 3, 3});
  Value cbias = cb.Parameter("b", DType::kF32, {8});
  Value conv = ir::Conv2d(cx, cw);
  cb.Output("y", ir::Relu(conv + ir::BroadcastInDim(cbias, conv.shape(), {1})));
  auto cg = cb.Build();
  ASSERT_TRUE(cg.ok()) << cg.status();
  auto cexe = MakeCpuBackend()->Compile(*cg);
  ASSERT_TRUE(cexe.ok()) << cexe.status();
  ASSERT_EQ((*cexe)->num_thunks(), 1);
  EXPECT_NE((*cexe)->thunk(0).name().find("onednn convolution+bias+relu"), std::string::npos)
      << (*cexe)->thunk(0).name();
}

// Long contractions over row-major operands (K >= 2 max(M, N), like the LM head's dX) run
// through oneDNN's sgemm, with a fused bias and/or residual written into the output first; the
// same shapes with a transposed operand, an activation, or in bf16 keep the matmul primitive.
// Both agree with the reference.
TEST(CpuBackendTest, LongContractionsUseSgemm) {
  enum Epi { kNone, kBias, kResidual, kBiasResidual, kBiasRelu };
  struct Case {
    std::vector<int64_t> lhs, rhs;
    ir::DotDims dims;
    DType dt;
    Epi epi;
    bool sgemm;
  };
  const std::vector<Case> cases = {
      {{2, 4, 300}, {300, 24}, {{}, {}, {2}, {0}}, DType::kF32, kNone, true},  // [8,300]x[300,24]
      {{16, 640}, {640, 3}, {{}, {}, {1}, {0}}, DType::kF32, kNone, true},
      {{16, 640}, {3, 640}, {{}, {}, {1}, {1}}, DType::kF32, kNone, false},  // rhs transposed
      {{640, 16}, {640, 3}, {{}, {}, {0}, {0}}, DType::kF32, kNone, false},  // lhs transposed
      {{16, 640}, {640, 3}, {{}, {}, {1}, {0}}, DType::kBF16, kNone, false},
      {{16, 20}, {20, 24}, {{}, {}, {1}, {0}}, DType::kF32, kNone, false},  // short K
      {{2, 4, 300}, {300, 24}, {{}, {}, {2}, {0}}, DType::kF32, kBias, true},
      {{2, 4, 300}, {300, 24}, {{}, {}, {2}, {0}}, DType::kF32, kResidual, true},
      {{2, 4, 300}, {300, 24}, {{}, {}, {2}, {0}}, DType::kF32, kBiasResidual, true},
      {{2, 4, 300}, {300, 24}, {{}, {}, {2}, {0}}, DType::kF32, kBiasRelu, false},
  };
  const bool fusion = !DisabledByEnv("fusion");
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    Builder b("long_k");
    Value x = b.Parameter("x", c.dt, Shape(c.lhs));
    Value w = b.Parameter("w", c.dt, Shape(c.rhs));
    Value y = ir::DotGeneral(x, w, c.dims);
    std::vector<Tensor> in = {Draw(U(Shape(c.lhs)), c.dt, rng), Draw(U(Shape(c.rhs)), c.dt, rng)};
    if (c.epi == kBias || c.epi == kBiasResidual || c.epi == kBiasRelu) {
      Shape bs{y.shape().dims().back()};
      y = y + b.Parameter("bias", c.dt, bs);
      in.push_back(Draw(U(bs), c.dt, rng));
    }
    if (c.epi == kBiasRelu) y = ir::Relu(y);
    if (c.epi == kResidual || c.epi == kBiasResidual) {
      y = b.Parameter("r", c.dt, y.shape()) + y;
      in.push_back(Draw(U(y.shape()), c.dt, rng));
    }
    b.Output("y", y);
    auto g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    auto want = MakeReferenceBackend()->Compile(*g).value()->Run(in).value();
    auto exe = MakeCpuBackend()->Compile(*g);
    ASSERT_TRUE(exe.ok()) << exe.status();
    for (int rep = 0; rep < 2; ++rep) {  // a second run over the same output buffer
      auto got = (*exe)->Run(in);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectClose((*got)[0], want[0], c.dt == DType::kF32 ? 1e-5 : 1e-2, "long_k");
    }
    std::string names;
    for (int i = 0; i < (*exe)->num_thunks(); ++i) names += (*exe)->thunk(i).name() + "; ";
    const std::string what = Shape(c.lhs).ToString() + " x " + Shape(c.rhs).ToString() + ": ";
    if (c.epi != kBiasRelu || fusion) {
      // Below avx512_core a bf16 dot computes in f32 (float normalization): the f32 rules apply.
      const bool want = c.sgemm || (c.dt == DType::kBF16 && !OneDnnHasBf16());
      EXPECT_EQ(names.find("sgemm:jit") != std::string::npos, want) << what << names;
    }
    if (fusion && c.epi == kBiasResidual) {
      EXPECT_NE(names.find("+bias+residual sgemm"), std::string::npos) << what << names;
    }
  }
}

// Fusion: an AdamW-like update with scalar, row and column broadcasts, bf16 rounding, compare and
// select runs as fused loop kernels, bit-identical to the per-op loops, in fewer thunks, and
// absorbed broadcasts get no arena buffer.
TEST(CpuBackendFusionTest, FusedLoopsMatchPerOpLoopsBitForBit) {
  if (DisabledByEnv("fusion")) GTEST_SKIP() << "tests the fusion pass";
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : {int64_t{3}, int64_t{300}}) {  // one block, and many blocks and threads
      ir::Builder b("adamw_like");
      Value w = b.Parameter("w", dt, {rows, 257});
      Value g = b.Parameter("g", dt, {rows, 257});
      Value m = b.Parameter("m", dt, {rows, 257});
      Value bias = b.Parameter("bias", dt, {257});
      Value col = b.Parameter("col", dt, {rows, 1});
      Value lr = b.Parameter("lr", dt, {});
      Value m2 = m * 0.9 + g * 0.1;
      Value v = g * g + 1e-3;
      Value upd = m2 / (ir::Sqrt(v) + 1e-8);
      Value w2 = w - (upd + w * 0.01) * lr;
      Value shifted = ir::Relu(w2 + bias) - col;
      Value masked =
          ir::Select(ir::Compare(shifted, ir::Abs(g), ir::CompareDirection::kGt), shifted, -g);
      b.Output("w", w2);
      b.Output("m", m2);
      b.Output("y", masked);
      b.Output("mask_any",
               ir::Compare(ir::Max(masked, ir::Min(w, g)), w, ir::CompareDirection::kGe));
      auto graph = b.Build();
      ASSERT_TRUE(graph.ok()) << graph.status();
      auto fused = MakeCpuBackend()->Compile(*graph);
      auto loops = MakeCpuBackend({.prefer_loops = true})->Compile(*graph);
      ASSERT_TRUE(fused.ok()) << fused.status();
      ASSERT_TRUE(loops.ok()) << loops.status();
      EXPECT_LT((*fused)->num_thunks(), (*loops)->num_thunks() / 3);
      bool saw_fusion = false;
      for (int i = 0; i < (*fused)->num_thunks(); ++i)
        saw_fusion |= (*fused)->thunk(i).name().find("(loop:") != std::string::npos;
      EXPECT_TRUE(saw_fusion);
      EXPECT_LT((*fused)->plan().arena_bytes, (*loops)->plan().arena_bytes);
      std::mt19937 rng(7);
      std::vector<Tensor> in;
      for (int id : graph->parameters())
        in.push_back(Draw(U(graph->node(id).type().shape), dt, rng));
      auto a = (*fused)->Run(in);
      auto c = (*loops)->Run(in);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(c.ok()) << c.status();
      for (size_t k = 0; k < a->size(); ++k)
        EXPECT_TRUE((*a)[k].BitwiseEquals((*c)[k]))
            << graph->outputs()[k].name << " " << DTypeName(dt) << " rows " << rows;
    }
  }
}

}  // namespace
}  // namespace kiln::runtime
