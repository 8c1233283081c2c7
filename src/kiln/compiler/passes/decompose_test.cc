// The decompose pass: each composite, decomposed into primitives, must compute what the reference
// backend's composite kernel computes (f64 and f32), and the pass must preserve the graph's
// interface.
#include "kiln/compiler/passes/decompose.h"

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::compiler {
namespace {

using ir::Builder;
using ir::Opcode;
using ir::Value;

struct Input {
  std::string name;
  DType dtype;  // kF32 here means "the case's float dtype"
  Shape shape;
  double lo = -1, hi = 1;  // float range, or integer range [lo, hi)
};

struct Case {
  std::string name;
  Opcode op;
  std::vector<Input> inputs;
  std::function<Value(const std::vector<Value>&)> body;
};

std::vector<Case> Cases() {
  auto attention = [](bool causal, std::optional<double> scale) {
    return
        [=](const std::vector<Value>& p) { return ir::Attention(p[0], p[1], p[2], causal, scale); };
  };
  const DType kF = DType::kF32;
  return {
      {"softmax_last",
       Opcode::kSoftmax,
       {{"x", kF, {3, 5}, -4, 4}},
       [](const std::vector<Value>& p) { return ir::Softmax(p[0], -1); }},
      // Large logits: only a max-subtracted form stays finite in f32.
      {"softmax_large",
       Opcode::kSoftmax,
       {{"x", kF, {2, 4}, 50, 120}},
       [](const std::vector<Value>& p) { return ir::Softmax(p[0], 1); }},
      {"softmax_first",
       Opcode::kSoftmax,
       {{"x", kF, {4, 2, 3}, -2, 2}},
       [](const std::vector<Value>& p) { return ir::Softmax(p[0], 0); }},
      {"log_softmax_last",
       Opcode::kLogSoftmax,
       {{"x", kF, {3, 5}, -4, 4}},
       [](const std::vector<Value>& p) { return ir::LogSoftmax(p[0], -1); }},
      {"log_softmax_large",
       Opcode::kLogSoftmax,
       {{"x", kF, {2, 3}, 80, 120}},
       [](const std::vector<Value>& p) { return ir::LogSoftmax(p[0], 0); }},
      {"layer_norm",
       Opcode::kLayerNorm,
       {{"x", kF, {2, 3, 8}, -3, 3}, {"gamma", kF, {8}}, {"beta", kF, {8}}},
       [](const std::vector<Value>& p) { return ir::LayerNorm(p[0], p[1], p[2], 1e-5); }},
      {"layer_norm_big_eps",
       Opcode::kLayerNorm,
       {{"x", kF, {4, 3}, -0.1, 0.1}, {"gamma", kF, {3}}, {"beta", kF, {3}}},
       [](const std::vector<Value>& p) { return ir::LayerNorm(p[0], p[1], p[2], 0.5); }},
      {"rms_norm",
       Opcode::kRmsNorm,
       {{"x", kF, {3, 6}, -2, 2}, {"gamma", kF, {6}}},
       [](const std::vector<Value>& p) { return ir::RmsNorm(p[0], p[1], 1e-6); }},
      {"cross_entropy_s32",
       Opcode::kCrossEntropy,
       {{"logits", kF, {4, 7}, -5, 5}, {"labels", DType::kS32, {4}, 0, 7}},
       [](const std::vector<Value>& p) { return ir::SparseCrossEntropy(p[0], p[1]); }},
      // Labels in [-3, 10) with C = 7: some rows are out of range (ignored, loss 0).
      {"cross_entropy_ignored_rows",
       Opcode::kCrossEntropy,
       {{"logits", kF, {12, 7}, -5, 5}, {"labels", DType::kS32, {12}, -3, 10}},
       [](const std::vector<Value>& p) { return ir::SparseCrossEntropy(p[0], p[1]); }},
      {"cross_entropy_s64_large",
       Opcode::kCrossEntropy,
       {{"logits", kF, {2, 3, 5}, 60, 100}, {"labels", DType::kS64, {2, 3}, 0, 5}},
       [](const std::vector<Value>& p) { return ir::SparseCrossEntropy(p[0], p[1]); }},
      {"attention",
       Opcode::kAttention,
       {{"q", kF, {2, 3, 4}}, {"k", kF, {2, 5, 4}}, {"v", kF, {2, 5, 3}}},
       attention(false, std::nullopt)},
      {"attention_causal_square",
       Opcode::kAttention,
       {{"q", kF, {2, 2, 4, 3}}, {"k", kF, {2, 2, 4, 3}}, {"v", kF, {2, 2, 4, 2}}},
       attention(true, std::nullopt)},
      {"attention_causal_sq_lt_sk",
       Opcode::kAttention,
       {{"q", kF, {2, 3, 4}}, {"k", kF, {2, 6, 4}}, {"v", kF, {2, 6, 3}}},
       attention(true, 0.3)},
      {"attention_causal_decode",
       Opcode::kAttention,
       {{"q", kF, {1, 1, 4}}, {"k", kF, {1, 5, 4}}, {"v", kF, {1, 5, 2}}},
       attention(true, std::nullopt)},
  };
}

absl::StatusOr<ir::Graph> BuildCase(const Case& c, DType dt) {
  Builder b(c.name);
  std::vector<Value> ps;
  for (const Input& in : c.inputs)
    ps.push_back(b.Parameter(in.name, IsFloating(in.dtype) ? dt : in.dtype, in.shape));
  b.Output("y", c.body(ps));
  return b.Build();
}

std::vector<Tensor> MakeInputs(const ir::Graph& g, const Case& c, std::mt19937& rng) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Input& in = c.inputs[i];
    const ir::Type& t = g.node(g.parameters()[i]).type();
    std::vector<double> v(t.shape.num_elements());
    std::uniform_real_distribution<double> u(in.lo, in.hi);
    for (double& x : v) x = IsFloating(t.dtype) ? u(rng) : std::floor(u(rng));
    out.push_back(Tensor::FromDoubles(t.dtype, t.shape, v));
  }
  return out;
}

int CountComposites(const ir::Graph& g) {
  int n = 0;
  for (const ir::Node& node : g.nodes()) n += ir::IsComposite(node.opcode()) ? 1 : 0;
  return n;
}

class DecomposeTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<runtime::Backend> backend_ = runtime::MakeReferenceBackend();
};

TEST_P(DecomposeTest, MatchesTheCompositeOnTheReferenceBackend) {
  const DType dt = GetParam();
  const double tol = dt == DType::kF64 ? 1e-12 : 2e-5;
  std::mt19937 rng(42);
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<ir::Graph> kept = BuildCase(c, dt);
    ASSERT_TRUE(kept.ok()) << kept.status();
    ASSERT_EQ(CountComposites(*kept), 1);
    absl::StatusOr<ir::Graph> dec = DecomposeComposites(*kept);
    ASSERT_TRUE(dec.ok()) << dec.status();
    ASSERT_TRUE(ir::Verify(*dec).ok()) << ir::Verify(*dec);
    EXPECT_EQ(CountComposites(*dec), 0);

    std::vector<Tensor> inputs = MakeInputs(*kept, c, rng);
    auto e1 = backend_->Compile(*kept);
    ASSERT_TRUE(e1.ok()) << e1.status();
    auto e2 = backend_->Compile(*dec);
    ASSERT_TRUE(e2.ok()) << e2.status();
    auto want = (*e1)->Run(inputs);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*e2)->Run(inputs);
    ASSERT_TRUE(got.ok()) << got.status();
    const Tensor& w = (*want)[0];
    const Tensor& gt = (*got)[0];
    ASSERT_EQ(gt.dtype(), dt);
    ASSERT_EQ(gt.shape(), w.shape());
    int bad = 0;
    for (int64_t i = 0; i < w.num_elements(); ++i) {
      const double a = w.GetDouble(i), b = gt.GetDouble(i);
      ASSERT_TRUE(std::isfinite(b)) << "element " << i;
      if (!(std::abs(a - b) <= tol * std::max(1.0, std::abs(a))) && bad++ < 5)
        ADD_FAILURE() << "element " << i << ": composite " << a << " vs decomposed " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DecomposeTest, ::testing::Values(DType::kF64, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// Causal masking aligns the query block with the end of the keys: with q = 0 every visible key
// scores the same, so with v = I each output row is uniform over the visible keys.
TEST(Decompose, CausalMaskIsAlignedAtTheEnd) {
  Builder b("attn");
  Value q = b.Parameter("q", DType::kF64, {2, 1});
  Value k = b.Parameter("k", DType::kF64, {3, 1});
  Value v = b.Parameter("v", DType::kF64, {3, 3});
  b.Output("y", DecomposeAttention(q, k, v, /*causal=*/true, 1.0));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();
  auto backend = runtime::MakeReferenceBackend();
  auto exe = backend->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto out = (*exe)->Run({Tensor::FromVector<double>({2, 1}, {0, 0}),
                          Tensor::FromVector<double>({3, 1}, {1, 2, 3}),
                          Tensor::FromVector<double>({3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1})});
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> y = (*out)[0].ToDoubles();
  const double h = 0.5, t = 1.0 / 3;
  EXPECT_THAT(
      y, ::testing::Pointwise(::testing::DoubleNear(1e-15), std::vector<double>{h, h, 0, t, t, t}));
}

TEST(Decompose, KeepLeavesSelectedOps) {
  Builder b("g");
  Value x = b.Parameter("x", DType::kF32, {2, 3, 4});
  Value gamma = b.Parameter("gamma", DType::kF32, {4});
  Value beta = b.Parameter("beta", DType::kF32, {4});
  Value h = ir::LayerNorm(x, gamma, beta);
  b.Output("attn", ir::Attention(h, h, h, true));
  b.Output("probs", ir::Softmax(h, -1));
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok()) << g.status();

  auto kept = DecomposeComposites(*g, [](Opcode op) { return op == Opcode::kAttention; });
  ASSERT_TRUE(kept.ok()) << kept.status();
  int attention = 0, others = 0;
  for (const ir::Node& n : kept->nodes()) {
    if (n.opcode() == Opcode::kAttention)
      ++attention;
    else if (ir::IsComposite(n.opcode()))
      ++others;
  }
  EXPECT_EQ(attention, 1);
  EXPECT_EQ(others, 0);

  // Interface preserved: parameter names/indices, output names/order, graph name.
  EXPECT_EQ(kept->name(), "g");
  ASSERT_EQ(kept->parameters().size(), 3u);
  const char* names[] = {"x", "gamma", "beta"};
  for (int i = 0; i < 3; ++i) {
    const ir::Node& p = kept->node(kept->parameters()[i]);
    EXPECT_EQ(p.attr_str("name"), names[i]);
    EXPECT_EQ(p.attr_int("index"), i);
    EXPECT_EQ(p.type(), g->node(g->parameters()[i]).type());
  }
  ASSERT_EQ(kept->outputs().size(), 2u);
  EXPECT_EQ(kept->outputs()[0].name, "attn");
  EXPECT_EQ(kept->outputs()[1].name, "probs");
}

TEST(Decompose, PassReportsChanges) {
  Builder b("g");
  Value x = b.Parameter("x", DType::kF32, {2, 3});
  b.Output("y", ir::LogSoftmax(x, -1) + 1.0);
  absl::StatusOr<ir::Graph> g = b.Build();
  ASSERT_TRUE(g.ok());
  DecomposePass pass;
  EXPECT_EQ(pass.name(), "decompose");
  absl::StatusOr<bool> changed = pass.Run(*g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(CountComposites(*g), 0);
  EXPECT_TRUE(ir::Verify(*g).ok());
  changed = pass.Run(*g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);

  DecomposePass keep_all([](Opcode) { return true; });
  Builder b2("g2");
  b2.Output("y", ir::Softmax(b2.Parameter("x", DType::kF32, {3})));
  absl::StatusOr<ir::Graph> g2 = b2.Build();
  ASSERT_TRUE(g2.ok());
  changed = keep_all.Run(*g2);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(CountComposites(*g2), 1);
}

TEST(Decompose, NonCompositeNodeIsAnError) {
  Builder b("g");
  Value x = b.Parameter("x", DType::kF32, {2});
  Value y = ir::Exp(x);
  ir::Node node = b.graph().node(y.id());
  absl::StatusOr<Value> r = DecomposeNode(node, {x});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("not a composite"));
}

}  // namespace
}  // namespace kiln::compiler
