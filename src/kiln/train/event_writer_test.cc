#include "kiln/train/event_writer.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/mem_env.h"
#include "kiln/data/record_io.h"
#include "tests/support/temp_dir.h"

namespace kiln::train {
namespace {

using ::testing::HasSubstr;

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string MakeTempDir() { return kiln::test_support::MakeTempDir("event_writer_test"); }

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A whole event file from tensorboard_logger's serialization test (protobuf-generated Event
// classes): wall_time 256.5 everywhere, then v/1 = 1.5 at step 1 and v/22 = 16 at step 2.
const char kGoldenFileHex[] =
    "1800000000000000a37f4b220900000000000870401a0d627261696e2e4576656e743a32bc98212b"
    "19000000000000008bf1082809000000000008704010012a0c0a0a0a03762f31150000c03f2cecc087"
    "1a00000000000000129bd82d09000000000008704010022a0d0a0b0a04762f323215000080418fa3b688";

// A record from TensorFlow's own event_file_loader test (wall_time 1440183447, brain.Event:1).
const char kTfEvent1Hex[] =
    "1800000000000000a37f4b22090000c025dd75d5411a0d627261696e2e4576656e743a31ecf3328d";

TEST(EventEncodingTest, MatchesTensorFlowBytes) {
  const std::string golden = FromHex(kGoldenFileHex);
  EXPECT_EQ(data::FrameRecord(EncodeFileVersionEvent(256.5)) +
                data::FrameRecord(EncodeScalarsEvent(256.5, 1, {{"v/1", 1.5f}})) +
                data::FrameRecord(EncodeScalarsEvent(256.5, 2, {{"v/22", 16.0f}})),
            golden);
  EXPECT_EQ(data::FrameRecord(EncodeFileVersionEvent(1440183447.0, "brain.Event:1")),
            FromHex(kTfEvent1Hex));
}

TEST(EventWriterTest, WholeFileMatchesTensorFlowBytes) {
  const std::string dir = MakeTempDir() + "/run";  // created by Create
  EventWriter::Options opt;
  opt.hostname = "host";
  opt.clock = [] { return 256.5; };
  auto w = EventWriter::Create(dir, opt);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->path(), dir + "/events.out.tfevents.0000000256.host");
  ASSERT_TRUE((*w)->AddScalar("v/1", 1, 1.5).ok());
  ASSERT_TRUE((*w)->AddScalar("v/22", 2, 16.0, 256.5).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(ReadFileBytes((*w)->path()), FromHex(kGoldenFileHex));

  // A second writer in the same second does not clobber the first file.
  auto w2 = EventWriter::Create(dir, opt);
  ASSERT_TRUE(w2.ok()) << w2.status();
  EXPECT_EQ((*w2)->path(), dir + "/events.out.tfevents.0000000256.host.1");
  EXPECT_EQ(ReadFileBytes((*w)->path()), FromHex(kGoldenFileHex));
}

TEST(EventWriterTest, ThroughEnvWithItsClock) {
  std::unique_ptr<MemEnv> env = NewMemEnv();  // clock at 2024-01-01T00:00:00Z
  EventWriter::Options opt;
  opt.env = env.get();
  opt.hostname = "h";
  auto w = EventWriter::Create("/runs/a", opt);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->path(), "/runs/a/events.out.tfevents.1704067200.h");
  env->AdvanceMicros(1'500'000);
  ASSERT_TRUE((*w)->AddScalar("loss", 1, 0.5).ok());
  auto w2 = EventWriter::Create("/runs/a", opt);
  ASSERT_TRUE(w2.ok()) << w2.status();
  EXPECT_EQ((*w2)->path(), "/runs/a/events.out.tfevents.1704067201.h");
  ASSERT_TRUE((*w)->Close().ok());
  auto events = ReadEventFile(env.get(), (*w)->path());
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].wall_time, 1704067200.0);
  EXPECT_EQ((*events)[1].wall_time, 1704067201.5);
  EXPECT_EQ((*events)[1].values[0].first, "loss");
}

TEST(EventWriterTest, FileNameUsesRealClockAndHost) {
  const std::string dir = MakeTempDir();
  auto w = EventWriter::Create(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  std::string name = std::filesystem::path((*w)->path()).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[^/]+)")))
      << name;
  EXPECT_NEAR((*w)->Now(), static_cast<double>(::time(nullptr)), 5.0);
  EXPECT_EQ(EventFileName(12, "h", ".rank3"), "events.out.tfevents.0000000012.h.rank3");
}

TEST(EventWriterTest, RoundTripThroughReader) {
  const std::string dir = MakeTempDir();
  EventWriter::Options opt;
  opt.hostname = "h";
  double t = 1700000000.25;
  opt.clock = [&t] { return t; };
  auto w = EventWriter::Create(dir, opt);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->AddScalars(10, {{"loss", 0.5}, {"lr", 1e-3}, {"zero", 0.0}}).ok());
  t += 1;
  ASSERT_TRUE((*w)->AddScalar("loss", -3, NAN).ok());
  ASSERT_TRUE((*w)->AddSessionStart(7).ok());
  ASSERT_TRUE((*w)->AddScalar("loss", int64_t{1} << 40, 1e39).ok());  // overflows f32 -> inf
  ASSERT_TRUE((*w)->Flush().ok());

  auto events = ReadEventFile((*w)->path());
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 5u);
  const auto& ev = *events;
  EXPECT_EQ(ev[0].file_version, kEventFileVersion);
  EXPECT_EQ(ev[0].wall_time, 1700000000.25);
  EXPECT_EQ(ev[0].step, 0);
  EXPECT_FALSE(ev[0].has_summary);

  EXPECT_EQ(ev[1].step, 10);
  ASSERT_EQ(ev[1].values.size(), 3u);
  EXPECT_EQ(ev[1].values[0], (std::pair<std::string, float>("loss", 0.5f)));
  EXPECT_EQ(ev[1].values[1], (std::pair<std::string, float>("lr", 1e-3f)));
  EXPECT_EQ(ev[1].values[2], (std::pair<std::string, float>("zero", 0.0f)));  // oneof: kept

  EXPECT_EQ(ev[2].step, -3);
  EXPECT_EQ(ev[2].wall_time, 1700000001.25);
  ASSERT_EQ(ev[2].values.size(), 1u);
  EXPECT_TRUE(std::isnan(ev[2].values[0].second));

  EXPECT_TRUE(ev[3].has_session_log);
  EXPECT_EQ(ev[3].session_status, SessionStatus::kStart);
  EXPECT_EQ(ev[3].step, 7);

  EXPECT_EQ(ev[4].step, int64_t{1} << 40);
  EXPECT_TRUE(std::isinf(ev[4].values[0].second));
}

TEST(EventWriterTest, RejectsBadTags) {
  auto w = EventWriter::Create(MakeTempDir());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->AddScalar("", 1, 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->AddScalar("bad\xff", 1, 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->AddScalar("\xc0\xaf", 1, 1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->AddScalars(1, {{"ok", 1.0}, {"", 2.0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*w)->AddScalar("utf8/\xc3\xa9t\xc3\xa9", 1, 1.0).ok());
  EXPECT_EQ(EventWriter::Create("").status().code(), absl::StatusCode::kInvalidArgument);
  EventWriter::Options opt;
  opt.hostname = "a/b";
  EXPECT_EQ(EventWriter::Create(MakeTempDir(), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EventDecodeTest, MalformedProtobufIsDataLoss) {
  std::string good = EncodeScalarsEvent(1.0, 300, {{"loss", 2.0f}});
  ASSERT_TRUE(DecodeEvent(good).ok());
  std::vector<std::string> bad = {
      good.substr(0, good.size() - 1),  // simple_value cut short
      good.substr(0, 10),               // step varint cut short
      std::string("\x2a\x05\x0a", 3),   // summary length past the end
      std::string("\x0b", 1),           // field 1 with the group wire type
      std::string("\x10\x01\x10", 3),   // step tag with no value
      std::string("\x0d\0\0\0\0", 5),   // wall_time with fixed32 wire type
      std::string("\x12\x00", 2),       // step as length-delimited
      std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 11),  // varint overflow
      std::string("\x00\x00", 2),                                       // field number 0
  };
  for (const std::string& b : bad) {
    absl::StatusOr<Event> e = DecodeEvent(b, "rec");
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDataLoss) << testing::PrintToString(b);
    EXPECT_THAT(std::string(e.status().message()), HasSubstr("rec"));
  }
  // Unknown fields (e.g. source_metadata = 10) are skipped.
  auto e = DecodeEvent(good + std::string("\x52\x02hi", 4));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->step, 300);
}

TEST(EventDecodeTest, FileMustStartWithFileVersion) {
  const std::string path = MakeTempDir() + "/events.out.tfevents.1.h";
  auto w = data::RecordWriter::Open(path);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write(EncodeScalarsEvent(1.0, 1, {{"a", 1.0f}})).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(ReadEventFile(path).status().code(), absl::StatusCode::kDataLoss);
}

int RunChecker(const std::string& args) {
  const std::string tool = std::string(KILN_SOURCE_DIR) + "/tools/check_events.py";
  std::string cmd = "/usr/bin/python3 " + tool + " " + args;
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// tools/check_events.py decodes what EventWriter writes, and rejects damaged files.
TEST(EventWriterTest, PythonCheckerAgrees) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string dir = MakeTempDir();
  EventWriter::Options opt;
  opt.hostname = "h";
  opt.clock = [] { return 1700000000.5; };
  auto w = EventWriter::Create(dir + "/run", opt);
  ASSERT_TRUE(w.ok());
  for (int step = 0; step < 50; ++step) {
    ASSERT_TRUE((*w)->AddScalars(step, {{"loss", 1.0 / (step + 1)}, {"lr", 0.1}}).ok());
  }
  ASSERT_TRUE((*w)->AddSessionStart(25).ok());
  ASSERT_TRUE((*w)->Close().ok());

  const std::string json = dir + "/out.jsonl";
  ASSERT_EQ(RunChecker(dir + "/run > " + json + " 2>/dev/null"), 0);
  std::ifstream in(json);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 52u);
  EXPECT_THAT(lines[0], HasSubstr("\"file_version\": \"brain.Event:2\""));
  EXPECT_THAT(lines[0], HasSubstr("\"wall_time\": 1700000000.5"));
  EXPECT_THAT(lines[4], HasSubstr("\"step\": 3"));
  EXPECT_THAT(lines[4], HasSubstr("{\"tag\": \"loss\", \"simple_value\": 0.25}"));
  EXPECT_THAT(lines[51], HasSubstr("\"session_log\": {\"status\": \"START\"}"));

  std::string bytes = ReadFileBytes((*w)->path());
  const std::string bad_dir = dir + "/bad";
  std::filesystem::create_directories(bad_dir);
  std::string damaged = bytes;
  damaged[damaged.size() - 30] ^= 0x08;
  std::ofstream(bad_dir + "/events.out.tfevents.1.h", std::ios::binary) << damaged;
  EXPECT_EQ(RunChecker(bad_dir + " --quiet 2>/dev/null"), 1);
  std::ofstream(bad_dir + "/events.out.tfevents.1.h", std::ios::binary | std::ios::trunc)
      << bytes.substr(0, bytes.size() - 5);
  EXPECT_EQ(RunChecker(bad_dir + " --quiet 2>/dev/null"), 1);
  EXPECT_EQ(RunChecker(bad_dir + " --quiet --allow-truncated-tail 2>/dev/null"), 0);
}

}  // namespace
}  // namespace kiln::train
