#include "kiln/data/record_io.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/fault_injection_env.h"
#include "kiln/base/mem_env.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

using ::testing::HasSubstr;

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// CRC32C straight from its definition (reflected polynomial 0x82F63B78, bit by bit), independent
// of base/crc32c.cc.
uint32_t SpecCrc32c(const std::string& s) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
  }
  return crc ^ 0xffffffffu;
}

uint32_t SpecMask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// The framing built from the spec: u64 length, masked CRC of it, data, masked CRC of data.
std::string SpecFrame(const std::string& data) {
  std::string len = Le(data.size(), 8);
  return len + Le(SpecMask(SpecCrc32c(len)), 4) + data + Le(SpecMask(SpecCrc32c(data)), 4);
}

std::string MakeTempDir() { return kiln::test_support::MakeTempDir("record_io_test"); }

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Two records written by TensorFlow (its event_file_loader tests): known-good framing bytes.
const char kTfRecord1Hex[] =
    "1800000000000000a37f4b22090000c025dd75d5411a0d627261696e2e4576656e743a31ecf3328d";
const char kTfRecord2Hex[] =
    "1800000000000000a37f4b220900000027e6b3d5411a0d627261696e2e4576656e743a326a4d0b15";

TEST(RecordIoTest, SpecCrcMatchesKnownVector) {
  EXPECT_EQ(SpecCrc32c("123456789"), 0xe3069283u);            // the CRC32C check value
  EXPECT_EQ(SpecCrc32c(std::string(32, '\0')), 0x8a9136aau);  // RFC 3720 B.4
}

TEST(RecordIoTest, FrameMatchesSpecBytes) {
  for (const std::string& data : {std::string(), std::string("123456789"),
                                  std::string(1000, '\xab'), std::string("a\0b", 3)}) {
    EXPECT_EQ(FrameRecord(data), SpecFrame(data)) << data.size();
  }
  // Empty data: the data CRC is 0, masked to the delta itself.
  std::string empty = FrameRecord("");
  ASSERT_EQ(empty.size(), 16u);
  EXPECT_EQ(empty.substr(12), Le(0xa282ead8u, 4));
}

TEST(RecordIoTest, FrameMatchesTensorFlowBytes) {
  for (const char* hex : {kTfRecord1Hex, kTfRecord2Hex}) {
    std::string golden = FromHex(hex);
    std::string payload = golden.substr(12, golden.size() - 16);
    EXPECT_EQ(FrameRecord(payload), golden);
  }
}

TEST(RecordIoTest, ReaderReadsTensorFlowBytes) {
  std::string bytes = FromHex(kTfRecord1Hex) + FromHex(kTfRecord2Hex);
  RecordReader reader(NewStringReadFile(&bytes));
  std::string rec;
  ASSERT_TRUE(reader.Read(&rec).value());
  EXPECT_THAT(rec, HasSubstr("brain.Event:1"));
  EXPECT_EQ(reader.offset(), 40u);
  ASSERT_TRUE(reader.Read(&rec).value());
  EXPECT_THAT(rec, HasSubstr("brain.Event:2"));
  EXPECT_FALSE(reader.Read(&rec).value());
  EXPECT_EQ(reader.offset(), bytes.size());
}

TEST(RecordIoTest, FileRoundTrip) {
  const std::string path = MakeTempDir() + "/a.tfrecord";
  std::vector<std::string> records = {"", "x", std::string(200000, 'y'), "last record"};
  for (int i = 0; i < 300; ++i) records.push_back("small " + std::to_string(i));
  {
    auto w = RecordWriter::Open(path);
    ASSERT_TRUE(w.ok()) << w.status();
    uint64_t expect_offset = 0;
    for (const std::string& r : records) {
      ASSERT_TRUE((*w)->Write(r).ok());
      expect_offset += 16 + r.size();
      EXPECT_EQ((*w)->offset(), expect_offset);
    }
    ASSERT_TRUE((*w)->Close().ok());
    EXPECT_TRUE((*w)->Close().ok());  // idempotent
    EXPECT_EQ((*w)->Write("more").code(), absl::StatusCode::kFailedPrecondition);
  }
  std::string expected;
  for (const std::string& r : records) expected += SpecFrame(r);
  EXPECT_EQ(ReadFileBytes(path), expected);

  auto all = ReadAllRecords(path);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, records);
}

TEST(RecordIoTest, AppendContinues) {
  const std::string path = MakeTempDir() + "/a.tfrecord";
  {
    auto w = RecordWriter::Open(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write("one").ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  {
    auto w = RecordWriter::Open(path, /*append=*/true);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*w)->offset(), 19u);
    ASSERT_TRUE((*w)->Write("two").ok());
    ASSERT_TRUE((*w)->Flush().ok());
    // Flushed bytes are visible to a reader while the writer is still open.
    auto live = ReadAllRecords(path);
    ASSERT_TRUE(live.ok());
    EXPECT_EQ(*live, (std::vector<std::string>{"one", "two"}));
    ASSERT_TRUE((*w)->Close().ok());
  }
}

TEST(RecordIoTest, CorruptionIsDataLossWithOffset) {
  const std::string good = FrameRecord("first") + FrameRecord("second record") + FrameRecord("3");
  const size_t second = 16 + 5;
  struct Case {
    size_t byte;
    const char* what;
    size_t record_offset;
  };
  for (const Case& c : {Case{0, "length", 0}, Case{9, "length", 0}, Case{12, "data", 0},
                        Case{second + 3, "length", second}, Case{second + 14, "data", second},
                        Case{second + 12 + 13 + 2, "data", second}}) {
    std::string bad = good;
    bad[c.byte] ^= 0x01;
    RecordReader reader(NewStringReadFile(&bad, "shard-7.tfrecord"));
    std::string rec;
    absl::Status s;
    for (int i = 0; i < 3 && s.ok(); ++i) s = reader.Read(&rec).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << c.byte << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("shard-7.tfrecord"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("offset " + std::to_string(c.record_offset)));
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.what));
    EXPECT_EQ(reader.offset(), c.record_offset);  // stays at the bad record
  }
}

TEST(RecordIoTest, AbsurdLengthIsDataLoss) {
  std::string bytes;
  AppendRecordHeader(uint64_t{1} << 40, &bytes);  // a valid header CRC for a huge length
  bytes += "tiny";
  RecordReader reader(NewStringReadFile(&bytes));
  std::string rec;
  absl::Status s = reader.Read(&rec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("over the limit"));
}

TEST(RecordIoTest, TruncatedTailIsOutOfRangeAndResumable) {
  const std::string full = FrameRecord("alpha") + FrameRecord("beta beta");
  const size_t second = 16 + 5;
  for (size_t cut = 0; cut <= full.size(); ++cut) {
    std::string live = full.substr(0, cut);
    RecordReader reader(NewStringReadFile(&live, "live.tfevents"));
    std::string rec;
    std::vector<std::string> got;
    absl::Status end;
    while (true) {
      absl::StatusOr<bool> r = reader.Read(&rec);
      if (!r.ok()) {
        end = r.status();
        break;
      }
      if (!*r) break;
      got.push_back(rec);
    }
    size_t complete = cut >= full.size() ? 2 : cut >= second ? 1 : 0;
    EXPECT_EQ(got.size(), complete) << cut;
    bool at_boundary = cut == 0 || cut == second || cut == full.size();
    if (at_boundary) {
      EXPECT_TRUE(end.ok()) << cut << ": " << end;
    } else {
      ASSERT_EQ(end.code(), absl::StatusCode::kOutOfRange) << cut << ": " << end;
      EXPECT_THAT(std::string(end.message()),
                  HasSubstr("truncated record at offset " + std::to_string(reader.offset())));
      EXPECT_THAT(std::string(end.message()), HasSubstr("live.tfevents"));
      // The writer finishes the record: the same reader picks it up.
      live = full;
      while (reader.Read(&rec).value()) got.push_back(rec);
      EXPECT_EQ(got, (std::vector<std::string>{"alpha", "beta beta"})) << cut;
    }
  }
}

TEST(RecordIoTest, ReadAllRecordsTruncatedTail) {
  const std::string path = MakeTempDir() + "/t.tfrecord";
  std::string bytes = FrameRecord("a") + FrameRecord("bb");
  WriteFileBytes(path, bytes.substr(0, bytes.size() - 2));
  EXPECT_EQ(ReadAllRecords(path).status().code(), absl::StatusCode::kOutOfRange);
  auto ok = ReadAllRecords(path, /*allow_truncated_tail=*/true);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, std::vector<std::string>{"a"});
}

TEST(RecordIoTest, EnvRoundTripAndLiveTail) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/shards").ok());
  auto w = RecordWriter::Open(env.get(), "/shards/a.tfrecord");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Write("one").ok());
  ASSERT_TRUE((*w)->Flush().ok());
  auto r = RecordReader::Open(env.get(), "/shards/a.tfrecord");
  ASSERT_TRUE(r.ok()) << r.status();
  std::string rec;
  ASSERT_TRUE((*r)->Read(&rec).value());
  EXPECT_EQ(rec, "one");
  EXPECT_FALSE((*r)->Read(&rec).value());  // caught up with the writer
  ASSERT_TRUE((*w)->Write(std::string(100000, 'z')).ok());
  ASSERT_TRUE((*w)->Close().ok());
  ASSERT_TRUE((*r)->Read(&rec).value());  // the file grew
  EXPECT_EQ(rec.size(), 100000u);
  auto all = ReadAllRecords(env.get(), "/shards/a.tfrecord");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
  EXPECT_EQ(ReadAllRecords(env.get(), "/shards/none").status().code(), absl::StatusCode::kNotFound);
}

TEST(RecordIoTest, WriteErrorIsSticky) {
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  auto w = RecordWriter::Open(&env, "/a.tfrecord");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Write("ok").ok());
  env.FailNth(FaultInjectionEnv::kAppend, 1);  // the data part of the next record
  absl::Status s = (*w)->Write("lost");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("offset 18"));
  // Later records would follow a torn one: refused.
  EXPECT_FALSE((*w)->Write("after").ok());
  EXPECT_FALSE((*w)->Close().ok());
  auto r = RecordReader::Open(&env, "/a.tfrecord");
  ASSERT_TRUE(r.ok());
  std::string rec;
  ASSERT_TRUE((*r)->Read(&rec).value());
  EXPECT_EQ(rec, "ok");
  EXPECT_EQ((*r)->Read(&rec).status().code(), absl::StatusCode::kOutOfRange);  // torn header
}

// Power loss at every point of writing five records (each Synced): after the crash the file
// holds a prefix of the records, every record whose Sync succeeded among them, and at most a torn
// tail, which the reader reports as truncated (OutOfRange) and never as corruption.
TEST(RecordIoTest, CrashAtEveryWriteLeavesSyncedRecordsReadable) {
  const std::vector<std::string> recs = {"alpha", std::string(70000, 'b'), "", "delta", "echo"};
  for (int64_t n = 0;; ++n) {
    std::unique_ptr<MemEnv> mem = NewMemEnv();
    FaultInjectionEnv env(mem.get());
    ASSERT_TRUE(env.CreateDir("/r").ok());
    ASSERT_TRUE(env.SyncDir("/").ok());
    env.FailAfter(n);
    size_t synced = 0;
    bool entry_durable = false;
    {
      auto w = RecordWriter::Open(&env, "/r/a.tfrecord", WriteMode::kExclusive);
      if (w.ok()) {
        entry_durable = env.SyncDir("/r").ok();
        for (const std::string& r : recs) {
          if (!(*w)->Write(r).ok() || !(*w)->Sync().ok()) break;
          ++synced;
        }
      }
    }  // destroyed without Close (a dead process)
    const bool injected = env.injected_failures() > 0;
    ASSERT_TRUE(env.SimulateCrash().ok());
    if (!entry_durable) {
      EXPECT_FALSE(env.FileExists("/r/a.tfrecord")) << "n=" << n;
    } else {
      auto strict = ReadAllRecords(&env, "/r/a.tfrecord");
      if (!strict.ok()) EXPECT_EQ(strict.status().code(), absl::StatusCode::kOutOfRange);
      auto got = ReadAllRecords(&env, "/r/a.tfrecord", /*allow_truncated_tail=*/true);
      ASSERT_TRUE(got.ok()) << "n=" << n << ": " << got.status();
      ASSERT_GE(got->size(), synced) << "n=" << n;
      ASSERT_LE(got->size(), recs.size());
      for (size_t i = 0; i < got->size(); ++i) EXPECT_EQ((*got)[i], recs[i]) << "n=" << n;
    }
    if (!injected) {
      EXPECT_EQ(synced, recs.size());
      break;
    }
  }
}

TEST(RecordIoTest, AppendModeContinuesAndExclusiveModeRefusesAnExistingFile) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/r").ok());
  {
    auto w = RecordWriter::Open(env.get(), "/r/a.tfrecord", WriteMode::kExclusive);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Write("one").ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  EXPECT_EQ(RecordWriter::Open(env.get(), "/r/a.tfrecord", WriteMode::kExclusive).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto w = RecordWriter::Open(env.get(), "/r/a.tfrecord", WriteMode::kAppend);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->offset(), kRecordHeaderBytes + 3 + kRecordFooterBytes);
  ASSERT_TRUE((*w)->Write("two").ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto all = ReadAllRecords(env.get(), "/r/a.tfrecord");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, (std::vector<std::string>{"one", "two"}));
}

TEST(RecordIoTest, MissingFileIsNotFound) {
  EXPECT_EQ(RecordReader::Open("/nonexistent/dir/x.tfrecord").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(RecordWriter::Open("/nonexistent/dir/x.tfrecord").status().code(),
            absl::StatusCode::kNotFound);
}

// tools/check_events.py --raw (an independent Python implementation of the framing and CRC32C)
// accepts what RecordWriter writes and rejects a flipped byte.
TEST(RecordIoTest, PythonCheckerAgrees) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/p.tfrecord";
  {
    auto w = RecordWriter::Open(path);
    ASSERT_TRUE(w.ok());
    for (int i = 0; i < 20; ++i) ASSERT_TRUE((*w)->Write(std::string(i * 7, 'a' + i)).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  const std::string tool = std::string(KILN_SOURCE_DIR) + "/tools/check_events.py";
  auto run = [&](const std::string& file) {
    std::string cmd = "/usr/bin/python3 " + tool + " --raw --quiet " + file + " 2>/dev/null";
    int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  EXPECT_EQ(run(path), 0);
  std::string bytes = ReadFileBytes(path);
  bytes[bytes.size() / 2] ^= 0x40;
  WriteFileBytes(dir + "/bad.tfrecord", bytes);
  EXPECT_EQ(run(dir + "/bad.tfrecord"), 1);
}

}  // namespace
}  // namespace kiln::data
