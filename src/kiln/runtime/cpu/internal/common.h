// Shared machinery of the cpu backend's lowering: element traits for the loops (bf16/f16 compute
// in f32, round to nearest even on store), dtype visitors, the OpenMP ParallelFor, the
// per-executable CpuContext (oneDNN engine, stream, workspace), FnThunk for loop kernels and
// DnnlThunkBuilder for oneDNN primitives, plus the per-family lowering entry points.
//
//   absl::StatusOr<std::unique_ptr<Thunk>> LowerFoo(const ir::Node& n, LowerContext& lc) {
//     int in = n.operand(0), out = n.id();
//     int64_t count = n.type().shape.num_elements();
//     return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
//       ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) { ... });
//     });
//   }
//
// Everything oneDNN creates (primitives, memory descriptors, memory objects) is created while
// lowering; running a thunk only binds data pointers and executes on the context's stream.
#ifndef KILN_RUNTIME_CPU_INTERNAL_COMMON_H_
#define KILN_RUNTIME_CPU_INTERNAL_COMMON_H_

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/status.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/executable.h"
#include "kiln/tensor/dtype.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::runtime::cpu {

// ---------------------------------------------------------------------------------------------
// Element types for the loops.

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float Bf16BitsToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Same rounding as kiln::FloatToBf16 (round to nearest even, NaN stays a quiet NaN), inline so
// the loops vectorize.
inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u;
  bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// Storage type S -> compute type C (float for f32/bf16/f16, double for f64, itself for ints).
template <typename S>
struct Elem {
  using C = S;
  static C Load(S x) { return x; }
  static S Store(C c) { return c; }
};
template <>
struct Elem<bf16_t> {
  using C = float;
  static float Load(bf16_t x) { return Bf16BitsToFloat(x.bits); }
  static bf16_t Store(float c) { return bf16_t{FloatToBf16Bits(c)}; }
};
template <>
struct Elem<f16_t> {
  using C = float;
  static float Load(f16_t x) { return F16ToFloat(x.bits); }
  static f16_t Store(float c) { return f16_t{FloatToF16(c)}; }
};

// exp(x) for f32 in a form the compiler vectorizes (no libm call): Cephes' range reduction and
// degree-6 polynomial, within 2 ulp of expf for x in [-87.3, 88.3]; 0 below (the true value is
// under 1.2e-38), +inf above 88.72, NaN stays NaN. For softmax-style uses (x <= 0).
inline float FastExp(float x) {
  float xc = std::min(std::max(x, -87.3f), 88.3f);   // NaN passes through both
  float t = xc * 1.44269504088896341f + 12582912.f;  // round(x / ln2) via the 1.5 * 2^23 trick
  float n = t - 12582912.f;
  float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  float result = y * scale;
  result = x < -87.3f ? 0.f : result;
  return x > 88.72f ? std::numeric_limits<float>::infinity() : result;
}

// tanh(x) for f32 in a form the compiler vectorizes: for |x| < 0.625 Cephes' odd polynomial
// x + x^3 P(x^2), beyond it 1 - 2 / (exp(2|x|) + 1) with FastExp and the sign restored; within a
// few ulp of tanhf, +-1 for large |x|, NaN stays NaN.
inline float FastTanh(float x) {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = x + x * z * p;
  const float big = std::copysign(1.f - 2.f / (FastExp(2.f * ax) + 1.f), x);
  return ax < 0.625f ? small : big;
}

// exp, tanh and tanh-approximated GELU over f32 arrays (y may equal x), vectorized for the
// machine's ISA (runtime dispatch, vector_math.cc). The one implementation of these ops on the
// cpu backend: the fused loops and the per-op loops both call them, so they agree bit for bit.
// ExpF32 covers the whole f32 range: exp(x) for x up to 88.72 (the scale applied in two factors),
// +inf beyond, 0 below -87.3 (where expf is denormal).
void ExpF32(const float* x, float* y, int64_t n);
void TanhF32(const float* x, float* y, int64_t n);
void GeluTanhF32(const float* x, float* y, int64_t n);

// Softmax of one row in place (with a scale applied first): max, exp(x - max) with FastExp, and
// a sum with 8 partial accumulators, all vectorized (runtime ISA dispatch; attention.cc).
void SoftmaxRowF32(float* row, int64_t n, float scale);
// log(sum(exp(row))) of one row (n > 0), read only, in one pass over memory: per L1-sized chunk
// its max, then FastExp(x - max) summed in 32 lanes combined in a fixed order (deterministic),
// the running sum rescaled when the max grows. attention.cc, beside SoftmaxRowF32.
float LogSumExpRowF32(const float* row, int64_t n);

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<S>{}) for the storage type of `t` among the float compute types (f32, bf16,
// f16, f64); returns `unsupported` otherwise.
template <typename F, typename R = decltype(std::declval<F>()(TypeTag<float>{}))>
R VisitFloat(DType t, F&& f, absl::Status unsupported) {
  switch (t) {
    case DType::kF32:
      return f(TypeTag<float>{});
    case DType::kBF16:
      return f(TypeTag<bf16_t>{});
    case DType::kF16:
      return f(TypeTag<f16_t>{});
    case DType::kF64:
      return f(TypeTag<double>{});
    default:
      return R(std::move(unsupported));
  }
}
// Integer types (bool is u8 storage: callers that accept bool handle it themselves).
template <typename F, typename R = decltype(std::declval<F>()(TypeTag<int32_t>{}))>
R VisitInt(DType t, F&& f, absl::Status unsupported) {
  switch (t) {
    case DType::kS8:
      return f(TypeTag<int8_t>{});
    case DType::kU8:
      return f(TypeTag<uint8_t>{});
    case DType::kS32:
      return f(TypeTag<int32_t>{});
    case DType::kS64:
      return f(TypeTag<int64_t>{});
    default:
      return R(std::move(unsupported));
  }
}
// Float compute types first, then integers.
template <typename F, typename R = decltype(std::declval<F>()(TypeTag<float>{}))>
R VisitNumeric(DType t, F&& f, absl::Status unsupported) {
  if (IsFloating(t) && !IsStorageOnly(t)) return VisitFloat(t, f, unsupported);
  return VisitInt(t, f, unsupported);
}

// ---------------------------------------------------------------------------------------------
// Parallelism.

// Elements per thread below which a loop stays on the calling thread.
inline constexpr int64_t kElementwiseGrain = 32768;

// Splits [0, n) into contiguous chunks of at least `grain` and calls f(begin, end) for each, on
// the OpenMP team. Deterministic: the split depends only on n, grain and the thread count.
template <typename F>
void ParallelFor(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t chunks = std::min<int64_t>(max_threads, (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    int64_t t = omp_get_thread_num();
    int64_t nt = omp_get_num_threads();
    int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) f(begin, end);
  }
}

// ---------------------------------------------------------------------------------------------
// Per-executable state shared by its thunks.

class CpuContext {
 public:
  CpuContext();
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  const dnnl::engine& engine() const { return engine_; }
  dnnl::stream& stream() { return stream_; }

  // Lowering records how many bytes of scratch a thunk needs while it runs; thunks run one at a
  // time, so they all share one workspace of the largest size.
  void RequireWorkspace(int64_t bytes) { workspace_bytes_ = std::max(workspace_bytes_, bytes); }
  // Allocates (and touches, so running never page-faults) the workspace. Called once after
  // lowering.
  void AllocateWorkspace();
  uint8_t* workspace() const { return workspace_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  int64_t workspace_bytes_ = 0;
  std::shared_ptr<uint8_t> workspace_memory_;
  uint8_t* workspace_ = nullptr;
};

// Hands out aligned offsets in a thunk's slice of the workspace.
class WorkspaceLayout {
 public:
  int64_t Add(int64_t bytes) {
    int64_t off = size_;
    size_ = AlignUp(size_ + std::max<int64_t>(bytes, 1));
    return off;
  }
  int64_t size() const { return size_; }

 private:
  int64_t size_ = 0;
};

struct LowerContext {
  const ir::Graph& graph;
  std::shared_ptr<CpuContext> cpu;
  CpuBackendOptions options;
  // Per node: its buffer holds the channel-blocked layout (nChw16c at avx512, nChw8c below:
  // ChannelBlock) instead of row-major NCHW (layout.cc, AssignBlockedLayouts); empty when nothing
  // is blocked.
  std::vector<char> blocked;

  const ir::Node& operand(const ir::Node& n, int i) const { return graph.node(n.operand(i)); }
  const ir::Type& operand_type(const ir::Node& n, int i) const { return operand(n, i).type(); }
  bool is_blocked(int node) const { return !blocked.empty() && blocked[node]; }
};

// A thunk that runs a loop kernel.
class FnThunk : public Thunk {
 public:
  FnThunk(std::string name, std::function<void(RunContext&)> fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  void Run(RunContext& ctx) override { fn_(ctx); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  std::function<void(RunContext&)> fn_;
};

// "add %7 (loop)"
std::string ThunkName(const ir::Node& n, const std::string& how);
std::unique_ptr<Thunk> MakeFnThunk(const ir::Node& n, const std::string& how,
                                   std::function<void(RunContext&)> fn);

// Errors.
absl::Status UnsupportedDType(const ir::Node& n, DType t);
absl::Status Unimplemented(const ir::Node& n, const std::string& why);

// ---------------------------------------------------------------------------------------------
// oneDNN helpers.

// The oneDNN data type of `t`, or undef when oneDNN has none (f64, s64, bool, f8).
dnnl::memory::data_type DnnlType(DType t);
// Plain row-major descriptor of a shape (rank 0 becomes [1]).
dnnl::memory::desc PlainDesc(const std::vector<int64_t>& dims, dnnl::memory::data_type dt);
dnnl::memory::desc StridedDesc(const std::vector<int64_t>& dims, dnnl::memory::data_type dt,
                               const std::vector<int64_t>& strides);
// Same dims and layout, other data type (for plain descriptors).
dnnl::memory::desc WithType(const dnnl::memory::desc& md, dnnl::memory::data_type dt);
// The layout of node `node`'s buffer as a oneDNN descriptor over `dims`: BlockedTag() when the
// node is blocked (LowerContext::blocked), plain row-major otherwise.
dnnl::memory::desc NodeDesc(const LowerContext& lc, int node, const std::vector<int64_t>& dims,
                            dnnl::memory::data_type dt);
// True when oneDNN picked its reference (plain C++) implementation: the loops are as fast or
// faster, and narrow types are better computed in f32.
inline bool IsRefImpl(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).find("ref") != std::string::npos;
}
// The one wrapper around every oneDNN call that may throw (primitive descriptors, primitives, the
// memory objects made for them): runs `fn` and turns a dnnl::error into Unimplemented naming the
// op, its operand and result types, what was being made and the ISA oneDNN runs at:
//   cpu backend: conv2d %7 (bf16[8,3,32,32], bf16[16,3,3,3] -> bf16[8,16,32,32]): oneDNN
//   convolution: could not create a primitive descriptor iterator (oneDNN ISA avx2)
// Unimplemented because a refusal means oneDNN has no kernel for that form: an op with a loop
// (OneDnnOrLoop, the matmul's and convolution's f32 retries) falls back to it, and the others
// fail with this message instead of an exception escaping the backend.
absl::Status DnnlStatus(const LowerContext& lc, const ir::Node& n, std::string_view what,
                        const std::function<void()>& fn);
// As above where only the node is at hand: names its result type, not its operands'.
absl::Status DnnlStatus(const ir::Node& n, const std::function<void()>& fn);
// The core of both, for callers outside a graph (machine.cc): `context` says what was being made
// ("oneDNN bf16 matmul 1024x1024x1024"); the message adds the error and the ISA.
absl::Status CatchOneDnn(std::string_view context, const std::function<void()>& fn);
// "bf16[8,3,32,32], bf16[16,3,3,3] -> bf16[8,16,32,32]": the operand and result types of `n`.
std::string OperandTypesText(const LowerContext& lc, const ir::Node& n);

// Builds a thunk that runs a short sequence of oneDNN primitives (input reorders, the main
// primitive, output reorders). Memory objects are created here, bound to their data at run time.
class DnnlThunkBuilder {
 public:
  DnnlThunkBuilder(LowerContext& lc, const ir::Node& n, std::string how);

  // DnnlStatus for this builder's node: runs `fn`, a oneDNN refusal becomes Unimplemented
  // naming the node, its types, `what` and the ISA.
  absl::Status Create(std::string_view what, const std::function<void()>& fn) {
    return DnnlStatus(lc_, node_, what, fn);
  }
  // Creates primitive P (dnnl::matmul, dnnl::convolution_forward, ...) from `pd` through Create,
  // and appends it with its arguments and `pd`'s scratchpad (AddStepWithScratchpad), or as a
  // final step (AddFinalStep) when `final`.
  template <typename P, typename Pd>
  absl::Status AddPrimitive(std::string_view what, const Pd& pd,
                            std::vector<std::pair<int, int>> args, bool final = false) {
    P prim;
    KILN_RETURN_IF_ERROR(Create(what, [&] { prim = P(pd); }));
    if (final) {
      AddFinalStep(std::move(prim), std::move(args), pd.scratchpad_desc());
    } else {
      AddStepWithScratchpad(std::move(prim), std::move(args), pd.scratchpad_desc());
    }
    return absl::OkStatus();
  }

  // A memory object over node `node`'s buffer, described by `md`.
  int NodeMemory(int node, const dnnl::memory::desc& md);
  // A memory object over `bytes` (md's size when 0) of this thunk's workspace slice.
  int TempMemory(const dnnl::memory::desc& md);
  // Workspace offset of a temp memory (for loop steps that fill it).
  int64_t TempOffset(int mem) const { return mems_[mem].offset; }
  // Reserves raw bytes in the workspace slice, for loop steps.
  int64_t TempBytes(int64_t bytes) { return layout_.Add(bytes); }

  // The primitive reads node `node` (layout `user`) in layout `want`: returns the memory to pass,
  // inserting a reorder (layout and/or dtype) into a temporary when they differ.
  absl::StatusOr<int> Input(int node, const dnnl::memory::desc& user,
                            const dnnl::memory::desc& want);
  // As Input, for an operand that may be fixed for the executable's life (a weight): when
  // `node` is constant at Thunk::PrepareConstants (Executable::BindConstantParameters), the
  // reorder into `want` runs once then, into a buffer the thunk keeps, and every later run reads
  // that buffer and skips the reorder (pre-packed weights). While `node` is not constant, or when
  // a run is handed another buffer than the one packed, it reorders on every run as Input does.
  absl::StatusOr<int> ConstantInput(int node, const dnnl::memory::desc& user,
                                    const dnnl::memory::desc& want);
  // A reorder of memory `from` into a temporary of layout/dtype `want` (no-op when equal).
  absl::StatusOr<int> Reorder(int from, const dnnl::memory::desc& want);
  dnnl::memory::desc Desc(int mem) const { return mems_[mem].memory.get_desc(); }

  // The primitive writes `have`; the node's buffer has layout `user`. Returns the memory to pass;
  // the reorder back (if any) runs after the steps added so far.
  absl::StatusOr<int> Output(int node, const dnnl::memory::desc& user,
                             const dnnl::memory::desc& have);

  // Appends a primitive with its arguments (dnnl arg id -> memory index).
  void AddStep(dnnl::primitive prim, std::vector<std::pair<int, int>> args);
  // Appends a primitive that uses a user-mode scratchpad of `scratch` (its desc).
  void AddStepWithScratchpad(dnnl::primitive prim, std::vector<std::pair<int, int>> args,
                             const dnnl::memory::desc& scratch);
  // Appends a primitive that runs last, after the reorders of the results back (Output).
  void AddFinalStep(dnnl::primitive prim, std::vector<std::pair<int, int>> args,
                    const dnnl::memory::desc& scratch);
  // Appends a loop step: fn(ctx, workspace slice base).
  void AddLoopStep(std::function<void(RunContext&, uint8_t*)> fn);

  // The thunk; its name ends with how many activation reorders it runs (", 2 reorders"), the
  // layout conversions a profile should show.
  absl::StatusOr<std::unique_ptr<Thunk>> Finish();

  // Appends " <impl>" to the thunk name (which oneDNN implementation runs, for profiles).
  void NameImpl(const dnnl::primitive_desc_base& pd) {
    name_ += std::string(" ") + pd.impl_info_str();
  }
  // Appends `text` to the thunk name (inside its parentheses).
  void AppendName(const std::string& text) { name_ += text; }

  // Attributes with user-mode scratchpad, for every primitive this backend creates.
  static dnnl::primitive_attr Attr();

 private:
  struct Mem {
    dnnl::memory memory;
    int node = -1;        // bound to ctx.buffers[node]
    int64_t offset = -1;  // or to workspace slice + offset
  };
  struct Step {
    dnnl::primitive prim;
    std::vector<dnnl_exec_arg_t> args;
    std::function<void(RunContext&, uint8_t*)> loop;
    int pack = -1;  // the reorder of packs_[pack]: skipped while that pack is live
  };
  // A ConstantInput's reorder of node `node` (memory `from`) into memory `to` (a workspace
  // temporary, or the kept buffer while the pack is live); steps_[step] is the reorder.
  struct Pack {
    int node = -1, from = -1, to = -1, step = -1;
  };
  friend class DnnlThunk;

  LowerContext& lc_;
  const ir::Node& node_;
  std::string name_;
  WorkspaceLayout layout_;
  std::vector<Mem> mems_;
  std::vector<Step> steps_;
  std::vector<Step> post_steps_;
  std::vector<Step> final_steps_;
  std::vector<Pack> packs_;
  int reorders_ = 0;  // of activations, per run (weight packs not counted): named by Finish
  absl::Status status_;
};

// ---------------------------------------------------------------------------------------------
// Strided copies (transpose, broadcast, slice, pad, operand re-layout).

// A copy between two strided views of the same multi-index space, planned at compile time:
// out[sum_d idx_d * out_strides_d] = in[sum_d idx_d * in_strides_d]. Strides are in elements;
// elem_size is 1, 2, 4 or 8. Unit dims are dropped and contiguous dims merged when planning.
struct CopyPlan {
  std::vector<int64_t> dims, in_strides, out_strides;
  int64_t elem_size = 4;
  bool empty = false;
};
inline constexpr int kMaxRank = 32;
CopyPlan PlanStridedCopy(const std::vector<int64_t>& dims, const std::vector<int64_t>& in_strides,
                         const std::vector<int64_t>& out_strides, int64_t elem_size);
void RunStridedCopy(const CopyPlan& plan, const void* in, void* out);

// Fills `count` elements of `elem_size` bytes with the bytes of `value`.
void FillBytes(void* out, int64_t count, const void* value, int64_t elem_size);

// Row-major strides of `dims` in elements.
std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims);

// ---------------------------------------------------------------------------------------------
// Per-family lowering entry points (one .cc file each). Each returns the thunk for `n`, or
// Unimplemented naming the op and dtype.

using LowerResult = absl::StatusOr<std::unique_ptr<Thunk>>;

// The one map from an op's library algorithm (opcodes.def `alg` column, ir::EltwiseAlg) to oneDNN
// (onednn_ops.cc): the eltwise algorithm and alpha for a unary op (gelu reads `approximate`),
// nullopt for ops without one; the binary algorithm for add sub mul div.
struct OneDnnEltwiseAlg {
  dnnl::algorithm alg;
  float alpha = 0.f;
};
std::optional<OneDnnEltwiseAlg> OneDnnEltwise(const ir::Node& n);
std::optional<dnnl::algorithm> OneDnnBinary(ir::Opcode op);

// The channel block of the blocked activation layout, as the process's ISA level has oneDNN's
// direct convolution and pooling kernels use it: 16 (nChw16c) at avx512 and above, 8 (nChw8c)
// at avx2 and sse41. layout.cc; fixed once the level is decided.
int64_t ChannelBlock();
dnnl::memory::format_tag BlockedTag();

// An asynchronous collective (compiler::IsAsyncCollective, ExecutionPlan::done_step): `start`
// hands it to the run's CollectiveStream at its own step, `wait` (placed before the first kernel
// that reads the result) blocks until it ran and stops the run on its error (misc.cc).
struct AsyncThunks {
  std::unique_ptr<Thunk> start, wait;
};
AsyncThunks LowerAsyncAllReduce(const ir::Node& n, LowerContext& lc);
LowerResult LowerDotGeneral(const ir::Node& n, LowerContext& lc);  // matmul.cc
// The oneDNN post-ops of an epilogue fusion group, from the steps the execution plan worked out
// (compiler::EpilogueSteps): dst = residual + act(head + bias), written to node `out`.
struct Epilogue {
  int bias = -1;  // node of the rank-1 bias, or -1
  bool has_act = false;
  dnnl::algorithm act = dnnl::algorithm::eltwise_relu;
  float alpha = 0.f;
  int residual = -1;  // node of the same-shaped residual, or -1
  // dst = act(head + bias + residual) instead of residual + act(head + bias) (convolutions).
  bool residual_first = false;
  int out = -1;       // node whose buffer receives the result (-1: the head itself)
  std::string label;  // "+bias+relu+residual"
};
// Unimplemented when the activation has no oneDNN eltwise algorithm.
absl::StatusOr<Epilogue> OneDnnEpilogue(const compiler::EpilogueSteps& steps, const ir::Graph& g);
// An output fusion group [dot_general, (bias add), (activation), (residual add)] as one oneDNN
// matmul with bias and post-ops, writing the last member's buffer (matmul.cc).
bool CanLowerMatmulEpilogue(const ir::Graph& g, const std::vector<int>& members, bool prefer_loops);
LowerResult LowerMatmulEpilogue(const compiler::ExecutionPlan::Kernel& k, LowerContext& lc);
// conv2d [+ bias] [+ residual] [+ activation] as one oneDNN convolution with bias, a binary-add
// and an eltwise post-op (conv_pool.cc).
bool CanLowerConvEpilogue(const ir::Graph& g, const std::vector<int>& members, bool prefer_loops);
LowerResult LowerConvEpilogue(const compiler::ExecutionPlan::Kernel& k, LowerContext& lc);
LowerResult LowerConv(const ir::Node& n, LowerContext& lc);  // conv_pool.cc
LowerResult LowerPool(const ir::Node& n, LowerContext& lc);  // conv_pool.cc
// Whether a forward f32 convolution, reading a row-major input, writes nChw16c (the layout
// oneDNN's direct kernel wants for its narrow layers), and whether a forward pooling runs oneDNN's
// jit kernel on nChw16c: the producers whose results AssignBlockedLayouts may keep blocked.
bool ConvWritesBlocked(const ir::Node& conv, const LowerContext& lc);  // conv_pool.cc
bool PoolRunsBlocked(const ir::Node& pool, const LowerContext& lc);    // conv_pool.cc
// Which values keep the nChw16c layout between kernels (layout.cc): those written by a convolution
// or pooling that computes in it, or by an elementwise loop over blocked values, and read only by
// kernels that take it (convolutions, pooling, elementwise loops, a sum over H and W), so that no
// reorder runs between them. Graph inputs and outputs, aliased and hoisted values stay row-major.
// A reduce_sum over dims {2, 3} of an f32 [N, C, H, W], C a multiple of 16: the global pool
// that may read nChw16c (layout.cc).
bool IsSpatialSum(const ir::Node& n, const ir::Graph& g);
std::vector<char> AssignBlockedLayouts(const compiler::ExecutionPlan& plan, const LowerContext& lc);
LowerResult LowerOneDnnUnary(const ir::Node& n, LowerContext& lc);      // onednn_ops.cc
LowerResult LowerOneDnnBinary(const ir::Node& n, LowerContext& lc);     // onednn_ops.cc
LowerResult LowerOneDnnSoftmax(const ir::Node& n, LowerContext& lc);    // onednn_ops.cc
LowerResult LowerOneDnnLayerNorm(const ir::Node& n, LowerContext& lc);  // onednn_ops.cc
LowerResult LowerOneDnnConvert(const ir::Node& n, LowerContext& lc);    // onednn_ops.cc
LowerResult LowerUnaryLoop(const ir::Node& n, LowerContext& lc);        // elementwise.cc
LowerResult LowerBinaryLoop(const ir::Node& n, LowerContext& lc);       // elementwise.cc
LowerResult LowerCompare(const ir::Node& n, LowerContext& lc);          // elementwise.cc
LowerResult LowerSelect(const ir::Node& n, LowerContext& lc);           // elementwise.cc
LowerResult LowerLogical(const ir::Node& n, LowerContext& lc);          // elementwise.cc
LowerResult LowerConvertLoop(const ir::Node& n, LowerContext& lc);      // elementwise.cc
LowerResult LowerStructural(const ir::Node& n, LowerContext& lc);       // structural.cc
LowerResult LowerIndexing(const ir::Node& n, LowerContext& lc);         // structural.cc
LowerResult LowerReduce(const ir::Node& n, LowerContext& lc);           // reduce.cc
LowerResult LowerArgmax(const ir::Node& n, LowerContext& lc);           // reduce.cc
LowerResult LowerSoftmaxLoop(const ir::Node& n, LowerContext& lc);      // norm.cc
LowerResult LowerLayerNormLoop(const ir::Node& n, LowerContext& lc);    // norm.cc
LowerResult LowerRmsNorm(const ir::Node& n, LowerContext& lc);          // norm.cc
LowerResult LowerCrossEntropy(const ir::Node& n, LowerContext& lc);     // norm.cc
LowerResult LowerAttention(const ir::Node& n, LowerContext& lc);        // attention.cc
LowerResult LowerMaxPoolGrad(const ir::Node& n, LowerContext& lc);      // pool_loops.cc
LowerResult LowerPoolLoop(const ir::Node& n, LowerContext& lc);         // pool_loops.cc
LowerResult LowerMisc(const ir::Node& n, LowerContext& lc);             // misc.cc

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_COMMON_H_
