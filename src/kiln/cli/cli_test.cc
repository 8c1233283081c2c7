#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/cli/app.h"
#include "kiln/cli/internal/test_util.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/run_dir.h"
#include "nlohmann/json.hpp"

namespace kiln::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
namespace fs = std::filesystem;

std::string Digits() { return std::string(KILN_SOURCE_DIR) + "/examples/data/digits.csv.gz"; }

TEST(Cli, Version) {
  KilnResult r = Kiln({"version"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, std::string("kiln ") + KilnVersion() + "\n");
  EXPECT_THAT(std::string(KilnVersion()), MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+"));
}

TEST(Cli, UsageErrorsAreMessagesAndNonZeroExits) {
  const std::vector<std::vector<std::string>> bad = {
      {},                            // a subcommand is required
      {"frobnicate"},                // unknown subcommand
      {"demo", "--steps", "-3"},     // fails the positive check
      {"demo", "--steps", "many"},   // not a number
      {"demo", "--backend", "tpu"},  // not a backend
      {"demo", "--hidden", "64,0"},  // a zero width
      {"demo", "--no-such-flag"},    // unknown flag
      {"ir", "print"},               // missing FILE
  };
  for (const auto& args : bad) {
    KilnResult r = Kiln(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_NE(r.code, 0) << joined;
    EXPECT_FALSE(r.err.empty()) << joined;
  }
  EXPECT_THAT(Kiln({"demo", "--backend", "tpu"}).err, HasSubstr("tpu"));
}

TEST(Cli, HelpGoesToStdoutAndSucceeds) {
  KilnResult r = Kiln({"demo", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--steps"));
  EXPECT_THAT(r.out, HasSubstr("--backend"));
}

TEST(Cli, DemoDataErrorsNameTheFile) {
  KilnResult missing = Kiln({"demo", "--data", "/nonexistent/digits.csv.gz"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err,
              HasSubstr("kiln demo: cannot open /nonexistent/digits.csv.gz: No such file"));

  std::string bad = WriteTemp("bad_digits.csv", "0,0,0\n");
  KilnResult malformed = Kiln({"demo", "--data", bad});
  EXPECT_EQ(malformed.code, 1);
  EXPECT_THAT(malformed.err, HasSubstr(bad + ":1: expected 65 columns"));

  KilnResult big_batch = Kiln({"demo", "--data", Digits(), "--batch", "5000"});
  EXPECT_EQ(big_batch.code, 1);
  EXPECT_THAT(big_batch.err, HasSubstr("--batch 5000 is larger than the training set"));
}

TEST(Cli, ShortDemoOnTheReferenceBackendAndItsIrRoundTrips) {
  const std::string ir_path = ::testing::TempDir() + "/train_step.kir";
  KilnResult r = Kiln({"demo", "--data", Digits(), "--backend", "reference", "--steps", "3",
                       "--batch", "16", "--hidden", "8", "--dump-ir", ir_path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("backend: reference"));
  EXPECT_THAT(r.out, HasSubstr("step     1  loss"));
  EXPECT_THAT(r.out, HasSubstr("held-out accuracy: "));
  EXPECT_THAT(r.out, HasSubstr("1438 train / 359 held out"));

  KilnResult check = Kiln({"ir", "check", ir_path});
  ASSERT_EQ(check.code, 0) << check.err;
  EXPECT_THAT(check.out, HasSubstr(ir_path + ": ok: graph @"));
  // Printing the dumped file reproduces it exactly (the printer is canonical).
  KilnResult print = Kiln({"ir", "print", ir_path});
  ASSERT_EQ(print.code, 0) << print.err;
  EXPECT_EQ(print.out, ReadFile(ir_path));
}

TEST(Cli, IrCheckAndPrint) {
  const std::string good = WriteTemp("good.kir", R"(
graph @tiny {
  %x = parameter() {index=0, name="x"} : f32[2,3]
  %y = relu(%x) : f32[2,3]
  return y = %y
}
)");
  KilnResult check = Kiln({"ir", "check", good});
  EXPECT_EQ(check.code, 0) << check.err;
  EXPECT_EQ(check.out, good + ": ok: graph @tiny, 2 nodes (1 parameters), 1 outputs\n");
  KilnResult print = Kiln({"ir", "print", good});
  EXPECT_EQ(print.code, 0) << print.err;
  EXPECT_THAT(print.out, HasSubstr("graph @tiny"));
  EXPECT_THAT(print.out, HasSubstr("relu"));

  const std::string bad = WriteTemp("bad.kir", "graph @t {\n  %x = frob() : f32[]\n}\n");
  KilnResult r = Kiln({"ir", "check", bad});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kiln ir check: " + bad + ": "));
  EXPECT_THAT(r.out, Not(HasSubstr("ok")));

  KilnResult missing = Kiln({"ir", "print", "/nonexistent.kir"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, HasSubstr("cannot open /nonexistent.kir"));
}

// ---- Issue 13: nothing a user does by mistake may destroy their work ----

std::string Example() { return std::string(KILN_SOURCE_DIR) + "/examples/mlp_digits.yaml"; }

std::string FreshDir(const std::string& name) {
  fs::path p =
      fs::path(::testing::TempDir()) / ("kiln_cli_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A short run of the example: `steps` steps, a checkpoint every `every`.
KilnResult TrainShort(const std::string& out, int steps, int every,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"train",        Example(),
                                   "--set",        "steps=" + std::to_string(steps),
                                   "--set",        "checkpoint_every=" + std::to_string(every),
                                   "--set",        "eval_every=0",
                                   "--set",        "eval_batches=1",
                                   "--output-dir", out};
  args.insert(args.end(), extra.begin(), extra.end());
  return Kiln(args);
}

// Every regular file under `dir` with its bytes.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = ReadFile(e.path());
  }
  return files;
}

std::string RunId(const std::string& dir) {
  return nlohmann::json::parse(ReadFile(dir + "/run.json")).value("run_id", std::string());
}

TEST(Cli, ExportNeverTouchesTheRunNorDeletesWhatItDidNotWrite) {
  const std::string w = FreshDir("export");
  const std::string run = w + "/run";
  ASSERT_EQ(TrainShort(run, 4, 2).code, 0);
  const auto before = Snapshot(run);
  ASSERT_TRUE(before.count("checkpoints/step_4/manifest.json"));

  // Into the run itself, inside it, or a folder that holds it: refused, the run untouched.
  for (const std::string& out : {run, run + "/", run + "/checkpoints", run + "/export", w}) {
    KilnResult r = Kiln({"export", run, "--out", out});
    EXPECT_EQ(r.code, 1) << out;
    EXPECT_THAT(r.err, HasSubstr("the run it exports")) << out;
    EXPECT_THAT(r.err, HasSubstr("Choose a folder outside it")) << out;
  }
  EXPECT_EQ(Snapshot(run), before);

  // An existing plain file: refused before anything is written (no renamed file, no artifact).
  const std::string file = w + "/model.bin";
  std::ofstream(file) << "precious";
  KilnResult f = Kiln({"export", run, "--out", file});
  EXPECT_EQ(f.code, 1);
  EXPECT_THAT(f.err, HasSubstr("is an existing file, not a folder; nothing was written"));
  EXPECT_EQ(ReadFile(file), "precious");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(w)) names.push_back(e.path().filename().string());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("run", "model.bin"));

  // A folder with the user's files: refused, and --overwrite adds the export next to them.
  const std::string mine = w + "/mine";
  fs::create_directories(mine);
  std::ofstream(mine + "/notes.txt") << "keep me";
  KilnResult refused = Kiln({"export", run, "--out", mine});
  EXPECT_EQ(refused.code, 1);
  EXPECT_THAT(refused.err, HasSubstr("is not empty (1 entry: notes.txt)"));
  EXPECT_THAT(refused.err, HasSubstr("Choose a new or empty folder, or pass --overwrite"));
  KilnResult added = Kiln({"export", run, "--out", mine, "--overwrite"});
  EXPECT_EQ(added.code, 0) << added.err;
  EXPECT_EQ(ReadFile(mine + "/notes.txt"), "keep me");
  EXPECT_TRUE(fs::exists(mine + "/manifest.json"));

  // An earlier export: replaced only with --overwrite, and only its own files.
  KilnResult again = Kiln({"export", run, "--out", mine});
  EXPECT_EQ(again.code, 1);
  EXPECT_THAT(again.err,
              HasSubstr("holds an earlier export; nothing was written. Pass --overwrite"));
  KilnResult replaced = Kiln({"export", run + "/checkpoints/step_2", "--out", mine, "--overwrite"});
  EXPECT_EQ(replaced.code, 0) << replaced.err;
  EXPECT_EQ(ReadFile(mine + "/notes.txt"), "keep me");
  EXPECT_THAT(ReadFile(mine + "/manifest.json"), HasSubstr("\"step\": \"2\""));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(mine)) left.push_back(e.path().filename().string());
  EXPECT_THAT(left, ::testing::UnorderedElementsAre("notes.txt", "manifest.json", "program.ir",
                                                    "weights.safetensors"));

  // A user's file under an export's name is never replaced, even with --overwrite.
  const std::string clash = w + "/clash";
  fs::create_directories(clash);
  std::ofstream(clash + "/manifest.json") << "my own manifest";
  KilnResult c = Kiln({"export", run, "--out", clash, "--overwrite"});
  EXPECT_EQ(c.code, 1);
  EXPECT_THAT(c.err, HasSubstr("which kiln export did not write and will not replace"));
  EXPECT_EQ(ReadFile(clash + "/manifest.json"), "my own manifest");
  EXPECT_EQ(Snapshot(run), before);
  fs::remove_all(w);
}

TEST(Cli, NoResumeOnAnOlderRunRefusesOrMovesItAside) {
  const std::string w = FreshDir("noresume");
  const std::string run = w + "/run";
  ASSERT_EQ(TrainShort(run, 8, 2).code, 0);  // the old run: step_4, step_6, step_8
  const std::string old_id = RunId(run);
  ASSERT_EQ(old_id.size(), 16u);
  const auto before = Snapshot(run);

  KilnResult refused = TrainShort(run, 4, 2, {"--no-resume"});
  EXPECT_EQ(refused.code, 1);
  EXPECT_THAT(refused.err,
              HasSubstr("already holds run " + old_id + " with checkpoints step_4..step_8"));
  EXPECT_THAT(refused.err, HasSubstr("add --replace"));
  EXPECT_EQ(Snapshot(run), before);

  KilnResult fresh = TrainShort(run, 4, 2, {"--no-resume", "--replace"});
  ASSERT_EQ(fresh.code, 0) << fresh.err;
  EXPECT_THAT(fresh.out, HasSubstr("moved the earlier run to " + run + "/replaced-"));
  // The old run is all there, moved aside; the new one has only its own checkpoints.
  std::string aside;
  for (const auto& e : fs::directory_iterator(run)) {
    if (e.path().filename().string().rfind("replaced-", 0) == 0) aside = e.path().string();
  }
  ASSERT_FALSE(aside.empty());
  for (const auto& [name, bytes] : before) {
    if (name != ".lock") EXPECT_EQ(ReadFile(aside + "/" + name), bytes) << name;
  }
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_2"));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step_4"));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step_8"));
  const std::string new_id = RunId(run);
  EXPECT_NE(new_id, old_id);
  EXPECT_THAT(ReadFile(run + "/checkpoints/step_4/manifest.json"),
              HasSubstr("\"run_id\":\"" + new_id + "\""));
  // Evaluating the folder evaluates the new run.
  KilnResult eval = Kiln({"eval", run, "--batches", "1"});
  EXPECT_EQ(eval.code, 0) << eval.err;
  EXPECT_THAT(eval.out, HasSubstr("step 4:"));
  // A rerun of a finished run says so instead of "steps 5..4" and "0 examples/s".
  KilnResult rerun = TrainShort(run, 4, 2);
  EXPECT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_THAT(rerun.out, HasSubstr("run already complete"));
  EXPECT_THAT(rerun.out, Not(HasSubstr("steps 5..4")));
  EXPECT_THAT(rerun.out, Not(HasSubstr("examples/s")));
  fs::remove_all(w);
}

TEST(Cli, ASecondTrainerOnTheSameFolderIsRefusedNamingThePid) {
  const std::string run = FreshDir("locked");
  absl::StatusOr<std::unique_ptr<train::RunDirLock>> held = train::RunDirLock::Acquire(run);
  ASSERT_TRUE(held.ok()) << held.status();
  KilnResult r = TrainShort(run, 4, 2);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("in use by another kiln train (process " + std::to_string(getpid()) +
                               " holds"));
  EXPECT_FALSE(fs::exists(run + "/metrics.jsonl"));
  held->reset();
  EXPECT_EQ(TrainShort(run, 4, 2).code, 0);
  fs::remove_all(run);
}

TEST(Cli, RunJsonSaysWhatTheCompilerRan) {
  nlohmann::json cpu_options, reference_options;
  {
    const std::string run = FreshDir("runjson_cpu");
    setenv("KILN_DISABLE_PASSES", "cse, fusion", 1);
    KilnResult r = TrainShort(run, 2, 2);
    unsetenv("KILN_DISABLE_PASSES");
    ASSERT_EQ(r.code, 0) << r.err;
    cpu_options = nlohmann::json::parse(ReadFile(run + "/run.json"))["compiler_options"];
    fs::remove_all(run);
  }
  {
    const std::string run = FreshDir("runjson_ref");
    KilnResult r = TrainShort(run, 2, 2, {"--backend", "reference"});
    ASSERT_EQ(r.code, 0) << r.err;
    reference_options = nlohmann::json::parse(ReadFile(run + "/run.json"))["compiler_options"];
    fs::remove_all(run);
  }
  EXPECT_EQ(cpu_options["optimize"], true);
  EXPECT_EQ(cpu_options["fusion"], false);
  EXPECT_EQ(cpu_options["disabled_passes"], nlohmann::json({"cse", "fusion"}));
  EXPECT_EQ(reference_options["optimize"], false);  // the reference backend runs no pass
  EXPECT_EQ(reference_options["fusion"], false);
  EXPECT_EQ(reference_options["disabled_passes"], nlohmann::json::array());
}

// The CLI reads KILN_DISABLE_PASSES (the compiler does not): a name that is no pass stops the
// command with the message naming it and the passes, before anything is trained.
TEST(Cli, UnknownPassInKilnDisablePassesIsAnError) {
  const std::string run = FreshDir("bad_disable");
  setenv("KILN_DISABLE_PASSES", "cse,csee", 1);
  KilnResult r = TrainShort(run, 2, 2);
  unsetenv("KILN_DISABLE_PASSES");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("KILN_DISABLE_PASSES names unknown pass 'csee'"));
  EXPECT_THAT(r.err, HasSubstr("the passes are decompose, simplify"));
  EXPECT_FALSE(fs::exists(run + "/metrics.jsonl"));
  fs::remove_all(run);
}

TEST(Cli, DivergenceStopsWithAdviceAndCommitsNoNonFiniteCheckpoint) {
  const std::string run = FreshDir("diverge");
  KilnResult r =
      TrainShort(run, 50, 1, {"--set", "optimizer.lr=1e30", "--set", "optimizer.clip_norm=0"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kiln train: training diverged at step "));
  EXPECT_THAT(r.err, HasSubstr("try a smaller optimizer.lr (now 1e+30"));
  EXPECT_THAT(r.out, Not(HasSubstr("done:")));
  // Every checkpoint it committed holds finite numbers (it stopped before saving any NaN).
  for (const auto& e : fs::directory_iterator(run + "/checkpoints")) {
    absl::StatusOr<nlohmann::json> meta = train::ReadCheckpointMetadata(e.path().string());
    ASSERT_TRUE(meta.ok()) << e.path();
    EXPECT_LE((*meta)["step"].get<int64_t>(), 1) << e.path();  // only the step before the NaNs
  }
  fs::remove_all(run);
}

TEST(Cli, EvalSaysWhichCheckpointItSkippedAndWhy) {
  const std::string run = FreshDir("evalcorrupt");
  ASSERT_EQ(TrainShort(run, 4, 2).code, 0);
  for (const auto& e : fs::directory_iterator(run + "/checkpoints/step_4")) {
    if (e.path().extension() == ".safetensors") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-4, std::ios::end);
      f.write("XXXX", 4);
    }
  }
  KilnResult r = Kiln({"eval", run, "--batches", "1"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kiln eval: note: skipped step_4: DATA_LOSS"));
  EXPECT_THAT(r.err, HasSubstr("CRC32C mismatch"));
  EXPECT_THAT(r.err, HasSubstr("using " + run + "/checkpoints/step_2"));
  EXPECT_THAT(r.out, HasSubstr("step 2:"));
  fs::remove_all(run);
}

TEST(Cli, ACheckpointCopiedOutOfItsRunEvaluatesAndExportsWithConfig) {
  const std::string w = FreshDir("loose");
  ASSERT_EQ(TrainShort(w + "/run", 2, 2).code, 0);
  fs::create_directories(w + "/kept");
  fs::copy(w + "/run/checkpoints/step_2", w + "/kept/step_2", fs::copy_options::recursive);
  KilnResult no_config = Kiln({"eval", w + "/kept/step_2"});
  EXPECT_EQ(no_config.code, 1);
  EXPECT_THAT(no_config.err, HasSubstr("--config RUNDIR/config.yaml"));
  KilnResult eval =
      Kiln({"eval", w + "/kept/step_2", "--config", w + "/run/config.yaml", "--batches", "1"});
  EXPECT_EQ(eval.code, 0) << eval.err;
  EXPECT_THAT(eval.out, HasSubstr("step 2:"));
  KilnResult exp = Kiln(
      {"export", w + "/kept/step_2", "--config", w + "/run/config.yaml", "--out", w + "/artifact"});
  EXPECT_EQ(exp.code, 0) << exp.err;
  EXPECT_TRUE(fs::exists(w + "/artifact/manifest.json"));
  fs::remove_all(w);
}

TEST(Cli, TrainErrorsBlameWhatWasWrong) {
  const std::string w = FreshDir("blame");
  KilnResult dir = Kiln({"train", w});
  EXPECT_EQ(dir.code, 1);
  EXPECT_THAT(dir.err, HasSubstr("is a directory, not a YAML config file"));
  KilnResult section = Kiln({"train", Example(), "--set", "optimizer=5"});
  EXPECT_THAT(section.err, HasSubstr("--set optimizer=5: optimizer: expected a mapping of keys"));
  EXPECT_THAT(section.err, Not(HasSubstr("line 1")));
  KilnResult seed = Kiln({"train", Example(), "--set", "seed=-1"});
  EXPECT_THAT(seed.err, HasSubstr("seed: expected a non-negative integer"));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"train", Example(), "--max-restarts", "-1"},
        std::vector<std::string>{"export", w, "--out", w + "/x", "--batch", "0"}}) {
    KilnResult r = Kiln(args);
    EXPECT_NE(r.code, 0);
    EXPECT_THAT(r.err, Not(HasSubstr("179769313486231570814527423731704356798070567525844996598")));
    EXPECT_THAT(r.err, HasSubstr(args[args.size() - 2]));
  }
  fs::remove_all(w);
}

}  // namespace
}  // namespace kiln::cli
