// Exported artifacts: an optimized MLP written with its weights, loaded back (through an in-memory
// Env and on the real file system) and run on the reference backend, matching the original
// graph; and every kind of damage to the directory reported as a clear error.
#include "kiln/compiler/artifact.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/mem_env.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/version.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/runtime/reference/reference_backend.h"
#include "kiln/tensor/safetensors.h"
#include "nlohmann/json.hpp"

namespace kiln::compiler {
namespace {

using ir::Value;
using ::testing::HasSubstr;

// logits = softmax((relu(x @ w1 + b1) @ w2 + b2) * 1.0)
ir::Graph Mlp() {
  ir::Builder b("mlp");
  Value x = b.Parameter("x", DType::kF32, {4, 8});
  Value w1 = b.Parameter("w1", DType::kF32, {8, 16});
  Value b1 = b.Parameter("b1", DType::kF32, {16});
  Value w2 = b.Parameter("w2", DType::kF32, {16, 3});
  Value b2 = b.Parameter("b2", DType::kF32, {3});
  Value h = ir::Relu(ir::MatMul(x, w1) + b1);
  Value logits = (ir::MatMul(h, w2) + b2) * 1.0;
  b.Output("probs", ir::Softmax(logits));
  b.Output("hidden", h);
  absl::StatusOr<ir::Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

Tensor Random(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0, 0.5);
  Tensor t(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetDouble(i, d(rng));
  return t;
}

std::map<std::string, Tensor> Weights() {
  return {{"w1", Random({8, 16}, 1)},
          {"b1", Random({16}, 2)},
          {"w2", Random({16, 3}, 3)},
          {"b2", Random({3}, 4)}};
}

ir::Graph Optimized() {
  CompileOptions o;
  absl::StatusOr<ir::Graph> g = Optimize(Mlp(), o);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

ArtifactOptions Options() {
  ArtifactOptions o;
  o.backend = "reference";
  o.metadata = {{"model", "mlp"}};
  return o;
}

// Runs `g` on the reference backend with named inputs.
std::map<std::string, Tensor> RunNamed(const ir::Graph& g,
                                       const std::map<std::string, Tensor>& in) {
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = ref->Compile(g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  absl::StatusOr<std::map<std::string, Tensor>> out = (*exe)->RunNamed(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return *out;
}

void ExpectNear(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.TypeString(), b.TypeString());
  for (int64_t i = 0; i < a.num_elements(); ++i)
    EXPECT_NEAR(a.GetDouble(i), b.GetDouble(i), 1e-5) << "element " << i;
}

void LoadAndCompareWithOriginal(const std::string& dir, Env* env) {
  absl::StatusOr<Artifact> a = LoadArtifact(dir, env);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->compiler_version, kCompilerVersion);
  EXPECT_EQ(a->backend, "reference");
  EXPECT_EQ(a->metadata.at("model"), "mlp");
  EXPECT_EQ(a->program_sha256.size(), 64u);
  ASSERT_EQ(a->signature.inputs.size(), 5u);
  EXPECT_EQ(a->signature.inputs[0].name, "x");
  EXPECT_FALSE(a->signature.inputs[0].weight);
  EXPECT_TRUE(a->signature.inputs[1].weight);
  ASSERT_EQ(a->signature.RuntimeInputs().size(), 1u);
  EXPECT_EQ(a->signature.RuntimeInputs()[0].shape, Shape({4, 8}));
  ASSERT_EQ(a->signature.outputs.size(), 2u);
  EXPECT_EQ(a->signature.outputs[0].name, "probs");
  EXPECT_EQ(a->signature.outputs[0].shape, Shape({4, 3}));

  // Run the loaded program the way a serving process would: compile, bind, run.
  Tensor x = Random({4, 8}, 99);
  std::unique_ptr<runtime::Backend> ref = runtime::MakeReferenceBackend();
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = ref->Compile(a->program);
  ASSERT_TRUE(exe.ok()) << exe.status();
  absl::StatusOr<std::vector<Tensor>> args = a->BindInputs({{"x", x}});
  ASSERT_TRUE(args.ok()) << args.status();
  absl::StatusOr<std::vector<Tensor>> outs = (*exe)->Run(*args);
  ASSERT_TRUE(outs.ok()) << outs.status();

  std::map<std::string, Tensor> in = Weights();
  in["x"] = x;
  std::map<std::string, Tensor> want = RunNamed(Mlp(), in);  // the original, unoptimized graph
  ASSERT_EQ(outs->size(), 2u);
  ExpectNear((*outs)[0], want.at("probs"));
  ExpectNear((*outs)[1], want.at("hidden"));

  // Binding errors name the input.
  EXPECT_THAT(a->BindInputs({}).status().message(), HasSubstr("missing input 'x: f32[4,8]'"));
  EXPECT_THAT(a->BindInputs({{"x", Random({2, 8}, 1)}}).status().message(),
              HasSubstr("input 'x' is f32[2,8], the signature says f32[4,8]"));
  EXPECT_THAT(a->BindInputs({{"x", x}, {"w1", Random({8, 16}, 1)}}).status().message(),
              HasSubstr("is a weight stored in the artifact"));
  EXPECT_THAT(a->BindInputs({{"x", x}, {"y", x}}).status().message(),
              HasSubstr("unknown input 'y'"));
}

TEST(ArtifactTest, RoundTripRunsLikeTheOriginalInMemEnv) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(WriteArtifact("/models/mlp", Optimized(), Weights(), Options(), env.get()).ok());
  std::vector<std::string> files = *env->GetChildren("/models/mlp");
  EXPECT_EQ(files,
            (std::vector<std::string>{"manifest.json", "program.ir", "weights.safetensors"}));
  EXPECT_EQ(*env->GetChildren("/models"), std::vector<std::string>{"mlp"});  // no temporaries left
  LoadAndCompareWithOriginal("/models/mlp", env.get());

  absl::StatusOr<std::string> manifest = ReadFileToString(env.get(), "/models/mlp/manifest.json");
  ASSERT_TRUE(manifest.ok());
  EXPECT_THAT(*manifest, HasSubstr("\"format\": \"kiln.artifact\""));
  EXPECT_THAT(*manifest, HasSubstr("\"version\": 1"));
}

TEST(ArtifactTest, RoundTripOnTheRealFileSystem) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string root =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln_artifact_test_" + std::to_string(::getpid());
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDir(root).ok());
  std::string dir = root + "/mlp";
  ASSERT_TRUE(WriteArtifact(dir, Optimized(), Weights(), Options()).ok());
  // The weights are a plain safetensors file other tools can read.
  absl::StatusOr<std::map<std::string, Tensor>> w = ReadSafetensors(dir + "/weights.safetensors");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->size(), 4u);
  LoadAndCompareWithOriginal(dir, nullptr);
  // Overwrite is refused unless asked for, then replaces the directory.
  EXPECT_EQ(WriteArtifact(dir, Optimized(), Weights(), Options()).code(),
            absl::StatusCode::kAlreadyExists);
  ArtifactOptions o = Options();
  o.overwrite = true;
  o.metadata["model"] = "mlp2";
  ASSERT_TRUE(WriteArtifact(dir, Optimized(), Weights(), o).ok());
  EXPECT_EQ(LoadArtifact(dir)->metadata.at("model"), "mlp2");
  EXPECT_EQ(*env->GetChildren(root), std::vector<std::string>{"mlp"});
  ASSERT_TRUE(env->DeleteDir(root).ok());
}

TEST(ArtifactTest, WriteRejectsBadWeights) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  std::map<std::string, Tensor> w = Weights();
  w["nope"] = Random({2}, 1);
  EXPECT_THAT(WriteArtifact("/a", Optimized(), w, Options(), env.get()).message(),
              HasSubstr("weight 'nope' is not a parameter"));
  w = Weights();
  w["b1"] = Random({15}, 1);
  EXPECT_THAT(WriteArtifact("/a", Optimized(), w, Options(), env.get()).message(),
              HasSubstr("weight 'b1' is f32[15], parameter is f32[16]"));
  EXPECT_FALSE(env->FileExists("/a"));
}

class DamagedArtifactTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(WriteArtifact("/m", Optimized(), Weights(), Options(), env_.get()).ok());
  }
  std::string Read(const std::string& f) { return *ReadFileToString(env_.get(), "/m/" + f); }
  void Write(const std::string& f, const std::string& bytes) {
    ASSERT_TRUE(WriteStringToFile(env_.get(), bytes, "/m/" + f).ok());
  }
  absl::Status Load() { return LoadArtifact("/m", env_.get()).status(); }
  void ReplaceInManifest(const std::string& from, const std::string& to) {
    std::string m = Read("manifest.json");
    size_t at = m.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    m.replace(at, from.size(), to);
    Write("manifest.json", m);
  }
  std::unique_ptr<MemEnv> env_ = NewMemEnv();
};

TEST_F(DamagedArtifactTest, MissingFiles) {
  for (const char* f : {"manifest.json", "program.ir", "weights.safetensors"}) {
    SCOPED_TRACE(f);
    std::string keep = Read(f);
    ASSERT_TRUE(env_->DeleteFile(std::string("/m/") + f).ok());
    absl::Status s = Load();
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(s.message(), HasSubstr(std::string("missing ") + f));
    Write(f, keep);
  }
  EXPECT_TRUE(Load().ok());
  EXPECT_EQ(LoadArtifact("/elsewhere", env_.get()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DamagedArtifactTest, CorruptProgram) {
  std::string p = Read("program.ir");
  std::string flipped = p;
  flipped[p.size() / 2] ^= 0x01;
  Write("program.ir", flipped);
  absl::Status s = Load();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("program.ir: crc32c"));
  Write("program.ir", p + " ");
  EXPECT_THAT(Load().message(), HasSubstr("bytes, the manifest says"));
}

TEST_F(DamagedArtifactTest, CorruptWeights) {
  std::string w = Read("weights.safetensors");
  w[w.size() - 1] ^= 0x40;
  Write("weights.safetensors", w);
  absl::Status s = Load();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("weights.safetensors: crc32c"));
}

TEST_F(DamagedArtifactTest, UnsupportedVersionAndFormat) {
  ReplaceInManifest("\"version\": 1", "\"version\": 2");
  absl::Status s = Load();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("version 2 is not supported"));
  ReplaceInManifest("\"version\": 2", "\"version\": 1");
  ReplaceInManifest("\"kiln.artifact\"", "\"other\"");
  EXPECT_THAT(Load().message(), HasSubstr("format is not \"kiln.artifact\""));
}

TEST_F(DamagedArtifactTest, MalformedManifest) {
  Write("manifest.json", "{not json");
  EXPECT_EQ(Load().code(), absl::StatusCode::kDataLoss);
  Write("manifest.json", "{\"format\": \"kiln.artifact\", \"version\": 1}");
  absl::Status s = Load();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("malformed manifest.json"));
}

TEST_F(DamagedArtifactTest, SignatureInconsistentWithProgram) {
  nlohmann::ordered_json m = nlohmann::ordered_json::parse(Read("manifest.json"));
  m["signature"]["inputs"][0]["shape"] = std::vector<int64_t>{5, 8};
  Write("manifest.json", m.dump(2));
  absl::Status s = Load();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("input 0 is 'x: f32[5,8]' in the manifest, 'x: f32[4,8]' in "
                                     "the program"));
}

TEST_F(DamagedArtifactTest, WeightShapeDisagreesWithSignature) {
  // A well-formed weights file (checksums updated in the manifest) with a wrongly shaped b2.
  std::map<std::string, Tensor> w = Weights();
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"w1", w["w1"]}, {"b1", w["b1"]}, {"w2", w["w2"]}, {"b2", Random({4}, 1)}};
  std::string bytes = *SerializeSafetensors(ts);
  std::string old = Read("weights.safetensors");
  Write("weights.safetensors", bytes);
  ReplaceInManifest(absl::StrCat("\"bytes\": ", old.size()),
                    absl::StrCat("\"bytes\": ", bytes.size()));
  ReplaceInManifest(absl::StrCat("\"crc32c\": ", crc32c::Value(old.data(), old.size())),
                    absl::StrCat("\"crc32c\": ", crc32c::Value(bytes.data(), bytes.size())));
  absl::Status s = Load();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("weight 'b2' is f32[4], the signature says f32[3]"));
}

}  // namespace
}  // namespace kiln::compiler
