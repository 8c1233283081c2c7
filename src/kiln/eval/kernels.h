// The tensor-level evaluator (kiln::eval, between ir and compiler in the layers of DESIGN.md §1,
// as XLA keeps its HloEvaluator beside the IR): every op in opcodes.def as plain loops over host
// buffers, computing in double (exact int64 for integer ops) and rounding once to the result
// dtype. It depends on ir, tensor and base only. The reference backend
// (runtime/reference/reference_backend.h) wraps each kernel in a thunk, and the constant folder
// (compiler/passes/constant_fold.cc) calls EvaluateNode, so a folded constant is bit for bit what
// the backend would compute.
//
//   KILN_ASSIGN_OR_RETURN(Tensor y, eval::EvaluateNode(node, {&a, &b}));    // one node on tensors
//
//   KILN_ASSIGN_OR_RETURN(eval::Kernel k, eval::MakeKernel(node, operand_types)); // checked once
//   k(buffers);  // buffers[i] = operand i's data, buffers[node.operands().size()] = the result's
//
// A factory checks the node's dtypes and attributes once and returns a Kernel, or InvalidArgument
// for a dtype or attribute the op does not allow (f8 outside data movement and convert, integers
// in transcendental ops, more than one replica in a collective). Errors name the reference
// backend, whose oracle these kernels are.
#ifndef KILN_EVAL_KERNELS_H_
#define KILN_EVAL_KERNELS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kiln/base/philox.h"
#include "kiln/ir/graph.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/tensor.h"

namespace kiln::eval {

// A kernel's buffers by slot: operand i at [i], the result at [ResultSlot(node)].
using Buffers = absl::Span<void* const>;
using Kernel = std::function<void(Buffers)>;
// What a factory reads besides the node: its operands' types, in operand order.
using OperandTypes = absl::Span<const ir::Type>;

inline int ResultSlot(const ir::Node& n) { return static_cast<int>(n.operands().size()); }

// The kernel of any op but parameter and constant (which have none: a caller supplies their
// data). Unimplemented for those two.
absl::StatusOr<Kernel> MakeKernel(const ir::Node& n, OperandTypes types);

// Runs n's kernel on `operands` (one per operand of n, with the types n was inferred from) and
// returns the result. The error MakeKernel gives, or InvalidArgument for a missing operand or
// one whose type is not the one n expects.
absl::StatusOr<Tensor> EvaluateNode(const ir::Node& n, absl::Span<const Tensor* const> operands);

// Family factories. Each handles the opcodes listed in its .cc file.
absl::StatusOr<Kernel> MakeElementwiseKernel(const ir::Node& n, OperandTypes types);
absl::StatusOr<Kernel> MakeStructuralKernel(const ir::Node& n, OperandTypes types);
absl::StatusOr<Kernel> MakeReductionKernel(const ir::Node& n, OperandTypes types);
absl::StatusOr<Kernel> MakeContractionKernel(const ir::Node& n, OperandTypes types);
absl::StatusOr<Kernel> MakePoolingKernel(const ir::Node& n, OperandTypes types);
absl::StatusOr<Kernel> MakeCompositeKernel(const ir::Node& n, OperandTypes types);
absl::StatusOr<Kernel> MakeRandomKernel(const ir::Node& n, OperandTypes types);
absl::StatusOr<Kernel> MakeQuantizedKernel(const ir::Node& n, OperandTypes types);  // quantized.cc

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

inline const void* In(Buffers b, int slot) { return b[slot]; }
inline void* Out(Buffers b, int slot) { return b[slot]; }

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

}  // namespace kiln::eval

#endif  // KILN_EVAL_KERNELS_H_
