// `kiln data ...` through the command line (RunKiln): exit codes, the summary, plain progress
// lines when stderr is not a terminal, and errors naming what was wrong.
#include <png.h>

#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/cli/app.h"
#include "kiln/data/import/image_codec.h"
#include "tests/support/temp_dir.h"

namespace kiln::cli {
namespace {

struct Result {
  int rc;
  std::string out, err;
};

Result Kiln(std::vector<std::string> args) {
  args.insert(args.begin(), "kiln");
  std::ostringstream out, err;
  const int rc = RunKiln(args, out, err);
  return {rc, out.str(), err.str()};
}

std::string MakeImages(const std::string& root) {
  Env* env = Env::Default();
  for (const char* label : {"cats", "dogs"}) {
    EXPECT_TRUE(env->CreateDir(JoinPath(root, label)).ok());
    for (int i = 0; i < 4; ++i) {
      data::PngSpec spec{6, 4, PNG_COLOR_TYPE_RGB, 8,
                         std::string(6 * 4 * 3, static_cast<char>(40 * i))};
      EXPECT_TRUE(
          WriteStringToFile(env, *data::EncodePng(spec),
                            JoinPath(root, std::string(label) + "/" + std::to_string(i) + ".png"))
              .ok());
    }
  }
  return root;
}

TEST(DataCommand, ImportImagesThenInspect) {
  const std::string tmp = test_support::MakeTempDir("data_cmd_test");
  const std::string src = MakeImages(JoinPath(tmp, "src"));
  const std::string out = JoinPath(tmp, "ds");
  Result r = Kiln({"data", "import", "images", src, "--out", out, "--size", "4x4", "--shards", "2",
                   "--held-out", "0.25", "--threads", "2"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("wrote 8 examples (held_out 2, train 6) in 3 shards"), std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("decode: 8/8 images (100.0%)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos);  // not a terminal: plain lines

  Result again = Kiln({"data", "import", "images", src, "--out", out, "--size", "4x4", "--shards",
                       "2", "--held-out", "0.25", "--quiet"});
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_NE(again.out.find("(3 kept from an earlier run)"), std::string::npos) << again.out;
  EXPECT_EQ(again.err, "");

  Result inspect = Kiln({"data", "inspect", out});
  ASSERT_EQ(inspect.rc, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("labels (2): cats dogs"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("image: uint8[4,4,3]"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("verified 3 shards"), std::string::npos) << inspect.out;

  // A damaged shard: inspect fails naming it.
  Env* env = Env::Default();
  const std::string shard = JoinPath(out, "train-00001-of-00002.tfrecord");
  std::string bytes = *ReadFileToString(env, shard);
  bytes[bytes.size() - 3] ^= 1;
  ASSERT_TRUE(WriteStringToFile(env, bytes, shard).ok());
  inspect = Kiln({"data", "inspect", out});
  EXPECT_EQ(inspect.rc, 1);
  EXPECT_NE(inspect.err.find("kiln data inspect: shard " + shard), std::string::npos)
      << inspect.err;
  EXPECT_EQ(Kiln({"data", "inspect", out, "--no-verify"}).rc, 0);
}

TEST(DataCommand, BadArgumentsAndInputs) {
  const std::string tmp = test_support::MakeTempDir("data_cmd_test");
  const std::string src = MakeImages(JoinPath(tmp, "src"));
  Result r = Kiln({"data", "import", "images", src, "--out", JoinPath(tmp, "o"), "--size", "4by4"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--size '4by4' is not HxW"), std::string::npos) << r.err;
  r = Kiln({"data", "import", "images", src, "--out", JoinPath(tmp, "o"), "--size", "4", "--resize",
            "pad"});
  EXPECT_NE(r.err.find("--resize must be crop or fit"), std::string::npos) << r.err;
  r = Kiln({"data", "inspect", tmp});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("has no dataset.json"), std::string::npos) << r.err;
  Env* env = Env::Default();
  const std::string csv = JoinPath(tmp, "t.csv"), schema = JoinPath(tmp, "s.yaml");
  ASSERT_TRUE(WriteStringToFile(env, "a,b\n1,x\n2,y\nz,x\n", csv).ok());
  ASSERT_TRUE(
      WriteStringToFile(env, "label: b\ncolumns: {a: numeric, b: categorical}\n", schema).ok());
  r = Kiln({"data", "import", "csv", csv, "--schema", schema, "--out", JoinPath(tmp, "c")});
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("t.csv:4:1 (column 'a'): 'z' is not a finite number"), std::string::npos)
      << r.err;
  r = Kiln({"data", "imprt"});
  EXPECT_NE(r.err.find("did you mean 'import'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kiln::cli
