// Pre-packed constant weights above the gemv kernel's batch (CpuBackendOptions::prepack_weights):
// a bound weight of a larger matmul runs, at avx512, a oneDNN matmul over the weight reordered
// once into oneDNN's blocked layout, and at avx2 (up to 256 rows) Kiln's blocked sgemm over the
// weight packed once into 16-column panels (internal/sgemm.h); a bound convolution filter is
// reordered once into the primitive's layout. Each test checks the packed path is taken (the
// thunk's name says so) and that it gives the outputs of the unpacked paths (the same executable
// unbound, an executable with prepack_weights off, bound) and of the reference backend; and that
// re-binding or unbinding never leaves a stale pack.
#include <cmath>
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

using testing::Dims;
using testing::Random;

// y = relu(x . W + b): x [M,K]; W [K,N], or [N,K] contracted on its dim 1 when transposed.
std::string MatmulProgram(int64_t M, int64_t K, int64_t N, bool transposed) {
  const std::string out = Dims({M, N});
  std::string s = "graph @g {\n";
  s += "  %0 = parameter() {index=0, name=\"x\"} : " + Dims({M, K}) + "\n";
  s += "  %1 = parameter() {index=1, name=\"w\"} : " + (transposed ? Dims({N, K}) : Dims({K, N})) +
       "\n";
  s += "  %2 = parameter() {index=2, name=\"b\"} : " + Dims({N}) + "\n";
  s += std::string("  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], ") +
       "rhs_batch=[], rhs_contracting=[" + (transposed ? "1" : "0") + "]} : " + out + "\n";
  s += "  %4 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[" + std::to_string(M) + "," +
       std::to_string(N) + "]} : " + out + "\n";
  s += "  %5 = add(%3, %4) : " + out + "\n";
  s += "  %6 = relu(%5) : " + out + "\n";
  s += "  return y=%6\n}\n";
  return s;
}

// y = relu(conv2d(x, f) + b), 3x3, padding 1: x [B,C,H,W], f [O,C,3,3].
std::string ConvProgram(int64_t B, int64_t C, int64_t O, int64_t H) {
  const std::string out = Dims({B, O, H, H});
  std::string s = "graph @g {\n";
  s += "  %0 = parameter() {index=0, name=\"x\"} : " + Dims({B, C, H, H}) + "\n";
  s += "  %1 = parameter() {index=1, name=\"f\"} : " + Dims({O, C, 3, 3}) + "\n";
  s += "  %2 = parameter() {index=2, name=\"b\"} : " + Dims({O}) + "\n";
  s += "  %3 = conv2d(%0, %1) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]} : " +
       out + "\n";
  s += "  %4 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[" + std::to_string(B) + "," +
       std::to_string(O) + "," + std::to_string(H) + "," + std::to_string(H) + "]} : " + out + "\n";
  s += "  %5 = add(%3, %4) : " + out + "\n";
  s += "  %6 = relu(%5) : " + out + "\n";
  s += "  return y=%6\n}\n";
  return s;
}

void ExpectClose(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.TypeString(), want.TypeString()) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.num_elements() && bad < 5; ++i) {
    const double g = got.GetDouble(i), w = want.GetDouble(i);
    if (!(std::fabs(g - w) <= tol + tol * std::fabs(w))) {
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want " << w;
      ++bad;
    }
  }
}

int PrePackedThunks(const Executable& exe) {
  int n = 0;
  for (int i = 0; i < exe.num_thunks(); ++i) {
    const std::string name = exe.thunk(i).name();
    // A weight packed on every run (not constant) is not pre-packed.
    n += name.find("weights pre-packed") != std::string::npos ||
         (name.find("packed sgemm") != std::string::npos &&
          name.find("packed per run") == std::string::npos);
  }
  return n;
}

// Compiles `program` three ways and checks the bound, pre-packed run against the unbound run, a
// bound run with prepack_weights off, and the reference backend. `packs`: whether the kernel at
// this ISA level has a layout of its own to pack the weight into (otherwise it reads the plain
// weight, and binding packs nothing); `kernel`: what the packed kernel's thunk name says. The
// packed kernels may sum in another order than the unpacked ones (Kiln's sgemm against oneDNN's
// gemm:jit), so all comparisons allow 1e-4 relative.
void CheckPrepacked(const std::string& program, std::vector<Tensor> in, const std::string& what,
                    bool packs = true, const std::string& kernel = "weights pre-packed") {
  auto g = ir::ParseGraph(program);
  ASSERT_TRUE(g.ok()) << g.status();
  auto cpu = MakeCpuBackend();
  CpuBackendOptions off;
  off.prepack_weights = false;
  auto cpu_off = MakeCpuBackend(off);
  auto ref = MakeReferenceBackend();
  auto exe = cpu->Compile(*g);
  ASSERT_TRUE(exe.ok()) << what << ": " << exe.status();
  auto plain = cpu_off->Compile(*g);
  ASSERT_TRUE(plain.ok()) << what << ": " << plain.status();
  auto oracle = ref->Compile(*g);
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  auto want = (*oracle)->Run(in);
  ASSERT_TRUE(want.ok()) << want.status();

  auto unbound = (*exe)->Run(in);
  ASSERT_TRUE(unbound.ok()) << what << ": " << unbound.status();
  EXPECT_EQ(PrePackedThunks(**exe), 0) << what << ": nothing is packed before binding";
  ASSERT_TRUE((*plain)->BindConstantParameters({{1, in[1]}, {2, in[2]}}).ok()) << what;
  EXPECT_EQ(PrePackedThunks(**plain), 0) << what << ": prepack_weights is off";
  auto unpacked = (*plain)->Run(in);
  ASSERT_TRUE(unpacked.ok()) << what << ": " << unpacked.status();

  ASSERT_TRUE((*exe)->BindConstantParameters({{1, in[1]}, {2, in[2]}}).ok()) << what;
  EXPECT_EQ(PrePackedThunks(**exe), packs ? 1 : 0)
      << what << ": the bound weight's kernel is pre-packed";
  if (packs) {
    std::string names;
    for (int i = 0; i < (*exe)->num_thunks(); ++i) names += (*exe)->thunk(i).name() + "; ";
    EXPECT_NE(names.find(kernel), std::string::npos) << what << ": " << names;
  }
  for (int rep = 0; rep < 2; ++rep) {  // the pack is reused
    auto got = (*exe)->Run(in);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    ExpectClose((*got)[0], (*unbound)[0], 1e-4, what + " packed vs unbound");
    ExpectClose((*got)[0], (*unpacked)[0], 1e-4, what + " packed vs prepack off");
    ExpectClose((*got)[0], (*want)[0], 1e-4, what + " packed vs reference");
  }

  // Re-binding another weight re-packs from it: the outputs follow the new weight.
  Tensor w2 = Random(in[1].shape(), 4242);
  std::vector<Tensor> in2 = in;
  in2[1] = w2;
  auto want2 = (*oracle)->Run(in2);
  ASSERT_TRUE(want2.ok()) << want2.status();
  ASSERT_TRUE((*exe)->BindConstantParameters({{1, w2}, {2, in[2]}}).ok()) << what;
  EXPECT_EQ(PrePackedThunks(**exe), packs ? 1 : 0) << what;
  auto got2 = (*exe)->Run(in2);
  ASSERT_TRUE(got2.ok()) << what << ": " << got2.status();
  ExpectClose((*got2)[0], (*want2)[0], 1e-4, what + " after re-binding");
  // The old weight is refused while the new one is bound, never served from a stale pack.
  EXPECT_FALSE((*exe)->Run(in).ok()) << what;

  // Unbinding drops the pack; the plain path runs again, with any weight.
  ASSERT_TRUE((*exe)->BindConstantParameters({}).ok()) << what;
  EXPECT_EQ(PrePackedThunks(**exe), 0) << what;
  auto got3 = (*exe)->Run(in);
  ASSERT_TRUE(got3.ok()) << what << ": " << got3.status();
  ExpectClose((*got3)[0], (*want)[0], 1e-4, what + " after unbinding");
}

TEST(Prepack, MatmulAboveTheGemvBatchRunsOnPackedWeights) {
  struct Case {
    int64_t M, K, N;
    bool transposed;
  };
  uint32_t seed = 1;
  for (const Case& c : std::vector<Case>{{9, 64, 48, false},
                                         {64, 256, 128, true},
                                         {256, 256, 512, false},
                                         {33, 100, 130, true},
                                         {9, 1024, 130, true},
                                         {33, 1024, 48, false},
                                         {256, 1024, 1024, false},
                                         {256, 100, 1024, true},
                                         {300, 64, 48, false},
                                         {300, 64, 48, true}}) {
    const std::string what = "M=" + std::to_string(c.M) + " K=" + std::to_string(c.K) +
                             " N=" + std::to_string(c.N) + (c.transposed ? " W^T" : "");
    std::vector<Tensor> in = {Random(Shape{c.M, c.K}, seed++),
                              Random(c.transposed ? Shape{c.N, c.K} : Shape{c.K, c.N}, seed++),
                              Random(Shape{c.N}, seed++)};
    // At avx512 oneDNN's brgemm over its blocked layout. Below, oneDNN 2.6's matmul is its gemm
    // kernel on plain weights: at avx2 and up to 256 rows Kiln's packed sgemm runs instead;
    // otherwise oneDNN does, and only a transposed weight is reordered, once, into the plain
    // layout it reads.
    const bool avx512 = ActiveCpuIsa() >= CpuIsa::kAvx512;
    const bool sgemm = ActiveCpuIsa() == CpuIsa::kAvx2 && c.M <= 256;
    CheckPrepacked(MatmulProgram(c.M, c.K, c.N, c.transposed), in, what,
                   avx512 || sgemm || c.transposed,
                   sgemm ? "packed sgemm+bias+relu" : "weights pre-packed");
  }
}

TEST(Prepack, ConvolutionFilterIsReorderedOnce) {
  struct Case {
    int64_t B, C, O, H;
  };
  uint32_t seed = 100;
  for (const Case& c : std::vector<Case>{
           {2, 16, 16, 8}, {4, 16, 32, 8}, {3, 32, 32, 4}, {2, 1, 16, 8}, {2, 3, 8, 5}}) {
    const std::string what = "conv B=" + std::to_string(c.B) + " C=" + std::to_string(c.C) +
                             " O=" + std::to_string(c.O) + " H=" + std::to_string(c.H);
    std::vector<Tensor> in = {Random(Shape{c.B, c.C, c.H, c.H}, seed++),
                              Random(Shape{c.O, c.C, 3, 3}, seed++), Random(Shape{c.O}, seed++)};
    // At sse41 oneDNN runs a 1-channel convolution as its gemm kernel, on the plain filter.
    CheckPrepacked(ConvProgram(c.B, c.C, c.O, c.H), in, what,
                   ActiveCpuIsa() >= CpuIsa::kAvx2 || c.C > 1);
  }
}

}  // namespace
}  // namespace kiln::runtime
