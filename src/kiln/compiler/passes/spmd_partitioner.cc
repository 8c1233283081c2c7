#include "kiln/compiler/passes/spmd_partitioner.h"

#include <cstring>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/passes/sharding_propagation.h"
#include "kiln/ir/op_traits.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;
using ir::Sharding;
using sharding::Lowering;

std::vector<int64_t> AllBut(int rank, int skip) {
  std::vector<int64_t> v;
  for (int d = 0; d < rank; ++d)
    if (d != skip) v.push_back(d);
  return v;
}

class Partitioner {
 public:
  Partitioner(const ir::Graph& g, const SpmdOptions& o)
      : g_(g), o_(o), m_(o.mesh), out_(g.name()) {}

  absl::StatusOr<ir::Graph> Run();

 private:
  const ir::Type& T(int v) const { return out_.node(v).type(); }
  absl::StatusOr<int> Add(Opcode op, std::vector<int> operands, ir::AttrMap attrs = {},
                          std::optional<ir::Type> declared = std::nullopt) {
    std::vector<ir::Type> types;
    for (int v : operands) types.push_back(T(v));
    KILN_ASSIGN_OR_RETURN(ir::Type t, ir::InferType(op, types, attrs, declared));
    return out_.AddNode(op, std::move(operands), std::move(t), std::move(attrs));
  }
  int Const(Tensor t) {
    ir::Type type{t.dtype(), t.shape()};
    return out_.AddNode(Opcode::kConstant, {}, type, {},
                        std::make_shared<const Tensor>(std::move(t)));
  }
  absl::StatusOr<int> Splat(double v, const ir::Type& t) {
    Tensor s(t.dtype, Shape{});
    s.SetDouble(0, v);
    int c = Const(std::move(s));
    if (t.shape.rank() == 0) return c;
    return Bcast(c, t.shape, {});
  }
  absl::StatusOr<int> Bcast(int v, const Shape& shape, std::vector<int64_t> bd) {
    return Add(Opcode::kBroadcastInDim, {v},
               {{"shape", shape.dims()}, {"broadcast_dimensions", std::move(bd)}});
  }
  absl::StatusOr<int> Binary(Opcode op, int a, int b) { return Add(op, {a, b}); }
  absl::StatusOr<int> Compare(int a, int b, const char* dir) {
    return Add(Opcode::kCompare, {a, b}, {{"direction", std::string(dir)}});
  }
  absl::StatusOr<int> AllReduce(int v, const std::string& reduction) {
    return Add(Opcode::kAllReduce, {v}, {{"reduction", reduction}, {"axis", m_.axis}});
  }
  absl::StatusOr<int> Reduce(Opcode op, int v, std::vector<int64_t> dims) {
    return Add(op, {v}, {{"dimensions", std::move(dims)}});
  }
  absl::StatusOr<int> Reshape(int v, const Shape& shape) {
    return Add(Opcode::kReshape, {v}, {{"shape", shape.dims()}});
  }

  absl::StatusOr<int> PartitionId();
  // rank * per_rank as a scalar of `dtype`.
  absl::StatusOr<int> Offset(int64_t per_rank, DType dtype);
  absl::StatusOr<int> Reshard(int v, const ir::Type& global, const Sharding& from,
                              const Sharding& to);
  absl::StatusOr<int> Lower(const ir::Node& n, const sharding::Plan& p,
                            const std::vector<int>& ops);
  absl::StatusOr<int> LowerLocal(const ir::Node& n, const sharding::Plan& p,
                                 const std::vector<int>& ops);
  absl::StatusOr<int> SplitSoftmax(const ir::Node& n, int x);
  absl::StatusOr<int> SplitCrossEntropy(const ir::Node& n, int x, int labels);

  const ir::Graph& g_;
  const SpmdOptions& o_;
  const sharding::Mesh& m_;
  ir::Graph out_;
  std::optional<int> rank_;
};

absl::StatusOr<int> Partitioner::PartitionId() {
  if (rank_) return *rank_;
  const int64_t M = m_.size;
  std::vector<int32_t> iota(static_cast<size_t>(M));
  std::iota(iota.begin(), iota.end(), 0);
  int c = Const(Tensor::FromVector(Shape{M}, iota));
  // Every rank sends [0, 1, ..., M-1]; rank r receives the sum of element r: M * r.
  KILN_ASSIGN_OR_RETURN(
      int rs, Add(Opcode::kReduceScatter, {c}, {{"dimension", int64_t{0}}, {"replicas", M}}));
  KILN_ASSIGN_OR_RETURN(int f, Add(Opcode::kConvert, {rs}, {}, ir::Type{DType::kF32, Shape{1}}));
  int m = Const(Tensor::FromVector(Shape{1}, std::vector<float>{static_cast<float>(M)}));
  KILN_ASSIGN_OR_RETURN(int q, Binary(Opcode::kDiv, f, m));
  KILN_ASSIGN_OR_RETURN(int i, Add(Opcode::kConvert, {q}, {}, ir::Type{DType::kS32, Shape{1}}));
  KILN_ASSIGN_OR_RETURN(int r, Reshape(i, Shape{}));
  rank_ = r;
  return r;
}

absl::StatusOr<int> Partitioner::Offset(int64_t per_rank, DType dtype) {
  KILN_ASSIGN_OR_RETURN(int r, PartitionId());
  Tensor k(DType::kS32, Shape{});
  k.SetDouble(0, static_cast<double>(per_rank));
  KILN_ASSIGN_OR_RETURN(int off, Binary(Opcode::kMul, r, Const(std::move(k))));
  if (dtype == DType::kS32) return off;
  return Add(Opcode::kConvert, {off}, {}, ir::Type{dtype, Shape{}});
}

absl::StatusOr<int> Partitioner::Reshard(int v, const ir::Type& global, const Sharding& from,
                                         const Sharding& to) {
  if (from == to) return v;
  const int64_t M = m_.size;
  if (from.split_dim() >= 0) {  // gather to replicated
    const int d = from.split_dim();
    const int64_t g = from.dims[d].groups;
    if (g == 1) {
      KILN_ASSIGN_OR_RETURN(
          v, Add(Opcode::kAllGather, {v}, {{"dimension", int64_t{d}}, {"replicas", M}}));
    } else {
      std::vector<int64_t> dims = T(v).shape.dims();
      std::vector<int64_t> grouped(dims.begin(), dims.begin() + d);
      grouped.push_back(g);
      grouped.push_back(dims[d] / g);
      grouped.insert(grouped.end(), dims.begin() + d + 1, dims.end());
      KILN_ASSIGN_OR_RETURN(v, Reshape(v, Shape(grouped)));
      KILN_ASSIGN_OR_RETURN(
          v, Add(Opcode::kAllGather, {v}, {{"dimension", int64_t{d + 1}}, {"replicas", M}}));
      KILN_ASSIGN_OR_RETURN(v, Reshape(v, global.shape));
    }
  }
  if (to.split_dim() < 0) return v;
  // Replicated -> split: each rank gathers its own rows along the split dim.
  const int d = to.split_dim();
  const int64_t n = global.shape.dim(d), g = to.dims[d].groups, block = n / g, lb = block / M;
  int base;
  if (g == 1) {
    KILN_ASSIGN_OR_RETURN(base, Add(Opcode::kIota, {}, {{"dimension", int64_t{0}}},
                                    ir::Type{DType::kS32, Shape{n / M}}));
  } else {
    std::vector<int32_t> rows;
    for (int64_t q = 0; q < g; ++q)
      for (int64_t w = 0; w < lb; ++w) rows.push_back(static_cast<int32_t>(q * block + w));
    base = Const(Tensor::FromVector(Shape{n / M}, rows));
  }
  KILN_ASSIGN_OR_RETURN(int off, Offset(lb, DType::kS32));
  KILN_ASSIGN_OR_RETURN(int offb, Bcast(off, Shape{n / M}, {}));
  KILN_ASSIGN_OR_RETURN(int idx, Binary(Opcode::kAdd, base, offb));
  return Add(Opcode::kGather, {v, idx}, {{"axis", int64_t{d}}});
}

absl::StatusOr<int> Partitioner::LowerLocal(const ir::Node& n, const sharding::Plan& p,
                                            const std::vector<int>& ops) {
  const ir::Type local = sharding::LocalType(n.type(), sharding::Resolved(p.out), m_);
  ir::AttrMap attrs = n.attrs();
  attrs.erase(ir::kShardingAttr);
  std::optional<ir::Type> declared;
  if (ir::OpTraits(n.opcode()).declared_type()) declared = local;
  switch (n.opcode()) {
    case Opcode::kBroadcastInDim:
    case Opcode::kReshape:
      attrs["shape"] = local.shape.dims();
      break;
    case Opcode::kSlice:
    case Opcode::kPad: {
      const int d = p.operands[0].split_dim();
      if (d < 0) break;
      const ir::Type& in = g_.node(n.operand(0)).type();
      const int64_t block = in.shape.dim(d) / p.operands[0].dims[d].groups;
      const int64_t lb = block / m_.size;
      for (const char* key : n.opcode() == Opcode::kSlice
                                 ? std::vector<const char*>{"start", "limit"}
                                 : std::vector<const char*>{"low", "high"}) {
        std::vector<int64_t> v = n.attr_ints(key);
        v[d] = v[d] / block * lb;
        attrs[key] = v;
      }
      break;
    }
    default:
      break;
  }
  if (n.opcode() == Opcode::kConstant)
    return out_.AddNode(Opcode::kConstant, {}, n.type(), attrs, n.shared_literal());
  absl::StatusOr<int> v = Add(n.opcode(), ops, std::move(attrs), declared);
  if (!v.ok())
    return absl::InternalError(absl::StrCat("spmd-partitioner: local %", n.id(), " (",
                                            std::string(ir::OpcodeName(n.opcode())),
                                            "): ", v.status().message()));
  const ir::Type want = p.out.partial.empty() ? local : n.type();
  if (T(*v) != want)
    return absl::InternalError(absl::StrCat("spmd-partitioner: local %", n.id(), " (",
                                            std::string(ir::OpcodeName(n.opcode())), ") is ",
                                            T(*v).ToString(), ", expected ", want.ToString()));
  return v;
}

absl::StatusOr<int> Partitioner::SplitSoftmax(const ir::Node& n, int x) {
  const ir::Type t = T(x);
  const int rank = t.shape.rank();
  int64_t a = n.attr_int("axis");
  if (a < 0) a += rank;
  const std::vector<int64_t> keep = AllBut(rank, static_cast<int>(a));
  KILN_ASSIGN_OR_RETURN(int m, Reduce(Opcode::kReduceMax, x, {a}));
  KILN_ASSIGN_OR_RETURN(m, AllReduce(m, "max"));
  KILN_ASSIGN_OR_RETURN(int mb, Bcast(m, t.shape, keep));
  KILN_ASSIGN_OR_RETURN(int sh, Binary(Opcode::kSub, x, mb));
  KILN_ASSIGN_OR_RETURN(int e, Add(Opcode::kExp, {sh}));
  KILN_ASSIGN_OR_RETURN(int s, Reduce(Opcode::kReduceSum, e, {a}));
  KILN_ASSIGN_OR_RETURN(s, AllReduce(s, "sum"));
  KILN_ASSIGN_OR_RETURN(int sb, Bcast(s, t.shape, keep));
  if (n.opcode() == Opcode::kSoftmax) return Binary(Opcode::kDiv, e, sb);
  KILN_ASSIGN_OR_RETURN(int ls, Add(Opcode::kLog, {sb}));
  return Binary(Opcode::kSub, sh, ls);
}

absl::StatusOr<int> Partitioner::SplitCrossEntropy(const ir::Node& n, int x, int labels) {
  const ir::Type t = T(x), lt = T(labels);
  const int last = t.shape.rank() - 1;
  const int64_t classes = g_.node(n.operand(0)).type().shape.dim(last);
  const int64_t local = t.shape.dim(last);
  const std::vector<int64_t> keep = AllBut(last + 1, last);
  KILN_ASSIGN_OR_RETURN(int m, Reduce(Opcode::kReduceMax, x, {last}));
  KILN_ASSIGN_OR_RETURN(m, AllReduce(m, "max"));
  KILN_ASSIGN_OR_RETURN(int mb, Bcast(m, t.shape, keep));
  KILN_ASSIGN_OR_RETURN(int sh, Binary(Opcode::kSub, x, mb));
  KILN_ASSIGN_OR_RETURN(int e, Add(Opcode::kExp, {sh}));
  KILN_ASSIGN_OR_RETURN(int s, Reduce(Opcode::kReduceSum, e, {last}));
  KILN_ASSIGN_OR_RETURN(s, AllReduce(s, "sum"));
  KILN_ASSIGN_OR_RETURN(int ls, Add(Opcode::kLog, {s}));
  KILN_ASSIGN_OR_RETURN(int lse, Binary(Opcode::kAdd, ls, m));
  // The target's logit: the rank that holds the label's class contributes it, the others 0.
  KILN_ASSIGN_OR_RETURN(int off, Offset(local, lt.dtype));
  KILN_ASSIGN_OR_RETURN(int offb, Bcast(off, lt.shape, {}));
  KILN_ASSIGN_OR_RETURN(int shifted, Binary(Opcode::kSub, labels, offb));
  KILN_ASSIGN_OR_RETURN(
      int cls, Add(Opcode::kIota, {}, {{"dimension", int64_t{last}}}, ir::Type{lt.dtype, t.shape}));
  KILN_ASSIGN_OR_RETURN(int lb, Bcast(shifted, t.shape, keep));
  KILN_ASSIGN_OR_RETURN(int hit, Compare(cls, lb, "eq"));
  KILN_ASSIGN_OR_RETURN(int zeros, Splat(0.0, t));
  KILN_ASSIGN_OR_RETURN(int picked, Add(Opcode::kSelect, {hit, x, zeros}));
  KILN_ASSIGN_OR_RETURN(int target, Reduce(Opcode::kReduceSum, picked, {last}));
  KILN_ASSIGN_OR_RETURN(target, AllReduce(target, "sum"));
  KILN_ASSIGN_OR_RETURN(int loss, Binary(Opcode::kSub, lse, target));
  // Out-of-range labels (ignore_index) give 0, as the op does.
  KILN_ASSIGN_OR_RETURN(int lo, Splat(0.0, lt));
  KILN_ASSIGN_OR_RETURN(int hi, Splat(static_cast<double>(classes), lt));
  KILN_ASSIGN_OR_RETURN(int ge, Compare(labels, lo, "ge"));
  KILN_ASSIGN_OR_RETURN(int lt_hi, Compare(labels, hi, "lt"));
  KILN_ASSIGN_OR_RETURN(int valid, Binary(Opcode::kLogicalAnd, ge, lt_hi));
  KILN_ASSIGN_OR_RETURN(int zero, Splat(0.0, T(loss)));
  return Add(Opcode::kSelect, {valid, loss, zero});
}

absl::StatusOr<int> Partitioner::Lower(const ir::Node& n, const sharding::Plan& p,
                                       const std::vector<int>& ops) {
  switch (p.lowering) {
    case Lowering::kLocal:
      return LowerLocal(n, p, ops);
    case Lowering::kReplicated: {
      ir::AttrMap attrs = n.attrs();
      attrs.erase(ir::kShardingAttr);
      if (n.opcode() == Opcode::kConstant)
        return out_.AddNode(Opcode::kConstant, {}, n.type(), attrs, n.shared_literal());
      std::optional<ir::Type> declared;
      if (ir::OpTraits(n.opcode()).declared_type()) declared = n.type();
      return Add(n.opcode(), ops, std::move(attrs), declared);
    }
    case Lowering::kIotaOffset: {
      KILN_ASSIGN_OR_RETURN(int local, LowerLocal(n, p, ops));
      const int d = static_cast<int>(n.attr_int("dimension"));
      KILN_ASSIGN_OR_RETURN(int off, Offset(T(local).shape.dim(d), T(local).dtype));
      KILN_ASSIGN_OR_RETURN(int offb, Bcast(off, T(local).shape, {}));
      return Binary(Opcode::kAdd, local, offb);
    }
    case Lowering::kVocabGather: {
      const int axis = static_cast<int>(n.attr_int("axis"));
      const int64_t rows = T(ops[0]).shape.dim(axis);
      const ir::Type it = T(ops[1]);
      KILN_ASSIGN_OR_RETURN(int off, Offset(rows, it.dtype));
      KILN_ASSIGN_OR_RETURN(int offb, Bcast(off, it.shape, {}));
      KILN_ASSIGN_OR_RETURN(int shifted, Binary(Opcode::kSub, ops[1], offb));
      KILN_ASSIGN_OR_RETURN(int got,
                            Add(Opcode::kGather, {ops[0], shifted}, {{"axis", int64_t{axis}}}));
      KILN_ASSIGN_OR_RETURN(int lo, Splat(0.0, it));
      KILN_ASSIGN_OR_RETURN(int hi, Splat(static_cast<double>(rows), it));
      KILN_ASSIGN_OR_RETURN(int ge, Compare(shifted, lo, "ge"));
      KILN_ASSIGN_OR_RETURN(int lt, Compare(shifted, hi, "lt"));
      KILN_ASSIGN_OR_RETURN(int mine, Binary(Opcode::kLogicalAnd, ge, lt));
      std::vector<int64_t> bd;
      for (int k = 0; k < it.shape.rank(); ++k) bd.push_back(axis + k);
      KILN_ASSIGN_OR_RETURN(int mb, Bcast(mine, T(got).shape, bd));
      KILN_ASSIGN_OR_RETURN(int zeros, Splat(0.0, T(got)));
      return Add(Opcode::kSelect, {mb, got, zeros});
    }
    case Lowering::kScatterOffset: {
      const int axis = static_cast<int>(n.attr_int("axis"));
      const int64_t rows = T(ops[0]).shape.dim(axis);
      const ir::Type it = T(ops[1]);
      KILN_ASSIGN_OR_RETURN(int off, Offset(rows, it.dtype));
      KILN_ASSIGN_OR_RETURN(int offb, Bcast(off, it.shape, {}));
      KILN_ASSIGN_OR_RETURN(int shifted, Binary(Opcode::kSub, ops[1], offb));
      // Indices outside [0, rows) are dropped: each rank adds only the rows it holds.
      return Add(Opcode::kScatterAdd, {ops[0], shifted, ops[2]}, {{"axis", int64_t{axis}}});
    }
    case Lowering::kSplitSoftmax:
      return SplitSoftmax(n, ops[0]);
    case Lowering::kSplitCrossEntropy:
      return SplitCrossEntropy(n, ops[0], ops[1]);
  }
  return absl::InternalError("spmd-partitioner: unknown lowering");
}

absl::StatusOr<ir::Graph> Partitioner::Run() {
  const int n = g_.num_nodes();
  std::vector<int> local(n, -1);
  std::vector<Sharding> actual(n);
  for (const ir::Node& node : g_.nodes()) {
    absl::StatusOr<Sharding> stored = ir::ShardingOf(node);
    if (!stored.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("spmd-partitioner: node %", node.id(), ": ", stored.status().message()));
    if (node.opcode() == Opcode::kParameter) {
      if (!stored->partial.empty() || !sharding::Fits(*stored, node.type(), m_) ||
          (stored->split_dim() >= 0 && stored->dims[stored->split_dim()].axis != m_.axis))
        return absl::InvalidArgumentError(
            absl::StrCat("spmd-partitioner: parameter \"", node.attr_str("name"), "\": sharding ",
                         stored->ToString(), " does not lay out ", node.type().ToString(),
                         " over axis '", m_.axis, "' of ", m_.size, " ranks"));
      ir::AttrMap attrs = node.attrs();
      attrs.erase(ir::kShardingAttr);
      local[node.id()] = out_.AddNode(Opcode::kParameter, {},
                                      sharding::LocalType(node.type(), *stored, m_), attrs);
      actual[node.id()] = *stored;
      continue;
    }
    std::vector<ir::Type> types;
    std::vector<Sharding> in;
    for (int op : node.operands()) {
      types.push_back(g_.node(op).type());
      in.push_back(actual[op]);
    }
    sharding::Plan p = sharding::PlanNode(node, types, in, &*stored, m_);
    if (p.out != *stored)
      return absl::InvalidArgumentError(absl::StrCat(
          "spmd-partitioner: node %", node.id(), " (", std::string(ir::OpcodeName(node.opcode())),
          "): sharding ", stored->ToString(), " is not the one its operands give (",
          p.out.ToString(), "): run sharding-propagation first"));
    std::vector<int> ops;
    for (size_t i = 0; i < types.size(); ++i) {
      absl::StatusOr<int> v =
          Reshard(local[node.operand(static_cast<int>(i))], types[i], in[i], p.operands[i]);
      if (!v.ok())
        return absl::InternalError(absl::StrCat("spmd-partitioner: resharding operand ", i, " of %",
                                                node.id(), ": ", v.status().message()));
      ops.push_back(*v);
    }
    KILN_ASSIGN_OR_RETURN(int v, Lower(node, p, ops));
    if (!p.out.partial.empty()) {
      KILN_ASSIGN_OR_RETURN(v, AllReduce(v, p.out.partial));
    }
    local[node.id()] = v;
    actual[node.id()] = sharding::Resolved(p.out);
  }
  for (const ir::Output& o : g_.outputs()) {
    const ir::Type& t = g_.node(o.node).type();
    Sharding want = Sharding::Replicated(t.shape.rank());
    auto it = o_.output_shardings.find(o.name);
    if (it != o_.output_shardings.end()) {
      want = it->second;
      if (!sharding::Fits(want, t, m_))
        return absl::InvalidArgumentError(absl::StrCat("spmd-partitioner: output \"", o.name,
                                                       "\": sharding ", want.ToString(),
                                                       " does not lay out ", t.ToString()));
    } else if (o.in_place_of >= 0) {
      want = actual[g_.ParameterWithIndex(o.in_place_of)];
    }
    KILN_ASSIGN_OR_RETURN(int v, Reshard(local[o.node], t, actual[o.node], want));
    out_.AddOutput(o.name, v, o.in_place_of);
  }
  return std::move(out_);
}

}  // namespace

absl::StatusOr<bool> SpmdPartitioner::Run(ir::Graph& graph) {
  bool annotated = false;
  for (const ir::Node& n : graph.nodes()) annotated |= n.has_attr(ir::kShardingAttr);
  if (!annotated) return false;
  if (!graph.fusion_groups().empty())
    return absl::InvalidArgumentError(
        "spmd-partitioner: the graph has fusion groups; partition before fusion");
  if (options_.mesh.size < 1)
    return absl::InvalidArgumentError("spmd-partitioner: mesh axis size must be >= 1");
  Partitioner p(graph, options_);
  KILN_ASSIGN_OR_RETURN(ir::Graph out, p.Run());
  graph = std::move(out);
  return true;
}

absl::Status AnnotateParameters(ir::Graph& graph,
                                const std::map<std::string, ir::Sharding>& shardings) {
  ir::Graph out(graph.name());
  for (const ir::Node& n : graph.nodes()) {
    ir::AttrMap attrs = n.attrs();
    if (n.opcode() == Opcode::kParameter) {
      auto it = shardings.find(n.attr_str("name"));
      if (it != shardings.end()) {
        KILN_RETURN_IF_ERROR(
            Annotate(ir::CheckSharding(it->second, n.type()), "parameter \"" + it->first + "\""));
        attrs[ir::kShardingAttr] = it->second.ToString();
      }
    }
    out.AddNode(n.opcode(), n.operands(), n.type(), std::move(attrs), n.shared_literal());
  }
  for (const ir::Output& o : graph.outputs()) out.AddOutput(o.name, o.node, o.in_place_of);
  out.set_fusion_groups(graph.fusion_groups());
  graph = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<ir::Graph> PartitionSpmd(const ir::Graph& global, const SpmdOptions& options) {
  ir::Graph g = global;
  ShardingPropagation propagation(options.mesh);
  KILN_RETURN_IF_ERROR(propagation.Run(g).status());
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(g), "after sharding-propagation"));
  SpmdPartitioner partitioner(options);
  KILN_RETURN_IF_ERROR(partitioner.Run(g).status());
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(g), "after spmd-partitioner"));
  return g;
}

namespace {

struct Layout {
  int64_t outer = 1, groups = 1, block = 1, inner = 1, elem = 1;
};

absl::StatusOr<Layout> LayoutOf(const ir::Type& t, const Sharding& s, const sharding::Mesh& mesh) {
  if (!sharding::Fits(s, t, mesh))
    return absl::InvalidArgumentError(absl::StrCat("sharding ", s.ToString(), " does not lay out ",
                                                   t.ToString(), " over ", mesh.size, " ranks"));
  Layout l;
  l.elem = DTypeSize(t.dtype);
  const int d = s.split_dim();
  if (d < 0) return l;
  for (int k = 0; k < d; ++k) l.outer *= t.shape.dim(k);
  for (int k = d + 1; k < t.shape.rank(); ++k) l.inner *= t.shape.dim(k);
  l.groups = s.dims[d].groups;
  l.block = t.shape.dim(d) / l.groups;
  return l;
}

}  // namespace

absl::StatusOr<Tensor> ShardOf(const Tensor& full, const Sharding& s, const sharding::Mesh& mesh,
                               int rank) {
  const ir::Type t{full.dtype(), full.shape()};
  KILN_ASSIGN_OR_RETURN(Layout l, LayoutOf(t, s, mesh));
  if (s.split_dim() < 0) return full.Clone();
  Tensor out(full.dtype(), sharding::LocalType(t, s, mesh).shape);
  const int64_t lb = l.block / mesh.size, run = lb * l.inner * l.elem;
  const auto* src = static_cast<const uint8_t*>(full.raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t q = 0; q < l.groups; ++q) {
      const int64_t from = ((o * l.groups + q) * l.block + rank * lb) * l.inner * l.elem;
      std::memcpy(dst, src + from, static_cast<size_t>(run));
      dst += run;
    }
  return out;
}

absl::StatusOr<Tensor> Unshard(const std::vector<Tensor>& shards, const Sharding& s,
                               const sharding::Mesh& mesh) {
  if (static_cast<int64_t>(shards.size()) != mesh.size || shards.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("Unshard: ", shards.size(), " shards for ", mesh.size, " ranks"));
  const int d = s.split_dim();
  if (d < 0) return shards[0].Clone();
  std::vector<int64_t> dims = shards[0].shape().dims();
  if (d >= static_cast<int>(dims.size()))
    return absl::InvalidArgumentError("Unshard: sharding rank does not match the shards");
  dims[d] *= mesh.size;
  const ir::Type t{shards[0].dtype(), Shape(dims)};
  KILN_ASSIGN_OR_RETURN(Layout l, LayoutOf(t, s, mesh));
  Tensor out(t.dtype, t.shape);
  const int64_t lb = l.block / mesh.size, run = lb * l.inner * l.elem;
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  for (int r = 0; r < mesh.size; ++r) {
    if (shards[r].shape() != shards[0].shape() || shards[r].dtype() != shards[0].dtype())
      return absl::InvalidArgumentError("Unshard: shards differ in type");
    const auto* src = static_cast<const uint8_t*>(shards[r].raw_data());
    for (int64_t o = 0; o < l.outer; ++o)
      for (int64_t q = 0; q < l.groups; ++q) {
        const int64_t to = ((o * l.groups + q) * l.block + r * lb) * l.inner * l.elem;
        std::memcpy(dst + to, src, static_cast<size_t>(run));
        src += run;
      }
  }
  return out;
}

}  // namespace kiln::compiler
