// Blocked activation layouts (CpuBackendOptions::blocked_layouts, layout.cc): a small ResNet's
// convolutions, residual adds, pooling and global sum keep nChw16c between them, so the thunks run
// no reorders; the results are bit for bit those of the row-major executable (the same oneDNN
// kernels, which reordered to nChw16c themselves) and match the reference backend. Values read
// by kernels that need row-major (graph outputs, a reshape, a transpose) stay row-major.
#include <cmath>
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

// Emits graph text with numbered values.
class Program {
 public:
  explicit Program(int64_t batch) : b_(batch) {}
  int Param(const std::vector<int64_t>& dims) {
    int id = Emit("parameter() {index=" + std::to_string(params_) + ", name=\"p" +
                      std::to_string(params_) + "\"}",
                  dims);
    param_dims_.push_back(dims);
    ++params_;
    return id;
  }
  // conv2d 3x3 padding 1 + bias (+ relu).
  int Conv(int x, int64_t in_c, int64_t out_c, int64_t hw, bool relu) {
    int f = Param({out_c, in_c, 3, 3}), bias = Param({out_c});
    std::vector<int64_t> out = {b_, out_c, hw, hw};
    int c = Emit("conv2d(" + V(x) + ", " + V(f) +
                     ") {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}",
                 out);
    int bb = Emit("broadcast_in_dim(" + V(bias) + ") {broadcast_dimensions=[1], shape=[" +
                      std::to_string(b_) + "," + std::to_string(out_c) + "," + std::to_string(hw) +
                      "," + std::to_string(hw) + "]}",
                  out);
    int a = Emit("add(" + V(c) + ", " + V(bb) + ")", out);
    return relu ? Emit("relu(" + V(a) + ")", out) : a;
  }
  int Op(const std::string& text, const std::vector<int64_t>& dims) { return Emit(text, dims); }
  // relu(x + skip).
  int ResidualRelu(int x, int skip, const std::vector<int64_t>& dims) {
    return Emit("relu(" + V(Emit("add(" + V(x) + ", " + V(skip) + ")", dims)) + ")", dims);
  }
  void Return(const std::vector<std::pair<std::string, int>>& outs) {
    text_ += "  return ";
    for (size_t i = 0; i < outs.size(); ++i)
      text_ += (i ? ", " : "") + outs[i].first + "=" + V(outs[i].second);
    text_ += "\n}\n";
  }
  std::string text() const { return "graph @g {\n" + text_; }
  const std::vector<std::vector<int64_t>>& param_dims() const { return param_dims_; }
  static std::string V(int id) { return "%" + std::to_string(id); }

 private:
  int Emit(const std::string& op, const std::vector<int64_t>& dims) {
    text_ += "  " + V(next_) + " = " + op + " : " + Dims(dims) + "\n";
    return next_++;
  }
  int64_t b_;
  int next_ = 0, params_ = 0;
  std::vector<std::vector<int64_t>> param_dims_;
  std::string text_;
};

// The digits CNN's shape (examples/cnn_digits.yaml): stem 1 -> 16, a residual block of 16, a
// 16 -> 32 convolution, 2x2 max pool, a residual block of 32, sum over H and W. With `leak`, an
// intermediate is also a graph output and a reshape and a transpose read others.
std::string ResNetProgram(int64_t B, bool leak, std::vector<std::vector<int64_t>>* params) {
  Program p(B);
  int x = p.Param({B, 1, 8, 8});
  int stem = p.Conv(x, 1, 16, 8, true);
  int c1 = p.Conv(stem, 16, 16, 8, true);
  int c2 = p.Conv(c1, 16, 16, 8, false);
  int r1 = p.ResidualRelu(c2, stem, {B, 16, 8, 8});
  int wide = p.Conv(r1, 16, 32, 8, true);
  int pool =
      p.Op("max_pool2d(" + Program::V(wide) + ") {padding=[0,0,0,0], strides=[2,2], window=[2,2]}",
           {B, 32, 4, 4});
  int c3 = p.Conv(pool, 32, 32, 4, true);
  int c4 = p.Conv(c3, 32, 32, 4, false);
  int r2 = p.ResidualRelu(c4, pool, {B, 32, 4, 4});
  int sum = p.Op("reduce_sum(" + Program::V(r2) + ") {dimensions=[2,3]}", {B, 32});
  if (leak) {
    int flat =
        p.Op("reshape(" + Program::V(c1) + ") {shape=[" + std::to_string(B) + ",1024]}", {B, 1024});
    int t = p.Op("transpose(" + Program::V(c3) + ") {permutation=[0,2,3,1]}", {B, 4, 4, 32});
    p.Return({{"y", sum}, {"r1", r1}, {"flat", flat}, {"t", t}});
  } else {
    p.Return({{"y", sum}});
  }
  *params = p.param_dims();
  return p.text();
}

int Reorders(const Executable& exe, std::string* names) {
  int total = 0;
  for (int i = 0; i < exe.num_thunks(); ++i) {
    const std::string name = exe.thunk(i).name();
    *names += name + "\n";
    size_t at = name.find(" reorder");
    if (at == std::string::npos) continue;
    size_t start = name.rfind(", ", at);
    total += std::stoi(name.substr(start + 2, at - start - 2));
  }
  return total;
}

void CheckResNet(int64_t B, bool leak, int max_blocked_reorders) {
  const std::string what = "B=" + std::to_string(B) + (leak ? " with row-major readers" : "");
  std::vector<std::vector<int64_t>> params;
  auto g = ir::ParseGraph(ResNetProgram(B, leak, &params));
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<Tensor> in;
  for (size_t i = 0; i < params.size(); ++i) in.push_back(Random(Shape(params[i]), 7 + i));
  CpuBackendOptions plain_options;
  plain_options.blocked_layouts = false;
  auto blocked = MakeCpuBackend()->Compile(*g);
  ASSERT_TRUE(blocked.ok()) << what << ": " << blocked.status();
  auto plain = MakeCpuBackend(plain_options)->Compile(*g);
  ASSERT_TRUE(plain.ok()) << what << ": " << plain.status();
  auto oracle = MakeReferenceBackend()->Compile(*g);
  ASSERT_TRUE(oracle.ok()) << oracle.status();

  std::string names_blocked, names_plain;
  const int reorders_blocked = Reorders(**blocked, &names_blocked);
  const int reorders_plain = Reorders(**plain, &names_plain);
  EXPECT_LE(reorders_blocked, max_blocked_reorders) << what << ":\n" << names_blocked;
  EXPECT_GT(reorders_plain, reorders_blocked)
      << what << ": the row-major executable reorders around each "
      << "convolution:\n"
      << names_plain;

  auto want = (*oracle)->Run(in);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = (*blocked)->Run(in);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status();
  auto base = (*plain)->Run(in);
  ASSERT_TRUE(base.ok()) << what << ": " << base.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < got->size(); ++o) {
    const Tensor &x = (*got)[o], &y = (*base)[o], &w = (*want)[o];
    ASSERT_EQ(x.TypeString(), w.TypeString()) << what << " output " << o;
    // f32 against the reference's accumulation: relative to the output's scale (uniform
    // weights grow the activations layer by layer).
    double scale = 0;
    for (int64_t i = 0; i < w.num_elements(); ++i)
      scale = std::max(scale, std::fabs(w.GetDouble(i)));
    int bad = 0;
    for (int64_t i = 0; i < x.num_elements() && bad < 5; ++i) {
      const float a = x.data<float>()[i], b = y.data<float>()[i];
      const double r = w.GetDouble(i);
      if (std::memcmp(&a, &b, 4) != 0) {
        ADD_FAILURE() << what << " output " << o << " element " << i << ": blocked " << a
                      << ", row-major " << b;
        ++bad;
      }
      if (!(std::fabs(a - r) <= 1e-5 * (1 + scale))) {
        ADD_FAILURE() << what << " output " << o << " element " << i << ": got " << a
                      << ", reference " << r;
        ++bad;
      }
    }
  }
}

TEST(BlockedLayouts, ResNetRunsWithoutReordersAndMatchesRowMajor) {
  // No reorder at all: the first convolution reads the row-major input and writes the blocked
  // layout (nChw16c at avx512, nChw8c at avx2: ChannelBlock), and the sum over H and W reads it,
  // on its own (batch 256: reduce.cc's kernel) or as the last residual loop's sink (fused_loop.cc's
  // blocked view). At sse41 oneDNN runs a 1-channel first layer only as its gemm convolution,
  // which writes row-major: the two convolutions reading the stem reorder it (one each).
  const int max_reorders = ActiveCpuIsa() >= CpuIsa::kAvx2 ? 0 : 2;
  for (int64_t batch : {256, 64, 3, 1}) CheckResNet(batch, /*leak=*/false, max_reorders);
}

TEST(BlockedLayouts, ValuesWithRowMajorReadersStayRowMajor) {
  // r1 is a graph output (so the residual loop writing it and the values it reads are
  // row-major), c1 is reshaped and c3 transposed: the convolutions around them reorder (8 in
  // all, 11 without blocked layouts); the pool, the last convolution and the last residual loop
  // stay blocked.
  for (int64_t batch : {64, 2}) CheckResNet(batch, /*leak=*/true, 8);
}

TEST(BlockedLayouts, OffWithPreferLoopsAndForOtherShapes) {
  // 24 channels (not a multiple of 16: row-major at avx512, nChw8c below) and a 3x3 average pool
  // with padding: correct either way.
  const std::string text = R"(graph @g {
  %0 = parameter() {index=0, name="x"} : f32[2,16,6,6]
  %1 = parameter() {index=1, name="f"} : f32[24,16,3,3]
  %2 = conv2d(%0, %1) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]} : f32[2,24,6,6]
  %3 = relu(%2) : f32[2,24,6,6]
  %4 = avg_pool2d(%3) {count_include_pad=0, padding=[1,1,1,1], strides=[1,1], window=[3,3]} : f32[2,24,6,6]
  %5 = reduce_sum(%4) {dimensions=[2,3]} : f32[2,24]
  return y=%5
}
)";
  auto g = ir::ParseGraph(text);
  ASSERT_TRUE(g.ok()) << g.status();
  std::vector<Tensor> in = {Random(Shape{2, 16, 6, 6}, 1), Random(Shape{24, 16, 3, 3}, 2)};
  auto want = (*MakeReferenceBackend()->Compile(*g))->Run(in);
  ASSERT_TRUE(want.ok()) << want.status();
  CpuBackendOptions loops;
  loops.prefer_loops = true;
  for (const CpuBackendOptions& o : {CpuBackendOptions{}, loops}) {
    auto exe = MakeCpuBackend(o)->Compile(*g);
    ASSERT_TRUE(exe.ok()) << exe.status();
    auto got = (*exe)->Run(in);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int64_t i = 0; i < (*got)[0].num_elements(); ++i)
      EXPECT_NEAR((*got)[0].data<float>()[i], (*want)[0].GetDouble(i), 1e-4) << i;
  }
}

// The residual epilogue (conv2d + bias + residual + relu as one convolution) at widths that are
// not multiples of 16 and on a first layer, against the reference backend.
TEST(BlockedLayouts, ConvolutionResidualEpilogueAtOtherWidths) {
  for (int64_t c : {3, 8, 24, 48}) {
    const std::string what = "channels " + std::to_string(c);
    Program p(2);
    int x = p.Param({2, c, 6, 6});
    int skip = p.Param({2, c, 6, 6});
    int conv = p.Conv(x, c, c, 6, /*relu=*/false);
    p.Return({{"y", p.ResidualRelu(conv, skip, {2, c, 6, 6})}});
    auto g = ir::ParseGraph(p.text());
    ASSERT_TRUE(g.ok()) << g.status();
    std::vector<Tensor> in;
    for (size_t i = 0; i < p.param_dims().size(); ++i)
      in.push_back(Random(Shape(p.param_dims()[i]), 30 + i));
    auto exe = MakeCpuBackend()->Compile(*g);
    ASSERT_TRUE(exe.ok()) << what << ": " << exe.status();
    std::string names;
    Reorders(**exe, &names);
    EXPECT_NE(names.find("convolution+bias+residual+relu"), std::string::npos) << what << names;
    auto got = (*exe)->Run(in);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    auto want = (*MakeReferenceBackend()->Compile(*g))->Run(in);
    ASSERT_TRUE(want.ok()) << want.status();
    for (int64_t i = 0; i < (*got)[0].num_elements(); ++i)
      ASSERT_NEAR((*got)[0].data<float>()[i], (*want)[0].GetDouble(i), 1e-4) << what << " " << i;
  }
}

}  // namespace
}  // namespace kiln::runtime
