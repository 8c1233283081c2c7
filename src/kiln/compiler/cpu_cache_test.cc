// The compile cache wired into the cpu backend (CpuBackendOptions::use_compile_cache): a second
// compile of the same graph skips the pipeline and runs the same program; anything that changes
// the result misses.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/compiler/cache.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/cpu/cpu_backend.h"

namespace kiln::compiler {
namespace {

using ::testing::HasSubstr;

// A small MLP forward with work for every part of the pipeline (CSE, fusion, scheduling).
ir::Graph Mlp(int64_t batch) {
  ir::Builder b("mlp");
  ir::Value x = b.Parameter("x", DType::kF32, {batch, 32});
  ir::Value w1 = b.Parameter("w1", DType::kF32, {32, 64});
  ir::Value b1 = b.Parameter("b1", DType::kF32, {64});
  ir::Value w2 = b.Parameter("w2", DType::kF32, {64, 8});
  ir::Value h = ir::Relu(ir::MatMul(x, w1) + b1);
  ir::Value y = ir::MatMul(h * 0.5 + h * 0.5, w2);
  b.Output("y", ir::Softmax(y, 1));
  b.Output("h", h);
  absl::StatusOr<ir::Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

std::vector<Tensor> Inputs(const ir::Graph& g) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<Tensor> in;
  for (int id : g.parameters()) {
    const ir::Type& t = g.node(id).type();
    std::vector<double> v(t.shape.num_elements());
    for (double& x : v) x = u(rng);
    in.push_back(Tensor::FromDoubles(t.dtype, t.shape, v));
  }
  return in;
}

std::vector<Tensor> RunOn(runtime::Backend& backend, const ir::Graph& g) {
  auto exe = backend.Compile(g);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  auto out = (*exe)->Run(Inputs(g));
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<Tensor>();
}

void ExpectBitIdentical(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].shape(), b[i].shape());
    EXPECT_EQ(0, std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].byte_size())) << "output " << i;
  }
}

struct Logged {
  std::vector<std::string> lines;
  CompileCacheOptions Options() {
    CompileCacheOptions o;
    o.use_disk = false;
    o.log = [this](const std::string& m) { lines.push_back(m); };
    return o;
  }
};

TEST(CpuCompileCache, SecondCompileIsAHitWithIdenticalOutputs) {
  Logged log;
  CompileCache cache(log.Options());
  std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend({.compile_cache = &cache});
  ir::Graph g = Mlp(16);
  std::vector<Tensor> first = RunOn(*cpu, g);
  EXPECT_EQ(cache.stats().misses, 1);
  EXPECT_EQ(cache.stats().hits(), 0);
  ASSERT_EQ(log.lines.size(), 1u);
  EXPECT_THAT(log.lines[0], HasSubstr("first compile of this graph"));

  std::vector<Tensor> second = RunOn(*cpu, g);
  EXPECT_EQ(cache.stats().memory_hits, 1);
  EXPECT_EQ(cache.stats().misses, 1);
  ExpectBitIdentical(first, second);
  // The same as compiling without the cache.
  std::unique_ptr<runtime::Backend> uncached =
      runtime::MakeCpuBackend({.use_compile_cache = false});
  ExpectBitIdentical(first, RunOn(*uncached, g));
  EXPECT_EQ(cache.stats().hits() + cache.stats().misses, 2);  // the uncached one never asked
}

TEST(CpuCompileCache, ChangedOptionsOrShapesMiss) {
  Logged log;
  CompileCache cache(log.Options());
  ir::Graph g = Mlp(16);
  RunOn(*runtime::MakeCpuBackend({.compile_cache = &cache}), g);
  RunOn(*runtime::MakeCpuBackend({.fuse = false, .compile_cache = &cache}), g);
  EXPECT_EQ(cache.stats().misses, 2);
  EXPECT_THAT(log.lines.back(), HasSubstr("options changed"));
  EXPECT_THAT(log.lines.back(), HasSubstr("fuse_loops"));
  RunOn(*runtime::MakeCpuBackend({.compile_cache = &cache, .remat = true}), g);
  EXPECT_EQ(cache.stats().misses, 3);
  EXPECT_THAT(log.lines.back(), HasSubstr("remat"));
  RunOn(*runtime::MakeCpuBackend({.compile_cache = &cache}), Mlp(8));
  EXPECT_EQ(cache.stats().misses, 4);
  EXPECT_THAT(log.lines.back(), HasSubstr("input shapes changed"));
  // Each of them is a hit the second time.
  RunOn(*runtime::MakeCpuBackend({.fuse = false, .compile_cache = &cache}), g);
  RunOn(*runtime::MakeCpuBackend({.compile_cache = &cache}), Mlp(8));
  EXPECT_EQ(cache.stats().misses, 4);
  EXPECT_EQ(cache.stats().memory_hits, 2);
}

TEST(CpuCompileCache, DiskTierServesAnotherCacheInstance) {
  std::string dir = (std::filesystem::temp_directory_path() /
                     ("kiln_cpu_cache_test_" + std::to_string(::getpid())))
                        .string();
  std::filesystem::remove_all(dir);
  ir::Graph g = Mlp(4);
  std::vector<Tensor> first, second;
  {
    Logged log;
    CompileCacheOptions o = log.Options();
    o.use_disk = true;
    o.dir = dir;
    CompileCache cache(o);
    first = RunOn(*runtime::MakeCpuBackend({.compile_cache = &cache}), g);
    EXPECT_EQ(cache.stats().misses, 1);
  }
  {
    Logged log;
    CompileCacheOptions o = log.Options();
    o.use_disk = true;
    o.dir = dir;
    CompileCache cache(o);  // a fresh process, as far as the memory tier knows
    second = RunOn(*runtime::MakeCpuBackend({.compile_cache = &cache}), g);
    EXPECT_EQ(cache.stats().disk_hits, 1);
    EXPECT_EQ(cache.stats().misses, 0);
  }
  ExpectBitIdentical(first, second);
  std::filesystem::remove_all(dir);
}

TEST(CpuCompileCache, DefaultCacheAndOptOut) {
  ir::Graph g = Mlp(3);
  // No cache by default (the cache is the caller's; there is no process-wide one): every
  // compile runs the pipeline, and gives the same outputs.
  std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend();
  ExpectBitIdentical(RunOn(*cpu, g), RunOn(*cpu, g));
  // Opted out, a provided cache is never consulted.
  Logged log;
  CompileCache cache(log.Options());
  RunOn(*runtime::MakeCpuBackend({.use_compile_cache = false, .compile_cache = &cache}), g);
  EXPECT_EQ(cache.stats().hits() + cache.stats().misses, 0);
}

// The backend's pipeline options (what the kiln CLI fills from KILN_DISABLE_PASSES) reach the
// compiler: a disabled pass changes the cache key, an unknown one is the compiler's error, and
// Describe records them.
TEST(CpuCompileCache, PipelineOptionsReachTheCompiler) {
  ir::Graph g = Mlp(3);
  Logged log;
  CompileCache cache(log.Options());
  runtime::CpuBackendOptions o{.compile_cache = &cache};
  ASSERT_TRUE(runtime::MakeCpuBackend(o)->Compile(g).ok());
  o.pipeline.disabled_passes = {"cse"};
  std::unique_ptr<runtime::Backend> no_cse = runtime::MakeCpuBackend(o);
  ASSERT_TRUE(no_cse->Compile(g).ok());
  EXPECT_EQ(cache.stats().misses, 2);
  EXPECT_EQ(no_cse->Describe()["disabled_passes"], nlohmann::json({"cse"}));
  o.pipeline.disabled_passes = {"nosuchpass"};
  absl::StatusOr<std::unique_ptr<runtime::Executable>> bad = runtime::MakeCpuBackend(o)->Compile(g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown pass 'nosuchpass'"), std::string::npos);
}

}  // namespace
}  // namespace kiln::compiler
