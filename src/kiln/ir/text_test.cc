// Tests for the IR text format: printer, parser and verifier (docs/ir.md).
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/op_traits.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/ir/verifier.h"

namespace kiln::ir {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Helpers

bool AttrEquals(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const auto* x = std::get_if<double>(&a)) {
    double y = std::get<double>(b);
    return std::memcmp(x, &y, sizeof y) == 0;  // bitwise: NaN payloads and -0.0 count
  }
  return a == b;
}

// Returns "" when equal, else what differs.
std::string GraphDiff(const Graph& a, const Graph& b) {
  if (a.name() != b.name()) return "name " + a.name() + " vs " + b.name();
  if (a.num_nodes() != b.num_nodes()) return "node count";
  for (int i = 0; i < a.num_nodes(); ++i) {
    const Node& x = a.node(i);
    const Node& y = b.node(i);
    std::string at = "node %" + std::to_string(i) + ": ";
    if (x.id() != y.id()) return at + "id";
    if (x.opcode() != y.opcode()) return at + "opcode";
    if (x.operands() != y.operands()) return at + "operands";
    if (x.type() != y.type())
      return at + "type " + x.type().ToString() + " vs " + y.type().ToString();
    if (x.attrs().size() != y.attrs().size()) return at + "attr count";
    for (const auto& [k, v] : x.attrs()) {
      auto it = y.attrs().find(k);
      if (it == y.attrs().end() || !AttrEquals(v, it->second)) return at + "attr " + k;
    }
    if ((x.literal() == nullptr) != (y.literal() == nullptr)) return at + "literal presence";
    if (x.literal() && !x.literal()->BitwiseEquals(*y.literal())) return at + "literal bytes";
  }
  if (a.outputs().size() != b.outputs().size()) return "output count";
  for (size_t i = 0; i < a.outputs().size(); ++i)
    if (a.outputs()[i].name != b.outputs()[i].name || a.outputs()[i].node != b.outputs()[i].node)
      return "output " + std::to_string(i);
  return "";
}

// print -> parse -> print is the identity, and the parsed graph equals the original.
void ExpectRoundTrip(const Graph& g) {
  std::string text = PrintGraph(g);
  absl::StatusOr<Graph> parsed = ParseGraph(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(GraphDiff(g, *parsed), "") << text;
  EXPECT_EQ(PrintGraph(*parsed), text);
}

Graph MustBuild(Builder& b) {
  absl::StatusOr<Graph> g = b.Build();
  KILN_CHECK_OK(g.status());
  return *std::move(g);
}

Graph MustParse(const std::string& text) {
  absl::StatusOr<Graph> g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  return g.ok() ? *std::move(g) : Graph();
}

// A graph holding one constant, built by hand (no builder needed).
Graph ConstantGraph(const Tensor& t) {
  Graph g("c");
  int id = g.AddNode(Opcode::kConstant, {}, Type{t.dtype(), t.shape()}, {},
                     std::make_shared<const Tensor>(t));
  g.AddOutput("out", id);
  return g;
}

// ---------------------------------------------------------------------------------------------
// One small graph per opcode. A new op must add a row (EveryOpcodeHasARow fails otherwise).

using GraphFn = std::function<void(Builder&)>;

Value P(Builder& b, const std::string& name, Shape s, DType t = DType::kF32) {
  return b.Parameter(name, t, std::move(s));
}

std::map<Opcode, GraphFn> OpTable() {
  Pool2dOptions pool;
  pool.window = {3, 2};
  pool.strides = {2, 1};
  pool.padding = {1, 0, 1, 1};
  pool.count_include_pad = true;
  Conv2dOptions conv;
  conv.strides = {2, 1};
  conv.padding = {1, 1, 0, 2};
  conv.dilation = {1, 2};
  conv.groups = 2;
  std::map<Opcode, GraphFn> t;
  // The plain elementwise rows of opcodes.def need no line here: each gets y = op(x) or
  // y = op(a, b) on f32[2,3] (rows below replace it where an op needs more, e.g. gelu's
  // attribute).
  for (int i = 0; i < kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    if (!OpTraits(op).plain_elementwise()) continue;
    t[op] = [op](Builder& b) {
      Value a = P(b, "a", {2, 3});
      b.Output("y", OpcodeArity(op) == 2 ? ElementwiseBinary(op, a, P(b, "b", {2, 3}))
                                         : ElementwiseUnary(op, a));
    };
  }
  t[Opcode::kAllGather] = [](Builder& b) { b.Output("y", AllGather(P(b, "x", {2, 3}), 1, 4)); };
  t[Opcode::kAllReduce] = [](Builder& b) { b.Output("y", AllReduce(P(b, "x", {2, 3}))); };
  t[Opcode::kArgmax] = [](Builder& b) { b.Output("y", ArgMax(P(b, "x", {2, 3}), -1)); };
  t[Opcode::kAttention] = [](Builder& b) {
    b.Output("y", Attention(P(b, "q", {2, 4, 8}), P(b, "k", {2, 5, 8}), P(b, "v", {2, 5, 6}), true,
                            0.125));
  };
  t[Opcode::kAvgPool2d] = [pool](Builder& b) {
    b.Output("y", AvgPool2d(P(b, "x", {1, 2, 6, 5}), pool));
  };
  t[Opcode::kAvgPool2dGrad] = [pool](Builder& b) {
    Value x = P(b, "x", {1, 2, 6, 5});
    Value y = AvgPool2d(x, pool);
    b.Output("dx", AvgPool2dGrad(P(b, "g", y.shape()), Shape{1, 2, 6, 5}, pool));
  };
  t[Opcode::kBroadcastInDim] = [](Builder& b) {
    b.Output("y", BroadcastInDim(P(b, "x", {3, 1}), Shape{2, 3, 4}, {1, 2}));
  };
  t[Opcode::kCompare] = [](Builder& b) {
    Value x = P(b, "a", {2, 3}), y = P(b, "b", {2, 3});
    b.Output("lt", Lt(x, y));
    b.Output("ge", Ge(x, y));
  };
  t[Opcode::kConcatenate] = [](Builder& b) {
    Value x = P(b, "a", {2, 3}), y = P(b, "b", {2, 1});
    b.Output("y", Concatenate({x, y, x}, -1));
  };
  t[Opcode::kConstant] = [](Builder& b) {
    b.Output("c", b.Constant(Tensor::FromVector<float>(Shape{2, 2}, {1.5f, -2.0f, 0.1f, 3e38f})));
    b.Output("s", b.Scalar(7, DType::kS32));
  };
  t[Opcode::kConv2d] = [conv](Builder& b) {
    b.Output("y", Conv2d(P(b, "x", {1, 4, 7, 6}), P(b, "w", {6, 2, 3, 2}), conv));
  };
  t[Opcode::kConv2dBackwardFilter] = [conv](Builder& b) {
    Value x = P(b, "x", {1, 4, 7, 6});
    Value y = Conv2d(x, P(b, "w", {6, 2, 3, 2}), conv);
    b.Output("dw", Conv2dBackwardFilter(x, P(b, "g", y.shape()), Shape{6, 2, 3, 2}, conv));
  };
  t[Opcode::kConv2dBackwardInput] = [conv](Builder& b) {
    Value w = P(b, "w", {6, 2, 3, 2});
    Value y = Conv2d(P(b, "x", {1, 4, 7, 6}), w, conv);
    b.Output("dx", Conv2dBackwardInput(P(b, "g", y.shape()), w, Shape{1, 4, 7, 6}, conv));
  };
  t[Opcode::kConvert] = [](Builder& b) { b.Output("y", Convert(P(b, "x", {2, 3}), DType::kBF16)); };
  t[Opcode::kCrossEntropy] = [](Builder& b) {
    b.Output("loss", SparseCrossEntropy(P(b, "logits", {4, 10}), P(b, "labels", {4}, DType::kS32)));
  };
  t[Opcode::kDotGeneral] = [](Builder& b) {
    DotDims d{{0}, {0}, {2}, {1}};
    b.Output("y", DotGeneral(P(b, "a", {2, 3, 4}), P(b, "b", {2, 4, 5}), d));
  };
  t[Opcode::kGather] = [](Builder& b) {
    b.Output("y", Gather(P(b, "table", {10, 4}), P(b, "idx", {2, 3}, DType::kS64), 0));
  };
  t[Opcode::kGelu] = [](Builder& b) {
    Value x = P(b, "x", {2, 3});
    b.Output("tanh", Gelu(x, true));
    b.Output("erf", Gelu(x, false));
  };
  t[Opcode::kIota] = [](Builder& b) { b.Output("y", b.Iota(DType::kS32, Shape{2, 3}, 1)); };
  t[Opcode::kLayerNorm] = [](Builder& b) {
    b.Output("y", LayerNorm(P(b, "x", {2, 8}), P(b, "g", {8}), P(b, "b", {8}), 1e-5));
  };
  t[Opcode::kLogSoftmax] = [](Builder& b) { b.Output("y", LogSoftmax(P(b, "x", {2, 3}), 0)); };
  t[Opcode::kLogicalAnd] = [](Builder& b) {
    b.Output("y", LogicalAnd(P(b, "a", {3}, DType::kBool), P(b, "b", {3}, DType::kBool)));
  };
  t[Opcode::kLogicalNot] = [](Builder& b) {
    b.Output("y", LogicalNot(P(b, "a", {3}, DType::kBool)));
  };
  t[Opcode::kLogicalOr] = [](Builder& b) {
    b.Output("y", LogicalOr(P(b, "a", {3}, DType::kS32), P(b, "b", {3}, DType::kS32)));
  };
  t[Opcode::kMaxPool2d] = [pool](Builder& b) {
    b.Output("y", MaxPool2d(P(b, "x", {1, 2, 6, 5}), pool));
  };
  t[Opcode::kMaxPool2dGrad] = [pool](Builder& b) {
    Value x = P(b, "x", {1, 2, 6, 5});
    Value y = MaxPool2d(x, pool);
    b.Output("dx", MaxPool2dGrad(x, P(b, "g", y.shape()), pool));
  };
  t[Opcode::kPad] = [](Builder& b) {
    b.Output("y", Pad(P(b, "x", {2, 3}), {1, 0}, {0, 2}, {1, 0}, -0.5));
  };
  t[Opcode::kParameter] = [](Builder& b) {
    P(b, "unused \"quoted\"\n", {0, 3}, DType::kU8);
    b.Output("y", P(b, "x", {}, DType::kF64));
  };
  // A scale that is not a short decimal: the text keeps every bit of it.
  t[Opcode::kQuantize] = [](Builder& b) {
    b.Output("q", Quantize(P(b, "x", {2, 3}), 0.0123456789f));
  };
  t[Opcode::kQuantizedConv2d] = [conv](Builder& b) {
    b.Output("y", QuantizedConv2d(P(b, "x", {1, 4, 6, 5}, DType::kS8),
                                  P(b, "w", {6, 2, 3, 3}, DType::kS8), P(b, "s", {6}), conv));
  };
  t[Opcode::kQuantizedDot] = [](Builder& b) {
    b.Output("y", QuantizedDot(P(b, "x", {2, 5, 3}, DType::kS8), P(b, "w", {3, 4}, DType::kS8),
                               P(b, "s", {4})));
  };
  t[Opcode::kRandomBits] = [](Builder& b) {
    Value seed = P(b, "seed", {}, DType::kS64), counter = P(b, "counter", {}, DType::kS64);
    b.Output("u", RandomBits(seed, counter, DType::kF32, Shape{2, 3}));
    b.Output("bits", RandomBits(seed, counter, DType::kS32, Shape{4}));
  };
  t[Opcode::kReduceMax] = [](Builder& b) {
    b.Output("y", ReduceMax(P(b, "x", {2, 3, 4}), {0, 2}));
  };
  t[Opcode::kReduceMin] = [](Builder& b) { b.Output("y", ReduceMin(P(b, "x", {2, 3}), {1})); };
  t[Opcode::kReduceScatter] = [](Builder& b) {
    b.Output("y", ReduceScatter(P(b, "x", {4, 3}), 0, 2));
  };
  t[Opcode::kReduceSum] = [](Builder& b) { b.Output("y", ReduceSum(P(b, "x", {2, 3}), {})); };
  t[Opcode::kReshape] = [](Builder& b) {
    b.Output("y", Reshape(P(b, "x", {2, 3}), Shape{3, 1, 2}));
  };
  t[Opcode::kRmsNorm] = [](Builder& b) {
    b.Output("y", RmsNorm(P(b, "x", {2, 8}, DType::kBF16), P(b, "g", {8}, DType::kBF16), 1e-6));
  };
  t[Opcode::kScatterAdd] = [](Builder& b) {
    b.Output("y",
             ScatterAdd(P(b, "x", {10, 4}), P(b, "idx", {3}, DType::kS32), P(b, "u", {3, 4}), 0));
  };
  t[Opcode::kSelect] = [](Builder& b) {
    b.Output("y", Select(P(b, "p", {2, 3}, DType::kBool), P(b, "a", {2, 3}), P(b, "b", {2, 3})));
  };
  t[Opcode::kSlice] = [](Builder& b) {
    b.Output("y", Slice(P(b, "x", {4, 5}), {0, 1}, {3, 5}, {2, 3}));
  };
  t[Opcode::kSoftmax] = [](Builder& b) { b.Output("y", Softmax(P(b, "x", {2, 3}))); };
  t[Opcode::kTranspose] = [](Builder& b) {
    b.Output("y", Transpose(P(b, "x", {2, 3, 4}), {2, 0, 1}));
  };
  return t;
}

Graph BuildRow(Opcode op, const GraphFn& fn) {
  Builder b(std::string(OpcodeName(op)) + "_graph");
  fn(b);
  return MustBuild(b);
}

TEST(IrTextTest, EveryOpcodeHasARow) {
  std::map<Opcode, GraphFn> table = OpTable();
  for (int i = 0; i < kNumOpcodes; ++i) {
    Opcode op = static_cast<Opcode>(i);
    EXPECT_TRUE(table.count(op)) << "no round-trip row for op " << OpcodeName(op);
  }
  EXPECT_EQ(static_cast<int>(table.size()), kNumOpcodes);
}

TEST(IrTextTest, EveryOpcodeRoundTrips) {
  for (const auto& [op, fn] : OpTable()) {
    SCOPED_TRACE(std::string(OpcodeName(op)));
    Graph g = BuildRow(op, fn);
    bool has_op = false;
    for (const Node& n : g.nodes()) has_op = has_op || n.opcode() == op;
    EXPECT_TRUE(has_op) << "the row for " << OpcodeName(op) << " does not use it";
    EXPECT_TRUE(Verify(g).ok()) << Verify(g);
    ExpectRoundTrip(g);
  }
}

TEST(IrTextTest, PrintsTheDocumentedForm) {
  Builder b("mlp");
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  Value w = b.Parameter("w", DType::kF32, {3, 4});
  b.Output("y", Relu(MatMul(x, w)));
  Graph g = MustBuild(b);
  EXPECT_EQ(PrintGraph(g),
            "graph @mlp {\n"
            "  %0 = parameter() {index=0, name=\"x\"} : f32[2,3]\n"
            "  %1 = parameter() {index=1, name=\"w\"} : f32[3,4]\n"
            "  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], "
            "rhs_contracting=[0]} : f32[2,4]\n"
            "  %3 = relu(%2) : f32[2,4]\n"
            "  return y=%3\n"
            "}\n");
}

// The example in docs/ir.md parses, and prints back exactly as written there.
TEST(IrTextTest, DocExampleIsCanonical) {
  std::string path = std::string(KILN_SOURCE_DIR) + "/docs/ir.md";
  FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr) << path;
  std::string doc;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) doc.append(buf, n);
  std::fclose(f);
  size_t start = doc.find("```\n", doc.find("## Example"));
  ASSERT_NE(start, std::string::npos);
  start += 4;
  std::string example = doc.substr(start, doc.find("```", start) - start);
  Graph g = MustParse(example);
  std::string canonical = example.substr(example.find("graph @"));  // drop the leading comment
  EXPECT_EQ(PrintGraph(g), canonical);
}

// ---------------------------------------------------------------------------------------------
// Constants

TEST(IrTextTest, ConstantsOfEveryDTypeAreBitExact) {
  std::mt19937_64 rng(42);
  for (int d = 0; d < kNumDTypes; ++d) {
    DType dt = static_cast<DType>(d);
    SCOPED_TRACE(std::string(DTypeName(dt)));
    for (int64_t n : {0, 1, 3, 17, 40}) {
      Tensor t(dt, Shape{n});
      auto* bytes = static_cast<uint8_t*>(t.raw_data());
      for (int64_t i = 0; i < t.byte_size(); ++i) bytes[i] = static_cast<uint8_t>(rng());
      if (dt == DType::kBool)
        for (int64_t i = 0; i < n; ++i) bytes[i] &= 1;
      ExpectRoundTrip(ConstantGraph(t));
      // Splat of one random element (exercises the single-number form).
      Tensor s(dt, Shape{2, n});
      for (int64_t i = 0; i < s.num_elements(); ++i)
        std::memcpy(static_cast<uint8_t*>(s.raw_data()) + i * DTypeSize(dt), bytes,
                    static_cast<size_t>(DTypeSize(dt)));
      ExpectRoundTrip(ConstantGraph(s));
    }
  }
}

TEST(IrTextTest, SpecialFloatConstants) {
  auto f32_bits = [](std::vector<uint32_t> bits) {
    Tensor t(DType::kF32, Shape{static_cast<int64_t>(bits.size())});
    std::memcpy(t.raw_data(), bits.data(), bits.size() * 4);
    return t;
  };
  // -0.0, +0, qNaN with payload, sNaN, -NaN, inf, -inf, min subnormal, max.
  Tensor t = f32_bits({0x80000000u, 0u, 0x7fc00123u, 0x7f800001u, 0xffc00000u, 0x7f800000u,
                       0xff800000u, 1u, 0x7f7fffffu});
  ExpectRoundTrip(ConstantGraph(t));
  std::vector<double> d = {-0.0, 0.1, 5e-324, 1.7976931348623157e308,
                           -std::numeric_limits<double>::infinity()};
  uint64_t payload_nan = 0xfff0000000000abcull;
  double pn;
  std::memcpy(&pn, &payload_nan, 8);
  d.push_back(pn);
  Tensor t64 = Tensor::FromVector<double>(Shape{static_cast<int64_t>(d.size())}, d);
  std::memcpy(static_cast<double*>(t64.raw_data()) + d.size() - 1, &payload_nan, 8);
  ExpectRoundTrip(ConstantGraph(t64));
  // Readable where that is exact, hex otherwise.
  EXPECT_THAT(PrintGraph(ConstantGraph(t64)),
              HasSubstr("{value=[-0.0,0.1,5e-324,1.7976931348623157e+308,-inf,"
                        "nan(0xfff0000000000abc)]} : f64[6]"));
  EXPECT_THAT(PrintGraph(ConstantGraph(t)), HasSubstr("{value=0x00000080"));
  EXPECT_THAT(PrintGraph(ConstantGraph(Tensor::FromVector<float>(Shape{}, {1.0f}))),
              HasSubstr("%0 = constant() {value=1.0} : f32[]"));
  EXPECT_THAT(PrintGraph(ConstantGraph(Tensor::FromVector<int32_t>(Shape{3}, {-1, 0, 7}))),
              HasSubstr("{value=[-1,0,7]} : s32[3]"));
  EXPECT_THAT(PrintGraph(ConstantGraph(Tensor(DType::kBF16, Shape{64, 64}))),
              HasSubstr("{value=0.0} : bf16[64,64]"));
  EXPECT_THAT(PrintGraph(ConstantGraph(Tensor::FromVector<bool>(Shape{2}, {true, false}))),
              HasSubstr("{value=[true,false]} : bool[2]"));
  EXPECT_THAT(PrintGraph(ConstantGraph(Tensor(DType::kS8, Shape{0, 3}))),
              HasSubstr("{value=[]} : s8[0,3]"));
}

TEST(IrTextTest, ReadableConstantForms) {
  Graph g = MustParse(R"(
    graph @c {
      %a = constant() {value=0x0000803f} : f32[]          # hex, little-endian
      %b = constant() {value=1} : f32[2,2]                # splat; ints allowed for floats
      %c = constant() {value=[1, 2.5, -inf, nan]} : bf16[4]
      %d = constant() {value=[true, false]} : bool[2]
      %e = constant() {value=-128} : s8[]
      %f = constant() {value=9223372036854775807} : s64[]
      return a=%a, b=%b, c=%c, d=%d, e=%e, f=%f
    })");
  ASSERT_EQ(g.num_nodes(), 6);
  EXPECT_EQ(g.node(0).literal()->data<float>()[0], 1.0f);
  EXPECT_EQ(g.node(1).literal()->ToDoubles(), (std::vector<double>{1, 1, 1, 1}));
  std::vector<double> c = g.node(2).literal()->ToDoubles();
  EXPECT_EQ(c[0], 1.0);
  EXPECT_EQ(c[1], 2.5);
  EXPECT_EQ(c[2], -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(c[3]));
  EXPECT_EQ(g.node(3).literal()->ToDoubles(), (std::vector<double>{1, 0}));
  EXPECT_EQ(g.node(4).literal()->data<int8_t>()[0], -128);
  EXPECT_EQ(g.node(5).literal()->data<int64_t>()[0], std::numeric_limits<int64_t>::max());
  ExpectRoundTrip(g);
}

// ---------------------------------------------------------------------------------------------
// Attributes, names, syntax

TEST(IrTextTest, FloatAttributesRoundTripExactly) {
  uint64_t nan_bits = 0x7ff0000000000001ull;  // signalling NaN with a payload
  double snan;
  std::memcpy(&snan, &nan_bits, 8);
  for (double v : {0.0, -0.0, 0.1, 1.0, -2.5, 1e-5, 5e-324, 1e300, 123456789012345678.0,
                   std::numeric_limits<double>::infinity(), std::nan(""), -std::nan(""), snan}) {
    Graph g("pad");
    int x = g.AddNode(Opcode::kParameter, {}, Type{DType::kF32, Shape{2}},
                      {{"index", int64_t{0}}, {"name", std::string("x")}});
    AttrMap attrs = {{"low", std::vector<int64_t>{1}},
                     {"high", std::vector<int64_t>{0}},
                     {"interior", std::vector<int64_t>{0}},
                     {"value", v}};
    int p = g.AddNode(Opcode::kPad, {x}, Type{DType::kF32, Shape{3}}, attrs);
    g.AddOutput("y", p);
    ASSERT_TRUE(Verify(g).ok()) << Verify(g);
    ExpectRoundTrip(g);
    std::string text = PrintGraph(g);
    // A float attribute never prints as an int.
    EXPECT_THAT(text, ::testing::ContainsRegex("value=(-?inf|-?nan|nan\\(0x[0-9a-f]+\\)|"
                                               "-?[0-9]+\\.[0-9]*|-?[0-9.]+e[-+][0-9]+)}"));
  }
  // An int attribute where a float is expected is still accepted (epsilon=1).
  ExpectRoundTrip(
      MustParse("graph @g { %x = parameter() {index=0, name=\"x\"} : f32[2,4]\n"
                "%g = parameter() {index=1, name=\"g\"} : f32[4]\n"
                "%y = rms_norm(%x, %g) {epsilon=1} : f32[2,4]\n return y=%y }"));
}

TEST(IrTextTest, NamesAndStringsWithOddCharacters) {
  Graph g("my model/v2 \"quoted\"");
  std::string pname = std::string("a\"b\\c\n\t\r\x01\x7f\xc3\xa9", 12);
  int x = g.AddNode(Opcode::kParameter, {}, Type{DType::kF32, Shape{2}},
                    {{"index", int64_t{0}}, {"name", pname}});
  int y = g.AddNode(Opcode::kNeg, {x}, Type{DType::kF32, Shape{2}}, {});
  g.AddOutput("out put", y);
  g.AddOutput("nan", x);  // would lex as a float if printed bare
  g.AddOutput("x.y_z", y);
  ASSERT_TRUE(Verify(g).ok()) << Verify(g);
  ExpectRoundTrip(g);
  std::string text = PrintGraph(g);
  EXPECT_THAT(text, HasSubstr("graph @\"my model/v2 \\\"quoted\\\"\" {"));
  EXPECT_THAT(text, HasSubstr("name=\"a\\\"b\\\\c\\n\\t\\r\\x01\\x7f\\xc3\\xa9\""));
  EXPECT_THAT(text, HasSubstr("return \"out put\"=%1, \"nan\"=%0, x.y_z=%1"));
}

TEST(IrTextTest, ParsesFreeFormText) {
  // Any value names, comments, free whitespace, optional types on inferred ops.
  Graph g = MustParse(R"(
// A hand-written graph.
graph @mlp {
  %x = parameter() {index=0, name="x"} : f32[2,3]   # the input
  %w = parameter() {name="w", index=1} : f32[3,4]
  %h = dot_general(%x,%w){lhs_batch=[],rhs_batch=[],lhs_contracting=[1],rhs_contracting=[0]}
  %out.1 = relu(%h) {} : f32[2,4]
  %"spaced name" = neg(%out.1)
  return y = %out.1, "z" = %"spaced name"
}  // trailing comment
)");
  ASSERT_EQ(g.num_nodes(), 5);
  EXPECT_EQ(g.name(), "mlp");
  EXPECT_EQ(g.node(2).opcode(), Opcode::kDotGeneral);
  EXPECT_EQ(g.node(2).type(), (Type{DType::kF32, Shape{2, 4}}));
  EXPECT_EQ(g.node(4).operands(), std::vector<int>{3});
  EXPECT_EQ(g.outputs()[1].name, "z");
  EXPECT_EQ(g.outputs()[1].node, 4);
  EXPECT_EQ(g.FindParameter("w"), 1);
  ExpectRoundTrip(g);
}

// ---------------------------------------------------------------------------------------------
// Malformed text

constexpr char kParam[] = "%x = parameter() {index=0, name=\"x\"} : f32[2,3]\n";

std::string Wrap(const std::string& body) {
  return "graph @g {\n" + std::string(kParam) + body + "\n}\n";
}

TEST(IrTextTest, RejectsMalformedText) {
  struct Case {
    std::string text;
    std::string error;
  };
  std::vector<Case> cases = {
      {"", "line 1, col 1: expected 'graph', got end of input"},
      {"graf @g {}", "expected 'graph', got 'graf'"},
      {"graph g {}", "expected a graph name (@name), got 'g'"},
      {"graph @g }", "expected '{', got '}'"},
      {"graph @g { }", "expected 'return' before '}'"},
      {"graph @g {\n  return\n}", "line 2, col 3: graph has no outputs"},
      {Wrap("return y=%x\n}"), "expected end of input after the graph, got '}'"},
      {std::string("graph @g {\n") + kParam + "return y=%x\n", "expected '}', got end of input"},
      {Wrap("%y = addd(%x, %x)\nreturn y=%y"), "line 3, col 6: unknown op 'addd'"},
      {Wrap("%y = add(%x, %z)\nreturn y=%y"), "line 3, col 14: use of undefined value %z"},
      {Wrap("%y = neg(%y)\nreturn y=%y"), "use of undefined value %y"},
      {Wrap("%x = neg(%x)\nreturn y=%x"), "line 3, col 1: value %x is already defined (at line 2"},
      {Wrap("%y = add(%x)\nreturn y=%y"), "add takes 2 operands, got 1"},
      {Wrap("%y = neg(%x, %x)\nreturn y=%y"), "neg takes 1 operand, got 2"},
      {Wrap("%y = concatenate() {dimension=0} : f32[1]\nreturn y=%y"),
       "concatenate takes at least 1 operand, got 0"},
      {Wrap("%y = neg(%x) : f33[2,3]\nreturn y=%y"), "unknown dtype 'f33'"},
      {Wrap("%y = neg(%x) : f32[2,-3]\nreturn y=%y"), "dimension size -3 is out of range"},
      {Wrap("%y = neg(%x) : f32[2,3\nreturn y=%y"), "expected ',' or ']', got 'return'"},
      {Wrap("%y = neg(%x) : f32\nreturn y=%y"), "expected '[' after the dtype"},
      {Wrap("%y = neg(%x) : f32[99999999,99999999,99999999]\nreturn y=%y"),
       "more than 2^48 elements"},
      {Wrap("%y = neg(%x) : f32[3,2]\nreturn y=%y"), "f32[3,2]"},
      {Wrap("%y = broadcast_in_dim(%x) {shape=[281474976710656,2,3], broadcast_dimensions=[1,2]}"
            "\nreturn y=%y"),
       "line 3, col 6: broadcast_in_dim: attribute 'shape' [281474976710656,2,3] has more than "
       "2^48 elements"},
      {Wrap("%y = reduce_sum(%x) {dimensions=[5]}\nreturn y=%y"), "line 3, col 6: reduce_sum"},
      {Wrap("%y = reduce_sum(%x) {dimensions=[1.5]}\nreturn y=%y"),
       "list elements must be integers"},
      {Wrap("%y = reduce_sum(%x) {dimensions=[1], dimensions=[0]}\nreturn y=%y"),
       "duplicate attribute 'dimensions'"},
      {Wrap("%y = neg(%x) {a=0x12}\nreturn y=%y"), "expected an integer, float, string"},
      {Wrap("%y = neg(%x) {a=}\nreturn y=%y"), "expected an attribute value"},
      {Wrap("%y = neg(%x) {a=\"abc}\nreturn y=%y"), "unterminated string"},
      {Wrap("%y = neg(%x) {a=\"\\q\"}\nreturn y=%y"), "unknown escape"},
      {Wrap("%y = neg(%x) {a=99999999999999999999}\nreturn y=%y"), "out of the int64 range"},
      {Wrap("%y = neg(%x) {a=1e999}\nreturn y=%y"), "out-of-range float"},
      {Wrap("%y = neg(%x) {a=1.5.2}\nreturn y=%y"), "malformed number"},
      {Wrap("%y = neg(%x) {a=12abc}\nreturn y=%y"), "malformed number '12abc'"},
      {Wrap("%y = neg(%x) {a=1e}\nreturn y=%y"), "expected digits in the exponent"},
      {Wrap("%y = neg(%x) ; \nreturn y=%y"), "line 3, col 14: unexpected character ';'"},
      {Wrap("%y = neg(%x)\nreturn y=%y, y=%x"), "duplicate output name 'y'"},
      {Wrap("%y = neg(%x)\nreturn \"\"=%y"), "output name must not be empty"},
      {Wrap("%y = neg(%x)\nreturn y=%q"), "use of undefined value %q"},
      {Wrap("%y = neg(%x)\nreturn y %y"), "expected '=', got '%y'"},
      {Wrap("% = neg(%x)\nreturn y=%x"), "expected a name after '%'"},
      {Wrap("%y = iota() {dimension=0}\nreturn y=%y"), "iota needs a ': type' annotation"},
      {Wrap("%c = constant() : f32[]\nreturn y=%c"), "constant needs a value attribute"},
      {Wrap("%c = constant() {value=0x0000803} : f32[]\nreturn y=%c"), "odd number of digits"},
      {Wrap("%c = constant() {value=0x00} : f32[]\nreturn y=%c"),
       "hex literal has 1 bytes, type f32[] needs 4"},
      {Wrap("%c = constant() {value=[1,2]} : f32[3]\nreturn y=%c"),
       "constant of type f32[3] needs 3 values, got 2"},
      {Wrap("%c = constant() {value=300} : u8[]\nreturn y=%c"), "300 is out of range for u8"},
      {Wrap("%c = constant() {value=1.5} : s32[]\nreturn y=%c"), "expected an integer for s32"},
      {Wrap("%c = constant() {value=1} : bool[]\nreturn y=%c"), "expected true or false for bool"},
      {Wrap("%c = constant() {value=true} : f32[]\nreturn y=%c"), "expected a number for f32"},
      {Wrap("%c = constant() {value=\"x\"} : f32[]\nreturn y=%c"), "constant value must be"},
      {Wrap("%c = constant() {value=0} : f32[100000,100000]\nreturn y=%c"), "too large"},
      {Wrap("%p = parameter() {index=1} : f32[]\nreturn y=%p"),
       "non-empty string attribute 'name'"},
      {Wrap("%p = parameter() {name=\"p\"} : f32[]\nreturn y=%p"), "integer attribute 'index'"},
      {Wrap("%p = parameter() {index=1, name=\"x\"} : f32[]\nreturn y=%p"),
       "parameter name \"x\" is already used by %0"},
      {Wrap("%p = parameter() {index=2, name=\"p\"} : f32[]\nreturn y=%p"),
       "line 3, col 6: parameter index 2 is out of range: the graph has 2 parameters"},
      {Wrap("%p = parameter() {index=0, name=\"p\"} : f32[]\nreturn y=%p"),
       "parameter index 0 is already used by %0"},
      {std::string("graph @g {\n") + kParam + "return y=%x\n} extra",
       "line 4, col 3: expected end of input after the graph, got 'extra'"},
      {std::string("graph @g {\0", 11), "unexpected character '\\x00'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Graph> g = ParseGraph(c.text);
    ASSERT_FALSE(g.ok()) << "accepted:\n" << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.error)) << c.text;
    EXPECT_THAT(std::string(g.status().message()), ::testing::StartsWith("line ")) << c.text;
  }
}

// Random mutations of valid text: the parser returns OK or an error, never crashes; anything it
// accepts is a verified graph that round-trips.
TEST(IrTextTest, FuzzedTextNeverCrashes) {
  std::vector<std::string> corpus;
  for (const auto& [op, fn] : OpTable()) corpus.push_back(PrintGraph(BuildRow(op, fn)));
  corpus.push_back(Wrap("%c = constant() {value=[1,2.5,-inf,nan]} : f32[4]\nreturn c=%c, x=%x"));
  const std::string alphabet = "%@{}[](),=:#/\"\\-.0123456789abcdefxnanitruesf32[] \n\t\x01\xff";
  std::mt19937 rng(1234);
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  int accepted = 0;
  const int kIterations = 10000;
  for (int it = 0; it < kIterations; ++it) {
    std::string text = corpus[pick(corpus.size())];
    int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      size_t pos = pick(text.size() + 1);
      switch (rng() % 6) {
        case 0:
          text.erase(pos, 1 + pick(8));
          break;  // delete a run
        case 1:
          text.insert(pos, 1, alphabet[pick(alphabet.size())]);
          break;  // insert a char
        case 2:
          if (pos < text.size()) text[pos] = alphabet[pick(alphabet.size())];
          break;
        case 3:
          text.resize(pos);
          break;   // truncate
        case 4: {  // duplicate a chunk elsewhere
          size_t from = pick(text.size() + 1);
          std::string chunk = text.substr(from, 1 + pick(30));
          text.insert(pick(text.size() + 1), chunk);
          break;
        }
        default:
          if (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])))
            text[pos] = static_cast<char>('0' + rng() % 10);  // perturb a number
          break;
      }
    }
    absl::StatusOr<Graph> g = ParseGraph(text);
    if (!g.ok()) {
      ASSERT_THAT(std::string(g.status().message()), ::testing::StartsWith("line ")) << text;
      continue;
    }
    ++accepted;
    ASSERT_TRUE(Verify(*g).ok()) << text;
    std::string printed = PrintGraph(*g);
    absl::StatusOr<Graph> again = ParseGraph(printed);
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << printed;
    ASSERT_EQ(GraphDiff(*g, *again), "") << printed;
    ASSERT_EQ(PrintGraph(*again), printed);
  }
  // Some mutations (comments, whitespace, number changes) keep the text valid.
  EXPECT_GT(accepted, kIterations / 50);
}

// ---------------------------------------------------------------------------------------------
// Verifier on hand-assembled graphs

class VerifierTest : public ::testing::Test {
 protected:
  int Param(int64_t index, const std::string& name, Type t = {DType::kF32, Shape{2}}) {
    return g_.AddNode(Opcode::kParameter, {}, t, {{"index", index}, {"name", name}});
  }
  void ExpectError(const std::string& substr) {
    absl::Status s = Verify(g_);
    ASSERT_FALSE(s.ok()) << PrintGraph(g_);
    EXPECT_THAT(std::string(s.message()), HasSubstr(substr));
  }
  Graph g_{"v"};
  const Type f2_{DType::kF32, Shape{2}};
};

TEST_F(VerifierTest, AcceptsAValidGraph) {
  int x = Param(0, "x");
  int y = Param(1, "y");
  g_.AddOutput("z", g_.AddNode(Opcode::kAdd, {x, y}, f2_, {}));
  EXPECT_TRUE(Verify(g_).ok()) << Verify(g_);
}

TEST_F(VerifierTest, OperandDefinedLater) {
  int x = Param(0, "x");
  g_.AddNode(Opcode::kNeg, {2}, f2_, {});
  g_.AddOutput("z", g_.AddNode(Opcode::kNeg, {x}, f2_, {}));
  ExpectError("node %1 (neg): operand 0 is %2, which is not defined before it");
}

TEST_F(VerifierTest, WrongOperandCount) {
  int x = Param(0, "x");
  g_.AddOutput("z", g_.AddNode(Opcode::kAdd, {x}, f2_, {}));
  ExpectError("node %1 (add): takes 2 operands, has 1");
}

TEST_F(VerifierTest, EmptyConcatenate) {
  Param(0, "x");
  g_.AddOutput("z", g_.AddNode(Opcode::kConcatenate, {}, f2_, {{"dimension", int64_t{0}}}));
  ExpectError("node %1 (concatenate): takes at least 1 operand");
}

TEST_F(VerifierTest, TypeMismatch) {
  int x = Param(0, "x");
  g_.AddOutput("z", g_.AddNode(Opcode::kNeg, {x}, Type{DType::kF32, Shape{3}}, {}));
  ExpectError("node %1 (neg)");
}

TEST_F(VerifierTest, ShapeRuleFailure) {
  int x = Param(0, "x");
  g_.AddOutput("z",
               g_.AddNode(Opcode::kReduceSum, {x}, f2_, {{"dimensions", std::vector<int64_t>{4}}}));
  ExpectError("node %1 (reduce_sum): reduce_sum");
}

TEST_F(VerifierTest, TypeTooLarge) {
  Param(0, "x", Type{DType::kF32, Shape{int64_t{1} << 30, int64_t{1} << 30}});
  g_.AddOutput("z", 0);
  ExpectError("node %0 (parameter): type f32[1073741824,1073741824] has a negative size or more");
}

TEST_F(VerifierTest, ConstantWithoutLiteral) {
  g_.AddOutput("z", g_.AddNode(Opcode::kConstant, {}, f2_, {}));
  ExpectError("node %0 (constant): constant has no literal value");
}

TEST_F(VerifierTest, ConstantLiteralTypeMismatch) {
  auto lit = std::make_shared<const Tensor>(DType::kF32, Shape{3});
  g_.AddOutput("z", g_.AddNode(Opcode::kConstant, {}, f2_, {}, lit));
  ExpectError("node %0 (constant): literal is f32[3] but the node's type is f32[2]");
}

TEST_F(VerifierTest, LiteralOnNonConstant) {
  int x = Param(0, "x");
  auto lit = std::make_shared<const Tensor>(DType::kF32, Shape{2});
  g_.AddOutput("z", g_.AddNode(Opcode::kNeg, {x}, f2_, {}, lit));
  ExpectError("node %1 (neg): only constants carry a literal value");
}

TEST_F(VerifierTest, BoolLiteralMustBeZeroOrOne) {
  auto t = std::make_shared<Tensor>(DType::kBool, Shape{2});
  t->data<uint8_t>()[1] = 2;
  g_.AddOutput("z", g_.AddNode(Opcode::kConstant, {}, Type{DType::kBool, Shape{2}}, {}, t));
  ExpectError("bool literal element 1 is byte 2");
}

TEST_F(VerifierTest, ParameterIndicesAndNames) {
  Param(0, "x");
  Param(2, "y");
  g_.AddOutput("z", 0);
  ExpectError("node %1 (parameter): parameter index 2 is out of range: the graph has 2");
}

TEST_F(VerifierTest, DuplicateParameterIndex) {
  Param(0, "x");
  Param(0, "y");
  g_.AddOutput("z", 0);
  ExpectError("node %1 (parameter): parameter index 0 is already used by %0");
}

TEST_F(VerifierTest, DuplicateParameterName) {
  Param(0, "x");
  Param(1, "x");
  g_.AddOutput("z", 0);
  ExpectError("node %1 (parameter): parameter name \"x\" is already used by %0");
}

TEST_F(VerifierTest, ParameterMissingAttributes) {
  g_.AddNode(Opcode::kParameter, {}, f2_, {{"index", int64_t{0}}});
  g_.AddOutput("z", 0);
  ExpectError("node %0 (parameter): parameter needs a string attribute 'name'");
}

TEST_F(VerifierTest, Outputs) {
  Param(0, "x");
  ExpectError("graph @v: has no outputs");
  g_.AddOutput("", 0);
  ExpectError("output 0 has an empty name");
  g_.ClearOutputs();
  g_.AddOutput("a", 0);
  g_.AddOutput("a", 0);
  ExpectError("duplicate output name \"a\"");
  g_.ClearOutputs();
  g_.AddOutput("a", 5);
  ExpectError("output \"a\" refers to %5, which does not exist");
}

// An output computed in place of a parameter prints and parses as `in_place_of %p`.
TEST(IrTextTest, InPlaceOfRoundTrips) {
  Builder b("sgd");
  Value w = b.Parameter("w", DType::kF32, {4});
  Value g = b.Parameter("g", DType::kF32, {4});
  b.Output("w_new", w - g, w);
  b.Output("g_sq", g * g);
  absl::StatusOr<Graph> graph = b.Build();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->outputs()[0].in_place_of, 0);
  EXPECT_EQ(graph->outputs()[1].in_place_of, -1);
  const std::string text = PrintGraph(*graph);
  EXPECT_THAT(text, HasSubstr("return w_new=%2 in_place_of %0, g_sq=%3"));
  absl::StatusOr<Graph> back = ParseGraph(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->outputs()[0].in_place_of, 0);
  EXPECT_EQ(back->outputs()[1].in_place_of, -1);
  EXPECT_EQ(PrintGraph(*back), text);
}

TEST(IrTextTest, InPlaceOfMustNameAParameter) {
  absl::StatusOr<Graph> g = ParseGraph(R"(graph @g {
  %0 = parameter() {index=0, name="w"} : f32[4]
  %1 = neg(%0) : f32[4]
  return y=%1 in_place_of %1
}
)");
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("in_place_of %1: not a parameter"));
  Builder b("bad");
  Value w = b.Parameter("w", DType::kF32, {4});
  b.Output("y", ir::Neg(w), ir::Neg(w));
  EXPECT_THAT(std::string(b.Build().status().message()), HasSubstr("not a parameter"));
  Builder c("bad_type");
  Value v = c.Parameter("v", DType::kF32, {4});
  c.Output("y", ir::ReduceSum(v, {0}), v);
  EXPECT_THAT(std::string(c.Build().status().message()),
              HasSubstr("is f32[] but the parameter it is in place of is f32[4]"));
}

TEST_F(VerifierTest, InPlaceOfChecked) {
  int p = g_.AddNode(Opcode::kParameter, {}, f2_, {{"index", int64_t{0}}, {"name", "p"}});
  int q = g_.AddNode(Opcode::kParameter, {}, {DType::kF32, Shape{3}},
                     {{"index", int64_t{1}}, {"name", "q"}});
  int y = g_.AddNode(Opcode::kNeg, {p}, f2_, {});
  g_.AddOutput("y", y, 7);
  ExpectError("output \"y\" in_place_of parameter index 7: no such parameter");
  g_.SetOutputInPlaceOf(0, 1);
  ExpectError("the output is f32[2], the parameter f32[3]");
  g_.SetOutputInPlaceOf(0, 0);
  g_.AddOutput("z", y, 0);
  ExpectError("output \"z\" in_place_of parameter index 0: output \"y\" is already in its place");
  g_.SetOutputInPlaceOf(1, -1);
  EXPECT_TRUE(Verify(g_).ok()) << Verify(g_);
  (void)q;
}

}  // namespace
}  // namespace kiln::ir
