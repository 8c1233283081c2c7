// The builder: records ops into a Graph, inferring each node's type as it goes. The first error
// sticks; every later op returns an invalid Value (builder set, id -1) and adds nothing.
#include "kiln/ir/builder.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/shape_inference.h"

namespace kiln::ir {
namespace {

const Type& InvalidType() {
  static const Type* const t = new Type{DType::kF32, Shape{}};
  return *t;
}

std::string Name(Opcode op) { return std::string(OpcodeName(op)); }

absl::Status Err(const std::string& op, const std::string& msg) {
  return absl::InvalidArgumentError(op + ": " + msg);
}

// The first builder any of `vs` belongs to (an invalid Value may still know its builder).
Builder* OwnerOf(const std::vector<Value>& vs) {
  for (const Value& v : vs)
    if (v.builder() != nullptr) return v.builder();
  return nullptr;
}

Value Invalid(const std::vector<Value>& vs) { return Value(OwnerOf(vs), -1); }

// The builder shared by `vs` when every value is valid and no error is recorded yet; otherwise
// nullptr, recording why when it is a new error.
Builder* Ready(const std::string& op, const std::vector<Value>& vs) {
  Builder* b = OwnerOf(vs);
  if (b == nullptr || !b->status().ok()) return nullptr;
  for (size_t i = 0; i < vs.size(); ++i) {
    if (!vs[i].valid()) {
      b->SetError(Err(op, "operand " + std::to_string(i) + " is not a valid value"));
      return nullptr;
    }
    if (vs[i].builder() != b) {
      b->SetError(Err(op, "operand " + std::to_string(i) + " belongs to another builder"));
      return nullptr;
    }
  }
  return b;
}

int64_t NormalizeAxis(int64_t axis, int rank) { return axis < 0 ? axis + rank : axis; }

std::vector<int64_t> NormalizeAxes(std::vector<int64_t> axes, int rank) {
  for (int64_t& a : axes) a = NormalizeAxis(a, rank);
  return axes;
}

// numpy broadcasting of two shapes: right-aligned, size-1 dims stretch.
bool BroadcastShapes(const Shape& a, const Shape& b, Shape* out) {
  int r = std::max(a.rank(), b.rank());
  std::vector<int64_t> dims(r);
  for (int i = 0; i < r; ++i) {
    int ia = a.rank() - r + i, ib = b.rank() - r + i;
    int64_t da = ia >= 0 ? a.dim(ia) : 1, db = ib >= 0 ? b.dim(ib) : 1;
    if (da != db && da != 1 && db != 1) return false;
    dims[i] = da == 1 ? db : da;
  }
  *out = Shape(dims);
  return true;
}

// Broadcasts every value to a common shape (naming all shapes on failure).
bool BroadcastAll(Builder* b, const std::string& op, std::vector<Value>& vs) {
  Shape s = vs[0].shape();
  for (size_t i = 1; i < vs.size(); ++i) {
    if (!BroadcastShapes(s, vs[i].shape(), &s)) {
      std::string all;
      for (size_t j = 0; j < vs.size(); ++j) all += (j ? " with " : "") + vs[j].type().ToString();
      b->SetError(Err(op, "cannot broadcast " + all));
      return false;
    }
  }
  for (Value& v : vs) {
    v = BroadcastTo(v, s);
    if (!v.valid()) return false;
  }
  return true;
}

Value Unary(Opcode op, Value x, AttrMap attrs = {}) {
  Builder* b = Ready(Name(op), {x});
  if (b == nullptr) return Invalid({x});
  // The one unary attribute with a default: gelu is the exact (erf) form unless told otherwise.
  if (op == Opcode::kGelu) attrs.try_emplace("approximate", std::string("none"));
  return b->AddNode(op, {x}, std::move(attrs));
}

Value Binary(Opcode op, Value x, Value y, AttrMap attrs = {}) {
  Builder* b = Ready(Name(op), {x, y});
  if (b == nullptr) return Invalid({x, y});
  if (x.dtype() != y.dtype()) {
    b->SetError(Err(
        Name(op), "operand dtypes differ: " + x.type().ToString() + " vs " + y.type().ToString()));
    return Invalid({x});
  }
  std::vector<Value> vs = {x, y};
  if (!BroadcastAll(b, Name(op), vs)) return Invalid({x});
  return b->AddNode(op, vs, std::move(attrs));
}

Value ScalarLike(Value x, double s) {
  if (!x.valid() || !x.builder()->status().ok()) return Invalid({x});
  return x.builder()->Scalar(s, x.dtype());
}

AttrMap ConvAttrs(const Conv2dOptions& o) {
  return {{"strides", o.strides},
          {"padding", o.padding},
          {"dilation", o.dilation},
          {"groups", o.groups}};
}

AttrMap PoolAttrs(const Pool2dOptions& o, bool avg) {
  AttrMap m = {{"window", o.window}, {"strides", o.strides}, {"padding", o.padding}};
  if (avg) m["count_include_pad"] = int64_t{o.count_include_pad ? 1 : 0};
  return m;
}

Value Reduce(Opcode op, Value x, std::vector<int64_t> dims) {
  Builder* b = Ready(Name(op), {x});
  if (b == nullptr) return Invalid({x});
  dims = NormalizeAxes(std::move(dims), x.rank());
  std::sort(dims.begin(), dims.end());
  return b->AddNode(op, {x}, {{"dimensions", dims}});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Value and Builder

const Type& Value::type() const {
  if (!valid()) return InvalidType();
  return builder_->type_of(id_);
}

Builder::Builder(std::string name) : graph_(std::move(name)) {}

const Type& Builder::type_of(int id) const {
  if (id < 0 || id >= static_cast<int>(types_.size())) return InvalidType();
  return types_[id];
}

Value Builder::Record(int id) {
  types_.push_back(graph_.node(id).type());
  return Value(this, id);
}

void Builder::SetError(absl::Status s) {
  if (status_.ok() && !s.ok()) status_ = std::move(s);
}

Value Builder::AddNode(Opcode op, const std::vector<Value>& operands, AttrMap attrs,
                       std::optional<Type> declared) {
  if (!status_.ok()) return Value(this, -1);
  std::vector<Type> types;
  std::vector<int> ids;
  for (size_t i = 0; i < operands.size(); ++i) {
    const Value& v = operands[i];
    if (v.builder() != this || v.id() < 0 || v.id() >= graph_.num_nodes()) {
      SetError(Err(Name(op), "operand " + std::to_string(i) +
                                 (v.builder() != nullptr && v.builder() != this
                                      ? " belongs to another builder"
                                      : " is not a valid value")));
      return Value(this, -1);
    }
    types.push_back(v.type());
    ids.push_back(v.id());
  }
  absl::StatusOr<Type> t = InferType(op, types, attrs, declared);
  if (!t.ok()) {
    SetError(t.status());
    return Value(this, -1);
  }
  return Record(graph_.AddNode(op, std::move(ids), *std::move(t), std::move(attrs)));
}

Value Builder::Parameter(const std::string& name, DType dtype, Shape shape) {
  if (!status_.ok()) return Value(this, -1);
  if (graph_.FindParameter(name) >= 0) {
    SetError(Err("parameter", "duplicate parameter name '" + name + "'"));
    return Value(this, -1);
  }
  Value v = AddNode(Opcode::kParameter, {}, {{"index", int64_t{next_param_index_}}, {"name", name}},
                    Type{dtype, std::move(shape)});
  if (v.valid()) ++next_param_index_;
  return v;
}

Value Builder::Constant(Tensor value) {
  if (!status_.ok()) return Value(this, -1);
  auto literal = std::make_shared<const Tensor>(std::move(value));
  Type declared{literal->dtype(), literal->shape()};
  absl::StatusOr<Type> t = InferType(Opcode::kConstant, {}, {}, declared);
  if (!t.ok()) {
    SetError(t.status());
    return Value(this, -1);
  }
  return Record(graph_.AddNode(Opcode::kConstant, {}, *std::move(t), {}, std::move(literal)));
}

Value Builder::Scalar(double v, DType dtype) {
  Tensor t(dtype, Shape{});
  t.SetDouble(0, v);
  return Constant(std::move(t));
}

Value Builder::Iota(DType dtype, Shape shape, int64_t dimension) {
  int64_t dim = NormalizeAxis(dimension, shape.rank());
  return AddNode(Opcode::kIota, {}, {{"dimension", dim}}, Type{dtype, std::move(shape)});
}

void Builder::Output(const std::string& name, Value v) {
  if (!status_.ok()) return;
  if (v.builder() != this || !v.valid() || v.id() >= graph_.num_nodes()) {
    SetError(Err("output", "output '" + name + "' is not a valid value of this builder"));
    return;
  }
  if (graph_.FindOutput(name) >= 0) {
    SetError(Err("output", "duplicate output name '" + name + "'"));
    return;
  }
  graph_.AddOutput(name, v.id());
}

void Builder::Output(const std::string& name, Value v, Value in_place_of) {
  if (!status_.ok()) return;
  if (in_place_of.builder() != this || !in_place_of.valid() ||
      in_place_of.id() >= graph_.num_nodes() ||
      graph_.node(in_place_of.id()).opcode() != Opcode::kParameter) {
    SetError(Err("output", "output '" + name + "' is in place of something not a parameter"));
    return;
  }
  if (v.valid() && v.builder() == this && v.id() < graph_.num_nodes() &&
      graph_.node(v.id()).type() != graph_.node(in_place_of.id()).type()) {
    SetError(Err("output", "output '" + name + "' is " + graph_.node(v.id()).type().ToString() +
                               " but the parameter it is in place of is " +
                               graph_.node(in_place_of.id()).type().ToString()));
    return;
  }
  Output(name, v);
  if (status_.ok())
    graph_.SetOutputInPlaceOf(graph_.outputs().size() - 1,
                              graph_.node(in_place_of.id()).attr_int("index"));
}

absl::StatusOr<Graph> Builder::Build() {
  absl::Status s = std::move(status_);
  Graph g = std::move(graph_);
  graph_ = Graph(g.name());
  types_.clear();
  status_ = absl::OkStatus();
  next_param_index_ = 0;
  if (!s.ok()) return s;
  return g;
}

// ---------------------------------------------------------------------------------------------
// Elementwise

// One function per kUnary / kBinary row of opcodes.def (declared the same way in builder.h).
#define KILN_IR_DEFINE_kUnary(name) \
  Value name(Value x) { return Unary(Opcode::k##name, x); }
#define KILN_IR_DEFINE_kBinary(name) \
  Value name(Value a, Value b) { return Binary(Opcode::k##name, a, b); }
#define KILN_OP(name, text, arity, kind, family, ...) KILN_IR_DEFINE_##family(name)
#include "kiln/ir/internal/other_families.h"
#include "kiln/ir/opcodes.def"
#undef KILN_OP
#undef KILN_IR_DEFINE_kUnary
#undef KILN_IR_DEFINE_kBinary

Value ElementwiseUnary(Opcode op, Value x) { return Unary(op, x); }
Value ElementwiseBinary(Opcode op, Value a, Value b) { return Binary(op, a, b); }

Value Gelu(Value x, bool tanh_approximation) {
  return Unary(Opcode::kGelu, x,
               {{"approximate", std::string(tanh_approximation ? "tanh" : "none")}});
}
Value LogicalNot(Value x) { return Unary(Opcode::kLogicalNot, x); }

Value Convert(Value x, DType dtype) {
  Builder* b = Ready("convert", {x});
  if (b == nullptr) return Invalid({x});
  if (x.dtype() == dtype) return x;
  return b->AddNode(Opcode::kConvert, {x}, {}, Type{dtype, x.shape()});
}

Value LogicalAnd(Value a, Value b) { return Binary(Opcode::kLogicalAnd, a, b); }
Value LogicalOr(Value a, Value b) { return Binary(Opcode::kLogicalOr, a, b); }

Value Compare(Value a, Value b, CompareDirection dir) {
  static const char* const kNames[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  return Binary(Opcode::kCompare, a, b,
                {{"direction", std::string(kNames[static_cast<int>(dir)])}});
}
Value Eq(Value a, Value b) { return Compare(a, b, CompareDirection::kEq); }
Value Ne(Value a, Value b) { return Compare(a, b, CompareDirection::kNe); }
Value Lt(Value a, Value b) { return Compare(a, b, CompareDirection::kLt); }
Value Le(Value a, Value b) { return Compare(a, b, CompareDirection::kLe); }
Value Gt(Value a, Value b) { return Compare(a, b, CompareDirection::kGt); }
Value Ge(Value a, Value b) { return Compare(a, b, CompareDirection::kGe); }

Value Select(Value pred, Value on_true, Value on_false) {
  Builder* b = Ready("select", {pred, on_true, on_false});
  if (b == nullptr) return Invalid({pred, on_true, on_false});
  std::vector<Value> vs = {pred, on_true, on_false};
  if (!BroadcastAll(b, "select", vs)) return Invalid({pred});
  return b->AddNode(Opcode::kSelect, vs);
}

Value operator+(Value a, Value b) { return Add(a, b); }
Value operator-(Value a, Value b) { return Sub(a, b); }
Value operator*(Value a, Value b) { return Mul(a, b); }
Value operator/(Value a, Value b) { return Div(a, b); }
Value operator-(Value a) { return Neg(a); }
Value operator+(Value a, double s) { return Add(a, ScalarLike(a, s)); }
Value operator+(double s, Value a) { return Add(ScalarLike(a, s), a); }
Value operator-(Value a, double s) { return Sub(a, ScalarLike(a, s)); }
Value operator-(double s, Value a) { return Sub(ScalarLike(a, s), a); }
Value operator*(Value a, double s) { return Mul(a, ScalarLike(a, s)); }
Value operator*(double s, Value a) { return Mul(ScalarLike(a, s), a); }
Value operator/(Value a, double s) { return Div(a, ScalarLike(a, s)); }
Value operator/(double s, Value a) { return Div(ScalarLike(a, s), a); }

// ---------------------------------------------------------------------------------------------
// Shape and data movement

Value BroadcastInDim(Value x, Shape shape, std::vector<int64_t> broadcast_dimensions) {
  Builder* b = Ready("broadcast_in_dim", {x});
  if (b == nullptr) return Invalid({x});
  return b->AddNode(Opcode::kBroadcastInDim, {x},
                    {{"shape", shape.dims()},
                     {"broadcast_dimensions", NormalizeAxes(broadcast_dimensions, shape.rank())}});
}

Value BroadcastTo(Value x, Shape shape) {
  Builder* b = Ready("broadcast_in_dim", {x});
  if (b == nullptr) return Invalid({x});
  if (x.shape() == shape) return x;
  int offset = shape.rank() - x.rank();
  bool ok = offset >= 0;
  for (int i = 0; ok && i < x.rank(); ++i)
    if (x.shape().dim(i) != 1 && x.shape().dim(i) != shape.dim(i + offset)) ok = false;
  if (!ok) {
    b->SetError(Err("broadcast_in_dim", "cannot broadcast " + x.type().ToString() + " to " +
                                            shape.ToString() + " (numpy rules)"));
    return Invalid({x});
  }
  std::vector<int64_t> bd(x.rank());
  for (int i = 0; i < x.rank(); ++i) bd[i] = i + offset;
  return b->AddNode(Opcode::kBroadcastInDim, {x},
                    {{"shape", shape.dims()}, {"broadcast_dimensions", bd}});
}

Value Reshape(Value x, Shape shape) {
  Builder* b = Ready("reshape", {x});
  if (b == nullptr) return Invalid({x});
  // One dim may be -1: inferred from the element count.
  std::vector<int64_t> dims = shape.dims();
  int unknown = -1;
  int64_t known = 1;
  for (int i = 0; i < static_cast<int>(dims.size()); ++i) {
    if (dims[i] == -1 && unknown < 0) {
      unknown = i;
    } else {
      known *= dims[i];
    }
  }
  if (unknown >= 0) {
    int64_t n = x.shape().num_elements();
    if (known <= 0 || n % known != 0) {
      b->SetError(
          Err("reshape", "cannot reshape " + x.type().ToString() + " to " + shape.ToString()));
      return Invalid({x});
    }
    dims[unknown] = n / known;
  }
  if (dims == x.shape().dims()) return x;
  return b->AddNode(Opcode::kReshape, {x}, {{"shape", dims}});
}

Value Transpose(Value x, std::vector<int64_t> permutation) {
  Builder* b = Ready("transpose", {x});
  if (b == nullptr) return Invalid({x});
  permutation = NormalizeAxes(std::move(permutation), x.rank());
  bool identity = static_cast<int>(permutation.size()) == x.rank();
  for (size_t i = 0; identity && i < permutation.size(); ++i)
    if (permutation[i] != static_cast<int64_t>(i)) identity = false;
  if (identity) return x;
  return b->AddNode(Opcode::kTranspose, {x}, {{"permutation", permutation}});
}

Value Slice(Value x, std::vector<int64_t> start, std::vector<int64_t> limit,
            std::vector<int64_t> stride) {
  Builder* b = Ready("slice", {x});
  if (b == nullptr) return Invalid({x});
  if (stride.empty()) stride.assign(start.size(), 1);
  return b->AddNode(Opcode::kSlice, {x}, {{"start", start}, {"limit", limit}, {"stride", stride}});
}

Value Concatenate(const std::vector<Value>& xs, int64_t dimension) {
  Builder* b = Ready("concatenate", xs);
  if (b == nullptr) return Invalid(xs);
  return b->AddNode(Opcode::kConcatenate, xs,
                    {{"dimension", NormalizeAxis(dimension, xs[0].rank())}});
}

Value Pad(Value x, std::vector<int64_t> low, std::vector<int64_t> high,
          std::vector<int64_t> interior, double value) {
  Builder* b = Ready("pad", {x});
  if (b == nullptr) return Invalid({x});
  if (interior.empty()) interior.assign(low.size(), 0);
  return b->AddNode(Opcode::kPad, {x},
                    {{"low", low}, {"high", high}, {"interior", interior}, {"value", value}});
}

Value Gather(Value table, Value indices, int64_t axis) {
  Builder* b = Ready("gather", {table, indices});
  if (b == nullptr) return Invalid({table, indices});
  return b->AddNode(Opcode::kGather, {table, indices},
                    {{"axis", NormalizeAxis(axis, table.rank())}});
}

Value ScatterAdd(Value operand, Value indices, Value updates, int64_t axis) {
  Builder* b = Ready("scatter_add", {operand, indices, updates});
  if (b == nullptr) return Invalid({operand, indices, updates});
  return b->AddNode(Opcode::kScatterAdd, {operand, indices, updates},
                    {{"axis", NormalizeAxis(axis, operand.rank())}});
}

// ---------------------------------------------------------------------------------------------
// Reductions

Value ReduceSum(Value x, std::vector<int64_t> dimensions) {
  return Reduce(Opcode::kReduceSum, x, std::move(dimensions));
}
Value ReduceMax(Value x, std::vector<int64_t> dimensions) {
  return Reduce(Opcode::kReduceMax, x, std::move(dimensions));
}
Value ReduceMin(Value x, std::vector<int64_t> dimensions) {
  return Reduce(Opcode::kReduceMin, x, std::move(dimensions));
}

Value Mean(Value x, std::vector<int64_t> dimensions) {
  Value sum = ReduceSum(x, dimensions);
  if (!sum.valid()) return sum;
  // The sum's rule validated the dims; divide by the number of elements each output sums.
  int64_t count = 1;
  for (int64_t d : NormalizeAxes(dimensions, x.rank())) count *= x.dim(static_cast<int>(d));
  return sum / static_cast<double>(count);
}

Value ArgMax(Value x, int64_t axis) {
  Builder* b = Ready("argmax", {x});
  if (b == nullptr) return Invalid({x});
  return b->AddNode(Opcode::kArgmax, {x}, {{"axis", NormalizeAxis(axis, x.rank())}});
}

// ---------------------------------------------------------------------------------------------
// Contractions

Value DotGeneral(Value lhs, Value rhs, const DotDims& dims) {
  Builder* b = Ready("dot_general", {lhs, rhs});
  if (b == nullptr) return Invalid({lhs, rhs});
  return b->AddNode(Opcode::kDotGeneral, {lhs, rhs},
                    {{"lhs_batch", NormalizeAxes(dims.lhs_batch, lhs.rank())},
                     {"rhs_batch", NormalizeAxes(dims.rhs_batch, rhs.rank())},
                     {"lhs_contracting", NormalizeAxes(dims.lhs_contracting, lhs.rank())},
                     {"rhs_contracting", NormalizeAxes(dims.rhs_contracting, rhs.rank())}});
}

Value MatMul(Value a, Value b) {
  Builder* bld = Ready("matmul", {a, b});
  if (bld == nullptr) return Invalid({a, b});
  int ra = a.rank(), rb = b.rank();
  if (ra == 0 || rb == 0) {
    bld->SetError(Err("matmul", "operands must have rank >= 1, got " + a.type().ToString() +
                                    " and " + b.type().ToString()));
    return Invalid({a});
  }
  // A vector or a rank-2 rhs needs no batch dims: contract directly (rhs weights are shared).
  if (rb == 1) return DotGeneral(a, b, {{}, {}, {ra - 1}, {0}});
  if (ra == 1) return DotGeneral(a, b, {{}, {}, {0}, {rb - 2}});
  if (rb == 2) return DotGeneral(a, b, {{}, {}, {ra - 1}, {0}});
  // Batched: broadcast the leading dims numpy-style, then one dot_general with batch dims.
  Shape a_batch(std::vector<int64_t>(a.shape().dims().begin(), a.shape().dims().end() - 2));
  Shape b_batch(std::vector<int64_t>(b.shape().dims().begin(), b.shape().dims().end() - 2));
  Shape batch;
  if (!BroadcastShapes(a_batch, b_batch, &batch)) {
    bld->SetError(Err("matmul", "batch dims do not broadcast: " + a.type().ToString() + " and " +
                                    b.type().ToString()));
    return Invalid({a});
  }
  auto with_batch = [&](Value v) {
    std::vector<int64_t> dims = batch.dims();
    dims.push_back(v.dim(-2));
    dims.push_back(v.dim(-1));
    return BroadcastTo(v, Shape(dims));
  };
  a = with_batch(a);
  b = with_batch(b);
  int n = batch.rank();
  DotDims d;
  for (int i = 0; i < n; ++i) {
    d.lhs_batch.push_back(i);
    d.rhs_batch.push_back(i);
  }
  d.lhs_contracting = {n + 1};
  d.rhs_contracting = {n};
  return DotGeneral(a, b, d);
}

Value Conv2d(Value input, Value filter, const Conv2dOptions& opts) {
  Builder* b = Ready("conv2d", {input, filter});
  if (b == nullptr) return Invalid({input, filter});
  return b->AddNode(Opcode::kConv2d, {input, filter}, ConvAttrs(opts));
}

Value Conv2dBackwardInput(Value grad_out, Value filter, Shape input_shape,
                          const Conv2dOptions& opts) {
  Builder* b = Ready("conv2d_backward_input", {grad_out, filter});
  if (b == nullptr) return Invalid({grad_out, filter});
  AttrMap attrs = ConvAttrs(opts);
  attrs["input_shape"] = input_shape.dims();
  return b->AddNode(Opcode::kConv2dBackwardInput, {grad_out, filter}, std::move(attrs));
}

Value Conv2dBackwardFilter(Value input, Value grad_out, Shape filter_shape,
                           const Conv2dOptions& opts) {
  Builder* b = Ready("conv2d_backward_filter", {input, grad_out});
  if (b == nullptr) return Invalid({input, grad_out});
  AttrMap attrs = ConvAttrs(opts);
  attrs["filter_shape"] = filter_shape.dims();
  return b->AddNode(Opcode::kConv2dBackwardFilter, {input, grad_out}, std::move(attrs));
}

Value Quantize(Value x, float scale) {
  return Unary(Opcode::kQuantize, x, {{"scale", static_cast<double>(scale)}});
}

Value QuantizedDot(Value x, Value w, Value scale) {
  Builder* b = Ready("quantized_dot", {x, w, scale});
  if (b == nullptr) return Invalid({x, w, scale});
  return b->AddNode(Opcode::kQuantizedDot, {x, w, scale}, {});
}

Value QuantizedConv2d(Value input, Value filter, Value scale, const Conv2dOptions& opts) {
  Builder* b = Ready("quantized_conv2d", {input, filter, scale});
  if (b == nullptr) return Invalid({input, filter, scale});
  return b->AddNode(Opcode::kQuantizedConv2d, {input, filter, scale}, ConvAttrs(opts));
}

Value MaxPool2d(Value x, const Pool2dOptions& opts) {
  return Unary(Opcode::kMaxPool2d, x, PoolAttrs(opts, /*avg=*/false));
}

Value MaxPool2dGrad(Value x, Value grad_out, const Pool2dOptions& opts) {
  Builder* b = Ready("max_pool2d_grad", {x, grad_out});
  if (b == nullptr) return Invalid({x, grad_out});
  return b->AddNode(Opcode::kMaxPool2dGrad, {x, grad_out}, PoolAttrs(opts, /*avg=*/false));
}

Value AvgPool2d(Value x, const Pool2dOptions& opts) {
  return Unary(Opcode::kAvgPool2d, x, PoolAttrs(opts, /*avg=*/true));
}

Value AvgPool2dGrad(Value grad_out, Shape input_shape, const Pool2dOptions& opts) {
  AttrMap attrs = PoolAttrs(opts, /*avg=*/true);
  attrs["input_shape"] = input_shape.dims();
  return Unary(Opcode::kAvgPool2dGrad, grad_out, std::move(attrs));
}

// ---------------------------------------------------------------------------------------------
// Composites

Value Softmax(Value x, int64_t axis) {
  return Unary(Opcode::kSoftmax, x, {{"axis", NormalizeAxis(axis, x.rank())}});
}

Value LogSoftmax(Value x, int64_t axis) {
  return Unary(Opcode::kLogSoftmax, x, {{"axis", NormalizeAxis(axis, x.rank())}});
}

Value LayerNorm(Value x, Value gamma, Value beta, double epsilon) {
  Builder* b = Ready("layer_norm", {x, gamma, beta});
  if (b == nullptr) return Invalid({x, gamma, beta});
  return b->AddNode(Opcode::kLayerNorm, {x, gamma, beta}, {{"epsilon", epsilon}});
}

Value RmsNorm(Value x, Value gamma, double epsilon) {
  Builder* b = Ready("rms_norm", {x, gamma});
  if (b == nullptr) return Invalid({x, gamma});
  return b->AddNode(Opcode::kRmsNorm, {x, gamma}, {{"epsilon", epsilon}});
}

Value SparseCrossEntropy(Value logits, Value labels) {
  Builder* b = Ready("cross_entropy", {logits, labels});
  if (b == nullptr) return Invalid({logits, labels});
  return b->AddNode(Opcode::kCrossEntropy, {logits, labels});
}

Value Attention(Value q, Value k, Value v, bool causal, std::optional<double> scale) {
  Builder* b = Ready("attention", {q, k, v});
  if (b == nullptr) return Invalid({q, k, v});
  // With a malformed q the default does not matter: the shape rule rejects the op.
  double s = scale.has_value()                  ? *scale
             : (q.rank() >= 1 && q.dim(-1) > 0) ? 1.0 / std::sqrt(static_cast<double>(q.dim(-1)))
                                                : 1.0;
  return b->AddNode(Opcode::kAttention, {q, k, v},
                    {{"causal", int64_t{causal ? 1 : 0}}, {"scale", s}});
}

// ---------------------------------------------------------------------------------------------
// Randomness

Value RandomBits(Value seed, Value counter, DType dtype, Shape shape) {
  Builder* b = Ready("random_bits", {seed, counter});
  if (b == nullptr) return Invalid({seed, counter});
  return b->AddNode(Opcode::kRandomBits, {seed, counter}, {}, Type{dtype, std::move(shape)});
}

Value Dropout(Value x, double rate, Value seed, Value counter) {
  Builder* b = Ready("dropout", {x, seed, counter});
  if (b == nullptr) return Invalid({x, seed, counter});
  if (!(rate >= 0.0 && rate < 1.0)) {
    b->SetError(Err("dropout", "rate must be in [0, 1), got " + std::to_string(rate)));
    return Invalid({x});
  }
  if (!IsFloating(x.dtype()) || IsStorageOnly(x.dtype())) {
    b->SetError(Err("dropout", "x must be floating-point, got " + x.type().ToString()));
    return Invalid({x});
  }
  if (rate == 0.0) return x;
  Value u = RandomBits(seed, counter, DType::kF32, x.shape());
  Value keep = Ge(u, b->Scalar(rate, DType::kF32));
  return Select(keep, x / (1.0 - rate), b->Scalar(0.0, x.dtype()));
}

// ---------------------------------------------------------------------------------------------
// Collectives

Value AllReduce(Value x) {
  return Unary(Opcode::kAllReduce, x, {{"reduction", std::string("sum")}});
}

Value AllGather(Value x, int64_t dimension, int64_t replicas) {
  return Unary(Opcode::kAllGather, x,
               {{"dimension", NormalizeAxis(dimension, x.rank())}, {"replicas", replicas}});
}

Value ReduceScatter(Value x, int64_t dimension, int64_t replicas) {
  return Unary(Opcode::kReduceScatter, x,
               {{"dimension", NormalizeAxis(dimension, x.rank())}, {"replicas", replicas}});
}

}  // namespace kiln::ir
