// Runs the PyTorch goldens of tests/golden/ (format: tests/golden/README.md) through Kiln: each op
// case is rebuilt with the builder from its metadata and run forward on the reference backend
// (and the cpu backend when it is built); gradients come from autodiff::Grad of
// sum(y * cot) and are compared with PyTorch's. The two model cases are rebuilt by hand from the
// architecture their metadata describes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/opcode.h"
#include "kiln/runtime/executable.h"
#include "kiln/runtime/reference/reference_backend.h"
#include "kiln/tensor/safetensors.h"
#include "nlohmann/json.hpp"
#ifdef KILN_HAVE_CPU_BACKEND
#include "kiln/runtime/cpu/cpu_backend.h"
#include "tests/support/pass_sweep.h"
#endif

namespace kiln {
namespace {

using json = nlohmann::json;
using ir::Builder;
using ir::Value;

const std::string kGoldenDir = std::string(KILN_SOURCE_DIR) + "/tests/golden";

// Ops with no golden (tests/golden/README.md says why).
// int8 ops: Kiln's own symmetric semantics (docs/ops.md), checked against hand-computed values in
// runtime/cpu/quantized_test.cc instead.
const std::set<std::string> kNoGolden = {
    "parameter",  "constant",       "iota",     "random_bits",   "all_reduce",
    "all_gather", "reduce_scatter", "quantize", "quantized_dot", "quantized_conv2d"};

// Ops whose golden has gradients that Kiln's autodiff does not implement yet (Grad returns
// Unimplemented). Their forward is still checked; when a VJP lands, the test says to drop the
// entry.
const std::set<std::string> kKnownMissingVjp = {
    "max_pool2d_grad",  // double backward through max_pool2d
};

std::vector<std::string> GoldenCases() {
  std::vector<std::string> cases;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kGoldenDir, ec)) {
    if (e.path().extension() == ".safetensors") cases.push_back(e.path().stem().string());
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

struct Golden {
  std::map<std::string, Tensor> tensors;
  json desc;

  const Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      ADD_FAILURE() << "golden has no tensor " << name;
      static const Tensor kEmpty;
      return kEmpty;
    }
    return it->second;
  }
  double tol(const char* key) const { return desc.at(key).get<double>(); }
};

absl::StatusOr<Golden> LoadGolden(const std::string& name) {
  Golden g;
  std::map<std::string, std::string> meta;
  KILN_ASSIGN_OR_RETURN(g.tensors,
                        ReadSafetensors(kGoldenDir + "/" + name + ".safetensors", &meta));
  auto it = meta.find("kiln_golden");
  if (it == meta.end()) return absl::DataLossError(name + ": no kiln_golden metadata");
  g.desc = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!g.desc.is_object() || g.desc.value("format", "") != "kiln-golden-v1")
    return absl::DataLossError(name + ": bad kiln_golden metadata");
  return g;
}

absl::StatusOr<ir::AttrMap> AttrsFromJson(const json& j) {
  ir::AttrMap attrs;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const json& v = it.value();
    if (v.is_number_integer()) {
      attrs[it.key()] = v.get<int64_t>();
    } else if (v.is_number_float()) {
      attrs[it.key()] = v.get<double>();
    } else if (v.is_string()) {
      attrs[it.key()] = v.get<std::string>();
    } else if (v.is_array()) {
      std::vector<int64_t> ints;
      for (const json& e : v) {
        if (!e.is_number_integer()) return absl::InvalidArgumentError("bad list attr " + it.key());
        ints.push_back(e.get<int64_t>());
      }
      attrs[it.key()] = std::move(ints);
    } else {
      return absl::InvalidArgumentError("bad attr " + it.key());
    }
  }
  return attrs;
}

// The builder's numpy-broadcasting binary functions, for "broadcast": "numpy" cases.
Value BroadcastingBinary(const std::string& op, Value a, Value b) {
  if (op == "add") return ir::Add(a, b);
  if (op == "sub") return ir::Sub(a, b);
  if (op == "mul") return ir::Mul(a, b);
  if (op == "div") return ir::Div(a, b);
  if (op == "pow") return ir::Pow(a, b);
  if (op == "max") return ir::Max(a, b);
  if (op == "min") return ir::Min(a, b);
  ADD_FAILURE() << "no broadcasting builder function for " << op;
  return a;
}

// Compares `got` with `want`: |got - want| <= atol + rtol * |want| elementwise; NaN and infinities
// must match exactly. Returns "" on success, else a message with the first few mismatches.
// *usage receives the largest |got - want| / allowance seen (for tuning tolerances).
std::string Compare(const Tensor& got, const Tensor& want, double rtol, double atol,
                    double* usage) {
  std::ostringstream err;
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    err << "type " << got.TypeString() << " != golden " << want.TypeString();
    return err.str();
  }
  int bad = 0;
  double max_diff = 0;
  *usage = 0;
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    const double g = got.GetDouble(i), w = want.GetDouble(i);
    bool ok;
    if (std::isnan(w) || std::isinf(w)) {
      ok = std::isnan(w) ? std::isnan(g) : g == w;
    } else {
      const double diff = std::fabs(g - w), allowance = atol + rtol * std::fabs(w);
      ok = diff <= allowance;  // false for a NaN result
      max_diff = std::max(max_diff, diff);
      if (allowance > 0) *usage = std::max(*usage, diff / allowance);
    }
    if (!ok && ++bad <= 5) err << "  [" << i << "] got " << g << " want " << w << "\n";
  }
  if (bad == 0) return "";
  std::ostringstream head;
  head << bad << " of " << got.num_elements() << " elements out of tolerance (rtol " << rtol
       << ", atol " << atol << "; max |diff| " << max_diff << "):\n"
       << err.str();
  return head.str();
}

struct BackendUnderTest {
  std::string name;
  std::unique_ptr<runtime::Backend> backend;
};

std::vector<BackendUnderTest> Backends() {
  std::vector<BackendUnderTest> out;
  out.push_back({"reference", runtime::MakeReferenceBackend()});
#ifdef KILN_HAVE_CPU_BACKEND
  // With the pipeline options of the CTest pass sweeps (tests/support/pass_sweep.h).
  out.push_back({"cpu", runtime::MakeCpuBackend(testing::SweepCpuOptions())});
#endif
  return out;
}

#ifdef KILN_HAVE_CPU_BACKEND
// A sweep entry (golden_test_without_<pass>) really runs without its pass.
TEST(GoldenPassSweep, TheSweepReachesTheBackend) {
  for (BackendUnderTest& b : Backends())
    if (b.name == "cpu") EXPECT_TRUE(testing::SweepReaches(*b.backend));
}
#endif

// One graph output to check against one golden tensor.
struct Expectation {
  std::string output;  // graph output
  std::string golden;  // golden tensor name
  bool is_grad;
};

// Compiles `graph` on each backend, runs it on `inputs` (by parameter name), and checks each
// expectation with the golden's forward or gradient tolerance.
void RunAndCheck(const Golden& g, const ir::Graph& graph,
                 const std::map<std::string, Tensor>& inputs,
                 const std::vector<Expectation>& expected) {
  for (BackendUnderTest& b : Backends()) {
    SCOPED_TRACE("backend " + b.name);
    absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = b.backend->Compile(graph);
    ASSERT_TRUE(exe.ok()) << exe.status();
    absl::StatusOr<std::map<std::string, Tensor>> outs = (*exe)->RunNamed(inputs);
    ASSERT_TRUE(outs.ok()) << outs.status();
    for (const Expectation& e : expected) {
      auto it = outs->find(e.output);
      ASSERT_NE(it, outs->end()) << "graph has no output " << e.output;
      const double rtol = g.tol(e.is_grad ? "grad_rtol" : "rtol");
      const double atol = g.tol(e.is_grad ? "grad_atol" : "atol");
      double usage = 0;
      std::string msg = Compare(it->second, g.at(e.golden), rtol, atol, &usage);
      if (std::getenv("KILN_GOLDEN_VERBOSE") != nullptr) {
        std::printf("  %-32s %-16s on %-9s uses %.3g of its tolerance\n",
                    g.desc.at("case").get<std::string>().c_str(), e.golden.c_str(), b.name.c_str(),
                    usage);
      }
      EXPECT_TRUE(msg.empty()) << e.golden << " on " << b.name << ": " << msg;
    }
  }
}

// ---- op cases ----

std::vector<int64_t> AllDims(Value v) {
  std::vector<int64_t> all(v.rank());
  for (int i = 0; i < v.rank(); ++i) all[i] = i;
  return all;
}

void RunOpCase(const Golden& g) {
  const json& d = g.desc;
  const std::string op = d.at("op").get<std::string>();
  std::optional<ir::Opcode> opcode = ir::OpcodeFromName(op);
  ASSERT_TRUE(opcode.has_value()) << "unknown op " << op;
  absl::StatusOr<ir::AttrMap> attrs = AttrsFromJson(d.at("attrs"));
  ASSERT_TRUE(attrs.ok()) << attrs.status();
  const std::vector<std::string> operands = d.at("operands").get<std::vector<std::string>>();
  const std::vector<std::string> grads = d.at("grads").get<std::vector<std::string>>();
  const Tensor& y_golden = g.at("out.y");

  Builder b(d.at("case").get<std::string>());
  std::vector<Value> args;
  std::map<std::string, Tensor> inputs;
  for (const std::string& name : operands) {
    const Tensor& t = g.at("in." + name);
    args.push_back(b.Parameter(name, t.dtype(), t.shape()));
    inputs[name] = t;
  }
  Value y;
  if (d.at("broadcast").get<std::string>() == "numpy") {
    ASSERT_EQ(args.size(), 2u);
    y = BroadcastingBinary(op, args[0], args[1]);
  } else {
    std::optional<ir::Type> declared;
    if (*opcode == ir::Opcode::kConvert) declared = ir::Type{y_golden.dtype(), y_golden.shape()};
    y = b.AddNode(*opcode, args, *attrs, declared);
  }
  b.Output("y", y);
  std::vector<Expectation> expected = {{"y", "out.y", false}};
  if (!grads.empty()) {
    const Tensor& cot = g.at("cot.y");
    Value c = b.Parameter("cot", cot.dtype(), cot.shape());
    inputs["cot"] = cot;
    b.Output("loss", ir::ReduceSum(y * c, AllDims(y)));
    for (const std::string& n : grads) expected.push_back({"grad/" + n, "grad." + n, true});
  }
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok()) << f.status();
  {
    SCOPED_TRACE("forward");
    RunAndCheck(g, *f, inputs, {expected[0]});
  }
  if (grads.empty()) return;
  SCOPED_TRACE("gradient");
  absl::StatusOr<ir::Graph> graph = autodiff::Grad(*f, grads, "loss");
  if (kKnownMissingVjp.count(op)) {
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kUnimplemented)
        << op << " now has a VJP: remove it from kKnownMissingVjp so its gradient is checked";
    return;
  }
  ASSERT_TRUE(graph.ok()) << graph.status();
  expected.erase(expected.begin());
  RunAndCheck(g, *graph, inputs, expected);
}

// ---- model cases ----

// Parameters for every in.<name> tensor, in file order of `names`.
std::map<std::string, Value> ModelParams(Builder& b, const Golden& g,
                                         const std::vector<std::string>& names,
                                         std::map<std::string, Tensor>* inputs) {
  std::map<std::string, Value> p;
  for (const std::string& n : names) {
    const Tensor& t = g.at("in." + n);
    p[n] = b.Parameter(n, t.dtype(), t.shape());
    (*inputs)[n] = t;
  }
  return p;
}

void RunMlp(const Golden& g, Builder& b, std::map<std::string, Tensor>* inputs) {
  std::vector<std::string> names = g.desc.at("inputs").get<std::vector<std::string>>();
  for (const auto& n : g.desc.at("params")) names.push_back(n.get<std::string>());
  std::map<std::string, Value> p = ModelParams(b, g, names, inputs);
  Value h = ir::Relu(ir::MatMul(p["x"], p["w1"]) + p["b1"]);
  h = ir::Relu(ir::MatMul(h, p["w2"]) + p["b2"]);
  Value logits = ir::MatMul(h, p["w3"]) + p["b3"];
  b.Output("logits", logits);
  b.Output("loss", ir::Mean(ir::SparseCrossEntropy(logits, p["labels"]), {0}));
}

void RunTransformerBlock(const Golden& g, Builder& b, std::map<std::string, Tensor>* inputs) {
  const json& a = g.desc.at("architecture");
  const int64_t batch = a.at("batch"), seq = a.at("seq"), dm = a.at("d_model"),
                heads = a.at("heads"), dh = a.at("head_dim");
  const double eps = a.at("layer_norm_epsilon");
  std::vector<std::string> names = {"x"};
  for (const auto& n : g.desc.at("params")) names.push_back(n.get<std::string>());
  std::map<std::string, Value> p = ModelParams(b, g, names, inputs);
  const Tensor& cot_t = g.at("cot.y");
  Value cot = b.Parameter("cot", cot_t.dtype(), cot_t.shape());
  (*inputs)["cot"] = cot_t;

  auto split = [&](Value t) {
    return ir::Transpose(ir::Reshape(t, Shape{batch, seq, heads, dh}), {0, 2, 1, 3});
  };
  Value x = p["x"];
  Value h = ir::LayerNorm(x, p["ln1.gamma"], p["ln1.beta"], eps);
  Value q = split(ir::MatMul(h, p["attn.wq"]) + p["attn.bq"]);
  Value k = split(ir::MatMul(h, p["attn.wk"]) + p["attn.bk"]);
  Value v = split(ir::MatMul(h, p["attn.wv"]) + p["attn.bv"]);
  Value att = ir::Attention(q, k, v, /*causal=*/true, 1.0 / std::sqrt(static_cast<double>(dh)));
  att = ir::Reshape(ir::Transpose(att, {0, 2, 1, 3}), Shape{batch, seq, dm});
  Value x1 = x + (ir::MatMul(att, p["attn.wo"]) + p["attn.bo"]);
  Value h2 = ir::LayerNorm(x1, p["ln2.gamma"], p["ln2.beta"], eps);
  Value m =
      ir::MatMul(ir::Gelu(ir::MatMul(h2, p["mlp.w1"]) + p["mlp.b1"], /*tanh=*/true), p["mlp.w2"]) +
      p["mlp.b2"];
  Value y = x1 + m;
  b.Output("y", y);
  b.Output("loss", ir::Mean(y * cot, AllDims(y)));
}

void RunModelCase(const Golden& g) {
  const std::string model = g.desc.at("model").get<std::string>();
  Builder b(model);
  std::map<std::string, Tensor> inputs;
  if (model == "mlp") {
    RunMlp(g, b, &inputs);
  } else if (model == "transformer_block") {
    RunTransformerBlock(g, b, &inputs);
  } else {
    FAIL() << "unknown model " << model;
  }
  absl::StatusOr<ir::Graph> f = b.Build();
  ASSERT_TRUE(f.ok()) << f.status();
  const std::vector<std::string> grads = g.desc.at("grads").get<std::vector<std::string>>();
  absl::StatusOr<ir::Graph> graph = autodiff::Grad(*f, grads, g.desc.at("loss").get<std::string>());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::vector<Expectation> expected;
  for (const auto& o : g.desc.at("outputs")) {
    const std::string n = o.get<std::string>();
    expected.push_back({n, "out." + n, false});
  }
  for (const std::string& n : grads) expected.push_back({"grad/" + n, "grad." + n, true});
  RunAndCheck(g, *graph, inputs, expected);
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesPyTorch) {
  absl::StatusOr<Golden> g = LoadGolden(GetParam());
  ASSERT_TRUE(g.ok()) << g.status();
  if (g->desc.at("kind") == "model") {
    RunModelCase(*g);
  } else {
    RunOpCase(*g);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenTest, ::testing::ValuesIn(GoldenCases()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Guards against a vacuous pass (goldens missing from the checkout) and against an op added to
// opcodes.def without a golden or a reason.
TEST(GoldenCoverageTest, EveryOpHasAGoldenOrAReason) {
  std::set<std::string> covered;
  int models = 0;
  for (const std::string& c : GoldenCases()) {
    absl::StatusOr<Golden> g = LoadGolden(c);
    ASSERT_TRUE(g.ok()) << g.status();
    if (g->desc.at("kind") == "op") {
      covered.insert(g->desc.at("op").get<std::string>());
    } else {
      ++models;
    }
  }
  EXPECT_EQ(models, 2);
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    const std::string name(ir::OpcodeName(static_cast<ir::Opcode>(i)));
    EXPECT_TRUE(covered.count(name) || kNoGolden.count(name))
        << name << " has no golden: add one to tests/golden/gen_goldens.py or say why not";
    EXPECT_FALSE(covered.count(name) && kNoGolden.count(name)) << name;
  }
}

}  // namespace
}  // namespace kiln
