#include "kiln/train/trace.h"

#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/fault_injection_env.h"
#include "kiln/base/mem_env.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"

namespace kiln::train {
namespace {

using nlohmann::json;

// Checks that the complete events of each (pid, tid), in file order, nest perfectly: each event
// starts no earlier than the enclosing open one and ends no later. Times are parsed from the
// JSON's microsecond decimals into integer nanoseconds, so the check is exact.
int64_t Ns(const json& us) {
  std::string s = us.dump();
  size_t dot = s.find('.');
  int64_t whole = std::stoll(s.substr(0, dot));
  std::string frac = dot == std::string::npos ? "" : s.substr(dot + 1);
  frac.resize(3, '0');
  return whole * 1000 + std::stoll(frac);
}

void ExpectProperNesting(const json& events) {
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> stacks;
  for (const json& e : events) {
    if (e.at("ph") != "X") continue;
    auto& stack = stacks[{e.at("pid").get<int64_t>(), e.at("tid").get<int64_t>()}];
    int64_t b = Ns(e.at("ts")), end = b + Ns(e.at("dur"));
    while (!stack.empty() && stack.back().second <= b) stack.pop_back();
    if (!stack.empty()) {
      EXPECT_GE(b, stack.back().first) << e.dump();
      EXPECT_LE(end, stack.back().second) << "overlaps its parent: " << e.dump();
    }
    stack.emplace_back(b, end);
  }
}

std::vector<json> OfPhase(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

TEST(ProfilerTest, DisabledRecordsNothing) {
  Profiler p;
  EXPECT_FALSE(p.enabled());
  {
    auto s = p.Scope("compute", "k");
    EXPECT_FALSE(s.active());
    s.Arg("x", 1);
  }
  p.AddInstant("c", "i");
  p.AddCounter("n", {{"v", 1}});
  p.AddComplete("c", "x", 0, 10);
  EXPECT_TRUE(p.Events().empty());
  json j = json::parse(p.ToJson());
  EXPECT_EQ(OfPhase(j, "X").size(), 0u);
  EXPECT_EQ(OfPhase(j, "M").size(), 1u);  // process_name
}

TEST(ProfilerTest, NestedScopesProduceValidChromeTrace) {
  Profiler::Options opt;
  opt.enabled = true;
  opt.pid = 3;
  opt.process_name = "worker \"3\"";
  Profiler p(opt);
  p.SetThreadName("trainer");
  for (int step = 0; step < 3; ++step) {
    auto outer = p.Scope("step", "train_step");
    outer.Arg("step", step);
    { auto input = p.Scope("input", "input_wait"); }
    {
      auto compute = p.Scope("compute", "executable");
      for (int k = 0; k < 4; ++k) {
        auto kernel = p.Scope("compute", "fused_kernel_" + std::to_string(k));
        kernel.Arg("flops", 1.5e9).Arg("impl", "onednn");
      }
    }
    p.AddInstant("marker", "step_end");
  }
  p.AddCounter("throughput", {{"examples_per_sec", 1234.5}});
  {
    auto ended = p.Scope("ckpt", "early");
    ended.End();
    ended.End();  // idempotent
  }
  ASSERT_EQ(p.Events().size(), 3u * 7 + 3 + 1 + 1);

  json j = json::parse(p.ToJson());
  EXPECT_EQ(j.at("displayTimeUnit"), "ms");
  std::vector<json> meta = OfPhase(j, "M");
  ASSERT_EQ(meta.size(), 2u);
  EXPECT_EQ(meta[0].at("name"), "process_name");
  EXPECT_EQ(meta[0].at("args").at("name"), "worker \"3\"");
  EXPECT_EQ(meta[1].at("name"), "thread_name");
  EXPECT_EQ(meta[1].at("args").at("name"), "trainer");
  EXPECT_EQ(meta[1].at("tid"), Profiler::CurrentTid());

  std::vector<json> complete = OfPhase(j, "X");
  ASSERT_EQ(complete.size(), 3u * 7 + 1);
  for (const json& e : complete) {
    for (const char* key : {"name", "cat", "ts", "dur", "pid", "tid"}) {
      EXPECT_TRUE(e.contains(key)) << key << " missing in " << e.dump();
    }
    EXPECT_EQ(e.at("pid"), 3);
    EXPECT_GE(Ns(e.at("dur")), 0);
  }
  // Sorted by start, parents first.
  EXPECT_EQ(complete[0].at("name"), "train_step");
  EXPECT_EQ(complete[0].at("args").at("step"), 0);
  EXPECT_EQ(complete[1].at("name"), "input_wait");
  EXPECT_EQ(complete[2].at("name"), "executable");
  EXPECT_EQ(complete[3].at("name"), "fused_kernel_0");
  EXPECT_EQ(complete[3].at("cat"), "compute");
  EXPECT_EQ(complete[3].at("args").at("flops"), 1.5e9);
  EXPECT_EQ(complete[3].at("args").at("impl"), "onednn");
  ExpectProperNesting(j.at("traceEvents"));

  std::vector<json> instants = OfPhase(j, "i");
  ASSERT_EQ(instants.size(), 3u);
  EXPECT_EQ(instants[0].at("s"), "t");
  std::vector<json> counters = OfPhase(j, "C");
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0].at("args").at("examples_per_sec"), 1234.5);
}

// A track of its own for events measured on another thread (a communication thread's
// collectives): its own tid, named, holding the events added to it.
TEST(ProfilerTest, NewTrackHoldsEventsAddedToIt) {
  Profiler p(Profiler::Options{.enabled = true});
  p.SetThreadName("trainer");
  const int comm = p.NewTrack("communication");
  EXPECT_NE(comm, Profiler::CurrentTid());
  p.AddComplete("collective", "all_reduce %3 f32[8]", 1000, 3000, {}, comm);
  p.AddComplete("kernel", "all_reduce %3 (wait)", 2000, 3000);
  json j = json::parse(p.ToJson());
  bool named = false;
  for (const json& m : OfPhase(j, "M"))
    named |= m.at("name") == "thread_name" && m.at("tid") == comm &&
             m.at("args").at("name") == "communication";
  EXPECT_TRUE(named);
  std::vector<json> complete = OfPhase(j, "X");
  ASSERT_EQ(complete.size(), 2u);
  for (const json& e : complete)
    EXPECT_EQ(e.at("tid") == comm, e.at("cat") == "collective") << e.dump();
}

TEST(ProfilerTest, ThreadSafeAndNestedPerThread) {
  Profiler::Options opt;
  opt.enabled = true;
  Profiler p(opt);
  constexpr int kThreads = 4, kIters = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&p, t] {
      p.SetThreadName("worker " + std::to_string(t));
      for (int i = 0; i < kIters; ++i) {
        auto a = p.Scope("outer", "a");
        auto b = p.Scope("inner", "b");
        auto c = p.Scope("inner", "c");
      }
    });
  }
  for (auto& th : threads) th.join();
  json j = json::parse(p.ToJson());
  std::vector<json> complete = OfPhase(j, "X");
  EXPECT_EQ(complete.size(), size_t{kThreads} * kIters * 3);
  std::set<int64_t> tids;
  for (const json& e : complete) tids.insert(e.at("tid").get<int64_t>());
  EXPECT_EQ(tids.size(), size_t{kThreads});
  EXPECT_EQ(OfPhase(j, "M").size(), 1u + kThreads);
  ExpectProperNesting(j.at("traceEvents"));
}

TEST(ProfilerTest, MovedScopeRecordsOnce) {
  Profiler::Options opt;
  opt.enabled = true;
  Profiler p(opt);
  {
    auto a = p.Scope("c", "moved");
    Profiler::ScopedEvent b = std::move(a);
    EXPECT_FALSE(a.active());
    EXPECT_TRUE(b.active());
    Profiler::ScopedEvent c;
    c = std::move(b);
  }
  ASSERT_EQ(p.Events().size(), 1u);
  EXPECT_EQ(p.Events()[0].name, "moved");
}

TEST(ProfilerTest, ToggleAndDropPastLimit) {
  Profiler::Options opt;
  opt.max_events = 5;
  Profiler p(opt);
  p.Reserve(1000);  // capped at max_events; records nothing
  EXPECT_TRUE(p.Events().empty());
  p.set_enabled(true);
  for (int i = 0; i < 8; ++i) {
    auto s = p.Scope("c", "e");
  }
  p.set_enabled(false);
  { auto s = p.Scope("c", "ignored"); }
  EXPECT_EQ(p.Events().size(), 5u);
  EXPECT_EQ(p.dropped(), 3u);
  json j = json::parse(p.ToJson());
  EXPECT_EQ(j.at("otherData").at("dropped_events"), 3);
  p.Clear();
  EXPECT_TRUE(p.Events().empty());
  EXPECT_EQ(p.dropped(), 0u);
}

TEST(ProfilerTest, ExplicitEventsAndEscaping) {
  Profiler::Options opt;
  opt.enabled = true;
  Profiler p(opt);
  // Exact microsecond decimals from nanoseconds.
  p.AddComplete("ckpt", "write \"shard\"\n\t\x01", 1'000'001'234, 1'000'501'235,
                {{"bytes", int64_t{1} << 40}, {"nan", NAN}, {"path", "/a\\b\xff"}}, /*tid=*/99);
  std::string text = p.ToJson();
  EXPECT_THAT(text, ::testing::HasSubstr("\"ts\":1000001.234,\"dur\":500.001"));
  json j = json::parse(text);
  std::vector<json> complete = OfPhase(j, "X");
  ASSERT_EQ(complete.size(), 1u);
  EXPECT_EQ(complete[0].at("name"), "write \"shard\"\n\t\x01");
  EXPECT_EQ(complete[0].at("tid"), 99);
  EXPECT_EQ(complete[0].at("args").at("bytes"), int64_t{1} << 40);
  EXPECT_TRUE(complete[0].at("args").at("nan").is_null());
  EXPECT_EQ(complete[0].at("args").at("path"), "/a\\b\xef\xbf\xbd");  // invalid byte -> U+FFFD
}

TEST(ProfilerTest, OtherDataJoinsTheTraceMetadata) {
  Profiler p;  // disabled: metadata is recorded anyway
  EXPECT_EQ(json::parse(p.ToJson()).at("otherData").size(), 3u);
  p.SetOtherData("memory_mib/arena", 412.5);
  p.SetOtherData("verdict", "matmul-bound");
  p.SetOtherData("steps", int64_t{2});
  p.SetOtherData("steps", int64_t{3});  // replaced, not repeated
  json other = json::parse(p.ToJson()).at("otherData");
  EXPECT_EQ(other.at("producer"), "kiln");
  EXPECT_EQ(other.at("dropped_events"), 0);
  EXPECT_EQ(other.at("memory_mib/arena"), 412.5);
  EXPECT_EQ(other.at("verdict"), "matmul-bound");
  EXPECT_EQ(other.at("steps"), 3);
  EXPECT_EQ(other.size(), 6u);
}

TEST(ProfilerTest, WriteJsonAtomically) {
  const std::string path = kiln::test_support::MakeTempDir("trace_test") + "/trace.json";
  Profiler::Options opt;
  opt.enabled = true;
  Profiler p(opt);
  { auto s = p.Scope("compile", "compile"); }
  ASSERT_TRUE(p.WriteJson(path).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str());
  EXPECT_EQ(OfPhase(j, "X").size(), 1u);
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  EXPECT_EQ(p.WriteJson("/nonexistent/dir/trace.json").code(), absl::StatusCode::kNotFound);
}

TEST(ProfilerTest, WriteJsonGoesThroughTheEnvAndSurvivesACrashWhole) {
  Profiler::Options opt;
  opt.enabled = true;
  Profiler p(opt);
  { auto s = p.Scope("compile", "compile"); }
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  ASSERT_TRUE(env.CreateDir("/run").ok());
  ASSERT_TRUE(env.SyncDir("/").ok());
  ASSERT_TRUE(env.SyncDir("/run").ok());
  ASSERT_TRUE(WriteStringToFile(&env, "old", "/run/trace.json", /*sync=*/true).ok());
  ASSERT_TRUE(env.SyncDir("/run").ok());
  ASSERT_TRUE(p.WriteJson("/run/trace.json", &env).ok());
  auto text = ReadFileToString(&env, "/run/trace.json");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(OfPhase(json::parse(*text), "X").size(), 1u);
  EXPECT_FALSE(env.FileExists("/run/trace.json.tmp"));
  // Power loss before the rename is made durable: the old file, whole (never a torn new one).
  ASSERT_TRUE(env.SimulateCrash().ok());
  text = ReadFileToString(&env, "/run/trace.json");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "old");
}

}  // namespace
}  // namespace kiln::train
