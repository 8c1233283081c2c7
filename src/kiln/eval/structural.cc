// Reference kernels for data movement (byte copies, so every dtype works, f8 included), plus
// iota, scatter_add and the single-replica collectives.
#include <algorithm>
#include <cstring>

#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"
#include "kiln/ir/element_semantics.h"

namespace kiln::eval {
namespace {

using ir::Opcode;

// Copies element `from` of `src` to element `to` of `dst`; both have elements of `width` bytes.
inline void CopyElement(void* dst, int64_t to, const void* src, int64_t from, int64_t width) {
  std::memcpy(static_cast<uint8_t*>(dst) + to * width,
              static_cast<const uint8_t*>(src) + from * width, width);
}

// A kernel that fills every output element from one input element chosen by `source`, which maps
// an output multi-index to an input multi-index.
Kernel GatherByIndex(
    const ir::Node& n, OperandTypes types,
    std::function<void(const std::vector<int64_t>& out_idx, std::vector<int64_t>& in_idx)> source) {
  const ir::Type& in_type = types[0];
  std::vector<int64_t> out_dims = n.type().shape.dims();
  std::vector<int64_t> in_strides = in_type.shape.Strides();
  int in_rank = in_type.shape.rank();
  int64_t count = n.type().shape.num_elements();
  int64_t width = DTypeSize(n.type().dtype);
  int x = 0, y = ResultSlot(n);
  return [=](Buffers ctx) {
    std::vector<int64_t> out_idx, in_idx(in_rank);
    for (int64_t i = 0; i < count; ++i) {
      Unravel(i, out_dims, out_idx);
      source(out_idx, in_idx);
      CopyElement(Out(ctx, y), i, In(ctx, x), Ravel(in_idx, in_strides), width);
    }
  };
}

// Operand dim i maps to output dim bd[i]; an operand dim of size 1 stretches.
Kernel BroadcastInDim(const ir::Node& n, OperandTypes types) {
  std::vector<int64_t> bd = n.attr_ints("broadcast_dimensions");
  std::vector<int64_t> in_dims = types[0].shape.dims();
  return GatherByIndex(n, types,
                       [bd, in_dims](const std::vector<int64_t>& o, std::vector<int64_t>& in) {
                         for (size_t i = 0; i < bd.size(); ++i)
                           in[i] = in_dims[i] == 1 ? 0 : o[bd[i]];
                       });
}

// Output dim i is operand dim perm[i].
Kernel Transpose(const ir::Node& n, OperandTypes types) {
  std::vector<int64_t> perm = n.attr_ints("permutation");
  return GatherByIndex(n, types, [perm](const std::vector<int64_t>& o, std::vector<int64_t>& in) {
    for (size_t i = 0; i < perm.size(); ++i) in[perm[i]] = o[i];
  });
}

// out[i] = in[start + i * stride] per dimension (limit only fixes the output size).
Kernel Slice(const ir::Node& n, OperandTypes types) {
  std::vector<int64_t> start = n.attr_ints("start");
  std::vector<int64_t> stride =
      n.has_attr("stride") ? n.attr_ints("stride") : std::vector<int64_t>();
  if (stride.empty()) stride.assign(start.size(), 1);
  return GatherByIndex(n, types,
                       [start, stride](const std::vector<int64_t>& o, std::vector<int64_t>& in) {
                         for (size_t d = 0; d < start.size(); ++d)
                           in[d] = start[d] + o[d] * stride[d];
                       });
}

// Row-major data is unchanged by a reshape; all_gather / reduce_scatter are identities over one
// replica; all_reduce's kernel is this copy, and its thunk then sums the copy over the ranks
// (reference_backend.cc, through RunContext::collectives).
absl::StatusOr<Kernel> Copy(const ir::Node& n) {
  if (n.opcode() == Opcode::kAllGather || n.opcode() == Opcode::kReduceScatter) {
    int64_t replicas = n.attr_int("replicas");
    if (replicas != 1)
      return Unsupported(n, "the reference backend runs one replica; this op has replicas = " +
                                std::to_string(replicas) + " (partition the graph for a " +
                                "multi-process run instead)");
  }
  if (n.opcode() == Opcode::kAllReduce && n.has_attr("reduction") &&
      n.attr_str("reduction") != "sum")
    return Unsupported(n, "unknown reduction '" + n.attr_str("reduction") + "'");
  int x = 0, y = ResultSlot(n);
  size_t bytes = static_cast<size_t>(n.type().byte_size());
  return Kernel([=](Buffers ctx) {
    if (bytes > 0) std::memcpy(Out(ctx, y), In(ctx, x), bytes);
  });
}

// Operands are laid side by side along `dimension`.
Kernel Concatenate(const ir::Node& n, OperandTypes types) {
  int dim = static_cast<int>(n.attr_int("dimension"));
  std::vector<std::vector<int64_t>> in_dims;
  for (const ir::Type& t : types) in_dims.push_back(t.shape.dims());
  std::vector<int64_t> out_strides = n.type().shape.Strides();
  int64_t width = DTypeSize(n.type().dtype);
  int y = ResultSlot(n);
  return [=](Buffers ctx) {
    int64_t offset = 0;  // position of the current operand along `dim`
    std::vector<int64_t> idx;
    for (size_t k = 0; k < in_dims.size(); ++k) {
      int64_t count = 1;
      for (int64_t d : in_dims[k]) count *= d;
      for (int64_t i = 0; i < count; ++i) {
        Unravel(i, in_dims[k], idx);
        idx[dim] += offset;
        CopyElement(Out(ctx, y), Ravel(idx, out_strides), In(ctx, static_cast<int>(k)), i, width);
      }
      offset += in_dims[k][dim];
    }
  };
}

// Fills with `value`, then puts operand element i of each dim at low + i * (interior + 1).
// Positions outside the output (only possible with negative padding) are dropped.
Kernel Pad(const ir::Node& n, OperandTypes types) {
  std::vector<int64_t> low = n.attr_ints("low");
  std::vector<int64_t> interior =
      n.has_attr("interior") ? n.attr_ints("interior") : std::vector<int64_t>();
  if (interior.empty()) interior.assign(low.size(), 0);
  double value = n.has_attr("value") ? n.attr_float("value") : 0.0;
  std::vector<int64_t> in_dims = types[0].shape.dims();
  std::vector<int64_t> out_dims = n.type().shape.dims();
  std::vector<int64_t> out_strides = n.type().shape.Strides();
  int64_t in_count = types[0].shape.num_elements();
  int64_t out_count = n.type().shape.num_elements();
  DType t = n.type().dtype;
  int64_t width = DTypeSize(t);
  int x = 0, y = ResultSlot(n);
  return [=](Buffers ctx) {
    for (int64_t i = 0; i < out_count; ++i) StoreFromDouble(Out(ctx, y), t, i, value);
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < in_count; ++i) {
      Unravel(i, in_dims, idx);
      bool inside = true;
      for (size_t d = 0; d < idx.size(); ++d) {
        idx[d] = low[d] + idx[d] * (interior[d] + 1);
        inside = inside && idx[d] >= 0 && idx[d] < out_dims[d];
      }
      if (inside) CopyElement(Out(ctx, y), Ravel(idx, out_strides), In(ctx, x), i, width);
    }
  };
}

// Element value = its index along `dimension`.
absl::StatusOr<Kernel> Iota(const ir::Node& n) {
  KILN_RETURN_IF_ERROR(CheckDType(n, n.type().dtype, kFloatTypes | kIntTypes, "result"));
  int dim = static_cast<int>(n.attr_int("dimension"));
  AxisSplit s = SplitAt(n.type().shape, dim);
  DType t = n.type().dtype;
  int y = ResultSlot(n);
  return Kernel([=](Buffers ctx) {
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t k = 0; k < s.size; ++k)
        for (int64_t i = 0; i < s.inner; ++i)
          StoreFromInt64(Out(ctx, y), t, (o * s.size + k) * s.inner + i, k);
  });
}

// Shared by gather and scatter_add: table/operand [outer, A, inner], indices [J],
// gathered/updates [outer, J, inner].
struct IndexedAxis {
  int64_t outer, axis_size, num_indices, inner;
};
IndexedAxis Split(const Shape& table, int64_t num_indices, int axis) {
  AxisSplit s = SplitAt(table, axis);
  return {s.outer, s.size, num_indices, s.inner};
}

// out[o, j, i] = table[o, clamp(indices[j], 0, A - 1), i]. With A = 0 there is nothing to read
// and the output is zeros.
absl::StatusOr<Kernel> Gather(const ir::Node& n, OperandTypes types) {
  DType idx_t = types[1].dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, idx_t, kIntTypes, "indices"));
  IndexedAxis s =
      Split(types[0].shape, types[1].shape.num_elements(), static_cast<int>(n.attr_int("axis")));
  int64_t width = DTypeSize(n.type().dtype);
  size_t bytes = static_cast<size_t>(n.type().byte_size());
  int table = 0, indices = 1, y = ResultSlot(n);
  return Kernel([=](Buffers ctx) {
    if (s.axis_size == 0) {
      if (bytes > 0) std::memset(Out(ctx, y), 0, bytes);
      return;
    }
    for (int64_t j = 0; j < s.num_indices; ++j) {
      int64_t k = std::clamp<int64_t>(LoadAsInt64(In(ctx, indices), idx_t, j), 0, s.axis_size - 1);
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i)
          CopyElement(Out(ctx, y), (o * s.num_indices + j) * s.inner + i, In(ctx, table),
                      (o * s.axis_size + k) * s.inner + i, width);
    }
  });
}

// out = operand; out[o, indices[j], i] += updates[o, j, i], skipping indices outside [0, A).
// Sums accumulate in double (floats) or int64 (integers) and round once.
absl::StatusOr<Kernel> ScatterAdd(const ir::Node& n, OperandTypes types) {
  DType t = n.type().dtype;
  DType idx_t = types[1].dtype;
  DType upd_t = types[2].dtype;
  KILN_RETURN_IF_ERROR(CheckDType(n, t, kFloatTypes | kIntTypes, "operand"));
  KILN_RETURN_IF_ERROR(CheckDType(n, idx_t, kIntTypes, "indices"));
  KILN_RETURN_IF_ERROR(CheckDType(n, upd_t, kFloatTypes | kIntTypes, "updates"));
  IndexedAxis s =
      Split(n.type().shape, types[1].shape.num_elements(), static_cast<int>(n.attr_int("axis")));
  int64_t count = n.type().shape.num_elements();
  int operand = 0, indices = 1, updates = 2, y = ResultSlot(n);
  bool floating = IsFloating(t);
  return Kernel([=, acc = std::vector<double>(floating ? count : 0),
                 iacc = std::vector<int64_t>(floating ? 0 : count)](Buffers ctx) mutable {
    for (int64_t e = 0; e < count; ++e) {
      if (floating)
        acc[e] = LoadAsDouble(In(ctx, operand), t, e);
      else
        iacc[e] = LoadAsInt64(In(ctx, operand), t, e);
    }
    for (int64_t j = 0; j < s.num_indices; ++j) {
      int64_t k = LoadAsInt64(In(ctx, indices), idx_t, j);
      if (k < 0 || k >= s.axis_size) continue;
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i) {
          int64_t dst = (o * s.axis_size + k) * s.inner + i;
          int64_t src = (o * s.num_indices + j) * s.inner + i;
          if (floating)
            acc[dst] += LoadAsDouble(In(ctx, updates), upd_t, src);
          else
            iacc[dst] = ir::WrapAdd(iacc[dst], LoadAsInt64(In(ctx, updates), upd_t, src));
        }
    }
    for (int64_t e = 0; e < count; ++e) {
      if (floating)
        StoreFromDouble(Out(ctx, y), t, e, acc[e]);
      else
        StoreFromInt64(Out(ctx, y), t, e, iacc[e]);
    }
  });
}

}  // namespace

absl::StatusOr<Kernel> MakeStructuralKernel(const ir::Node& n, OperandTypes types) {
  switch (n.opcode()) {
    case Opcode::kBroadcastInDim:
      return BroadcastInDim(n, types);
    case Opcode::kTranspose:
      return Transpose(n, types);
    case Opcode::kSlice:
      return Slice(n, types);
    case Opcode::kReshape:
    case Opcode::kAllReduce:
    case Opcode::kAllGather:
    case Opcode::kReduceScatter:
      return Copy(n);
    case Opcode::kConcatenate:
      return Concatenate(n, types);
    case Opcode::kPad:
      return Pad(n, types);
    case Opcode::kIota:
      return Iota(n);
    case Opcode::kGather:
      return Gather(n, types);
    case Opcode::kScatterAdd:
      return ScatterAdd(n, types);
    default:
      return absl::InternalError("structural: unexpected op " +
                                 std::string(ir::OpcodeName(n.opcode())));
  }
}

}  // namespace kiln::eval
