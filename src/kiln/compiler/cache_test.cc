// The compile cache against an in-memory Env: memory and disk hits, the key's sensitivity to each
// of its parts, corrupt entries as logged misses, miss explanations and the recompile warning.
#include "kiln/compiler/cache.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/compiler/internal/sha256.h"
#include "kiln/compiler/version.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/sharding.h"

namespace kiln::compiler {
namespace {

using ir::Value;
using ::testing::HasSubstr;

// softmax(relu(x @ w) * 1.0 + 0): the pipeline decomposes softmax and removes the identities.
ir::Graph Model(const std::string& name, int64_t batch, double scale = 1.0) {
  ir::Builder b(name);
  Value x = b.Parameter("x", DType::kF32, {batch, 8});
  Value w = b.Parameter("w", DType::kF32, {8, 4});
  Value h = ir::Relu(ir::MatMul(x, w)) * scale + 0.0;
  b.Output("y", ir::Softmax(h));
  absl::StatusOr<ir::Graph> g = b.Build();
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

CompileOptions Opts() {
  CompileOptions o;
  o.pipeline.verify_each_pass = true;
  return o;
}

struct Fixture {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  std::vector<std::string> log;
  CompileCacheOptions Options() {
    CompileCacheOptions o;
    o.dir = "/cache";
    o.env = env.get();
    o.log = [this](const std::string& m) { log.push_back(m); };
    return o;
  }
};

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(internal::Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(internal::Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(internal::Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Fed in uneven pieces across block boundaries: same digest as one call.
  std::string million(1000000, 'a');
  internal::Sha256 h;
  for (size_t i = 0; i < million.size();) {
    size_t n = std::min<size_t>(1 + i % 97, million.size() - i);
    h.Update(million.data() + i, n);
    i += n;
  }
  EXPECT_EQ(internal::DigestHex(h.Finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(CompileCacheTest, MissThenMemoryHitThenDiskHitInFreshCache) {
  Fixture f;
  ir::Graph g = Model("net", 4);
  absl::StatusOr<ir::Graph> want = Optimize(g, Opts());
  ASSERT_TRUE(want.ok()) << want.status();
  {
    CompileCache cache(f.Options());
    CacheStats s1;
    absl::StatusOr<ir::Graph> a = cache.GetOrOptimize(g, Opts(), "cpu/avx2", &s1);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(s1.misses, 1);
    EXPECT_EQ(s1.hits(), 0);
    EXPECT_EQ(ir::PrintGraph(*a), ir::PrintGraph(*want));
    ASSERT_EQ(f.log.size(), 1u);
    EXPECT_THAT(f.log[0], HasSubstr("kiln compile cache: miss for graph 'net'"));
    EXPECT_THAT(f.log[0], HasSubstr("first compile"));
    EXPECT_THAT(f.log[0], HasSubstr("no entry on disk"));
    EXPECT_TRUE(f.env->FileExists(cache.EntryPath(cache.Key(g, Opts(), "cpu/avx2"))));

    CacheStats s2;
    absl::StatusOr<ir::Graph> b = cache.GetOrOptimize(g, Opts(), "cpu/avx2", &s2);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(s2.memory_hits, 1);
    EXPECT_EQ(s2.misses, 0);
    EXPECT_EQ(ir::PrintGraph(*b), ir::PrintGraph(*want));
    EXPECT_EQ(f.log.size(), 1u);  // hits are silent
    EXPECT_EQ(cache.stats().misses, 1);
    EXPECT_EQ(cache.stats().memory_hits, 1);
  }
  CompileCache fresh(f.Options());
  CacheStats s3;
  absl::StatusOr<ir::Graph> c = fresh.GetOrOptimize(g, Opts(), "cpu/avx2", &s3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(s3.disk_hits, 1);
  EXPECT_EQ(s3.misses, 0);
  EXPECT_GE(s3.seconds_saved, 0.0);
  EXPECT_EQ(ir::PrintGraph(*c), ir::PrintGraph(*want));
  // The disk hit also filled the memory tier.
  CacheStats s4;
  ASSERT_TRUE(fresh.GetOrOptimize(g, Opts(), "cpu/avx2", &s4).ok());
  EXPECT_EQ(s4.memory_hits, 1);
  EXPECT_THAT(fresh.stats().ToString(), HasSubstr("2 hits (1 memory, 1 disk), 0 misses"));
}

TEST(CompileCacheTest, GraphNameIsNotPartOfTheKeyButIsRestored) {
  Fixture f;
  CompileCache cache(f.Options());
  EXPECT_EQ(cache.Key(Model("a", 4), Opts(), "cpu"), cache.Key(Model("b", 4), Opts(), "cpu"));
  ASSERT_TRUE(cache.GetOrOptimize(Model("a", 4), Opts(), "cpu").ok());
  CacheStats s;
  absl::StatusOr<ir::Graph> g = cache.GetOrOptimize(Model("b", 4), Opts(), "cpu", &s);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(s.memory_hits, 1);
  EXPECT_EQ(g->name(), "b");
}

TEST(CompileCacheTest, KeyChangesWithEachPart) {
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  const std::string base = cache.Key(g, Opts(), "cpu/avx2");
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, cache.Key(g, Opts(), "cpu/avx2"));  // deterministic

  EXPECT_NE(base, cache.Key(g, Opts(), "cpu/avx512"));                   // backend / ISA
  EXPECT_NE(base, cache.Key(Model("net", 8), Opts(), "cpu/avx2"));       // shapes
  EXPECT_NE(base, cache.Key(Model("net", 4, 2.0), Opts(), "cpu/avx2"));  // IR body

  CompileOptions disabled = Opts();
  disabled.pipeline.disabled_passes = {"cse"};
  EXPECT_NE(base, cache.Key(g, disabled, "cpu/avx2"));
  CompileOptions keep = Opts();
  keep.keep_composite = [](ir::Opcode op) { return op == ir::Opcode::kSoftmax; };
  EXPECT_NE(base, cache.Key(g, keep, "cpu/avx2"));
  CompileOptions keep_none = Opts();
  keep_none.keep_composite = [](ir::Opcode) { return false; };
  EXPECT_EQ(base, cache.Key(g, keep_none, "cpu/avx2"));  // same predicate results as null
  CompileOptions fold = Opts();
  fold.max_fold_elements = 7;
  EXPECT_NE(base, cache.Key(g, fold, "cpu/avx2"));
  // Diagnostic-only options do not change the key.
  CompileOptions diag = Opts();
  diag.pipeline.verify_each_pass = false;
  diag.pipeline.dump_dir = "/dumps";
  EXPECT_EQ(base, cache.Key(g, diag, "cpu/avx2"));

  EXPECT_THAT(CanonicalOptionsString(keep), HasSubstr("softmax:keep"));
  EXPECT_THAT(CanonicalOptionsString(keep), HasSubstr("attention:decompose"));
  EXPECT_THAT(CanonicalOptionsString(disabled), HasSubstr("disabled_passes=cse\n"));
}

// The program pipeline's options (precision policy, SPMD mesh and shardings) are in the key;
// unset, the options string is what it was before they existed.
TEST(CompileCacheTest, ProgramOptionsArePartOfTheKey) {
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  CompileOptions o = Opts();
  const std::string base = cache.Key(g, o, "cpu");
  EXPECT_THAT(CanonicalOptionsString(o), ::testing::Not(HasSubstr("precision=")));
  EXPECT_THAT(CanonicalOptionsString(o), ::testing::Not(HasSubstr("mesh=")));
  CompileOptions mixed = o;
  mixed.program.precision = PrecisionPolicy::kMixedBf16;
  EXPECT_NE(base, cache.Key(g, mixed, "cpu"));
  EXPECT_THAT(CanonicalOptionsString(mixed), HasSubstr("\nprecision=mixed_bf16\n"));
  absl::StatusOr<ir::Sharding> cols = ir::ParseSharding("[_,model]");
  ASSERT_TRUE(cols.ok()) << cols.status();
  CompileOptions tp = o;
  tp.program.mesh = {"model", 2};
  tp.program.shardings = {{"w", *cols}};
  EXPECT_NE(base, cache.Key(g, tp, "cpu"));
  EXPECT_THAT(CanonicalOptionsString(tp),
              HasSubstr("\nmesh=model:2,shardings=w=" + cols->ToString() + "\n"));
  CompileOptions tp4 = tp;
  tp4.program.mesh.size = 4;
  EXPECT_NE(cache.Key(g, tp, "cpu"), cache.Key(g, tp4, "cpu"));
}

TEST(CompileCacheTest, DisabledPassesFromVariablesArePartOfTheKey) {
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  CompileOptions o = Opts();
  std::string before = cache.Key(g, o, "cpu");
  ASSERT_TRUE(ApplyPipelineVariables({.disable_passes = "dce, cse"}, &o.pipeline).ok());
  std::string after = cache.Key(g, o, "cpu");
  EXPECT_THAT(CanonicalOptionsString(o), HasSubstr("disabled_passes=cse,dce\n"));
  EXPECT_NE(before, after);
}

TEST(CompileCacheTest, UnknownDisabledPassIsAnErrorEvenWhenCached) {
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  CompileOptions o = Opts();
  ASSERT_TRUE(cache.GetOrOptimize(g, o, "cpu").ok());
  o.pipeline.disabled_passes = {"csee"};
  absl::StatusOr<ir::Graph> typo = cache.GetOrOptimize(g, o, "cpu");
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(typo.status().message()), HasSubstr("unknown pass 'csee'"));
  // Disabling a real pass still works and is a different entry.
  o.pipeline.disabled_passes = {"cse"};
  CacheStats s;
  EXPECT_TRUE(cache.GetOrOptimize(g, o, "cpu", &s).ok());
  EXPECT_EQ(s.misses, 1);
}

// The cache reads no environment: no KILN_DISABLE_PASSES in its key, no $KILN_CACHE_DIR or
// $HOME/.cache disk tier without a dir.
TEST(CompileCacheTest, TheEnvironmentIsNotRead) {
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  std::string before = cache.Key(g, Opts(), "cpu");
  setenv("KILN_DISABLE_PASSES", "cse", 1);
  setenv("KILN_CACHE_DIR", "/tmp/kiln_cache_test_env", 1);
  std::string after = cache.Key(g, Opts(), "cpu");
  CompileCacheOptions no_dir = f.Options();
  no_dir.dir = "";
  CompileCache memory_only(no_dir);
  unsetenv("KILN_DISABLE_PASSES");
  unsetenv("KILN_CACHE_DIR");
  EXPECT_EQ(before, after);
  EXPECT_EQ(memory_only.disk_dir(), "");
}

TEST(CompileCacheTest, ComputeCacheKeyCoversEveryFieldUnambiguously) {
  const std::string k = ComputeCacheKey("ir", "v1", "opts", "cpu");
  EXPECT_EQ(k, ComputeCacheKey("ir", "v1", "opts", "cpu"));
  EXPECT_NE(k, ComputeCacheKey("ir", "v2", "opts", "cpu"));  // compiler version
  EXPECT_NE(k, ComputeCacheKey("ir2", "v1", "opts", "cpu"));
  EXPECT_NE(k, ComputeCacheKey("ir", "v1", "opts2", "cpu"));
  EXPECT_NE(k, ComputeCacheKey("ir", "v1", "opts", "cpu2"));
  // Length prefixes: moving bytes between fields changes the key.
  EXPECT_NE(ComputeCacheKey("ab", "c", "", ""), ComputeCacheKey("a", "bc", "", ""));
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  ir::Graph anonymous = g;
  anonymous.set_name("_");
  EXPECT_EQ(cache.Key(g, Opts(), "cpu"),
            ComputeCacheKey(ir::PrintGraph(anonymous), kCompilerVersion,
                            CanonicalOptionsString(Opts()), "cpu"));
}

TEST(CompileCacheTest, CompilerVersionIsInTheKeyAndEntryDescription) {
  // The version is a compile-time constant, so check that it is hashed in by reading back the
  // stored entry's description, and that it is part of what the key covers (an entry whose key
  // bytes differ from the file name is rejected: see CorruptEntries).
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  ASSERT_TRUE(cache.GetOrOptimize(g, Opts(), "cpu").ok());
  absl::StatusOr<std::string> bytes =
      ReadFileToString(f.env.get(), cache.EntryPath(cache.Key(g, Opts(), "cpu")));
  ASSERT_TRUE(bytes.ok());
  EXPECT_THAT(*bytes, HasSubstr(std::string("compiler_version: ") + kCompilerVersion));
  EXPECT_EQ(bytes->compare(0, 8, "KILNCACH"), 0);
}

TEST(CompileCacheTest, MissesExplainWhatChanged) {
  Fixture f;
  CompileCache cache(f.Options());
  ASSERT_TRUE(cache.GetOrOptimize(Model("net", 4), Opts(), "cpu/avx2").ok());
  CompileOptions disabled = Opts();
  disabled.pipeline.disabled_passes = {"cse"};
  ASSERT_TRUE(cache.GetOrOptimize(Model("net", 4), disabled, "cpu/avx2").ok());
  ASSERT_TRUE(cache.GetOrOptimize(Model("net", 4), disabled, "cpu/avx512").ok());
  ASSERT_TRUE(cache.GetOrOptimize(Model("net", 4, 3.0), disabled, "cpu/avx512").ok());
  ASSERT_EQ(f.log.size(), 4u);
  EXPECT_THAT(f.log[1], HasSubstr("options changed (disabled_passes: '' -> 'cse')"));
  EXPECT_THAT(f.log[2], HasSubstr("backend changed ('cpu/avx2' -> 'cpu/avx512')"));
  EXPECT_THAT(f.log[3], HasSubstr("IR changed"));
  cache.ClearMemory();
  // A key already seen in this process, gone from memory, found on disk: a hit, not logged.
  CacheStats s;
  ASSERT_TRUE(cache.GetOrOptimize(Model("net", 4), Opts(), "cpu/avx2", &s).ok());
  EXPECT_EQ(s.disk_hits, 1);
  EXPECT_EQ(f.log.size(), 4u);
}

TEST(CompileCacheTest, CorruptEntriesAreLoggedMissesAndRewritten) {
  Fixture f;
  ir::Graph g = Model("net", 4);
  std::string path;
  {
    CompileCache cache(f.Options());
    ASSERT_TRUE(cache.GetOrOptimize(g, Opts(), "cpu").ok());
    path = cache.EntryPath(cache.Key(g, Opts(), "cpu"));
  }
  absl::StatusOr<std::string> good = ReadFileToString(f.env.get(), path);
  ASSERT_TRUE(good.ok());

  struct Case {
    std::string what;
    std::string bytes;
    std::string reason;
  };
  std::string flipped_body = *good;
  flipped_body[flipped_body.size() - 5] ^= 0x20;
  std::string flipped_header = *good;
  flipped_header[50] ^= 1;
  std::string wrong_magic = *good;
  wrong_magic[0] = 'X';
  std::vector<Case> cases = {
      {"body bit flip", flipped_body, "entry corrupt: crc mismatch (body)"},
      {"header bit flip", flipped_header, "entry corrupt: crc mismatch (header)"},
      {"bad magic", wrong_magic, "entry corrupt: bad magic"},
      {"truncated header", good->substr(0, 40), "entry corrupt: truncated header"},
      {"truncated body", good->substr(0, good->size() - 10), "entry corrupt: size mismatch"},
      {"empty file", "", "entry corrupt: truncated header"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ASSERT_TRUE(WriteStringToFile(f.env.get(), c.bytes, path).ok());
    f.log.clear();
    CompileCache cache(f.Options());
    CacheStats s;
    absl::StatusOr<ir::Graph> out = cache.GetOrOptimize(g, Opts(), "cpu", &s);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(s.misses, 1);
    EXPECT_EQ(s.corrupt_entries, 1);
    ASSERT_EQ(f.log.size(), 1u);
    EXPECT_THAT(f.log[0], HasSubstr(c.reason));
    // Rewritten: identical to the good entry apart from the recorded optimize time.
    absl::StatusOr<std::string> now = ReadFileToString(f.env.get(), path);
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(now->size(), good->size());
    CompileCache again(f.Options());
    CacheStats s2;
    ASSERT_TRUE(again.GetOrOptimize(g, Opts(), "cpu", &s2).ok());
    EXPECT_EQ(s2.disk_hits, 1);
  }

  // An intact entry stored under another key's name is rejected (key check in the header).
  CompileCache cache(f.Options());
  ir::Graph other = Model("net", 8);
  std::string other_path = cache.EntryPath(cache.Key(other, Opts(), "cpu"));
  ASSERT_TRUE(WriteStringToFile(f.env.get(), *good, other_path).ok());
  f.log.clear();
  CacheStats s;
  ASSERT_TRUE(cache.GetOrOptimize(other, Opts(), "cpu", &s).ok());
  EXPECT_EQ(s.corrupt_entries, 1);
  ASSERT_EQ(f.log.size(), 1u);
  EXPECT_THAT(f.log[0], HasSubstr("entry corrupt: key mismatch"));
}

TEST(CompileCacheTest, UnwritableDiskIsLoggedNotFatal) {
  Fixture f;
  ASSERT_TRUE(WriteStringToFile(f.env.get(), "a file, not a folder", "/cache").ok());
  CompileCache cache(f.Options());
  CacheStats s;
  ASSERT_TRUE(cache.GetOrOptimize(Model("net", 4), Opts(), "cpu", &s).ok());
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.disk_write_errors, 1);
  ASSERT_EQ(f.log.size(), 2u);
  EXPECT_THAT(f.log[1], HasSubstr("cannot store entry for graph 'net'"));
}

TEST(CompileCacheTest, IrDumpRequestBypassesTheLookup) {
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph g = Model("net", 4);
  ASSERT_TRUE(cache.GetOrOptimize(g, Opts(), "cpu").ok());
  CompileOptions dump = Opts();
  dump.pipeline.dump_dir = "/dumps";
  dump.pipeline.env = f.env.get();
  CacheStats s;
  ASSERT_TRUE(cache.GetOrOptimize(g, dump, "cpu", &s).ok());
  EXPECT_EQ(s.misses, 1);
  EXPECT_THAT(f.log.back(), HasSubstr("lookup skipped: IR dumps requested"));
  EXPECT_FALSE(f.env->GetChildren("/dumps")->empty());
}

TEST(CompileCacheTest, InvalidGraphIsAnErrorAndNotCached) {
  Fixture f;
  CompileCache cache(f.Options());
  ir::Graph bad("bad");
  bad.AddNode(ir::Opcode::kRelu, {}, ir::Type{DType::kF32, Shape{2}}, {});  // no operand
  bad.AddOutput("y", 0);
  EXPECT_FALSE(cache.GetOrOptimize(bad, Opts(), "cpu").ok());
  EXPECT_FALSE(cache.GetOrOptimize(bad, Opts(), "cpu").ok());
  EXPECT_EQ(cache.stats().misses, 2);
  EXPECT_EQ(cache.stats().hits(), 0);
}

TEST(CompileCacheTest, LruEvictsTheLeastRecentlyUsed) {
  Fixture f;
  CompileCacheOptions o = f.Options();
  o.use_disk = false;
  o.memory_capacity = 2;
  o.recompile_warning_threshold = 0;
  CompileCache cache(o);
  EXPECT_EQ(cache.disk_dir(), "");
  auto run = [&](int64_t batch) {
    CacheStats s;
    EXPECT_TRUE(cache.GetOrOptimize(Model("net", batch), Opts(), "cpu", &s).ok());
    return s.memory_hits == 1;
  };
  EXPECT_FALSE(run(1));
  EXPECT_FALSE(run(2));
  EXPECT_TRUE(run(1));   // 1 is now the most recent
  EXPECT_FALSE(run(3));  // evicts 2
  EXPECT_TRUE(run(1));
  EXPECT_FALSE(run(2));
  EXPECT_THAT(f.log.back(), HasSubstr("no disk tier"));
}

TEST(CompileCacheTest, RepeatedRecompilesWithNewShapesWarnLoudly) {
  Fixture f;
  CompileCache cache(f.Options());
  auto warnings = [&] {
    int n = 0;
    for (const std::string& m : f.log) n += m.find("WARNING") != std::string::npos;
    return n;
  };
  ASSERT_TRUE(cache.GetOrOptimize(Model("train_step", 32), Opts(), "cpu").ok());
  ASSERT_TRUE(cache.GetOrOptimize(Model("train_step", 16), Opts(), "cpu").ok());
  ASSERT_TRUE(cache.GetOrOptimize(Model("train_step", 32), Opts(), "cpu").ok());  // seen before
  EXPECT_EQ(warnings(), 0);
  EXPECT_THAT(f.log[1], HasSubstr("input shapes changed (x: f32[32,8] -> f32[16,8])"));
  ASSERT_TRUE(cache.GetOrOptimize(Model("train_step", 7), Opts(), "cpu").ok());  // third shape
  EXPECT_EQ(warnings(), 1);
  EXPECT_THAT(f.log.back(), HasSubstr("WARNING: graph 'train_step' recompiled for its 3 distinct "
                                      "input shapes (changed: x: f32[32,8] -> f32[7,8])"));
  // Another graph name has its own history.
  ASSERT_TRUE(cache.GetOrOptimize(Model("eval_step", 5), Opts(), "cpu").ok());
  EXPECT_EQ(warnings(), 1);
  ASSERT_TRUE(cache.GetOrOptimize(Model("train_step", 9), Opts(), "cpu").ok());
  EXPECT_EQ(warnings(), 2);
  EXPECT_EQ(cache.stats().recompile_warnings, 2);
}

}  // namespace
}  // namespace kiln::compiler
