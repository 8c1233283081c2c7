// Shape and dtype inference: dispatch, shared checks, and the rules for elementwise, structural,
// reduction, source and collective ops. Contractions, pooling and composites live in
// shape_inference_nn.cc. scripts/op-index.sh finds an op's rule.
#include "kiln/ir/shape_inference.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/internal/shape_rules.h"
#include "kiln/ir/op_traits.h"

namespace kiln::ir {
namespace internal {

std::string IntsToString(const std::vector<int64_t>& v) { return Shape(v).ToString(); }

absl::Status RuleContext::Error(const std::string& msg) const {
  return absl::InvalidArgumentError(name() + ": " + msg);
}

const AttrValue* RuleContext::Find(const std::string& attr) const {
  auto it = attrs_.find(attr);
  return it == attrs_.end() ? nullptr : &it->second;
}

absl::Status RuleContext::WrongKind(const std::string& attr, const char* want) const {
  return Error("attribute '" + attr + "' must be " + want);
}

absl::StatusOr<int64_t> RuleContext::Int(const std::string& attr) const {
  const AttrValue* v = Find(attr);
  if (v == nullptr) return Error("missing attribute '" + attr + "' (int)");
  if (!std::holds_alternative<int64_t>(*v)) return WrongKind(attr, "an int");
  return std::get<int64_t>(*v);
}

absl::StatusOr<double> RuleContext::Float(const std::string& attr) const {
  const AttrValue* v = Find(attr);
  if (v == nullptr) return Error("missing attribute '" + attr + "' (float)");
  if (std::holds_alternative<int64_t>(*v)) return static_cast<double>(std::get<int64_t>(*v));
  if (!std::holds_alternative<double>(*v)) return WrongKind(attr, "a float");
  return std::get<double>(*v);
}

absl::StatusOr<std::string> RuleContext::Str(const std::string& attr) const {
  const AttrValue* v = Find(attr);
  if (v == nullptr) return Error("missing attribute '" + attr + "' (string)");
  if (!std::holds_alternative<std::string>(*v)) return WrongKind(attr, "a string");
  return std::get<std::string>(*v);
}

absl::StatusOr<std::vector<int64_t>> RuleContext::Ints(const std::string& attr) const {
  const AttrValue* v = Find(attr);
  if (v == nullptr) return Error("missing attribute '" + attr + "' (int list)");
  if (!std::holds_alternative<std::vector<int64_t>>(*v)) return WrongKind(attr, "an int list");
  return std::get<std::vector<int64_t>>(*v);
}

absl::StatusOr<std::vector<int64_t>> RuleContext::IntsOfSize(const std::string& attr, size_t size,
                                                             int64_t min_value) const {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, Ints(attr));
  if (v.size() != size)
    return Error("attribute '" + attr + "' must have " + std::to_string(size) + " entries, got " +
                 IntsToString(v));
  for (int64_t x : v)
    if (x < min_value)
      return Error("attribute '" + attr + "' entries must be >= " + std::to_string(min_value) +
                   ", got " + IntsToString(v));
  return v;
}

absl::StatusOr<int64_t> RuleContext::IntInRange(const std::string& attr, int64_t lo,
                                                int64_t hi) const {
  KILN_ASSIGN_OR_RETURN(int64_t v, Int(attr));
  if (v < lo || v > hi)
    return Error("attribute '" + attr + "' must be in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + std::to_string(v));
  return v;
}

absl::StatusOr<int64_t> RuleContext::Axis(const std::string& attr, int r) const {
  KILN_ASSIGN_OR_RETURN(int64_t v, Int(attr));
  if (v < 0 || v >= r)
    return Error("attribute '" + attr + "' is " + std::to_string(v) + ", out of range for rank " +
                 std::to_string(r) + (num_operands() > 0 ? " operand " + T(0) : std::string()));
  return v;
}

absl::Status RuleContext::RequireFloat(int i) const {
  if (!IsFloating(in(i).dtype) || IsStorageOnly(in(i).dtype))
    return Error("operand " + std::to_string(i) +
                 " must be floating-point (f32, bf16, f16, f64), got " + T(i));
  return absl::OkStatus();
}

absl::Status RuleContext::RequireNumeric(int i) const {
  if (in(i).dtype == DType::kBool)
    return Error("operand " + std::to_string(i) + " must be numeric, got " + T(i));
  return absl::OkStatus();
}

absl::Status RuleContext::RequireBoolOrInt(int i) const {
  if (in(i).dtype != DType::kBool && !IsInteger(in(i).dtype))
    return Error("operand " + std::to_string(i) + " must be bool or integer, got " + T(i));
  return absl::OkStatus();
}

absl::Status RuleContext::RequireIndex(int i, const std::string& what) const {
  if (in(i).dtype != DType::kS32 && in(i).dtype != DType::kS64)
    return Error(what + " must be s32 or s64, got " + T(i));
  return absl::OkStatus();
}

absl::Status RuleContext::RequireSameDType(int i, int j) const {
  if (in(i).dtype != in(j).dtype) return Error("operand dtypes differ: " + T(i) + " vs " + T(j));
  return absl::OkStatus();
}

absl::Status RuleContext::RequireSameType(int i, int j) const {
  if (in(i) != in(j)) return Error("operand types differ: " + T(i) + " vs " + T(j));
  return absl::OkStatus();
}

absl::Status RuleContext::RequireRank(int i, int r) const {
  if (rank(i) != r)
    return Error("operand " + std::to_string(i) + " must have rank " + std::to_string(r) +
                 ", got " + T(i));
  return absl::OkStatus();
}

absl::Status RuleContext::RequireMinRank(int i, int r) const {
  if (rank(i) < r)
    return Error("operand " + std::to_string(i) + " must have rank >= " + std::to_string(r) +
                 ", got " + T(i));
  return absl::OkStatus();
}

int64_t WindowOutputSize(int64_t in, int64_t k, int64_t stride, int64_t pad_lo, int64_t pad_hi,
                         int64_t dilation) {
  // 128-bit so that absurd attributes give "does not fit" instead of signed overflow.
  __int128 span =
      static_cast<__int128>(in) + pad_lo + pad_hi - static_cast<__int128>(dilation) * (k - 1) - 1;
  if (span < 0) return -1;
  __int128 out = span / stride + 1;
  return out > kMaxElements ? -1 : static_cast<int64_t>(out);
}

}  // namespace internal

namespace {

using internal::IntsToString;
using internal::kMaxElements;
using internal::RuleContext;

bool IsFloatOnlyUnary(Opcode op) { return OpTraits(op).float_only(); }

// Dims listed in `attr` must be distinct and in [0, r).
absl::StatusOr<std::vector<int64_t>> DistinctDims(const RuleContext& c, const std::string& attr,
                                                  int r) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, c.Ints(attr));
  std::set<int64_t> seen;
  for (int64_t d : dims) {
    if (d < 0 || d >= r)
      return c.Error("attribute '" + attr + "' " + IntsToString(dims) +
                     " has a dimension out of range for " + c.T(0));
    if (!seen.insert(d).second)
      return c.Error("attribute '" + attr + "' " + IntsToString(dims) + " repeats dimension " +
                     std::to_string(d));
  }
  return dims;
}

absl::Status CheckDeclaredShape(const RuleContext& c, const Type& t) {
  for (int64_t d : t.shape.dims())
    if (d < 0) return c.Error("declared type " + t.ToString() + " has a negative dimension");
  return absl::OkStatus();
}

absl::StatusOr<Type> RequireDeclared(const RuleContext& c) {
  if (!c.declared().has_value()) return c.Error("a declared result type is required");
  KILN_RETURN_IF_ERROR(CheckDeclaredShape(c, *c.declared()));
  return *c.declared();
}

// ---------------------------------------------------------------------------------------------
// Elementwise

absl::StatusOr<Type> InferUnary(const RuleContext& c) {
  if (IsFloatOnlyUnary(c.op())) {
    KILN_RETURN_IF_ERROR(c.RequireFloat(0));
  } else if (c.op() == Opcode::kLogicalNot) {
    KILN_RETURN_IF_ERROR(c.RequireBoolOrInt(0));
  } else {
    KILN_RETURN_IF_ERROR(c.RequireNumeric(0));  // abs neg relu sign
  }
  if (c.op() == Opcode::kGelu) {
    KILN_ASSIGN_OR_RETURN(std::string approx, c.Str("approximate"));
    if (approx != "tanh" && approx != "none")
      return c.Error("attribute 'approximate' must be \"tanh\" or \"none\", got \"" + approx +
                     "\"");
  }
  return c.in(0);
}

absl::StatusOr<Type> InferBinary(const RuleContext& c) {
  KILN_RETURN_IF_ERROR(c.RequireSameType(0, 1));
  switch (c.op()) {
    case Opcode::kLogicalAnd:
    case Opcode::kLogicalOr:
      KILN_RETURN_IF_ERROR(c.RequireBoolOrInt(0));
      return c.in(0);
    case Opcode::kCompare: {
      KILN_ASSIGN_OR_RETURN(std::string dir, c.Str("direction"));
      static const char* kDirs[] = {"eq", "ne", "lt", "le", "gt", "ge"};
      if (std::find(std::begin(kDirs), std::end(kDirs), dir) == std::end(kDirs))
        return c.Error("attribute 'direction' must be one of eq ne lt le gt ge, got \"" + dir +
                       "\"");
      return Type{DType::kBool, c.shape(0)};
    }
    default:  // add sub mul div pow max min
      KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
      return c.in(0);
  }
}

absl::StatusOr<Type> InferSelect(const RuleContext& c) {
  if (c.in(0).dtype != DType::kBool) return c.Error("predicate must be bool, got " + c.T(0));
  KILN_RETURN_IF_ERROR(c.RequireSameType(1, 2));
  if (c.shape(0) != c.shape(1))
    return c.Error("predicate shape " + c.T(0) + " differs from the value shape " + c.T(1));
  return c.in(1);
}

absl::StatusOr<Type> InferConvert(const RuleContext& c) {
  KILN_ASSIGN_OR_RETURN(Type t, RequireDeclared(c));
  if (t.shape != c.shape(0))
    return c.Error("declared type " + t.ToString() + " must keep the operand's shape " + c.T(0));
  return t;
}

// ---------------------------------------------------------------------------------------------
// Sources

absl::StatusOr<Type> InferParameter(const RuleContext& c) {
  KILN_ASSIGN_OR_RETURN(Type t, RequireDeclared(c));
  KILN_ASSIGN_OR_RETURN(int64_t index, c.Int("index"));
  if (index < 0) return c.Error("attribute 'index' must be >= 0, got " + std::to_string(index));
  KILN_ASSIGN_OR_RETURN(std::string name, c.Str("name"));
  if (name.empty()) return c.Error("attribute 'name' must not be empty");
  return t;
}

absl::StatusOr<Type> InferIota(const RuleContext& c) {
  KILN_ASSIGN_OR_RETURN(Type t, RequireDeclared(c));
  if (t.dtype == DType::kBool) return c.Error("declared type must be numeric, got " + t.ToString());
  KILN_ASSIGN_OR_RETURN(int64_t dim, c.Int("dimension"));
  if (dim < 0 || dim >= t.shape.rank())
    return c.Error("attribute 'dimension' is " + std::to_string(dim) + ", out of range for " +
                   t.ToString());
  return t;
}

absl::StatusOr<Type> InferRandomBits(const RuleContext& c) {
  for (int i = 0; i < 2; ++i) {
    if (c.in(i) != Type{DType::kS64, Shape{}})
      return c.Error(std::string(i == 0 ? "seed" : "counter") + " must be s64[], got " + c.T(i));
  }
  KILN_ASSIGN_OR_RETURN(Type t, RequireDeclared(c));
  if (t.dtype != DType::kS32 && t.dtype != DType::kF32)
    return c.Error("declared type must be s32 (raw bits) or f32 (uniform), got " + t.ToString());
  return t;
}

// ---------------------------------------------------------------------------------------------
// Structural

absl::StatusOr<Type> InferBroadcastInDim(const RuleContext& c) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, c.Ints("shape"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> bd, c.Ints("broadcast_dimensions"));
  Shape out(shape);
  for (int64_t d : shape)
    if (d < 0) return c.Error("attribute 'shape' " + out.ToString() + " has a negative size");
  if (!internal::CheckedNumElements(out).has_value())
    return c.Error("attribute 'shape' " + out.ToString() + " has more than 2^48 elements");
  if (static_cast<int>(bd.size()) != c.rank(0))
    return c.Error("broadcast_dimensions " + IntsToString(bd) +
                   " must have one entry per operand dim of " + c.T(0));
  for (size_t i = 0; i < bd.size(); ++i) {
    if (bd[i] < 0 || bd[i] >= out.rank())
      return c.Error("broadcast_dimensions " + IntsToString(bd) +
                     " out of range for output shape " + out.ToString());
    if (i > 0 && bd[i] <= bd[i - 1])
      return c.Error("broadcast_dimensions " + IntsToString(bd) + " must be strictly increasing");
  }
  for (size_t i = 0; i < bd.size(); ++i) {
    int64_t in = c.shape(0).dim(static_cast<int>(i));
    if (in != 1 && in != out.dim(static_cast<int>(bd[i])))
      return c.Error("operand " + c.T(0) + " dim " + std::to_string(i) + " (size " +
                     std::to_string(in) + ") cannot broadcast to output " + out.ToString() +
                     " dim " + std::to_string(bd[i]));
  }
  return Type{c.in(0).dtype, out};
}

absl::StatusOr<Type> InferReshape(const RuleContext& c) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, c.Ints("shape"));
  Shape out(shape);
  for (int64_t d : shape)
    if (d < 0) return c.Error("attribute 'shape' " + out.ToString() + " has a negative size");
  if (!internal::CheckedNumElements(out).has_value())
    return c.Error("attribute 'shape' " + out.ToString() + " has more than 2^48 elements");
  if (out.num_elements() != c.shape(0).num_elements())
    return c.Error("cannot reshape " + c.T(0) + " (" + std::to_string(c.shape(0).num_elements()) +
                   " elements) to " + out.ToString() + " (" + std::to_string(out.num_elements()) +
                   " elements)");
  return Type{c.in(0).dtype, out};
}

absl::StatusOr<Type> InferTranspose(const RuleContext& c) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, c.Ints("permutation"));
  int r = c.rank(0);
  std::vector<bool> seen(r, false);
  bool ok = static_cast<int>(perm.size()) == r;
  for (size_t i = 0; ok && i < perm.size(); ++i) {
    if (perm[i] < 0 || perm[i] >= r || seen[perm[i]])
      ok = false;
    else
      seen[perm[i]] = true;
  }
  if (!ok)
    return c.Error("permutation " + IntsToString(perm) + " is not a permutation of the dims of " +
                   c.T(0));
  std::vector<int64_t> dims(r);
  for (int i = 0; i < r; ++i) dims[i] = c.shape(0).dim(static_cast<int>(perm[i]));
  return Type{c.in(0).dtype, Shape(dims)};
}

absl::StatusOr<Type> InferSlice(const RuleContext& c) {
  int r = c.rank(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> start, c.IntsOfSize("start", r, 0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> limit, c.IntsOfSize("limit", r, 0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> stride, c.IntsOfSize("stride", r, 1));
  std::vector<int64_t> dims(r);
  for (int i = 0; i < r; ++i) {
    if (start[i] > limit[i] || limit[i] > c.shape(0).dim(i))
      return c.Error("start " + IntsToString(start) + " / limit " + IntsToString(limit) +
                     " out of bounds for " + c.T(0) + " at dim " + std::to_string(i));
    dims[i] = (limit[i] - start[i] + stride[i] - 1) / stride[i];
  }
  return Type{c.in(0).dtype, Shape(dims)};
}

absl::StatusOr<Type> InferConcatenate(const RuleContext& c) {
  int r = c.rank(0);
  if (r == 0) return c.Error("cannot concatenate scalars (" + c.T(0) + ")");
  KILN_ASSIGN_OR_RETURN(int64_t dim, c.Axis("dimension", r));
  std::vector<int64_t> dims = c.shape(0).dims();
  for (int i = 1; i < c.num_operands(); ++i) {
    KILN_RETURN_IF_ERROR(c.RequireSameDType(0, i));
    bool ok = c.rank(i) == r;
    for (int d = 0; ok && d < r; ++d)
      if (d != dim && c.shape(i).dim(d) != dims[d]) ok = false;
    if (!ok)
      return c.Error("operand " + std::to_string(i) + " " + c.T(i) + " does not match operand 0 " +
                     c.T(0) + " outside dimension " + std::to_string(dim));
    dims[dim] += c.shape(i).dim(static_cast<int>(dim));
  }
  return Type{c.in(0).dtype, Shape(dims)};
}

absl::StatusOr<Type> InferPad(const RuleContext& c) {
  int r = c.rank(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> low, c.IntsOfSize("low", r, 0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> high, c.IntsOfSize("high", r, 0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> interior, c.IntsOfSize("interior", r, 0));
  KILN_RETURN_IF_ERROR(c.Float("value").status());
  std::vector<int64_t> dims(r);
  for (int i = 0; i < r; ++i) {
    int64_t d = c.shape(0).dim(i);
    __int128 size = static_cast<__int128>(low[i]) + high[i] + d +
                    static_cast<__int128>(std::max<int64_t>(d - 1, 0)) * interior[i];
    if (size > kMaxElements)
      return c.Error("padded dimension " + std::to_string(i) + " of " + c.T(0) + " is too large");
    dims[i] = static_cast<int64_t>(size);
  }
  return Type{c.in(0).dtype, Shape(dims)};
}

// table.shape[:axis] + indices.shape + table.shape[axis+1:]
std::vector<int64_t> GatherDims(const Shape& table, const Shape& indices, int64_t axis) {
  std::vector<int64_t> dims(table.dims().begin(), table.dims().begin() + axis);
  dims.insert(dims.end(), indices.dims().begin(), indices.dims().end());
  dims.insert(dims.end(), table.dims().begin() + axis + 1, table.dims().end());
  return dims;
}

absl::StatusOr<Type> InferGather(const RuleContext& c) {
  KILN_RETURN_IF_ERROR(c.RequireMinRank(0, 1));
  KILN_RETURN_IF_ERROR(c.RequireIndex(1, "indices"));
  KILN_ASSIGN_OR_RETURN(int64_t axis, c.Axis("axis", c.rank(0)));
  return Type{c.in(0).dtype, Shape(GatherDims(c.shape(0), c.shape(1), axis))};
}

absl::StatusOr<Type> InferScatterAdd(const RuleContext& c) {
  KILN_RETURN_IF_ERROR(c.RequireMinRank(0, 1));
  KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
  KILN_RETURN_IF_ERROR(c.RequireIndex(1, "indices"));
  KILN_ASSIGN_OR_RETURN(int64_t axis, c.Axis("axis", c.rank(0)));
  Type want{c.in(0).dtype, Shape(GatherDims(c.shape(0), c.shape(1), axis))};
  if (c.in(2) != want)
    return c.Error("updates " + c.T(2) + " must be " + want.ToString() + " (operand " + c.T(0) +
                   ", indices " + c.T(1) + ", axis " + std::to_string(axis) + ")");
  return c.in(0);
}

// ---------------------------------------------------------------------------------------------
// Reductions

absl::StatusOr<Type> InferReduce(const RuleContext& c) {
  KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> red, DistinctDims(c, "dimensions", c.rank(0)));
  std::vector<int64_t> dims;
  for (int i = 0; i < c.rank(0); ++i)
    if (std::find(red.begin(), red.end(), i) == red.end()) dims.push_back(c.shape(0).dim(i));
  return Type{c.in(0).dtype, Shape(dims)};
}

absl::StatusOr<Type> InferArgmax(const RuleContext& c) {
  KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
  KILN_RETURN_IF_ERROR(c.RequireMinRank(0, 1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, c.Axis("axis", c.rank(0)));
  if (c.shape(0).dim(static_cast<int>(axis)) == 0)
    return c.Error("cannot take argmax over an empty axis of " + c.T(0));
  std::vector<int64_t> dims = c.shape(0).dims();
  dims.erase(dims.begin() + axis);
  return Type{DType::kS32, Shape(dims)};
}

// ---------------------------------------------------------------------------------------------
// Collectives

absl::StatusOr<Type> InferCollective(const RuleContext& c) {
  if (c.op() == Opcode::kAllReduce) {
    KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
    KILN_ASSIGN_OR_RETURN(std::string red, c.Str("reduction"));
    if (red != "sum" && red != "max")
      return c.Error("attribute 'reduction' must be \"sum\" or \"max\", got \"" + red + "\"");
    return c.in(0);
  }
  if (c.op() == Opcode::kReduceScatter) KILN_RETURN_IF_ERROR(c.RequireNumeric(0));
  KILN_RETURN_IF_ERROR(c.RequireMinRank(0, 1));
  KILN_ASSIGN_OR_RETURN(int64_t dim, c.Axis("dimension", c.rank(0)));
  KILN_ASSIGN_OR_RETURN(int64_t replicas, c.Int("replicas"));
  if (replicas < 1)
    return c.Error("attribute 'replicas' must be >= 1, got " + std::to_string(replicas));
  std::vector<int64_t> dims = c.shape(0).dims();
  if (c.op() == Opcode::kAllGather) {
    if (__builtin_mul_overflow(dims[dim], replicas, &dims[dim]) || dims[dim] > kMaxElements)
      return c.Error("gathered dimension " + std::to_string(dim) + " of " + c.T(0) + " times " +
                     std::to_string(replicas) + " replicas is too large");
  } else {
    if (dims[dim] % replicas != 0)
      return c.Error("dimension " + std::to_string(dim) + " of " + c.T(0) +
                     " is not divisible by " + std::to_string(replicas) + " replicas");
    dims[dim] /= replicas;
  }
  return Type{c.in(0).dtype, Shape(dims)};
}

absl::StatusOr<Type> Dispatch(const RuleContext& c) {
  // The plain elementwise families (opcodes.def `family`) share the unary and binary rules.
  switch (OpTraits(c.op()).family) {
    case KernelFamily::kUnary:
    case KernelFamily::kBinary:
    case KernelFamily::kCompare:
    case KernelFamily::kLogical:
      return OpcodeArity(c.op()) == 1 ? InferUnary(c) : InferBinary(c);
    default:
      break;
  }
  switch (c.op()) {
    case Opcode::kSelect:
      return InferSelect(c);
    case Opcode::kConvert:
      return InferConvert(c);
    case Opcode::kParameter:
      return InferParameter(c);
    case Opcode::kConstant:
      return RequireDeclared(c);
    case Opcode::kIota:
      return InferIota(c);
    case Opcode::kRandomBits:
      return InferRandomBits(c);
    case Opcode::kBroadcastInDim:
      return InferBroadcastInDim(c);
    case Opcode::kReshape:
      return InferReshape(c);
    case Opcode::kTranspose:
      return InferTranspose(c);
    case Opcode::kSlice:
      return InferSlice(c);
    case Opcode::kConcatenate:
      return InferConcatenate(c);
    case Opcode::kPad:
      return InferPad(c);
    case Opcode::kGather:
      return InferGather(c);
    case Opcode::kScatterAdd:
      return InferScatterAdd(c);
    case Opcode::kReduceMax:
    case Opcode::kReduceMin:
    case Opcode::kReduceSum:
      return InferReduce(c);
    case Opcode::kArgmax:
      return InferArgmax(c);
    case Opcode::kAllGather:
    case Opcode::kAllReduce:
    case Opcode::kReduceScatter:
      return InferCollective(c);
    case Opcode::kDotGeneral:
    case Opcode::kConv2d:
    case Opcode::kConv2dBackwardFilter:
    case Opcode::kConv2dBackwardInput:
    case Opcode::kQuantize:
    case Opcode::kQuantizedConv2d:
    case Opcode::kQuantizedDot:
      return internal::InferContraction(c);
    case Opcode::kAvgPool2d:
    case Opcode::kAvgPool2dGrad:
    case Opcode::kMaxPool2d:
    case Opcode::kMaxPool2dGrad:
      return internal::InferPooling(c);
    case Opcode::kAttention:
    case Opcode::kCrossEntropy:
    case Opcode::kLayerNorm:
    case Opcode::kLogSoftmax:
    case Opcode::kRmsNorm:
    case Opcode::kSoftmax:
      return internal::InferComposite(c);
    default:
      break;
  }
  return c.Error("no shape rule for this op");
}

bool IsDeclaredOp(Opcode op) {
  return op == Opcode::kParameter || op == Opcode::kConstant || op == Opcode::kIota ||
         op == Opcode::kRandomBits || op == Opcode::kConvert;
}

}  // namespace

absl::StatusOr<Type> InferType(Opcode op, const std::vector<Type>& operands, const AttrMap& attrs,
                               const std::optional<Type>& declared) {
  RuleContext c(op, operands, attrs, declared);
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= kNumOpcodes)
    return absl::InvalidArgumentError("unknown opcode " + std::to_string(static_cast<int>(op)));
  int arity = OpcodeArity(op);
  if (arity >= 0 && c.num_operands() != arity)
    return c.Error("expected " + std::to_string(arity) + " operand(s), got " +
                   std::to_string(c.num_operands()));
  if (arity < 0 && c.num_operands() == 0) return c.Error("expected at least one operand");
  for (int i = 0; i < c.num_operands(); ++i)
    for (int64_t d : c.shape(i).dims())
      if (d < 0)
        return c.Error("operand " + std::to_string(i) + " " + c.T(i) + " has a negative dimension");
  // f8 types are storage formats: only convert (and sources that hold them) may touch them.
  if (op != Opcode::kConvert && op != Opcode::kParameter && op != Opcode::kConstant) {
    for (int i = 0; i < c.num_operands(); ++i)
      if (IsStorageOnly(c.in(i).dtype))
        return c.Error("operand " + std::to_string(i) + " " + c.T(i) +
                       " has a storage-only dtype; convert it to a compute dtype first");
    if (declared.has_value() && IsStorageOnly(declared->dtype))
      return c.Error("result type " + declared->ToString() +
                     " has a storage-only dtype; only convert, parameter and constant produce it");
  }
  for (int i = 0; i < c.num_operands(); ++i)
    if (!internal::CheckedNumElements(c.shape(i)).has_value())
      return c.Error("operand " + std::to_string(i) + " " + c.T(i) +
                     " has more than 2^48 elements");
  if (declared.has_value() && !internal::CheckedNumElements(declared->shape).has_value())
    return c.Error("declared type " + declared->ToString() +
                   " has a negative dimension or more than 2^48 elements");
  KILN_ASSIGN_OR_RETURN(Type t, Dispatch(c));
  if (!internal::CheckedNumElements(t.shape).has_value())
    return c.Error("result type " + t.ToString() + " has more than 2^48 elements");
  if (!IsDeclaredOp(op) && declared.has_value() && *declared != t)
    return c.Error("declared type " + declared->ToString() + " does not match the inferred type " +
                   t.ToString());
  return t;
}

}  // namespace kiln::ir
