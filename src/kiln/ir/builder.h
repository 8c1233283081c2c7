// The C++ builder: models are ordinary C++ that calls these functions; the builder records a
// static-shape SSA graph. Binary ops broadcast numpy-style, made explicit in the IR as
// broadcast_in_dim nodes.
//
//   Builder b("mlp");
//   Value x = b.Parameter("x", DType::kF32, {32, 64});
//   Value w = b.Parameter("w", DType::kF32, {64, 10});
//   Value y = Relu(MatMul(x, w) + 1.0f);       // scalar broadcast
//   b.Output("loss", ReduceSum(y, {0, 1}));
//   absl::StatusOr<Graph> g = b.Build();         // first error, if any, is returned here
//
// Errors (shape mismatches, bad attributes) do not throw: the builder records the first one,
// later ops become no-ops, and Build() returns it. Value::type() of a failed op is f32[].
#ifndef KILN_IR_BUILDER_H_
#define KILN_IR_BUILDER_H_

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

class Builder;

// A handle to a node being built. Cheap to copy.
class Value {
 public:
  Value() = default;
  Value(Builder* b, int id) : builder_(b), id_(id) {}

  Builder* builder() const { return builder_; }
  int id() const { return id_; }
  bool valid() const { return builder_ != nullptr && id_ >= 0; }
  const Type& type() const;
  DType dtype() const { return type().dtype; }
  const Shape& shape() const { return type().shape; }
  int rank() const { return shape().rank(); }
  int64_t dim(int i) const { return shape().dim(i < 0 ? i + rank() : i); }

 private:
  Builder* builder_ = nullptr;
  int id_ = -1;
};

class Builder {
 public:
  explicit Builder(std::string name = "main");
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  // Parameters get consecutive indices in creation order.
  Value Parameter(const std::string& name, DType dtype, Shape shape);
  Value Constant(Tensor value);
  // A scalar constant of `dtype`.
  Value Scalar(double v, DType dtype);
  Value Iota(DType dtype, Shape shape, int64_t dimension);
  // The generic entry point every op function uses: infers the type, records an error if any.
  Value AddNode(Opcode op, const std::vector<Value>& operands, AttrMap attrs = {},
                std::optional<Type> declared = std::nullopt);
  void Output(const std::string& name, Value v);
  // An output computed in place of parameter `in_place_of` (of v's type): Output::in_place_of.
  void Output(const std::string& name, Value v, Value in_place_of);

  // Records `s` as the builder's error if it has none yet.
  void SetError(absl::Status s);
  const absl::Status& status() const { return status_; }
  const Graph& graph() const { return graph_; }
  const Type& type_of(int id) const;

  // Returns the graph, or the first error recorded. The builder is left empty.
  absl::StatusOr<Graph> Build();

 private:
  // Records a node's type in types_ (kept beside graph_) and returns the node's Value.
  Value Record(int id);

  Graph graph_;
  // Node types in a deque: Value::type() hands out references that must stay valid while more
  // nodes are added (graph_.nodes() is a vector and reallocates).
  std::deque<Type> types_;
  absl::Status status_;
  int next_param_index_ = 0;
};

// ---- Plain elementwise ops: one function per kUnary / kBinary row of opcodes.def ----
// Abs(x), Cos(x), ..., Tanh(x); Add(a, b), Sub(a, b), ..., Min(a, b) (binary ones broadcast
// numpy-style). Generated from the rows, so a new plain op needs no edit here.
#define KILN_IR_DECLARE_kUnary(name) Value name(Value x);
#define KILN_IR_DECLARE_kBinary(name) Value name(Value a, Value b);
#define KILN_OP(name, text, arity, kind, family, ...) KILN_IR_DECLARE_##family(name)
#include "kiln/ir/internal/other_families.h"  // the other families declare nothing
#include "kiln/ir/opcodes.def"
#undef KILN_OP
#undef KILN_IR_DECLARE_kUnary
#undef KILN_IR_DECLARE_kBinary

// The same by opcode, for code that iterates the rows (the op tests): any unary op without
// required attributes, and any binary op (broadcasting numpy-style).
Value ElementwiseUnary(Opcode op, Value x);
Value ElementwiseBinary(Opcode op, Value a, Value b);

// gelu with its attribute: approximate="tanh" when tanh_approximation (Gelu(x) is the exact form).
Value Gelu(Value x, bool tanh_approximation);

// ---- Other elementwise ops ----
Value LogicalNot(Value x);
Value Convert(Value x, DType dtype);
Value LogicalAnd(Value a, Value b);
Value LogicalOr(Value a, Value b);
enum class CompareDirection { kEq, kNe, kLt, kLe, kGt, kGe };
Value Compare(Value a, Value b, CompareDirection dir);
Value Eq(Value a, Value b);
Value Ne(Value a, Value b);
Value Lt(Value a, Value b);
Value Le(Value a, Value b);
Value Gt(Value a, Value b);
Value Ge(Value a, Value b);
// pred ? on_true : on_false, all three broadcast together.
Value Select(Value pred, Value on_true, Value on_false);

Value operator+(Value a, Value b);
Value operator-(Value a, Value b);
Value operator*(Value a, Value b);
Value operator/(Value a, Value b);
Value operator-(Value a);
// Scalars take the dtype of the Value.
Value operator+(Value a, double s);
Value operator+(double s, Value a);
Value operator-(Value a, double s);
Value operator-(double s, Value a);
Value operator*(Value a, double s);
Value operator*(double s, Value a);
Value operator/(Value a, double s);
Value operator/(double s, Value a);

// ---- Shape and data movement ----
Value BroadcastInDim(Value x, Shape shape, std::vector<int64_t> broadcast_dimensions);
// numpy-style: right-aligned, size-1 dims stretch.
Value BroadcastTo(Value x, Shape shape);
Value Reshape(Value x, Shape shape);
Value Transpose(Value x, std::vector<int64_t> permutation);
Value Slice(Value x, std::vector<int64_t> start, std::vector<int64_t> limit,
            std::vector<int64_t> stride = {});
Value Concatenate(const std::vector<Value>& xs, int64_t dimension);
Value Pad(Value x, std::vector<int64_t> low, std::vector<int64_t> high,
          std::vector<int64_t> interior = {}, double value = 0.0);
Value Gather(Value table, Value indices, int64_t axis = 0);
Value ScatterAdd(Value operand, Value indices, Value updates, int64_t axis = 0);

// ---- Reductions ----
Value ReduceSum(Value x, std::vector<int64_t> dimensions);
Value ReduceMax(Value x, std::vector<int64_t> dimensions);
Value ReduceMin(Value x, std::vector<int64_t> dimensions);
Value Mean(Value x, std::vector<int64_t> dimensions);
Value ArgMax(Value x, int64_t axis);

// ---- Contractions ----
struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contracting, rhs_contracting;
};
Value DotGeneral(Value lhs, Value rhs, const DotDims& dims);
// numpy matmul for rank >= 2 operands with equal leading (batch) dims; rank-2 rhs broadcasts
// over lhs's leading dims (e.g. [B,S,D] x [D,F] -> [B,S,F]).
Value MatMul(Value a, Value b);

struct Conv2dOptions {
  std::vector<int64_t> strides = {1, 1};
  std::vector<int64_t> padding = {0, 0, 0, 0};  // top, bottom, left, right
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
};
Value Conv2d(Value input, Value filter, const Conv2dOptions& opts = {});
Value Conv2dBackwardInput(Value grad_out, Value filter, Shape input_shape,
                          const Conv2dOptions& opts);
Value Conv2dBackwardFilter(Value input, Value grad_out, Shape filter_shape,
                           const Conv2dOptions& opts);

// ---- int8 (post-training quantization; docs/ops.md "Quantized ops") ----
// f32 -> s8: clamp(rint(x / scale), -127, 127) (one f32 division, half to even; NaN -> 0).
Value Quantize(Value x, float scale);
// s8 x[..., K], s8 w[K, N], f32 scale[N] -> f32[..., N] = f32(exact int32 sum) * scale[n].
Value QuantizedDot(Value x, Value w, Value scale);
// s8 input NCHW, s8 filter OIHW, f32 scale[O] -> f32 (conv2d's geometry) = f32(int32 sum) *
// scale[o].
Value QuantizedConv2d(Value input, Value filter, Value scale, const Conv2dOptions& opts = {});

struct Pool2dOptions {
  std::vector<int64_t> window = {2, 2};
  std::vector<int64_t> strides = {2, 2};
  std::vector<int64_t> padding = {0, 0, 0, 0};  // top, bottom, left, right
  bool count_include_pad = false;               // avg pooling only
};
Value MaxPool2d(Value x, const Pool2dOptions& opts = {});
Value MaxPool2dGrad(Value x, Value grad_out, const Pool2dOptions& opts);
Value AvgPool2d(Value x, const Pool2dOptions& opts = {});
Value AvgPool2dGrad(Value grad_out, Shape input_shape, const Pool2dOptions& opts);

// ---- Composites (each has a decomposition into primitives: compiler/passes/decompose.h) ----
Value Softmax(Value x, int64_t axis = -1);
Value LogSoftmax(Value x, int64_t axis = -1);
Value LayerNorm(Value x, Value gamma, Value beta, double epsilon = 1e-5);
Value RmsNorm(Value x, Value gamma, double epsilon = 1e-6);
// Per-example loss: logits [..., C], integer labels [...] -> [...].
Value SparseCrossEntropy(Value logits, Value labels);
// q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv]; scale defaults to 1/sqrt(D).
Value Attention(Value q, Value k, Value v, bool causal = false,
                std::optional<double> scale = std::nullopt);

// ---- Randomness (stateless, counter-based) ----
// seed and counter are s64 scalars. dtype s32 gives raw bits, f32 uniform [0, 1).
Value RandomBits(Value seed, Value counter, DType dtype, Shape shape);
// Inverted dropout: keeps each element with probability 1 - rate and scales by 1/(1 - rate).
Value Dropout(Value x, double rate, Value seed, Value counter);

// ---- Collectives (identity in a single-process run) ----
Value AllReduce(Value x);
Value AllGather(Value x, int64_t dimension, int64_t replicas);
Value ReduceScatter(Value x, int64_t dimension, int64_t replicas);

}  // namespace kiln::ir

#endif  // KILN_IR_BUILDER_H_
