// The GPT model against a plain-PyTorch GPT-2 (Hugging Face modeling_gpt2 semantics): weights by
// Hugging Face name, logits, loss and gradients from testdata/gpt_tiny_golden.safetensors, which
// testdata/gen_gpt_golden.py writes (run it with /usr/bin/python3 to regenerate).
#include "kiln/nn/gpt.h"

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/autodiff/grad.h"
#include "kiln/ir/printer.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"
#include "kiln/tensor/safetensors.h"

namespace kiln::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const GptConfig kTiny = {
    .vocab_size = 50, .context = 16, .dim = 32, .layers = 2, .heads = 2, .seq_len = 12};

std::map<std::string, Tensor> LoadGolden() {
  auto t = ReadSafetensors(std::string(KILN_SOURCE_DIR) +
                           "/src/kiln/nn/testdata/gpt_tiny_golden.safetensors");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : std::map<std::string, Tensor>{};
}

// The golden file's model weights (everything not under "golden.").
std::map<std::string, Tensor> Weights(const std::map<std::string, Tensor>& golden) {
  std::map<std::string, Tensor> w;
  for (const auto& [name, t] : golden) {
    if (!absl::StartsWith(name, "golden.")) w[name] = t;
  }
  return w;
}

void ExpectNear(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  double worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double d = std::abs(got.GetDouble(i) - want.GetDouble(i));
    if (d > worst) worst = d, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": worst element " << at << " got " << got.GetDouble(at)
                        << " want " << want.GetDouble(at);
}

std::vector<std::unique_ptr<runtime::Backend>> Backends() {
  std::vector<std::unique_ptr<runtime::Backend>> out;
  out.push_back(runtime::MakeReferenceBackend());
  out.push_back(runtime::MakeCpuBackend());
  return out;
}

TEST(Gpt, ParameterNamesAndLayoutsAreHuggingFaces) {
  Gpt gpt({.vocab_size = 50, .context = 16, .dim = 32, .layers = 1, .heads = 2});
  ASSERT_TRUE(gpt.Validate().ok());
  std::vector<std::string> names;
  std::vector<std::string> shapes;
  for (const ParamSpec& s : gpt.Params()) {
    names.push_back(s.name);
    shapes.push_back(s.shape.ToString());
  }
  EXPECT_THAT(names,
              ElementsAre("transformer.wte.weight", "transformer.wpe.weight",
                          "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                          "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                          "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias",
                          "transformer.h.0.ln_2.weight", "transformer.h.0.ln_2.bias",
                          "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
                          "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias",
                          "transformer.ln_f.weight", "transformer.ln_f.bias"));
  EXPECT_THAT(shapes, ElementsAre("[50,32]", "[16,32]", "[32]", "[32]", "[32,96]", "[96]",
                                  "[32,32]", "[32]", "[32]", "[32]", "[32,128]", "[128]",
                                  "[128,32]", "[32]", "[32]", "[32]"));
}

TEST(Gpt, InitializationFollowsHuggingFace) {
  Gpt gpt({.vocab_size = 64, .context = 32, .dim = 64, .layers = 8, .heads = 4});
  auto p = InitParams(gpt.Params(), 5);
  ASSERT_TRUE(p.ok()) << p.status();
  auto stddev = [&](const std::string& name) {
    std::vector<double> v = p->Find(name)->ToDoubles();
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / v.size());
  };
  EXPECT_NEAR(stddev("transformer.wte.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.3.attn.c_attn.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.3.mlp.c_proj.weight"), 0.02 / std::sqrt(16.0), 0.0003);
  EXPECT_EQ(stddev("transformer.h.3.mlp.c_fc.bias"), 0.0);
  EXPECT_THAT(p->Find("transformer.ln_f.weight")->ToDoubles(), ::testing::Each(1.0));
}

TEST(Gpt, LogitsLossAndGradientsMatchPyTorchGpt2) {
  const std::map<std::string, Tensor> golden = LoadGolden();
  ASSERT_FALSE(golden.empty());
  Gpt gpt(kTiny);
  auto params = gpt.ImportHuggingFace(Weights(golden));
  ASSERT_TRUE(params.ok()) << params.status();
  const Tensor tokens = golden.at("golden.tokens").ConvertTo(DType::kS32);
  const Tensor targets = golden.at("golden.targets").ConvertTo(DType::kS32);

  auto predict = gpt.PredictGraph(2);
  ASSERT_TRUE(predict.ok()) << predict.status();
  auto loss_graph = gpt.LossGraph(2);
  ASSERT_TRUE(loss_graph.ok()) << loss_graph.status();
  auto grad_graph =
      autodiff::Grad(*loss_graph, {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"});
  ASSERT_TRUE(grad_graph.ok()) << grad_graph.status();

  for (const auto& backend : Backends()) {
    SCOPED_TRACE(backend->name());
    std::vector<Tensor> inputs;
    for (int i = 0; i < params->size(); ++i) inputs.push_back(params->value(i));
    inputs.push_back(tokens);
    auto exe = backend->Compile(*predict);
    ASSERT_TRUE(exe.ok()) << exe.status();
    auto out = (*exe)->Run(inputs);
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectNear((*out)[0], golden.at("golden.logits"), 1e-4, "logits");

    inputs.push_back(targets);
    auto gexe = backend->Compile(*grad_graph);
    ASSERT_TRUE(gexe.ok()) << gexe.status();
    auto gout = (*gexe)->Run(inputs);
    ASSERT_TRUE(gout.ok()) << gout.status();
    ExpectNear((*gout)[0], golden.at("golden.loss"), 1e-5, "loss");
    // The tied embedding's gradient sums the lookup's and the LM head's.
    ExpectNear((*gout)[1], golden.at("golden.grad.transformer.wte.weight"), 1e-5, "grad wte");
    ExpectNear((*gout)[2], golden.at("golden.grad.transformer.h.0.attn.c_attn.weight"), 1e-5,
               "grad c_attn");
  }
}

TEST(Gpt, ImportHuggingFaceAcceptsGpt2ModelNamesAndRejectsMismatches) {
  const std::map<std::string, Tensor> golden = LoadGolden();
  ASSERT_FALSE(golden.empty());
  Gpt gpt(kTiny);
  // GPT2Model files drop "transformer."; GPT2LMHeadModel state dicts carry lm_head.weight and
  // (older versions) the causal-mask buffers.
  std::map<std::string, Tensor> hf;
  for (const auto& [name, t] : Weights(golden))
    hf[name.substr(std::string("transformer.").size())] = t;
  hf["lm_head.weight"] = golden.at("transformer.wte.weight");
  hf["h.0.attn.bias"] = Tensor(DType::kBool, Shape{1, 1, 16, 16});
  hf["h.0.attn.masked_bias"] = Tensor(DType::kF32, Shape{});
  auto p = gpt.ImportHuggingFace(hf);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Find("transformer.h.1.mlp.c_fc.weight")
                  ->BitwiseEquals(golden.at("transformer.h.1.mlp.c_fc.weight")));

  std::map<std::string, Tensor> missing = hf;
  missing.erase("ln_f.bias");
  EXPECT_THAT(std::string(gpt.ImportHuggingFace(missing).status().message()),
              HasSubstr("transformer.ln_f.bias"));
  std::map<std::string, Tensor> extra = hf;
  extra["h.2.ln_1.weight"] = Tensor(DType::kF32, Shape{32});
  EXPECT_THAT(std::string(gpt.ImportHuggingFace(extra).status().message()),
              HasSubstr("h.2.ln_1.weight"));
  Gpt wider({.vocab_size = 50, .context = 16, .dim = 64, .layers = 2, .heads = 2});
  EXPECT_EQ(wider.ImportHuggingFace(hf).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Gpt, ExportHuggingFaceRoundTrips) {
  const std::map<std::string, Tensor> golden = LoadGolden();
  ASSERT_FALSE(golden.empty());
  Gpt gpt(kTiny);
  auto params = gpt.ImportHuggingFace(Weights(golden));
  ASSERT_TRUE(params.ok()) << params.status();
  const std::string dir = ::testing::TempDir();
  ASSERT_TRUE(gpt.ExportHuggingFace(*params, dir).ok());
  std::map<std::string, std::string> meta;
  auto back = ReadSafetensors(dir + "/model.safetensors", &meta);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(meta["format"], "pt");
  EXPECT_EQ(back->size(), static_cast<size_t>(params->size()));
  auto again = gpt.ImportHuggingFace(*back);
  ASSERT_TRUE(again.ok()) << again.status();
  for (int i = 0; i < params->size(); ++i) {
    EXPECT_TRUE(again->value(i).BitwiseEquals(params->value(i))) << params->names()[i];
  }
  EXPECT_THAT(gpt.HuggingFaceConfigJson(), HasSubstr("\"n_embd\": 32,"));
  EXPECT_THAT(gpt.HuggingFaceConfigJson(), HasSubstr("\"activation_function\": \"gelu_new\""));
  ParamStore partial;
  EXPECT_FALSE(gpt.ExportHuggingFace(partial, dir).ok());
}

TEST(Gpt, ValidateAndGraphSignatures) {
  EXPECT_FALSE(
      Gpt({.vocab_size = 50, .context = 16, .dim = 30, .layers = 1, .heads = 4}).Validate().ok());
  EXPECT_FALSE(
      Gpt({.vocab_size = 50, .context = 16, .dim = 32, .layers = 1, .heads = 2, .seq_len = 17})
          .LossGraph(1)
          .ok());
  Gpt gpt({.vocab_size = 50, .context = 16, .dim = 32, .layers = 1, .heads = 2, .dropout = 0.1});
  auto eval = gpt.LossGraph(3);
  auto train = gpt.TrainLossGraph(3);
  ASSERT_TRUE(eval.ok() && train.ok());
  auto last_inputs = [](const ir::Graph& g, int n) {
    std::vector<std::string> names;
    std::vector<int> ps = g.parameters();
    for (size_t i = ps.size() - n; i < ps.size(); ++i)
      names.push_back(g.node(ps[i]).attr_str("name"));
    return names;
  };
  EXPECT_THAT(last_inputs(*eval, 2), ElementsAre("tokens", "targets"));
  EXPECT_THAT(last_inputs(*train, 4), ElementsAre("tokens", "targets", "rng/seed", "rng/step"));
  EXPECT_EQ(eval->node(eval->parameters().back()).type().ToString(), "s32[3,16]");
}

// Dropout masks are a function of (seed, step): a run resumed at step t matches the
// uninterrupted one bit for bit, and training with dropout still lowers the loss.
TEST(Gpt, TrainingWithDropoutIsReproducibleAcrossAResume) {
  Gpt gpt({.vocab_size = 16, .context = 8, .dim = 16, .layers = 1, .heads = 2, .dropout = 0.2});
  auto loss = gpt.TrainLossGraph(2);
  ASSERT_TRUE(loss.ok()) << loss.status();
  auto init = InitParams(gpt.Params(), 3);
  ASSERT_TRUE(init.ok());
  std::vector<int32_t> seq(16);
  for (int i = 0; i < 16; ++i) seq[i] = (i * 5 + 1) % 16;
  const Tensor tokens = Tensor::FromVector<int32_t>(Shape{2, 8}, seq);
  std::vector<int32_t> next(16);
  for (int i = 0; i < 16; ++i) next[i] = (seq[i] * 5 + 1) % 16;  // a learnable next-token map
  const Tensor targets = Tensor::FromVector<int32_t>(Shape{2, 8}, next);
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdamW;
  opt.schedule.lr = 1e-2;
  auto cpu = runtime::MakeCpuBackend();
  const TrainStepOptions options{.optimizer = opt, .rng_seed = 42};

  auto full = TrainStep::Create(*cpu, *loss, init->Clone(), options);
  ASSERT_TRUE(full.ok()) << full.status();
  // One set of parameters and AdamW state, every update written in place: nothing staged.
  const int updates = init->size() * 3;
  EXPECT_EQ((*full)->executable().num_in_place_outputs(), updates);
  std::vector<float> losses;
  for (int s = 0; s < 20; ++s) {
    auto m = (*full)->Run({&tokens, &targets});
    ASSERT_TRUE(m.ok()) << m.status();
    losses.push_back(m->loss);
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  EXPECT_EQ((*full)->executable().staging_bytes_allocated(), 0);

  auto first = TrainStep::Create(*cpu, *loss, init->Clone(), options);
  ASSERT_TRUE(first.ok());
  for (int s = 0; s < 8; ++s) ASSERT_TRUE((*first)->Run({&tokens, &targets}).ok());
  auto resumed = TrainStep::Create(*cpu, *loss, init->Clone(), options);
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE(
      (*resumed)->Restore((*first)->params().Clone(), (*first)->optimizer_state().Clone(), 8).ok());
  for (int s = 8; s < 20; ++s) {
    EXPECT_EQ((*resumed)->Run({&tokens, &targets})->loss, losses[s]) << "step " << s;
  }
  // Another seed drops other elements.
  auto other = TrainStep::Create(*cpu, *loss, init->Clone(), {.optimizer = opt, .rng_seed = 43});
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*other)->Run({&tokens, &targets})->loss, losses[0]);
}

// The LM head's [batch, seq, vocab] values (the logits and their gradient; the softmax is never
// materialized: the gradient is exp(logits - lse) - onehot in one loop) share ONE f32 buffer in
// the compiled train step: the gradient's loop takes the logits' buffer, which die at it.
TEST(GptTest, TrainStepHoldsOneVocabSizedBuffer) {
  Gpt gpt({.vocab_size = 512, .context = 8, .dim = 16, .layers = 1, .heads = 2});
  auto loss = gpt.TrainLossGraph(2);
  ASSERT_TRUE(loss.ok()) << loss.status();
  auto init = InitParams(gpt.Params(), 3);
  ASSERT_TRUE(init.ok());
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdamW;
  opt.clip_norm = 1.0;
  auto cpu = runtime::MakeCpuBackend();
  auto step = TrainStep::Create(*cpu, *loss, *std::move(init), {.optimizer = opt});
  ASSERT_TRUE(step.ok()) << step.status();
  const runtime::Executable& exe = (*step)->executable();
  std::set<int64_t> offsets;
  int values = 0;
  for (const ir::Node& n : exe.graph().nodes()) {
    const ir::Type& t = n.type();
    if (t.dtype != DType::kF32 || t.shape != Shape{2, 8, 512}) continue;
    if (n.id() >= static_cast<int>(exe.plan().offsets.size()) || exe.plan().offsets[n.id()] < 0)
      continue;
    offsets.insert(exe.plan().offsets[n.id()]);
    ++values;
  }
  EXPECT_GE(values, 2);  // logits, logit gradient
  EXPECT_EQ(offsets.size(), 1u) << values << " vocab-sized values in the arena\n"
                                << ir::PrintGraph(exe.graph());
}

// The tied embedding's gradient (the LM head's dW plus the token gather's scatter) scatters the
// gathered rows into dW in place: no [vocab, dim] zeros are broadcast and nothing is added over
// them.
TEST(GptTest, TiedEmbeddingGradientScattersIntoTheHeadGradient) {
  Gpt gpt({.vocab_size = 512, .context = 8, .dim = 16, .layers = 1, .heads = 2});
  auto loss = gpt.TrainLossGraph(2);
  ASSERT_TRUE(loss.ok()) << loss.status();
  auto init = InitParams(gpt.Params(), 3);
  ASSERT_TRUE(init.ok());
  OptimizerConfig opt;
  opt.kind = OptimizerKind::kAdamW;
  auto cpu = runtime::MakeCpuBackend();
  auto step = TrainStep::Create(*cpu, *loss, *std::move(init), {.optimizer = opt});
  ASSERT_TRUE(step.ok()) << step.status();
  const runtime::Executable& exe = (*step)->executable();
  const ir::Graph& g = exe.graph();
  int scatters = 0;
  for (const ir::Node& n : g.nodes()) {
    // (Broadcasts inside fused loops are read per element, never materialized.)
    if (n.opcode() == ir::Opcode::kBroadcastInDim && exe.plan().offsets[n.id()] >= 0) {
      EXPECT_NE(n.type().shape, (Shape{512, 16})) << "a vocab-sized broadcast: %" << n.id();
    }
    if (n.opcode() != ir::Opcode::kScatterAdd) continue;
    ++scatters;
    const ir::Node& dw = g.node(n.operand(0));
    EXPECT_NE(dw.opcode(), ir::Opcode::kBroadcastInDim);
    EXPECT_EQ(exe.plan().offsets[n.id()], exe.plan().offsets[dw.id()]) << "not in place";
  }
  EXPECT_EQ(scatters, 1);
}

}  // namespace
}  // namespace kiln::nn
