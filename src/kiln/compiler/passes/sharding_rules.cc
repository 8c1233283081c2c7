#include "kiln/compiler/passes/sharding_rules.h"

#include <algorithm>

#include "kiln/ir/op_traits.h"

namespace kiln::compiler::sharding {
namespace {

using ir::Opcode;
using ir::Sharding;

Sharding Rep(int rank) { return Sharding::Replicated(rank); }

int64_t InnerSize(const ir::Type& t, int d) {
  int64_t inner = 1;
  for (int k = d + 1; k < t.shape.rank(); ++k) inner *= t.shape.dim(k);
  return inner;
}

// Every rank owns the elements i of the flattened value with (i / grain) % size == rank: a
// split layout is determined by this grain alone (see ReshapeSharding).
int64_t Grain(const ir::Type& t, const Sharding& s, const Mesh& mesh) {
  const int d = s.split_dim();
  const int64_t block = t.shape.dim(d) / s.dims[d].groups;
  return InnerSize(t, d) * (block / mesh.size);
}

// The split of `t` with the given grain, or replicated when no dimension has it.
Sharding FromGrain(const ir::Type& t, int64_t grain, const Mesh& mesh) {
  for (int e = t.shape.rank() - 1; e >= 0; --e) {
    const int64_t m = t.shape.dim(e), inner = InnerSize(t, e);
    if (m <= 1 || inner == 0 || grain % inner != 0) continue;
    const int64_t block = mesh.size * (grain / inner);
    if (block > m || m % block != 0) continue;
    Sharding s = Split(t.shape.rank(), e, m / block, mesh);
    if (Fits(s, t, mesh)) return s;
  }
  return Rep(t.shape.rank());
}

Plan Replicated(const ir::Node& n, const std::vector<ir::Type>& types) {
  Plan p;
  p.out = Rep(n.type().shape.rank());
  for (const ir::Type& t : types) p.operands.push_back(Rep(t.shape.rank()));
  p.lowering = Lowering::kReplicated;
  return p;
}

bool UsableHint(const Sharding* hint, const ir::Type& t, const Mesh& mesh) {
  return hint != nullptr && hint->partial.empty() && hint->split_dim() >= 0 && Fits(*hint, t, mesh);
}

int IndexOf(const std::vector<int64_t>& v, int64_t x) {
  auto it = std::find(v.begin(), v.end(), x);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

// Moves a split at dimension `from` of `s` to dimension `to` of a rank-`rank` value.
Sharding Moved(const Sharding& s, int from, int to, int rank) {
  Sharding r = Rep(rank);
  if (from >= 0 && to >= 0) r.dims[to] = s.dims[from];
  return r;
}

Plan Elementwise(const ir::Node& n, const std::vector<ir::Type>& types,
                 const std::vector<Sharding>& in, const Sharding* hint, const Mesh& mesh) {
  Plan p;
  p.out = Rep(n.type().shape.rank());
  for (const Sharding& s : in)
    if (s.split_dim() >= 0) {
      p.out = s;
      break;
    }
  if (p.out.split_dim() < 0 && UsableHint(hint, n.type(), mesh)) p.out = *hint;
  p.operands.assign(types.size(), p.out);
  return p;
}

Plan Broadcast(const ir::Node& n, const std::vector<ir::Type>& types,
               const std::vector<Sharding>& in, const Sharding* hint, const Mesh& mesh) {
  const std::vector<int64_t>& bd = n.attr_ints("broadcast_dimensions");
  const int rank = n.type().shape.rank(), in_rank = types[0].shape.rank();
  Plan p;
  const int d = in[0].split_dim();
  if (d >= 0 && types[0].shape.dim(d) == n.type().shape.dim(static_cast<int>(bd[d]))) {
    p.out = Moved(in[0], d, static_cast<int>(bd[d]), rank);
    p.operands = {in[0]};
    return p;
  }
  if (d < 0 && UsableHint(hint, n.type(), mesh)) {
    p.out = *hint;
    // The operand follows the split when it has that dimension at full size; otherwise each
    // rank broadcasts the replicated operand into its local shape.
    const int e = hint->split_dim();
    const int i = IndexOf(bd, e);
    p.operands = {Rep(in_rank)};
    if (i >= 0 && types[0].shape.dim(i) == n.type().shape.dim(e)) {
      Sharding o = Moved(*hint, e, i, in_rank);
      if (Fits(o, types[0], mesh)) p.operands = {o};
    }
    return p;
  }
  p.out = Rep(rank);
  p.operands = {Rep(in_rank)};
  return p;
}

Plan DotGeneral(const ir::Node& n, const std::vector<ir::Type>& types,
                const std::vector<Sharding>& in, const Mesh& mesh) {
  const std::vector<int64_t>& lb = n.attr_ints("lhs_batch");
  const std::vector<int64_t>& rb = n.attr_ints("rhs_batch");
  const std::vector<int64_t>& lc = n.attr_ints("lhs_contracting");
  const std::vector<int64_t>& rc = n.attr_ints("rhs_contracting");
  const int lr = types[0].shape.rank(), rr = types[1].shape.rank();
  const int rank = n.type().shape.rank();
  auto free_dims = [](int r, const std::vector<int64_t>& b, const std::vector<int64_t>& c) {
    std::vector<int64_t> f;
    for (int d = 0; d < r; ++d)
      if (IndexOf(b, d) < 0 && IndexOf(c, d) < 0) f.push_back(d);
    return f;
  };
  const std::vector<int64_t> lf = free_dims(lr, lb, lc), rf = free_dims(rr, rb, rc);
  const int dl = in[0].split_dim(), dr = in[1].split_dim();
  const int64_t gl = dl >= 0 ? in[0].dims[dl].groups : 0, gr = dr >= 0 ? in[1].dims[dr].groups : 0;
  Plan p;
  p.lowering = Lowering::kLocal;
  // Output dim of a batch / free dim of either side.
  auto out_of_lhs_free = [&](int d) { return static_cast<int>(lb.size()) + IndexOf(lf, d); };
  auto out_of_rhs_free = [&](int d) {
    return static_cast<int>(lb.size() + lf.size()) + IndexOf(rf, d);
  };
  // 1. Contracting dims split alike on both sides: a partial sum.
  if (dl >= 0 && dr >= 0 && IndexOf(lc, dl) >= 0 && IndexOf(lc, dl) == IndexOf(rc, dr) &&
      gl == gr) {
    p.out = Rep(rank);
    p.out.partial = "sum";
    p.out.partial_axis = mesh.axis;
    p.operands = {in[0], in[1]};
    return p;
  }
  // 2. Batch dims split alike.
  if (dl >= 0 && dr >= 0 && IndexOf(lb, dl) >= 0 && IndexOf(lb, dl) == IndexOf(rb, dr) &&
      gl == gr) {
    p.out = Moved(in[0], dl, IndexOf(lb, dl), rank);
    p.operands = {in[0], in[1]};
    return p;
  }
  // 3. A free dim split: the result is split there, the other side replicated. When both are,
  // the larger operand keeps its split.
  const bool lfree = dl >= 0 && IndexOf(lf, dl) >= 0, rfree = dr >= 0 && IndexOf(rf, dr) >= 0;
  if (lfree && (!rfree || types[0].byte_size() >= types[1].byte_size())) {
    p.out = Moved(in[0], dl, out_of_lhs_free(dl), rank);
    p.operands = {in[0], Rep(rr)};
    return p;
  }
  if (rfree) {
    p.out = Moved(in[1], dr, out_of_rhs_free(dr), rank);
    p.operands = {Rep(lr), in[1]};
    return p;
  }
  // 4. One side split on a contracting or batch dim: split the other side to match (a local
  // slice, no communication).
  for (int side = 0; side < 2; ++side) {
    const int d = side == 0 ? dl : dr;
    if (d < 0) continue;
    const Sharding& s = in[side];
    const std::vector<int64_t>& my_c = side == 0 ? lc : rc;
    const std::vector<int64_t>& other_c = side == 0 ? rc : lc;
    const std::vector<int64_t>& my_b = side == 0 ? lb : rb;
    const std::vector<int64_t>& other_b = side == 0 ? rb : lb;
    const ir::Type& other_t = types[1 - side];
    int j = IndexOf(my_c, d);
    if (j >= 0) {
      Sharding o = Moved(s, d, static_cast<int>(other_c[j]), other_t.shape.rank());
      if (!Fits(o, other_t, mesh)) continue;
      p.out = Rep(rank);
      p.out.partial = "sum";
      p.out.partial_axis = mesh.axis;
      p.operands = side == 0 ? std::vector<Sharding>{s, o} : std::vector<Sharding>{o, s};
      return p;
    }
    j = IndexOf(my_b, d);
    if (j >= 0) {
      Sharding o = Moved(s, d, static_cast<int>(other_b[j]), other_t.shape.rank());
      if (!Fits(o, other_t, mesh)) continue;
      p.out = Moved(s, d, j, rank);
      p.operands = side == 0 ? std::vector<Sharding>{s, o} : std::vector<Sharding>{o, s};
      return p;
    }
  }
  p.out = Rep(rank);
  p.operands = {Rep(lr), Rep(rr)};
  return p;
}

Plan Reduce(const ir::Node& n, const std::vector<ir::Type>& types, const std::vector<Sharding>& in,
            const Mesh& mesh) {
  const std::vector<int64_t>& dims = n.attr_ints("dimensions");
  const int rank = n.type().shape.rank();
  const int d = in[0].split_dim();
  Plan p;
  p.operands = {in[0]};
  if (d < 0) {
    p.out = Rep(rank);
    return p;
  }
  if (IndexOf(dims, d) >= 0) {
    if (n.opcode() == Opcode::kReduceMin) return Replicated(n, types);
    p.out = Rep(rank);
    p.out.partial = n.opcode() == Opcode::kReduceSum ? "sum" : "max";
    p.out.partial_axis = mesh.axis;
    return p;
  }
  int removed_before = 0;
  for (int64_t k : dims)
    if (k < d) ++removed_before;
  p.out = Moved(in[0], d, d - removed_before, rank);
  return p;
}

Plan Reshape(const ir::Node& n, const std::vector<ir::Type>& types, const std::vector<Sharding>& in,
             const Mesh& mesh) {
  Plan p;
  if (in[0].split_dim() < 0) {
    p.out = Rep(n.type().shape.rank());
    p.operands = {in[0]};
    return p;
  }
  p.out = FromGrain(n.type(), Grain(types[0], in[0], mesh), mesh);
  p.operands = {p.out.split_dim() >= 0 ? in[0] : Rep(types[0].shape.rank())};
  if (p.out.split_dim() < 0) p.lowering = Lowering::kReplicated;
  return p;
}

// slice / pad / concatenate along a split dim keep it when every boundary falls between whole
// groups (blocks of dim / groups elements): then each rank's part of every block stays its own.
Plan Slice(const ir::Node& n, const std::vector<ir::Type>& types, const std::vector<Sharding>& in,
           const Mesh& mesh) {
  const int d = in[0].split_dim();
  if (d < 0) return Plan{Rep(n.type().shape.rank()), {in[0]}, Lowering::kLocal};
  const int64_t block = types[0].shape.dim(d) / in[0].dims[d].groups;
  const int64_t start = n.attr_ints("start")[d], limit = n.attr_ints("limit")[d];
  const int64_t stride = n.has_attr("stride") ? n.attr_ints("stride")[d] : 1;
  if (stride != 1 || start % block != 0 || limit % block != 0 || limit <= start)
    return Replicated(n, types);
  Sharding out = in[0];
  out.dims[d].groups = (limit - start) / block;
  return Plan{out, {in[0]}, Lowering::kLocal};
}

Plan Pad(const ir::Node& n, const std::vector<ir::Type>& types, const std::vector<Sharding>& in,
         const Mesh& mesh) {
  const int d = in[0].split_dim();
  if (d < 0) return Plan{Rep(n.type().shape.rank()), {in[0]}, Lowering::kLocal};
  const int64_t block = types[0].shape.dim(d) / in[0].dims[d].groups;
  const int64_t low = n.attr_ints("low")[d], high = n.attr_ints("high")[d];
  const int64_t interior = n.attr_ints("interior")[d];
  if (interior != 0 || low % block != 0 || high % block != 0) return Replicated(n, types);
  Sharding out = in[0];
  out.dims[d].groups = n.type().shape.dim(d) / block;
  (void)mesh;
  return Plan{out, {in[0]}, Lowering::kLocal};
}

Plan Concatenate(const ir::Node& n, const std::vector<ir::Type>& types,
                 const std::vector<Sharding>& in, const Mesh& mesh) {
  const int axis = static_cast<int>(n.attr_int("dimension"));
  const int rank = n.type().shape.rank();
  int first = -1;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].split_dim() >= 0) {
      first = static_cast<int>(i);
      break;
    }
  if (first < 0) return Plan{Rep(rank), in, Lowering::kLocal};
  const int d = in[first].split_dim();
  Plan p;
  p.lowering = Lowering::kLocal;
  if (d != axis) {
    p.out = in[first];
    p.operands.assign(in.size(), in[first]);
    return p;
  }
  const int64_t block = types[first].shape.dim(d) / in[first].dims[d].groups;
  int64_t groups = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t size = types[i].shape.dim(d);
    if (size % block != 0) return Replicated(n, types);
    Sharding s = in[first];
    s.dims[d].groups = size / block;
    p.operands.push_back(s);
    groups += size / block;
  }
  p.out = in[first];
  p.out.dims[d].groups = groups;
  (void)mesh;
  return p;
}

Plan Gather(const ir::Node& n, const std::vector<ir::Type>& types, const std::vector<Sharding>& in,
            const Mesh& mesh) {
  const int axis = static_cast<int>(n.attr_int("axis"));
  const int ir_rank = types[1].shape.rank();
  const int rank = n.type().shape.rank();
  const int dt = in[0].split_dim(), di = in[1].split_dim();
  Plan p;
  if (dt == axis && in[0].dims[dt].groups == 1) {
    p.out = Rep(rank);
    p.out.partial = "sum";
    p.out.partial_axis = mesh.axis;
    p.operands = {in[0], Rep(ir_rank)};
    p.lowering = Lowering::kVocabGather;
    return p;
  }
  if (dt >= 0 && dt != axis) {
    p.out = Moved(in[0], dt, dt < axis ? dt : dt + ir_rank - 1, rank);
    p.operands = {in[0], Rep(ir_rank)};
    return p;
  }
  if (dt < 0 && di >= 0) {
    p.out = Moved(in[1], di, axis + di, rank);
    p.operands = {in[0], in[1]};
    return p;
  }
  return Replicated(n, types);
}

Plan ScatterAdd(const ir::Node& n, const std::vector<ir::Type>& types,
                const std::vector<Sharding>& in, const Sharding* hint, const Mesh& mesh) {
  const int axis = static_cast<int>(n.attr_int("axis"));
  const int ir_rank = types[1].shape.rank(), ur = types[2].shape.rank();
  Sharding target = in[0];
  if (target.split_dim() < 0 && UsableHint(hint, n.type(), mesh)) target = *hint;
  const int d = target.split_dim();
  if (d < 0) return Replicated(n, types);
  Plan p;
  p.out = target;
  if (d == axis) {
    if (target.dims[d].groups != 1) return Replicated(n, types);
    p.operands = {target, Rep(ir_rank), Rep(ur)};
    p.lowering = Lowering::kScatterOffset;
    return p;
  }
  Sharding u = Moved(target, d, d < axis ? d : d + ir_rank - 1, ur);
  p.operands = {target, Rep(ir_rank), u};
  return p;
}

Plan Softmax(const ir::Node& n, const std::vector<Sharding>& in) {
  const int64_t axis = n.attr_int("axis");
  const int rank = n.type().shape.rank();
  const int a = static_cast<int>(axis < 0 ? axis + rank : axis);
  Plan p{in[0], {in[0]}, Lowering::kLocal};
  if (in[0].split_dim() == a) p.lowering = Lowering::kSplitSoftmax;
  return p;
}

Plan CrossEntropy(const ir::Node& n, const std::vector<ir::Type>& types,
                  const std::vector<Sharding>& in, const Mesh& mesh) {
  const int last = types[0].shape.rank() - 1;
  const int d = in[0].split_dim();
  if (d < 0)
    return Plan{Rep(n.type().shape.rank()), {in[0], Rep(types[1].shape.rank())}, Lowering::kLocal};
  if (d == last) {
    if (in[0].dims[d].groups != 1) return Replicated(n, types);
    return Plan{Rep(n.type().shape.rank()),
                {in[0], Rep(types[1].shape.rank())},
                Lowering::kSplitCrossEntropy};
  }
  Sharding l = Moved(in[0], d, d, types[1].shape.rank());
  if (!Fits(l, types[1], mesh)) return Replicated(n, types);
  return Plan{l, {in[0], l}, Lowering::kLocal};
}

// layer_norm / rms_norm normalize the last dim; attention mixes its last two: a split of a
// leading dim stays, anything else is replicated.
Plan LeadingDimsOnly(const ir::Node& n, const std::vector<ir::Type>& types,
                     const std::vector<Sharding>& in, int trailing, int split_operands) {
  const int d = in[0].split_dim();
  const int rank = types[0].shape.rank();
  if (d < 0 || d >= rank - trailing) return Replicated(n, types);
  Plan p;
  p.out = in[0];
  for (size_t i = 0; i < types.size(); ++i)
    p.operands.push_back(static_cast<int>(i) < split_operands ? in[0] : Rep(types[i].shape.rank()));
  return p;
}

}  // namespace

Sharding Split(int rank, int dim, int64_t groups, const Mesh& mesh) {
  Sharding s = Sharding::Replicated(rank);
  s.dims[dim].axis = mesh.axis;
  s.dims[dim].groups = groups;
  return s;
}

bool Fits(const Sharding& s, const ir::Type& type, const Mesh& mesh) {
  if (!s.partial.empty() || s.rank() != type.shape.rank()) return false;
  const int d = s.split_dim();
  if (d < 0) return true;
  const int64_t n = type.shape.dim(d), g = s.dims[d].groups;
  return g >= 1 && n % g == 0 && (n / g) % mesh.size == 0 && n > 0;
}

ir::Type LocalType(const ir::Type& type, const Sharding& s, const Mesh& mesh) {
  ir::Type t = type;
  const int d = s.split_dim();
  if (d < 0) return t;
  std::vector<int64_t> dims = type.shape.dims();
  dims[d] /= mesh.size;
  t.shape = Shape(dims);
  return t;
}

Sharding Resolved(const Sharding& s) {
  Sharding r = s;
  r.partial.clear();
  r.partial_axis.clear();
  return r;
}

Plan PlanNode(const ir::Node& n, const std::vector<ir::Type>& types,
              const std::vector<Sharding>& in, const Sharding* hint, const Mesh& mesh) {
  const int rank = n.type().shape.rank();
  const ir::OpInfo& info = ir::OpTraits(n.opcode());
  if (n.opcode() == Opcode::kIota) {
    Plan p{Rep(rank), {}, Lowering::kLocal};
    if (UsableHint(hint, n.type(), mesh)) {
      const int d = hint->split_dim();
      if (d != n.attr_int("dimension")) {
        p.out = *hint;
      } else if (hint->dims[d].groups == 1) {
        p.out = *hint;
        p.lowering = Lowering::kIotaOffset;
      }
    }
    return p;
  }
  if (info.kind == ir::OpKind::kElementwise) return Elementwise(n, types, in, hint, mesh);
  switch (n.opcode()) {
    case Opcode::kBroadcastInDim:
      return Broadcast(n, types, in, hint, mesh);
    case Opcode::kTranspose: {
      const std::vector<int64_t>& perm = n.attr_ints("permutation");
      Sharding out = Rep(rank);
      for (int i = 0; i < rank; ++i) out.dims[i] = in[0].dims[perm[i]];
      return Plan{out, {in[0]}, Lowering::kLocal};
    }
    case Opcode::kReshape:
      return Reshape(n, types, in, mesh);
    case Opcode::kDotGeneral:
      return DotGeneral(n, types, in, mesh);
    case Opcode::kReduceSum:
    case Opcode::kReduceMax:
    case Opcode::kReduceMin:
      return Reduce(n, types, in, mesh);
    case Opcode::kArgmax: {
      const int d = in[0].split_dim(), axis = static_cast<int>(n.attr_int("axis"));
      if (d < 0) return Plan{Rep(rank), {in[0]}, Lowering::kLocal};
      if (d == axis) return Replicated(n, types);
      return Plan{Moved(in[0], d, d < axis ? d : d - 1, rank), {in[0]}, Lowering::kLocal};
    }
    case Opcode::kSlice:
      return Slice(n, types, in, mesh);
    case Opcode::kPad:
      return Pad(n, types, in, mesh);
    case Opcode::kConcatenate:
      return Concatenate(n, types, in, mesh);
    case Opcode::kGather:
      return Gather(n, types, in, mesh);
    case Opcode::kScatterAdd:
      return ScatterAdd(n, types, in, hint, mesh);
    case Opcode::kSoftmax:
    case Opcode::kLogSoftmax:
      return Softmax(n, in);
    case Opcode::kCrossEntropy:
      return CrossEntropy(n, types, in, mesh);
    case Opcode::kAllReduce:
      // The data-parallel gradient all-reduce runs over the other mesh axis: it keeps the
      // layout. One over this axis is already partitioned: computed as it is.
      if (!n.has_attr("axis")) return Plan{in[0], {in[0]}, Lowering::kLocal};
      return Replicated(n, types);
    case Opcode::kLayerNorm:
    case Opcode::kRmsNorm:
      return LeadingDimsOnly(n, types, in, /*trailing=*/1, /*split_operands=*/1);
    case Opcode::kAttention:
      return LeadingDimsOnly(n, types, in, /*trailing=*/2, /*split_operands=*/3);
    default:
      break;
  }
  // constants, random bits, collectives already in the program, convolutions, pooling, ...
  return Replicated(n, types);
}

}  // namespace kiln::compiler::sharding
