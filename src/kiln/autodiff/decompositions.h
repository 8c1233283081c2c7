// Decompositions of the composite ops (kind kComposite in opcodes.def) into primitives. The
// compiler's decompose pass (compiler/passes/decompose.h) applies them to graphs; the VJP rules
// reuse the pieces (attention probabilities, one-hot labels) when building backward graphs.
//
//   ir::Value p = DecomposeSoftmax(scores, /*axis=*/-1);     // max-subtracted exp / sum
//   KILN_ASSIGN_OR_RETURN(ir::Value y, DecomposeNode(node, operands));
//
// Semantics match the reference backend's composite kernels (runtime/reference/composite.cc).
// Numerics: softmax, log_softmax and cross_entropy subtract the row max before exp;
// layer_norm uses the biased (population) variance, like PyTorch; causal attention sets masked
// scores to -inf, so (as in PyTorch and the reference) a query row that sees no key at all (only
// possible when Sq > Sk) comes out NaN.
#ifndef KILN_AUTODIFF_DECOMPOSITIONS_H_
#define KILN_AUTODIFF_DECOMPOSITIONS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"

namespace kiln::autodiff {

// Axes may be negative (counted from the end), as in the builder.
ir::Value DecomposeSoftmax(ir::Value x, int64_t axis);
ir::Value DecomposeLogSoftmax(ir::Value x, int64_t axis);
// x [..., D], gamma [D], beta [D]; normalizes over the last dim.
ir::Value DecomposeLayerNorm(ir::Value x, ir::Value gamma, ir::Value beta, double epsilon);
ir::Value DecomposeRmsNorm(ir::Value x, ir::Value gamma, double epsilon);
// logits [..., C], labels [...] (s32/s64) -> per-example loss [...]: logsumexp - picked logit.
// A label outside [0, C) gives a loss of 0 (like PyTorch's ignore_index).
ir::Value DecomposeCrossEntropy(ir::Value logits, ir::Value labels);
// q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] -> [..., Sq, Dv].
ir::Value DecomposeAttention(ir::Value q, ir::Value k, ir::Value v, bool causal, double scale);

// Pieces shared with the VJP rules.
// scale * q k^T, with masked (k > q + Sk - Sq) entries set to -inf when causal: [..., Sq, Sk].
ir::Value AttentionScores(ir::Value q, ir::Value k, bool causal, double scale);
// 1 where the class index equals the label, else 0, in `dtype`: labels [...] -> [..., C].
// The bool [..., num_classes] "class == label" of OneHot, before it becomes 1 / 0.
ir::Value LabelHit(ir::Value labels, int64_t num_classes);
ir::Value OneHot(ir::Value labels, int64_t num_classes, DType dtype);
// True where 0 <= label < num_classes: labels [...] -> bool [...].
ir::Value ValidLabels(ir::Value labels, int64_t num_classes);

// Decomposes composite node `n` whose operands are `operands` (Values in one Builder).
// InvalidArgument when `n` is not a composite op.
absl::StatusOr<ir::Value> DecomposeNode(const ir::Node& n, const std::vector<ir::Value>& operands);

}  // namespace kiln::autodiff

#endif  // KILN_AUTODIFF_DECOMPOSITIONS_H_
