// Small graph-building helpers shared by the VJP rules (vjp_rules.cc).
//
// Shapes and types are taken by value on purpose: Value::shape() refers into the builder's node
// list, which moves when nodes are added, so a reference must not be held across node creation.
//
//   ir::Value z = Zeros(b, x.type());                       // broadcast scalar 0
//   ir::Value g = BroadcastReduced(r, x.shape(), {1});      // undo reduce_sum over dim 1
#ifndef KILN_AUTODIFF_INTERNAL_VJP_HELPERS_H_
#define KILN_AUTODIFF_INTERNAL_VJP_HELPERS_H_

#include <cstdint>
#include <vector>

#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"

namespace kiln::autodiff::internal {

// A scalar 0 of `like`'s dtype (binary ops and select broadcast it).
ir::Value Zero(const ir::Value& like);

// A zero tensor of `type` (a broadcast scalar constant).
ir::Value Zeros(ir::Builder* b, ir::Type type);

// Broadcasts `r`, the result of reducing a tensor of shape `shape` over `reduced` dims, back to
// `shape`.
ir::Value BroadcastReduced(ir::Value r, Shape shape, const std::vector<int64_t>& reduced);

// Sums x over all leading dims, keeping the last `keep` dims: [a, b, D] -> [D] for keep = 1.
ir::Value SumLeading(ir::Value x, int keep);

// Reshapes only when the shape differs.
ir::Value ReshapeIfNeeded(ir::Value x, const Shape& shape);

// Transposes only when `perm` is not the identity.
ir::Value TransposeIfNeeded(ir::Value x, const std::vector<int64_t>& perm);

// Conv and pooling options read back from a node's attributes.
ir::Conv2dOptions ConvOptionsOf(const ir::Node& n);
ir::Pool2dOptions PoolOptionsOf(const ir::Node& n);

}  // namespace kiln::autodiff::internal

#endif  // KILN_AUTODIFF_INTERNAL_VJP_HELPERS_H_
