// Data movement: broadcast_in_dim, transpose and slice are one strided copy each (planned at
// compile time, run by RunStridedCopy); pad is a fill plus a strided copy; concatenate a strided
// copy per operand; reshape a copy. Indexing ops: gather, scatter_add, iota.
#include <cstring>

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;

std::unique_ptr<Thunk> CopyThunk(const ir::Node& n, const std::string& how, CopyPlan plan,
                                 int64_t in_offset_bytes = 0) {
  int in = n.operand(0), out = n.id();
  return MakeFnThunk(n, how, [=](RunContext& ctx) {
    RunStridedCopy(plan, static_cast<const uint8_t*>(ctx.buffers[in]) + in_offset_bytes,
                   ctx.buffers[out]);
  });
}

// Parallel memcpy for large buffers.
void Memcpy(void* dst, const void* src, int64_t bytes) {
  constexpr int64_t kGrain = 1 << 20;
  ParallelFor(bytes, kGrain, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<uint8_t*>(dst) + b, static_cast<const uint8_t*>(src) + b, e - b);
  });
}

}  // namespace

LowerResult LowerStructural(const ir::Node& n, LowerContext& lc) {
  const ir::Type& it = lc.operand_type(n, 0);
  const std::vector<int64_t>& in_dims = it.shape.dims();
  const std::vector<int64_t>& out_dims = n.type().shape.dims();
  std::vector<int64_t> in_strides = RowMajorStrides(in_dims);
  std::vector<int64_t> out_strides = RowMajorStrides(out_dims);
  int64_t es = DTypeSize(n.type().dtype);
  int rank = static_cast<int>(out_dims.size());

  switch (n.opcode()) {
    case Opcode::kReshape: {
      int in = n.operand(0), out = n.id();
      int64_t bytes = n.type().byte_size();
      return MakeFnThunk(
          n, "copy", [=](RunContext& ctx) { Memcpy(ctx.buffers[out], ctx.buffers[in], bytes); });
    }
    case Opcode::kBroadcastInDim: {
      const auto& bd = n.attr_ints("broadcast_dimensions");
      std::vector<int64_t> s(rank, 0);
      for (size_t i = 0; i < bd.size(); ++i)
        if (in_dims[i] == out_dims[bd[i]]) s[bd[i]] = in_strides[i];
      return CopyThunk(n, "strided copy", PlanStridedCopy(out_dims, s, out_strides, es));
    }
    case Opcode::kTranspose: {
      const auto& perm = n.attr_ints("permutation");
      std::vector<int64_t> s(rank);
      for (int i = 0; i < rank; ++i) s[i] = in_strides[perm[i]];
      return CopyThunk(n, "strided copy", PlanStridedCopy(out_dims, s, out_strides, es));
    }
    case Opcode::kSlice: {
      const auto& start = n.attr_ints("start");
      std::vector<int64_t> stride =
          n.has_attr("stride") ? n.attr_ints("stride") : std::vector<int64_t>(rank, 1);
      if (stride.empty()) stride.assign(rank, 1);
      std::vector<int64_t> s(rank);
      int64_t base = 0;
      for (int i = 0; i < rank; ++i) {
        s[i] = in_strides[i] * stride[i];
        base += start[i] * in_strides[i];
      }
      return CopyThunk(n, "strided copy", PlanStridedCopy(out_dims, s, out_strides, es), base * es);
    }
    case Opcode::kPad: {
      const auto& low = n.attr_ints("low");
      std::vector<int64_t> interior =
          n.has_attr("interior") ? n.attr_ints("interior") : std::vector<int64_t>(rank, 0);
      if (interior.empty()) interior.assign(rank, 0);
      uint64_t value_bits = 0;
      StoreFromDouble(&value_bits, n.type().dtype, 0,
                      n.has_attr("value") ? n.attr_float("value") : 0.0);
      std::vector<int64_t> os(rank);
      int64_t base = 0;
      for (int i = 0; i < rank; ++i) {
        os[i] = out_strides[i] * (interior[i] + 1);
        base += low[i] * out_strides[i];
      }
      CopyPlan plan = PlanStridedCopy(in_dims, in_strides, os, es);
      int in = n.operand(0), out = n.id();
      int64_t count = n.type().shape.num_elements();
      return MakeFnThunk(n, "fill + strided copy", [=](RunContext& ctx) {
        FillBytes(ctx.buffers[out], count, &value_bits, es);
        RunStridedCopy(plan, ctx.buffers[in], static_cast<uint8_t*>(ctx.buffers[out]) + base * es);
      });
    }
    case Opcode::kConcatenate: {
      int axis = static_cast<int>(n.attr_int("dimension"));
      std::vector<std::pair<int, CopyPlan>> parts;
      std::vector<int64_t> offsets;
      int64_t at = 0;
      for (int k = 0; k < static_cast<int>(n.operands().size()); ++k) {
        const ir::Type& t = lc.operand_type(n, k);
        if (t.shape.num_elements() > 0) {
          parts.push_back(
              {n.operand(k),
               PlanStridedCopy(t.shape.dims(), RowMajorStrides(t.shape.dims()), out_strides, es)});
          offsets.push_back(at * out_strides[axis] * es);
        }
        at += t.shape.dim(axis);
      }
      int out = n.id();
      return MakeFnThunk(n, "strided copies", [=](RunContext& ctx) {
        for (size_t k = 0; k < parts.size(); ++k)
          RunStridedCopy(parts[k].second, ctx.buffers[parts[k].first],
                         static_cast<uint8_t*>(ctx.buffers[out]) + offsets[k]);
      });
    }
    default:
      return Unimplemented(n, "not a structural op");
  }
}

namespace {

int64_t LoadIndex(const void* p, DType t, int64_t i) {
  return t == DType::kS64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// out = operand; out[o, idx[i], j] += updates[o, i, j] for in-range indices. Each (o, j-chunk)
// is one task that walks i in order, so the result does not depend on the thread count.
template <typename S>
std::unique_ptr<Thunk> ScatterAddThunk(const ir::Node& n, LowerContext& lc) {
  const ir::Type& ot = lc.operand_type(n, 0);
  const ir::Type& xt = lc.operand_type(n, 1);
  int axis = static_cast<int>(n.attr_int("axis"));
  int64_t outer = 1, inner = 1, A = ot.shape.dim(axis), I = xt.shape.num_elements();
  for (int d = 0; d < axis; ++d) outer *= ot.shape.dim(d);
  for (int d = axis + 1; d < ot.shape.rank(); ++d) inner *= ot.shape.dim(d);
  DType it = xt.dtype;
  int operand = n.operand(0), indices = n.operand(1), updates = n.operand(2), out = n.id();
  int64_t count = ot.shape.num_elements();
  constexpr int64_t kChunk = 256;
  int64_t chunks = (inner + kChunk - 1) / kChunk;
  using C = typename Elem<S>::C;
  // Narrow floats accumulate in f32 in the workspace and round once at the end.
  constexpr bool kWide = !std::is_same_v<S, C>;
  int64_t ws_bytes = kWide ? count * static_cast<int64_t>(sizeof(C)) : 0;
  lc.cpu->RequireWorkspace(ws_bytes);
  std::shared_ptr<CpuContext> cpu = lc.cpu;
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    const S* src = static_cast<const S*>(ctx.buffers[operand]);
    const S* upd = static_cast<const S*>(ctx.buffers[updates]);
    const void* idx = ctx.buffers[indices];
    S* y = static_cast<S*>(ctx.buffers[out]);
    C* acc = kWide ? reinterpret_cast<C*>(cpu->workspace()) : nullptr;
    // In place (opcodes.def: scatter_add may overwrite its operand) only the rows hit are touched:
    // a tied embedding's gradient scatters into the LM head's dW without copying it.
    if (kWide || static_cast<const void*>(src) != static_cast<const void*>(y)) {
      ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if constexpr (kWide)
            acc[i] = Elem<S>::Load(src[i]);
          else
            y[i] = src[i];
        }
      });
    }
    ParallelFor(outer * chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / chunks, j0 = (t % chunks) * kChunk, j1 = std::min(inner, j0 + kChunk);
        for (int64_t i = 0; i < I; ++i) {
          int64_t k = LoadIndex(idx, it, i);
          if (k < 0 || k >= A) continue;
          const S* u = upd + (o * I + i) * inner;
          int64_t base = (o * A + k) * inner;
          for (int64_t j = j0; j < j1; ++j) {
            if constexpr (kWide) {
              acc[base + j] += Elem<S>::Load(u[j]);
            } else if constexpr (std::is_integral_v<S>) {
              using U = std::make_unsigned_t<S>;
              y[base + j] = static_cast<S>(static_cast<U>(y[base + j]) + static_cast<U>(u[j]));
            } else {
              y[base + j] += u[j];
            }
          }
        }
      }
    });
    if constexpr (kWide) {
      ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) y[i] = Elem<S>::Store(acc[i]);
      });
    }
  });
}

}  // namespace

// iota: the index along `dimension`. The output is runs of `inner` equal values (the dims after
// `dimension`), the value counting 0..D-1 and starting over for each outer index; the threads
// write whole runs with typed stores (a constant of [tokens x vocab] for the one-hot of a
// cross-entropy gradient is rebuilt every step, so it must run at memory speed).
template <typename T>
LowerResult IotaThunk(const ir::Node& n) {
  const DType t = n.type().dtype;
  const Shape& s = n.type().shape;
  const int dim = static_cast<int>(n.attr_int("dimension"));
  int64_t D = s.dim(dim), inner = 1;
  for (int d = dim + 1; d < s.rank(); ++d) inner *= s.dim(d);
  const int64_t runs = inner == 0 ? 0 : s.num_elements() / inner;
  const int out = n.id();
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, inner));
  return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
    T* y = static_cast<T*>(ctx.buffers[out]);
    ParallelFor(runs, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        T v;  // the value converted as the reference kernel converts it
        StoreFromDouble(&v, t, 0, static_cast<double>(r % D));
        T* row = y + r * inner;
        for (int64_t i = 0; i < inner; ++i) row[i] = v;
      }
    });
  });
}

LowerResult LowerIndexing(const ir::Node& n, LowerContext& lc) {
  switch (n.opcode()) {
    case Opcode::kGather: {
      const ir::Type& tt = lc.operand_type(n, 0);
      const ir::Type& xt = lc.operand_type(n, 1);
      if (xt.dtype != DType::kS32 && xt.dtype != DType::kS64) return UnsupportedDType(n, xt.dtype);
      int axis = static_cast<int>(n.attr_int("axis"));
      int64_t outer = 1, inner = 1, A = tt.shape.dim(axis), I = xt.shape.num_elements();
      for (int d = 0; d < axis; ++d) outer *= tt.shape.dim(d);
      for (int d = axis + 1; d < tt.shape.rank(); ++d) inner *= tt.shape.dim(d);
      int64_t row = inner * DTypeSize(tt.dtype);
      if (A == 0) {  // nothing to read: zeros
        int out = n.id();
        int64_t bytes = n.type().byte_size();
        return MakeFnThunk(n, "zeros",
                           [=](RunContext& ctx) { std::memset(ctx.buffers[out], 0, bytes); });
      }
      DType it = xt.dtype;
      int table = n.operand(0), indices = n.operand(1), out = n.id();
      return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
        const uint8_t* src = static_cast<const uint8_t*>(ctx.buffers[table]);
        const void* idx = ctx.buffers[indices];
        uint8_t* y = static_cast<uint8_t*>(ctx.buffers[out]);
        ParallelFor(outer * I, std::max<int64_t>(1, 65536 / std::max<int64_t>(row, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t t = b; t < e; ++t) {
                        int64_t o = t / I, i = t % I;
                        int64_t k = std::clamp<int64_t>(LoadIndex(idx, it, i), 0, A - 1);
                        std::memcpy(y + t * row, src + (o * A + k) * row, row);
                      }
                    });
      });
    }
    case Opcode::kScatterAdd: {
      DType t = n.type().dtype;
      DType it = lc.operand_type(n, 1).dtype;
      if (it != DType::kS32 && it != DType::kS64) return UnsupportedDType(n, it);
      return VisitNumeric(
          t,
          [&](auto tag) -> LowerResult {
            return ScatterAddThunk<typename decltype(tag)::type>(n, lc);
          },
          UnsupportedDType(n, t));
    }
    case Opcode::kIota: {
      DType t = n.type().dtype;
      if (t == DType::kBool) return IotaThunk<uint8_t>(n);
      return VisitNumeric(
          t, [&](auto tag) -> LowerResult { return IotaThunk<typename decltype(tag)::type>(n); },
          UnsupportedDType(n, t));
    }
    default:
      return Unimplemented(n, "not an indexing op");
  }
}

}  // namespace kiln::runtime::cpu
