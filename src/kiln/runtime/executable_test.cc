#include "kiln/runtime/executable.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::runtime {
namespace {

using ir::Graph;
using ir::Opcode;
using ir::Type;
using ::testing::HasSubstr;

// A minimal f32 backend for add and neg, so the executable is tested without any real backend.
class TestThunk : public Thunk {
 public:
  TestThunk(const ir::Node& n) : node_(n) {}
  void Run(RunContext& ctx) override {
    int64_t count = node_.type().shape.num_elements();
    float* y = static_cast<float*>(ctx.buffers[node_.id()]);
    const float* a = static_cast<const float*>(ctx.buffers[node_.operand(0)]);
    if (node_.opcode() == Opcode::kAdd) {
      const float* b = static_cast<const float*>(ctx.buffers[node_.operand(1)]);
      for (int64_t i = 0; i < count; ++i) y[i] = a[i] + b[i];
    } else {
      for (int64_t i = 0; i < count; ++i) y[i] = -a[i];
    }
  }
  std::string name() const override { return "test " + std::to_string(node_.id()); }

 private:
  ir::Node node_;
};

std::unique_ptr<Executable> Compile(const Graph& g) {
  std::vector<std::unique_ptr<Thunk>> thunks;
  for (const auto& n : g.nodes())
    if (n.opcode() == Opcode::kAdd || n.opcode() == Opcode::kNeg)
      thunks.push_back(std::make_unique<TestThunk>(n));
  return std::make_unique<Executable>(g, compiler::PlanBuffers(g), std::move(thunks), "test");
}

int Param(Graph& g, int index, const std::string& name, Shape s) {
  return g.AddNode(Opcode::kParameter, {}, Type{DType::kF32, std::move(s)},
                   {{"index", int64_t{index}}, {"name", name}});
}

// y = -(x + w) + c, plus the parameter x and the constant c as outputs themselves.
Graph TestGraph() {
  Graph g("t");
  // Declared out of index order on purpose: Run takes inputs in index order.
  int w = Param(g, 1, "w", Shape{3});
  int x = Param(g, 0, "x", Shape{3});
  auto lit = std::make_shared<Tensor>(Tensor::FromVector<float>(Shape{3}, {10, 20, 30}));
  int c = g.AddNode(Opcode::kConstant, {}, Type{DType::kF32, Shape{3}}, {}, lit);
  int s = g.AddNode(Opcode::kAdd, {x, w}, Type{DType::kF32, Shape{3}}, {});
  int n = g.AddNode(Opcode::kNeg, {s}, Type{DType::kF32, Shape{3}}, {});
  int y = g.AddNode(Opcode::kAdd, {n, c}, Type{DType::kF32, Shape{3}}, {});
  g.AddOutput("y", y);
  g.AddOutput("x_again", x);
  g.AddOutput("c", c);
  return g;
}

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.num_elements());
}

TEST(ExecutableTest, RunInParameterOrder) {
  auto exe = Compile(TestGraph());
  EXPECT_EQ(exe->num_thunks(), 3);
  EXPECT_EQ(exe->backend_name(), "test");
  Tensor x = Tensor::FromVector<float>(Shape{3}, {1, 2, 3});
  Tensor w = Tensor::FromVector<float>(Shape{3}, {100, 200, 300});
  auto outs = exe->Run({x, w});
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_EQ(outs->size(), 3u);
  EXPECT_EQ(Values((*outs)[0]), (std::vector<float>{-91, -182, -273}));
  EXPECT_EQ(Values((*outs)[1]), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Values((*outs)[2]), (std::vector<float>{10, 20, 30}));
  // Outputs are fresh tensors, not views of the input or the literal.
  EXPECT_NE((*outs)[1].raw_data(), x.raw_data());
}

TEST(ExecutableTest, ReuseAcrossRunsWithDifferentInputs) {
  auto exe = Compile(TestGraph());
  for (int r = 0; r < 3; ++r) {
    float f = static_cast<float>(r);
    auto outs = exe->Run({Tensor::FromVector<float>(Shape{3}, {f, f, f}),
                          Tensor::FromVector<float>(Shape{3}, {1, 1, 1})});
    ASSERT_TRUE(outs.ok());
    EXPECT_EQ(Values((*outs)[0]), (std::vector<float>{9 - f, 19 - f, 29 - f}));
  }
}

TEST(ExecutableTest, ThunkObserverSeesEveryThunkInOrder) {
  auto exe = Compile(TestGraph());
  std::vector<int> seen;
  int64_t last_end = 0;
  exe->set_thunk_observer([&](int i, int64_t start_ns, int64_t end_ns) {
    EXPECT_LE(start_ns, end_ns);
    EXPECT_GE(start_ns, last_end);
    last_end = end_ns;
    seen.push_back(i);
  });
  Tensor x = Tensor::FromVector<float>(Shape{3}, {1, 2, 3});
  ASSERT_TRUE(exe->Run({x, x}).ok());
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
  exe->set_thunk_observer(nullptr);
  ASSERT_TRUE(exe->Run({x, x}).ok());
  EXPECT_EQ(seen.size(), 3u);
}

TEST(ExecutableTest, RunNamed) {
  auto exe = Compile(TestGraph());
  auto outs = exe->RunNamed({{"x", Tensor::FromVector<float>(Shape{3}, {1, 1, 1})},
                             {"w", Tensor::FromVector<float>(Shape{3}, {0, 1, 2})}});
  ASSERT_TRUE(outs.ok()) << outs.status();
  EXPECT_EQ(outs->size(), 3u);
  EXPECT_EQ(Values(outs->at("y")), (std::vector<float>{9, 18, 27}));
  EXPECT_EQ(Values(outs->at("x_again")), (std::vector<float>{1, 1, 1}));
}

TEST(ExecutableTest, RunNamedMissingAndUnknownInputs) {
  auto exe = Compile(TestGraph());
  Tensor t = Tensor::FromVector<float>(Shape{3}, {1, 2, 3});
  auto missing = exe->RunNamed({{"x", t}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("'w'"));
  auto unknown = exe->RunNamed({{"x", t}, {"w", t}, {"z", t}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'z'"));
}

TEST(ExecutableTest, InputErrorsNameTheParameter) {
  auto exe = Compile(TestGraph());
  Tensor ok = Tensor::FromVector<float>(Shape{3}, {1, 2, 3});
  auto count = exe->Run({ok});
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(count.status().message(), HasSubstr("expected 2 inputs, got 1"));

  auto shape = exe->Run({ok, Tensor(DType::kF32, Shape{4})});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.status().message(), HasSubstr("'w'"));
  EXPECT_THAT(shape.status().message(), HasSubstr("f32[4]"));

  auto dtype = exe->Run({Tensor(DType::kF64, Shape{3}), ok});
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dtype.status().message(), HasSubstr("'x'"));
  EXPECT_THAT(dtype.status().message(), HasSubstr("f64[3]"));
}

TEST(ExecutableTest, RunIntoWritesCallerTensors) {
  auto exe = Compile(TestGraph());
  Tensor x = Tensor::FromVector<float>(Shape{3}, {1, 2, 3});
  Tensor w = Tensor::FromVector<float>(Shape{3}, {0, 0, 0});
  Tensor y(DType::kF32, Shape{3}), xa(DType::kF32, Shape{3}), c(DType::kF32, Shape{3});
  void* before = y.raw_data();
  ASSERT_TRUE(exe->RunInto({&x, &w}, {&y, &xa, &c}).ok());
  EXPECT_EQ(y.raw_data(), before);
  EXPECT_EQ(Values(y), (std::vector<float>{9, 18, 27}));
  EXPECT_EQ(Values(xa), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Values(c), (std::vector<float>{10, 20, 30}));

  Tensor bad(DType::kF32, Shape{2});
  absl::Status s = exe->RunInto({&x, &w}, {&y, &bad, &c});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("x_again"));
  s = exe->RunInto({&x, &w}, {&y});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = exe->RunInto({&x, nullptr}, {&y, &xa, &c});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
}

TEST(ExecutableTest, ArenaIsSharedAcrossLiveRanges) {
  Graph g;
  int x = Param(g, 0, "x", Shape{64});
  for (int i = 0; i < 6; ++i) x = g.AddNode(Opcode::kNeg, {x}, Type{DType::kF32, Shape{64}}, {});
  g.AddOutput("y", x);
  auto exe = Compile(g);
  // The neg chain runs in place: one buffer (in-place reuse of a dying operand).
  EXPECT_EQ(exe->plan().arena_bytes, 256);
  std::vector<float> in(64);
  for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i);
  auto outs = exe->Run({Tensor::FromVector<float>(Shape{64}, in)});
  ASSERT_TRUE(outs.ok());
  EXPECT_EQ(Values((*outs)[0]), in);  // six negations
}

TEST(ExecutableTest, NoParametersNoThunks) {
  Graph g;
  auto lit = std::make_shared<Tensor>(Tensor::FromVector<float>(Shape{2}, {4, 5}));
  int c = g.AddNode(Opcode::kConstant, {}, Type{DType::kF32, Shape{2}}, {}, lit);
  g.AddOutput("c", c);
  auto exe = Compile(g);
  auto outs = exe->Run({});
  ASSERT_TRUE(outs.ok());
  EXPECT_EQ(Values((*outs)[0]), (std::vector<float>{4, 5}));
}

}  // namespace
}  // namespace kiln::runtime
