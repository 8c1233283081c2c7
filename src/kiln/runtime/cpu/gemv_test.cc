// The packed-weight matmuls against the reference backend: the small-batch gemv (internal/gemv.h)
// at batch 1, 2 and 7, and from 9 to 256 rows (9, 33, 256) the blocked sgemm (internal/sgemm.h)
// at AVX2 (elsewhere those, and 257 rows everywhere, run oneDNN: the control), several
// shapes, plain and transposed weights, the bias, relu and residual epilogue; the sgemm kernel
// itself (a residual updated in place, results independent of the thread count); and staleness:
// weights that are not bound are never packed, a bound weight must be passed as bound, re-binding
// re-packs, and an in-place-updated weight cannot be bound at all.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/base/cpu_isa.h"
#include "kiln/ir/parser.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/internal/sgemm.h"
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

// "gemv" or "sgemm" when a thunk runs that packed kernel, else "".
// The packed kernel over a bound (pre-packed) weight, or "".
std::string PackedKernel(const Executable& exe) {
  for (int i = 0; i < exe.num_thunks(); ++i) {
    const std::string name = exe.thunk(i).name();
    if (name.find("packed per run") != std::string::npos) continue;
    if (name.find("packed gemv") != std::string::npos) return "gemv";
    if (name.find("packed sgemm") != std::string::npos) return "sgemm";
  }
  return "";
}
bool RunsPacked(const Executable& exe) { return !PackedKernel(exe).empty(); }
bool PacksPerRun(const Executable& exe) {
  for (int i = 0; i < exe.num_thunks(); ++i)
    if (exe.thunk(i).name().find(", weight packed per run)") != std::string::npos) return true;
  return false;
}

// The kernel a bound f32 weight of an M-row matmul runs at this process's ISA level: the gemv up
// to 8 rows; from 9 to 256 rows the blocked sgemm at avx2 (where oneDNN's matmul is its gemm:jit
// kernel, which re-packs the plain weight every call); otherwise oneDNN (over its own packed
// layout at avx512; at sse41 the sgemm's baseline variant does not clearly beat gemm:jit).
std::string ExpectedKernel(int64_t M) {
  if (M <= 8) return "gemv";
  return ActiveCpuIsa() == CpuIsa::kAvx2 && M <= 256 ? "sgemm" : "";
}

struct Case {
  int64_t M, K, N;
  bool transposed, relu, residual;
};

TEST(Gemv, MatchesReferenceAcrossShapesAndBatches) {
  std::vector<Case> cases;
  for (int64_t M : {1, 2, 7, 9, 33, 256}) {
    cases.push_back({M, 1, 1, false, false, false});
    cases.push_back({M, 7, 5, false, true, false});
    cases.push_back({M, 33, 17, true, false, false});
    cases.push_back({M, 64, 64, false, true, true});
    cases.push_back({M, 100, 130, true, true, false});
    cases.push_back({M, 1024, 10, false, false, false});
    cases.push_back({M, 300, 1000, false, true, false});
    // Several K blocks (of 256) with the relu and residual after the last.
    cases.push_back({M, 1024, 48, false, true, true});
    cases.push_back({M, 1024, 130, true, false, true});
  }
  cases.push_back({256, 1024, 1024, false, true, false});
  cases.push_back({33, 1024, 1024, true, true, true});
  cases.push_back({257, 100, 130, false, true, true});  // above the sgemm's rows: oneDNN
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
    EXPECT_EQ(PackedKernel(**exe), ExpectedKernel(c.M)) << what;
    auto want = (*oracle)->Run(in);
    ASSERT_TRUE(want.ok()) << want.status();
    for (int rep = 0; rep < 2; ++rep) {  // the pack is reused
      auto got = (*exe)->Run(in);
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      ExpectClose((*got)[0], (*want)[0], what);
    }
  }
}

// Packs W[K,N] (row-major) as GemvThunk does: [panels][K][16], the last panel zero-padded.
std::vector<float> PackPanels(const std::vector<float>& w, int64_t K, int64_t N) {
  const int64_t panels = (N + 15) / 16;
  std::vector<float> pack(panels * K * 16, 0.f);
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < 16 && p * 16 + j < N; ++j)
        pack[(p * K + k) * 16 + j] = w[k * N + p * 16 + j];
  return pack;
}

// The kernel directly, at every level (the baseline variant too, which matmul.cc leaves to
// oneDNN): a residual that is the output buffer itself (as buffer assignment may
// arrange), with and without the relu between, across several K blocks; and the same bits on one
// thread as on two, and from a transposed x.
TEST(Sgemm, ResidualInPlaceThreadCountAndLayoutIndependent) {
  struct KernelCase {
    int64_t M, K, N;
    bool relu;
  };
  for (const KernelCase& c : std::vector<KernelCase>{
           {9, 700, 48, true},
           {33, 1024, 130, false},
           {256, 513, 100, true},
           {40, 5, 20, false},
           {600, 300, 40, true}}) {  // 600 rows: several row blocks at any L2 size
    const std::string what = "M=" + std::to_string(c.M) + " K=" + std::to_string(c.K) +
                             " N=" + std::to_string(c.N) + (c.relu ? " relu" : "");
    std::mt19937 rng(static_cast<uint32_t>(c.M * 7 + c.K));
    std::uniform_real_distribution<float> dist(-1, 1);
    std::vector<float> x(c.M * c.K), w(c.K * c.N), b(c.N), r(c.M * c.N);
    for (auto* v : {&x, &w, &b, &r})
      for (float& f : *v) f = dist(rng);
    const std::vector<float> pack = PackPanels(w, c.K, c.N);
    std::vector<float> want(c.M * c.N);
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double acc = b[n];
        for (int64_t k = 0; k < c.K; ++k) acc += double{x[m * c.K + k]} * w[k * c.N + n];
        if (c.relu) acc = std::max(acc, 0.0);
        want[m * c.N + n] = static_cast<float>(acc + r[m * c.N + n]);
      }
    runtime::cpu::PackedMatmulArgs a;
    a.x = x.data();
    a.xs_m = c.K;
    a.pack = pack.data();
    a.bias = b.data();
    a.M = c.M;
    a.K = c.K;
    a.N = c.N;
    a.relu = c.relu;
    std::vector<float> separate(c.M * c.N), in_place = r, one_thread(c.M * c.N);
    a.residual = r.data();
    a.out = separate.data();
    runtime::cpu::PackedSgemm(a);
    a.residual = a.out = in_place.data();
    runtime::cpu::PackedSgemm(a);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    a.residual = r.data();
    a.out = one_thread.data();
    runtime::cpu::PackedSgemm(a);
    omp_set_num_threads(threads);
    // x stored transposed ([K, M], read with strides): the same sums in the same order.
    std::vector<float> xt(c.K * c.M), transposed(c.M * c.N);
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t k = 0; k < c.K; ++k) xt[k * c.M + m] = x[m * c.K + k];
    a.x = xt.data();
    a.xs_m = 1;
    a.xs_k = c.M;
    a.out = transposed.data();
    runtime::cpu::PackedSgemm(a);
    int bad = 0;
    for (int64_t i = 0; i < c.M * c.N && bad < 5; ++i) {
      for (float got : {separate[i], in_place[i]}) {
        if (!(std::fabs(got - want[i]) <= 1e-4 + 1e-4 * std::fabs(want[i]))) {
          ADD_FAILURE() << what << " element " << i << ": got " << got << ", want " << want[i];
          ++bad;
        }
      }
    }
    EXPECT_EQ(std::memcmp(separate.data(), one_thread.data(), separate.size() * sizeof(float)), 0)
        << what << ": one thread and " << threads << " differ";
    EXPECT_EQ(std::memcmp(separate.data(), transposed.data(), separate.size() * sizeof(float)), 0)
        << what << ": a transposed x gives other bits";
  }
}

// An unbound weight is never pre-packed; above the gemv's rows at avx2 (K <= 1024, N >= 64) the
// sgemm packs it on every run instead (matmul.cc), so a training step's update shows either way.
TEST(Gemv, UnboundWeightsAreNeverPackedAndChangesShow) {
  for (int64_t M : {1, 33}) {     // the gemv's rows, and the sgemm's
    for (int64_t N : {48, 80}) {  // too narrow to pack per run, and wide enough
      const std::string at = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " ";
      auto g = ir::ParseGraph(Program(M, 64, N, false, true, false));
      ASSERT_TRUE(g.ok());
      auto exe = MakeCpuBackend()->Compile(*g);
      ASSERT_TRUE(exe.ok()) << exe.status();
      auto oracle = MakeReferenceBackend()->Compile(*g);
      ASSERT_TRUE(oracle.ok());
      EXPECT_FALSE(RunsPacked(**exe)) << at;
      EXPECT_EQ(PacksPerRun(**exe), ExpectedKernel(M) == "sgemm" && N >= 64) << at;
      std::vector<Tensor> in = {Random(Shape{M, 64}, 1), Random(Shape{64, N}, 2),
                                Random(Shape{N}, 3), Random(Shape{M, N}, 4)};
      for (int step = 0; step < 3; ++step) {
        // A training step's update: the same buffer, new values.
        for (int64_t i = 0; i < in[1].num_elements(); ++i) in[1].data<float>()[i] *= -1.5f;
        auto got = (*exe)->Run(in);
        auto want = (*oracle)->Run(in);
        ASSERT_TRUE(got.ok() && want.ok());
        ExpectClose((*got)[0], (*want)[0], at + "step " + std::to_string(step));
      }
      EXPECT_FALSE(RunsPacked(**exe)) << at;
    }
  }
}

TEST(Gemv, BoundWeightsAreCheckedAndRebindingRepacks) {
  for (int64_t M : {2, 40}) {  // the gemv's rows, and the sgemm's
    const std::string at = "M=" + std::to_string(M) + " ";
    auto g = ir::ParseGraph(Program(M, 64, 48, false, false, false));
    ASSERT_TRUE(g.ok());
    auto exe = MakeCpuBackend()->Compile(*g);
    ASSERT_TRUE(exe.ok()) << exe.status();
    auto oracle = MakeReferenceBackend()->Compile(*g);
    ASSERT_TRUE(oracle.ok());
    std::vector<Tensor> in = {Random(Shape{M, 64}, 1), Random(Shape{64, 48}, 2),
                              Random(Shape{48}, 3), Random(Shape{M, 48}, 4)};
    ASSERT_TRUE((*exe)->BindConstantParameters({{1, in[1]}}).ok());
    EXPECT_EQ(PackedKernel(**exe), ExpectedKernel(M)) << at;
    EXPECT_EQ((*exe)->num_bound_parameters(), 1);
    auto check = [&](const std::vector<Tensor>& args, const std::string& what) {
      auto got = (*exe)->Run(args);
      ASSERT_TRUE(got.ok()) << at << what << ": " << got.status();
      auto want = (*oracle)->Run(args);
      ASSERT_TRUE(want.ok());
      ExpectClose((*got)[0], (*want)[0], at + what);
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
