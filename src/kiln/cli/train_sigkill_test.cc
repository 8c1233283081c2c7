// `kiln train` under SIGKILL (docs/train.md "Resume semantics"): the real binary is started,
// killed with SIGKILL at seeded-random moments and restarted on the same output directory, again
// and again, and must end bit-identical to an uninterrupted run: the same loss, learning rate,
// gradient norm (and evaluation) at every step in metrics.jsonl, and the same final parameters,
// optimizer state and iterator state in the last checkpoint. After every kill the next start
// must resume from the newest checkpoint committed before the kill (verified by its CRCs, never
// skipped as damaged). One scenario aims the kills at checkpoint writes (a `step_N.tmp-*`
// directory is on disk), so an interrupted save is shown never to damage the previous one.
//
// The seed is printed and in every failure message; KILN_SIGKILL_SEED=N replays its choices
// (the kill moments still depend on timing). KILN_SIGKILL_KILLS=N sets kills per scenario
// (default 5; the CTest train_sigkill_test_long uses more).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/train/checkpoint.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A `kiln train` child process with stdout+stderr in `log`.
pid_t Start(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {KILN_BINARY, "train"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c;
  for (std::string& a : argv) c.push_back(a.data());
  c.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f != nullptr) {
      dup2(fileno(f), STDOUT_FILENO);
      dup2(fileno(f), STDERR_FILENO);
    }
    execv(c[0], c.data());
    _exit(127);
  }
  return pid;
}

// Polls until the child exits (returns its wait status) or `seconds` pass (returns -1).
int WaitFor(pid_t pid, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 || Clock::now() >= end) return -1;
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// checkpoints/: committed step numbers (sorted) and the names of interrupted saves.
struct CheckpointDir {
  std::vector<int64_t> committed;
  std::vector<std::string> leftovers;
};
CheckpointDir ListCheckpoints(const std::string& root) {
  CheckpointDir d;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = kiln::train::ParseCheckpointDirName(name);
    if (step >= 0) {
      d.committed.push_back(step);
    } else if (name.find(".tmp-") != std::string::npos) {
      d.leftovers.push_back(name);
    }
  }
  std::sort(d.committed.begin(), d.committed.end());
  return d;
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.insert(e.path().filename().string());
  return names;
}

// metrics.jsonl as (step, key) -> value for the keys a resumed run must reproduce exactly. Lines
// of recomputed steps repeat; each repeat must equal the first. Errors go to `problems`.
using Metrics = std::map<std::pair<int64_t, std::string>, double>;
Metrics ReadMetrics(const std::string& path, std::vector<std::string>* problems) {
  static const std::set<std::string> kExact = {"loss",  "lr",        "grad_norm",
                                               "epoch", "eval/loss", "eval/accuracy"};
  Metrics m;
  std::istringstream in(ReadFile(path));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step")) {
      problems->push_back(path + ":" + std::to_string(n) + ": not a metrics line: " + line);
      continue;
    }
    const int64_t step = j["step"].get<int64_t>();
    for (const auto& [key, v] : j.items()) {
      if (!kExact.count(key) || !v.is_number()) continue;
      auto [it, fresh] = m.emplace(std::make_pair(step, key), v.get<double>());
      if (!fresh && it->second != v.get<double>()) {
        std::ostringstream s;
        s.precision(17);
        s << path << ": step " << step << " " << key << " was logged as " << it->second
          << " and, recomputed after a kill, as " << v.get<double>();
        problems->push_back(s.str());
      }
    }
  }
  return m;
}

struct Scenario {
  std::string name;
  std::vector<std::string> sets;  // --set overrides of examples/mlp_digits.yaml
  int64_t steps = 0;
  bool aim_at_writes = false;  // kill while a save is in flight, not at any moment
};
void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

class TrainSigkillTest : public ::testing::TestWithParam<Scenario> {
 protected:
  void SetUp() override {
    // Same thread count for every run (bit-identity holds per machine and thread count).
    setenv("OMP_NUM_THREADS", "2", /*overwrite=*/0);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    const char* s = std::getenv("KILN_SIGKILL_SEED");
    seed_ = s != nullptr ? std::strtoull(s, nullptr, 10) : std::random_device()();
    const char* k = std::getenv("KILN_SIGKILL_KILLS");
    kills_ = k != nullptr ? std::max(1, std::atoi(k)) : 5;
    work_ = (fs::temp_directory_path() /
             ("kiln_sigkill_" + GetParam().name + "_" + std::to_string(getpid())))
                .string();
    fs::remove_all(work_);
    fs::create_directories(work_);
    std::cout << "[" << GetParam().name << "] seed " << seed_ << " (KILN_SIGKILL_SEED), " << kills_
              << " kills, work dir " << work_ << std::endl;
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(work_);
  }

  std::vector<std::string> Args(const std::string& out) const {
    std::vector<std::string> a = {std::string(KILN_SOURCE_DIR) + "/examples/mlp_digits.yaml",
                                  "--output-dir",
                                  out,
                                  "--set",
                                  "steps=" + std::to_string(GetParam().steps),
                                  "--set",
                                  "log_every=1"};
    for (const std::string& s : GetParam().sets) {
      a.push_back("--set");
      a.push_back(s);
    }
    return a;
  }

  uint64_t seed_ = 0;
  int kills_ = 5;
  std::string work_;
};

TEST_P(TrainSigkillTest, KilledAndResumedRunIsBitIdenticalToAnUninterruptedOne) {
  const Scenario& sc = GetParam();
  SCOPED_TRACE("seed " + std::to_string(seed_) +
               " (rerun with KILN_SIGKILL_SEED=" + std::to_string(seed_) + "), work dir " + work_);
  std::mt19937_64 rng(seed_);

  // The uninterrupted run: the reference, and how long a run takes (to place kills).
  const std::string straight = work_ + "/straight";
  auto t0 = Clock::now();
  pid_t pid = Start(Args(straight), work_ + "/straight.log");
  int status = -1;
  double startup_seconds = 0;  // until the first metrics line: process start, data, compile
  while (Seconds(Clock::now() - t0) < 120) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      status = st;
      break;
    }
    std::error_code ec;
    if (startup_seconds == 0 && fs::file_size(straight + "/metrics.jsonl", ec) > 0 && !ec) {
      startup_seconds = Seconds(Clock::now() - t0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  const double run_seconds = Seconds(Clock::now() - t0);
  if (startup_seconds == 0) startup_seconds = run_seconds;
  if (status == -1) KillAndReap(pid);
  ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "uninterrupted run failed:\n"
      << ReadFile(work_ + "/straight.log");
  std::vector<std::string> problems;
  const Metrics want = ReadMetrics(straight + "/metrics.jsonl", &problems);
  // The background write time of a save (write + fsync + commit), to aim kills into it.
  std::vector<double> write_ms;
  {
    std::istringstream in(ReadFile(straight + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("checkpoint/write_ms")) {
        write_ms.push_back(j["checkpoint/write_ms"].get<double>());
      }
    }
  }
  std::sort(write_ms.begin(), write_ms.end());
  const double median_write_ms = write_ms.empty() ? 1.0 : write_ms[write_ms.size() / 2];
  std::cout << "[" << sc.name << "] uninterrupted: " << run_seconds << " s (start-up "
            << startup_seconds << " s), median save " << median_write_ms << " ms" << std::endl;

  // The interrupted run: start, SIGKILL, restart on the same directory, ...
  const std::string out = work_ + "/killed", root = out + "/checkpoints";
  int kills = 0, mid_write = 0, attempts = 0, resumed = 0;
  std::vector<std::string> story, last_leftovers;
  int64_t expect_resume = -1;  // newest committed checkpoint when the last process died
  bool finished = false;
  // `completed`: the process ran to the end, so it must have logged its resume.
  auto check_resume = [&](const std::string& log_path, bool completed) {
    const std::string log = ReadFile(log_path);
    for (size_t at = log.find("skipped step_"); at != std::string::npos;
         at = log.find("skipped step_", at + 1)) {
      ADD_FAILURE() << log_path << ": a checkpoint was skipped as damaged: "
                    << log.substr(at, log.find('\n', at) - at);
    }
    const size_t at = log.find("resumed from ");
    if (at == std::string::npos) {  // nothing to resume, or killed before it logged
      EXPECT_FALSE(completed && expect_resume != -1)
          << log_path << ": did not resume from step_" << expect_resume << ":\n"
          << log;
      return;
    }
    const std::string line = log.substr(at, log.find('\n', at) - at);
    ++resumed;
    EXPECT_NE(expect_resume, -1) << log_path
                                 << ": resumed although nothing was committed: " << line;
    EXPECT_NE(line.find("/step_" + std::to_string(expect_resume) + " "), std::string::npos)
        << log_path << ": expected to resume from step_" << expect_resume
        << ", the newest checkpoint committed before the kill; got: " << line;
  };
  const int max_attempts = 4 * kills_;
  for (int i = 0; !finished && (sc.aim_at_writes ? mid_write < kills_ : kills < kills_) &&
                  attempts < max_attempts;
       ++i) {
    // The final checkpoint is committed (a kill landed after it): only the final run is left.
    // Checked before starting a process: one started and left running here would hold the run
    // lock when the final run starts, which then fails as "in use by another kiln train".
    if (!sc.aim_at_writes && expect_resume == sc.steps) break;
    ++attempts;
    const std::string log = work_ + "/run" + std::to_string(i) + ".log";
    pid = Start(Args(out), log);
    std::string when;
    if (!sc.aim_at_writes) {
      // Anywhere in a run: start-up, training, evaluation, a save, the final checkpoint. The
      // window is the start-up plus a share of the training time left after the checkpoint it
      // resumes from, so that the kills spread over the whole run (about 3/kills of it each).
      const double left = 1.0 - static_cast<double>(std::max<int64_t>(expect_resume, 0)) /
                                    static_cast<double>(sc.steps);
      const double window =
          startup_seconds + (run_seconds - startup_seconds) * left * std::min(1.0, 3.0 / kills_);
      const double delay = std::uniform_real_distribution<double>(0, window)(rng);
      status = WaitFor(pid, delay);
      when = "after " + std::to_string(delay) + " s";
    } else {
      // While a save is in flight: wait for the k-th new entry in checkpoints/ (a save begins
      // with its step_N.tmp-* directory), then a random part of a save's duration.
      const int k = std::uniform_int_distribution<int>(1, 3)(rng);
      const double extra = std::uniform_real_distribution<double>(0, 0.8 * median_write_ms)(rng);
      std::set<std::string> seen = Entries(root);
      int fresh = 0;
      status = -1;
      const auto end = Clock::now() + std::chrono::seconds(120);
      while (fresh < k && Clock::now() < end) {
        int st = 0;
        if (waitpid(pid, &st, WNOHANG) == pid) {
          status = st;
          break;
        }
        for (const std::string& n : Entries(root)) {
          if (seen.insert(n).second) ++fresh;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (status == -1) status = WaitFor(pid, extra / 1e3);
      when = std::to_string(extra) + " ms into save #" + std::to_string(k);
    }
    if (status != -1) {  // it finished before the kill
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "run " << i << " exited with status " << status << ":\n"
          << ReadFile(log);
      check_resume(log, /*completed=*/true);
      finished = true;
      story.push_back("finished");
      break;
    }
    KillAndReap(pid);
    ++kills;
    check_resume(log, /*completed=*/false);
    CheckpointDir d = ListCheckpoints(root);
    const bool new_leftover = !d.leftovers.empty() && d.leftovers != last_leftovers;
    if (new_leftover) ++mid_write;
    last_leftovers = d.leftovers;
    expect_resume = d.committed.empty() ? -1 : d.committed.back();
    story.push_back("kill " + when + " -> newest step_" + std::to_string(expect_resume) +
                    (new_leftover ? " + interrupted save " + d.leftovers.back() : ""));
  }
  if (!finished) {
    const std::string log = work_ + "/final.log";
    pid = Start(Args(out), log);
    status = WaitFor(pid, 120);
    if (status == -1) KillAndReap(pid);
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "final run failed:\n"
        << ReadFile(log);
    check_resume(log, /*completed=*/true);
  }
  std::cout << "[" << sc.name << "] " << kills << " kills (" << mid_write << " during a save), "
            << resumed << " resumes:\n";
  for (const std::string& s : story) std::cout << "  " << s << "\n";
  std::cout << std::flush;
  EXPECT_EQ(ListCheckpoints(root).leftovers.size(), 0u) << "an interrupted save was not cleaned up";
  if (sc.aim_at_writes) {
    EXPECT_GE(mid_write, 1) << "no kill landed during a save: nothing about saves was tested";
  }

  // The same metrics at every step.
  const Metrics got = ReadMetrics(out + "/metrics.jsonl", &problems);
  for (size_t i = 0; i < problems.size() && i < 5; ++i) ADD_FAILURE() << problems[i];
  EXPECT_EQ(problems.size(), 0u) << "metrics problems (the first 5 above)";
  int64_t losses = 0;
  for (const auto& [key, value] : want) {
    auto it = got.find(key);
    if (it == got.end()) {
      ADD_FAILURE() << "step " << key.first << ": no " << key.second << " in the killed run";
      break;
    }
    if (it->second != value) {
      ADD_FAILURE() << std::setprecision(17) << "step " << key.first << " " << key.second
                    << ": uninterrupted " << value << ", killed and resumed " << it->second;
      break;
    }
    if (key.second == "loss") ++losses;
  }
  EXPECT_EQ(losses, sc.steps);
  EXPECT_EQ(got.size(), want.size());

  // The same final checkpoint: parameters, optimizer state, iterator and RNG state, bit for bit.
  auto a = kiln::train::CheckpointManager::Open(straight + "/checkpoints");
  auto b = kiln::train::CheckpointManager::Open(root);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<kiln::train::Checkpoint> ca = (*a)->Restore(sc.steps);
  absl::StatusOr<kiln::train::Checkpoint> cb = (*b)->Restore(sc.steps);
  ASSERT_TRUE(ca.ok()) << ca.status();
  ASSERT_TRUE(cb.ok()) << cb.status();
  ASSERT_EQ(ca->tensors.size(), cb->tensors.size());
  for (const auto& [name, t] : ca->tensors) {
    auto it = cb->tensors.find(name);
    ASSERT_NE(it, cb->tensors.end()) << name;
    EXPECT_TRUE(t.BitwiseEquals(it->second)) << "final " << name << " differs";
  }
  for (const char* key : {"step", "rng", "data"}) {
    EXPECT_EQ(ca->metadata[key], cb->metadata[key]) << "checkpoint metadata '" << key << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, TrainSigkillTest,
    ::testing::Values(
        // The example MLP (SGD with momentum, CSV source, shuffled epochs, evaluation), killed at
        // any moment. Saves every 40 steps; ~0.4 ms steps.
        Scenario{.name = "anytime",
                 .sets = {"checkpoint_every=40", "eval_every=400", "keep_last=2"},
                 .steps = 2000},
        // A wider MLP with AdamW on the input pipeline (background prefetch, 256-slot shuffle
        // buffer), saving every 3 steps so a save (7.7 MB with fsync) is nearly always in flight;
        // kills aimed into saves.
        Scenario{.name = "during_saves",
                 .sets = {"model.hidden=[768,768]", "optimizer.kind=adamw", "optimizer.lr=0.002",
                          "data.source=digits:" KILN_SOURCE_DIR "/examples/data/digits.csv.gz",
                          "data.shuffle_buffer=256", "checkpoint_every=3", "eval_every=0",
                          "keep_last=2"},
                 .steps = 45,
                 .aim_at_writes = true}),
    [](const ::testing::TestParamInfo<Scenario>& info) { return info.param.name; });

}  // namespace
