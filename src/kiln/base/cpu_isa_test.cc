#include "kiln/base/cpu_isa.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(CpuIsaTest, NamesRoundTrip) {
  for (CpuIsa isa : AllCpuIsas()) {
    absl::StatusOr<CpuIsa> parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(*ParseCpuIsa("native"), HostCpuIsa());
  absl::StatusOr<CpuIsa> bad = ParseCpuIsa("avx3");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'avx3'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("sse41, avx2"), std::string::npos);
}

// The level is decided once per process: each case runs in a child of its own.
TEST(CpuIsaTest, SettingCapsTheLevelOnceAndForAll) {
  EXPECT_EXIT(
      {
        if (!ApplyCpuIsaSetting("sse41", /*strict=*/true).ok()) std::exit(1);
        if (ActiveCpuIsa() != CpuIsa::kSse41) std::exit(2);
        if (CpuIsaCapped() != (HostCpuIsa() > CpuIsa::kSse41)) std::exit(3);
        if (!ApplyCpuIsaSetting("sse41", true).ok()) std::exit(4);  // the same level again
        absl::Status other = ApplyCpuIsaSetting("native", false);
        const bool same = HostCpuIsa() == CpuIsa::kSse41;
        if (other.ok() != same) std::exit(5);
        if (!same && other.code() != absl::StatusCode::kFailedPrecondition) std::exit(6);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CpuIsaTest, EmptySettingLeavesTheHostLevel) {
  EXPECT_EXIT(
      {
        if (!ApplyCpuIsaSetting("", true).ok()) std::exit(1);
        std::exit(ActiveCpuIsa() == HostCpuIsa() ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CpuIsaTest, BadNameIsAnErrorAndDecidesNothing) {
  absl::Status s = ApplyCpuIsaSetting("pentium", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuIsaTest, LevelAboveTheHostIsAnErrorOnlyWhenStrict) {
  if (HostCpuIsa() == CpuIsa::kAmx) GTEST_SKIP() << "no level above this CPU's";
  EXPECT_EXIT(
      {
        absl::Status strict = ApplyCpuIsaSetting("amx", true);
        if (strict.code() != absl::StatusCode::kOutOfRange) std::exit(1);
        if (strict.message().find("runs at most " + CpuIsaName(HostCpuIsa())) == std::string::npos)
          std::exit(2);
        if (!ApplyCpuIsaSetting("amx", false).ok()) std::exit(3);
        std::exit(ActiveCpuIsa() == HostCpuIsa() ? 0 : 4);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kiln
