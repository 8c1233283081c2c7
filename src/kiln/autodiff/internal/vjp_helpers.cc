#include "kiln/autodiff/internal/vjp_helpers.h"

namespace kiln::autodiff::internal {

ir::Value Zero(const ir::Value& like) { return like.builder()->Scalar(0.0, like.dtype()); }

ir::Value Zeros(ir::Builder* b, ir::Type type) {
  return ir::BroadcastInDim(b->Scalar(0.0, type.dtype), type.shape, {});
}

ir::Value BroadcastReduced(ir::Value r, Shape shape, const std::vector<int64_t>& reduced) {
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < shape.rank(); ++i) {
    bool is_reduced = false;
    for (int64_t d : reduced) is_reduced |= (d == i);
    if (!is_reduced) kept.push_back(i);
  }
  return ir::BroadcastInDim(r, shape, kept);
}

ir::Value SumLeading(ir::Value x, int keep) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank() - keep; ++i) dims.push_back(i);
  if (dims.empty()) return x;
  return ir::ReduceSum(x, dims);
}

ir::Value ReshapeIfNeeded(ir::Value x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return ir::Reshape(x, shape);
}

ir::Value TransposeIfNeeded(ir::Value x, const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return ir::Transpose(x, perm);
  return x;
}

ir::Conv2dOptions ConvOptionsOf(const ir::Node& n) {
  ir::Conv2dOptions o;
  o.strides = n.attr_ints("strides");
  o.padding = n.attr_ints("padding");
  o.dilation = n.attr_ints("dilation");
  o.groups = n.attr_int("groups");
  return o;
}

ir::Pool2dOptions PoolOptionsOf(const ir::Node& n) {
  ir::Pool2dOptions o;
  o.window = n.attr_ints("window");
  o.strides = n.attr_ints("strides");
  o.padding = n.attr_ints("padding");
  if (n.has_attr("count_include_pad")) o.count_include_pad = n.attr_int("count_include_pad") != 0;
  return o;
}

}  // namespace kiln::autodiff::internal
