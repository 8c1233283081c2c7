// Reductions over any set of dims. The input shape is collapsed at compile time into alternating
// kept and reduced groups (unit dims dropped, neighbours of the same kind merged). Two kernels
// cover every case:
//   - innermost group kept (e.g. sum over the batch of [B, D]): rows of the innermost group are
//     accumulated elementwise, in chunks, each (kept-outer index, chunk) one parallel task;
//   - innermost group reduced (e.g. sum over the last dim): contiguous runs are reduced with
//     several independent accumulators; one parallel task per output element, or, when there are
//     fewer outputs than threads, per-thread partials over the reduced range combined in order.
// Floats accumulate in f32 (f64 in f64), integers in 64 bits with wrap-around; max/min
// propagate NaN. An empty reduction gives the identity (0, -inf/lowest, +inf/highest).
#include <limits>
#include <type_traits>

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {
namespace {

using ir::Opcode;

enum class Red { kSum, kMax, kMin };

template <typename S, Red kOp>
struct Reducer {
  using C = typename Elem<S>::C;
  static constexpr bool kInt = std::is_integral_v<C>;
  using Acc = std::conditional_t<kOp == Red::kSum && kInt, uint64_t, C>;

  static Acc Init() {
    if constexpr (kOp == Red::kSum) {
      return Acc(0);
    } else if constexpr (kInt) {
      return kOp == Red::kMax ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
    } else {
      return kOp == Red::kMax ? -std::numeric_limits<C>::infinity()
                              : std::numeric_limits<C>::infinity();
    }
  }
  static Acc Load(S x) {
    if constexpr (kOp == Red::kSum && kInt)
      return static_cast<Acc>(static_cast<int64_t>(x));
    else
      return Elem<S>::Load(x);
  }
  static Acc Apply(Acc a, Acc v) {
    if constexpr (kOp == Red::kSum) {
      return a + v;
    } else if constexpr (kOp == Red::kMax) {
      if constexpr (kInt)
        return v > a ? v : a;
      else
        return (v > a || v != v) ? v : a;
    } else {
      if constexpr (kInt)
        return v < a ? v : a;
      else
        return (v < a || v != v) ? v : a;
    }
  }
  static S Store(Acc a) {
    if constexpr (kOp == Red::kSum && kInt)
      return static_cast<S>(static_cast<int64_t>(a));
    else
      return Elem<S>::Store(static_cast<C>(a));
  }
  // Reduces a contiguous run with 8 independent accumulators (vectorizable, and more accurate
  // than one running sum).
  static Acc Run(const S* p, int64_t n, Acc a) {
    Acc part[8];
    for (int k = 0; k < 8; ++k) part[k] = Init();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) part[k] = Apply(part[k], Load(p[i + k]));
    for (; i < n; ++i) part[i & 7] = Apply(part[i & 7], Load(p[i]));
    Acc q0 = Apply(Apply(part[0], part[1]), Apply(part[2], part[3]));
    Acc q1 = Apply(Apply(part[4], part[5]), Apply(part[6], part[7]));
    return Apply(a, Apply(q0, q1));
  }
};

struct Group {
  int64_t size;
  int64_t stride;  // input stride, elements
  bool reduced;
};

// Odometer over a list of groups: offset of the current multi-index.
struct Odometer {
  int64_t idx[kMaxRank] = {};
  int64_t offset = 0;
  void Seek(const std::vector<Group>& g, int64_t flat) {
    offset = 0;
    for (int d = static_cast<int>(g.size()) - 1; d >= 0; --d) {
      idx[d] = flat % g[d].size;
      flat /= g[d].size;
      offset += idx[d] * g[d].stride;
    }
  }
  void Next(const std::vector<Group>& g) {
    for (int d = static_cast<int>(g.size()) - 1; d >= 0; --d) {
      ++idx[d];
      offset += g[d].stride;
      if (idx[d] < g[d].size) return;
      offset -= idx[d] * g[d].stride;
      idx[d] = 0;
    }
  }
};

int64_t Product(const std::vector<Group>& g) {
  int64_t p = 1;
  for (const Group& x : g) p *= x.size;
  return p;
}

// The innermost group is kept: each output row accumulates kChunk contiguous outputs at a time
// over the reduced groups.
template <typename S, Red kOp>
std::unique_ptr<Thunk> KeptInnerReduceThunk(const ir::Node& n, int in, int out,
                                            const std::vector<Group>& kept,
                                            const std::vector<Group>& red) {
  using R = Reducer<S, kOp>;
  using Acc = typename R::Acc;
  int64_t I = kept.back().size;
  std::vector<Group> kouter(kept.begin(), kept.end() - 1);
  int64_t KO = Product(kouter), RC = Product(red);
  constexpr int64_t kChunk = 256;
  int64_t chunks = (I + kChunk - 1) / kChunk;
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, RC * kChunk));
  return MakeFnThunk(n, "loop reduce", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[in]);
    S* y = static_cast<S*>(ctx.buffers[out]);
    ParallelFor(KO * chunks, grain, [&](int64_t b, int64_t e) {
      Acc acc[kChunk];
      Odometer ko;
      ko.Seek(kouter, b / chunks);
      int64_t last_o = b / chunks;
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / chunks, j0 = (t % chunks) * kChunk, len = std::min(kChunk, I - j0);
        while (last_o < o) {
          ko.Next(kouter);
          ++last_o;
        }
        for (int64_t j = 0; j < len; ++j) acc[j] = R::Init();
        Odometer r;
        r.Seek(red, 0);
        for (int64_t ri = 0; ri < RC; ++ri) {
          const S* row = x + ko.offset + r.offset + j0;
          for (int64_t j = 0; j < len; ++j) acc[j] = R::Apply(acc[j], R::Load(row[j]));
          r.Next(red);
        }
        S* dst = y + o * I + j0;
        for (int64_t j = 0; j < len; ++j) dst[j] = R::Store(acc[j]);
      }
    });
  });
}

template <typename S, Red kOp>
std::unique_ptr<Thunk> ReduceThunk(const ir::Node& n, LowerContext& lc,
                                   const std::vector<Group>& groups) {
  using R = Reducer<S, kOp>;
  using Acc = typename R::Acc;
  int in = n.operand(0), out = n.id();
  int64_t out_count = n.type().shape.num_elements();
  int64_t in_count = lc.operand_type(n, 0).shape.num_elements();

  if (in_count == 0) {  // empty reduction: the identity everywhere
    return MakeFnThunk(n, "fill", [=](RunContext& ctx) {
      S* y = static_cast<S*>(ctx.buffers[out]);
      S v = R::Store(R::Init());
      for (int64_t i = 0; i < out_count; ++i) y[i] = v;
    });
  }

  std::vector<Group> kept, red;
  for (const Group& g : groups) (g.reduced ? red : kept).push_back(g);
  bool inner_kept = !groups.back().reduced;

  if (inner_kept) return KeptInnerReduceThunk<S, kOp>(n, in, out, kept, red);

  // Innermost group reduced: contiguous runs of J.
  int64_t J = red.back().size;
  std::vector<Group> router(red.begin(), red.end() - 1);
  int64_t KO = Product(kept), RO = Product(router);
  int max_threads = omp_get_max_threads();
  if (KO >= max_threads || KO * RO * J < 4 * kElementwiseGrain) {
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, RO * J));
    return MakeFnThunk(n, "loop reduce", [=](RunContext& ctx) {
      const S* x = static_cast<const S*>(ctx.buffers[in]);
      S* y = static_cast<S*>(ctx.buffers[out]);
      ParallelFor(KO, grain, [&](int64_t b, int64_t e) {
        Odometer ko;
        ko.Seek(kept, b);
        if (RO == 1) {  // one contiguous run per output (e.g. a global average pool's H x W)
          for (int64_t o = b; o < e; ++o) {
            y[o] = R::Store(R::Run(x + ko.offset, J, R::Init()));
            ko.Next(kept);
          }
          return;
        }
        Odometer r;  // outside the loop: its index array is not re-zeroed for every output
        for (int64_t o = b; o < e; ++o) {
          Acc acc = R::Init();
          r.Seek(router, 0);
          for (int64_t ri = 0; ri < RO; ++ri) {
            acc = R::Run(x + ko.offset + r.offset, J, acc);
            r.Next(router);
          }
          y[o] = R::Store(acc);
          ko.Next(kept);
        }
      });
    });
  }

  // Few outputs, much work: P partials over the flattened reduced range, combined in order.
  int P = max_threads;
  int64_t ws = AlignUp(static_cast<int64_t>(P) * KO * static_cast<int64_t>(sizeof(Acc)));
  lc.cpu->RequireWorkspace(ws);
  std::shared_ptr<CpuContext> cpu = lc.cpu;
  int64_t total = RO * J;
  return MakeFnThunk(n, "loop reduce (split)", [=](RunContext& ctx) {
    const S* x = static_cast<const S*>(ctx.buffers[in]);
    S* y = static_cast<S*>(ctx.buffers[out]);
    Acc* partial = reinterpret_cast<Acc*>(cpu->workspace());
    int threads = std::min(P, omp_in_parallel() ? 1 : omp_get_max_threads());
    for (int64_t i = 0; i < int64_t{P} * KO; ++i) partial[i] = R::Init();
#pragma omp parallel num_threads(threads)
    {
      int p = omp_get_thread_num(), np = omp_get_num_threads();
      int64_t begin = total * p / np, end = total * (p + 1) / np;
      Odometer ko;
      ko.Seek(kept, 0);
      for (int64_t o = 0; o < KO; ++o) {
        Acc acc = R::Init();
        int64_t f = begin;
        Odometer r;
        r.Seek(router, f / J);
        while (f < end) {
          int64_t j = f % J, len = std::min(J - j, end - f);
          acc = R::Run(x + ko.offset + r.offset + j, len, acc);
          f += len;
          if (j + len == J) r.Next(router);
        }
        partial[static_cast<int64_t>(p) * KO + o] = acc;
        ko.Next(kept);
      }
    }
    for (int64_t o = 0; o < KO; ++o) {
      Acc acc = R::Init();
      for (int p = 0; p < P; ++p) acc = R::Apply(acc, partial[static_cast<int64_t>(p) * KO + o]);
      y[o] = R::Store(acc);
    }
  });
}

template <typename S>
LowerResult ReduceFor(const ir::Node& n, LowerContext& lc, const std::vector<Group>& groups) {
  switch (n.opcode()) {
    case Opcode::kReduceSum:
      return ReduceThunk<S, Red::kSum>(n, lc, groups);
    case Opcode::kReduceMax:
      return ReduceThunk<S, Red::kMax>(n, lc, groups);
    default:
      return ReduceThunk<S, Red::kMin>(n, lc, groups);
  }
}

}  // namespace

// reduce_sum over H and W of an f32 [N, C, H, W] held channel-blocked (AssignBlockedLayouts,
// block L = ChannelBlock(): 16 or 8): each output sums its H*W values in Reducer::Run's order
// (value i into partial i % 8, the partials combined as a tree), so the result is bit for bit the
// row-major kernel's.
LowerResult BlockedSpatialSum(const ir::Node& n, LowerContext& lc) {
  const auto& d = lc.operand_type(n, 0).shape.dims();
  if (!IsSpatialSum(n, lc.graph) || n.type().shape.num_elements() != d[0] * d[1])
    return absl::InternalError(
        absl::StrCat(ThunkName(n, "loop reduce"), ": reads a blocked buffer it cannot reduce"));
  const int64_t L = ChannelBlock();
  const int64_t N = d[0], CB = d[1] / L, HW = d[2] * d[3];
  const int in = n.operand(0), out = n.id();
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, HW * L));
  return MakeFnThunk(n, absl::StrCat("loop reduce, nChw", L, "c"), [=](RunContext& ctx) {
    const float* x = static_cast<const float*>(ctx.buffers[in]);
    float* y = static_cast<float*>(ctx.buffers[out]);
    ParallelFor(N * CB, grain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const float* p = x + t * HW * L;
        float part[8][16] = {};
        for (int64_t i = 0; i < HW; ++i)
          for (int64_t l = 0; l < L; ++l) part[i & 7][l] += p[i * L + l];
        float* dst = y + t * L;  // t = n * CB + cb: outputs n * C + cb * L + lane
        for (int64_t l = 0; l < L; ++l) {
          float q0 = (part[0][l] + part[1][l]) + (part[2][l] + part[3][l]);
          float q1 = (part[4][l] + part[5][l]) + (part[6][l] + part[7][l]);
          dst[l] = 0.f + (q0 + q1);
        }
      }
    });
  });
}

LowerResult LowerReduce(const ir::Node& n, LowerContext& lc) {
  if (lc.is_blocked(n.operand(0))) return BlockedSpatialSum(n, lc);
  const ir::Type& it = lc.operand_type(n, 0);
  DType t = it.dtype;
  const auto& dims = it.shape.dims();
  std::vector<bool> reduced(dims.size(), false);
  for (int64_t d : n.attr_ints("dimensions")) reduced[d] = true;
  std::vector<int64_t> strides = RowMajorStrides(dims);
  std::vector<Group> groups;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;
    if (!groups.empty() && groups.back().reduced == reduced[d]) {
      groups.back().size *= dims[d];
      groups.back().stride = strides[d];
    } else {
      groups.push_back({dims[d], strides[d], reduced[d]});
    }
  }
  bool any_reduced = false;
  for (const Group& g : groups) any_reduced |= g.reduced;
  if (!any_reduced || it.shape.num_elements() == 0) {
    // Nothing reduced (only unit dims): a copy. An empty input takes the identity path below.
    if (it.shape.num_elements() != 0) {
      int in = n.operand(0), out = n.id();
      int64_t bytes = n.type().byte_size();
      return MakeFnThunk(n, "copy", [=](RunContext& ctx) {
        std::memcpy(ctx.buffers[out], ctx.buffers[in], bytes);
      });
    }
    groups = {{1, 1, true}};
  }
  if (t == DType::kBool && n.opcode() != Opcode::kReduceSum)
    return ReduceFor<uint8_t>(n, lc, groups);
  return VisitNumeric(
      t,
      [&](auto tag) -> LowerResult {
        return ReduceFor<typename decltype(tag)::type>(n, lc, groups);
      },
      UnsupportedDType(n, t));
}

// First max wins; a NaN counts as larger than every number (the first NaN wins); an empty axis
// gives 0.
LowerResult LowerArgmax(const ir::Node& n, LowerContext& lc) {
  const ir::Type& it = lc.operand_type(n, 0);
  int axis = static_cast<int>(n.attr_int("axis"));
  int64_t outer = 1, inner = 1, A = it.shape.dim(axis);
  for (int d = 0; d < axis; ++d) outer *= it.shape.dim(d);
  for (int d = axis + 1; d < it.shape.rank(); ++d) inner *= it.shape.dim(d);
  int in = n.operand(0), out = n.id();
  bool out64 = n.type().dtype == DType::kS64;
  auto make = [&](auto tag) -> LowerResult {
    using S = typename decltype(tag)::type;
    using C = typename Elem<S>::C;
    return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
      const S* x = static_cast<const S*>(ctx.buffers[in]);
      void* y = ctx.buffers[out];
      auto store = [&](int64_t i, int64_t v) {
        if (out64)
          static_cast<int64_t*>(y)[i] = v;
        else
          static_cast<int32_t*>(y)[i] = static_cast<int32_t>(v);
      };
      auto better = [](C v, C best) {
        if constexpr (std::is_integral_v<C>)
          return v > best;
        else
          return v > best || (v != v && best == best);
      };
      ParallelFor(outer * inner, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(A, 1)),
                  [&](int64_t b, int64_t e) {
                    for (int64_t t = b; t < e; ++t) {
                      int64_t o = t / inner, j = t % inner;
                      const S* p = x + o * A * inner + j;
                      C best = Elem<S>::Load(p[0]);
                      int64_t bi = 0;
                      for (int64_t a = 1; a < A; ++a) {
                        C v = Elem<S>::Load(p[a * inner]);
                        if (better(v, best)) {
                          best = v;
                          bi = a;
                        }
                      }
                      store(t, bi);
                    }
                  });
    });
  };
  if (A == 0) {  // empty axis: index 0 everywhere
    int64_t bytes = n.type().byte_size();
    return MakeFnThunk(n, "zeros",
                       [=](RunContext& ctx) { std::memset(ctx.buffers[out], 0, bytes); });
  }
  if (it.dtype == DType::kBool) return make(TypeTag<uint8_t>{});
  return VisitNumeric(it.dtype, make, UnsupportedDType(n, it.dtype));
}

}  // namespace kiln::runtime::cpu
