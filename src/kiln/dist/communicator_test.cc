#include "kiln/dist/communicator.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/dist/collectives_adapter.h"
#include "kiln/dist/internal/oracle.h"
#include "kiln/dist/thread_communicator.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {
namespace {

using internal::Input;
using internal::OracleElement;
using ::testing::HasSubstr;

// Runs fn(rank, comm) on one thread per rank and waits for all.
void RunRanks(std::vector<std::unique_ptr<Communicator>>& comms,
              const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(comms.size()); ++r)
    threads.emplace_back([&, r] { fn(r, *comms[r]); });
  for (auto& t : threads) t.join();
}

struct ReduceCase {
  int ranks;
  DType dtype;
  ReduceOp op;
};

std::string CaseName(const ::testing::TestParamInfo<ReduceCase>& info) {
  return std::to_string(info.param.ranks) + "ranks_" + std::string(DTypeName(info.param.dtype)) +
         "_" + std::string(ReduceOpName(info.param.op));
}

class ReduceTest : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceTest, AllReduceMatchesOracle) {
  const auto [n, dtype, op] = GetParam();
  const int64_t count = 2500;  // more than one 1024-element block
  std::vector<Tensor> in, data;
  for (int r = 0; r < n; ++r) {
    in.push_back(Input(dtype, count, r));
    data.push_back(in.back().Clone());
  }
  Tensor expected(dtype, Shape{count});
  for (int64_t i = 0; i < count; ++i) OracleElement(in, i, op, expected.raw_data(), i);
  auto comms = MakeThreadCommunicators(n);
  RunRanks(comms, [&](int r, Communicator& c) { EXPECT_TRUE(c.AllReduce(data[r], op).ok()); });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(data[r].BitwiseEquals(expected)) << "rank " << r;
}

TEST_P(ReduceTest, ReduceScatterMatchesOracle) {
  const auto [n, dtype, op] = GetParam();
  const int64_t chunk = 1100;
  std::vector<Tensor> in, out;
  for (int r = 0; r < n; ++r) {
    in.push_back(Input(dtype, chunk * n, r));
    out.emplace_back(dtype, Shape{chunk});
  }
  auto comms = MakeThreadCommunicators(n);
  RunRanks(comms,
           [&](int r, Communicator& c) { EXPECT_TRUE(c.ReduceScatter(in[r], out[r], op).ok()); });
  for (int r = 0; r < n; ++r) {
    Tensor expected(dtype, Shape{chunk});
    for (int64_t i = 0; i < chunk; ++i)
      OracleElement(in, r * chunk + i, op, expected.raw_data(), i);
    EXPECT_TRUE(out[r].BitwiseEquals(expected)) << "rank " << r;
  }
}

std::vector<ReduceCase> AllCases() {
  std::vector<ReduceCase> cases;
  for (int n : {1, 2, 3, 4})
    for (DType d : {DType::kF32, DType::kBF16, DType::kS32})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax})
        cases.push_back({n, d, op});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(All, ReduceTest, ::testing::ValuesIn(AllCases()), CaseName);

class MoveTest : public ::testing::TestWithParam<DType> {};

TEST_P(MoveTest, AllGatherConcatenatesInRankOrder) {
  const DType dtype = GetParam();
  const int n = 3;
  const int64_t count = 700;
  std::vector<Tensor> in, out;
  for (int r = 0; r < n; ++r) {
    in.push_back(Input(dtype, count, r));
    out.emplace_back(dtype, Shape{n, count});
  }
  auto comms = MakeThreadCommunicators(n);
  RunRanks(comms, [&](int r, Communicator& c) { EXPECT_TRUE(c.AllGather(in[r], out[r]).ok()); });
  const int64_t bytes = count * DTypeSize(dtype);
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < n; ++s)
      EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(out[r].raw_data()) + s * bytes,
                               in[s].raw_data(), bytes))
          << "rank " << r << " slice " << s;
}

TEST_P(MoveTest, BroadcastCopiesTheRoot) {
  const DType dtype = GetParam();
  const int n = 3;
  for (int root = 0; root < n; ++root) {
    std::vector<Tensor> data;
    for (int r = 0; r < n; ++r) data.push_back(Input(dtype, 900, r));
    const Tensor expected = data[root].Clone();
    auto comms = MakeThreadCommunicators(n);
    RunRanks(comms, [&](int r, Communicator& c) { EXPECT_TRUE(c.Broadcast(data[r], root).ok()); });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(data[r].BitwiseEquals(expected)) << r << " " << root;
  }
}

INSTANTIATE_TEST_SUITE_P(All, MoveTest, ::testing::Values(DType::kF32, DType::kBF16, DType::kS32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(ThreadCommunicatorTest, BarrierWaitsForEveryRank) {
  const int n = 4;
  std::atomic<int> before{0};
  std::vector<int> seen(n, -1);
  auto comms = MakeThreadCommunicators(n);
  RunRanks(comms, [&](int r, Communicator& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * r));
    before.fetch_add(1);
    EXPECT_TRUE(c.Barrier().ok());
    seen[r] = before.load();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(seen[r], n) << r;
}

TEST(ThreadCommunicatorTest, ResultsAreBitIdenticalRunToRun) {
  const int n = 4;
  const int64_t count = 5000;
  Tensor first;
  for (int run = 0; run < 6; ++run) {
    std::vector<Tensor> data;
    for (int r = 0; r < n; ++r) data.push_back(Input(DType::kF32, count, r));
    auto comms = MakeThreadCommunicators(n);
    std::mt19937 jitter(run);
    std::vector<int> delay_us(n);
    for (int& d : delay_us) d = jitter() % 3000;  // different arrival orders each run
    RunRanks(comms, [&](int r, Communicator& c) {
      for (int step = 0; step < 3; ++step) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us[(r + step) % n]));
        EXPECT_TRUE(c.AllReduce(data[r], ReduceOp::kMean).ok());
      }
    });
    for (int r = 1; r < n; ++r) EXPECT_TRUE(data[r].BitwiseEquals(data[0])) << "rank " << r;
    if (run == 0)
      first = data[0].Clone();
    else
      EXPECT_TRUE(data[0].BitwiseEquals(first)) << "run " << run;
  }
}

TEST(ThreadCommunicatorTest, AMissingRankTimesOutInsteadOfHanging) {
  const int n = 3;
  const auto timeout = std::chrono::milliseconds(300);
  auto comms = MakeThreadCommunicators(n, timeout);
  std::vector<absl::Status> status(n);
  std::vector<double> elapsed_ms(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n - 1; ++r)  // rank n-1 never joins
    threads.emplace_back([&, r] {
      Tensor t = Input(DType::kF32, 256, r);
      const auto start = std::chrono::steady_clock::now();
      status[r] = comms[r]->AllReduce(t, ReduceOp::kSum);
      elapsed_ms[r] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("AllReduce of 1024 bytes"));
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr("on rank " + std::to_string(r) + " of 3"));
    EXPECT_LT(elapsed_ms[r], 300 + 1000) << "rank " << r;
  }
  // At least one rank waited the whole timeout; the other may have been released by it.
  EXPECT_GE(std::max(elapsed_ms[0], elapsed_ms[1]), 300 - 5);
  // The group is broken for good: the late rank, and any later call, fail at once.
  Tensor late = Input(DType::kF32, 256, 2);
  absl::Status s = comms[2]->AllReduce(late, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(comms[0]->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  // The seam says so on every rank, and so do the collectives over it.
  for (int r = 0; r < n; ++r) EXPECT_TRUE(comms[r]->broken()) << "rank " << r;
  CommunicatorCollectives collectives(*comms[0]);
  EXPECT_TRUE(collectives.broken());
}

// Abort on one in-process rank breaks the group: a peer waiting in a collective fails at once
// (not at its timeout), and every rank then reports broken().
TEST(ThreadCommunicatorTest, AbortBreaksTheGroupForEveryRank) {
  auto comms = MakeThreadCommunicators(2, std::chrono::milliseconds(60000));
  EXPECT_FALSE(comms[0]->broken());
  EXPECT_FALSE(CommunicatorCollectives(*comms[1]).broken());
  absl::Status waiting;
  const auto start = std::chrono::steady_clock::now();
  std::thread peer([&] { waiting = comms[0]->Barrier(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[1]->Abort(3);
  peer.join();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(waiting.ok());
  EXPECT_THAT(std::string(waiting.message()), HasSubstr("rank 1 aborted the job (code 3)"));
  EXPECT_LT(ms, 30000);
  EXPECT_TRUE(comms[0]->broken());
  EXPECT_TRUE(comms[1]->broken());
  EXPECT_EQ(comms[1]->Barrier().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ThreadCommunicatorTest, MismatchedArgumentsAcrossRanksFailOnEveryRank) {
  auto comms = MakeThreadCommunicators(2);
  std::vector<absl::Status> status(2);
  RunRanks(comms, [&](int r, Communicator& c) {
    Tensor t = Input(DType::kF32, r == 0 ? 4 : 3, r);
    status[r] = c.AllReduce(t, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("element count"));
  }
  EXPECT_THAT(std::string(status[0].message()), HasSubstr("element count 4 vs 3"));
  // The group is still usable after a mismatch every rank saw.
  RunRanks(comms, [&](int r, Communicator& c) { EXPECT_TRUE(c.Barrier().ok()); });
  RunRanks(comms, [&](int r, Communicator& c) {
    Tensor t = Input(DType::kF32, 8, r);
    status[r] = r == 0 ? c.AllReduce(t, ReduceOp::kSum) : c.Broadcast(t, 0);
  });
  EXPECT_THAT(std::string(status[1].message()), HasSubstr("op Broadcast vs AllReduce"));
}

TEST(ThreadCommunicatorTest, BadLocalArgumentsAreInvalidArgument) {
  auto comms = MakeThreadCommunicators(2);
  Communicator& c = *comms[0];
  Tensor send(DType::kF32, Shape{7});
  Tensor recv(DType::kF32, Shape{3});
  absl::Status s = c.ReduceScatter(send, recv, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ReduceScatter"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("do not match"));
  Tensor gathered(DType::kF32, Shape{5});
  s = c.AllGather(recv, gathered);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("AllGather"));
  Tensor wrong_dtype(DType::kBF16, Shape{6});
  EXPECT_THAT(std::string(c.AllGather(recv, wrong_dtype).message()), HasSubstr("bf16[6]"));
  Tensor f16(DType::kF16, Shape{4});
  s = c.AllReduce(f16, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("f16 is not reducible"));
  EXPECT_EQ(c.Broadcast(send, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Broadcast(send, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(nullptr, 4, DType::kF32, ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(send.raw_data(), -1, DType::kF32, ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  float buf[8] = {};
  s = c.ReduceScatter(buf, buf + 3, 2, DType::kF32, ReduceOp::kSum);  // send is buf[0..4)
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("overlap"));
  EXPECT_THAT(std::string(c.AllGather(buf, buf + 1, 2, DType::kF32).message()),
              HasSubstr("overlap"));
}

TEST(ThreadCommunicatorTest, SizeOneIsTheIdentity) {
  auto comms = MakeThreadCommunicators(1);
  Communicator& c = *comms[0];
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  Tensor t = Input(DType::kBF16, 100, 0);
  const Tensor before = t.Clone();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
    ASSERT_TRUE(c.AllReduce(t, op).ok());
    EXPECT_TRUE(t.BitwiseEquals(before));
  }
  ASSERT_TRUE(c.Broadcast(t, 0).ok());
  ASSERT_TRUE(c.Barrier().ok());
  Tensor out(DType::kBF16, Shape{100});
  ASSERT_TRUE(c.AllGather(t, out).ok());
  EXPECT_TRUE(out.BitwiseEquals(before));
}

// Split: a 2 x 3 mesh of 6 ranks, rank r at (r / 3, r % 3). Rows (color r / 3) and columns
// (color r % 3) each reduce among their own members only, in key order.
TEST(ThreadCommunicatorSplitTest, RowsAndColumnsSumWithinTheirGroupOnly) {
  const int n = 6, model = 3;
  auto comms = MakeThreadCommunicators(n, std::chrono::milliseconds(5000));
  std::vector<std::unique_ptr<Communicator>> rows(n), cols(n);
  std::vector<float> row_sum(n), col_sum(n);
  std::vector<std::vector<float>> col_gather(n, std::vector<float>(2));
  RunRanks(comms, [&](int r, Communicator& c) {
    auto row = c.Split(r / model, r % model);
    auto col = c.Split(r % model, r / model);
    ASSERT_TRUE(row.ok()) << row.status();
    ASSERT_TRUE(col.ok()) << col.status();
    rows[r] = *std::move(row);
    cols[r] = *std::move(col);
    EXPECT_EQ(rows[r]->size(), model);
    EXPECT_EQ(rows[r]->rank(), r % model);
    EXPECT_EQ(cols[r]->size(), n / model);
    EXPECT_EQ(cols[r]->rank(), r / model);
    EXPECT_EQ(rows[r]->timeout(), std::chrono::milliseconds(5000));
    row_sum[r] = static_cast<float>(1 << r);  // each rank's own bit: the sum names the members
    col_sum[r] = static_cast<float>(1 << r);
    EXPECT_TRUE(rows[r]->AllReduce(&row_sum[r], 1, DType::kF32, ReduceOp::kSum).ok());
    EXPECT_TRUE(cols[r]->AllReduce(&col_sum[r], 1, DType::kF32, ReduceOp::kSum).ok());
    const float mine = static_cast<float>(r);
    EXPECT_TRUE(cols[r]->AllGather(&mine, col_gather[r].data(), 1, DType::kF32).ok());
  });
  for (int r = 0; r < n; ++r) {
    const int d = r / model, m = r % model;
    EXPECT_EQ(row_sum[r], static_cast<float>(7 << (3 * d))) << "rank " << r;  // 3 ranks of row d
    EXPECT_EQ(col_sum[r], static_cast<float>((1 << m) + (1 << (m + 3)))) << "rank " << r;
    EXPECT_EQ(col_gather[r], (std::vector<float>{static_cast<float>(m), static_cast<float>(m + 3)}))
        << "rank " << r;
  }
  // The groups outlive the world communicators and stay independent: one row's collective does
  // not wait for the other row.
  comms.clear();
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(model);
  for (int m = 0; m < model; ++m)
    threads.emplace_back([&, m] { status[m] = rows[m]->Barrier(); });  // row 0 only
  for (auto& t : threads) t.join();
  for (int m = 0; m < model; ++m) EXPECT_TRUE(status[m].ok()) << status[m];
}

TEST(ThreadCommunicatorSplitTest, KeysOrderTheGroupAndTiesKeepRankOrder) {
  const int n = 4;
  auto comms = MakeThreadCommunicators(n);
  std::vector<int> new_rank(n, -1);
  std::vector<std::vector<int32_t>> gathered(n, std::vector<int32_t>(n));
  RunRanks(comms, [&](int r, Communicator& c) {
    // One group; keys 1, 0, 1, 0: order rank 1, rank 3 (key 0), then rank 0, rank 2 (key 1).
    auto g = c.Split(7, r % 2 == 0 ? 1 : 0);
    ASSERT_TRUE(g.ok()) << g.status();
    new_rank[r] = (*g)->rank();
    const int32_t me = r;
    EXPECT_TRUE((*g)->AllGather(&me, gathered[r].data(), 1, DType::kS32).ok());
  });
  EXPECT_EQ(new_rank, (std::vector<int>{2, 0, 3, 1}));
  for (int r = 0; r < n; ++r) EXPECT_EQ(gathered[r], (std::vector<int32_t>{1, 3, 0, 2}));
}

TEST(ThreadCommunicatorSplitTest, ANegativeColorFailsOnEveryRank) {
  auto comms = MakeThreadCommunicators(3);
  std::vector<absl::Status> status(3);
  RunRanks(comms,
           [&](int r, Communicator& c) { status[r] = c.Split(r == 1 ? -2 : 0, r).status(); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("rank 1 passed color -2"));
  }
  // Nothing was split and the world still works.
  RunRanks(comms, [&](int r, Communicator& c) { EXPECT_TRUE(c.Barrier().ok()); });
}

TEST(ThreadCommunicatorSplitTest, MismatchedCallsFailOnEveryRank) {
  auto comms = MakeThreadCommunicators(2);
  std::vector<absl::Status> status(2);
  RunRanks(comms, [&](int r, Communicator& c) {
    if (r == 0) {
      status[r] = c.Split(0, 0).status();
    } else {
      float x = 1;
      status[r] = c.AllReduce(&x, 1, DType::kF32, ReduceOp::kSum);
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status[0].message()), HasSubstr("op Split vs AllReduce"));
  EXPECT_THAT(std::string(status[1].message()), HasSubstr("op AllReduce vs Split"));
  // Every rank saw the mismatch: the next Split on both works.
  RunRanks(comms, [&](int r, Communicator& c) {
    auto g = c.Split(0, r);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE((*g)->Barrier().ok());
  });
}

// A dead member of a group: its peers in that group time out (DeadlineExceeded) and that group
// is broken; the other group, and the world, are not.
TEST(ThreadCommunicatorSplitTest, ADeadPeerTimesOutInItsGroupOnly) {
  const int n = 4;
  auto comms = MakeThreadCommunicators(n, std::chrono::milliseconds(300));
  std::vector<std::unique_ptr<Communicator>> groups(n);
  RunRanks(comms, [&](int r, Communicator& c) {
    auto g = c.Split(r / 2, r);
    ASSERT_TRUE(g.ok()) << g.status();
    groups[r] = *std::move(g);
  });
  std::vector<absl::Status> status(n);
  std::vector<double> ms(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;  // rank 1 (group 0) is dead
    threads.emplace_back([&, r] {
      float x = 1;
      const auto start = std::chrono::steady_clock::now();
      status[r] = groups[r]->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum);
      ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(status[0].code(), absl::StatusCode::kDeadlineExceeded) << status[0];
  EXPECT_THAT(std::string(status[0].message()), HasSubstr("on rank 0 of 2"));
  EXPECT_GE(ms[0], 300 - 5);
  EXPECT_LT(ms[0], 300 + 1000);
  EXPECT_TRUE(status[2].ok()) << status[2];
  EXPECT_TRUE(status[3].ok()) << status[3];
  float y = 1;
  EXPECT_EQ(groups[1]->AllReduce(&y, 1, DType::kF32, ReduceOp::kSum).code(),
            absl::StatusCode::kFailedPrecondition);
  RunRanks(comms, [&](int r, Communicator& c) { EXPECT_TRUE(c.Barrier().ok()); });
}

TEST(ThreadCommunicatorSplitTest, SizeOneAndSingletonGroups) {
  auto one = MakeThreadCommunicators(1);
  auto g = one[0]->Split(0, 0);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->size(), 1);
  auto comms = MakeThreadCommunicators(3);
  std::vector<float> v(3);
  RunRanks(comms, [&](int r, Communicator& c) {
    auto s = c.Split(r, 0);  // every rank alone
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->size(), 1);
    EXPECT_EQ((*s)->rank(), 0);
    v[r] = static_cast<float>(r + 1);
    EXPECT_TRUE((*s)->AllReduce(&v[r], 1, DType::kF32, ReduceOp::kSum).ok());
    // Nested: a split of a split.
    auto t = (*s)->Split(0, 0);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE((*t)->Barrier().ok());
  });
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace kiln::dist
