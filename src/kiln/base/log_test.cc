#include "kiln/base/log.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::log {
namespace {

struct Captured {
  Severity severity;
  std::string file;
  int line;
  std::string message;
};

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = SetSink([this](Severity s, std::string_view file, int line, std::string_view m) {
      captured_.push_back({s, std::string(file), line, std::string(m)});
    });
    previous_min_ = SetMinSeverity(Severity::kInfo);
  }
  void TearDown() override {
    SetSink(previous_);
    SetMinSeverity(previous_min_);
  }
  std::vector<Captured> captured_;
  Sink previous_;
  Severity previous_min_ = Severity::kInfo;
};

TEST_F(LogTest, MessageReachesSinkWithSeverityAndPlace) {
  KILN_LOG(WARNING) << "cache " << 42 << " is full";
  const int line = __LINE__ - 1;
  ASSERT_EQ(captured_.size(), 1u);
  EXPECT_EQ(captured_[0].severity, Severity::kWarning);
  EXPECT_EQ(captured_[0].message, "cache 42 is full");
  EXPECT_EQ(captured_[0].line, line);
  EXPECT_NE(captured_[0].file.find("log_test.cc"), std::string::npos);
}

TEST_F(LogTest, BelowMinimumIsDroppedWithoutFormatting) {
  int formatted = 0;
  auto count = [&formatted] { return ++formatted; };
  KILN_LOG(DEBUG) << "not shown " << count();
  EXPECT_EQ(formatted, 0);
  EXPECT_TRUE(captured_.empty());
  SetMinSeverity(Severity::kError);
  KILN_LOG(WARNING) << "dropped";
  KILN_LOG(ERROR) << "kept";
  ASSERT_EQ(captured_.size(), 1u);
  EXPECT_EQ(captured_[0].message, "kept");
}

TEST_F(LogTest, UsableAsSingleStatementInIfElse) {
  bool flag = false;
  if (flag)
    KILN_LOG(INFO) << "then";
  else
    KILN_LOG(INFO) << "else";
  ASSERT_EQ(captured_.size(), 1u);
  EXPECT_EQ(captured_[0].message, "else");
}

TEST_F(LogTest, ConcurrentMessagesArriveWhole) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 100; ++i) KILN_LOG(INFO) << "thread " << t << " message " << i;
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(captured_.size(), 400u);
  for (const Captured& c : captured_) EXPECT_EQ(c.message.rfind("thread ", 0), 0u) << c.message;
}

TEST(SeverityNameTest, Names) {
  EXPECT_EQ(SeverityName(Severity::kDebug), "debug");
  EXPECT_EQ(SeverityName(Severity::kWarning), "warning");
  EXPECT_EQ(SeverityName(Severity::kError), "error");
}

}  // namespace
}  // namespace kiln::log
