#include "kiln/train/checkpoint.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/fault_injection_env.h"
#include "kiln/base/mem_env.h"
#include "kiln/base/status.h"
#include "kiln/tensor/safetensors.h"
#include "kiln/train/internal/checkpoint_format.h"

namespace kiln::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// A tensor whose bytes are a pattern that depends on `seed` (every bit pattern round-trips; the
// comparison is bytewise).
Tensor Pattern(DType dtype, Shape shape, int seed) {
  Tensor t(dtype, std::move(shape));
  uint8_t* p = t.data<uint8_t>();
  for (int64_t i = 0; i < t.byte_size(); ++i) p[i] = static_cast<uint8_t>(i * 37 + seed * 11 + 5);
  if (dtype == DType::kBool)
    for (int64_t i = 0; i < t.num_elements(); ++i) p[i] &= 1;
  return t;
}

// A small "model": a few tensors of mixed dtypes, different for each seed.
NamedTensors Model(int seed) {
  return {{"embed.weight", Pattern(DType::kF32, Shape{8, 4}, seed)},
          {"block.0.w", Pattern(DType::kBF16, Shape{4, 4}, seed + 1)},
          {"block.0.b", Pattern(DType::kF32, Shape{4}, seed + 2)},
          {"opt.step", Pattern(DType::kS64, Shape{}, seed + 3)},
          {"opt.m.embed", Pattern(DType::kF32, Shape{8, 4}, seed + 4)}};
}

nlohmann::json Meta(int seed) {
  return {{"rng", {{"seed", 1234}, {"counter", seed * 1000}}},
          {"iterator", {{"shard", seed % 3}, {"offset", seed * 17}, {"epoch", 1}}}};
}

void ExpectSameTensors(const std::map<std::string, Tensor>& got, const NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name;
    EXPECT_TRUE(it->second.BitwiseEquals(t))
        << name << ": " << it->second.TypeString() << " vs " << t.TypeString();
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  CheckpointTest() : mem_(NewMemEnv()) {}

  std::unique_ptr<CheckpointManager> OpenManager(CheckpointOptions opts = {}, Env* env = nullptr) {
    opts.env = env != nullptr ? env : mem_.get();
    absl::StatusOr<std::unique_ptr<CheckpointManager>> m = CheckpointManager::Open(kRoot, opts);
    KILN_CHECK_OK(m.status());
    return std::move(*m);
  }
  std::vector<std::string> Children(const std::string& dir) {
    absl::StatusOr<std::vector<std::string>> c = mem_->GetChildren(dir);
    KILN_CHECK_OK(c.status());
    return *c;
  }
  std::string ReadMem(const std::string& path) { return *ReadFileToString(mem_.get(), path); }
  void WriteMem(const std::string& path, const std::string& bytes) {
    KILN_CHECK_OK(WriteStringToFile(mem_.get(), bytes, path));
  }
  std::string ShardPath(int64_t step, int i, int n) {
    return absl::StrFormat("%s/step_%d/shard-%05d-of-%05d.safetensors", kRoot, step, i, n);
  }

  static constexpr char kRoot[] = "/run/checkpoints";
  std::unique_ptr<MemEnv> mem_;
};

TEST_F(CheckpointTest, RoundTripsEveryDTypeScalarsEmptyTensorsAndMetadata) {
  NamedTensors in;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType t = static_cast<DType>(i);
    const std::string name(DTypeName(t));
    in.emplace_back(name + ".matrix", Pattern(t, Shape{3, 5}, i));
    in.emplace_back(name + ".scalar", Pattern(t, Shape{}, i + 100));
    in.emplace_back(name + ".empty", Pattern(t, Shape{0, 4}, 0));
  }
  CheckpointOptions opts;
  opts.shard_bytes = 100;  // several shards
  auto mgr = OpenManager(opts);
  const nlohmann::json meta = {{"rng", {1, 2, 3}}, {"note", "ünïcode"}, {"lr", 0.125}};
  ASSERT_TRUE(mgr->Save(7, in, meta).ok());
  EXPECT_GT(mgr->last_save_info().shards, 1);
  EXPECT_EQ(mgr->last_save_info().step, 7);

  absl::StatusOr<Checkpoint> c = mgr->Restore(7);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 7);
  EXPECT_EQ(c->path, std::string(kRoot) + "/step_7");
  EXPECT_EQ(c->metadata, meta);
  EXPECT_THAT(c->notes, IsEmpty());
  ExpectSameTensors(c->tensors, in);

  // Each shard is an ordinary safetensors file.
  const int shards = mgr->last_save_info().shards;
  std::map<std::string, Tensor> all;
  for (int i = 0; i < shards; ++i) {
    std::map<std::string, std::string> st_meta;
    absl::StatusOr<std::map<std::string, Tensor>> part =
        ParseSafetensors(ReadMem(ShardPath(7, i, shards)), &st_meta, "shard");
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_EQ(st_meta["format"], "pt");
    all.insert(part->begin(), part->end());
  }
  ExpectSameTensors(all, in);
  EXPECT_THAT(Children(std::string(kRoot) + "/step_7"), SizeIs(shards + 1));
}

TEST_F(CheckpointTest, ShardHeaderIsWhatSerializeSafetensorsWrites) {
  NamedTensors ts = Model(3);
  std::vector<internal::ShardEntry> entries;
  for (const auto& [name, t] : ts) {
    entries.push_back({name, t.dtype(), t.shape(), static_cast<uint64_t>(t.byte_size())});
  }
  absl::StatusOr<std::string> header = internal::BuildShardHeader(entries, {{"format", "pt"}});
  ASSERT_TRUE(header.ok());
  absl::StatusOr<std::string> full = SerializeSafetensors(ts, {{"format", "pt"}});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->substr(0, header->size()), *header);
}

TEST_F(CheckpointTest, RestoreLatestOnAnEmptyDirectoryIsNotFound) {
  auto mgr = OpenManager();
  EXPECT_EQ(mgr->RestoreLatest().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mgr->Restore(3).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(*mgr->Steps(), IsEmpty());
}

TEST_F(CheckpointTest, RestoreLatestPicksTheNewestStepNumerically) {
  auto mgr = OpenManager(CheckpointOptions{.keep_last = 10});
  for (int step : {9, 10, 100, 20}) ASSERT_TRUE(mgr->Save(step, Model(step), Meta(step)).ok());
  EXPECT_THAT(*mgr->Steps(), ElementsAre(9, 10, 20, 100));
  absl::StatusOr<Checkpoint> c = mgr->RestoreLatest();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->step, 100);
  ExpectSameTensors(c->tensors, Model(100));
  EXPECT_EQ(c->metadata, Meta(100));
}

TEST_F(CheckpointTest, RetentionKeepsLastKPlusEveryMth) {
  CheckpointOptions opts;
  opts.keep_last = 2;
  opts.keep_every = 4;
  auto mgr = OpenManager(opts);
  for (int step = 1; step <= 9; ++step) ASSERT_TRUE(mgr->Save(step, Model(step)).ok());
  EXPECT_THAT(mgr->last_save_info().deleted_steps, ElementsAre(7));
  ASSERT_TRUE(mgr->Save(10, Model(10)).ok());
  EXPECT_THAT(mgr->last_save_info().deleted_steps, IsEmpty());
  EXPECT_THAT(*mgr->Steps(), ElementsAre(4, 8, 9, 10));
  // A step older than the newest K is still kept when it is the one just written.
  ASSERT_TRUE(mgr->Save(5, Model(5)).ok());
  EXPECT_THAT(*mgr->Steps(), ElementsAre(4, 5, 8, 9, 10));
  ASSERT_TRUE(mgr->Save(11, Model(11)).ok());
  EXPECT_THAT(*mgr->Steps(), ElementsAre(4, 8, 10, 11));
}

// Issue 13 case 2: the old run's checkpoints in the same folder must never be restored by, nor
// deleted by the retention of, a new run.
TEST_F(CheckpointTest, RunIdsKeepRunsApartInRestoreAndRetention) {
  CheckpointOptions old_run;
  old_run.run_id = "aaaaaaaaaaaaaaaa";
  old_run.keep_last = 2;
  auto a = OpenManager(old_run);
  for (int step : {300, 400}) ASSERT_TRUE(a->Save(step, Model(step), Meta(step)).ok());
  a.reset();
  // A checkpoint from before run ids: it belongs to whichever run the folder holds.
  auto legacy = OpenManager();
  ASSERT_TRUE(legacy->Save(50, Model(50), Meta(50)).ok());
  legacy.reset();

  CheckpointOptions new_run;
  new_run.run_id = "bbbbbbbbbbbbbbbb";
  new_run.keep_last = 2;
  auto b = OpenManager(new_run);
  absl::StatusOr<Checkpoint> first = b->RestoreLatest();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->step, 50);  // not the old run's 400
  EXPECT_THAT(absl::StrJoin(first->notes, "\n"),
              HasSubstr("skipped step_400: it belongs to run aaaaaaaaaaaaaaaa, not to this run "
                        "(bbbbbbbbbbbbbbbb)"));
  for (int step : {100, 200, 250}) ASSERT_TRUE(b->Save(step, Model(step), Meta(step)).ok());
  // Retention counted only b's (and the legacy) checkpoints: 50 and 100 went, 300/400 stayed.
  EXPECT_THAT(*b->Steps(), ElementsAre(200, 250, 300, 400));
  absl::StatusOr<Checkpoint> latest = b->RestoreLatest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 250);
  EXPECT_EQ(CheckpointRunId(latest->metadata), "bbbbbbbbbbbbbbbb");
  EXPECT_EQ(latest->metadata["rng"]["counter"], 250000);  // the caller's metadata is kept
  absl::StatusOr<nlohmann::json> meta =
      ReadCheckpointMetadata(std::string(kRoot) + "/step_400", mem_.get());
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(CheckpointRunId(*meta), "aaaaaaaaaaaaaaaa");

  // Only foreign checkpoints: a fresh start (NotFound), not damage.
  for (int step : {200, 250})
    ASSERT_TRUE(mem_->DeleteDir(std::string(kRoot) + "/step_" + std::to_string(step)).ok());
  EXPECT_TRUE(absl::IsNotFound(b->RestoreLatest().status()));
}

TEST_F(CheckpointTest, ReadOnlyOpenChangesNothing) {
  ASSERT_TRUE(OpenManager()->Save(1, Model(1)).ok());
  WriteMem(std::string(kRoot) + "/step_2.tmp-1234", "an interrupted save of a live trainer");
  CheckpointOptions ro;
  ro.read_only = true;
  auto m = OpenManager(ro);
  EXPECT_THAT(m->open_notes(), IsEmpty());
  EXPECT_TRUE(mem_->FileExists(std::string(kRoot) + "/step_2.tmp-1234"));
  EXPECT_EQ(m->RestoreLatest()->step, 1);
}

TEST_F(CheckpointTest, ReplacingTheSameStepIsAtomicAndLeavesNothingBehind) {
  auto mgr = OpenManager();
  ASSERT_TRUE(mgr->Save(5, Model(1), Meta(1)).ok());
  ASSERT_TRUE(mgr->Save(5, Model(2), Meta(2)).ok());
  absl::StatusOr<Checkpoint> c = mgr->Restore(5);
  ASSERT_TRUE(c.ok());
  ExpectSameTensors(c->tensors, Model(2));
  EXPECT_EQ(c->metadata, Meta(2));
  EXPECT_THAT(Children(kRoot), ElementsAre("step_5"));
}

TEST_F(CheckpointTest, OpenRemovesLeftoversAndPutsBackAnInterruptedReplacement) {
  {
    auto mgr = OpenManager();
    ASSERT_TRUE(mgr->Save(3, Model(3)).ok());
    ASSERT_TRUE(mgr->Save(4, Model(4)).ok());
  }
  const std::string r = kRoot;
  KILN_CHECK_OK(mem_->CreateDir(r + "/step_5.tmp-0123456789abcdef/sub"));
  WriteMem(r + "/step_5.tmp-0123456789abcdef/shard-00000-of-00001.safetensors", "partial");
  WriteMem(r + "/step_6.tmp-x", "a stray file");
  // step_3 was being replaced (renamed aside) when the process died; step_4's replacement
  // committed, so its old copy is garbage.
  KILN_CHECK_OK(mem_->RenameFile(r + "/step_3", r + "/step_3.old-aa"));
  KILN_CHECK_OK(mem_->CreateDir(r + "/step_4.old-bb"));
  WriteMem(r + "/notes.txt", "not ours");
  KILN_CHECK_OK(mem_->CreateDir(r + "/step_abc"));

  auto mgr = OpenManager();
  EXPECT_THAT(Children(kRoot), ElementsAre("notes.txt", "step_3", "step_4", "step_abc"));
  EXPECT_THAT(mgr->open_notes(), SizeIs(4));
  EXPECT_THAT(absl::StrJoin(mgr->open_notes(), "\n"), HasSubstr("step_5.tmp-0123456789abcdef"));
  EXPECT_THAT(*mgr->Steps(), ElementsAre(3, 4));
  absl::StatusOr<Checkpoint> c = mgr->Restore(3);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameTensors(c->tensors, Model(3));
}

// ---- damage ----

TEST_F(CheckpointTest, CorruptTensorByteIsDataLossNamingTensorAndFileAndFallsBack) {
  auto mgr = OpenManager();
  ASSERT_TRUE(mgr->Save(1, Model(1), Meta(1)).ok());
  ASSERT_TRUE(mgr->Save(2, Model(2), Meta(2)).ok());
  const std::string shard = ShardPath(2, 0, 1);
  std::string bytes = ReadMem(shard);
  bytes[bytes.size() - 5] ^= 0x10;  // inside the last tensor, "opt.m.embed"
  WriteMem(shard, bytes);

  absl::StatusOr<Checkpoint> c2 = mgr->Restore(2);
  EXPECT_EQ(c2.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(c2.status().message()), HasSubstr("'opt.m.embed'"));
  EXPECT_THAT(std::string(c2.status().message()), HasSubstr(shard));
  EXPECT_THAT(std::string(c2.status().message()), HasSubstr("CRC32C"));

  absl::StatusOr<Checkpoint> c = mgr->RestoreLatest();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 1);
  ExpectSameTensors(c->tensors, Model(1));
  ASSERT_THAT(c->notes, SizeIs(1));
  EXPECT_THAT(c->notes[0], HasSubstr("step_2"));
  EXPECT_THAT(c->notes[0], HasSubstr("'opt.m.embed'"));
}

TEST_F(CheckpointTest, EverySingleByteFlipIsDetected) {
  auto mgr = OpenManager();
  NamedTensors small = {{"w", Pattern(DType::kF32, Shape{3}, 1)},
                        {"b", Pattern(DType::kS8, Shape{2}, 2)}};
  ASSERT_TRUE(mgr->Save(1, small, {{"k", 1}}).ok());
  for (const std::string& path :
       {ShardPath(1, 0, 1), std::string(kRoot) + "/step_1/manifest.json"}) {
    const std::string good = ReadMem(path);
    for (size_t i = 0; i < good.size(); ++i) {
      std::string bad = good;
      bad[i] ^= 0x01;
      WriteMem(path, bad);
      absl::Status s = mgr->Restore(1).status();
      ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << path << " byte " << i << ": " << s;
    }
    WriteMem(path, good);
  }
  EXPECT_TRUE(mgr->Restore(1).ok());
}

TEST_F(CheckpointTest, TruncatedShardIsDataLossAndFallsBack) {
  auto mgr = OpenManager();
  ASSERT_TRUE(mgr->Save(1, Model(1)).ok());
  ASSERT_TRUE(mgr->Save(2, Model(2)).ok());
  const std::string shard = ShardPath(2, 0, 1);
  std::string bytes = ReadMem(shard);
  WriteMem(shard, bytes.substr(0, bytes.size() - 3));
  absl::Status s = mgr->Restore(2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("truncated"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(shard));
  absl::StatusOr<Checkpoint> c = mgr->RestoreLatest();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->step, 1);
  EXPECT_THAT(c->notes[0], HasSubstr("truncated"));
}

TEST_F(CheckpointTest, MissingManifestOrShardIsDataLossAndFallsBack) {
  auto mgr = OpenManager(CheckpointOptions{.keep_last = 5});
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(mgr->Save(step, Model(step)).ok());
  KILN_CHECK_OK(mem_->DeleteFile(std::string(kRoot) + "/step_3/manifest.json"));
  KILN_CHECK_OK(mem_->DeleteFile(ShardPath(2, 0, 1)));
  absl::Status s3 = mgr->Restore(3).status();
  EXPECT_EQ(s3.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s3.message()), HasSubstr("manifest.json is missing"));
  absl::Status s2 = mgr->Restore(2).status();
  EXPECT_EQ(s2.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s2.message()), HasSubstr("shard is missing"));
  absl::StatusOr<Checkpoint> c = mgr->RestoreLatest();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->step, 1);
  EXPECT_THAT(c->notes, SizeIs(2));
}

TEST_F(CheckpointTest, NothingVerifiesIsDataLossListingEachCheckpoint) {
  auto mgr = OpenManager();
  ASSERT_TRUE(mgr->Save(1, Model(1)).ok());
  ASSERT_TRUE(mgr->Save(2, Model(2)).ok());
  WriteMem(std::string(kRoot) + "/step_1/manifest.json", "{}");
  WriteMem(std::string(kRoot) + "/step_2/manifest.json", "");
  absl::Status s = mgr->RestoreLatest().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("step_1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("step_2"));
}

TEST_F(CheckpointTest, NewerFormatVersionIsNotMistakenForDamage) {
  auto mgr = OpenManager();
  ASSERT_TRUE(mgr->Save(1, Model(1)).ok());
  ASSERT_TRUE(mgr->Save(2, Model(2)).ok());
  const std::string path = std::string(kRoot) + "/step_2/manifest.json";
  absl::StatusOr<internal::Manifest> m = internal::DecodeManifest(ReadMem(path), path);
  ASSERT_TRUE(m.ok());
  m->format_version = 3;  // 2 is the sharded format (checkpoint_sharded_test)
  WriteMem(path, *internal::EncodeManifest(*m));
  EXPECT_EQ(mgr->RestoreLatest().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointTest, BadArgumentsAreInvalidArgument) {
  auto mgr = OpenManager();
  NamedTensors dup = {{"a", Tensor()}, {"a", Tensor()}};
  EXPECT_EQ(mgr->Save(1, dup).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr->SaveAsync(1, dup).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr->Save(1, {{"", Tensor()}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr->Save(-1, Model(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr->Save(1, {{"bad\xff", Tensor()}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(mgr->SaveInFlight());
  EXPECT_THAT(Children(kRoot), IsEmpty());
  CheckpointOptions opts;
  opts.env = mem_.get();
  opts.keep_last = 0;
  EXPECT_EQ(CheckpointManager::Open(kRoot, opts).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointDirNameTest, OnlyCanonicalNamesCount) {
  EXPECT_EQ(ParseCheckpointDirName("step_0"), 0);
  EXPECT_EQ(ParseCheckpointDirName("step_1200"), 1200);
  EXPECT_EQ(ParseCheckpointDirName("step_012"), -1);
  EXPECT_EQ(ParseCheckpointDirName("step_"), -1);
  EXPECT_EQ(ParseCheckpointDirName("step_-1"), -1);
  EXPECT_EQ(ParseCheckpointDirName("step_5.tmp-ab"), -1);
  EXPECT_EQ(ParseCheckpointDirName("Step_5"), -1);
  EXPECT_EQ(ParseCheckpointDirName("step_1234567890123456789"), -1);
}

// ---- crashes ----

// Saves steps 1 and 2 (keep_last = 2), then saves `third_step` (a new step, or 2 again to test
// replacement) with the Env failing at mutating operation n: every operation from n on (the
// process died there), or only that one (`transient`: the process lives on, sees the error and
// saves step 4). Then simulates power loss in which the oldest `keep` of the undurable namespace
// changes happen to reach the disk anyway. After reopening, the newest checkpoint must verify
// and be the old state or the new one, whole; an acknowledged save must survive; no temporary
// directory may remain; every checkpoint left must verify. Returns false once n is past the
// end of the save (nothing was failed). `pending` receives the undurable change count.
bool CrashOnce(int64_t third_step, bool transient, int64_t n, size_t keep, size_t* pending) {
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  CheckpointOptions opts;
  opts.env = &env;
  opts.keep_last = 2;
  opts.shard_bytes = 200;  // three shards
  const std::string root = "/ckpt";
  absl::Status saved;
  {
    auto mgr = *CheckpointManager::Open(root, opts);
    KILN_CHECK_OK(mgr->Save(1, Model(1), Meta(1)));
    KILN_CHECK_OK(mgr->Save(2, Model(2), Meta(2)));
    if (transient) {
      env.FailNth(FaultInjectionEnv::kAllMutations, n);
    } else {
      env.FailAfter(n);
    }
    saved = mgr->Save(third_step, Model(3), Meta(3));
    if (transient && env.injected_failures() > 0) {
      if (saved.ok()) {
        // Only retention failed after the commit: reported as a note.
        EXPECT_THAT(mgr->last_save_info().notes, Not(IsEmpty()));
      } else {
        EXPECT_EQ(saved.code(), absl::ErrnoToStatusCode(EIO)) << saved;
        EXPECT_THAT(std::string(saved.message()), HasSubstr("injected fault"));
      }
      const std::vector<std::string> names = *mem->GetChildren(root);
      for (const std::string& name : names) {
        EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
      }
      KILN_CHECK_OK(mgr->Save(4, Model(4), Meta(4)));
    }
  }
  const bool failed = env.injected_failures() > 0;
  if (!failed) {
    EXPECT_TRUE(saved.ok()) << saved;
  }
  *pending = env.pending_changes();
  absl::Status crash = env.SimulateCrash(keep);
  EXPECT_TRUE(crash.ok()) << crash;
  if (!crash.ok()) return false;

  absl::StatusOr<std::unique_ptr<CheckpointManager>> reopened = CheckpointManager::Open(root, opts);
  EXPECT_TRUE(reopened.ok()) << reopened.status();
  if (!reopened.ok()) return false;
  auto& mgr = *reopened;
  const std::vector<std::string> names = *mem->GetChildren(root);
  for (const std::string& name : names) {
    EXPECT_GE(ParseCheckpointDirName(name), 0) << "leftover " << name;
  }
  absl::StatusOr<Checkpoint> c = mgr->RestoreLatest();
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return false;
  EXPECT_THAT(c->notes, IsEmpty());
  if (transient && failed) {
    EXPECT_EQ(c->step, 4);
    ExpectSameTensors(c->tensors, Model(4));
  } else if (saved.ok()) {
    EXPECT_EQ(c->step, third_step);
    ExpectSameTensors(c->tensors, Model(3));
    EXPECT_EQ(c->metadata, Meta(3));
  } else {
    // Old or new state, never a mix.
    const bool is_new = c->step == third_step && c->metadata == Meta(3);
    const int expect = is_new ? 3 : 2;
    EXPECT_EQ(c->metadata, Meta(expect));
    ExpectSameTensors(c->tensors, Model(expect));
  }
  const std::vector<int64_t> steps = *mgr->Steps();
  for (int64_t step : steps) EXPECT_TRUE(mgr->Restore(step).ok()) << step;
  // Step 2 is never lost: it is the previous checkpoint, or its replacement (later retention
  // may delete it once step 4 exists).
  if (!transient) {
    EXPECT_TRUE(std::find(steps.begin(), steps.end(), 2) != steps.end());
  }
  return failed;
}

void CrashSweep(int64_t third_step, bool transient) {
  int64_t n = 0;
  int64_t runs = 0;
  for (;; ++n) {
    size_t pending = 0;
    bool failed;
    {
      SCOPED_TRACE(absl::StrCat("fail at mutation ", n, transient ? " (transient)" : " (died)"));
      failed = CrashOnce(third_step, transient, n, 0, &pending);
      ++runs;
    }
    for (size_t keep = 1; keep <= pending && !::testing::Test::HasFailure(); ++keep) {
      SCOPED_TRACE(absl::StrCat("fail at mutation ", n, transient ? " (transient)" : " (died)",
                                ", oldest ", keep, " of ", pending, " unsynced changes kept"));
      size_t ignored;
      CrashOnce(third_step, transient, n, keep, &ignored);
      ++runs;
    }
    if (!failed || ::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(n, 20);  // the sweep did cover a whole save
  std::printf("  %lld crash points, %lld runs\n", static_cast<long long>(n),
              static_cast<long long>(runs));
}

TEST(CheckpointCrashTest, CrashAtEveryWriteSyncAndRenameOfASaveKeepsThePreviousCheckpoint) {
  CrashSweep(/*third_step=*/3, /*transient=*/false);
}

TEST(CheckpointCrashTest, CrashWhileReplacingTheNewestStep) {
  CrashSweep(/*third_step=*/2, /*transient=*/false);
}

TEST(CheckpointCrashTest, TransientFailureAtEveryStepIsReportedAndCleanedUp) {
  CrashSweep(/*third_step=*/3, /*transient=*/true);
}

TEST(CheckpointCrashTest, TransientFailureWhileReplacingTheNewestStep) {
  CrashSweep(/*third_step=*/2, /*transient=*/true);
}

// ---- async ----

// Forwards to a MemEnv, but file Syncs wait until the gate is opened.
class GatedEnv final : public Env {
 public:
  explicit GatedEnv(Env* target) : t_(target) {}
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void WaitOpen() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p) override {
    class File final : public WritableFile {
     public:
      File(GatedEnv* env, std::unique_ptr<WritableFile> f) : env_(env), f_(std::move(f)) {}
      absl::Status Append(std::string_view d) override { return f_->Append(d); }
      absl::Status Flush() override { return f_->Flush(); }
      absl::Status Sync() override {
        env_->WaitOpen();
        return f_->Sync();
      }
      absl::Status Close() override { return f_->Close(); }

     private:
      GatedEnv* env_;
      std::unique_ptr<WritableFile> f_;
    };
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, t_->NewWritableFile(p));
    return std::make_unique<File>(this, std::move(f));
  }
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& p) override {
    return t_->NewSequentialFile(p);
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& p) override {
    return t_->NewRandomAccessFile(p);
  }
  bool FileExists(const std::string& p) override { return t_->FileExists(p); }
  absl::StatusOr<bool> IsDirectory(const std::string& p) override { return t_->IsDirectory(p); }
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& d) override {
    return t_->GetChildren(d);
  }
  absl::StatusOr<uint64_t> GetFileSize(const std::string& p) override { return t_->GetFileSize(p); }
  absl::Status DeleteFile(const std::string& p) override { return t_->DeleteFile(p); }
  absl::Status CreateDir(const std::string& d) override { return t_->CreateDir(d); }
  absl::Status DeleteDir(const std::string& d) override { return t_->DeleteDir(d); }
  absl::Status RenameFile(const std::string& a, const std::string& b) override {
    return t_->RenameFile(a, b);
  }
  absl::Status SyncDir(const std::string& d) override { return t_->SyncDir(d); }
  uint64_t NowMicros() override { return t_->NowMicros(); }
  void SleepForMicros(int64_t m) override { t_->SleepForMicros(m); }
  uint64_t RandomU64() override { return t_->RandomU64(); }

 private:
  Env* t_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST_F(CheckpointTest, SaveAsyncReturnsAfterTheCopyAndAtMostOneSaveIsInFlight) {
  GatedEnv gated(mem_.get());
  auto mgr = OpenManager({}, &gated);
  NamedTensors live = Model(1);
  ASSERT_TRUE(mgr->SaveAsync(1, live, Meta(1)).ok());  // returns although writes are blocked
  EXPECT_TRUE(mgr->SaveInFlight());
  EXPECT_THAT(*mgr->Steps(), IsEmpty());
  // The caller may change its tensors at once: the checkpoint holds the values at the call.
  NamedTensors before = Model(1);
  for (auto& [name, t] : live) std::memset(t.raw_data(), 0xab, t.byte_size());

  std::atomic<bool> released{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    released = true;
    gated.Open();
  });
  // Waits for save 1 to finish before starting save 2.
  ASSERT_TRUE(mgr->SaveAsync(2, live, Meta(2)).ok());
  EXPECT_TRUE(released.load());
  EXPECT_THAT(*mgr->Steps(), ::testing::Contains(1));
  opener.join();
  ASSERT_TRUE(mgr->Wait().ok());
  EXPECT_FALSE(mgr->SaveInFlight());
  EXPECT_THAT(*mgr->Steps(), ElementsAre(1, 2));
  EXPECT_EQ(mgr->last_save_info().step, 2);

  absl::StatusOr<Checkpoint> c1 = mgr->Restore(1);
  ASSERT_TRUE(c1.ok());
  ExpectSameTensors(c1->tensors, before);
  absl::StatusOr<Checkpoint> c2 = mgr->Restore(2);
  ASSERT_TRUE(c2.ok());
  ExpectSameTensors(c2->tensors, live);
  EXPECT_EQ(c2->metadata, Meta(2));
}

TEST_F(CheckpointTest, AsyncErrorsSurfaceExactlyOnce) {
  FaultInjectionEnv env(mem_.get());
  auto mgr = OpenManager({}, &env);
  ASSERT_TRUE(mgr->Save(1, Model(1)).ok());

  // Through Wait().
  env.FailNth(FaultInjectionEnv::kSync, 0);
  ASSERT_TRUE(mgr->SaveAsync(2, Model(2)).ok());
  absl::Status s = mgr->Wait();
  EXPECT_EQ(s.code(), absl::ErrnoToStatusCode(EIO));
  EXPECT_THAT(std::string(s.message()), HasSubstr("checkpoint step 2"));
  EXPECT_TRUE(mgr->Wait().ok());  // reported once

  // Through the next SaveAsync, which then does not save.
  env.FailNth(FaultInjectionEnv::kRename, 0);
  ASSERT_TRUE(mgr->SaveAsync(3, Model(3)).ok());
  s = mgr->SaveAsync(4, Model(4));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("step 3"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("step 4 was not saved"));
  EXPECT_FALSE(mgr->SaveInFlight());
  EXPECT_THAT(*mgr->Steps(), ElementsAre(1));
  // A retry works.
  ASSERT_TRUE(mgr->SaveAsync(4, Model(4)).ok());
  ASSERT_TRUE(mgr->Wait().ok());
  EXPECT_THAT(*mgr->Steps(), ElementsAre(1, 4));
  EXPECT_THAT(Children(kRoot), ElementsAre("step_1", "step_4"));
}

// RestoreInto: tensors of a matching name, dtype and shape are read into the given buffers
// (no second copy); the rest into fresh tensors.
TEST_F(CheckpointTest, RestoreIntoReadsIntoTheGivenBuffers) {
  std::unique_ptr<CheckpointManager> m = OpenManager();
  const NamedTensors saved = Model(1);
  ASSERT_TRUE(m->Save(3, saved, Meta(1)).ok());
  NamedTensors into = {{"embed.weight", Tensor(DType::kF32, Shape{8, 4})},
                       {"block.0.b", Tensor(DType::kF32, Shape{5})},  // another shape
                       {"other", Tensor(DType::kF32, Shape{4})}};
  m->RestoreInto(&into);
  absl::StatusOr<Checkpoint> ck = m->RestoreLatest();
  m->RestoreInto(nullptr);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ExpectSameTensors(ck->tensors, saved);
  EXPECT_EQ(ck->tensors.at("embed.weight").raw_data(), into[0].second.raw_data());
  EXPECT_TRUE(into[0].second.BitwiseEquals(saved[0].second));
  EXPECT_NE(ck->tensors.at("block.0.b").raw_data(), into[1].second.raw_data());
  absl::StatusOr<Checkpoint> again = m->Restore(3);  // cleared: fresh tensors
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->tensors.at("embed.weight").raw_data(), into[0].second.raw_data());
}

// RestoreOnly keeps the accepted tensors and still verifies the others.
TEST_F(CheckpointTest, RestoreOnlyKeepsTheAcceptedTensorsAndVerifiesTheRest) {
  std::unique_ptr<CheckpointManager> m = OpenManager();
  const NamedTensors saved = Model(2);
  ASSERT_TRUE(m->Save(4, saved, Meta(2)).ok());
  m->RestoreOnly([](const std::string& name) { return name.rfind("opt.", 0) != 0; });
  absl::StatusOr<Checkpoint> ck = m->Restore(4);
  ASSERT_TRUE(ck.ok()) << ck.status();
  NamedTensors kept(saved.begin(), saved.end() - 2);  // all but opt.step, opt.m.embed
  ExpectSameTensors(ck->tensors, kept);
  // A damaged tensor that is not kept still fails the restore.
  const std::string shard = ShardPath(4, 0, 1);
  std::string bytes = ReadMem(shard);
  bytes[bytes.size() - 1] ^= 0x01;  // the last tensor: opt.m.embed
  WriteMem(shard, bytes);
  EXPECT_EQ(m->Restore(4).status().code(), absl::StatusCode::kDataLoss);
  m->RestoreOnly(nullptr);
  EXPECT_EQ(m->Restore(4).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, StagingBuffersAreReusedAcrossSaves) {
  auto mgr = OpenManager();
  NamedTensors m = Model(1);
  ASSERT_TRUE(mgr->SaveAsync(1, m).ok());
  ASSERT_TRUE(mgr->Wait().ok());
  absl::StatusOr<Checkpoint> c = mgr->Restore(1);
  ASSERT_TRUE(c.ok());
  // Same shapes, new values: the second save must carry the new values.
  NamedTensors m2 = Model(2);
  ASSERT_TRUE(mgr->SaveAsync(2, m2).ok());
  // A model whose tensor list changed shape and length.
  NamedTensors m3 = {{"only", Pattern(DType::kF16, Shape{7}, 9)}};
  ASSERT_TRUE(mgr->SaveAsync(3, m3).ok());
  ASSERT_TRUE(mgr->Wait().ok());
  ExpectSameTensors(mgr->Restore(2)->tensors, m2);
  ExpectSameTensors(mgr->Restore(3)->tensors, m3);
}

TEST(CheckpointPosixTest, LargeTensorsRoundTripOnTheRealFileSystem) {
  const std::string root =
      ::testing::TempDir() + "/kiln_checkpoint_test_" + std::to_string(::getpid());
  Env* env = Env::Default();
  if (env->FileExists(root)) KILN_CHECK_OK(env->DeleteDir(root));
  {
    CheckpointOptions opts;
    opts.shard_bytes = 6 << 20;
    auto mgr = *CheckpointManager::Open(root, opts);
    // 9 MiB in one tensor: larger than a write chunk and than the shard budget.
    NamedTensors ts = {{"big", Pattern(DType::kF32, Shape{3, 768, 1024}, 5)},
                       {"small", Pattern(DType::kS32, Shape{10}, 6)}};
    ASSERT_TRUE(mgr->SaveAsync(10, ts, Meta(10)).ok());
    ASSERT_TRUE(mgr->Wait().ok());
    EXPECT_EQ(mgr->last_save_info().shards, 2);
    absl::StatusOr<Checkpoint> c = mgr->RestoreLatest();
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectSameTensors(c->tensors, ts);
    // Readable by the plain safetensors reader.
    absl::StatusOr<std::map<std::string, Tensor>> big =
        ReadSafetensors(root + "/step_10/shard-00000-of-00002.safetensors");
    ASSERT_TRUE(big.ok()) << big.status();
    EXPECT_TRUE(big->at("big").BitwiseEquals(ts[0].second));
  }
  KILN_CHECK_OK(env->DeleteDir(root));
}

}  // namespace
}  // namespace kiln::train
