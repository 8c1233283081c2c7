// FixedBatchRunner: full batches, a ragged tail, fewer rows than the batch, none, and a wrong row
// width, on y = x + w at batch 3 (reference backend), so every output row shows its input row and
// a padded row shows w alone.
#include "kiln/serve/fixed_batch_runner.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/ir/builder.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::serve {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBatch = 3;

class FixedBatchRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ir::Builder b("add_w");
    ir::Value w = b.Parameter("w", DType::kF32, {2});
    ir::Value x = b.Parameter("x", DType::kF32, {kBatch, 2});
    b.Output("y", x + w);
    absl::StatusOr<ir::Graph> g = b.Build();
    ASSERT_TRUE(g.ok()) << g.status();
    program_ = *g;
    backend_ = runtime::MakeReferenceBackend();
    absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend_->Compile(program_);
    ASSERT_TRUE(exe.ok()) << exe.status();
    exe_ = *std::move(exe);
    weights_ = {{"w", Tensor::FromVector<float>({2}, {100.f, 200.f})}};
  }

  FixedBatchRunner Runner() {
    absl::StatusOr<FixedBatchRunner> r = FixedBatchRunner::ForProgram(*exe_, program_, weights_);
    EXPECT_TRUE(r.ok()) << r.status();
    return *std::move(r);
  }

  // n rows: row r is (r, -r).
  static Tensor Rows(int64_t n) {
    std::vector<float> v;
    for (int64_t r = 0; r < n; ++r) {
      v.push_back(static_cast<float>(r));
      v.push_back(static_cast<float>(-r));
    }
    return Tensor::FromVector<float>({n, 2}, v);
  }

  // RunAll's y for n rows, flattened, and the batches RunRows reported.
  std::vector<float> RunN(int64_t n, std::vector<std::pair<int64_t, int64_t>>* batches) {
    FixedBatchRunner r = Runner();
    const Tensor x = Rows(n);
    EXPECT_TRUE(
        r.RunRows({{"x", x}}, n, [&](const std::vector<Tensor>& outs, int64_t begin, int64_t rows) {
           EXPECT_EQ(outs[0].shape(), (Shape{kBatch, 2}));
           batches->emplace_back(begin, rows);
           return absl::OkStatus();
         }).ok());
    absl::StatusOr<std::vector<Tensor>> all = r.RunAll({{"x", x}}, n);
    EXPECT_TRUE(all.ok()) << all.status();
    if (!all.ok() || all->empty()) return {};
    EXPECT_EQ((*all)[0].shape(), (Shape{n, 2}));
    const float* y = (*all)[0].data<float>();
    return std::vector<float>(y, y + 2 * n);
  }

  static std::vector<float> Expected(int64_t n) {
    std::vector<float> v;
    for (int64_t r = 0; r < n; ++r) {
      v.push_back(100.f + r);
      v.push_back(200.f - r);
    }
    return v;
  }

  ir::Graph program_;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<runtime::Executable> exe_;
  std::map<std::string, Tensor> weights_;
};

TEST_F(FixedBatchRunnerTest, FullBatches) {
  std::vector<std::pair<int64_t, int64_t>> batches;
  EXPECT_EQ(RunN(6, &batches), Expected(6));
  EXPECT_EQ(batches, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 3}}));
}

TEST_F(FixedBatchRunnerTest, RaggedTailIsPaddedAndTrimmed) {
  std::vector<std::pair<int64_t, int64_t>> batches;
  EXPECT_EQ(RunN(7, &batches), Expected(7));
  EXPECT_EQ(batches, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 3}, {6, 1}}));
}

TEST_F(FixedBatchRunnerTest, FewerRowsThanTheBatch) {
  std::vector<std::pair<int64_t, int64_t>> batches;
  EXPECT_EQ(RunN(2, &batches), Expected(2));
  EXPECT_EQ(batches, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}}));
}

TEST_F(FixedBatchRunnerTest, NoRowsRunNothing) {
  std::vector<std::pair<int64_t, int64_t>> batches;
  EXPECT_TRUE(RunN(0, &batches).empty());
  EXPECT_TRUE(batches.empty());
}

TEST_F(FixedBatchRunnerTest, AWrongRowWidthIsAnError) {
  FixedBatchRunner r = Runner();
  const Tensor x = Tensor::FromVector<float>({2, 3}, std::vector<float>(6, 1.f));
  absl::Status s = r.RunRows(
      {{"x", x}}, 2, [](const std::vector<Tensor>&, int64_t, int64_t) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("runtime input x"));
  EXPECT_EQ(r.RunAll({{"z", x}}, 2).status().code(), absl::StatusCode::kInvalidArgument);
  float row[3] = {1, 2, 3};
  EXPECT_EQ(r.Stage(0, 0, 1, row, sizeof(row)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Stage(0, 2, 2, row, 2 * 2 * sizeof(float)).code(),
            absl::StatusCode::kInvalidArgument);  // past the batch
}

TEST_F(FixedBatchRunnerTest, StagedRowsRunWithTheRestZeroedInTheSameBuffers) {
  FixedBatchRunner r = Runner();
  EXPECT_EQ(r.batch(), kBatch);
  ASSERT_EQ(r.num_inputs(), 1u);
  EXPECT_EQ(r.row_bytes(0), 2 * static_cast<int64_t>(sizeof(float)));
  const void* buffer = r.input_buffer(0).raw_data();
  const Tensor x = Rows(3);
  ASSERT_TRUE(r.Stage(0, 0, 3, x.raw_data(), x.byte_size()).ok());
  ASSERT_TRUE(r.Run(3).ok());
  // Two rows staged over the last run's three: the third is padding again.
  const float two[4] = {7, 8, 9, 10};
  ASSERT_TRUE(r.Stage(0, 0, 2, two, sizeof(two)).ok());
  absl::StatusOr<std::vector<Tensor>> outs = r.Run(2);
  ASSERT_TRUE(outs.ok()) << outs.status();
  const float* y = (*outs)[0].data<float>();
  EXPECT_EQ(std::vector<float>(y, y + 6), (std::vector<float>{107, 208, 109, 210, 100, 200}));
  EXPECT_EQ(r.input_buffer(0).raw_data(), buffer);  // no new buffer per run
  const Tensor part = FixedBatchRunner::Rows((*outs)[0], kBatch, 1, 1);
  EXPECT_EQ(part.shape(), (Shape{1, 2}));
  EXPECT_EQ(part.data<float>()[0], 109);
  EXPECT_EQ(r.Run(4).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::serve
