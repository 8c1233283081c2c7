// Private to the reference backend: the kernel type, one factory per op family, and the small
// helpers every family shares (element access in double or exact int64, index arithmetic).
//
// A factory checks the node's dtypes and attributes once, at compile time, and returns a Kernel:
// a closure that reads its operands from ctx.buffers[operand id] and writes ctx.buffers[node id].
//
//   KILN_ASSIGN_OR_RETURN(Kernel k, MakeElementwiseKernel(graph, node));
//   k(ctx);
#ifndef KILN_RUNTIME_REFERENCE_KERNELS_H_
#define KILN_RUNTIME_REFERENCE_KERNELS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/philox.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/executable.h"
#include "kiln/tensor/dtype.h"

namespace kiln::runtime::reference {

using Kernel = std::function<void(RunContext&)>;

// Family factories. Each handles the opcodes listed in its .cc file and returns InvalidArgument
// for a dtype or attribute the op does not allow.
absl::StatusOr<Kernel> MakeElementwiseKernel(const ir::Graph& g, const ir::Node& n);
absl::StatusOr<Kernel> MakeStructuralKernel(const ir::Graph& g, const ir::Node& n);
absl::StatusOr<Kernel> MakeReductionKernel(const ir::Graph& g, const ir::Node& n);
absl::StatusOr<Kernel> MakeContractionKernel(const ir::Graph& g, const ir::Node& n);
absl::StatusOr<Kernel> MakePoolingKernel(const ir::Graph& g, const ir::Node& n);
absl::StatusOr<Kernel> MakeCompositeKernel(const ir::Graph& g, const ir::Node& n);
absl::StatusOr<Kernel> MakeRandomKernel(const ir::Graph& g, const ir::Node& n);

// Philox4x32-10: one block of four 32-bit words from a 128-bit counter and a 64-bit key (the one
// implementation, base/philox.h, which the cpu backend's random_bits runs too).
using ::kiln::Philox4x32;

// ---- Shared helpers ----

// The dtype classes ops accept, or-ed together: floats = f64 f32 bf16 f16 (not the f8 storage
// types); ints = s8 u8 s32 s64; bool; any = every dtype, f8 included.
inline constexpr unsigned kFloatTypes = 1, kIntTypes = 2, kBoolTypes = 4, kAnyTypes = 8;
// OK when `t` is in `allowed`; otherwise InvalidArgument naming the
// node, e.g. "reference backend: exp %3: dtype s32 is not supported (operand 0)".
absl::Status CheckDType(const ir::Node& n, DType t, unsigned allowed, const std::string& what);
absl::Status Unsupported(const ir::Node& n, const std::string& why);

inline const void* In(const RunContext& ctx, int id) { return ctx.buffers[id]; }
inline void* Out(RunContext& ctx, int id) { return ctx.buffers[id]; }

// Row-major linear index <-> multi-index.
inline void Unravel(int64_t linear, const std::vector<int64_t>& dims, std::vector<int64_t>& idx) {
  idx.resize(dims.size());
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    int64_t n = dims[d];
    idx[d] = n > 0 ? linear % n : 0;
    linear = n > 0 ? linear / n : 0;
  }
}
inline int64_t Ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& strides) {
  int64_t linear = 0;
  for (size_t d = 0; d < idx.size(); ++d) linear += idx[d] * strides[d];
  return linear;
}

// Splits `shape` around `axis` into outer (product of dims before), size (dims[axis]) and inner
// (product of dims after), so element (o, k, i) is at (o * size + k) * inner + i.
struct AxisSplit {
  int64_t outer = 1, size = 1, inner = 1;
};
inline AxisSplit SplitAt(const Shape& shape, int axis) {
  AxisSplit s;
  for (int d = 0; d < shape.rank(); ++d) {
    if (d < axis)
      s.outer *= shape.dim(d);
    else if (d == axis)
      s.size = shape.dim(d);
    else
      s.inner *= shape.dim(d);
  }
  return s;
}

// The operand types of n.
inline const ir::Type& OperandType(const ir::Graph& g, const ir::Node& n, int i) {
  return g.node(n.operand(i)).type();
}

}  // namespace kiln::runtime::reference

#endif  // KILN_RUNTIME_REFERENCE_KERNELS_H_
