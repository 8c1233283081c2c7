// Gradient checks: every differentiable op's VJP rule against central finite differences in f64 on
// the reference backend, plus whole-model and error-path tests of Grad.
//
// kOpTable has one row per opcode (a new op without a row fails OpTableCoversEveryOpcode). A
// differentiable row lists cases; each case builds f(params) = sum(op(...) * W) with a fixed random
// weight W (so that e.g. softmax's constant row sums cannot hide a wrong rule) and inputs chosen
// away from kinks and ties.
#include "kiln/autodiff/grad.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/autodiff/vjp_rules.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/op_traits.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::autodiff {
namespace {

using ir::Builder;
using ir::Opcode;
using ir::Value;
using ::testing::HasSubstr;

constexpr DType kF64 = DType::kF64;

// ----------------------------------------------------------------------------------------------
// Inputs

// How a parameter's values are drawn.
struct Gen {
  enum Kind { kUniform, kAwayFromZero, kGrid } kind = kUniform;
  double lo = -1.0, hi = 1.0;  // kUniform range; kAwayFromZero magnitude range
  double offset = 0.0;         // kGrid: distinct values offset + 0.2 * k, shuffled
};
Gen Uniform(double lo, double hi) { return {Gen::kUniform, lo, hi, 0.0}; }
Gen AwayFromZero(double lo = 0.2, double hi = 1.0) { return {Gen::kAwayFromZero, lo, hi, 0.0}; }
// Values on a 0.2-spaced grid (shuffled): all distinct, and two grids with offsets differing by
// 0.1 never come closer than 0.1.
Gen Grid(double offset = 0.0) { return {Gen::kGrid, 0.0, 0.0, offset}; }

std::vector<double> Draw(const Gen& g, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> v(n);
  switch (g.kind) {
    case Gen::kUniform:
      for (double& x : v) x = g.lo + (g.hi - g.lo) * u(rng);
      break;
    case Gen::kAwayFromZero:
      for (double& x : v) x = (u(rng) < 0.5 ? -1 : 1) * (g.lo + (g.hi - g.lo) * u(rng));
      break;
    case Gen::kGrid:
      for (int64_t i = 0; i < n; ++i) v[i] = g.offset + 0.2 * static_cast<double>(i - n / 2);
      std::shuffle(v.begin(), v.end(), rng);
      break;
  }
  return v;
}

struct Param {
  std::string name;
  Shape shape;
  Gen gen = Uniform(-1, 1);
};

// A gradient case: parameters (all f64, all differentiated) and the body applying the op.
struct Case {
  std::string name;
  std::vector<Param> params;
  std::function<Value(Builder&, const std::vector<Value>&)> body;
  double fd_eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-6;
  // When set, Grad must fail with Unimplemented (and this substring).
  std::string expect_unimplemented;
};

struct Row {
  // Empty for differentiable ops; otherwise why there is no gradient.
  std::string not_differentiable;
  std::vector<Case> cases;
};

Value ConstS32(Builder& b, Shape shape, std::vector<int32_t> v) {
  return b.Constant(Tensor::FromVector<int32_t>(std::move(shape), v));
}
Value ConstS64(Builder& b, Shape shape, std::vector<int64_t> v) {
  return b.Constant(Tensor::FromVector<int64_t>(std::move(shape), v));
}

Tensor RandomTensor(const Shape& shape, const Gen& g, std::mt19937& rng) {
  return Tensor::FromDoubles(kF64, shape, Draw(g, shape.num_elements(), rng));
}

// ----------------------------------------------------------------------------------------------
// The harness

class GradChecker {
 public:
  GradChecker() : backend_(runtime::MakeReferenceBackend()) {}

  // Builds f = sum(body(params) * W), checks Grad against finite differences.
  void Check(Opcode op, const Case& c) {
    SCOPED_TRACE(std::string(ir::OpcodeName(op)) + " / " + c.name);
    std::mt19937 rng(1234);
    Builder b("f");
    std::vector<Value> ps;
    std::vector<std::string> names;
    for (const Param& p : c.params) {
      ps.push_back(b.Parameter(p.name, kF64, p.shape));
      names.push_back(p.name);
    }
    Value y = c.body(b, ps);
    ASSERT_TRUE(b.status().ok()) << b.status();
    ASSERT_EQ(y.dtype(), kF64);
    Value w = b.Constant(RandomTensor(y.shape(), Uniform(0.5, 1.5), rng));
    Value loss = y.rank() == 0 ? y * w : ir::ReduceSum(y * w, AllDims(y.rank()));
    b.Output("loss", loss);
    absl::StatusOr<ir::Graph> f = b.Build();
    ASSERT_TRUE(f.ok()) << f.status();
    bool has_op = false;
    for (const ir::Node& n : f->nodes()) has_op = has_op || n.opcode() == op;
    ASSERT_TRUE(has_op) << "the case does not use the op it is filed under";

    absl::StatusOr<ir::Graph> g = Grad(*f, names);
    if (!c.expect_unimplemented.empty()) {
      ASSERT_FALSE(g.ok());
      EXPECT_EQ(g.status().code(), absl::StatusCode::kUnimplemented) << g.status();
      EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.expect_unimplemented));
      return;
    }
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(ir::Verify(*g).ok()) << ir::Verify(*g);

    std::vector<Tensor> inputs;
    for (const Param& p : c.params) inputs.push_back(RandomTensor(p.shape, p.gen, rng));
    CheckAgainstFiniteDifferences(*f, *g, inputs, c.fd_eps, c.atol, c.rtol);
  }

  // Runs g (loss + grads) and compares each grad to central differences of f's loss.
  void CheckAgainstFiniteDifferences(const ir::Graph& f, const ir::Graph& g,
                                     std::vector<Tensor> inputs, double eps, double atol,
                                     double rtol) {
    auto fexe = backend_->Compile(f);
    ASSERT_TRUE(fexe.ok()) << fexe.status();
    auto gexe = backend_->Compile(g);
    ASSERT_TRUE(gexe.ok()) << gexe.status();
    auto gouts = (*gexe)->Run(inputs);
    ASSERT_TRUE(gouts.ok()) << gouts.status();
    const int first_grad = static_cast<int>(f.outputs().size());
    ASSERT_EQ(gouts->size(), first_grad + inputs.size());
    auto fouts = (*fexe)->Run(inputs);
    ASSERT_TRUE(fouts.ok()) << fouts.status();
    EXPECT_DOUBLE_EQ((*gouts)[0].GetDouble(0), (*fouts)[0].GetDouble(0)) << "loss differs";

    auto loss_at = [&](std::vector<Tensor>& in) {
      auto outs = (*fexe)->Run(in);
      EXPECT_TRUE(outs.ok()) << outs.status();
      return outs.ok() ? (*outs)[0].GetDouble(0) : NAN;
    };
    for (size_t p = 0; p < inputs.size(); ++p) {
      const Tensor& grad = (*gouts)[first_grad + p];
      ASSERT_EQ(grad.shape(), inputs[p].shape());
      Tensor& x = inputs[p];
      int failures = 0;
      for (int64_t i = 0; i < x.num_elements(); ++i) {
        const double x0 = x.GetDouble(i);
        x.SetDouble(i, x0 + eps);
        const double up = loss_at(inputs);
        x.SetDouble(i, x0 - eps);
        const double down = loss_at(inputs);
        x.SetDouble(i, x0);
        const double fd = (up - down) / (2 * eps);
        const double an = grad.GetDouble(i);
        const double tol = atol + rtol * std::max(std::abs(fd), std::abs(an));
        if (!(std::abs(fd - an) <= tol) && failures++ < 5) {
          ADD_FAILURE() << "grad/" << g.node(g.parameters()[p]).attr_str("name") << "[" << i
                        << "]: analytic " << an << " vs finite difference " << fd;
        }
      }
      EXPECT_EQ(failures, 0) << "mismatching elements in gradient " << p;
    }
  }

  runtime::Backend& backend() { return *backend_; }

 private:
  static std::vector<int64_t> AllDims(int rank) {
    std::vector<int64_t> d(rank);
    for (int i = 0; i < rank; ++i) d[i] = i;
    return d;
  }

  std::unique_ptr<runtime::Backend> backend_;
};

// ----------------------------------------------------------------------------------------------
// The table: one row per opcode.

using Body = std::function<Value(Builder&, const std::vector<Value>&)>;

Case Unary(std::string name, Shape s, Gen gen, std::function<Value(Value)> op) {
  return {name, {{"x", s, gen}}, [op](Builder&, const std::vector<Value>& p) { return op(p[0]); }};
}
Case Binary(std::string name, Shape sa, Gen ga, Shape sb, Gen gb,
            std::function<Value(Value, Value)> op) {
  return {name, {{"a", sa, ga}, {"b", sb, gb}}, [op](Builder&, const std::vector<Value>& p) {
            return op(p[0], p[1]);
          }};
}

ir::Conv2dOptions ConvOpts(std::vector<int64_t> strides, std::vector<int64_t> padding,
                           std::vector<int64_t> dilation, int64_t groups) {
  ir::Conv2dOptions o;
  o.strides = strides;
  o.padding = padding;
  o.dilation = dilation;
  o.groups = groups;
  return o;
}

ir::Pool2dOptions PoolOpts(std::vector<int64_t> window, std::vector<int64_t> strides,
                           std::vector<int64_t> padding, bool count_include_pad = false) {
  ir::Pool2dOptions o;
  o.window = window;
  o.strides = strides;
  o.padding = padding;
  o.count_include_pad = count_include_pad;
  return o;
}

// The plain elementwise rows of opcodes.def (families kUnary and kBinary) that have no row of their
// own above get one from their columns, so a new op is checked with no line here: a unary op on
// inputs where it is smooth (kPositive: [0.5, 2]; kKinkAtZero: away from 0; else [-3, 3]), a
// binary op on same-shape and broadcast operands in [-2, 2]. Every such op must be
// differentiable: a plain op without a VJP rule fails OpTableCoversEveryOpcode until it gets an
// explicit row saying why.
void AddPlainElementwiseRows(std::map<Opcode, Row>& t) {
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    const ir::OpInfo& info = ir::OpTraits(op);
    if (!info.plain_elementwise() || t.count(op)) continue;
    const std::string name(info.name);
    if (info.family == ir::KernelFamily::kUnary) {
      const Gen gen = info.positive_domain() ? Uniform(0.5, 2.0)
                      : info.kink_at_zero()  ? AwayFromZero(0.2, 1.0)
                                             : Uniform(-3, 3);
      t[op].cases = {
          Unary(name, {2, 3}, gen, [op](Value x) { return ir::ElementwiseUnary(op, x); })};
      continue;
    }
    auto apply = [op](Builder&, const std::vector<Value>& p) {
      return ir::ElementwiseBinary(op, p[0], p[1]);
    };
    t[op].cases = {
        {"same", {{"a", {2, 3}, Uniform(-2, 2)}, {"b", {2, 3}, Uniform(-2, 2)}}, apply},
        {"broadcast", {{"a", {2, 3}, Uniform(-2, 2)}, {"b", {3}, Uniform(-2, 2)}}, apply}};
  }
}

std::map<Opcode, Row> MakeOpTable() {
  std::map<Opcode, Row> t;
  const Gen any = Uniform(-1, 1);
  const Gen pos = Uniform(0.5, 2.0);

  // Not differentiable.
  t[Opcode::kArgmax] = {"integer result"};
  t[Opcode::kCompare] = {"bool result"};
  t[Opcode::kConstant] = {"no operands"};
  t[Opcode::kIota] = {"no operands"};
  t[Opcode::kLogicalAnd] = {"bool/integer operands"};
  t[Opcode::kLogicalNot] = {"bool/integer operand"};
  t[Opcode::kLogicalOr] = {"bool/integer operands"};
  t[Opcode::kParameter] = {"a leaf"};
  t[Opcode::kQuantize] = {"int8 inference op (Grad refuses it)"};
  t[Opcode::kQuantizedConv2d] = {"int8 inference op (Grad refuses it)"};
  t[Opcode::kQuantizedDot] = {"int8 inference op (Grad refuses it)"};
  t[Opcode::kRandomBits] = {"integer operands"};
  t[Opcode::kSign] = {"derivative zero almost everywhere"};

  // Elementwise unary: the plain rows of opcodes.def are derived below; gelu has two forms.
  t[Opcode::kGelu].cases = {
      Unary("exact", {2, 3}, Uniform(-3, 3), [](Value x) { return ir::Gelu(x, false); }),
      Unary("tanh", {2, 3}, Uniform(-3, 3), [](Value x) { return ir::Gelu(x, true); })};
  // f64 -> f32 -> f64 loses precision: a linear loss with a wide step keeps FD exact enough.
  t[Opcode::kConvert].cases = {{"f64-f32-f64",
                                {{"x", {2, 3}, any}},
                                [](Builder&, const std::vector<Value>& p) {
                                  return ir::Convert(ir::Convert(p[0], DType::kF32), kF64);
                                },
                                /*fd_eps=*/1e-2,
                                /*atol=*/1e-5,
                                /*rtol=*/1e-5}};

  // Elementwise binary.
  // add and sub are derived below; mul adds x * x (both operands the same value).
  t[Opcode::kMul].cases = {Binary("mul", {2, 3}, any, {2, 3}, any, ir::Mul),
                           Binary("broadcast", {2, 3}, any, {3}, any, ir::Mul),
                           {"square",
                            {{"x", {2, 3}, any}},
                            [](Builder&, const std::vector<Value>& p) { return p[0] * p[0]; }}};
  t[Opcode::kDiv].cases = {Binary("div", {2, 3}, any, {2, 3}, AwayFromZero(0.5, 2), ir::Div)};
  t[Opcode::kPow].cases = {Binary("pow", {2, 3}, pos, {2, 3}, Uniform(-1.5, 1.5), ir::Pow)};
  t[Opcode::kMax].cases = {Binary("max", {3, 4}, Grid(0.0), {3, 4}, Grid(0.1), ir::Max)};
  t[Opcode::kMin].cases = {Binary("min", {3, 4}, Grid(0.0), {3, 4}, Grid(0.1), ir::Min)};
  t[Opcode::kSelect].cases = {{"select",
                               {{"a", {2, 3}, any}, {"b", {2, 3}, any}},
                               [](Builder& b, const std::vector<Value>& p) {
                                 Value pred = b.Constant(Tensor::FromVector<bool>(
                                     {2, 3}, {true, false, false, true, true, false}));
                                 return ir::Select(pred, p[0], p[1]);
                               }}};

  // Structural.
  t[Opcode::kBroadcastInDim].cases = {Unary("stretch_and_add_dims", {3, 1}, any,
                                            [](Value x) {
                                              return ir::BroadcastInDim(x, {2, 3, 4}, {1, 2});
                                            }),
                                      Unary("scalar", {}, any,
                                            [](Value x) {
                                              return ir::BroadcastInDim(x, {2, 2}, {});
                                            }),
                                      Unary("size1_kept", {1, 3}, any, [](Value x) {
                                        return ir::BroadcastInDim(x, {1, 2, 3}, {0, 2});
                                      })};
  t[Opcode::kConcatenate].cases = {{"three",
                                    {{"a", {2, 3}, any}, {"b", {2, 1}, any}, {"c", {2, 2}, any}},
                                    [](Builder&, const std::vector<Value>& p) {
                                      return ir::Concatenate({p[0], p[1], p[2]}, 1);
                                    }}};
  t[Opcode::kGather].cases = {
      {"axis0_clamped",
       {{"table", {5, 3}, any}},
       [](Builder& b, const std::vector<Value>& p) {
         return ir::Gather(p[0], ConstS32(b, {4}, {1, 3, 1, 7}), 0);  // 7 clamps to 4
       }},
      {"axis1_2d_indices",
       {{"table", {2, 4, 3}, any}},
       [](Builder& b, const std::vector<Value>& p) {
         return ir::Gather(p[0], ConstS64(b, {2, 2}, {0, 3, 3, -1}), 1);  // -1 clamps to 0
       }}};
  t[Opcode::kScatterAdd].cases = {
      {"axis0_dropped",
       {{"operand", {5, 3}, any}, {"updates", {4, 3}, any}},
       [](Builder& b, const std::vector<Value>& p) {
         return ir::ScatterAdd(p[0], ConstS32(b, {4}, {1, 3, 1, 7}), p[1], 0);  // 7 dropped
       }},
      {"axis1",
       {{"operand", {2, 4}, any}, {"updates", {2, 3}, any}},
       [](Builder& b, const std::vector<Value>& p) {
         return ir::ScatterAdd(p[0], ConstS64(b, {3}, {0, 2, 0}), p[1], 1);
       }}};
  t[Opcode::kPad].cases = {Unary("low_high_interior", {2, 3}, any, [](Value x) {
    return ir::Pad(x, {1, 0}, {0, 2}, {1, 2}, 0.5);
  })};
  t[Opcode::kReshape].cases = {Unary("reshape", {2, 6}, any, [](Value x) {
    return ir::Reshape(x, {3, 2, 2});
  })};
  t[Opcode::kSlice].cases = {
      Unary("strided", {5, 6}, any,
            [](Value x) {
              return ir::Slice(x, {1, 0}, {5, 6}, {2, 4});
            }),
      Unary("uneven_end", {7}, any, [](Value x) { return ir::Slice(x, {1}, {6}, {3}); })};
  t[Opcode::kTranspose].cases = {Unary("rank3", {2, 3, 4}, any, [](Value x) {
    return ir::Transpose(x, {2, 0, 1});
  })};

  // Reductions.
  t[Opcode::kReduceSum].cases = {Unary("dims02", {2, 3, 4}, any, [](Value x) {
    return ir::ReduceSum(x, {0, 2});
  })};
  t[Opcode::kReduceMax].cases = {
      Unary("rows", {3, 4}, Grid(), [](Value x) { return ir::ReduceMax(x, {1}); }),
      Unary("all", {3, 4}, Grid(), [](Value x) {
        return ir::ReduceMax(x, {0, 1});
      })};
  t[Opcode::kReduceMin].cases = {
      Unary("cols", {3, 4}, Grid(), [](Value x) { return ir::ReduceMin(x, {0}); })};

  // Contractions.
  t[Opcode::kDotGeneral].cases = {
      Binary("matmul", {2, 3}, any, {3, 4}, any, ir::MatMul),
      Binary("batch_two_contracting_shuffled", {2, 3, 4, 5}, any, {5, 6, 2, 3}, any,
             [](Value l, Value r) {
               return ir::DotGeneral(l, r, {{0}, {2}, {3, 1}, {0, 3}});
             }),
      Binary("outer", {3}, any, {2}, any,
             [](Value l, Value r) {
               return ir::DotGeneral(l, r, {{}, {}, {}, {}});
             }),
      Binary("rhs_first", {3, 2}, any, {4, 3}, any, [](Value l, Value r) {
        return ir::DotGeneral(l, r, {{}, {}, {0}, {1}});
      })};
  const ir::Conv2dOptions strided = ConvOpts({2, 2}, {1, 0, 1, 1}, {1, 1}, 1);
  const ir::Conv2dOptions grouped = ConvOpts({1, 1}, {1, 1, 1, 1}, {2, 1}, 2);
  t[Opcode::kConv2d].cases = {Binary("strided_padded", {2, 2, 5, 6}, any, {3, 2, 3, 3}, any,
                                     [=](Value x, Value w) { return ir::Conv2d(x, w, strided); }),
                              Binary("dilated_grouped", {1, 4, 5, 5}, any, {4, 2, 2, 3}, any,
                                     [=](Value x, Value w) { return ir::Conv2d(x, w, grouped); })};
  // conv2d [2,2,5,6] * [3,2,3,3] with `strided` gives [2,3,2,3].
  t[Opcode::kConv2dBackwardInput].cases = {
      Binary("strided_padded", {2, 3, 2, 3}, any, {3, 2, 3, 3}, any, [=](Value dy, Value w) {
        return ir::Conv2dBackwardInput(dy, w, {2, 2, 5, 6}, strided);
      })};
  t[Opcode::kConv2dBackwardFilter].cases = {
      Binary("strided_padded", {2, 2, 5, 6}, any, {2, 3, 2, 3}, any, [=](Value x, Value dy) {
        return ir::Conv2dBackwardFilter(x, dy, {3, 2, 3, 3}, strided);
      })};

  // Pooling.
  const ir::Pool2dOptions pool = PoolOpts({3, 3}, {2, 2}, {1, 1, 1, 0});
  const ir::Pool2dOptions pool_incl = PoolOpts({3, 3}, {2, 2}, {1, 1, 1, 0}, true);
  t[Opcode::kMaxPool2d].cases = {
      Unary("padded", {1, 2, 5, 5}, Grid(), [=](Value x) { return ir::MaxPool2d(x, pool); })};
  t[Opcode::kMaxPool2dGrad].cases = {
      {"double_backward",
       {{"x", {1, 1, 4, 4}, Grid()}, {"dy", {1, 1, 2, 2}, any}},
       [](Builder&, const std::vector<Value>& p) {
         return ir::MaxPool2dGrad(p[0], p[1], PoolOpts({2, 2}, {2, 2}, {0, 0, 0, 0}));
       },
       1e-6,
       1e-7,
       1e-6,
       /*expect_unimplemented=*/"max_pool2d_grad"}};
  t[Opcode::kAvgPool2d].cases = {
      Unary("exclude_pad", {1, 2, 5, 5}, any, [=](Value x) { return ir::AvgPool2d(x, pool); }),
      Unary("include_pad", {1, 2, 5, 5}, any,
            [=](Value x) { return ir::AvgPool2d(x, pool_incl); })};
  // avg_pool2d of [1,2,5,5] with `pool` gives [1,2,3,2].
  t[Opcode::kAvgPool2dGrad].cases = {Unary("exclude_pad", {1, 2, 3, 2}, any,
                                           [=](Value dy) {
                                             return ir::AvgPool2dGrad(dy, {1, 2, 5, 5}, pool);
                                           }),
                                     Unary("include_pad", {1, 2, 3, 2}, any, [=](Value dy) {
                                       return ir::AvgPool2dGrad(dy, {1, 2, 5, 5}, pool_incl);
                                     })};

  // Composites (their own rules, not their decompositions).
  t[Opcode::kSoftmax].cases = {
      Unary("last", {2, 5}, Uniform(-2, 2), [](Value x) { return ir::Softmax(x, -1); }),
      Unary("first", {3, 2}, Uniform(-2, 2), [](Value x) { return ir::Softmax(x, 0); })};
  t[Opcode::kLogSoftmax].cases = {
      Unary("last", {2, 5}, Uniform(-2, 2), [](Value x) { return ir::LogSoftmax(x, -1); }),
      Unary("middle", {2, 3, 2}, Uniform(-2, 2), [](Value x) { return ir::LogSoftmax(x, 1); })};
  t[Opcode::kLayerNorm].cases = {{"rank3",
                                  {{"x", {2, 3, 4}, any}, {"gamma", {4}, any}, {"beta", {4}, any}},
                                  [](Builder&, const std::vector<Value>& p) {
                                    return ir::LayerNorm(p[0], p[1], p[2], 1e-5);
                                  }}};
  t[Opcode::kRmsNorm].cases = {
      {"rank2",
       {{"x", {3, 4}, any}, {"gamma", {4}, any}},
       [](Builder&, const std::vector<Value>& p) { return ir::RmsNorm(p[0], p[1], 1e-6); }}};
  t[Opcode::kCrossEntropy].cases = {
      {"s32_ignored_row",
       {{"logits", {4, 5}, Uniform(-2, 2)}},
       [](Builder& b, const std::vector<Value>& p) {
         // -100 is out of range: an ignored row (loss 0, zero gradient).
         return ir::SparseCrossEntropy(p[0], ConstS32(b, {4}, {4, 0, -100, 2}));
       }},
      {"s64_rank3",
       {{"logits", {2, 2, 3}, Uniform(-2, 2)}},
       [](Builder& b, const std::vector<Value>& p) {
         return ir::SparseCrossEntropy(p[0], ConstS64(b, {2, 2}, {2, 1, 0, 2}));
       }}};
  auto attention = [](bool causal, std::optional<double> scale) {
    return [=](Builder&, const std::vector<Value>& p) {
      return ir::Attention(p[0], p[1], p[2], causal, scale);
    };
  };
  t[Opcode::kAttention].cases = {
      {"plain",
       {{"q", {2, 3, 2}, any}, {"k", {2, 4, 2}, any}, {"v", {2, 4, 3}, any}},
       attention(false, std::nullopt)},
      {"causal_sq_lt_sk",
       {{"q", {2, 2, 2}, any}, {"k", {2, 4, 2}, any}, {"v", {2, 4, 3}, any}},
       attention(true, 0.7)},
      {"causal_square_two_batch_dims",
       {{"q", {2, 1, 3, 2}, any}, {"k", {2, 1, 3, 2}, any}, {"v", {2, 1, 3, 2}, any}},
       attention(true, std::nullopt)}};

  // Collectives (single process: one replica).
  t[Opcode::kAllReduce].cases = {Unary("one_replica", {2, 3}, any, ir::AllReduce)};
  t[Opcode::kAllGather].cases = {
      Unary("one_replica", {2, 3}, any, [](Value x) { return ir::AllGather(x, 1, 1); })};
  t[Opcode::kReduceScatter].cases = {
      Unary("one_replica", {2, 3}, any, [](Value x) { return ir::ReduceScatter(x, 0, 1); })};
  AddPlainElementwiseRows(t);
  return t;
}

const std::map<Opcode, Row>& OpTable() {
  static const auto* t = new std::map<Opcode, Row>(MakeOpTable());
  return *t;
}

TEST(GradOpTable, OpTableCoversEveryOpcode) {
  const auto& t = OpTable();
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    const std::string name(ir::OpcodeName(op));
    auto it = t.find(op);
    ASSERT_NE(it, t.end()) << "no row for '" << name << "' in the gradient op table";
    const Row& row = it->second;
    if (row.not_differentiable.empty()) {
      EXPECT_TRUE(IsDifferentiable(op)) << name << " has cases but no VJP rule";
      EXPECT_FALSE(row.cases.empty()) << name << " is differentiable but has no gradient case";
    } else {
      EXPECT_FALSE(IsDifferentiable(op)) << name << " is marked non-differentiable but has a rule";
      EXPECT_TRUE(row.cases.empty()) << name;
    }
  }
}

class GradOpTest : public ::testing::TestWithParam<int> {};

TEST_P(GradOpTest, MatchesFiniteDifferences) {
  const Opcode op = static_cast<Opcode>(GetParam());
  auto it = OpTable().find(op);
  if (it == OpTable().end()) GTEST_SKIP() << "no row (OpTableCoversEveryOpcode fails)";
  if (!it->second.not_differentiable.empty()) {
    GTEST_SKIP() << "not differentiable: " << it->second.not_differentiable;
  }
  GradChecker checker;
  for (const Case& c : it->second.cases) checker.Check(op, c);
}

INSTANTIATE_TEST_SUITE_P(AllOps, GradOpTest, ::testing::Range(0, ir::kNumOpcodes),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(ir::OpcodeName(static_cast<Opcode>(info.param)));
                         });

// ----------------------------------------------------------------------------------------------
// Whole graphs

TEST(Grad, RefusesInt8Ops) {
  Builder b("q");
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  Value w = b.Parameter("w", DType::kS8, {3, 4});
  Value s = b.Parameter("s", DType::kF32, {4});
  b.Output("loss", ir::ReduceSum(ir::QuantizedDot(ir::Quantize(x, 0.5f), w, s), {0, 1}));
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<ir::Graph> g = Grad(*f, {"x", "s"}, "loss");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("quantized_dot) is not differentiable"), std::string::npos)
      << g.status();
}

TEST(Grad, TwoLayerMlp) {
  Builder b("mlp");
  Value x = b.Parameter("x", kF64, {4, 3});
  Value w1 = b.Parameter("w1", kF64, {3, 5});
  Value b1 = b.Parameter("b1", kF64, {5});
  Value w2 = b.Parameter("w2", kF64, {5, 2});
  Value b2 = b.Parameter("b2", kF64, {2});
  Value h = ir::Tanh(ir::MatMul(x, w1) + b1);
  Value logits = ir::MatMul(h, w2) + b2;
  Value labels = ConstS32(b, {4}, {0, 1, 1, 0});
  b.Output("logits", logits);
  b.Output("loss", ir::Mean(ir::SparseCrossEntropy(logits, labels), {0}));
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok()) << f.status();

  absl::StatusOr<ir::Graph> g = Grad(*f, {"w1", "b1", "w2", "b2", "x"}, "loss");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(ir::Verify(*g).ok());
  ASSERT_EQ(g->outputs().size(), 7u);
  EXPECT_EQ(g->outputs()[0].name, "logits");
  EXPECT_EQ(g->outputs()[1].name, "loss");
  EXPECT_EQ(g->outputs()[2].name, "grad/w1");
  EXPECT_EQ(g->outputs()[6].name, "grad/x");
  ASSERT_EQ(g->parameters().size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(g->node(g->parameters()[i]).attr_str("name"),
              f->node(f->parameters()[i]).attr_str("name"));
  }

  // Check against finite differences of a graph whose first output is the loss.
  Builder lb("mlp_loss");
  std::vector<Value> ps;
  for (int id : f->parameters())
    ps.push_back(lb.Parameter(f->node(id).attr_str("name"), kF64, f->node(id).type().shape));
  Value lh = ir::Tanh(ir::MatMul(ps[0], ps[1]) + ps[2]);
  Value ll = ir::MatMul(lh, ps[3]) + ps[4];
  lb.Output("loss", ir::Mean(ir::SparseCrossEntropy(ll, ConstS32(lb, {4}, {0, 1, 1, 0})), {0}));
  absl::StatusOr<ir::Graph> loss_only = lb.Build();
  ASSERT_TRUE(loss_only.ok());
  absl::StatusOr<ir::Graph> g2 = Grad(*loss_only, {"x", "w1", "b1", "w2", "b2"});
  ASSERT_TRUE(g2.ok()) << g2.status();

  std::mt19937 rng(7);
  std::vector<Tensor> inputs;
  for (int id : f->parameters())
    inputs.push_back(RandomTensor(f->node(id).type().shape, Uniform(-1, 1), rng));
  GradChecker checker;
  checker.CheckAgainstFiniteDifferences(*loss_only, *g2, inputs, 1e-6, 1e-8, 1e-6);

  // Both gradient graphs agree.
  auto e1 = checker.backend().Compile(*g);
  auto e2 = checker.backend().Compile(*g2);
  ASSERT_TRUE(e1.ok() && e2.ok());
  auto o1 = (*e1)->Run(inputs);
  auto o2 = (*e2)->Run(inputs);
  ASSERT_TRUE(o1.ok() && o2.ok());
  const int order1[] = {6, 2, 3, 4, 5};  // grad/x, grad/w1, ... in g
  for (int i = 0; i < 5; ++i) {
    const Tensor& a = (*o1)[order1[i]];
    const Tensor& c = (*o2)[1 + i];
    ASSERT_EQ(a.shape(), c.shape());
    for (int64_t j = 0; j < a.num_elements(); ++j)
      EXPECT_NEAR(a.GetDouble(j), c.GetDouble(j), 1e-12);
  }
}

// f32 logits take the fused form of the cross-entropy gradient, exp(x - lse) - onehot with lse
// recovered from the loss: it must equal softmax - onehot (computed here in f64) to f32
// accuracy, and an ignored row whose logits spread far past exp's range must come out exactly
// zero, not NaN or inf.
TEST(Grad, CrossEntropyF32GradientFromTheLoss) {
  Builder b("xent");
  Value logits = b.Parameter("logits", DType::kF32, {3, 6});
  Value labels = ConstS32(b, {3}, {2, -1, 5});
  b.Output("loss", ir::ReduceSum(ir::SparseCrossEntropy(logits, labels), {0}));
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<ir::Graph> g = Grad(*f, {"logits"}, "loss");
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<float> x = {0.5f,  -1.f, 2.f,  0.f, 3.f,  -2.f,  // label 2
                                -90.f, 95.f, 0.f,  1.f, -3.f, 50.f,  // ignored, spread 185
                                7.f,   6.5f, -4.f, 2.f, 0.f,  8.f};  // label 5
  auto exe = runtime::MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto out = (*exe)->Run({Tensor::FromVector<float>(Shape{3, 6}, x)});
  ASSERT_TRUE(out.ok()) << out.status();
  const Tensor& dx = (*out)[1];
  const int label[] = {2, -1, 5};
  for (int r = 0; r < 3; ++r) {
    double m = -1e300, sum = 0;
    for (int j = 0; j < 6; ++j) m = std::max(m, double(x[r * 6 + j]));
    for (int j = 0; j < 6; ++j) sum += std::exp(x[r * 6 + j] - m);
    for (int j = 0; j < 6; ++j) {
      const double want =
          label[r] < 0 ? 0.0 : std::exp(x[r * 6 + j] - m) / sum - (j == label[r] ? 1.0 : 0.0);
      if (label[r] < 0) {
        EXPECT_EQ(dx.GetDouble(r * 6 + j), 0.0) << "row " << r << " col " << j;
      } else {
        EXPECT_NEAR(dx.GetDouble(r * 6 + j), want, 2e-6) << "row " << r << " col " << j;
      }
    }
  }
}

TEST(Grad, AccumulatesOverMultipleUses) {
  Builder b("f");
  Value x = b.Parameter("x", kF64, {3});
  b.Output("loss", ir::ReduceSum(x * x + ir::Sin(x) * x, {0}));
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok());
  absl::StatusOr<ir::Graph> g = Grad(*f, {"x"});
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937 rng(3);
  GradChecker().CheckAgainstFiniteDifferences(*f, *g, {RandomTensor({3}, Uniform(-2, 2), rng)},
                                              1e-6, 1e-8, 1e-6);
}

// Grad of a gradient graph: d/dx sum(c * dL/dw) for L = sum(softmax(conv2d(x, w))).
TEST(Grad, SecondOrder) {
  Builder b("f");
  Value x = b.Parameter("x", kF64, {1, 2, 4, 4});
  Value w = b.Parameter("w", kF64, {2, 2, 3, 3});
  ir::Conv2dOptions opts;
  opts.padding = {1, 1, 1, 1};
  b.Output("loss", ir::ReduceSum(ir::Softmax(ir::Tanh(ir::Conv2d(x, w, opts)), -1) *
                                     b.Iota(kF64, {1, 2, 4, 4}, 3),
                                 {0, 1, 2, 3}));
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<ir::Graph> g = Grad(*f, {"w"});
  ASSERT_TRUE(g.ok()) << g.status();

  // h(x, w) = sum(grad/w * c).
  Builder hb("h");
  absl::StatusOr<ValueMap> map = CopyGraph(*g, hb);
  ASSERT_TRUE(map.ok()) << map.status();
  std::mt19937 rng(5);
  Value c = hb.Constant(RandomTensor({2, 2, 3, 3}, Uniform(-1, 1), rng));
  hb.Output("gv", ir::ReduceSum((*map)[g->outputs()[1].node] * c, {0, 1, 2, 3}));
  absl::StatusOr<ir::Graph> h = hb.Build();
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<ir::Graph> hg = Grad(*h, {"x", "w"});
  ASSERT_TRUE(hg.ok()) << hg.status();
  GradChecker().CheckAgainstFiniteDifferences(*h, *hg,
                                              {RandomTensor({1, 2, 4, 4}, Uniform(-1, 1), rng),
                                               RandomTensor({2, 2, 3, 3}, Uniform(-0.5, 0.5), rng)},
                                              1e-5, 1e-7, 1e-5);
}

TEST(Grad, UnreachableParameterGetsZeros) {
  Builder b("f");
  Value x = b.Parameter("x", kF64, {2, 2});
  Value y = b.Parameter("y", DType::kF32, {3});
  b.Output("loss", ir::ReduceSum(x * x, {0, 1}));
  b.Output("other", y * 2.0);
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok());
  absl::StatusOr<ir::Graph> g = Grad(*f, {"y", "x"});
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->outputs().size(), 4u);
  EXPECT_EQ(g->outputs()[2].name, "grad/y");
  EXPECT_EQ(g->outputs()[3].name, "grad/x");

  GradChecker checker;
  auto exe = checker.backend().Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  Tensor xv = Tensor::FromVector<double>({2, 2}, {1, -2, 3, 0.5});
  Tensor yv = Tensor::FromVector<float>({3}, {1, 2, 3});
  auto outs = (*exe)->Run({xv, yv});
  ASSERT_TRUE(outs.ok()) << outs.status();
  const Tensor& gy = (*outs)[2];
  EXPECT_EQ(gy.dtype(), DType::kF32);
  ASSERT_EQ(gy.shape(), Shape({3}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(gy.GetDouble(i), 0.0);
  const Tensor& gx = (*outs)[3];
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(gx.GetDouble(i), 2 * xv.GetDouble(i));
}

TEST(Grad, LossOutputSelectsTheOutput) {
  Builder b("f");
  Value x = b.Parameter("x", kF64, {});
  b.Output("a", x * 2.0);
  b.Output("b", x * x * 3.0);
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok());
  for (const auto& [loss, expected] :
       std::vector<std::pair<std::string, double>>{{"", 2.0}, {"a", 2.0}, {"b", 6.0 * 1.5}}) {
    absl::StatusOr<ir::Graph> g = Grad(*f, {"x"}, loss);
    ASSERT_TRUE(g.ok()) << g.status();
    GradChecker checker;
    auto exe = checker.backend().Compile(*g);
    ASSERT_TRUE(exe.ok()) << exe.status();
    auto outs = (*exe)->Run({Tensor::FromVector<double>({}, {1.5})});
    ASSERT_TRUE(outs.ok()) << outs.status();
    EXPECT_DOUBLE_EQ((*outs)[2].GetDouble(0), expected) << "loss '" << loss << "'";
  }
}

// Matches PyTorch: torch.maximum/minimum split ties in half; torch.amax/amin divide evenly.
TEST(Grad, TiesFollowPyTorch) {
  Builder b("f");
  Value x = b.Parameter("x", kF64, {3});
  Value y = b.Parameter("y", kF64, {3});
  Value m = b.Parameter("m", kF64, {2, 3});
  b.Output("loss", ir::ReduceSum(ir::Max(x, y) + ir::Min(x, y) * 10.0, {0}) +
                       ir::ReduceSum(ir::ReduceMax(m, {1}), {0}));
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok());
  absl::StatusOr<ir::Graph> g = Grad(*f, {"x", "y", "m"});
  ASSERT_TRUE(g.ok()) << g.status();
  GradChecker checker;
  auto exe = checker.backend().Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto outs = (*exe)->Run({Tensor::FromVector<double>({3}, {1, 2, 3}),
                           Tensor::FromVector<double>({3}, {1, 1, 4}),
                           Tensor::FromVector<double>({2, 3}, {1, 3, 3, 2, 0, 1})});
  ASSERT_TRUE(outs.ok()) << outs.status();
  // torch: maximum -> x.grad [0.5, 1, 0], y.grad [0.5, 0, 1]; minimum the other way round.
  EXPECT_THAT((*outs)[1].ToDoubles(), ::testing::ElementsAre(5.5, 1, 10));
  EXPECT_THAT((*outs)[2].ToDoubles(), ::testing::ElementsAre(5.5, 10, 1));
  // torch.amax: [[0, 0.5, 0.5], [1, 0, 0]].
  EXPECT_THAT((*outs)[3].ToDoubles(), ::testing::ElementsAre(0, 0.5, 0.5, 1, 0, 0));
}

TEST(Grad, Float32Mlp) {
  // The rules work in f32 too; compare against the f64 gradient.
  auto build = [](DType dt) {
    Builder b("f");
    Value x = b.Parameter("x", dt, {3, 4});
    Value w = b.Parameter("w", dt, {4, 2});
    b.Output("loss", ir::Mean(ir::LogSoftmax(ir::Gelu(ir::MatMul(x, w)), -1), {0, 1}));
    return b.Build();
  };
  auto f32 = build(DType::kF32);
  auto f64 = build(kF64);
  ASSERT_TRUE(f32.ok() && f64.ok());
  auto g32 = Grad(*f32, {"x", "w"});
  auto g64 = Grad(*f64, {"x", "w"});
  ASSERT_TRUE(g32.ok() && g64.ok());
  std::mt19937 rng(11);
  Tensor x = RandomTensor({3, 4}, Uniform(-1, 1), rng),
         w = RandomTensor({4, 2}, Uniform(-1, 1), rng);
  GradChecker checker;
  auto e32 = checker.backend().Compile(*g32);
  auto e64 = checker.backend().Compile(*g64);
  ASSERT_TRUE(e32.ok() && e64.ok());
  auto o32 = (*e32)->Run({x.ConvertTo(DType::kF32), w.ConvertTo(DType::kF32)});
  auto o64 = (*e64)->Run({x, w});
  ASSERT_TRUE(o32.ok() && o64.ok());
  for (int k = 1; k < 3; ++k) {
    EXPECT_EQ((*o32)[k].dtype(), DType::kF32);
    for (int64_t i = 0; i < (*o64)[k].num_elements(); ++i)
      EXPECT_NEAR((*o32)[k].GetDouble(i), (*o64)[k].GetDouble(i), 1e-5);
  }
}

// ----------------------------------------------------------------------------------------------
// Errors

absl::StatusOr<ir::Graph> SmallGraph() {
  Builder b("f");
  Value x = b.Parameter("x", kF64, {3});
  Value n = b.Parameter("n", DType::kS32, {3});
  b.Output("vec", x * 2.0);
  b.Output("loss", ir::ReduceSum(x * ir::Convert(n, kF64), {0}));
  return b.Build();
}

TEST(GradErrors, NonScalarLoss) {
  auto f = SmallGraph();
  ASSERT_TRUE(f.ok());
  auto g = Grad(*f, {"x"});  // the first output, "vec", is not a scalar
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("must be a floating scalar"));
  EXPECT_TRUE(Grad(*f, {"x"}, "loss").ok());
}

TEST(GradErrors, UnknownLossOutput) {
  auto f = SmallGraph();
  ASSERT_TRUE(f.ok());
  auto g = Grad(*f, {"x"}, "nope");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("no output named 'nope'"));
}

TEST(GradErrors, UnknownWrt) {
  auto f = SmallGraph();
  ASSERT_TRUE(f.ok());
  auto g = Grad(*f, {"x", "w"}, "loss");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("no parameter named 'w'"));
}

TEST(GradErrors, IntegerWrt) {
  auto f = SmallGraph();
  ASSERT_TRUE(f.ok());
  auto g = Grad(*f, {"n"}, "loss");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("not floating point"));
}

TEST(GradErrors, RepeatedWrt) {
  auto f = SmallGraph();
  ASSERT_TRUE(f.ok());
  auto g = Grad(*f, {"x", "x"}, "loss");
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("listed twice"));
}

}  // namespace
}  // namespace kiln::autodiff
