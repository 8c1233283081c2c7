// A data-parallel train step on thread communicators (no MPI) against the one-process step: D
// ranks with B/D examples each track one process with the global batch B, on the cpu and the
// reference backends, with one bucket or several; the gradient buckets; a rank that never joins;
// the asynchronous all-reduce (bit-identical to the synchronous path, in flight while a backward
// kernel runs, its failure the step's error).
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/dist/collectives_adapter.h"
#include "kiln/dist/thread_communicator.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kB = 8, kF = 6, kC = 4, kSteps = 5;

nn::MlpClassifier Model() {
  return nn::MlpClassifier({.in_features = kF, .hidden = {5}, .num_classes = kC});
}

// Deterministic batches: step s, example i.
Tensor Inputs(int step, int first, int count) {
  Tensor x(DType::kF32, Shape{count, kF});
  for (int i = 0; i < count; ++i)
    for (int f = 0; f < kF; ++f)
      x.data<float>()[i * kF + f] = std::sin(0.7f * (first + i) + 0.3f * f + 1.1f * step);
  return x;
}
Tensor Labels(int step, int first, int count) {
  Tensor y(DType::kS32, Shape{count});
  for (int i = 0; i < count; ++i) y.data<int32_t>()[i] = (first + i + step) % kC;
  return y;
}

nn::TrainStepOptions Options() {
  nn::TrainStepOptions o;
  o.optimizer.kind = nn::OptimizerKind::kAdamW;
  o.optimizer.schedule.lr = 0.05;
  o.optimizer.clip_norm = 0.5;
  return o;
}

std::unique_ptr<runtime::Backend> Backend(bool cpu, bool async = true) {
  runtime::CpuBackendOptions o;
  o.async_collectives = async;
  return cpu ? runtime::MakeCpuBackend(o) : runtime::MakeReferenceBackend();
}

struct Result {
  std::vector<float> losses, norms;
  nn::ParamStore params;
  int64_t state_bytes = 0;
};

Result OneProcess(bool cpu) {
  nn::MlpClassifier model = Model();
  std::unique_ptr<runtime::Backend> backend = Backend(cpu);
  auto step = nn::TrainStep::Create(*backend, *model.LossGraph(kB),
                                    *nn::InitParams(model.Params(), 7), Options());
  EXPECT_TRUE(step.ok()) << step.status();
  Result r;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x = Inputs(s, 0, kB), y = Labels(s, 0, kB);
    auto m = (*step)->Run({&x, &y});
    EXPECT_TRUE(m.ok()) << m.status();
    r.losses.push_back(m->loss);
    r.norms.push_back(m->grad_norm);
  }
  r.params = (*step)->params().Clone();
  return r;
}

// D ranks on threads; rank r trains on examples [r B/D, (r+1) B/D) of each global batch.
std::vector<Result> DataParallel(bool cpu, int d, int64_t first_bucket, int64_t bucket,
                                 int* buckets, bool shard_state = false,
                                 nn::TrainStepOptions o = Options(), bool async = true,
                                 int64_t* async_run = nullptr) {
  std::vector<std::unique_ptr<Communicator>> comms = MakeThreadCommunicators(d);
  std::vector<std::unique_ptr<CommunicatorCollectives>> colls;
  std::vector<std::unique_ptr<runtime::Backend>> backends;
  std::vector<std::unique_ptr<nn::TrainStep>> steps;
  nn::MlpClassifier model = Model();
  for (int r = 0; r < d; ++r) {  // compiled here, one at a time: only the runs are concurrent
    colls.push_back(std::make_unique<CommunicatorCollectives>(*comms[r]));
    backends.push_back(Backend(cpu, async));
    o.data_parallel = d;
    o.collectives = colls[r].get();
    o.shard_state = shard_state;
    o.data_rank = r;
    o.first_bucket_bytes = first_bucket;
    o.bucket_bytes = bucket;
    auto step = nn::TrainStep::Create(*backends[r], *model.LossGraph(kB / d),
                                      *nn::InitParams(model.Params(), 7), o);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return {};
    steps.push_back(*std::move(step));
  }
  *buckets = steps[0]->num_gradient_buckets();

  std::vector<Result> results(d);
  std::vector<std::thread> threads;
  for (int r = 0; r < d; ++r) {
    threads.emplace_back([&, r] {
      for (int s = 0; s < kSteps; ++s) {
        Tensor x = Inputs(s, r * kB / d, kB / d), y = Labels(s, r * kB / d, kB / d);
        auto m = steps[r]->Run({&x, &y});
        EXPECT_TRUE(m.ok()) << m.status();
        if (!m.ok()) return;
        results[r].losses.push_back(m->loss);
        results[r].norms.push_back(m->grad_norm);
      }
      results[r].params = steps[r]->params().Clone();
      results[r].state_bytes = steps[r]->optimizer_state_bytes();
    });
  }
  for (std::thread& t : threads) t.join();
  if (async_run != nullptr) *async_run = steps[0]->executable().async_collectives_run();
  return results;
}

void ExpectTracks(const Result& one, const Result& dp, int rank) {
  ASSERT_EQ(dp.losses.size(), one.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s) {
    EXPECT_NEAR(dp.losses[s], one.losses[s], 1e-5 * std::abs(one.losses[s]))
        << "rank " << rank << " step " << s;
    EXPECT_NEAR(dp.norms[s], one.norms[s], 1e-5 * std::abs(one.norms[s]) + 1e-7);
  }
  for (int i = 0; i < one.params.size(); ++i) {
    const Tensor& a = one.params.value(i);
    const Tensor* b = dp.params.Find(one.params.names()[i]);
    ASSERT_NE(b, nullptr);
    for (int64_t k = 0; k < a.num_elements(); ++k)
      EXPECT_NEAR(b->data<float>()[k], a.data<float>()[k], 1e-5) << one.params.names()[i];
  }
}

class DataParallelStep : public ::testing::TestWithParam<bool> {};

TEST_P(DataParallelStep, TwoAndFourRanksTrackOneProcess) {
  const bool cpu = GetParam();
  const Result one = OneProcess(cpu);
  for (int d : {2, 4}) {
    int buckets = 0;
    std::vector<Result> dp = DataParallel(cpu, d, 1 << 20, 25 << 20, &buckets);
    ASSERT_EQ(dp.size(), d);
    EXPECT_EQ(buckets, 1);  // 4 small gradients fit the first bucket
    for (int r = 0; r < d; ++r) ExpectTracks(one, dp[r], r);
    // Every rank holds the same bits.
    for (int r = 1; r < d; ++r) {
      EXPECT_EQ(dp[r].losses, dp[0].losses);
      for (int i = 0; i < dp[0].params.size(); ++i)
        EXPECT_EQ(0, std::memcmp(dp[r].params.value(i).raw_data(), dp[0].params.value(i).raw_data(),
                                 dp[0].params.value(i).byte_size()));
    }
  }
}

TEST_P(DataParallelStep, SeveralBucketsGiveTheSameBits) {
  const bool cpu = GetParam();
  int one_bucket = 0, many = 0;
  std::vector<Result> a = DataParallel(cpu, 2, 1 << 20, 25 << 20, &one_bucket);
  // fc1: weight 5x4 (80 B), bias 4 (16 B); fc0: weight 6x5 (120 B), bias 5 (20 B).
  std::vector<Result> b = DataParallel(cpu, 2, 96, 100, &many);
  ASSERT_EQ(a.size(), 2);
  ASSERT_EQ(b.size(), 2);
  EXPECT_EQ(one_bucket, 1);
  EXPECT_EQ(many, 3);  // {fc1 bias, fc1 weight}, {fc0 bias}, {fc0 weight}
  EXPECT_EQ(a[0].losses, b[0].losses);
  for (int i = 0; i < a[0].params.size(); ++i)
    EXPECT_EQ(0, std::memcmp(a[0].params.value(i).raw_data(), b[0].params.value(i).raw_data(),
                             a[0].params.value(i).byte_size()));
}

bool SameBits(const nn::ParamStore& a, const nn::ParamStore& b) {
  if (a.size() != b.size()) return false;
  for (int i = 0; i < a.size(); ++i) {
    if (a.value(i).byte_size() != b.value(i).byte_size() ||
        std::memcmp(a.value(i).raw_data(), b.value(i).raw_data(), a.value(i).byte_size()) != 0)
      return false;
  }
  return true;
}

// ZeRO-1 on 1, 2 and 4 ranks (the 59 parameter elements do not split evenly: the last shard is
// padded) tracks one process as the unsharded data-parallel step does; every rank ends with the
// same parameters; the optimizer state is split over the ranks.
TEST_P(DataParallelStep, ZeroOneTracksOneProcessWithAShareOfTheState) {
  const bool cpu = GetParam();
  const Result one = OneProcess(cpu);
  int64_t whole_state = 0;
  for (int i = 0; i < one.params.size(); ++i) whole_state += 2 * one.params.value(i).byte_size();
  for (int d : {1, 2, 4}) {
    SCOPED_TRACE(d);
    int buckets = 0;
    std::vector<Result> z = DataParallel(cpu, d, 1 << 20, 25 << 20, &buckets, true);
    ASSERT_EQ(z.size(), d);
    EXPECT_EQ(buckets, 0);  // no all_reduce in the graph: a reduce-scatter instead
    int64_t state = 0;
    for (int r = 0; r < d; ++r) {
      ExpectTracks(one, z[r], r);
      EXPECT_EQ(z[r].losses, z[0].losses);
      EXPECT_TRUE(SameBits(z[r].params, z[0].params)) << "rank " << r;
      // AdamW m and v for ceil(59 / d) elements at most.
      EXPECT_LE(z[r].state_bytes, 2 * 4 * ((59 + d - 1) / d));
      state += z[r].state_bytes;
    }
    EXPECT_EQ(state, whole_state);
  }
}

// Without clipping the norm (the one sum ZeRO-1 takes in another order) does not touch the
// update: per element the mean gradient and the update are the unsharded step's, bit for bit.
// Two runs are bit-identical too.
TEST_P(DataParallelStep, ZeroOneWithoutClippingIsBitIdenticalToDataParallel) {
  const bool cpu = GetParam();
  nn::TrainStepOptions o = Options();
  o.optimizer.clip_norm = 0;
  for (int d : {2, 4}) {
    SCOPED_TRACE(d);
    int buckets = 0;
    std::vector<Result> dp = DataParallel(cpu, d, 1 << 20, 25 << 20, &buckets, false, o);
    std::vector<Result> z1 = DataParallel(cpu, d, 1 << 20, 25 << 20, &buckets, true, o);
    std::vector<Result> z2 = DataParallel(cpu, d, 1 << 20, 25 << 20, &buckets, true, o);
    ASSERT_EQ(z1.size(), d);
    ASSERT_EQ(z2.size(), d);
    EXPECT_EQ(z1[0].losses, dp[0].losses);
    EXPECT_TRUE(SameBits(z1[0].params, dp[0].params));
    EXPECT_EQ(z1[0].losses, z2[0].losses);
    EXPECT_TRUE(SameBits(z1[0].params, z2[0].params));
  }
}

TEST(ZeroShards, RangesCoverEveryElementOnce) {
  // Tensors of 30, 5, 20, 4 elements over 3 shards of 20: the last one padded by 1.
  EXPECT_EQ(nn::ShardSize({30, 5, 20, 4}, 3), 20);
  auto r0 = nn::ShardRanges({30, 5, 20, 4}, 3, 0);
  auto r1 = nn::ShardRanges({30, 5, 20, 4}, 3, 1);
  auto r2 = nn::ShardRanges({30, 5, 20, 4}, 3, 2);
  ASSERT_EQ(r0.size(), 1);
  EXPECT_EQ(r0[0].index, 0);
  EXPECT_EQ(r0[0].end, 20);
  ASSERT_EQ(r1.size(), 3);  // w0[20:30], b0[0:5], w1[0:5]
  EXPECT_EQ(r1[0].begin, 20);
  EXPECT_EQ(r1[1].shard_offset, 10);
  EXPECT_EQ(r1[2].end, 5);
  ASSERT_EQ(r2.size(), 2);  // w1[5:20], b1[0:4]
  EXPECT_EQ(r2[1].shard_offset, 15);
  EXPECT_EQ(r2[1].end, 4);
  EXPECT_TRUE(nn::ShardRanges({3}, 4, 3).empty());
}

TEST(DataParallelStepErrors, ZeroOneNeedsShardCollectivesAndEnoughElements) {
  nn::MlpClassifier model = Model();
  std::unique_ptr<runtime::Backend> backend = runtime::MakeReferenceBackend();
  nn::TrainStepOptions o = Options();
  o.shard_state = true;
  o.data_parallel = 2;
  o.data_rank = 2;
  std::vector<std::unique_ptr<Communicator>> comms = MakeThreadCommunicators(2);
  CommunicatorCollectives c(*comms[0]);
  o.collectives = &c;
  auto s =
      nn::TrainStep::Create(*backend, *model.LossGraph(4), *nn::InitParams(model.Params(), 7), o);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("data_rank (2)"));
  o.data_rank = 0;
  o.data_parallel = 64;  // 59 elements
  std::vector<std::unique_ptr<Communicator>> many = MakeThreadCommunicators(64);
  CommunicatorCollectives c64(*many[0]);
  o.collectives = &c64;
  s = nn::TrainStep::Create(*backend, *model.LossGraph(1), *nn::InitParams(model.Params(), 7), o);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("too few"));
}

INSTANTIATE_TEST_SUITE_P(Backends, DataParallelStep, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "cpu" : "reference"; });

TEST(GradientBuckets, ReverseOrderFirstSmaller) {
  // Gradients of 10, 30, 30, 5, 100 bytes; first bucket <= 40, the rest <= 60; a gradient
  // larger than its bucket is a bucket of its own.
  EXPECT_THAT(nn::GradientBuckets({10, 30, 30, 5, 100}, 40, 60),
              ElementsAre(ElementsAre(4), ElementsAre(3, 2), ElementsAre(1, 0)));
  EXPECT_THAT(nn::GradientBuckets({30, 30, 10, 20}, 20, 60),
              ElementsAre(ElementsAre(3), ElementsAre(2, 1), ElementsAre(0)));
  EXPECT_THAT(nn::GradientBuckets({10, 10}, 100, 100), ElementsAre(ElementsAre(1, 0)));
  EXPECT_TRUE(nn::GradientBuckets({}, 1, 1).empty());
}

TEST(DataParallelStepErrors, NeedsCollectivesOfTheRightSize) {
  nn::MlpClassifier model = Model();
  std::unique_ptr<runtime::Backend> backend = runtime::MakeReferenceBackend();
  nn::TrainStepOptions o = Options();
  o.data_parallel = 2;
  auto s =
      nn::TrainStep::Create(*backend, *model.LossGraph(4), *nn::InitParams(model.Params(), 7), o);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("data_parallel = 2"));
  std::vector<std::unique_ptr<Communicator>> comms = MakeThreadCommunicators(3);
  CommunicatorCollectives c(*comms[0]);
  o.collectives = &c;
  s = nn::TrainStep::Create(*backend, *model.LossGraph(4), *nn::InitParams(model.Params(), 7), o);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("got 3"));
}

// Rank 1 never runs its step: rank 0's all-reduce times out and Run returns DeadlineExceeded
// naming the collective, instead of hanging.
TEST(DataParallelStepErrors, APeerThatNeverJoinsTimesOut) {
  std::vector<std::unique_ptr<Communicator>> comms =
      MakeThreadCommunicators(2, std::chrono::milliseconds(300));
  CommunicatorCollectives c(*comms[0]);
  nn::MlpClassifier model = Model();
  std::unique_ptr<runtime::Backend> backend = runtime::MakeCpuBackend();
  nn::TrainStepOptions o = Options();
  o.data_parallel = 2;
  o.collectives = &c;
  auto step =
      nn::TrainStep::Create(*backend, *model.LossGraph(4), *nn::InitParams(model.Params(), 7), o);
  ASSERT_TRUE(step.ok()) << step.status();
  Tensor x = Inputs(0, 0, 4), y = Labels(0, 0, 4);
  auto start = std::chrono::steady_clock::now();
  auto m = (*step)->Run({&x, &y});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("all_reduce"));
  EXPECT_EQ((*step)->step(), 0);
  EXPECT_GE((*step)->executable().async_collectives_run(), 1);  // it ran asynchronously
}

}  // namespace
}  // namespace kiln::dist

namespace kiln::dist {
namespace {

// The asynchronous path (the cpu backend's default) gives the bits of the synchronous one (the
// collectives in their thunks, as before), on 2 and 4 thread ranks with several buckets, and two
// asynchronous runs give the same bits.
TEST(DataParallelOverlap, AsyncIsBitIdenticalToSync) {
  for (int d : {2, 4}) {
    SCOPED_TRACE(d);
    int buckets = 0;
    int64_t async_run = 0, sync_run = 0;
    std::vector<Result> sync =
        DataParallel(true, d, 96, 100, &buckets, false, Options(), false, &sync_run);
    std::vector<Result> a1 =
        DataParallel(true, d, 96, 100, &buckets, false, Options(), true, &async_run);
    std::vector<Result> a2 = DataParallel(true, d, 96, 100, &buckets, false, Options(), true);
    ASSERT_EQ(sync.size(), d);
    ASSERT_EQ(a1.size(), d);
    ASSERT_EQ(a2.size(), d);
    EXPECT_EQ(buckets, 3);
    EXPECT_EQ(sync_run, 0);                  // no communication thread
    EXPECT_EQ(async_run, kSteps * buckets);  // every bucket on it
    for (int r = 0; r < d; ++r) {
      EXPECT_EQ(a1[r].losses, sync[r].losses);
      EXPECT_EQ(a1[r].norms, sync[r].norms);
      EXPECT_TRUE(SameBits(a1[r].params, sync[r].params)) << "rank " << r;
      EXPECT_TRUE(SameBits(a1[r].params, a2[r].params)) << "rank " << r;
    }
  }
}

// Collectives over 2 "ranks" in one thread: the peer is a mirror (the sum is 2x), so a test
// needs no second thread; it can hold an all-reduce until the step's thread has run a kernel
// (a backward kernel that ran while the all-reduce was in flight), or fail one.
class ProbeCollectives : public runtime::Collectives {
 public:
  int size() const override { return 2; }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    const int call = calls_++;
    if (call == fail_call_) return absl::UnavailableError("injected failure");
    if (call == 0 && hold_first_) {
      // Held until a kernel started after this all-reduce's start thunk has finished on the
      // step's thread. Bounded: on a synchronous path that never happens, and the step fails.
      const auto deadline = std::chrono::steady_clock::now() + hold_limit_;
      while (kernels_after_start_.load() == 0) {
        if (std::chrono::steady_clock::now() > deadline)
          return absl::DeadlineExceededError("no kernel ran while the all-reduce was in flight");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      held_until_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
    }
    EXPECT_EQ(dtype, DType::kF32);
    float* x = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) x[i] = x[i] + x[i];
    return absl::OkStatus();
  }
  // Only the gradient all-reduce is probed; no mesh axis.
  absl::Status ReduceScatterSum(const void*, void*, int64_t, DType) override {
    return absl::UnimplementedError("ProbeCollectives: reduce-scatter");
  }
  absl::Status AllGather(const void*, void*, int64_t, DType) override {
    return absl::UnimplementedError("ProbeCollectives: all-gather");
  }
  int num_shards() const override { return 1; }
  absl::Status ShardAllGather(const void*, void*, int64_t, DType) override {
    return absl::UnimplementedError("ProbeCollectives: shard all-gather");
  }
  absl::Status ShardReduceScatterSum(const void*, void*, int64_t, DType) override {
    return absl::UnimplementedError("ProbeCollectives: shard reduce-scatter");
  }
  absl::Status ShardAllReduce(void*, int64_t, DType, bool) override {
    return absl::UnimplementedError("ProbeCollectives: shard all-reduce");
  }
  bool broken() const override { return false; }
  // The thunk observer: counts kernels that ran after the first start thunk.
  void Observe(const std::string& thunk) {
    if (thunk.find("(start)") != std::string::npos) {
      started_ = true;
      return;
    }
    if (started_ && thunk.find("(wait)") == std::string::npos) ++kernels_after_start_;
  }

  std::atomic<int> calls_{0};
  int fail_call_ = -1;
  bool hold_first_ = false;
  std::chrono::milliseconds hold_limit_{10000};
  bool started_ = false;
  std::atomic<int> kernels_after_start_{0};
  int64_t held_until_ns_ = 0;
};

struct ProbeStep {
  std::unique_ptr<runtime::Backend> backend;
  std::unique_ptr<nn::TrainStep> step;
};

ProbeStep MakeProbeStep(ProbeCollectives& c, bool async) {
  ProbeStep p;
  p.backend = Backend(true, async);
  nn::MlpClassifier model = Model();
  nn::TrainStepOptions o = Options();
  o.data_parallel = 2;
  o.collectives = &c;
  o.first_bucket_bytes = 96;  // 3 buckets: {fc1 bias, fc1 weight}, {fc0 bias}, {fc0 weight}
  o.bucket_bytes = 100;
  auto step =
      nn::TrainStep::Create(*p.backend, *model.LossGraph(4), *nn::InitParams(model.Params(), 7), o);
  EXPECT_TRUE(step.ok()) << step.status();
  if (step.ok()) p.step = *std::move(step);
  return p;
}

// The first bucket's all-reduce is held on the communication thread until the step's thread has
// finished a kernel after starting it: the step completes, so a kernel of the backward pass ran
// while the all-reduce was in flight, and the profile's timestamps show it (the kernel ended
// between the collective's start and its end on the communication thread). The synchronous path,
// held the same way, cannot progress and fails (so the check can fail).
TEST(DataParallelOverlap, AnAllReduceIsInFlightWhileABackwardKernelRuns) {
  ProbeCollectives c;
  c.hold_first_ = true;
  ProbeStep p = MakeProbeStep(c, true);
  ASSERT_NE(p.step, nullptr);
  runtime::Executable& exe = p.step->mutable_executable();
  std::vector<std::pair<int64_t, int64_t>> kernel_times;
  std::vector<std::string> kernel_names;
  exe.set_thunk_observer([&](int i, int64_t start, int64_t end) {
    c.Observe(exe.thunk(i).name());
    kernel_times.push_back({start, end});
    kernel_names.push_back(exe.thunk(i).name());
  });
  std::vector<std::tuple<std::string, int64_t, int64_t>> collectives;
  // In flight: from its start thunk handing it to the communication thread to its end there.
  exe.set_collective_observer([&](const std::string& name, int64_t start, int64_t, int64_t end) {
    collectives.push_back({name, start, end});
  });
  Tensor x = Inputs(0, 0, 4), y = Labels(0, 0, 4);
  auto m = p.step->Run({&x, &y});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(c.kernels_after_start_.load(), 0);
  ASSERT_EQ(collectives.size(), 3u);
  const auto& [name, begin, end] = collectives[0];
  EXPECT_THAT(name, HasSubstr("all_reduce %"));
  int inside = 0;  // kernels (not start/wait thunks) that ended while it was in flight
  for (size_t k = 0; k < kernel_times.size(); ++k)
    if (kernel_names[k].find("all_reduce") == std::string::npos &&
        kernel_times[k].second >= begin && kernel_times[k].second <= end)
      ++inside;
  EXPECT_GE(inside, 1);
  // The waits come after the backward kernels: the first wait thunk follows every start thunk.
  int last_start = -1, first_wait = -1;
  for (int i = 0; i < exe.num_thunks(); ++i) {
    const std::string t = exe.thunk(i).name();
    if (t.find("(start)") != std::string::npos) last_start = i;
    if (t.find("(wait)") != std::string::npos && first_wait < 0) first_wait = i;
  }
  EXPECT_LT(last_start, first_wait);

  ProbeCollectives sync_c;
  sync_c.hold_first_ = true;
  sync_c.hold_limit_ = std::chrono::milliseconds(300);
  ProbeStep sync = MakeProbeStep(sync_c, false);
  ASSERT_NE(sync.step, nullptr);
  runtime::Executable& sync_exe = sync.step->mutable_executable();
  sync_exe.set_thunk_observer(
      [&](int i, int64_t, int64_t) { sync_c.Observe(sync_exe.thunk(i).name()); });
  auto failed = sync.step->Run({&x, &y});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDeadlineExceeded) << failed.status();
}

// A collective that fails on the communication thread (here the second bucket's, while the third
// is queued behind it) fails the step with its error, naming the all_reduce, at once; nothing is
// left in flight, so the next step runs normally.
TEST(DataParallelOverlap, AFailedAsyncAllReduceIsTheStepsError) {
  ProbeCollectives c;
  c.fail_call_ = 1;
  ProbeStep p = MakeProbeStep(c, true);
  ASSERT_NE(p.step, nullptr);
  Tensor x = Inputs(0, 0, 4), y = Labels(0, 0, 4);
  auto start = std::chrono::steady_clock::now();
  auto m = p.step->Run({&x, &y});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("all_reduce %"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("injected failure"));
  EXPECT_EQ(p.step->step(), 0);
  const int after_failure = c.calls_.load();
  EXPECT_EQ(after_failure, 3);  // the third bucket was already queued and ran; nothing after
  auto next = p.step->Run({&x, &y});
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(c.calls_.load(), after_failure + 3 + 1);  // 3 buckets and the loss average
}

}  // namespace
}  // namespace kiln::dist
