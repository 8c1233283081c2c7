#include "kiln/compiler/passes/algebraic.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

// The one value every element of a tensor has (bitwise identical elements), or nullopt.
std::optional<double> SplatOf(const Tensor& t) {
  int64_t n = t.num_elements(), w = DTypeSize(t.dtype());
  if (n == 0) return std::nullopt;
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  for (int64_t i = 1; i < n; ++i)
    if (std::memcmp(p, p + i * w, w) != 0) return std::nullopt;
  return t.GetDouble(0);
}

class Simplifier {
 public:
  explicit Simplifier(GraphEditor& e) : e_(e) {}

  // The replacement for node `id`, or nullopt when no rule applies.
  absl::StatusOr<std::optional<int>> Simplify(const ir::Node& n);

 private:
  int Op(const ir::Node& n, int i) const { return e_.operand(n.id(), i); }
  const ir::Node& OpNode(const ir::Node& n, int i) const { return e_.operand_node(n.id(), i); }

  // The splat value of node `id` if it is a constant, or a broadcast_in_dim / reshape chain over
  // a constant, whose elements are all the same.
  std::optional<double> Splat(int id) {
    for (;;) {
      const ir::Node& n = e_.node(id);
      if (n.opcode() == Opcode::kBroadcastInDim || n.opcode() == Opcode::kReshape) {
        id = e_.operand(id, 0);
        continue;
      }
      if (n.opcode() != Opcode::kConstant || n.literal() == nullptr) return std::nullopt;
      auto it = splat_.find(n.literal());
      if (it == splat_.end()) it = splat_.emplace(n.literal(), SplatOf(*n.literal())).first;
      return it->second;
    }
  }
  bool IsZero(int id) {
    std::optional<double> v = Splat(id);
    return v && *v == 0.0;
  }
  bool IsOne(int id) {
    std::optional<double> v = Splat(id);
    return v && *v == 1.0;
  }

  absl::StatusOr<std::optional<int>> Transpose(const ir::Node& n);
  absl::StatusOr<std::optional<int>> Reshape(const ir::Node& n);
  absl::StatusOr<std::optional<int>> Broadcast(const ir::Node& n);
  absl::StatusOr<std::optional<int>> Convert(const ir::Node& n);
  absl::StatusOr<std::optional<int>> Select(const ir::Node& n);
  std::optional<int> Slice(const ir::Node& n);
  std::optional<int> Pad(const ir::Node& n);
  absl::StatusOr<std::optional<int>> AddOfPads(const ir::Node& n);
  absl::StatusOr<std::optional<int>> AddOfScatter(const ir::Node& n);
  absl::StatusOr<std::optional<int>> LabelPick(const ir::Node& n);

  GraphEditor& e_;
  std::unordered_map<const Tensor*, std::optional<double>> splat_;
};

bool IsIdentity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

absl::StatusOr<std::optional<int>> Simplifier::Simplify(const ir::Node& n) {
  switch (n.opcode()) {
    // ---- add ----
    case Opcode::kAdd:
      if (IsZero(Op(n, 1))) return Op(n, 0);
      if (IsZero(Op(n, 0))) return Op(n, 1);
      {
        KILN_ASSIGN_OR_RETURN(std::optional<int> r, AddOfScatter(n));
        if (r) return r;
      }
      return AddOfPads(n);
    // ---- sub ----
    case Opcode::kSub:
      if (IsZero(Op(n, 1))) return Op(n, 0);
      return std::nullopt;
    // ---- mul ----
    case Opcode::kMul:
      if (IsOne(Op(n, 1))) return Op(n, 0);
      if (IsOne(Op(n, 0))) return Op(n, 1);
      if (IsInteger(n.type().dtype)) {
        if (IsZero(Op(n, 1))) return Op(n, 1);
        if (IsZero(Op(n, 0))) return Op(n, 0);
      }
      return std::nullopt;
    // ---- div ----
    case Opcode::kDiv:
      if (IsOne(Op(n, 1))) return Op(n, 0);
      return std::nullopt;
    // ---- neg ----
    case Opcode::kNeg:
      if (OpNode(n, 0).opcode() == Opcode::kNeg) return e_.operand(Op(n, 0), 0);
      return std::nullopt;
    case Opcode::kTranspose:
      return Transpose(n);
    case Opcode::kReshape:
      return Reshape(n);
    case Opcode::kBroadcastInDim:
      return Broadcast(n);
    case Opcode::kConvert:
      return Convert(n);
    case Opcode::kSelect:
      return Select(n);
    case Opcode::kSlice:
      return Slice(n);
    // ---- pad ----
    case Opcode::kPad:
      return Pad(n);
    case Opcode::kReduceSum:
      return LabelPick(n);
    default:
      return std::nullopt;
  }
}

// ---- transpose ----
absl::StatusOr<std::optional<int>> Simplifier::Transpose(const ir::Node& n) {
  std::vector<int64_t> perm = n.attr_ints("permutation");
  int x = Op(n, 0);
  if (e_.node(x).opcode() == Opcode::kTranspose) {
    // out dim i = middle dim perm[i] = x' dim inner[perm[i]].
    const std::vector<int64_t>& inner = e_.node(x).attr_ints("permutation");
    for (int64_t& p : perm) p = inner[p];
    x = e_.operand(x, 0);
  } else if (!IsIdentity(perm)) {
    return std::nullopt;
  }
  if (IsIdentity(perm)) return x;
  KILN_ASSIGN_OR_RETURN(int t, e_.Add(Opcode::kTranspose, {x}, {{"permutation", perm}}));
  return t;
}

// ---- reshape ----
absl::StatusOr<std::optional<int>> Simplifier::Reshape(const ir::Node& n) {
  int x = Op(n, 0);
  bool nested = e_.node(x).opcode() == Opcode::kReshape;
  if (nested) x = e_.operand(x, 0);
  if (e_.type(x).shape == n.type().shape) return x;
  if (!nested) return std::nullopt;
  KILN_ASSIGN_OR_RETURN(int r, e_.Add(Opcode::kReshape, {x}, n.attrs()));
  return r;
}

// ---- broadcast_in_dim ----
absl::StatusOr<std::optional<int>> Simplifier::Broadcast(const ir::Node& n) {
  std::vector<int64_t> bd = n.attr_ints("broadcast_dimensions");
  int x = Op(n, 0);
  bool nested = e_.node(x).opcode() == Opcode::kBroadcastInDim;
  if (nested) {
    // x' dim i -> middle dim inner[i] -> output dim bd[inner[i]].
    std::vector<int64_t> inner = e_.node(x).attr_ints("broadcast_dimensions");
    for (int64_t& d : inner) d = bd[d];
    bd = std::move(inner);
    x = e_.operand(x, 0);
  }
  if (e_.type(x).shape == n.type().shape && IsIdentity(bd)) return x;
  if (!nested) return std::nullopt;
  KILN_ASSIGN_OR_RETURN(int b,
                        e_.Add(Opcode::kBroadcastInDim, {x},
                               {{"shape", n.type().shape.dims()}, {"broadcast_dimensions", bd}}));
  return b;
}

// ---- convert ----
absl::StatusOr<std::optional<int>> Simplifier::Convert(const ir::Node& n) {
  int x = Op(n, 0);
  DType to = n.type().dtype;
  if (e_.type(x).dtype == to) return x;
  if (e_.node(x).opcode() != Opcode::kConvert) return std::nullopt;
  int inner = e_.operand(x, 0);
  if (!ConvertIsExact(e_.type(inner).dtype, e_.type(x).dtype)) return std::nullopt;
  if (e_.type(inner).dtype == to) return inner;
  KILN_ASSIGN_OR_RETURN(int c, e_.Add(Opcode::kConvert, {inner}, {}, n.type()));
  return c;
}

// ---- select ----
absl::StatusOr<std::optional<int>> Simplifier::Select(const ir::Node& n) {
  if (Op(n, 1) == Op(n, 2)) return Op(n, 1);
  std::optional<double> p = Splat(Op(n, 0));
  if (p) return *p != 0.0 ? Op(n, 1) : Op(n, 2);
  // select(p, 1, 0) is convert(p): bool converts to exactly 1 / 0 in every dtype.
  if (e_.type(Op(n, 0)).dtype == DType::kBool && IsOne(Op(n, 1)) && IsZero(Op(n, 2))) {
    std::optional<double> zero = Splat(Op(n, 2));
    if (std::signbit(*zero)) return std::nullopt;  // -0.0 is not what convert gives
    KILN_ASSIGN_OR_RETURN(int c, e_.Add(Opcode::kConvert, {Op(n, 0)}, {}, n.type()));
    return c;
  }
  return std::nullopt;
}

// ---- slice ----
std::optional<int> Simplifier::Slice(const ir::Node& n) {
  int x = Op(n, 0);
  if (e_.type(x).shape != n.type().shape) return std::nullopt;
  for (int64_t s : n.attr_ints("start"))
    if (s != 0) return std::nullopt;
  if (n.has_attr("stride"))
    for (int64_t s : n.attr_ints("stride"))
      if (s != 1) return std::nullopt;
  return x;
}

// pad with no padding at all is its operand.
std::optional<int> Simplifier::Pad(const ir::Node& n) {
  for (const char* a : {"low", "high", "interior"})
    for (int64_t v : n.attr_ints(a))
      if (v != 0) return std::nullopt;
  return Op(n, 0);
}

// add(x, scatter_add(zeros, i, u)) (either order): scatter_add(x, i, u). A tied embedding's
// gradient is the LM head's dW plus the gather's scatter into zeros; this scatters the rows into
// dW itself (in place: scatter_add may overwrite its operand), so neither the full-size zeros nor
// the add over them is built. Exact but for rounding where an index repeats (x + (u1 + u2)
// becomes (x + u1) + u2), the trade every reassociation makes.
absl::StatusOr<std::optional<int>> Simplifier::AddOfScatter(const ir::Node& n) {
  if (!IsFloating(n.type().dtype) && !IsInteger(n.type().dtype)) return std::nullopt;
  for (int s = 0; s < 2; ++s) {
    const ir::Node& sc = OpNode(n, s);
    const int x = Op(n, 1 - s);
    if (sc.opcode() != Opcode::kScatterAdd || sc.type() != n.type() || e_.type(x) != n.type() ||
        !IsZero(e_.operand(sc.id(), 0)))
      continue;
    KILN_ASSIGN_OR_RETURN(
        int r, e_.Add(Opcode::kScatterAdd, {x, e_.operand(sc.id(), 1), e_.operand(sc.id(), 2)},
                      {{"axis", sc.attr_int("axis")}}));
    return r;
  }
  return std::nullopt;
}

// reduce_sum(select(broadcast(iota[C]) == broadcast(L), x, 0), last dim), with x [..., C] and L
// integer labels [...] (or their exact f32 conversion): the masked row sum that picks each row's
// label logit (autodiff's cross-entropy gradient) becomes a gather of one element per row,
// select(0 <= L < C, x.flat[row * C + L], 0): one read per row instead of a pass over x. Exact
// up to the sign of a zero (a -0.0 logit sums to +0.0), as add(x, 0) -> x. A tensor-parallel
// program keeps the sum: its local iota is offset (a shard of the classes), so the rule does not
// match.
absl::StatusOr<std::optional<int>> Simplifier::LabelPick(const ir::Node& n) {
  const ir::Node& sel = OpNode(n, 0);
  const ir::Type& xt = sel.type();
  const int rank = xt.shape.rank();
  if (sel.opcode() != Opcode::kSelect || rank < 1 || !IsFloating(xt.dtype) ||
      n.attr_ints("dimensions") != std::vector<int64_t>{rank - 1} || !IsZero(Op(sel, 2)) ||
      e_.type(Op(sel, 1)).shape != xt.shape)
    return std::nullopt;
  const ir::Node& hit = OpNode(sel, 0);
  if (hit.opcode() != Opcode::kCompare || hit.attr_str("direction") != "eq") return std::nullopt;
  const int64_t classes = xt.shape.dim(rank - 1);
  std::vector<int64_t> lead_dims(rank - 1);
  std::iota(lead_dims.begin(), lead_dims.end(), int64_t{0});
  int labels = -1;  // the integer labels
  bool iota_found = false;
  for (int side = 0; side < 2; ++side) {
    const ir::Node& b = OpNode(hit, side);
    if (b.opcode() != Opcode::kBroadcastInDim || b.type().shape != xt.shape) return std::nullopt;
    const std::vector<int64_t> bd = b.attr_ints("broadcast_dimensions");
    const ir::Node& src = e_.operand_node(b.id(), 0);
    if (bd == std::vector<int64_t>{rank - 1} && src.opcode() == Opcode::kIota &&
        src.type().shape == Shape{classes} && !iota_found) {
      iota_found = true;
      continue;
    }
    if (bd != lead_dims || labels >= 0) return std::nullopt;
    int l = src.id();
    if (src.opcode() == Opcode::kConvert && IsInteger(e_.type(e_.operand(l, 0)).dtype) &&
        src.type().dtype == DType::kF32 && classes <= (int64_t{1} << 24))
      l = e_.operand(l, 0);  // labels converted to f32: exact for every class index
    if (!IsInteger(e_.type(l).dtype)) return std::nullopt;
    labels = l;
  }
  if (!iota_found || labels < 0) return std::nullopt;
  int64_t rows = 1;
  for (int d = 0; d < rank - 1; ++d) rows *= xt.shape.dim(d);
  if (rows == 0 || classes == 0) return std::nullopt;
  const DType it =
      rows * classes <= std::numeric_limits<int32_t>::max() ? DType::kS32 : DType::kS64;
  const ir::Type idx_type{it, Shape{rows}};
  int l = labels;
  if (e_.type(l).shape != Shape{rows}) {
    KILN_ASSIGN_OR_RETURN(l,
                          e_.Add(Opcode::kReshape, {l}, {{"shape", std::vector<int64_t>{rows}}}));
  }
  if (e_.type(l).dtype != it) {
    KILN_ASSIGN_OR_RETURN(l, e_.Add(Opcode::kConvert, {l}, {}, idx_type));
  }
  KILN_ASSIGN_OR_RETURN(int zero, e_.AddSplat(0, idx_type));
  KILN_ASSIGN_OR_RETURN(int top, e_.AddSplat(static_cast<double>(classes - 1), idx_type));
  KILN_ASSIGN_OR_RETURN(int width, e_.AddSplat(static_cast<double>(classes), idx_type));
  KILN_ASSIGN_OR_RETURN(int ge,
                        e_.Add(Opcode::kCompare, {l, zero}, {{"direction", std::string("ge")}}));
  KILN_ASSIGN_OR_RETURN(int le,
                        e_.Add(Opcode::kCompare, {l, top}, {{"direction", std::string("le")}}));
  KILN_ASSIGN_OR_RETURN(int valid, e_.Add(Opcode::kLogicalAnd, {ge, le}));
  KILN_ASSIGN_OR_RETURN(int lo, e_.Add(Opcode::kMax, {l, zero}));
  KILN_ASSIGN_OR_RETURN(int col, e_.Add(Opcode::kMin, {lo, top}));
  KILN_ASSIGN_OR_RETURN(int row, e_.Add(Opcode::kIota, {}, {{"dimension", int64_t{0}}}, idx_type));
  KILN_ASSIGN_OR_RETURN(int base, e_.Add(Opcode::kMul, {row, width}));
  KILN_ASSIGN_OR_RETURN(int index, e_.Add(Opcode::kAdd, {base, col}));
  KILN_ASSIGN_OR_RETURN(int flat, e_.Add(Opcode::kReshape, {Op(sel, 1)},
                                         {{"shape", std::vector<int64_t>{rows * classes}}}));
  KILN_ASSIGN_OR_RETURN(int picked, e_.Add(Opcode::kGather, {flat, index}, {{"axis", int64_t{0}}}));
  KILN_ASSIGN_OR_RETURN(int none, e_.AddSplat(0, e_.type(picked)));
  KILN_ASSIGN_OR_RETURN(int r, e_.Add(Opcode::kSelect, {valid, picked, none}));
  if (e_.type(r).shape != n.type().shape) {
    KILN_ASSIGN_OR_RETURN(r, e_.Add(Opcode::kReshape, {r}, {{"shape", n.type().shape.dims()}}));
  }
  return r;
}

// add(pad(x), pad(y)) where both pad with 0 along one dim d only and x's slot ends where y's
// begins: pad(concatenate(x, y), low of x, high of y). The sum of the pads a slice's gradient
// makes (fused q/k/v projections) becomes one concatenate instead of full-size pads and adds.
// Exact up to the sign of zero, the trade add(x, 0) -> x already makes.
absl::StatusOr<std::optional<int>> Simplifier::AddOfPads(const ir::Node& n) {
  if (!IsFloating(n.type().dtype) && !IsInteger(n.type().dtype)) return std::nullopt;
  const ir::Node& a = OpNode(n, 0);
  const ir::Node& b = OpNode(n, 1);
  auto plain_pad = [&](const ir::Node& p) {
    if (p.opcode() != Opcode::kPad || p.type() != n.type() || p.attr_float("value") != 0.0)
      return false;
    for (int64_t v : p.attr_ints("interior"))
      if (v != 0) return false;
    return true;
  };
  if (!plain_pad(a) || !plain_pad(b)) return std::nullopt;
  const std::vector<int64_t>& alo = a.attr_ints("low");
  const std::vector<int64_t>& ahi = a.attr_ints("high");
  const std::vector<int64_t>& blo = b.attr_ints("low");
  const std::vector<int64_t>& bhi = b.attr_ints("high");
  int d = -1;
  for (size_t i = 0; i < alo.size(); ++i) {
    if (alo[i] == 0 && ahi[i] == 0 && blo[i] == 0 && bhi[i] == 0) continue;
    if (d >= 0) return std::nullopt;  // padded along two dims
    d = static_cast<int>(i);
  }
  if (d < 0) return std::nullopt;
  int x = e_.operand(a.id(), 0), y = e_.operand(b.id(), 0);
  int64_t x_end = alo[d] + e_.type(x).shape.dim(d), y_end = blo[d] + e_.type(y).shape.dim(d);
  int first, second;
  int64_t low, high;
  if (x_end == blo[d]) {
    first = x, second = y, low = alo[d], high = bhi[d];
  } else if (y_end == alo[d]) {
    first = y, second = x, low = blo[d], high = ahi[d];
  } else {
    return std::nullopt;  // overlapping or with a gap
  }
  // Splice the parts of a concatenate along d (from an earlier application of this rule).
  std::vector<int> parts;
  for (int part : {first, second}) {
    const ir::Node& pn = e_.node(part);
    if (pn.opcode() == Opcode::kConcatenate && pn.attr_int("dimension") == d) {
      for (int k = 0; k < static_cast<int>(pn.operands().size()); ++k)
        parts.push_back(e_.operand(part, k));
    } else {
      parts.push_back(part);
    }
  }
  KILN_ASSIGN_OR_RETURN(
      int cat, e_.Add(Opcode::kConcatenate, parts, {{"dimension", static_cast<int64_t>(d)}}));
  std::vector<int64_t> lo(alo.size(), 0), hi(alo.size(), 0), in(alo.size(), 0);
  lo[d] = low;
  hi[d] = high;
  if (low == 0 && high == 0) return cat;
  KILN_ASSIGN_OR_RETURN(
      int padded,
      e_.Add(Opcode::kPad, {cat}, {{"low", lo}, {"high", hi}, {"interior", in}, {"value", 0.0}}));
  return padded;
}

}  // namespace

bool ConvertIsExact(DType from, DType to) {
  if (from == to || from == DType::kBool) return true;
  auto in = [to](std::initializer_list<DType> ts) {
    for (DType t : ts)
      if (t == to) return true;
    return false;
  };
  switch (from) {
    case DType::kS8:
    case DType::kU8:  // 8 significant bits fit bf16's 8 and f16's 11
      return in({DType::kS32, DType::kS64, DType::kF16, DType::kBF16, DType::kF32, DType::kF64});
    case DType::kS32:
      return in({DType::kS64, DType::kF64});
    case DType::kF8E4M3:  // 4 significant bits, exponents 2^-9 .. 2^8
    case DType::kF8E5M2:  // 3 significant bits, exponents 2^-16 .. 2^15, inf
      return in({DType::kF16, DType::kBF16, DType::kF32, DType::kF64});
    case DType::kF16:
    case DType::kBF16:
      return in({DType::kF32, DType::kF64});
    case DType::kF32:
      return to == DType::kF64;
    default:
      return false;
  }
}

absl::StatusOr<bool> AlgebraicSimplifierPass::Run(ir::Graph& graph) {
  GraphEditor e(graph);
  Simplifier s(e);
  for (const ir::Node& n : graph.nodes()) {
    e.set_position(n.id());
    KILN_ASSIGN_OR_RETURN(std::optional<int> r, s.Simplify(n));
    if (r) KILN_RETURN_IF_ERROR(e.Replace(n.id(), *r));
  }
  if (!e.changed()) return false;
  KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
  return true;
}

}  // namespace kiln::compiler
