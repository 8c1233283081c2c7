#include "kiln/ir/builder.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::ir {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

const Node& N(Value v) { return v.builder()->graph().node(v.id()); }
const Node& Operand(Value v, int i) { return v.builder()->graph().node(N(v).operand(i)); }
int Count(const Builder& b, Opcode op) {
  int n = 0;
  for (const Node& node : b.graph().nodes()) n += node.opcode() == op;
  return n;
}

TEST(BuilderTest, HeaderExampleBuilds) {
  Builder b("mlp");
  Value x = b.Parameter("x", DType::kF32, {32, 64});
  Value w = b.Parameter("w", DType::kF32, {64, 10});
  Value y = Relu(MatMul(x, w) + 1.0f);
  b.Output("loss", ReduceSum(y, {0, 1}));
  absl::StatusOr<Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "mlp");
  ASSERT_EQ(g->outputs().size(), 1u);
  EXPECT_EQ(g->node(g->outputs()[0].node).type(), (Type{DType::kF32, Shape{}}));
  EXPECT_THAT(g->parameters(), ElementsAre(0, 1));
  EXPECT_EQ(g->node(1).attr_int("index"), 1);
  EXPECT_EQ(g->node(1).attr_str("name"), "w");
  // Every operand precedes its user.
  for (const Node& n : g->nodes())
    for (int op : n.operands()) EXPECT_LT(op, n.id());
  // The builder is empty again and reusable.
  EXPECT_EQ(b.graph().num_nodes(), 0);
  EXPECT_EQ(b.Parameter("z", DType::kF32, {1}).id(), 0);
  EXPECT_EQ(N(b.Parameter("z2", DType::kF32, {1})).attr_int("index"), 1);
}

TEST(BuilderTest, BroadcastsOnlyTheOperandThatDiffers) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  Value v = b.Parameter("v", DType::kF32, {3});
  Value y = x + v;
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_EQ(N(y).opcode(), Opcode::kAdd);
  EXPECT_EQ(N(y).operand(0), x.id());  // x untouched
  const Node& bc = Operand(y, 1);
  EXPECT_EQ(bc.opcode(), Opcode::kBroadcastInDim);
  EXPECT_EQ(bc.attr_ints("shape"), (Ints{2, 3}));
  EXPECT_EQ(bc.attr_ints("broadcast_dimensions"), (Ints{1}));
  EXPECT_EQ(bc.operand(0), v.id());
  // Same shapes: no broadcast at all.
  int before = Count(b, Opcode::kBroadcastInDim);
  Value z = x * x;
  EXPECT_EQ(Count(b, Opcode::kBroadcastInDim), before);
  EXPECT_EQ(N(z).operands(), (std::vector<int>{x.id(), x.id()}));
  EXPECT_TRUE(b.status().ok());
}

TEST(BuilderTest, BroadcastsBothSides) {
  Builder b;
  Value col = b.Parameter("col", DType::kF32, {4, 1, 3});
  Value row = b.Parameter("row", DType::kF32, {2, 1});
  Value y = Sub(col, row);
  EXPECT_EQ(y.shape(), (Shape{4, 2, 3}));
  const Node& l = Operand(y, 0);
  const Node& r = Operand(y, 1);
  EXPECT_EQ(l.opcode(), Opcode::kBroadcastInDim);
  EXPECT_EQ(l.attr_ints("broadcast_dimensions"), (Ints{0, 1, 2}));  // size-1 dim stretches
  EXPECT_EQ(r.attr_ints("broadcast_dimensions"), (Ints{1, 2}));
  EXPECT_EQ(r.attr_ints("shape"), (Ints{4, 2, 3}));
}

TEST(BuilderTest, IncompatibleBroadcastNamesBothShapes) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  Value v = b.Parameter("v", DType::kF32, {4});
  Value y = x + v;
  EXPECT_FALSE(y.valid());
  EXPECT_EQ(b.status().message(), "add: cannot broadcast f32[2,3] with f32[4]");
}

TEST(BuilderTest, DTypeMismatchIsAnError) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2});
  Value i = b.Parameter("i", DType::kS32, {2});
  EXPECT_FALSE(Mul(x, i).valid());
  EXPECT_EQ(b.status().message(), "mul: operand dtypes differ: f32[2] vs s32[2]");
}

TEST(BuilderTest, ScalarOperatorsUseTheValueDType) {
  Builder b;
  Value x = b.Parameter("x", DType::kBF16, {2, 2});
  Value y = 1.0 - x * 2.0;
  ASSERT_TRUE(b.status().ok()) << b.status();
  EXPECT_EQ(y.type(), (Type{DType::kBF16, Shape{2, 2}}));
  EXPECT_EQ(N(y).opcode(), Opcode::kSub);
  // Left operand of the sub is the broadcast scalar 1.
  const Node& one_bc = Operand(y, 0);
  ASSERT_EQ(one_bc.opcode(), Opcode::kBroadcastInDim);
  EXPECT_EQ(one_bc.attr_ints("broadcast_dimensions"), Ints{});
  const Node& one = b.graph().node(one_bc.operand(0));
  ASSERT_EQ(one.opcode(), Opcode::kConstant);
  EXPECT_EQ(one.type(), (Type{DType::kBF16, Shape{}}));
  EXPECT_EQ(one.literal()->GetDouble(0), 1.0);
  // Right operand is x * 2.
  const Node& mul = Operand(y, 1);
  EXPECT_EQ(mul.opcode(), Opcode::kMul);
  EXPECT_EQ(mul.operand(0), x.id());
  const Node& two = b.graph().node(b.graph().node(mul.operand(1)).operand(0));
  EXPECT_EQ(two.literal()->GetDouble(0), 2.0);

  Value i = b.Parameter("i", DType::kS32, {3});
  Value j = i / 2.0;
  EXPECT_EQ(j.dtype(), DType::kS32);
  EXPECT_EQ(N(-i).opcode(), Opcode::kNeg);
  EXPECT_EQ(N(2.0 + i).opcode(), Opcode::kAdd);
  EXPECT_EQ(N(i - 1.0).opcode(), Opcode::kSub);
  EXPECT_EQ(N(3.0 * i).opcode(), Opcode::kMul);
  EXPECT_EQ(N(8.0 / i).opcode(), Opcode::kDiv);
  EXPECT_TRUE(b.status().ok());
}

TEST(BuilderTest, FirstErrorSticks) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  Value bad = Reshape(x, {7});
  EXPECT_FALSE(bad.valid());
  EXPECT_EQ(bad.builder(), &b);
  EXPECT_EQ(bad.type(), (Type{DType::kF32, Shape{}}));  // safe placeholder type
  absl::Status first = b.status();
  EXPECT_THAT(std::string(first.message()), HasSubstr("reshape: cannot reshape f32[2,3]"));
  int nodes = b.graph().num_nodes();
  // Later ops, valid or not, add nothing and keep the first error.
  Value y = Exp(x);
  Value z = MatMul(bad, bad) + 1.0;
  Value w = Transpose(x, {5, 5});
  EXPECT_FALSE(y.valid());
  EXPECT_FALSE(z.valid());
  EXPECT_FALSE(w.valid());
  EXPECT_FALSE(b.Parameter("p", DType::kF32, {1}).valid());
  b.Output("out", y);
  EXPECT_EQ(b.graph().num_nodes(), nodes);
  EXPECT_EQ(b.status(), first);
  absl::StatusOr<Graph> g = b.Build();
  EXPECT_EQ(g.status(), first);
  // Build() resets the builder.
  EXPECT_TRUE(b.status().ok());
}

TEST(BuilderTest, InvalidOperandsAreErrors) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2});
  EXPECT_FALSE(Add(x, Value()).valid());
  EXPECT_EQ(b.status().message(), "add: operand 1 is not a valid value");

  Builder b2, b3;
  Value p = b2.Parameter("p", DType::kF32, {2});
  Value q = b3.Parameter("q", DType::kF32, {2});
  EXPECT_FALSE(Add(p, q).valid());
  EXPECT_THAT(std::string(b2.status().message()), HasSubstr("another builder"));
  // Operations on values no builder owns do nothing and do not crash.
  EXPECT_FALSE(Exp(Value()).valid());
  EXPECT_FALSE(Concatenate({}, 0).valid());
}

TEST(BuilderTest, ParametersAndOutputs) {
  Builder b;
  b.Parameter("x", DType::kF32, {2});
  EXPECT_FALSE(b.Parameter("x", DType::kF32, {2}).valid());
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("duplicate parameter name 'x'"));

  Builder c;
  Value y = c.Parameter("y", DType::kF32, {2});
  c.Output("o", y);
  c.Output("o", y);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("duplicate output name 'o'"));
}

TEST(BuilderTest, MatMulVariants) {
  Builder b;
  auto P = [&](const char* name, Shape s) { return b.Parameter(name, DType::kF32, s); };
  auto dims = [](Value v) {
    const Node& n = N(v);
    return std::vector<Ints>{n.attr_ints("lhs_batch"), n.attr_ints("rhs_batch"),
                             n.attr_ints("lhs_contracting"), n.attr_ints("rhs_contracting")};
  };
  Value m = MatMul(P("a", {2, 3}), P("b", {3, 4}));
  EXPECT_EQ(m.shape(), (Shape{2, 4}));
  EXPECT_EQ(dims(m), (std::vector<Ints>{{}, {}, {1}, {0}}));

  Value batched = MatMul(P("c", {5, 2, 3}), P("d", {5, 3, 4}));
  EXPECT_EQ(batched.shape(), (Shape{5, 2, 4}));
  EXPECT_EQ(dims(batched), (std::vector<Ints>{{0}, {0}, {2}, {1}}));

  // Rank-2 rhs: shared weights, no batch dims and no broadcast.
  int bcasts = Count(b, Opcode::kBroadcastInDim);
  Value proj = MatMul(P("e", {2, 7, 3}), P("f", {3, 4}));
  EXPECT_EQ(proj.shape(), (Shape{2, 7, 4}));
  EXPECT_EQ(dims(proj), (std::vector<Ints>{{}, {}, {2}, {0}}));
  EXPECT_EQ(Count(b, Opcode::kBroadcastInDim), bcasts);

  // Vectors follow numpy.
  EXPECT_EQ(MatMul(P("g", {3}), P("h", {3, 4})).shape(), (Shape{4}));
  EXPECT_EQ(MatMul(P("i", {2, 3}), P("j", {3})).shape(), (Shape{2}));
  EXPECT_EQ(MatMul(P("k", {3}), P("l", {3})).shape(), (Shape{}));
  EXPECT_EQ(MatMul(P("k2", {3}), P("l2", {6, 3, 4})).shape(), (Shape{6, 4}));

  // Batch dims broadcast: the rank-2 lhs is broadcast over rhs's batch.
  Value bb = MatMul(P("m", {2, 3}), P("n", {5, 3, 4}));
  EXPECT_EQ(bb.shape(), (Shape{5, 2, 4}));
  EXPECT_EQ(Operand(bb, 0).opcode(), Opcode::kBroadcastInDim);
  EXPECT_EQ(Operand(bb, 1).opcode(), Opcode::kParameter);
  ASSERT_TRUE(b.status().ok()) << b.status();

  Builder e;
  Value bad =
      MatMul(e.Parameter("a", DType::kF32, {2, 2, 3}), e.Parameter("b", DType::kF32, {3, 3, 4}));
  EXPECT_FALSE(bad.valid());
  EXPECT_EQ(e.status().message(), "matmul: batch dims do not broadcast: f32[2,2,3] and f32[3,3,4]");

  Builder k;
  MatMul(k.Parameter("a", DType::kF32, {2, 3}), k.Parameter("b", DType::kF32, {4, 5}));
  EXPECT_EQ(k.status().message(),
            "dot_general: contracting dimension sizes differ: lhs f32[2,3] dim 1 is 3, rhs "
            "f32[4,5] dim 0 is 4");

  Builder s;
  MatMul(s.Scalar(1.0, DType::kF32), s.Parameter("b", DType::kF32, {4, 5}));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("matmul: operands must have rank >= 1"));
}

TEST(BuilderTest, NegativeAxesAreNormalized) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3, 4});
  EXPECT_EQ(N(ReduceSum(x, {-1, 0})).attr_ints("dimensions"), (Ints{0, 2}));
  EXPECT_EQ(N(ReduceMax(x, {-2})).attr_ints("dimensions"), (Ints{1}));
  EXPECT_EQ(N(Softmax(x)).attr_int("axis"), 2);
  EXPECT_EQ(N(LogSoftmax(x, -3)).attr_int("axis"), 0);
  EXPECT_EQ(N(ArgMax(x, -1)).attr_int("axis"), 2);
  EXPECT_EQ(N(Concatenate({x, x}, -1)).attr_int("dimension"), 2);
  Value t = Transpose(x, {-1, 0, 1});
  EXPECT_EQ(N(t).attr_ints("permutation"), (Ints{2, 0, 1}));
  EXPECT_EQ(t.shape(), (Shape{4, 2, 3}));
  Value idx = b.Parameter("idx", DType::kS32, {5});
  EXPECT_EQ(N(Gather(x, idx, -1)).attr_int("axis"), 2);
  EXPECT_EQ(N(AllGather(x, -1, 2)).attr_int("dimension"), 2);
  EXPECT_EQ(N(b.Iota(DType::kS32, {3, 4}, -1)).attr_int("dimension"), 1);
  ASSERT_TRUE(b.status().ok()) << b.status();
  ReduceSum(x, {-4});
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("reduce_sum"));
}

TEST(BuilderTest, MeanDividesByCount) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3, 4});
  Value m = Mean(x, {0, -1});
  ASSERT_TRUE(m.valid()) << b.status();
  EXPECT_EQ(m.shape(), (Shape{3}));
  EXPECT_EQ(N(m).opcode(), Opcode::kDiv);
  EXPECT_EQ(Operand(m, 0).opcode(), Opcode::kReduceSum);
  const Node& count = b.graph().node(Operand(m, 1).operand(0));
  EXPECT_EQ(count.literal()->GetDouble(0), 8.0);
}

TEST(BuilderTest, ShapeHelpers) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {2, 3, 4});
  EXPECT_EQ(Reshape(x, {-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_EQ(Reshape(x, {2, 3, 4}).id(), x.id());  // no-op
  EXPECT_EQ(Transpose(x, {0, 1, 2}).id(), x.id());
  EXPECT_EQ(Convert(x, DType::kF32).id(), x.id());
  EXPECT_EQ(Convert(x, DType::kBF16).dtype(), DType::kBF16);
  EXPECT_EQ(BroadcastTo(x, {5, 2, 3, 4}).shape(), (Shape{5, 2, 3, 4}));
  EXPECT_EQ(BroadcastInDim(b.Parameter("v", DType::kF32, {3}), {2, 3}, {-1}).shape(),
            (Shape{2, 3}));
  Value s = Slice(x, {0, 1, 0}, {2, 3, 4});
  EXPECT_EQ(N(s).attr_ints("stride"), (Ints{1, 1, 1}));
  EXPECT_EQ(s.shape(), (Shape{2, 2, 4}));
  Value p = Pad(x, {0, 1, 0}, {0, 0, 2});
  EXPECT_EQ(N(p).attr_ints("interior"), (Ints{0, 0, 0}));
  EXPECT_EQ(p.shape(), (Shape{2, 4, 6}));
  ASSERT_TRUE(b.status().ok()) << b.status();
  BroadcastTo(x, {3, 4});
  EXPECT_EQ(b.status().message(),
            "broadcast_in_dim: cannot broadcast f32[2,3,4] to [3,4] (numpy rules)");
}

TEST(BuilderTest, AttributesMapDirectly) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {1, 2, 8, 8});
  EXPECT_EQ(N(Gelu(x, true)).attr_str("approximate"), "tanh");
  EXPECT_EQ(N(Gelu(x)).attr_str("approximate"), "none");
  const char* dirs[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  Value cmp[] = {Eq(x, x), Ne(x, x), Lt(x, x), Le(x, x), Gt(x, x), Ge(x, x)};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(N(cmp[i]).attr_str("direction"), dirs[i]);
    EXPECT_EQ(cmp[i].dtype(), DType::kBool);
  }
  Pool2dOptions po;
  po.window = {3, 3};
  po.strides = {1, 1};
  po.padding = {1, 1, 1, 1};
  po.count_include_pad = true;
  const Node& avg = N(AvgPool2d(x, po));
  EXPECT_EQ(avg.attr_int("count_include_pad"), 1);
  EXPECT_EQ(avg.attr_ints("window"), (Ints{3, 3}));
  EXPECT_FALSE(N(MaxPool2d(x, po)).has_attr("count_include_pad"));
  Value pooled = MaxPool2d(x);
  EXPECT_EQ(pooled.shape(), (Shape{1, 2, 4, 4}));
  EXPECT_EQ(MaxPool2dGrad(x, pooled, {}).shape(), (Shape{1, 2, 8, 8}));
  EXPECT_EQ(AvgPool2dGrad(pooled, {1, 2, 8, 8}, {}).shape(), (Shape{1, 2, 8, 8}));

  Conv2dOptions co;
  co.padding = {1, 1, 1, 1};
  co.groups = 2;
  Value w = b.Parameter("w", DType::kF32, {4, 1, 3, 3});
  Value y = Conv2d(x, w, co);
  EXPECT_EQ(y.shape(), (Shape{1, 4, 8, 8}));
  EXPECT_EQ(N(y).attr_int("groups"), 2);
  EXPECT_EQ(N(y).attr_ints("padding"), (Ints{1, 1, 1, 1}));
  EXPECT_EQ(Conv2dBackwardInput(y, w, {1, 2, 8, 8}, co).shape(), (Shape{1, 2, 8, 8}));
  EXPECT_EQ(Conv2dBackwardFilter(x, y, {4, 1, 3, 3}, co).shape(), (Shape{4, 1, 3, 3}));
  ASSERT_TRUE(b.status().ok()) << b.status();
}

TEST(BuilderTest, Composites) {
  Builder b;
  Value q = b.Parameter("q", DType::kF32, {2, 5, 16});
  Value k = b.Parameter("k", DType::kF32, {2, 7, 16});
  Value v = b.Parameter("v", DType::kF32, {2, 7, 8});
  Value a = Attention(q, k, v, /*causal=*/true);
  EXPECT_EQ(a.shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(N(a).attr_int("causal"), 1);
  EXPECT_DOUBLE_EQ(N(a).attr_float("scale"), 0.25);
  EXPECT_DOUBLE_EQ(N(Attention(q, k, v, false, 0.5)).attr_float("scale"), 0.5);

  Value g = b.Parameter("g", DType::kF32, {16});
  EXPECT_DOUBLE_EQ(N(LayerNorm(q, g, g)).attr_float("epsilon"), 1e-5);
  EXPECT_DOUBLE_EQ(N(RmsNorm(q, g, 1e-3)).attr_float("epsilon"), 1e-3);
  Value labels = b.Parameter("labels", DType::kS32, {2, 5});
  Value ce = SparseCrossEntropy(q, labels);
  EXPECT_EQ(N(ce).opcode(), Opcode::kCrossEntropy);
  EXPECT_EQ(ce.shape(), (Shape{2, 5}));
  Type qt = q.type();  // copy: references into the graph move when nodes are added
  EXPECT_EQ(AllReduce(q).type(), qt);
  EXPECT_EQ(ReduceScatter(q, 1, 5).shape(), (Shape{2, 1, 16}));
  ASSERT_TRUE(b.status().ok()) << b.status();
}

TEST(BuilderTest, Dropout) {
  Builder b;
  Value x = b.Parameter("x", DType::kF32, {4, 4});
  Value seed = b.Parameter("seed", DType::kS64, {});
  Value ctr = b.Parameter("ctr", DType::kS64, {});
  EXPECT_EQ(Dropout(x, 0.0, seed, ctr).id(), x.id());
  Value d = Dropout(x, 0.25, seed, ctr);
  ASSERT_TRUE(d.valid()) << b.status();
  EXPECT_EQ(d.type(), x.type());
  EXPECT_EQ(N(d).opcode(), Opcode::kSelect);
  const Node& keep = Operand(d, 0);
  EXPECT_EQ(keep.opcode(), Opcode::kCompare);
  EXPECT_EQ(keep.attr_str("direction"), "ge");
  const Node& bits = b.graph().node(keep.operand(0));
  EXPECT_EQ(bits.opcode(), Opcode::kRandomBits);
  EXPECT_EQ(bits.type(), (Type{DType::kF32, Shape{4, 4}}));
  const Node& scaled = Operand(d, 1);
  EXPECT_EQ(scaled.opcode(), Opcode::kDiv);
  EXPECT_DOUBLE_EQ(
      b.graph().node(b.graph().node(scaled.operand(1)).operand(0)).literal()->GetDouble(0), 0.75);
  Dropout(x, 1.0, seed, ctr);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("dropout: rate must be in [0, 1)"));
}

TEST(BuilderTest, ConstantsAndIota) {
  Builder b;
  Tensor t = Tensor::FromVector<float>(Shape{3}, {1, 2, 3});
  Value c = b.Constant(t);
  EXPECT_EQ(c.type(), (Type{DType::kF32, Shape{3}}));
  EXPECT_EQ(N(c).literal()->raw_data(), t.raw_data());  // held, not copied
  Value s = b.Scalar(7, DType::kS64);
  EXPECT_EQ(N(s).literal()->GetDouble(0), 7.0);
  EXPECT_EQ(s.type(), (Type{DType::kS64, Shape{}}));
  Value i = b.Iota(DType::kF32, {2, 3}, 0);
  EXPECT_EQ(N(i).attr_int("dimension"), 0);
  Value sel = Select(Gt(c, b.Scalar(1.5, DType::kF32)), c, b.Scalar(0, DType::kF32));
  EXPECT_EQ(sel.shape(), (Shape{3}));
  ASSERT_TRUE(b.status().ok()) << b.status();
  b.Iota(DType::kF32, {2}, 1);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("iota"));
}

}  // namespace
}  // namespace kiln::ir
