#include "kiln/train/metrics.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"

namespace kiln::train {
namespace {

using ::testing::HasSubstr;

std::string MakeTempDir() { return kiln::test_support::MakeTempDir("metrics_test"); }

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string OnlyEventFile(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().find("tfevents") != std::string::npos) {
      files.push_back(e.path().string());
    }
  }
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? "" : files[0];
}

TEST(JsonlSinkTest, FormatLine) {
  EXPECT_EQ(JsonlSink::FormatLine(10, {{"lr", 0.001}, {"loss", 0.25}}),
            R"({"step":10,"loss":0.25,"lr":0.001})");
  EXPECT_EQ(JsonlSink::FormatLine(-1, {}), R"({"step":-1})");
  EXPECT_EQ(JsonlSink::FormatLine(3, {{"a", NAN}, {"b", INFINITY}, {"c", 1e300}}),
            R"({"step":3,"a":null,"b":null,"c":1e+300})");
  // Doubles round-trip exactly.
  double x = 0.1 + 0.2;
  nlohmann::json j = nlohmann::json::parse(JsonlSink::FormatLine(0, {{"x", x}}));
  EXPECT_EQ(j["x"].get<double>(), x);
}

TEST(JsonlSinkTest, WritesAppendsAndRejectsStep) {
  const std::string path = MakeTempDir() + "/metrics.jsonl";
  {
    auto sink = JsonlSink::Create(path, /*append=*/false);
    ASSERT_TRUE(sink.ok()) << sink.status();
    ASSERT_TRUE((*sink)->Write(1, {{"loss", 2.0}}).ok());
    // Visible to readers right away, before Flush/Close (a killed run keeps it).
    EXPECT_EQ(ReadLines(path).size(), 1u);
    ASSERT_TRUE((*sink)->Write(2, {{"loss", 1.5}, {"acc", 0.5}}).ok());
    absl::Status s = (*sink)->Write(3, {{"step", 1.0}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("step"));
    ASSERT_TRUE((*sink)->Close().ok());
    EXPECT_TRUE((*sink)->Close().ok());
    EXPECT_EQ((*sink)->Write(4, {}).code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    auto sink = JsonlSink::Create(path);  // append (a resumed run)
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE((*sink)->Write(3, {{"loss", 1.0}}).ok());
    ASSERT_TRUE((*sink)->Close().ok());
  }
  std::vector<std::string> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 3u);
  std::vector<int64_t> steps;
  for (const std::string& l : lines) {
    nlohmann::json j = nlohmann::json::parse(l);
    steps.push_back(j.at("step").get<int64_t>());
    EXPECT_TRUE(j.contains("loss"));
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(lines[1], R"({"step":2,"acc":0.5,"loss":1.5})");

  {
    auto sink = JsonlSink::Create(path, /*append=*/false);  // truncates
    ASSERT_TRUE(sink.ok());
  }
  EXPECT_TRUE(ReadLines(path).empty());
  EXPECT_EQ(JsonlSink::Create("/nonexistent/dir/m.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TensorBoardSinkTest, OneEventPerWrite) {
  const std::string dir = MakeTempDir();
  auto sink = TensorBoardSink::Create(dir);
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_TRUE((*sink)->Write(5, {{"loss", 0.75}, {"lr", 0.5}}).ok());
  ASSERT_TRUE((*sink)->Write(6, {{"loss", 0.5}}).ok());
  // Readable while the sink is open.
  auto live = ReadEventFile(OnlyEventFile(dir));
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->size(), 3u);
  ASSERT_TRUE((*sink)->Close().ok());
  auto events = ReadEventFile(OnlyEventFile(dir));
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[1].step, 5);
  EXPECT_EQ((*events)[1].values,
            (std::vector<std::pair<std::string, float>>{{"loss", 0.75f}, {"lr", 0.5f}}));
  EXPECT_EQ((*events)[2].step, 6);
}

class FailingSink : public MetricsSink {
 public:
  absl::Status Write(int64_t, const std::map<std::string, double>&) override {
    ++writes;
    return absl::ResourceExhaustedError("disk full");
  }
  absl::Status Flush() override { return absl::OkStatus(); }
  absl::Status Close() override {
    closed = true;
    return absl::OkStatus();
  }
  int writes = 0;
  bool closed = false;
};

TEST(MultiSinkTest, FansOutAndKeepsGoingPastErrors) {
  const std::string dir = MakeTempDir();
  std::vector<std::unique_ptr<MetricsSink>> sinks;
  auto failing = std::make_unique<FailingSink>();
  FailingSink* failing_ptr = failing.get();
  sinks.push_back(std::move(failing));
  auto jsonl = JsonlSink::Create(dir + "/metrics.jsonl");
  ASSERT_TRUE(jsonl.ok());
  sinks.push_back(std::move(*jsonl));
  auto tb = TensorBoardSink::Create(dir);
  ASSERT_TRUE(tb.ok());
  sinks.push_back(std::move(*tb));
  MultiSink multi(std::move(sinks));
  EXPECT_EQ(multi.size(), 3u);

  absl::Status s = multi.Write(1, {{"loss", 1.0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("metrics sink 0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("disk full"));
  EXPECT_TRUE(multi.Flush().ok());
  EXPECT_TRUE(multi.Close().ok());
  EXPECT_EQ(failing_ptr->writes, 1);
  EXPECT_TRUE(failing_ptr->closed);

  EXPECT_EQ(ReadLines(dir + "/metrics.jsonl"),
            std::vector<std::string>{R"({"step":1,"loss":1.0})"});
  auto events = ReadEventFile(OnlyEventFile(dir));
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].values[0].first, "loss");
}

}  // namespace
}  // namespace kiln::train
