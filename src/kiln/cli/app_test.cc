// The `kiln` command's own usage errors (a mistyped command gets the nearest one) and how
// `kiln demo` finds its data when --data is not given.
#include "kiln/cli/app.h"

#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/cli/demo.h"
#include "kiln/cli/internal/test_util.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(App, MistypedCommandSuggestsTheNearest) {
  KilnResult r = Kiln({"trian", "examples/mlp_digits.yaml"});
  EXPECT_EQ(r.code, 109);
  EXPECT_EQ(r.err, "kiln: unknown command 'trian'; did you mean 'train'?\n");
  EXPECT_EQ(r.out, "");

  EXPECT_THAT(Kiln({"exprot", "run"}).err, HasSubstr("did you mean 'export'?"));
  EXPECT_THAT(Kiln({"evl"}).err, HasSubstr("did you mean 'eval'?"));
  EXPECT_THAT(Kiln({"dmeo"}).err, HasSubstr("did you mean 'demo'?"));
  EXPECT_THAT(Kiln({"exp"}).err, HasSubstr("did you mean 'export'?"));  // a prefix
  // Nested commands too.
  KilnResult ir = Kiln({"ir", "prnt", "x.kir"});
  EXPECT_EQ(ir.code, 109);
  EXPECT_EQ(ir.err, "kiln ir: unknown command 'prnt'; did you mean 'print'?\n");
}

TEST(App, UnknownOrMissingCommandListsTheCommands) {
  KilnResult r = Kiln({"frobnicate"});
  EXPECT_EQ(r.code, 109);
  EXPECT_THAT(r.err, HasSubstr("kiln: unknown command 'frobnicate'; the commands are "));
  EXPECT_THAT(r.err, HasSubstr("data, demo, eval, export, ir, predict, quantize, serve, train"));
  EXPECT_THAT(r.err, HasSubstr("kiln --help"));

  KilnResult none = Kiln({});
  EXPECT_EQ(none.code, 106);
  EXPECT_THAT(none.err, HasSubstr("kiln: a command is required: data, demo, eval, export, ir, "
                                  "predict, quantize, serve, train, version"));
  EXPECT_THAT(Kiln({"ir"}).err, HasSubstr("kiln ir: a command is required: check, print"));

  // Flags and real commands are left to the parser.
  EXPECT_EQ(Kiln({"--version"}).code, 0);
  EXPECT_EQ(Kiln({"--help"}).code, 0);
  EXPECT_EQ(Kiln({"version"}).code, 0);
}

// Runs the body in another working directory and comes back.
class InDirectory {
 public:
  explicit InDirectory(const fs::path& dir) : old_(fs::current_path()) { fs::current_path(dir); }
  ~InDirectory() { fs::current_path(old_); }

 private:
  fs::path old_;
};

TEST(Demo, FindsItsDataOutsideTheSourceTree) {
  fs::path elsewhere = fs::path(::testing::TempDir()) / "kiln_demo_elsewhere";
  fs::create_directories(elsewhere);
  InDirectory in(elsewhere);

  std::vector<std::string> candidates = DefaultDigitsDataCandidates();
  ASSERT_FALSE(candidates.empty());
  // The current directory first, then the binary's folders, then the source tree.
  EXPECT_EQ(candidates.front(),
            (fs::current_path() / "examples/data/digits.csv.gz").lexically_normal().string());
  fs::path exe = fs::read_symlink("/proc/self/exe");
  ASSERT_GE(candidates.size(), 2u);
  EXPECT_EQ(candidates[1],
            (exe.parent_path() / "examples/data/digits.csv.gz").lexically_normal().string());
  EXPECT_THAT(candidates, Contains(std::string(KILN_SOURCE_DIR) + "/examples/data/digits.csv.gz"));
  absl::StatusOr<std::string> found = FindDefaultDigitsData(candidates);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(fs::exists(*found));

  KilnResult r =
      Kiln({"demo", "--backend", "reference", "--steps", "2", "--batch", "8", "--hidden", "4"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("examples/data/digits.csv.gz: 1797 images"));
}

TEST(Demo, MissingDataSaysWhereItLookedAndHowToPassIt) {
  absl::StatusOr<std::string> found =
      FindDefaultDigitsData({"/nonexistent/a/digits.csv.gz", "/nonexistent/b/digits.csv.gz"});
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  const std::string m(found.status().message());
  EXPECT_THAT(m, HasSubstr("cannot find the digits data examples/data/digits.csv.gz"));
  EXPECT_THAT(m,
              HasSubstr("looked in: /nonexistent/a/digits.csv.gz, /nonexistent/b/digits.csv.gz"));
  EXPECT_THAT(m, HasSubstr("pass --data FILE"));
}

}  // namespace
}  // namespace kiln::cli
