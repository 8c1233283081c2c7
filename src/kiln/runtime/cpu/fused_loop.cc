// Loop fusion groups (compiler/passes/fusion.h) as one kernel: a small register program run over
// blocks of kBlock elements. Each block loads the group's inputs (converting bf16/bool to f32, and
// reading broadcast_in_dim operands through a broadcasting view), runs the members' ops over
// per-thread scratch registers that stay in L1, then stores the members that are used outside the
// group. One pass over memory for the whole chain, one thunk, no per-op library dispatch.
//
// Inputs load a run at a time, with the dtype picked once per input and block: a kRows view
// copies runs of its inner vector, a kCols view fills runs of one row's value, a kStrided view
// walks its outer dims once per run of the innermost one (copy, fill or gather); reductions
// accumulate the same runs (a run into one output is summed over f64 partial sums first).
// Contiguous inputs are prefetched a couple of blocks ahead, since the ops read one input
// stream at a time.
//
// Semantics match the unfused loops bit for bit: values compute in f32; a bf16 member rounds to
// bf16 (nearest even) after its op, exactly as storing and reloading it would; bool values are
// 0/1 floats. Every input read of a block comes before any output write of that block, so an
// output may share its buffer with a same-shaped input that dies at the group (the train step's
// in-place parameter and optimizer-state updates): outputs are stored at the end of the block,
// except f32 outputs whose defining instruction comes at or after the last instruction that reads
// an input buffer in place; those are computed straight into their buffers (DirectOutputs).
// Binary ops with a scalar operand read it once per block, not per element.
//
// The block routine is compiled once per ISA level and picked from the process's capped level
// (base/isa_dispatch.h), so the loops use AVX-512 or AVX2 where allowed without -march=native.
#include "kiln/runtime/cpu/internal/fused_loop.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kiln/base/isa_dispatch.h"
#include "kiln/compiler/passes/fusion.h"
#include "kiln/ir/op_traits.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;

constexpr int64_t kBlock = 256;
// How many blocks ahead RunBlocks prefetches contiguous inputs.
constexpr int64_t kPrefetchBlocks = 2;
// Scratch registers plus direct-input slots; the fusion pass caps groups at 64 members, so a
// program needs at most a few hundred.
constexpr int kMaxSlots = 512;

enum class FOp : uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMax,
  kMin,
  kNeg,
  kAbs,
  kRelu,
  kSqrt,
  kRsqrt,
  kExp,
  kTanh,
  kSign,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kSelect,
  kAnd,
  kOr,
  kNot,
  kToBool,
  kRoundBf16,
};

struct Instr {
  FOp op;
  int16_t dst, a, b, c;
  // Bit 0: `a` is a scalar input's register, bit 1: `b` is (read once, not per element).
  uint8_t scalars = 0;
};

// How an input is read, in elements of the output index space.
enum class View : uint8_t {
  kContiguous,  // in[i]
  kScalar,      // in[0]
  kRows,        // in[i % inner]          (a [inner] vector repeated over rows)
  kCols,        // in[(i / inner) % outer] (one value per row of `inner`, rows repeat)
  kStrided,     // general: collapsed dims and strides
};

struct Input {
  int node = -1;
  DType dtype = DType::kF32;
  View view = View::kContiguous;
  int64_t inner = 1, outer = 1;
  std::vector<int64_t> dims, strides;  // kStrided only (collapsed)
  int16_t reg = -1;
  // f32 and contiguous: the ops read the buffer in place (reg is a pointer slot past the scratch
  // registers, not scratch).
  bool direct = false;
};

struct Output {
  int node;
  DType dtype;
  int16_t reg;
  // f32, computed straight into the output buffer by the instruction that defines it (reg is a
  // pointer slot, as for a direct input): no scratch register and no store (DirectOutputs).
  bool direct = false;
};

// A reduce_sum member: its operand's register is accumulated into per-thread f64 accumulators
// indexed through `view` (group index -> output index, the reduce's kept dims).
struct Reduction {
  int node;
  DType dtype;
  int16_t reg = -1;  // the reduced value's slot
  Input view;        // kScalar, kRows, kCols, kStrided or kContiguous over the output
  int64_t out_count = 1;
  int64_t acc_offset = 0;  // in doubles, within one thread's accumulators
};

struct Program {
  std::vector<Reduction> reductions;
  int64_t acc_per_thread = 0;  // doubles
  std::vector<Input> inputs;
  std::vector<Instr> code;
  std::vector<Output> outputs;
  int num_regs = 0;   // scratch registers (kBlock floats each, per thread)
  int num_slots = 0;  // num_regs + one pointer slot per direct input and direct output
  int64_t count = 0;
};

// Reads elements [start, start+n) of `in` as floats into r.
// The per-block pieces are always inlined into RunBlocks, which is compiled once per ISA.
#define KILN_BLOCK_INLINE inline __attribute__((always_inline))

// Calls f(j, offset, len, stride) for runs of a strided view covering the elements start + j
// (j < n) in order: a run is `len` consecutive elements along the innermost collapsed dim, at
// `offset` + t * `stride` in the operand. The outer multi-index advances once per run.
template <typename F>
KILN_BLOCK_INLINE void ForEachStridedRun(const Input& v, int64_t start, int64_t n, F&& f) {
  const int rank = static_cast<int>(v.dims.size());
  const int64_t inner = v.dims[rank - 1], s0 = v.strides[rank - 1];
  int64_t idx[kMaxRank];
  int64_t rem = start, off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    idx[d] = rem % v.dims[d];
    rem /= v.dims[d];
    off += idx[d] * v.strides[d];
  }
  for (int64_t j = 0; j < n;) {
    const int64_t run = std::min(n - j, inner - idx[rank - 1]);
    f(j, off, run, s0);
    j += run;
    off += run * s0;
    idx[rank - 1] += run;
    if (idx[rank - 1] < inner) continue;
    off -= inner * s0;
    idx[rank - 1] = 0;
    for (int d = rank - 2; d >= 0; --d) {
      off += v.strides[d];
      if (++idx[d] < v.dims[d]) break;
      off -= v.strides[d] * v.dims[d];
      idx[d] = 0;
    }
  }
}

// One element of an input's storage type as the f32 the ops compute in.
KILN_BLOCK_INLINE float ToF32(float x) { return x; }
KILN_BLOCK_INLINE float ToF32(uint16_t x) { return Bf16BitsToFloat(x); }
KILN_BLOCK_INLINE float ToF32(uint8_t x) { return x ? 1.0f : 0.0f; }

// r[t] = src[t * stride] for t < n, with the unit-stride (copy) and zero-stride (fill) cases as
// their own vectorizable loops.
template <typename T>
KILN_BLOCK_INLINE void LoadRun(const T* src, int64_t stride, int64_t n, float* r) {
  if (stride == 1) {
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(r, src, n * sizeof(float));
    } else {
      for (int64_t t = 0; t < n; ++t) r[t] = ToF32(src[t]);
    }
  } else if (stride == 0) {
    const float v = ToF32(src[0]);
    for (int64_t t = 0; t < n; ++t) r[t] = v;
  } else {
    for (int64_t t = 0; t < n; ++t) r[t] = ToF32(src[t * stride]);
  }
}

// Reads elements [start, start+n) of `in` (storage type T) as floats into r, one run at a time:
// kRows copies runs of the inner vector, kCols fills runs of one row's value.
template <typename T>
KILN_BLOCK_INLINE void LoadInputAs(const Input& in, const T* base, int64_t start, int64_t n,
                                   float* r) {
  switch (in.view) {
    case View::kContiguous:
      LoadRun(base + start, 1, n, r);
      return;
    case View::kScalar:
      LoadRun(base, 0, n, r);
      return;
    case View::kRows: {
      int64_t k = start % in.inner;
      for (int64_t j = 0; j < n; k = 0) {
        const int64_t run = std::min(n - j, in.inner - k);
        LoadRun(base + k, 1, run, r + j);
        j += run;
      }
      return;
    }
    case View::kCols: {
      int64_t row = start / in.inner, col = start % in.inner;
      for (int64_t j = 0; j < n; col = 0, ++row) {
        const int64_t run = std::min(n - j, in.inner - col);
        LoadRun(base + row % in.outer, 0, run, r + j);
        j += run;
      }
      return;
    }
    case View::kStrided:
      ForEachStridedRun(in, start, n, [&](int64_t j, int64_t off, int64_t len, int64_t stride) {
        LoadRun(base + off, stride, len, r + j);
      });
      return;
  }
}

// The dtype is picked once per input and block, never per element.
KILN_BLOCK_INLINE void LoadInput(const Input& in, const void* base, int64_t start, int64_t n,
                                 float* r) {
  switch (in.dtype) {
    case DType::kF32:
      return LoadInputAs(in, static_cast<const float*>(base), start, n, r);
    case DType::kBF16:
      return LoadInputAs(in, static_cast<const uint16_t*>(base), start, n, r);
    default:
      return LoadInputAs(in, static_cast<const uint8_t*>(base), start, n, r);
  }
}

// d[j] = f(a[j], b[j]) for j < n; a scalar operand (`scalars`, see Instr) is read once.
template <typename F>
KILN_BLOCK_INLINE void Binary(float* d, const float* a, const float* b, uint8_t scalars, int64_t n,
                              F f) {
  if (scalars & 2) {
    const float y = b[0];
    for (int64_t j = 0; j < n; ++j) d[j] = f(a[j], y);
  } else if (scalars & 1) {
    const float x = a[0];
    for (int64_t j = 0; j < n; ++j) d[j] = f(x, b[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) d[j] = f(a[j], b[j]);
  }
}

// The ops over one block. Registers never alias within an instruction (the allocator frees an
// operand's register only after the instruction that last reads it).
KILN_BLOCK_INLINE void RunCode(const Instr* code, int num_instrs, float* const* slot, int64_t n) {
  for (int k = 0; k < num_instrs; ++k) {
    const Instr& in = code[k];
    // No __restrict: a rounding step runs in place (d == a).
    float* d = slot[in.dst];
    const float* a = slot[in.a];
    const float* b = in.b >= 0 ? slot[in.b] : a;
    const float* c = in.c >= 0 ? slot[in.c] : a;
    switch (in.op) {
      case FOp::kAdd:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x + y; });
        break;
      case FOp::kSub:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x - y; });
        break;
      case FOp::kMul:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x * y; });
        break;
      case FOp::kDiv:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x / y; });
        break;
      case FOp::kMax:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return (x > y || x != x) ? x : y; });
        break;
      case FOp::kMin:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return (x < y || x != x) ? x : y; });
        break;
      case FOp::kNeg:
        for (int64_t j = 0; j < n; ++j) d[j] = -a[j];
        break;
      case FOp::kAbs:
        for (int64_t j = 0; j < n; ++j) d[j] = std::fabs(a[j]);
        break;
      case FOp::kRelu:
        for (int64_t j = 0; j < n; ++j) d[j] = a[j] < 0.0f ? 0.0f : a[j];
        break;
      case FOp::kSqrt:
        for (int64_t j = 0; j < n; ++j) d[j] = std::sqrt(a[j]);
        break;
      case FOp::kRsqrt:
        for (int64_t j = 0; j < n; ++j) d[j] = 1.0f / std::sqrt(a[j]);
        break;
      case FOp::kExp:
        ExpF32(a, d, n);
        break;
      case FOp::kTanh:
        TanhF32(a, d, n);
        break;
      case FOp::kSign:
        for (int64_t j = 0; j < n; ++j) d[j] = a[j] > 0.0f ? 1.0f : (a[j] < 0.0f ? -1.0f : 0.0f);
        break;
      case FOp::kEq:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x == y ? 1.0f : 0.0f; });
        break;
      case FOp::kNe:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x != y ? 1.0f : 0.0f; });
        break;
      case FOp::kLt:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x < y ? 1.0f : 0.0f; });
        break;
      case FOp::kLe:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x <= y ? 1.0f : 0.0f; });
        break;
      case FOp::kGt:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x > y ? 1.0f : 0.0f; });
        break;
      case FOp::kGe:
        Binary(d, a, b, in.scalars, n, [](float x, float y) { return x >= y ? 1.0f : 0.0f; });
        break;
      case FOp::kSelect:
        for (int64_t j = 0; j < n; ++j) d[j] = a[j] != 0.0f ? b[j] : c[j];
        break;
      case FOp::kAnd:
        Binary(d, a, b, in.scalars, n,
               [](float x, float y) { return (x != 0.0f && y != 0.0f) ? 1.0f : 0.0f; });
        break;
      case FOp::kOr:
        Binary(d, a, b, in.scalars, n,
               [](float x, float y) { return (x != 0.0f || y != 0.0f) ? 1.0f : 0.0f; });
        break;
      case FOp::kNot:
        for (int64_t j = 0; j < n; ++j) d[j] = a[j] == 0.0f ? 1.0f : 0.0f;
        break;
      case FOp::kToBool:
        for (int64_t j = 0; j < n; ++j) d[j] = a[j] != 0.0f ? 1.0f : 0.0f;
        break;
      case FOp::kRoundBf16:
        for (int64_t j = 0; j < n; ++j) d[j] = Bf16BitsToFloat(FloatToBf16Bits(a[j]));
        break;
    }
  }
}

// The sum of x[0..n) in f64, over 8 independent partial sums (vectorizable).
KILN_BLOCK_INLINE double SumRun(const float* x, int64_t n) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int k = 0; k < 8; ++k) part[k] += x[t + k];
  double s = 0;
  for (int k = 0; k < 8; ++k) s += part[k];
  for (; t < n; ++t) s += x[t];
  return s;
}

// acc[t * stride] += x[t] for t < n (stride 0: one output takes the run's sum).
KILN_BLOCK_INLINE void AccumulateRun(const float* x, int64_t n, int64_t stride, double* acc) {
  if (stride == 0) {
    acc[0] += SumRun(x, n);
  } else if (stride == 1) {
    for (int64_t t = 0; t < n; ++t) acc[t] += x[t];
  } else {
    for (int64_t t = 0; t < n; ++t) acc[t * stride] += x[t];
  }
}

// acc[view(start + j)] += r[j] for j < n, one run of the view at a time.
KILN_BLOCK_INLINE void Accumulate(const Reduction& red, int64_t start, int64_t n, const float* r,
                                  double* acc) {
  const Input& v = red.view;
  switch (v.view) {
    case View::kScalar: {
      // 32 independent lanes (two AVX-512 or four AVX2 accumulators): 8 lanes would make the
      // sum a chain of dependent adds, slower than the read stream of a gradient norm.
      float part[32] = {};
      int64_t j = 0;
      for (; j + 32 <= n; j += 32)
        for (int k = 0; k < 32; ++k) part[k] += r[j + k];
      double s = 0;
      for (int k = 0; k < 32; ++k) s += part[k];
      for (; j < n; ++j) s += r[j];
      acc[0] += s;
      return;
    }
    case View::kContiguous:
      AccumulateRun(r, n, 1, acc + start);
      return;
    case View::kRows: {
      int64_t k = start % v.inner;
      for (int64_t j = 0; j < n; k = 0) {
        const int64_t run = std::min(n - j, v.inner - k);
        AccumulateRun(r + j, run, 1, acc + k);
        j += run;
      }
      return;
    }
    case View::kCols: {
      int64_t row = start / v.inner, col = start % v.inner;
      for (int64_t j = 0; j < n; col = 0, ++row) {
        const int64_t run = std::min(n - j, v.inner - col);
        AccumulateRun(r + j, run, 0, acc + row % v.outer);
        j += run;
      }
      return;
    }
    case View::kStrided:
      ForEachStridedRun(v, start, n, [&](int64_t j, int64_t off, int64_t len, int64_t stride) {
        AccumulateRun(r + j, len, stride, acc + off);
      });
      return;
  }
}

KILN_BLOCK_INLINE void StoreOutput(const Output& o, void* base, int64_t start, int64_t n,
                                   const float* r) {
  switch (o.dtype) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(base) + start, r, n * sizeof(float));
      return;
    case DType::kBF16: {
      uint16_t* p = static_cast<uint16_t*>(base) + start;
      for (int64_t j = 0; j < n; ++j) p[j] = FloatToBf16Bits(r[j]);
      return;
    }
    default: {
      uint8_t* p = static_cast<uint8_t*>(base) + start;
      for (int64_t j = 0; j < n; ++j) p[j] = r[j] != 0.0f ? 1 : 0;
      return;
    }
  }
}

// Blocks [b0, b1) of a program: load, compute, accumulate, store. Compiled for AVX-512, AVX2 and
// the baseline ISA (base/isa_dispatch.h: the process's level picks one), every piece inlined.
KILN_BLOCK_INLINE void RunBlocksBody(const Program& p, const void* const* in_ptrs,
                                     void* const* out_ptrs, float** slot, double* acc, int64_t b0,
                                     int64_t b1) {
  for (int64_t blk = b0; blk < b1; ++blk) {
    int64_t start = blk * kBlock, n = std::min(kBlock, p.count - start);
    // The ops read one input stream at a time, a block each: prefetch the contiguous inputs
    // kPrefetchBlocks ahead so every stream has lines in flight.
    const int64_t ahead = start + kPrefetchBlocks * kBlock;
    if (ahead < p.count) {
      for (size_t i = 0; i < p.inputs.size(); ++i) {
        const Input& in = p.inputs[i];
        if (in.view != View::kContiguous) continue;
        const int64_t size = in.dtype == DType::kF32 ? 4 : in.dtype == DType::kBF16 ? 2 : 1;
        const char* q = static_cast<const char*>(in_ptrs[i]) + ahead * size;
        const int64_t bytes = std::min(kBlock, p.count - ahead) * size;
        for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(q + off, 0, 3);
      }
    }
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      const Input& in = p.inputs[i];
      if (in.direct)
        slot[in.reg] = const_cast<float*>(static_cast<const float*>(in_ptrs[i])) + start;
      else if (in.view != View::kScalar)
        LoadInput(in, in_ptrs[i], start, n, slot[in.reg]);
    }
    for (size_t i = 0; i < p.outputs.size(); ++i)
      if (p.outputs[i].direct) slot[p.outputs[i].reg] = static_cast<float*>(out_ptrs[i]) + start;
    // Full blocks run a copy of the ops with the trip count known at compile time.
    if (n == kBlock)
      RunCode(p.code.data(), static_cast<int>(p.code.size()), slot, kBlock);
    else
      RunCode(p.code.data(), static_cast<int>(p.code.size()), slot, n);
    for (const Reduction& red : p.reductions)
      Accumulate(red, start, n, slot[red.reg], acc + red.acc_offset);
    for (size_t i = 0; i < p.outputs.size(); ++i)
      if (!p.outputs[i].direct)
        StoreOutput(p.outputs[i], out_ptrs[i], start, n, slot[p.outputs[i].reg]);
  }
}

KILN_ISA_VARIANTS(void, RunBlocks,
                  (const Program& p, const void* const* in_ptrs, void* const* out_ptrs,
                   float** slot, double* acc, int64_t b0, int64_t b1),
                  (p, in_ptrs, out_ptrs, slot, acc, b0, b1))

// The view that reads `src` (of shape src_dims) broadcast into `out_dims` through
// broadcast_in_dim's `dims` (operand dim i -> output dim dims[i]; size-1 operand dims repeat).
void MakeBroadcastView(const std::vector<int64_t>& src_dims, const std::vector<int64_t>& dims,
                       const std::vector<int64_t>& out_dims, Input& in) {
  std::vector<int64_t> src_strides = RowMajorStrides(src_dims);
  std::vector<int64_t> strides(out_dims.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (src_dims[i] != 1) strides[dims[i]] = src_strides[i];
  // Collapse: drop unit dims, merge neighbours that are both broadcast or contiguous together.
  std::vector<int64_t> cd, cs;
  for (size_t d = 0; d < out_dims.size(); ++d) {
    if (out_dims[d] == 1) continue;
    if (!cd.empty()) {
      bool both_zero = cs.back() == 0 && strides[d] == 0;
      bool contiguous = strides[d] != 0 && cs.back() == strides[d] * out_dims[d];
      if (both_zero || contiguous) {
        cd.back() *= out_dims[d];
        cs.back() = strides[d];
        continue;
      }
    }
    cd.push_back(out_dims[d]);
    cs.push_back(strides[d]);
  }
  if (cd.empty() || (cd.size() == 1 && cs[0] == 0)) {
    in.view = View::kScalar;
  } else if (cd.size() == 1 && cs[0] == 1) {
    in.view = View::kContiguous;
  } else if (cd.size() == 2 && cs[0] == 0 && cs[1] == 1) {
    in.view = View::kRows;
    in.inner = cd[1];
  } else if (cd.size() == 2 && cs[0] == 1 && cs[1] == 0) {
    in.view = View::kCols;
    in.inner = cd[1];
    in.outer = cd[0];
  } else if (cd.size() == 3 && cs[0] == 0 && cs[1] == 1 && cs[2] == 0) {
    in.view = View::kCols;  // [outer-repeat, rows, inner-repeat]
    in.inner = cd[2];
    in.outer = cd[1];
  } else {
    in.view = View::kStrided;
    in.dims = cd;
    in.strides = cs;
  }
}

FOp CompareOp(const std::string& dir) {
  if (dir == "eq") return FOp::kEq;
  if (dir == "ne") return FOp::kNe;
  if (dir == "lt") return FOp::kLt;
  if (dir == "le") return FOp::kLe;
  if (dir == "gt") return FOp::kGt;
  return FOp::kGe;
}

// The instruction each loop-fusible op runs as. compare's instruction comes from its direction
// and convert's from its dtypes; reduce_sum (the one kLoopSink op) is accumulated, not run.
struct LoopOp {
  bool runs = false;
  FOp op = FOp::kAdd;
};
constexpr LoopOp LoopOpFor(Opcode op) {
  switch (op) {
    case Opcode::kAdd:
      return {true, FOp::kAdd};
    case Opcode::kSub:
      return {true, FOp::kSub};
    case Opcode::kMul:
      return {true, FOp::kMul};
    case Opcode::kDiv:
      return {true, FOp::kDiv};
    case Opcode::kMax:
      return {true, FOp::kMax};
    case Opcode::kMin:
      return {true, FOp::kMin};
    case Opcode::kNeg:
      return {true, FOp::kNeg};
    case Opcode::kAbs:
      return {true, FOp::kAbs};
    case Opcode::kRelu:
      return {true, FOp::kRelu};
    case Opcode::kSqrt:
      return {true, FOp::kSqrt};
    case Opcode::kRsqrt:
      return {true, FOp::kRsqrt};
    case Opcode::kExp:
      return {true, FOp::kExp};
    case Opcode::kTanh:
      return {true, FOp::kTanh};
    case Opcode::kSign:
      return {true, FOp::kSign};
    case Opcode::kSelect:
      return {true, FOp::kSelect};
    case Opcode::kLogicalAnd:
      return {true, FOp::kAnd};
    case Opcode::kLogicalOr:
      return {true, FOp::kOr};
    case Opcode::kLogicalNot:
      return {true, FOp::kNot};
    case Opcode::kCompare:
      return {true, FOp::kEq};  // by direction: CompareOp
    case Opcode::kConvert:
      return {true, FOp::kRoundBf16};  // by dtypes, or free
    default:
      return {};
  }
}
// The fusion pass groups exactly the kLoop / kLoopBool / kLoopSink rows of opcodes.def; a row
// marked fusible without an instruction here (or the reverse) fails the build.
constexpr bool RunsExactlyTheLoopFusibleOps() {
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    const auto op = static_cast<Opcode>(i);
    if (LoopOpFor(op).runs != ir::OpTraits(op).loop_fusible()) return false;
    if (ir::OpTraits(op).loop_sink() != (op == Opcode::kReduceSum)) return false;
  }
  return true;
}
static_assert(RunsExactlyTheLoopFusibleOps(),
              "fused_loop.cc LoopOpFor must cover exactly the loop-fusible ops of opcodes.def");

class FusedLoopThunk : public Thunk {
 public:
  FusedLoopThunk(std::string name, Program program, std::shared_ptr<CpuContext> cpu, int threads)
      : name_(std::move(name)), p_(std::move(program)), cpu_(std::move(cpu)), threads_(threads) {}

  void Run(RunContext& ctx) override {
    std::vector<const void*>& in_ptrs = in_ptrs_;
    for (size_t i = 0; i < p_.inputs.size(); ++i) in_ptrs[i] = ctx.buffers[p_.inputs[i].node];
    for (size_t i = 0; i < p_.outputs.size(); ++i) out_ptrs_[i] = ctx.buffers[p_.outputs[i].node];
    const int64_t count = p_.count;
    const int64_t blocks = (count + kBlock - 1) / kBlock;
    const int64_t per_thread_blocks = std::max<int64_t>(1, kElementwiseGrain / kBlock);
    int max_threads = omp_in_parallel() ? 1 : std::min(threads_, omp_get_max_threads());
    int64_t chunks =
        std::min<int64_t>(max_threads, (blocks + per_thread_blocks - 1) / per_thread_blocks);
    auto work = [&](int t, int64_t b0, int64_t b1) {
      float* regs = reinterpret_cast<float*>(cpu_->workspace()) +
                    static_cast<int64_t>(t) * p_.num_regs * kBlock;
      float* slot[kMaxSlots];
      for (int r = 0; r < p_.num_regs; ++r) slot[r] = regs + r * kBlock;
      double* acc = AccBase() + static_cast<int64_t>(t) * p_.acc_per_thread;
      std::fill(acc, acc + p_.acc_per_thread, 0.0);
      // Scalars are the same for every block: fill their (never reused) registers once.
      for (size_t i = 0; i < p_.inputs.size(); ++i)
        if (p_.inputs[i].view == View::kScalar)
          LoadInput(p_.inputs[i], in_ptrs[i], 0, kBlock, slot[p_.inputs[i].reg]);
      RunBlocks(p_, in_ptrs.data(), out_ptrs_.data(), slot, acc, b0, b1);
    };
    int used = 1;
    if (chunks <= 1) {
      work(0, 0, blocks);
    } else {
#pragma omp parallel num_threads(static_cast <int>(chunks))
      {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
        work(t, b0, b1);  // even an empty range zeroes its accumulators
#pragma omp single
        used = nt;
      }
    }
    // Reductions: the threads' partial sums, combined in thread order (deterministic for a
    // given thread count), rounded once on store.
    for (const Reduction& red : p_.reductions) {
      void* out = ctx.buffers[red.node];
      for (int64_t k = 0; k < red.out_count; ++k) {
        double s = 0;
        for (int t = 0; t < used; ++t) s += AccBase()[t * p_.acc_per_thread + red.acc_offset + k];
        float f = static_cast<float>(s);
        if (red.dtype == DType::kBF16)
          static_cast<uint16_t*>(out)[k] = FloatToBf16Bits(f);
        else
          static_cast<float*>(out)[k] = f;
      }
    }
  }
  std::string name() const override { return name_; }

  // `acc_offset`: where the reductions' per-thread accumulators start in the workspace.
  void Prepare(int64_t acc_offset) {
    acc_workspace_offset_ = acc_offset;
    in_ptrs_.resize(p_.inputs.size());
    out_ptrs_.resize(p_.outputs.size());
  }

 private:
  double* AccBase() const {
    return reinterpret_cast<double*>(cpu_->workspace() + acc_workspace_offset_);
  }

  int64_t acc_workspace_offset_ = 0;
  std::string name_;
  Program p_;
  std::shared_ptr<CpuContext> cpu_;
  int threads_;
  std::vector<const void*> in_ptrs_;
  std::vector<void*> out_ptrs_;
};

struct Pending {
  FOp op;
  int dst, a, b, c;  // value numbers
};

// The value number of fused input `r` (the same node through the same view is one input), adding
// it to p.inputs when new. Values 0..nm-1 are members; nm + k is input k.
int InputValue(const ir::Graph& g, const FusionReads::Read& r, const std::vector<int64_t>& out_dims,
               int nm, Program& p) {
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const Input& in = p.inputs[k];
    if (in.node != r.node) continue;
    Input probe;
    probe.node = r.node;
    if (r.broadcast_dims) {
      MakeBroadcastView(g.node(r.node).type().shape.dims(), *r.broadcast_dims, out_dims, probe);
    }
    if (probe.view == in.view && probe.inner == in.inner && probe.outer == in.outer &&
        probe.dims == in.dims && probe.strides == in.strides)
      return nm + static_cast<int>(k);
  }
  Input in;
  in.node = r.node;
  in.dtype = g.node(r.node).type().dtype;
  if (r.broadcast_dims)
    MakeBroadcastView(g.node(r.node).type().shape.dims(), *r.broadcast_dims, out_dims, in);
  p.inputs.push_back(in);
  return nm + static_cast<int>(p.inputs.size()) - 1;
}

// Reorders an f32 program (each value written once) so that the instructions reading an input
// buffer in place, with everything they depend on, come first, each part in program order (a
// valid order: the first part is closed under dependencies). The outputs defined in the second
// part can then be computed straight into their buffers (DirectOutputs).
void ReadsFirst(std::vector<Pending>& code, int nm, const Program& p) {
  const int nv = nm + static_cast<int>(p.inputs.size());
  std::vector<int> writer(nv, -1);
  for (int k = 0; k < static_cast<int>(code.size()); ++k) {
    if (writer[code[k].dst] >= 0) return;  // a rounding step: leave the order as it is
    writer[code[k].dst] = k;
  }
  std::vector<char> first(code.size(), 0);
  for (int k = static_cast<int>(code.size()) - 1; k >= 0; --k) {
    bool reads_direct = false;
    for (int v : {code[k].a, code[k].b, code[k].c}) {
      if (v < nm) continue;
      const Input& in = p.inputs[v - nm];
      reads_direct |= in.view == View::kContiguous && in.dtype == DType::kF32;
    }
    if (reads_direct) first[k] = 1;
    if (!first[k]) continue;
    for (int v : {code[k].a, code[k].b, code[k].c})
      if (v >= 0 && writer[v] >= 0) first[writer[v]] = 1;  // producers come earlier: k descends
  }
  std::vector<Pending> ordered;
  for (int pass = 1; pass >= 0; --pass)
    for (size_t k = 0; k < code.size(); ++k)
      if (first[k] == pass) ordered.push_back(code[k]);
  code = std::move(ordered);
}

// Register allocation over value numbers (0..nm-1 members, then inputs): a value's register is
// freed after its last read (outputs and inputs stay live to the end of the block: stores run
// last; inputs load first). Fills p.code, the registers of inputs, outputs and reductions, and
// p.num_regs / p.num_slots.
absl::Status AllocateRegisters(const std::vector<Pending>& code, const std::vector<int>& out_values,
                               const std::vector<int>& reduction_values, int nm,
                               const ir::Node& root, Program& p) {
  const int nv = nm + static_cast<int>(p.inputs.size());
  std::vector<int> last_use(nv, -1);
  for (size_t k = 0; k < code.size(); ++k)
    for (int v : {code[k].a, code[k].b, code[k].c})
      if (v >= 0) last_use[v] = std::max<int>(last_use[v], static_cast<int>(k));
  for (int v : out_values) last_use[v] = static_cast<int>(code.size()) + 1;
  for (int v : reduction_values) last_use[v] = static_cast<int>(code.size()) + 1;
  std::vector<int> reg(nv, -1), free_regs;
  int num_regs = 0;
  auto alloc = [&]() {
    if (!free_regs.empty()) {
      int r = free_regs.back();
      free_regs.pop_back();
      return r;
    }
    return num_regs++;
  };
  // f32 contiguous inputs are read in place (pointer slots numbered after the registers);
  // scalar inputs keep their register for the whole run (filled once per thread).
  std::vector<char> pinned(nv, 0);
  for (int k = 0; k < static_cast<int>(p.inputs.size()); ++k) {
    Input& in = p.inputs[k];
    in.direct = in.view == View::kContiguous && in.dtype == DType::kF32;
    if (in.direct) continue;
    reg[nm + k] = alloc();
    if (in.view == View::kScalar) pinned[nm + k] = 1;
  }
  for (size_t k = 0; k < code.size(); ++k) {
    const Pending& c = code[k];
    if (reg[c.dst] < 0) reg[c.dst] = alloc();
    // Operands whose last read is this instruction free their register afterwards, unless the
    // destination is the same value (a rounding step in place).
    for (int v : {c.a, c.b, c.c})
      if (v >= 0 && v != c.dst && reg[v] >= 0 && !pinned[v] && last_use[v] == static_cast<int>(k)) {
        bool dup = false;
        for (int r : free_regs) dup |= r == reg[v];
        if (!dup) free_regs.push_back(reg[v]);
      }
  }
  // Direct inputs take the slots after the scratch registers.
  int num_slots = num_regs;
  for (int k = 0; k < static_cast<int>(p.inputs.size()); ++k)
    if (p.inputs[k].direct) reg[nm + k] = num_slots++;
  if (num_slots > kMaxSlots)
    return Unimplemented(root, absl::StrCat("fusion group needs ", num_slots,
                                            " registers; the kernel has ", kMaxSlots));
  for (size_t k = 0; k < code.size(); ++k) {
    const Pending& c = code[k];
    auto scalar = [&](int v) { return v >= nm && p.inputs[v - nm].view == View::kScalar; };
    p.code.push_back(
        {c.op, static_cast<int16_t>(reg[c.dst]), static_cast<int16_t>(reg[c.a]),
         static_cast<int16_t>(c.b >= 0 ? reg[c.b] : -1),
         static_cast<int16_t>(c.c >= 0 ? reg[c.c] : -1),
         static_cast<uint8_t>((scalar(c.a) ? 1 : 0) | (c.b >= 0 && scalar(c.b) ? 2 : 0))});
  }
  for (size_t k = 0; k < p.inputs.size(); ++k) p.inputs[k].reg = static_cast<int16_t>(reg[nm + k]);
  for (size_t k = 0; k < p.outputs.size(); ++k)
    p.outputs[k].reg = static_cast<int16_t>(reg[out_values[k]]);
  for (size_t k = 0; k < p.reductions.size(); ++k)
    p.reductions[k].reg = static_cast<int16_t>(reg[reduction_values[k]]);
  p.num_regs = std::max(num_regs, 1);
  p.num_slots = std::max(num_slots, 1);
  return absl::OkStatus();
}

// Lets the f32 outputs defined at or after the last instruction that reads an input buffer in
// place (a direct input) be computed straight into their buffers, so every input read of a block
// still comes before any output write (an output may share its buffer with an input). The
// output's register belongs to it from its defining instruction on, so those references move to a
// new pointer slot.
void DirectOutputs(Program& p) {
  int last_direct_read = -1;
  for (int k = 0; k < static_cast<int>(p.code.size()); ++k)
    for (int r : {p.code[k].a, p.code[k].b, p.code[k].c})
      if (r >= p.num_regs) last_direct_read = k;
  for (Output& o : p.outputs) {
    if (o.dtype != DType::kF32 || o.reg >= p.num_regs || p.num_slots >= kMaxSlots) continue;
    int def = -1;
    for (int k = 0; k < static_cast<int>(p.code.size()); ++k)
      if (p.code[k].dst == o.reg) def = k;
    if (def < 0 || def < last_direct_read) continue;
    const int16_t from = o.reg, to = static_cast<int16_t>(p.num_slots++);
    p.code[def].dst = to;
    for (size_t k = def + 1; k < p.code.size(); ++k)
      for (int16_t* r : {&p.code[k].dst, &p.code[k].a, &p.code[k].b, &p.code[k].c})
        if (*r == from) *r = to;
    for (Reduction& red : p.reductions)
      if (red.reg == from) red.reg = to;
    for (Output& other : p.outputs)
      if (other.reg == from) other.reg = to;  // `o` itself, or an output of the same value
    o.direct = true;
  }
}

// Whether the group runs over values held channel-blocked (layout.cc: all its same-shape inputs
// and outputs are, or none): element i of every operand is element i of the others, so the
// elementwise code is the same; a sum over H and W accumulates through the blocked index space
// [N, C/L, H*W, L], L = ChannelBlock().
bool RunsBlocked(const std::vector<int>& members, const FusionReads& reads,
                 const LowerContext& lc) {
  for (int m : members) {
    if (lc.is_blocked(m)) return true;
    for (const FusionReads::Read& r : reads.at(m))
      if (r.broadcast_dims == nullptr && lc.is_blocked(r.node)) return true;
  }
  return false;
}

// A reduce_sum member `n` of a group over `out_dims`: a sink, accumulated after the block's ops
// through a view of its kept dims (appended to p.reductions).
absl::Status AddReduction(const ir::Graph& g, const ir::Node& n,
                          const std::vector<int64_t>& out_dims, bool blocked, Program& p) {
  Reduction red;
  red.node = n.id();
  red.dtype = n.type().dtype;
  red.out_count = n.type().shape.num_elements();
  const std::vector<int64_t>& reduced = n.attr_ints("dimensions");
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < static_cast<int64_t>(out_dims.size()); ++d)
    if (std::find(reduced.begin(), reduced.end(), d) == reduced.end()) kept.push_back(d);
  if (blocked) {
    if (!IsSpatialSum(n, g))
      return absl::InternalError(ThunkName(n, "fused loop") +
                                 ": reduces a blocked value other than over H, W");
    const int64_t L = ChannelBlock();
    const int64_t N = out_dims[0], CB = out_dims[1] / L, HW = out_dims[2] * out_dims[3];
    MakeBroadcastView({N, CB, L}, {0, 1, 3}, {N, CB, HW, L}, red.view);
  } else {
    MakeBroadcastView(n.type().shape.dims(), kept, out_dims, red.view);
  }
  red.acc_offset = p.acc_per_thread;
  p.acc_per_thread += red.out_count;
  p.reductions.push_back(red);
  return absl::OkStatus();
}

}  // namespace

LowerResult LowerFusedLoop(const std::vector<int>& members, const FusionReads& reads,
                           const std::vector<char>& needed, LowerContext& lc) {
  const ir::Graph& g = lc.graph;
  const ir::Node& root = g.node(members.back());
  Program p;
  // The group's index space: its elementwise members' shape (a reduction may come last).
  const ir::Node* shaped = &root;
  for (int m : members)
    if (g.node(m).opcode() != Opcode::kReduceSum) {
      shaped = &g.node(m);
      break;
    }
  p.count = shaped->type().shape.num_elements();
  const std::vector<int64_t>& out_dims = shaped->type().shape.dims();

  // Value numbering: group member -> register (after allocation); inputs first.
  std::map<int, int> member_index;
  for (size_t i = 0; i < members.size(); ++i) member_index[members[i]] = static_cast<int>(i);
  // Values: 0..members-1 are members; members + k is input k. A convert between f32 and bf16 in
  // the f32 -> bf16 direction rounds; bf16 -> f32 and bool -> float conversions are free.
  const int nm = static_cast<int>(members.size());
  std::vector<int> value_of_member(nm, -1);  // a member may alias another value (free convert)
  auto input_value = [&](int member, int operand_index) {
    return InputValue(g, reads.at(member)[operand_index], out_dims, nm, p);
  };

  const bool blocked = RunsBlocked(members, reads, lc);

  std::vector<Pending> code;
  std::vector<int> reduction_values;  // per reduction: the value it accumulates
  for (int i = 0; i < nm; ++i) {
    const ir::Node& n = g.node(members[i]);
    std::vector<int> ops;
    for (int k = 0; k < static_cast<int>(n.operands().size()); ++k) {
      int o = n.operand(k);
      auto it = member_index.find(o);
      ops.push_back(it != member_index.end() ? value_of_member[it->second]
                                             : input_value(n.id(), k));
    }
    DType t = n.type().dtype;
    auto emit = [&](FOp op, int a, int b = -1, int c = -1) {
      code.push_back({op, i, a, b, c});
      value_of_member[i] = i;
      if (t == DType::kBF16 && op != FOp::kRoundBf16)
        code.push_back({FOp::kRoundBf16, i, i, -1, -1});
    };
    switch (n.opcode()) {
      case Opcode::kCompare:
        emit(CompareOp(n.attr_str("direction")), ops[0], ops[1]);
        break;
      case Opcode::kConvert: {
        DType from = g.node(n.operand(0)).type().dtype;
        if (t == DType::kBool) {
          emit(FOp::kToBool, ops[0]);
        } else if (t == DType::kBF16 && from == DType::kF32) {
          emit(FOp::kRoundBf16, ops[0]);
          code.back().op = FOp::kRoundBf16;
        } else {
          value_of_member[i] = ops[0];  // widening or bool -> float: the same value
        }
        break;
      }
      case Opcode::kReduceSum: {
        // A sink: accumulated after the block's ops, through a view of its kept dims. One that
        // nothing reads (dead code the pipeline kept) has no buffer and is skipped.
        if (!needed[n.id()]) break;
        KILN_RETURN_IF_ERROR(AddReduction(g, n, out_dims, blocked, p));
        reduction_values.push_back(ops[0]);
        break;
      }
      default: {
        const LoopOp lo = LoopOpFor(n.opcode());
        if (!lo.runs) return Unimplemented(n, "not a loop-fusible op");
        const int arity = static_cast<int>(ops.size());
        emit(lo.op, ops[0], arity > 1 ? ops[1] : -1, arity > 2 ? ops[2] : -1);
        break;
      }
    }
  }

  // Outputs: members needed outside the group (reductions store their own results).
  std::vector<int> out_values;
  for (int i = 0; i < nm; ++i) {
    int id = members[i];
    if (!needed[id] || g.node(id).opcode() == Opcode::kReduceSum) continue;
    p.outputs.push_back({id, g.node(id).type().dtype, 0});
    out_values.push_back(value_of_member[i]);
  }

  ReadsFirst(code, nm, p);
  KILN_RETURN_IF_ERROR(AllocateRegisters(code, out_values, reduction_values, nm, root, p));
  DirectOutputs(p);

  int threads = std::max(1, omp_get_max_threads());
  const int64_t acc_offset = AlignUp(static_cast<int64_t>(threads) * p.num_regs * kBlock * 4);
  lc.cpu->RequireWorkspace(acc_offset +
                           static_cast<int64_t>(threads) * p.acc_per_thread * sizeof(double));
  std::string name = absl::StrCat("fusion ", g.FusionGroupOf(members.front()), " %",
                                  members.front(), "..%", members.back(), " (loop: ", nm, " ops, ",
                                  p.inputs.size(), " in, ", p.outputs.size(), " out)");
  auto thunk = std::make_unique<FusedLoopThunk>(std::move(name), std::move(p), lc.cpu, threads);
  thunk->Prepare(acc_offset);
  return std::unique_ptr<Thunk>(std::move(thunk));
}

}  // namespace kiln::runtime::cpu
