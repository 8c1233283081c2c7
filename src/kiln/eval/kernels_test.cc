// The evaluator on its own (ir + tensor + base, no backend): one node on tensors, and the
// dtype check a factory makes once.
#include "kiln/eval/kernels.h"

#include <vector>

#include "gtest/gtest.h"
#include "kiln/ir/graph.h"

namespace kiln::eval {
namespace {

TEST(EvaluateNode, AddsTensorsAndRoundsOnceToTheResultType) {
  const ir::Node sum(2, ir::Opcode::kAdd, {0, 1}, {DType::kF32, Shape({3})}, {});
  const Tensor x = Tensor::FromDoubles(DType::kF32, Shape({3}), {1, 2.5, -4});
  const Tensor y = Tensor::FromDoubles(DType::kF32, Shape({3}), {0.5, 0.5, 4});
  absl::StatusOr<Tensor> r = EvaluateNode(sum, {&x, &y});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->GetDouble(0), 1.5);
  EXPECT_EQ(r->GetDouble(1), 3.0);
  EXPECT_EQ(r->GetDouble(2), 0.0);
  // A missing operand is InvalidArgument, not a crash.
  EXPECT_EQ(EvaluateNode(sum, {&x}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeKernel, RefusesAnIntegerTranscendental) {
  const ir::Type s32{DType::kS32, Shape({2})};
  const ir::Node exp(1, ir::Opcode::kExp, {0}, s32, {});
  const std::vector<ir::Type> types = {s32};
  EXPECT_EQ(MakeKernel(exp, types).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::eval
