#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/cli/app.h"

namespace kiln::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

struct Result {
  int code;
  std::string out, err;
};

Result Kiln(std::vector<std::string> args) {
  args.insert(args.begin(), "kiln");
  std::ostringstream out, err;
  int code = RunKiln(args, out, err);
  return {code, out.str(), err.str()};
}

std::string Digits() { return std::string(KILN_SOURCE_DIR) + "/examples/data/digits.csv.gz"; }

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(Cli, Version) {
  Result r = Kiln({"version"});
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
    Result r = Kiln(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_NE(r.code, 0) << joined;
    EXPECT_FALSE(r.err.empty()) << joined;
  }
  EXPECT_THAT(Kiln({"demo", "--backend", "tpu"}).err, HasSubstr("tpu"));
}

TEST(Cli, HelpGoesToStdoutAndSucceeds) {
  Result r = Kiln({"demo", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--steps"));
  EXPECT_THAT(r.out, HasSubstr("--backend"));
}

TEST(Cli, DemoDataErrorsNameTheFile) {
  Result missing = Kiln({"demo", "--data", "/nonexistent/digits.csv.gz"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err,
              HasSubstr("kiln demo: cannot open /nonexistent/digits.csv.gz: No such file"));

  std::string bad = WriteTemp("bad_digits.csv", "0,0,0\n");
  Result malformed = Kiln({"demo", "--data", bad});
  EXPECT_EQ(malformed.code, 1);
  EXPECT_THAT(malformed.err, HasSubstr(bad + ":1: expected 65 columns"));

  Result big_batch = Kiln({"demo", "--data", Digits(), "--batch", "5000"});
  EXPECT_EQ(big_batch.code, 1);
  EXPECT_THAT(big_batch.err, HasSubstr("--batch 5000 is larger than the training set"));
}

TEST(Cli, ShortDemoOnTheReferenceBackendAndItsIrRoundTrips) {
  const std::string ir_path = ::testing::TempDir() + "/train_step.kir";
  Result r = Kiln({"demo", "--data", Digits(), "--backend", "reference", "--steps", "3", "--batch",
                   "16", "--hidden", "8", "--dump-ir", ir_path});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("backend: reference"));
  EXPECT_THAT(r.out, HasSubstr("step     1  loss"));
  EXPECT_THAT(r.out, HasSubstr("held-out accuracy: "));
  EXPECT_THAT(r.out, HasSubstr("1438 train / 359 held out"));

  Result check = Kiln({"ir", "check", ir_path});
  ASSERT_EQ(check.code, 0) << check.err;
  EXPECT_THAT(check.out, HasSubstr(ir_path + ": ok: graph @"));
  // Printing the dumped file reproduces it exactly (the printer is canonical).
  Result print = Kiln({"ir", "print", ir_path});
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
  Result check = Kiln({"ir", "check", good});
  EXPECT_EQ(check.code, 0) << check.err;
  EXPECT_EQ(check.out, good + ": ok: graph @tiny, 2 nodes (1 parameters), 1 outputs\n");
  Result print = Kiln({"ir", "print", good});
  EXPECT_EQ(print.code, 0) << print.err;
  EXPECT_THAT(print.out, HasSubstr("graph @tiny"));
  EXPECT_THAT(print.out, HasSubstr("relu"));

  const std::string bad = WriteTemp("bad.kir", "graph @t {\n  %x = frob() : f32[]\n}\n");
  Result r = Kiln({"ir", "check", bad});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kiln ir check: " + bad + ": "));
  EXPECT_THAT(r.out, Not(HasSubstr("ok")));

  Result missing = Kiln({"ir", "print", "/nonexistent.kir"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, HasSubstr("cannot open /nonexistent.kir"));
}

}  // namespace
}  // namespace kiln::cli
