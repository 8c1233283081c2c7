// Temporary folders for tests that are removed when the test program exits, so a test run leaves
// nothing behind under $TMPDIR (a failing run keeps them when KILN_KEEP_TEST_DIRS is set, to look
// at what the test wrote).
//
//   std::string dir = kiln::test_support::MakeTempDir("event_writer_test");  //
//   /tmp/event_writer_test.Ab12Cd
#ifndef KILN_TESTS_SUPPORT_TEMP_DIR_H_
#define KILN_TESTS_SUPPORT_TEMP_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::test_support {

namespace internal {
struct TempDirRegistry {
  std::mutex mu;
  std::vector<std::string> dirs;
  ~TempDirRegistry() {
    if (std::getenv("KILN_KEEP_TEST_DIRS") != nullptr) return;
    for (const std::string& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
};
inline TempDirRegistry& Registry() {
  static TempDirRegistry registry;  // destroyed at exit: removes every folder made here
  return registry;
}
}  // namespace internal

// A new, empty folder `<TempDir>/<prefix>.XXXXXX`, removed at exit.
inline std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = ::testing::TempDir() + "/" + prefix + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  EXPECT_NE(::mkdtemp(buf.data()), nullptr) << tmpl;
  internal::TempDirRegistry& r = internal::Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.dirs.push_back(buf.data());
  return buf.data();
}

}  // namespace kiln::test_support

#endif  // KILN_TESTS_SUPPORT_TEMP_DIR_H_
