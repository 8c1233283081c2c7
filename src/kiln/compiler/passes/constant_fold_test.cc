// Constant folding: IR-text cases for the pass, and the values it folds to (the reference kernels'
// EvaluateNode on standalone tensors) checked bit for bit against the reference backend running
// the graph, for every op and dtype of the folding subset.
#include "kiln/compiler/passes/constant_fold.h"

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/eval/kernels.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/op_traits.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;
using testing::ExpectRewrite;
using testing::ExpectUnchanged;

TEST(ConstantFold, FoldsChainsInOneRun) {
  ConstantFoldPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[]
      %a = constant() {value=2.0} : f32[]
      %b = constant() {value=3.0} : f32[]
      %s = add(%a, %b)
      %n = neg(%s)
      %d = div(%n, %b)
      %y = mul(%x, %d)
      return y=%y
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[]
      %1 = constant() {value=-1.6666666} : f32[]
      %2 = mul(%0, %1)
      return y=%2
    })");
}

TEST(ConstantFold, IntegersWrapLikeTheBackends) {
  ConstantFoldPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %a = constant() {value=[100,-128,7]} : s8[3]
      %b = constant() {value=[100,-1,0]} : s8[3]
      %s = add(%a, %b)
      %d = div(%a, %b)
      return s=%s, d=%d
    })",
                R"(
    graph @g {
      %0 = constant() {value=[-56,127,7]} : s8[3]
      %1 = constant() {value=[1,-128,-1]} : s8[3]
      return s=%0, d=%1
    })");
}

TEST(ConstantFold, BroadcastsAndIotaAreEvaluatedButNotMaterialized) {
  ConstantFoldPass pass;
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,2]
      %1 = constant() {value=2.0} : f32[]
      %2 = broadcast_in_dim(%1) {broadcast_dimensions=[], shape=[2,2]}
      %3 = add(%0, %2)
      %4 = iota() {dimension=1} : s32[2,3]
      return y=%3, i=%4
    })");
  ExpectRewrite(pass, R"(
    graph @g {
      %c2 = constant() {value=2.0} : f32[]
      %c3 = constant() {value=3.0} : f32[]
      %b2 = broadcast_in_dim(%c2) {broadcast_dimensions=[], shape=[2,2]}
      %b3 = broadcast_in_dim(%c3) {broadcast_dimensions=[], shape=[2,2]}
      %s = add(%b2, %b3)
      %i = iota() {dimension=1} : s32[2,3]
      %one = constant() {value=1} : s32[]
      %ob = broadcast_in_dim(%one) {broadcast_dimensions=[], shape=[2,3]}
      %m = compare(%i, %ob) {direction="ge"}
      %r = reduce_sum(%i) {dimensions=[0]}
      return s=%s, m=%m, r=%r
    })",
                R"(
    graph @g {
      %0 = constant() {value=5.0} : f32[2,2]
      %1 = constant() {value=[false,true,true,false,true,true]} : bool[2,3]
      %2 = constant() {value=[0,2,4]} : s32[3]
      return s=%0, m=%1, r=%2
    })");
}

TEST(ConstantFold, StructuralOps) {
  ConstantFoldPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %c = constant() {value=[1,2,3,4,5,6]} : f32[2,3]
      %t = transpose(%c) {permutation=[1,0]}
      %r = reshape(%c) {shape=[3,2]}
      %s = slice(%c) {limit=[2,3], start=[0,1], stride=[1,2]}
      %k = concatenate(%s, %s) {dimension=1}
      %v = convert(%k) : s32[2,2]
      return t=%t, r=%r, v=%v
    })",
                R"(
    graph @g {
      %0 = constant() {value=[1.0,4.0,2.0,5.0,3.0,6.0]} : f32[3,2]
      %1 = constant() {value=[1.0,2.0,3.0,4.0,5.0,6.0]} : f32[3,2]
      %2 = constant() {value=[2,2,5,5]} : s32[2,2]
      return t=%0, r=%1, v=%2
    })");
}

TEST(ConstantFold, LeavesNonConstantUnsupportedAndLargeAlone) {
  ConstantFoldPass pass(/*max_elements=*/4);
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = constant() {value=[1,2]} : f32[2]
      %2 = add(%0, %1)
      %3 = constant() {value=[1,2,3,4]} : f32[2,2]
      %4 = dot_general(%3, %3) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %5 = constant() {value=[1,2,3,4,5,6,7,8]} : f32[8]
      %6 = neg(%5)
      %7 = constant() {value=3} : s64[]
      %8 = random_bits(%7, %7) : f32[2]
      return a=%2, b=%4, c=%6, d=%8
    })");
}

TEST(ConstantFold, ConvertsFromStorageTypes) {
  ConstantFoldPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %c = constant() {value=[1.5,-3,500]} : f8e4m3[3]
      %f = convert(%c) : f32[3]
      %h = convert(%f) : f8e5m2[3]
      return f=%f, h=%h
    })",
                R"(
    graph @g {
      %0 = constant() {value=[1.5,-3.0,448.0]} : f32[3]
      %1 = constant() {value=[1.5,-3.0,448.0]} : f8e5m2[3]
      return f=%0, h=%1
    })");
}

// ----------------------------------------------------------------------------------------------
// The evaluator against the reference backend, bit for bit.

std::vector<double> Values(DType t, int64_t n, std::mt19937& rng) {
  static const double kSpecial[] = {0.0,
                                    -0.0,
                                    1.0,
                                    -1.0,
                                    0.5,
                                    2.5,
                                    -2.5,
                                    3.0,
                                    100.0,
                                    1e30,
                                    -1e-30,
                                    448.0,
                                    1e5,
                                    3e9,
                                    -7.25,
                                    1e-8,
                                    std::numeric_limits<double>::infinity(),
                                    -std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::quiet_NaN()};
  std::vector<double> v(n);
  std::uniform_real_distribution<double> u(-4, 4);
  std::uniform_int_distribution<int> pick(0, std::size(kSpecial) - 1);
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::kBool) {
      v[i] = rng() % 2;
    } else if (IsInteger(t)) {
      int64_t big[] = {0,
                       1,
                       -1,
                       2,
                       3,
                       7,
                       -128,
                       127,
                       255,
                       100,
                       -100,
                       1 << 20,
                       std::numeric_limits<int32_t>::min(),
                       std::numeric_limits<int64_t>::max()};
      v[i] = static_cast<double>(rng() % 3 == 0 ? big[rng() % std::size(big)]
                                                : static_cast<int64_t>(rng() % 9) - 4);
    } else {
      v[i] = rng() % 3 == 0 ? kSpecial[pick(rng)] : u(rng);
    }
  }
  return v;
}

Tensor Random(DType t, const Shape& s, std::mt19937& rng) {
  if (IsInteger(t) && t != DType::kS64) {
    // Integers wrap into range, as the runtime would store them.
    Tensor x(DType::kS64, s);
    std::vector<double> v = Values(t, s.num_elements(), rng);
    for (int64_t i = 0; i < s.num_elements(); ++i)
      x.data<int64_t>()[i] = static_cast<int64_t>(v[i]);
    Tensor y(t, s);
    for (int64_t i = 0; i < s.num_elements(); ++i) {
      int64_t w = x.data<int64_t>()[i];
      if (t == DType::kS8) y.data<int8_t>()[i] = static_cast<int8_t>(w);
      if (t == DType::kU8) y.data<uint8_t>()[i] = static_cast<uint8_t>(w);
      if (t == DType::kS32) y.data<int32_t>()[i] = static_cast<int32_t>(w);
    }
    return y;
  }
  if (t == DType::kS64) {
    Tensor y(t, s);
    std::vector<double> v = Values(t, s.num_elements(), rng);
    for (int64_t i = 0; i < s.num_elements(); ++i)
      y.data<int64_t>()[i] = static_cast<int64_t>(v[i]);
    return y;
  }
  return Tensor::FromDoubles(t, s, Values(t, s.num_elements(), rng));
}

struct EvalCase {
  Opcode op;
  std::vector<ir::Type> inputs;
  ir::AttrMap attrs;
  std::optional<ir::Type> declared;
};

std::string Describe(const EvalCase& c) {
  std::string s(ir::OpcodeName(c.op));
  for (const ir::Type& t : c.inputs) s += " " + t.ToString();
  if (c.declared) s += " -> " + c.declared->ToString();
  for (const auto& [k, v] : c.attrs)
    if (const auto* str = std::get_if<std::string>(&v)) s += " " + k + "=" + *str;
  return s;
}

std::vector<EvalCase> EvalCases() {
  const Shape s{3, 4};
  auto ty = [&](DType t) { return ir::Type{t, s}; };
  const DType kFloats[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};
  const DType kInts[] = {DType::kS8, DType::kU8, DType::kS32, DType::kS64};
  const DType kAll[] = {DType::kF32,    DType::kBF16, DType::kF16, DType::kF8E4M3,
                        DType::kF8E5M2, DType::kF64,  DType::kS8,  DType::kU8,
                        DType::kS32,    DType::kS64,  DType::kBool};
  std::vector<EvalCase> cases;
  for (Opcode op : {Opcode::kAbs, Opcode::kCos, Opcode::kErf, Opcode::kExp, Opcode::kGelu,
                    Opcode::kLog, Opcode::kNeg, Opcode::kRelu, Opcode::kRsqrt, Opcode::kSigmoid,
                    Opcode::kSign, Opcode::kSilu, Opcode::kSin, Opcode::kSqrt, Opcode::kTanh}) {
    ir::AttrMap attrs;
    if (op == Opcode::kGelu) attrs["approximate"] = std::string("none");
    for (DType t : kFloats) cases.push_back({op, {ty(t)}, attrs, {}});
    if (op == Opcode::kAbs || op == Opcode::kNeg || op == Opcode::kRelu || op == Opcode::kSign)
      for (DType t : kInts) cases.push_back({op, {ty(t)}, {}, {}});
  }
  cases.push_back({Opcode::kGelu, {ty(DType::kF32)}, {{"approximate", std::string("tanh")}}, {}});
  for (Opcode op : {Opcode::kAdd, Opcode::kSub, Opcode::kMul, Opcode::kDiv, Opcode::kPow,
                    Opcode::kMax, Opcode::kMin}) {
    for (DType t : kFloats) cases.push_back({op, {ty(t), ty(t)}, {}, {}});
    for (DType t : kInts) cases.push_back({op, {ty(t), ty(t)}, {}, {}});
  }
  for (const char* d : {"eq", "ne", "lt", "le", "gt", "ge"})
    for (DType t : {DType::kF32, DType::kBF16, DType::kS32, DType::kU8, DType::kBool})
      cases.push_back({Opcode::kCompare, {ty(t), ty(t)}, {{"direction", std::string(d)}}, {}});
  for (DType t : {DType::kBool, DType::kS32}) {
    cases.push_back({Opcode::kLogicalAnd, {ty(t), ty(t)}, {}, {}});
    cases.push_back({Opcode::kLogicalOr, {ty(t), ty(t)}, {}, {}});
    cases.push_back({Opcode::kLogicalNot, {ty(t)}, {}, {}});
  }
  for (DType t : {DType::kF32, DType::kS8, DType::kBF16})
    cases.push_back({Opcode::kSelect, {ty(DType::kBool), ty(t), ty(t)}, {}, {}});
  for (DType from : kAll)
    for (DType to : kAll) cases.push_back({Opcode::kConvert, {ty(from)}, {}, ty(to)});
  for (DType t : {DType::kF32, DType::kS8, DType::kF16, DType::kBool}) {
    cases.push_back(
        {Opcode::kTranspose, {ty(t)}, {{"permutation", std::vector<int64_t>{1, 0}}}, {}});
    cases.push_back({Opcode::kReshape, {ty(t)}, {{"shape", std::vector<int64_t>{2, 6}}}, {}});
    cases.push_back({Opcode::kSlice,
                     {ty(t)},
                     {{"start", std::vector<int64_t>{1, 0}},
                      {"limit", std::vector<int64_t>{3, 4}},
                      {"stride", std::vector<int64_t>{1, 3}}},
                     {}});
    cases.push_back({Opcode::kBroadcastInDim,
                     {ir::Type{t, Shape{3, 1}}},
                     {{"shape", std::vector<int64_t>{2, 3, 4}},
                      {"broadcast_dimensions", std::vector<int64_t>{1, 2}}},
                     {}});
    cases.push_back(
        {Opcode::kConcatenate, {ty(t), ir::Type{t, Shape{3, 2}}}, {{"dimension", int64_t{1}}}, {}});
  }
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kS32, DType::kU8})
    cases.push_back({Opcode::kIota, {}, {{"dimension", int64_t{1}}}, ir::Type{t, Shape{2, 3, 4}}});
  for (Opcode op : {Opcode::kReduceSum, Opcode::kReduceMax, Opcode::kReduceMin}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF64, DType::kS8, DType::kS64})
      for (auto dims :
           {std::vector<int64_t>{0}, std::vector<int64_t>{1}, std::vector<int64_t>{0, 1}})
        cases.push_back({op, {ty(t)}, {{"dimensions", dims}}, {}});
  }
  return cases;
}

TEST(ConstantFoldEvaluator, MatchesReferenceBackendBitForBit) {
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  std::mt19937 rng(1234);
  int checked = 0;
  for (const EvalCase& c : EvalCases()) {
    SCOPED_TRACE(Describe(c));
    ir::Builder b("eval");
    std::vector<ir::Value> operands;
    std::vector<Tensor> literals;
    for (const ir::Type& t : c.inputs) {
      literals.push_back(Random(t.dtype, t.shape, rng));
      operands.push_back(b.Constant(literals.back()));
    }
    b.Output("y", b.AddNode(c.op, operands, c.attrs, c.declared));
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    auto exe = ref->Compile(*g);
    ASSERT_TRUE(exe.ok()) << exe.status();
    auto want = (*exe)->Run({});
    ASSERT_TRUE(want.ok()) << want.status();

    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : literals) ptrs.push_back(&t);
    const ir::Node& node = g->node(g->outputs()[0].node);
    ASSERT_TRUE(ir::OpTraits(node.opcode()).constant_foldable());
    absl::StatusOr<Tensor> got = eval::EvaluateNode(node, ptrs);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->BitwiseEquals((*want)[0])) << "first difference at element " << [&] {
      for (int64_t i = 0; i < got->num_elements(); ++i)
        if (!(got->GetDouble(i) == (*want)[0].GetDouble(i))) return i;
      return int64_t{-1};
    }();
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

TEST(ConstantFoldEvaluator, RejectsDtypesTheReferenceRejects) {
  // The verifier already rejects these graphs; the kernels refuse them on their own as well, so
  // the folder leaves such nodes alone.
  Tensor s32(DType::kS32, Shape{2}), f8(DType::kF8E4M3, Shape{2}), b(DType::kBool, Shape{2});
  ir::Node exp_s32(1, Opcode::kExp, {0}, {DType::kS32, Shape{2}}, {});
  ir::Node exp_f8(1, Opcode::kExp, {0}, {DType::kF8E4M3, Shape{2}}, {});
  ir::Node add_bool(1, Opcode::kAdd, {0, 0}, {DType::kBool, Shape{2}}, {});
  ir::Node dot(1, Opcode::kDotGeneral, {0, 0}, {DType::kS32, Shape{}}, {});
  using eval::EvaluateNode;
  EXPECT_EQ(EvaluateNode(exp_s32, {&s32}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvaluateNode(exp_f8, {&f8}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvaluateNode(add_bool, {&b, &b}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvaluateNode(add_bool, {&b, nullptr}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EvaluateNode(add_bool, {&b}).status().code(), absl::StatusCode::kInvalidArgument);
  // dot_general is not a kFold row: the folder never asks, whatever the kernel would say.
  EXPECT_FALSE(ir::OpTraits(dot.opcode()).constant_foldable());
}

}  // namespace
}  // namespace kiln::compiler
