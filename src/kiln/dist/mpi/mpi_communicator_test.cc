// Runs under mpirun on 2 ranks (run_mpi_test.sh): every test is collective, and each rank checks
// its own results against the scalar oracle, which it evaluates on every rank's inputs (each rank
// can generate all of them).
//   dist_mpi_test                  the ops (GoogleTest)
//   dist_mpi_test --dead_peer      rank 1 never joins: rank 0 must get DeadlineExceeded in ~1 s
//   dist_mpi_test --crashed_peer   rank 1 exits at once: mpirun must end the job
//   dist_mpi_test --dead_peer_split  as --dead_peer, on a communicator split from the world
#include "kiln/dist/mpi/mpi_communicator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/dist/internal/oracle.h"

namespace kiln::dist {
namespace {

using internal::Input;
using internal::OracleElement;
using ::testing::HasSubstr;

MpiCommunicator* g_comm = nullptr;  // MpiReduction::kRankOrder (the default)
MpiCommunicator* g_mpi = nullptr;   // MpiReduction::kMpi

MpiCommunicator* For(MpiReduction reduction) {
  return reduction == MpiReduction::kRankOrder ? g_comm : g_mpi;
}

std::vector<Tensor> AllInputs(DType dtype, int64_t count) {
  std::vector<Tensor> in;
  for (int r = 0; r < g_comm->size(); ++r) in.push_back(Input(dtype, count, r));
  return in;
}

// kRankOrder: bit-identical to the oracle. kMpi: with 2 ranks each element is x0 + x1 exactly
// once, bit-identical too; with more, only close (OpenMPI's association).
void ExpectMatches(const Tensor& got, const Tensor& expected, MpiReduction reduction,
                   const std::string& what) {
  if (reduction == MpiReduction::kRankOrder || g_comm->size() <= 2 || got.dtype() == DType::kS32) {
    EXPECT_TRUE(got.BitwiseEquals(expected)) << what;
    return;
  }
  for (int64_t i = 0; i < got.num_elements(); ++i)
    ASSERT_NEAR(got.GetDouble(i), expected.GetDouble(i), 1e-3) << what << " element " << i;
}

class MpiReduceTest : public ::testing::TestWithParam<std::tuple<MpiReduction, DType, ReduceOp>> {};

TEST_P(MpiReduceTest, AllReduceMatchesOracle) {
  const auto [reduction, dtype, op] = GetParam();
  const int64_t count = 3001;  // not a multiple of the size: unequal slices
  std::vector<Tensor> in = AllInputs(dtype, count);
  Tensor data = in[g_comm->rank()].Clone();
  ASSERT_TRUE(For(reduction)->AllReduce(data, op).ok());
  Tensor expected(dtype, Shape{count});
  for (int64_t i = 0; i < count; ++i) OracleElement(in, i, op, expected.raw_data(), i);
  ExpectMatches(data, expected, reduction, "AllReduce");
}

TEST_P(MpiReduceTest, ReduceScatterMatchesOracle) {
  const auto [reduction, dtype, op] = GetParam();
  const int64_t chunk = 1500;
  std::vector<Tensor> in = AllInputs(dtype, chunk * g_comm->size());
  Tensor out(dtype, Shape{chunk});
  ASSERT_TRUE(For(reduction)->ReduceScatter(in[g_comm->rank()], out, op).ok());
  Tensor expected(dtype, Shape{chunk});
  for (int64_t i = 0; i < chunk; ++i)
    OracleElement(in, g_comm->rank() * chunk + i, op, expected.raw_data(), i);
  ExpectMatches(out, expected, reduction, "ReduceScatter");
}

INSTANTIATE_TEST_SUITE_P(
    All, MpiReduceTest,
    ::testing::Combine(::testing::Values(MpiReduction::kRankOrder, MpiReduction::kMpi),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kS32),
                       ::testing::Values(ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax)));

// Slices of several 4 MiB segments, the last one partial: the pipelined rank-order all-reduce.
TEST(MpiCommunicatorTest, MultiSegmentAllReduceMatchesOracle) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t count = 5'000'003;
    std::vector<Tensor> in = AllInputs(dtype, count);
    Tensor data = in[g_comm->rank()].Clone();
    ASSERT_TRUE(g_comm->AllReduce(data, ReduceOp::kSum).ok());
    Tensor expected(dtype, Shape{count});
    for (int64_t i = 0; i < count; ++i)
      OracleElement(in, i, ReduceOp::kSum, expected.raw_data(), i);
    EXPECT_TRUE(data.BitwiseEquals(expected)) << DTypeName(dtype);
  }
}

class MpiMoveTest : public ::testing::TestWithParam<DType> {};

TEST_P(MpiMoveTest, AllGatherConcatenatesInRankOrder) {
  const DType dtype = GetParam();
  const int64_t count = 777;
  std::vector<Tensor> in = AllInputs(dtype, count);
  Tensor out(dtype, Shape{g_comm->size(), count});
  ASSERT_TRUE(g_comm->AllGather(in[g_comm->rank()], out).ok());
  const int64_t bytes = count * DTypeSize(dtype);
  for (int r = 0; r < g_comm->size(); ++r)
    EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(out.raw_data()) + r * bytes,
                             in[r].raw_data(), bytes))
        << "slice " << r;
}

TEST_P(MpiMoveTest, BroadcastCopiesTheRoot) {
  const DType dtype = GetParam();
  for (int root = 0; root < g_comm->size(); ++root) {
    std::vector<Tensor> in = AllInputs(dtype, 999);
    Tensor data = in[g_comm->rank()].Clone();
    ASSERT_TRUE(g_comm->Broadcast(data, root).ok());
    EXPECT_TRUE(data.BitwiseEquals(in[root])) << "root " << root;
  }
}

INSTANTIATE_TEST_SUITE_P(All, MpiMoveTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kS32));

TEST(MpiCommunicatorTest, RankAndSizeComeFromMpi) {
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");  // set by mpirun for every rank
  ASSERT_NE(world, nullptr);
  EXPECT_EQ(g_comm->size(), std::atoi(world));
  EXPECT_EQ(g_comm->rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_GE(g_comm->rank(), 0);
  EXPECT_LT(g_comm->rank(), g_comm->size());
  std::vector<int32_t> ranks(g_comm->size(), -1);
  int32_t mine = g_comm->rank();
  ASSERT_TRUE(g_comm->AllGather(&mine, ranks.data(), 1, DType::kS32).ok());
  for (int r = 0; r < g_comm->size(); ++r) EXPECT_EQ(ranks[r], r);
  EXPECT_TRUE(g_comm->Barrier().ok());
}

// A large all-reduce (more than OpenMPI's segment sizes) repeated from the same inputs: the same
// bits every time, and on every rank.
TEST(MpiCommunicatorTest, LargeAllReduceIsBitIdenticalRunToRunAndAcrossRanks) {
  const int64_t count = (8 << 20) / 4;
  Tensor input = Input(DType::kF32, count, g_comm->rank());
  std::vector<Tensor> all = AllInputs(DType::kF32, 64);  // the oracle on a prefix
  Tensor first;
  for (int run = 0; run < 3; ++run) {
    Tensor data = input.Clone();
    ASSERT_TRUE(g_comm->AllReduce(data, ReduceOp::kMean).ok());
    Tensor via_mpi = input.Clone();
    ASSERT_TRUE(g_mpi->AllReduce(via_mpi, ReduceOp::kMean).ok());
    if (g_comm->size() == 2) {
      EXPECT_TRUE(via_mpi.BitwiseEquals(data)) << "2 ranks: OpenMPI's sum is x0 + x1 too";
    }
    if (run == 0)
      first = data;
    else
      EXPECT_TRUE(data.BitwiseEquals(first)) << "run " << run;
  }
  Tensor expected(DType::kF32, Shape{64});
  for (int64_t i = 0; i < 64; ++i) OracleElement(all, i, ReduceOp::kMean, expected.raw_data(), i);
  EXPECT_EQ(0, std::memcmp(first.raw_data(), expected.raw_data(), 64 * sizeof(float)));
  Tensor from_root = first.Clone();
  ASSERT_TRUE(g_comm->Broadcast(from_root, 0).ok());
  EXPECT_TRUE(from_root.BitwiseEquals(first)) << "rank " << g_comm->rank() << " differs from 0";
}

TEST(MpiCommunicatorTest, BadArgumentsReturnInvalidArgumentWithoutJoining) {
  Tensor send(DType::kF32, Shape{5});
  Tensor recv(DType::kF32, Shape{3});
  absl::Status s = g_comm->ReduceScatter(send, recv, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("do not match"));
  Tensor f16(DType::kF16, Shape{4});
  EXPECT_EQ(g_comm->AllReduce(f16, ReduceOp::kMax).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g_comm->Broadcast(send, 7).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(g_comm->Barrier().ok());  // nobody joined anything above
}

// Split over 2 real processes: reversed keys reverse the group's order; singletons are the
// identity; a negative color on one rank fails on both (the colors are exchanged first).
TEST(MpiCommunicatorTest, SplitFormsGroupsInKeyOrder) {
  for (MpiReduction reduction : {MpiReduction::kRankOrder, MpiReduction::kMpi}) {
    MpiCommunicator* c = For(reduction);
    auto reversed = c->Split(0, -c->rank());
    ASSERT_TRUE(reversed.ok()) << reversed.status();
    EXPECT_EQ((*reversed)->size(), c->size());
    EXPECT_EQ((*reversed)->rank(), c->size() - 1 - c->rank());
    const int32_t me = c->rank();
    std::vector<int32_t> all(c->size());
    ASSERT_TRUE((*reversed)->AllGather(&me, all.data(), 1, DType::kS32).ok());
    for (int i = 0; i < c->size(); ++i) EXPECT_EQ(all[i], c->size() - 1 - i);
    std::vector<Tensor> in = AllInputs(DType::kF32, 3001);
    Tensor data = in[c->rank()].Clone();
    ASSERT_TRUE((*reversed)->AllReduce(data, ReduceOp::kSum).ok());
    Tensor want = in[c->rank()].Clone();
    ASSERT_TRUE(c->AllReduce(want, ReduceOp::kSum).ok());
    if (c->size() == 2) EXPECT_TRUE(data.BitwiseEquals(want));  // x0 + x1 == x1 + x0

    auto alone = c->Split(c->rank(), 0);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ((*alone)->size(), 1);
    Tensor own = in[c->rank()].Clone();
    ASSERT_TRUE((*alone)->AllReduce(own, ReduceOp::kSum).ok());
    EXPECT_TRUE(own.BitwiseEquals(in[c->rank()]));

    absl::Status bad = c->Split(c->rank() == 1 ? -1 : 0, 0).status();
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(bad.message()), HasSubstr("rank 1 passed color -1"));
    EXPECT_TRUE(c->Barrier().ok());
  }
}

int DeadPeer() {
  g_comm->set_timeout(std::chrono::milliseconds(1000));
  if (g_comm->rank() != 0) {
    std::printf("dead-peer: rank %d not joining\n", g_comm->rank());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(0);  // without MPI_Finalize; rank 0 has normally aborted the job long before
  }
  std::vector<float> data(1 << 20, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = g_comm->AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  absl::Status after = g_comm->Barrier();
  const bool ok = s.code() == absl::StatusCode::kDeadlineExceeded && ms >= 990 && ms < 3000 &&
                  std::string(s.message()).find("AllReduce of 4194304 bytes on rank 0 of 2") !=
                      std::string::npos &&
                  after.code() == absl::StatusCode::kFailedPrecondition;
  std::printf("dead-peer: %s: rank 0 got [%s] after %.0f ms; the next call got [%s]\n",
              ok ? "PASS" : "FAIL", s.ToString().c_str(), ms, after.ToString().c_str());
  std::fflush(stdout);
  g_comm->Abort(ok ? 0 : 1);
}

// As DeadPeer, on a communicator split from the world: the timeout holds on it, and the world
// communicator reports the job broken (broken() is what the CLI checks before aborting).
int DeadPeerSplit() {
  g_comm->set_timeout(std::chrono::milliseconds(1000));
  auto group = g_comm->Split(0, g_comm->rank());
  if (!group.ok()) {
    std::printf("dead-peer-split: FAIL: Split: %s\n", group.status().ToString().c_str());
    std::fflush(stdout);
    g_comm->Abort(1);
  }
  if (g_comm->rank() != 0) {
    std::printf("dead-peer-split: rank %d not joining\n", g_comm->rank());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(0);
  }
  std::vector<float> data(1 << 16, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = (*group)->AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const bool ok =
      s.code() == absl::StatusCode::kDeadlineExceeded && ms >= 990 && ms < 3000 && g_comm->broken();
  std::printf("dead-peer-split: %s: rank 0 got [%s] after %.0f ms; world broken: %d\n",
              ok ? "PASS" : "FAIL", s.ToString().c_str(), ms, g_comm->broken() ? 1 : 0);
  std::fflush(stdout);
  g_comm->Abort(ok ? 0 : 1);
}

int CrashedPeer() {
  g_comm->set_timeout(std::chrono::milliseconds(20000));
  if (g_comm->rank() != 0) {
    std::printf("crashed-peer: rank %d exiting\n", g_comm->rank());
    std::fflush(stdout);
    std::_Exit(3);
  }
  std::vector<float> data(1 << 20, 1.0f);
  absl::Status s = g_comm->AllReduce(data.data(), data.size(), DType::kF32, ReduceOp::kSum);
  // Only reached if mpirun did not end the job; the wrapper's 10 s limit fails the test first.
  std::printf("crashed-peer: rank 0 returned [%s]\n", s.ToString().c_str());
  std::fflush(stdout);
  g_comm->Abort(1);
}

}  // namespace
}  // namespace kiln::dist

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  auto comm = kiln::dist::MpiCommunicator::Create(std::chrono::milliseconds(20000));
  if (!comm.ok()) {
    std::fprintf(stderr, "MpiCommunicator::Create: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  kiln::dist::g_comm = comm->get();
  auto mpi = kiln::dist::MpiCommunicator::Create(std::chrono::milliseconds(20000),
                                                 kiln::dist::MpiReduction::kMpi);
  if (!mpi.ok()) {
    std::fprintf(stderr, "MpiCommunicator::Create: %s\n", mpi.status().ToString().c_str());
    return 1;
  }
  kiln::dist::g_mpi = mpi->get();
  if (mode == "--dead_peer") return kiln::dist::DeadPeer();
  if (mode == "--crashed_peer") return kiln::dist::CrashedPeer();
  if (mode == "--dead_peer_split") return kiln::dist::DeadPeerSplit();
  int32_t failed = RUN_ALL_TESTS() != 0;
  // Both ranks exit with the same code: any rank's failure fails the job.
  if (!kiln::dist::g_comm->AllReduce(&failed, 1, kiln::DType::kS32, kiln::dist::ReduceOp::kMax)
           .ok())
    failed = 1;
  mpi->reset();  // free the communicators before MPI_Finalize runs at exit
  comm->reset();
  return failed;
}
