// Sharded checkpoints on thread communicators (no MPI): the slice description and its runs, a
// save by 2 and 4 ranks restored whole (one process) and read back slice by slice on other
// meshes (flat ranges, boxes across pieces), a rank that fails mid-save (the previous checkpoint
// intact, nothing committed, every rank told), pieces that do not tile, damage, and an
// unsharded checkpoint read through the same reader.
#include <functional>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/base/fault_injection_env.h"
#include "kiln/base/mem_env.h"
#include "kiln/base/status.h"
#include "kiln/dist/thread_communicator.h"
#include "kiln/train/checkpoint.h"

namespace kiln::train {
namespace {

using ::testing::HasSubstr;

Tensor Iota(Shape shape, float base) {
  Tensor t(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = base + static_cast<float>(i);
  return t;
}

// The elements of `slice` of `whole`, by the definition (row-major index arithmetic).
Tensor Expected(const Tensor& whole, const TensorSlice& slice) {
  Tensor out(whole.dtype(), slice.PieceShape());
  if (slice.flat) {
    for (int64_t i = slice.begin; i < slice.end; ++i)
      out.data<float>()[i - slice.begin] = whole.data<float>()[i];
    return out;
  }
  const Shape& s = whole.shape();
  std::vector<int64_t> idx(s.rank(), 0);
  for (int64_t k = 0; k < out.num_elements(); ++k) {
    int64_t rem = k, flat = 0;
    for (int d = s.rank() - 1; d >= 0; --d) {
      idx[d] = rem % slice.sizes[d] + slice.offsets[d];
      rem /= slice.sizes[d];
    }
    for (int d = 0; d < s.rank(); ++d) flat = flat * s.dim(d) + idx[d];
    out.data<float>()[k] = whole.data<float>()[flat];
  }
  return out;
}

void ExpectEqual(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape().dims(), want.shape().dims());
  EXPECT_TRUE(got.BitwiseEquals(want));
}

TEST(TensorSlice, RunsAndOverlap) {
  const Shape whole{4, 3, 5};
  // Rows 1..2, all of dim 1, columns 2..4: one run per (row, dim-1 index).
  std::vector<SliceRun> runs = SliceRuns(TensorSlice::Box({1, 0, 2}, {2, 3, 3}), whole);
  ASSERT_EQ(runs.size(), 6);
  EXPECT_EQ(runs[0].start, 17);
  EXPECT_EQ(runs[0].length, 3);
  EXPECT_EQ(runs[5].local, 15);
  // Whole trailing dimensions merge into one run.
  runs = SliceRuns(TensorSlice::Box({1, 0, 0}, {2, 3, 5}), whole);
  ASSERT_EQ(runs.size(), 1);
  EXPECT_EQ(runs[0].start, 15);
  EXPECT_EQ(runs[0].length, 30);
  EXPECT_TRUE(SliceRuns(TensorSlice::Flat(3, 3), whole).empty());
  EXPECT_EQ(SliceRuns(TensorSlice::Whole(Shape{}), Shape{}).size(), 1);
  // Copy a flat range out of a box piece.
  const Tensor t = Iota(whole, 0);
  const TensorSlice box = TensorSlice::Box({0, 1, 1}, {4, 2, 3});
  const Tensor piece = Expected(t, box);
  const TensorSlice flat = TensorSlice::Flat(6, 14);
  Tensor out(DType::kF32, flat.PieceShape());
  // Elements 6..13: row 0, dim-1 indices 1 (6..9) and 2 (10..13): the box holds 6, 7, 8, 11,
  // 12, 13.
  EXPECT_EQ(CopyOverlap(SliceRuns(box, whole), piece.raw_data(), SliceRuns(flat, whole),
                        out.raw_data(), 4),
            6);
  EXPECT_EQ(out.data<float>()[0], 6);
  EXPECT_EQ(out.data<float>()[7], 13);
  EXPECT_THAT(std::string(TensorSlice::Box({0, 0}, {5, 1}).Check(Shape{4, 1}).message()),
              HasSubstr("not inside shape [4,1]"));
  EXPECT_THAT(std::string(TensorSlice::Flat(0, 9).Check(Shape{2, 4}).message()),
              HasSubstr("flat[0:9]"));
  EXPECT_EQ(TensorSlice::Box({0, 64}, {128, 64}).ToString(), "[0:128, 64:128]");
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  ShardedCheckpointTest() : mem_(NewMemEnv()) {
    tensors_ = {
        {"w", Iota(Shape{6, 4}, 0)}, {"b", Iota(Shape{7}, 100)}, {"emb", Iota(Shape{5, 8}, 1000)}};
  }

  // Each of `ranks` ranks holds: a flat 1/ranks of w and b (ZeRO-1's flat shards), and a column
  // block of emb (a tensor-parallel slice). `pieces_for` may change a rank's list.
  std::vector<TensorPiece> PiecesOf(int rank, int ranks) {
    std::vector<TensorPiece> out;
    for (const char* name : {"w", "b"}) {
      const Tensor& t = Find(name);
      const int64_t n = t.num_elements(), s = (n + ranks - 1) / ranks;
      const int64_t lo = std::min(n, rank * s), hi = std::min(n, lo + s);
      if (lo < hi) {
        out.push_back(
            {name, DType::kF32, t.shape(), TensorSlice::Flat(lo, hi), t.data<float>() + lo});
      }
    }
    const int64_t cols = 8 / ranks;
    const TensorSlice box = TensorSlice::Box({0, rank * cols}, {5, cols});
    staged_[rank] = Expected(Find("emb"), box);
    out.push_back({"emb", DType::kF32, Shape{5, 8}, box, staged_[rank].raw_data()});
    return out;
  }

  const Tensor& Find(const std::string& name) {
    for (const auto& [n, t] : tensors_)
      if (n == name) return t;
    return tensors_[0].second;
  }

  // Runs SaveSharded on `ranks` threads; env_for(rank) picks each rank's Env.
  std::vector<absl::Status> SaveOnRanks(
      int64_t step, int ranks, std::function<Env*(int)> env_for = nullptr,
      std::function<std::vector<TensorPiece>(int)> pieces = nullptr) {
    auto comms = dist::MakeThreadCommunicators(ranks, std::chrono::milliseconds(5000));
    std::vector<absl::Status> out(ranks);
    std::vector<std::vector<TensorPiece>> lists(ranks);
    for (int r = 0; r < ranks; ++r) lists[r] = pieces ? pieces(r) : PiecesOf(r, ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        CheckpointOptions o;
        o.env = env_for ? env_for(r) : mem_.get();
        o.read_only = r != 0;
        o.run_id = "run-a";
        auto m = CheckpointManager::Open("/ck", o);
        if (!m.ok()) {
          out[r] = m.status();
          return;
        }
        out[r] = (*m)->SaveSharded(step, lists[r], {{"step", step}}, *comms[r]);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  std::unique_ptr<MemEnv> mem_;
  NamedTensors tensors_;
  std::map<int, Tensor> staged_;
};

TEST_F(ShardedCheckpointTest, TwoAndFourRanksRestoreWholeAndAsAnySlice) {
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(ranks);
    const int64_t step = 10 * ranks;
    for (const absl::Status& s : SaveOnRanks(step, ranks)) ASSERT_TRUE(s.ok()) << s;
    const std::string dir = absl::StrCat("/ck/step_", step);
    // Every rank's own files, plus the merged manifest.
    EXPECT_TRUE(mem_->FileExists(dir + "/manifest.json"));
    EXPECT_TRUE(mem_->FileExists(dir + "/rank-00001-shard-00000-of-00001.safetensors"));
    // One process: Restore assembles every tensor.
    CheckpointOptions o;
    o.env = mem_.get();
    auto m = *CheckpointManager::Open("/ck", o);
    absl::StatusOr<Checkpoint> c = m->Restore(step);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->metadata["run_id"], "run-a");  // rank 0 stamps its run id
    for (const auto& [name, t] : tensors_) ExpectEqual(c->tensors.at(name), t);
    // Another mesh: slices that cross the pieces.
    auto r = *CheckpointReader::Open(dir, mem_.get());
    EXPECT_TRUE(r->sharded());
    EXPECT_EQ(r->ranks(), ranks);
    for (const TensorSlice& s :
         {TensorSlice::Flat(0, 12), TensorSlice::Flat(5, 24), TensorSlice::Box({1, 1}, {4, 3}),
          TensorSlice::Whole(Shape{6, 4})}) {
      absl::StatusOr<Tensor> got = r->ReadSlice("w", s);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectEqual(*got, Expected(Find("w"), s));
    }
    for (const TensorSlice& s : {TensorSlice::Box({0, 2}, {5, 4}), TensorSlice::Flat(3, 37),
                                 TensorSlice::Box({2, 0}, {2, 8})}) {
      absl::StatusOr<Tensor> got = r->ReadSlice("emb", s);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectEqual(*got, Expected(Find("emb"), s));
    }
    EXPECT_EQ(r->ReadSlice("nope", TensorSlice::Flat(0, 1)).status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(r->ReadSlice("b", TensorSlice::Flat(0, 8)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(ShardedCheckpointTest, AFailingRankCommitsNothingAndKeepsThePreviousCheckpoint) {
  for (const absl::Status& s : SaveOnRanks(5, 2)) ASSERT_TRUE(s.ok()) << s;
  // Rank 1's writes fail from its 2nd mutation on: its shard file is left unsynced.
  for (int64_t fail_at : {0, 1, 2, 3}) {
    SCOPED_TRACE(fail_at);
    FaultInjectionEnv faulty(mem_.get());
    faulty.FailAfter(fail_at);
    std::vector<absl::Status> st = SaveOnRanks(
        6, 2, [&](int r) -> Env* { return r == 1 ? static_cast<Env*>(&faulty) : mem_.get(); });
    EXPECT_EQ(st[0].code(), absl::StatusCode::kAborted) << st[0];
    EXPECT_THAT(std::string(st[0].message()), HasSubstr("another rank failed"));
    EXPECT_FALSE(st[1].ok());
    EXPECT_FALSE(mem_->FileExists("/ck/step_6"));
    CheckpointOptions o;
    o.env = mem_.get();
    auto m = *CheckpointManager::Open("/ck", o);  // cleans up the temporary directory
    EXPECT_EQ(*m->Steps(), std::vector<int64_t>{5});
    absl::StatusOr<Checkpoint> c = m->RestoreLatest();
    ASSERT_TRUE(c.ok()) << c.status();
    for (const auto& [name, t] : tensors_) ExpectEqual(c->tensors.at(name), t);
  }
  // Rank 0 (the committer) failing: nothing committed either.
  FaultInjectionEnv faulty(mem_.get());
  faulty.FailNth(FaultInjectionEnv::kRename, 0);
  std::vector<absl::Status> st = SaveOnRanks(
      7, 2, [&](int r) -> Env* { return r == 0 ? static_cast<Env*>(&faulty) : mem_.get(); });
  EXPECT_FALSE(st[0].ok());
  EXPECT_EQ(st[1].code(), absl::StatusCode::kAborted) << st[1];
  EXPECT_FALSE(mem_->FileExists("/ck/step_7"));
}

TEST_F(ShardedCheckpointTest, PiecesThatDoNotTileAreDataLoss) {
  // Rank 1 forgets its part of b: the commit succeeds (no rank can see the others' pieces), the
  // reader refuses the checkpoint, and RestoreLatest falls back to the older one.
  for (const absl::Status& s : SaveOnRanks(1, 2)) ASSERT_TRUE(s.ok()) << s;
  auto drop_b = [&](int r) {
    std::vector<TensorPiece> p = PiecesOf(r, 2);
    if (r == 1) p.erase(p.begin() + 1);
    return p;
  };
  for (const absl::Status& s : SaveOnRanks(2, 2, nullptr, drop_b)) ASSERT_TRUE(s.ok()) << s;
  auto r = CheckpointReader::Open("/ck/step_2", mem_.get());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("the pieces of 'b' cover 4 of its 7"));
  CheckpointOptions o;
  o.env = mem_.get();
  o.run_id = "run-a";
  auto m = *CheckpointManager::Open("/ck", o);
  absl::StatusOr<Checkpoint> c = m->RestoreLatest();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 1);
  EXPECT_THAT(c->notes[0], HasSubstr("skipped step_2"));
}

// A tensor-parallel split of K groups: each of 2 ranks holds 2 column blocks of emb (block r of
// each half), saved as 2 boxes of one name, which go to separate shard files. Overlapping boxes
// on one rank are refused (InvalidArgument on that rank) and nothing is committed.
TEST_F(ShardedCheckpointTest, ARankMayHoldSeveralDisjointBoxesOfOneTensor) {
  auto groups = [&](int r) {
    std::vector<TensorPiece> out;
    for (int q = 0; q < 2; ++q) {
      const TensorSlice box = TensorSlice::Box({0, q * 4 + r * 2}, {5, 2});
      staged_[r * 2 + q] = Expected(Find("emb"), box);
      out.push_back({"emb", DType::kF32, Shape{5, 8}, box, staged_[r * 2 + q].raw_data()});
    }
    return out;
  };
  for (const absl::Status& s : SaveOnRanks(4, 2, nullptr, groups)) ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(mem_->FileExists("/ck/step_4/rank-00001-shard-00001-of-00002.safetensors"));
  auto r = CheckpointReader::Open("/ck/step_4", mem_.get());
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<Tensor> e = (*r)->ReadSlice("emb", TensorSlice::Whole(Shape{5, 8}));
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectEqual(*e, Find("emb"));

  auto overlapping = [&](int r) {
    std::vector<TensorPiece> out = groups(r);
    if (r == 1) out[1].slice = TensorSlice::Box({0, 3}, {5, 2});
    return out;
  };
  std::vector<absl::Status> st = SaveOnRanks(5, 2, nullptr, overlapping);
  EXPECT_EQ(st[1].code(), absl::StatusCode::kInvalidArgument) << st[1];
  EXPECT_THAT(std::string(st[1].message()), HasSubstr("[0:5, 2:4] and [0:5, 3:5] overlap"));
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(mem_->FileExists("/ck/step_5"));
}

TEST_F(ShardedCheckpointTest, DamagedPieceIsDataLoss) {
  for (const absl::Status& s : SaveOnRanks(3, 2)) ASSERT_TRUE(s.ok()) << s;
  const std::string file = "/ck/step_3/rank-00001-shard-00000-of-00001.safetensors";
  std::string bytes = *ReadFileToString(mem_.get(), file);
  bytes[bytes.size() - 3] ^= 0x40;  // inside rank 1's emb block
  ASSERT_TRUE(WriteStringToFile(mem_.get(), bytes, file, true).ok());
  auto r = *CheckpointReader::Open("/ck/step_3", mem_.get());
  EXPECT_TRUE(r->ReadSlice("w", TensorSlice::Flat(0, 24)).ok());  // not in the damaged piece
  absl::StatusOr<Tensor> e = r->ReadSlice("emb", TensorSlice::Whole(Shape{5, 8}));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("'emb' [0:5, 4:8]: CRC32C mismatch"));
}

TEST_F(ShardedCheckpointTest, UnshardedCheckpointsReadThroughTheReader) {
  CheckpointOptions o;
  o.env = mem_.get();
  auto m = *CheckpointManager::Open("/ck", o);
  ASSERT_TRUE(m->Save(4, tensors_).ok());
  auto r = *CheckpointReader::Open("/ck/step_4", mem_.get());
  EXPECT_FALSE(r->sharded());
  EXPECT_EQ(r->names(), (std::vector<std::string>{"w", "b", "emb"}));
  const TensorSlice s = TensorSlice::Box({1, 3}, {3, 5});
  ExpectEqual(*r->ReadSlice("emb", s), Expected(Find("emb"), s));
}

}  // namespace
}  // namespace kiln::train
