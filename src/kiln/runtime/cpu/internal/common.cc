#include "kiln/runtime/cpu/internal/common.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kiln/base/memory.h"
#include "kiln/base/status.h"
#include "kiln/ir/opcode.h"
#include "kiln/runtime/cpu/isa.h"

namespace kiln::runtime::cpu {

namespace {
// oneDNN is capped at the process's ISA level before its first engine (runtime/cpu/isa.h).
dnnl::engine MakeEngine() {
  EnsureOneDnnIsa();
  return dnnl::engine(dnnl::engine::kind::cpu, 0);
}
}  // namespace

CpuContext::CpuContext() : engine_(MakeEngine()), stream_(engine_) {}

CpuContext::~CpuContext() = default;

void CpuContext::AllocateWorkspace() {
  workspace_memory_.reset();
  workspace_ = nullptr;
  if (workspace_bytes_ == 0) return;
  // Zeroed with every page mapped now, so running never page-faults.
  workspace_memory_ = AllocatePopulated(AlignUp(workspace_bytes_), kBufferAlignment);
  workspace_ = workspace_memory_.get();
}

std::string ThunkName(const ir::Node& n, const std::string& how) {
  return absl::StrCat(std::string(ir::OpcodeName(n.opcode())), " %", n.id(), " (", how, ")");
}

std::unique_ptr<Thunk> MakeFnThunk(const ir::Node& n, const std::string& how,
                                   std::function<void(RunContext&)> fn) {
  return std::make_unique<FnThunk>(ThunkName(n, how), std::move(fn));
}

absl::Status UnsupportedDType(const ir::Node& n, DType t) {
  return absl::UnimplementedError(
      absl::StrCat("cpu backend: ", std::string(ir::OpcodeName(n.opcode())), " %", n.id(),
                   " does not support dtype ", std::string(DTypeName(t))));
}

absl::Status Unimplemented(const ir::Node& n, const std::string& why) {
  return absl::UnimplementedError(absl::StrCat(
      "cpu backend: ", std::string(ir::OpcodeName(n.opcode())), " %", n.id(), ": ", why));
}

// ---------------------------------------------------------------------------------------------
// oneDNN helpers.

dnnl::memory::data_type DnnlType(DType t) {
  using dt = dnnl::memory::data_type;
  switch (t) {
    case DType::kF32:
      return dt::f32;
    case DType::kBF16:
      return dt::bf16;
    case DType::kF16:
      return dt::f16;
    case DType::kS8:
      return dt::s8;
    case DType::kU8:
      return dt::u8;
    case DType::kS32:
      return dt::s32;
    default:
      return dt::undef;
  }
}

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

dnnl::memory::desc PlainDesc(const std::vector<int64_t>& dims, dnnl::memory::data_type dt) {
  std::vector<int64_t> d = dims.empty() ? std::vector<int64_t>{1} : dims;
  return dnnl::memory::desc(d, dt, RowMajorStrides(d));
}

dnnl::memory::desc NodeDesc(const LowerContext& lc, int node, const std::vector<int64_t>& dims,
                            dnnl::memory::data_type dt) {
  if (lc.is_blocked(node) && dims.size() == 4) return dnnl::memory::desc(dims, dt, BlockedTag());
  return PlainDesc(dims, dt);
}

dnnl::memory::desc StridedDesc(const std::vector<int64_t>& dims, dnnl::memory::data_type dt,
                               const std::vector<int64_t>& strides) {
  return dnnl::memory::desc(dims, dt, strides);
}

dnnl::memory::desc WithType(const dnnl::memory::desc& md, dnnl::memory::data_type dt) {
  dnnl::memory::desc out = md;
  out.data.data_type = static_cast<dnnl_data_type_t>(dt);
  return out;
}

namespace {
// Runs `fn`; a dnnl::error becomes Unimplemented "<context()>: <error> (oneDNN ISA <isa>)". The
// context is built only on failure: this wraps every primitive the backend makes.
absl::Status Catch(const std::function<void()>& fn, const std::function<std::string()>& context) {
  try {
    fn();
  } catch (const dnnl::error& e) {
    return absl::UnimplementedError(
        absl::StrCat(context(), ": ", e.what(), " (oneDNN ISA ", OneDnnIsaName(), ")"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status CatchOneDnn(std::string_view context, const std::function<void()>& fn) {
  return Catch(fn, [&] { return std::string(context); });
}

std::string OperandTypesText(const LowerContext& lc, const ir::Node& n) {
  std::string out;
  for (int op : n.operands())
    absl::StrAppend(&out, out.empty() ? "" : ", ", lc.graph.node(op).type().ToString());
  absl::StrAppend(&out, " -> ", n.type().ToString());
  return out;
}

absl::Status DnnlStatus(const LowerContext& lc, const ir::Node& n, std::string_view what,
                        const std::function<void()>& fn) {
  return Catch(fn, [&] {
    return absl::StrCat("cpu backend: ", std::string(ir::OpcodeName(n.opcode())), " %", n.id(),
                        " (", OperandTypesText(lc, n), "): oneDNN ", std::string(what));
  });
}

absl::Status DnnlStatus(const ir::Node& n, const std::function<void()>& fn) {
  return Catch(fn, [&] {
    return absl::StrCat("cpu backend: ", std::string(ir::OpcodeName(n.opcode())), " %", n.id(),
                        " (-> ", n.type().ToString(), "): oneDNN");
  });
}

// ---------------------------------------------------------------------------------------------
// DnnlThunk.

class DnnlThunk : public Thunk {
 public:
  DnnlThunk(std::string name, std::shared_ptr<CpuContext> cpu,
            std::vector<DnnlThunkBuilder::Mem> mems, std::vector<DnnlThunkBuilder::Step> steps,
            std::vector<DnnlThunkBuilder::Pack> packs)
      : name_(std::move(name)),
        cpu_(std::move(cpu)),
        mems_(std::move(mems)),
        steps_(std::move(steps)) {
    for (const DnnlThunkBuilder::Pack& p : packs) packs_.push_back({p, nullptr, nullptr, false});
  }

  void Run(RunContext& ctx) override {
    uint8_t* ws = cpu_->workspace();
    Bind(ctx, ws);
    for (LivePack& p : packs_) {
      // The kept copy is used only for the very buffer it was made from, while still constant.
      const int node = p.spec.node;
      p.live = p.buffer && ctx.buffers[node] == p.packed_from &&
               node < static_cast<int>(ctx.constant.size()) && ctx.constant[node];
      if (p.live) dnnl_memory_set_data_handle(mems_[p.spec.to].memory.get(), p.buffer.get());
    }
    dnnl_stream_t stream = cpu_->stream().get();
    for (auto& s : steps_) {
      if (s.pack >= 0 && packs_[s.pack].live) continue;
      if (s.loop) {
        s.loop(ctx, ws);
      } else {
        dnnl_primitive_execute(s.prim.get(), stream, static_cast<int>(s.args.size()),
                               s.args.data());
      }
    }
  }

  std::string name() const override {
    int live = 0;
    for (const LivePack& p : packs_) live += p.buffer != nullptr;
    if (live == 0) return name_;
    return name_.substr(0, name_.size() - 1) + ", weights pre-packed)";
  }

  // Runs each ConstantInput reorder whose node is constant now, once, into a buffer of its own.
  absl::Status PrepareConstants(const RunContext& ctx) override {
    for (LivePack& p : packs_) {
      p.buffer.reset();
      p.packed_from = nullptr;
      p.live = false;
    }
    if (packs_.empty() || ctx.constant.empty()) return absl::OkStatus();
    uint8_t* ws = cpu_->workspace();
    Bind(ctx, ws);
    for (LivePack& p : packs_) {
      const int node = p.spec.node;
      if (node >= static_cast<int>(ctx.constant.size()) || !ctx.constant[node] ||
          ctx.buffers[node] == nullptr)
        continue;
      const dnnl::memory& to = mems_[p.spec.to].memory;
      std::shared_ptr<uint8_t> buffer = AllocatePopulated(
          AlignUp(static_cast<int64_t>(to.get_desc().get_size())), kBufferAlignment);
      dnnl_memory_set_data_handle(to.get(), buffer.get());
      const DnnlThunkBuilder::Step& s = steps_[p.spec.step];
      dnnl_status_t st = dnnl_primitive_execute(s.prim.get(), cpu_->stream().get(),
                                                static_cast<int>(s.args.size()), s.args.data());
      if (st == dnnl_success) st = dnnl_stream_wait(cpu_->stream().get());
      if (st != dnnl_success)
        return absl::InternalError(name_ +
                                   ": pre-packing a constant weight failed (oneDNN status " +
                                   std::to_string(static_cast<int>(st)) + ")");
      p.buffer = std::move(buffer);
      p.packed_from = ctx.buffers[node];
    }
    return absl::OkStatus();
  }

 private:
  struct LivePack {
    DnnlThunkBuilder::Pack spec;
    std::shared_ptr<uint8_t> buffer;  // the packed copy, while the node is constant
    const void* packed_from;          // the buffer it was packed from
    bool live;                        // this run reads `buffer` and skips the reorder
  };

  void Bind(const RunContext& ctx, uint8_t* ws) {
    for (auto& m : mems_) {
      void* p = m.node >= 0 ? ctx.buffers[m.node] : static_cast<void*>(ws + m.offset);
      dnnl_memory_set_data_handle(m.memory.get(), p);
    }
  }

  std::string name_;
  std::shared_ptr<CpuContext> cpu_;
  std::vector<DnnlThunkBuilder::Mem> mems_;
  std::vector<DnnlThunkBuilder::Step> steps_;
  std::vector<LivePack> packs_;
};

DnnlThunkBuilder::DnnlThunkBuilder(LowerContext& lc, const ir::Node& n, std::string how)
    : lc_(lc), node_(n), name_(ThunkName(n, how)) {
  name_.pop_back();  // the ")": NameImpl may add to it, Finish closes it
}

dnnl::primitive_attr DnnlThunkBuilder::Attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

int DnnlThunkBuilder::NodeMemory(int node, const dnnl::memory::desc& md) {
  Mem m;
  m.memory = dnnl::memory(md, lc_.cpu->engine(), DNNL_MEMORY_NONE);
  m.node = node;
  mems_.push_back(std::move(m));
  return static_cast<int>(mems_.size()) - 1;
}

int DnnlThunkBuilder::TempMemory(const dnnl::memory::desc& md) {
  Mem m;
  m.memory = dnnl::memory(md, lc_.cpu->engine(), DNNL_MEMORY_NONE);
  m.offset = layout_.Add(static_cast<int64_t>(md.get_size()));
  mems_.push_back(std::move(m));
  return static_cast<int>(mems_.size()) - 1;
}

absl::StatusOr<int> DnnlThunkBuilder::Input(int node, const dnnl::memory::desc& user,
                                            const dnnl::memory::desc& want) {
  return Reorder(NodeMemory(node, user), want);
}

absl::StatusOr<int> DnnlThunkBuilder::ConstantInput(int node, const dnnl::memory::desc& user,
                                                    const dnnl::memory::desc& want) {
  const int from = NodeMemory(node, user);
  KILN_ASSIGN_OR_RETURN(int to, Reorder(from, want));
  if (to == from) return to;  // the layout it has is the one wanted: nothing to pack
  Pack p;
  p.node = node;
  p.from = from;
  p.to = to;
  p.step = static_cast<int>(steps_.size()) - 1;  // the reorder Reorder just added
  steps_.back().pack = static_cast<int>(packs_.size());
  packs_.push_back(p);
  --reorders_;  // a weight's pack, not an activation's reorder
  return to;
}

absl::StatusOr<int> DnnlThunkBuilder::Reorder(int from, const dnnl::memory::desc& want) {
  dnnl::memory::desc have = mems_[from].memory.get_desc();
  if (have == want) return from;
  int w = TempMemory(want);
  dnnl::reorder::primitive_desc pd;
  KILN_RETURN_IF_ERROR(Create("reorder", [&] {
    pd = dnnl::reorder::primitive_desc(lc_.cpu->engine(), have, lc_.cpu->engine(), want, Attr());
  }));
  KILN_RETURN_IF_ERROR(
      AddPrimitive<dnnl::reorder>("reorder", pd, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, w}}));
  ++reorders_;
  return w;
}

absl::StatusOr<int> DnnlThunkBuilder::Output(int node, const dnnl::memory::desc& user,
                                             const dnnl::memory::desc& have) {
  int u = NodeMemory(node, user);
  if (user == have) return u;
  int h = TempMemory(have);
  Step s;
  dnnl::reorder::primitive_desc pd;
  KILN_RETURN_IF_ERROR(Create("reorder", [&] {
    pd = dnnl::reorder::primitive_desc(lc_.cpu->engine(), have, lc_.cpu->engine(), user, Attr());
    s.prim = dnnl::reorder(pd);
  }));
  s.args = {{DNNL_ARG_FROM, mems_[h].memory.get()}, {DNNL_ARG_TO, mems_[u].memory.get()}};
  if (pd.scratchpad_desc().get_size() > 0) {
    int sp = TempMemory(pd.scratchpad_desc());
    s.args.push_back({DNNL_ARG_SCRATCHPAD, mems_[sp].memory.get()});
  }
  post_steps_.push_back(std::move(s));
  ++reorders_;
  return h;
}

void DnnlThunkBuilder::AddStep(dnnl::primitive prim, std::vector<std::pair<int, int>> args) {
  Step s;
  s.prim = std::move(prim);
  for (auto [arg, mem] : args) s.args.push_back({arg, mems_[mem].memory.get()});
  steps_.push_back(std::move(s));
}

void DnnlThunkBuilder::AddStepWithScratchpad(dnnl::primitive prim,
                                             std::vector<std::pair<int, int>> args,
                                             const dnnl::memory::desc& scratch) {
  if (scratch.get_size() > 0) args.push_back({DNNL_ARG_SCRATCHPAD, TempMemory(scratch)});
  AddStep(std::move(prim), std::move(args));
}

void DnnlThunkBuilder::AddFinalStep(dnnl::primitive prim, std::vector<std::pair<int, int>> args,
                                    const dnnl::memory::desc& scratch) {
  if (scratch.get_size() > 0) args.push_back({DNNL_ARG_SCRATCHPAD, TempMemory(scratch)});
  Step s;
  s.prim = std::move(prim);
  for (auto [arg, mem] : args) s.args.push_back({arg, mems_[mem].memory.get()});
  final_steps_.push_back(std::move(s));
}

void DnnlThunkBuilder::AddLoopStep(std::function<void(RunContext&, uint8_t*)> fn) {
  Step s;
  s.loop = std::move(fn);
  steps_.push_back(std::move(s));
}

absl::StatusOr<std::unique_ptr<Thunk>> DnnlThunkBuilder::Finish() {
  for (auto& s : post_steps_) steps_.push_back(std::move(s));
  for (auto& s : final_steps_) steps_.push_back(std::move(s));
  post_steps_.clear();
  final_steps_.clear();
  if (reorders_ > 0)
    absl::StrAppend(&name_, ", ", reorders_, reorders_ == 1 ? " reorder" : " reorders");
  name_ += ")";
  lc_.cpu->RequireWorkspace(layout_.size());
  return std::unique_ptr<Thunk>(
      new DnnlThunk(name_, lc_.cpu, std::move(mems_), std::move(steps_), std::move(packs_)));
}

// ---------------------------------------------------------------------------------------------
// Strided copies.

void FillBytes(void* out, int64_t count, const void* value, int64_t elem_size) {
  auto fill = [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, value, sizeof(T));
    T* o = static_cast<T*>(out);
    ParallelFor(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = v;
    });
  };
  switch (elem_size) {
    case 1:
      fill(TypeTag<uint8_t>{});
      break;
    case 2:
      fill(TypeTag<uint16_t>{});
      break;
    case 4:
      fill(TypeTag<uint32_t>{});
      break;
    default:
      fill(TypeTag<uint64_t>{});
      break;
  }
}

namespace {

template <typename T>
void CopyRow(const T* in, int64_t in_stride, T* out, int64_t out_stride, int64_t n) {
  if (in_stride == 1 && out_stride == 1) {
    std::memcpy(out, in, n * sizeof(T));
  } else if (in_stride == 0 && out_stride == 1) {
    T v = *in;
    for (int64_t i = 0; i < n; ++i) out[i] = v;
  } else if (out_stride == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = in[i * in_stride];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i * out_stride] = in[i * in_stride];
  }
}

// 2-D tile transpose: out[i*os_i + j] = in[i*is_i + j*is_j] for a tile where is_j != 1 but some
// outer dim reads contiguously; blocking keeps both sides in cache.
template <typename T>
void CopyStridedTyped(const std::vector<int64_t>& dims, const T* in, const std::vector<int64_t>& is,
                      T* out, const std::vector<int64_t>& os) {
  int r = static_cast<int>(dims.size());
  int64_t inner = dims[r - 1];
  int64_t rows = 1;
  for (int d = 0; d < r - 1; ++d) rows *= dims[d];

  // Transpose-like: innermost output is contiguous, input is not, and the second-innermost dim
  // reads contiguously: copy in 32x32 tiles over those two dims.
  if (r >= 2 && os[r - 1] == 1 && is[r - 1] != 1 && is[r - 2] == 1 && is[r - 1] != 0) {
    constexpr int64_t kTile = 32;
    int64_t d0 = dims[r - 2], d1 = inner;
    int64_t outer = rows / d0;
    int64_t tiles0 = (d0 + kTile - 1) / kTile;
    ParallelFor(outer * tiles0, std::max<int64_t>(1, 4096 / (kTile * std::max<int64_t>(d1, 1))),
                [&](int64_t b, int64_t e) {
                  for (int64_t t = b; t < e; ++t) {
                    int64_t o = t / tiles0, t0 = (t % tiles0) * kTile;
                    int64_t in_off = 0, out_off = 0, rem = o;
                    for (int d = r - 3; d >= 0; --d) {
                      int64_t idx = rem % dims[d];
                      rem /= dims[d];
                      in_off += idx * is[d];
                      out_off += idx * os[d];
                    }
                    int64_t e0 = std::min(d0, t0 + kTile);
                    for (int64_t t1 = 0; t1 < d1; t1 += kTile) {
                      int64_t e1 = std::min(d1, t1 + kTile);
                      for (int64_t i = t0; i < e0; ++i) {
                        const T* src = in + in_off + i;
                        T* dst = out + out_off + i * os[r - 2];
                        for (int64_t j = t1; j < e1; ++j) dst[j] = src[j * is[r - 1]];
                      }
                    }
                  }
                });
    return;
  }

  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1));
  ParallelFor(rows, grain, [&](int64_t b, int64_t e) {
    int64_t idx[kMaxRank] = {};
    int64_t in_off = 0, out_off = 0, rem = b;
    for (int d = r - 2; d >= 0; --d) {
      idx[d] = rem % dims[d];
      rem /= dims[d];
      in_off += idx[d] * is[d];
      out_off += idx[d] * os[d];
    }
    for (int64_t row = b; row < e; ++row) {
      CopyRow(in + in_off, is[r - 1], out + out_off, os[r - 1], inner);
      for (int d = r - 2; d >= 0; --d) {
        ++idx[d];
        in_off += is[d];
        out_off += os[d];
        if (idx[d] < dims[d]) break;
        in_off -= idx[d] * is[d];
        out_off -= idx[d] * os[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace

CopyPlan PlanStridedCopy(const std::vector<int64_t>& dims, const std::vector<int64_t>& in_strides,
                         const std::vector<int64_t>& out_strides, int64_t elem_size) {
  CopyPlan p;
  p.elem_size = elem_size;
  auto& d = p.dims;
  auto& is = p.in_strides;
  auto& os = p.out_strides;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0) p.empty = true;
    if (dims[i] == 1) continue;
    if (!d.empty() && is.back() == in_strides[i] * dims[i] &&
        os.back() == out_strides[i] * dims[i]) {
      d.back() *= dims[i];
      is.back() = in_strides[i];
      os.back() = out_strides[i];
      continue;
    }
    d.push_back(dims[i]);
    is.push_back(in_strides[i]);
    os.push_back(out_strides[i]);
  }
  if (d.empty()) {
    d = {1};
    is = {0};
    os = {0};
  }
  KILN_CHECK(d.size() <= kMaxRank);
  return p;
}

void RunStridedCopy(const CopyPlan& p, const void* in, void* out) {
  if (p.empty) return;
  const auto& d = p.dims;
  const auto& is = p.in_strides;
  const auto& os = p.out_strides;
  switch (p.elem_size) {
    case 1:
      CopyStridedTyped(d, static_cast<const uint8_t*>(in), is, static_cast<uint8_t*>(out), os);
      break;
    case 2:
      CopyStridedTyped(d, static_cast<const uint16_t*>(in), is, static_cast<uint16_t*>(out), os);
      break;
    case 4:
      CopyStridedTyped(d, static_cast<const uint32_t*>(in), is, static_cast<uint32_t*>(out), os);
      break;
    default:
      CopyStridedTyped(d, static_cast<const uint64_t*>(in), is, static_cast<uint64_t*>(out), os);
      break;
  }
}

}  // namespace kiln::runtime::cpu
