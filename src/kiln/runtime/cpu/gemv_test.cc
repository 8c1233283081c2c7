// The packed small-batch matmul (internal/gemv.h) against the reference backend: several shapes,
// batch 1, 2, 7 and 256 (256 runs oneDNN: the control), plain and transposed weights, the bias,
// relu and residual epilogue; and staleness: weights that are not bound are never packed, a bound
// weight must be passed as bound, re-binding re-packs, and an in-place-updated weight cannot be
// bound at all.
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/ir/parser.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/test_util.h"
#include "kiln/runtime/reference/reference_backend.h"

namespace kiln::runtime {
namespace {

using testing::Random;

// y = relu?(x . W + b) (+ r): x [M,K]; W [K,N], or [N,K] contracted on its dim 1 when transposed.
std::string Program(int64_t M, int64_t K, int64_t N, bool transposed, bool relu, bool residual) {
  const std::string w = transposed ? "f32[" + std::to_string(N) + "," + std::to_string(K) + "]"
                                   : "f32[" + std::to_string(K) + "," + std::to_string(N) + "]";
  const std::string out = "f32[" + std::to_string(M) + "," + std::to_string(N) + "]";
  std::string s = "graph @g {\n";
  s += "  %0 = parameter() {index=0, name=\"x\"} : f32[" + std::to_string(M) + "," +
       std::to_string(K) + "]\n";
  s += "  %1 = parameter() {index=1, name=\"w\"} : " + w + "\n";
  s += "  %2 = parameter() {index=2, name=\"b\"} : f32[" + std::to_string(N) + "]\n";
  s += "  %3 = parameter() {index=3, name=\"r\"} : " + out + "\n";
  s +=
      std::string("  %4 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], ") +
      "rhs_contracting=[" + (transposed ? "1" : "0") + "]} : " + out + "\n";
  s += "  %5 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[" + std::to_string(M) + "," +
       std::to_string(N) + "]} : " + out + "\n";
  s += "  %6 = add(%4, %5) : " + out + "\n";
  int last = 6;
  if (relu) s += "  %7 = relu(%6) : " + out + "\n", last = 7;
  if (residual) {
    s += "  %" + std::to_string(last + 1) + " = add(%" + std::to_string(last) + ", %3) : " + out +
         "\n";
    ++last;
  }
  s += "  return y=%" + std::to_string(last) + "\n}\n";
  return s;
}

void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.TypeString(), want.TypeString()) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.num_elements() && bad < 5; ++i) {
    const double g = got.GetDouble(i), w = want.GetDouble(i);
    if (!(std::fabs(g - w) <= 1e-4 + 1e-4 * std::fabs(w))) {
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want " << w;
      ++bad;
    }
  }
}

bool RunsPacked(const Executable& exe) {
  for (int i = 0; i < exe.num_thunks(); ++i)
    if (exe.thunk(i).name().find("packed gemv") != std::string::npos) return true;
  return false;
}

struct Case {
  int64_t M, K, N;
  bool transposed, relu, residual;
};

TEST(Gemv, MatchesReferenceAcrossShapesAndBatches) {
  std::vector<Case> cases;
  for (int64_t M : {1, 2, 7, 256}) {
    cases.push_back({M, 1, 1, false, false, false});
    cases.push_back({M, 7, 5, false, true, false});
    cases.push_back({M, 33, 17, true, false, false});
    cases.push_back({M, 64, 64, false, true, true});
    cases.push_back({M, 100, 130, true, true, false});
    cases.push_back({M, 1024, 10, false, false, false});
    cases.push_back({M, 300, 1000, false, true, false});
  }
  auto cpu = MakeCpuBackend();
  auto ref = MakeReferenceBackend();
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const std::string what = "M=" + std::to_string(c.M) + " K=" + std::to_string(c.K) +
                             " N=" + std::to_string(c.N) + (c.transposed ? " W^T" : "") +
                             (c.relu ? " relu" : "") + (c.residual ? " +residual" : "");
    auto g = ir::ParseGraph(Program(c.M, c.K, c.N, c.transposed, c.relu, c.residual));
    ASSERT_TRUE(g.ok()) << g.status();
    auto exe = cpu->Compile(*g);
    ASSERT_TRUE(exe.ok()) << what << ": " << exe.status();
    auto oracle = ref->Compile(*g);
    ASSERT_TRUE(oracle.ok()) << oracle.status();
    std::vector<Tensor> in = {Random(Shape{c.M, c.K}, seed++),
                              Random(c.transposed ? Shape{c.N, c.K} : Shape{c.K, c.N}, seed++),
                              Random(Shape{c.N}, seed++), Random(Shape{c.M, c.N}, seed++)};
    ASSERT_TRUE((*exe)->BindConstantParameters({{1, in[1]}, {2, in[2]}}).ok()) << what;
    EXPECT_EQ(RunsPacked(**exe), c.M <= 8) << what;
    auto want = (*oracle)->Run(in);
    ASSERT_TRUE(want.ok()) << want.status();
    for (int rep = 0; rep < 2; ++rep) {  // the pack is reused
      auto got = (*exe)->Run(in);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      ExpectClose((*got)[0], (*want)[0], what);
    }
  }
}

TEST(Gemv, UnboundWeightsAreNeverPackedAndChangesShow) {
  auto g = ir::ParseGraph(Program(1, 64, 48, false, true, false));
  ASSERT_TRUE(g.ok());
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto oracle = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(oracle.ok());
  EXPECT_FALSE(RunsPacked(**exe));
  std::vector<Tensor> in = {Random(Shape{1, 64}, 1), Random(Shape{64, 48}, 2), Random(Shape{48}, 3),
                            Random(Shape{1, 48}, 4)};
  for (int step = 0; step < 3; ++step) {
    // A training step's update: the same buffer, new values.
    for (int64_t i = 0; i < in[1].num_elements(); ++i) in[1].data<float>()[i] *= -1.5f;
    auto got = (*exe)->Run(in);
    auto want = (*oracle)->Run(in);
    ASSERT_TRUE(got.ok() && want.ok());
    ExpectClose((*got)[0], (*want)[0], "step " + std::to_string(step));
  }
  EXPECT_FALSE(RunsPacked(**exe));
}

TEST(Gemv, BoundWeightsAreCheckedAndRebindingRepacks) {
  auto g = ir::ParseGraph(Program(2, 64, 48, false, false, false));
  ASSERT_TRUE(g.ok());
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto oracle = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(oracle.ok());
  std::vector<Tensor> in = {Random(Shape{2, 64}, 1), Random(Shape{64, 48}, 2), Random(Shape{48}, 3),
                            Random(Shape{2, 48}, 4)};
  ASSERT_TRUE((*exe)->BindConstantParameters({{1, in[1]}}).ok());
  EXPECT_TRUE(RunsPacked(**exe));
  EXPECT_EQ((*exe)->num_bound_parameters(), 1);
  auto check = [&](const std::vector<Tensor>& args, const std::string& what) {
    auto got = (*exe)->Run(args);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    auto want = (*oracle)->Run(args);
    ASSERT_TRUE(want.ok());
    ExpectClose((*got)[0], (*want)[0], what);
  };
  check(in, "bound");

  // Another tensor for the bound weight, even with equal values, is refused: the pack could be
  // stale for it.
  std::vector<Tensor> other = in;
  other[1] = in[1].Clone();
  auto refused = (*exe)->Run(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("'w'"), std::string::npos)
      << refused.status();

  // Changed in place, then bound again: re-packed, the new values show.
  for (int64_t i = 0; i < in[1].num_elements(); ++i) in[1].data<float>()[i] += 0.25f;
  ASSERT_TRUE((*exe)->BindConstantParameters({{1, in[1]}}).ok());
  check(in, "re-bound after an in-place change");

  // A new tensor bound: packed from it.
  other[1] = Random(Shape{64, 48}, 9);
  ASSERT_TRUE((*exe)->BindConstantParameters({{1, other[1]}}).ok());
  check(other, "bound to a new tensor");

  // Unbound: nothing packed, any tensor accepted, its current values used.
  ASSERT_TRUE((*exe)->BindConstantParameters({}).ok());
  EXPECT_FALSE(RunsPacked(**exe));
  check(in, "unbound");
}

TEST(Gemv, BindingIsValidated) {
  // w' = w - 0.5 * x^T . y  updated in place of w: a training step's weight cannot be constant.
  auto g = ir::ParseGraph(R"(graph @step {
  %0 = parameter() {index=0, name="x"} : f32[1,4]
  %1 = parameter() {index=1, name="w"} : f32[4,3]
  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[1,3]
  %3 = dot_general(%0, %2) {lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[0]} : f32[4,3]
  %4 = sub(%1, %3) : f32[4,3]
  return y=%2, w_new=%4 in_place_of %1
}
)");
  ASSERT_TRUE(g.ok()) << g.status();
  auto exe = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(exe.ok()) << exe.status();
  absl::Status s = (*exe)->BindConstantParameters({{1, Random(Shape{4, 3}, 1)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("in place"), std::string::npos) << s;
  s = (*exe)->BindConstantParameters({{1, Random(Shape{3, 4}, 1)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = (*exe)->BindConstantParameters({{7, Random(Shape{4, 3}, 1)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ((*exe)->num_bound_parameters(), 0);
}

}  // namespace
}  // namespace kiln::runtime
