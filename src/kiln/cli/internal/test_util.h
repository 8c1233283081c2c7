// What the cli tests share: running `kiln` in-process with its output captured, and small file
// helpers under the test's temporary folder.
//
//   KilnResult r = Kiln({"train", "examples/mlp_digits.yaml", "--set", "steps=2"});
//   EXPECT_EQ(r.code, 0) << r.err;
#ifndef KILN_CLI_INTERNAL_TEST_UTIL_H_
#define KILN_CLI_INTERNAL_TEST_UTIL_H_

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/cli/app.h"

namespace kiln::cli {

struct KilnResult {
  int code;
  std::string out, err;
};

// `kiln ARGS...` (without the program name), as RunKiln runs it.
inline KilnResult Kiln(std::vector<std::string> args) {
  args.insert(args.begin(), "kiln");
  std::ostringstream out, err;
  int code = RunKiln(args, out, err);
  return {code, out.str(), err.str()};
}

// Writes `text` to TempDir()/name and returns the path.
inline std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The bytes of `path` ("" when it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace kiln::cli

#endif  // KILN_CLI_INTERNAL_TEST_UTIL_H_
