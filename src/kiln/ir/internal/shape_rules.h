// Private helpers shared by the shape-inference rule files (shape_inference.cc and
// shape_inference_nn.cc). Not part of the IR's public API.
//
//   RuleContext c(Opcode::kAdd, operands, attrs);
//   KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
//   KILN_ASSIGN_OR_RETURN(int64_t axis, c.Int("axis"));
//   return c.Error("bad things: " + c.T(0));   // "add: bad things: f32[2,3]"
#ifndef KILN_IR_INTERNAL_SHAPE_RULES_H_
#define KILN_IR_INTERNAL_SHAPE_RULES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::ir::internal {

// "[1,2,3]"
std::string IntsToString(const std::vector<int64_t>& v);

class RuleContext {
 public:
  RuleContext(Opcode op, const std::vector<Type>& operands, const AttrMap& attrs,
              const std::optional<Type>& declared)
      : op_(op), operands_(operands), attrs_(attrs), declared_(declared) {}

  Opcode op() const { return op_; }
  std::string name() const { return std::string(OpcodeName(op_)); }
  const Type& in(int i) const { return operands_[i]; }
  const Shape& shape(int i) const { return operands_[i].shape; }
  int rank(int i) const { return operands_[i].shape.rank(); }
  int num_operands() const { return static_cast<int>(operands_.size()); }
  const std::optional<Type>& declared() const { return declared_; }
  // Operand i's type as text, e.g. "f32[2,3]".
  std::string T(int i) const { return operands_[i].ToString(); }

  // InvalidArgument "<op>: <msg>".
  absl::Status Error(const std::string& msg) const;

  // Required attributes of one kind. Float accepts an int attribute too.
  absl::StatusOr<int64_t> Int(const std::string& attr) const;
  absl::StatusOr<double> Float(const std::string& attr) const;
  absl::StatusOr<std::string> Str(const std::string& attr) const;
  absl::StatusOr<std::vector<int64_t>> Ints(const std::string& attr) const;
  // An int list attribute of exactly `size` entries, each >= min_value.
  absl::StatusOr<std::vector<int64_t>> IntsOfSize(const std::string& attr, size_t size,
                                                  int64_t min_value) const;
  // An int attribute in [lo, hi].
  absl::StatusOr<int64_t> IntInRange(const std::string& attr, int64_t lo, int64_t hi) const;
  // An axis attribute valid for a tensor of rank `r` (0 <= axis < r).
  absl::StatusOr<int64_t> Axis(const std::string& attr, int r) const;

  // Operand dtype checks (storage-only dtypes are rejected before rules run).
  absl::Status RequireFloat(int i) const;    // f32 bf16 f16 f64
  absl::Status RequireNumeric(int i) const;  // any but bool
  absl::Status RequireBoolOrInt(int i) const;
  absl::Status RequireIndex(int i, const std::string& what) const;  // s32 or s64
  absl::Status RequireSameDType(int i, int j) const;
  absl::Status RequireSameType(int i, int j) const;
  absl::Status RequireRank(int i, int r) const;
  absl::Status RequireMinRank(int i, int r) const;

 private:
  const AttrValue* Find(const std::string& attr) const;
  absl::Status WrongKind(const std::string& attr, const char* want) const;

  Opcode op_;
  const std::vector<Type>& operands_;
  const AttrMap& attrs_;
  const std::optional<Type>& declared_;
};

// Largest element count any type may have; keeps every size computation inside int64.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

// Element count of `s`, or nullopt past kMaxElements (checked, no overflow).
inline std::optional<int64_t> CheckedNumElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s.dims()) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxElements) return std::nullopt;
  }
  return n;
}

// Spatial output size of a conv/pool window: floor((in + lo + hi - dil*(k-1) - 1)/stride) + 1,
// or a negative value when the (dilated) window does not fit the padded input.
int64_t WindowOutputSize(int64_t in, int64_t k, int64_t stride, int64_t pad_lo, int64_t pad_hi,
                         int64_t dilation);

// Rule families. Each returns the inferred type for ops it owns.
absl::StatusOr<Type> InferContraction(const RuleContext& c);  // dot_general, conv2d*, quantize*
absl::StatusOr<Type> InferPooling(const RuleContext& c);      // *_pool2d*
absl::StatusOr<Type> InferComposite(const RuleContext& c);    // softmax, norms, attention, ...

}  // namespace kiln::ir::internal

#endif  // KILN_IR_INTERNAL_SHAPE_RULES_H_
