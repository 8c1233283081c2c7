// Algebraic simplification ("algebraic"): local identities that remove work without changing
// results.
//
//   %3 = add(%0, %2)     # %2 = broadcast_in_dim(constant 0.0)      ->   uses of %3 read %0
//   %5 = transpose(%4) {permutation=[1,0]}  # %4 = transpose(%0) {permutation=[1,0]}  ->  %0
//
// "Zero" / "one" below means a constant, or a broadcast_in_dim / reshape chain over one, whose
// every element is exactly 0 / 1 (-0.0 counts as zero).
// What it rewrites:
// - add(x, 0), add(0, x), sub(x, 0)                        -> x
// - mul(x, 1), mul(1, x), div(x, 1)                        -> x
// - mul(x, 0), mul(0, x)                                   -> 0, integer dtypes only
// - neg(neg(x))                                            -> x
// - transpose(x) with the identity permutation             -> x
// - transpose(transpose(x, p), q)                          -> transpose(x, p o q), or x
// - reshape(x) to x's own shape                            -> x
// - reshape(reshape(x))                                    -> reshape(x), or x
// - broadcast_in_dim(x) to x's shape, dims 0..r-1          -> x
// - broadcast_in_dim(broadcast_in_dim(x))                  -> one broadcast_in_dim (or x)
// - convert(x) to x's dtype                                -> x
// - convert(convert(x, T1), T2) where every value of x's dtype is exactly representable in T1
//   (e.g. f32 -> f64, bf16 -> f32, s8 -> s32, u8 -> bf16)  -> convert(x, T2), or x if T2 = x's
// - select(p, a, b) with p all true / all false            -> a / b
// - select(p, a, a)                                        -> a
// - select(p, 1, 0) with p bool                            -> convert(p)
// - slice(x) of the full range with stride 1               -> x
// - reduce_sum(select(broadcast(iota[C]) == broadcast(L), x, 0)) over x's last dim [..., C],
//   L integer labels (or their f32 convert)                -> select(0 <= L < C, gather of
//   x.flat[row * C + L], 0): the label logit of each row (the cross-entropy gradient's) in one
//   read per row instead of a pass over x
// What it leaves alone: x * 0 for floats (NaN * 0 and inf * 0 are NaN), x - x, x / x, 0 - x
// (sign of zero), any other convert pair (f32 -> bf16 -> f32 rounds), and everything else.
// Exactness: every rewrite gives bit-identical results except that the sign of a zero result may
// differ: add(x, 0) with x = -0.0 computes +0.0 but becomes -0.0 (x - 0 is exact); XLA makes the
// same trade. NaN payloads are not preserved through the convert pair rule (NaN stays NaN).
// Cost: one pass over the nodes; each constant is scanned at most once (memoized).
#ifndef KILN_COMPILER_PASSES_ALGEBRAIC_H_
#define KILN_COMPILER_PASSES_ALGEBRAIC_H_

#include <string>

#include "kiln/compiler/pass.h"
#include "kiln/tensor/dtype.h"

namespace kiln::compiler {

class AlgebraicSimplifierPass : public Pass {
 public:
  std::string name() const override { return "algebraic"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;
};

// True when every value of `from` converts to `to` and back unchanged (NaN stays NaN), so a
// convert through `to` loses nothing.
bool ConvertIsExact(DType from, DType to);

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_ALGEBRAIC_H_
