#include "kiln/runtime/cpu/cpu_backend.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/cache.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/passes/fusion.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/buffer_plan.h"
#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/cpu/internal/fused_loop.h"
#include "kiln/runtime/cpu/machine.h"

namespace kiln::runtime {
namespace cpu {
namespace {

using ir::Opcode;

// Runs the oneDNN lowering unless loops are preferred; falls back to the loop when oneDNN cannot
// run the op (Unimplemented: dtype or shape it lacks).
LowerResult OneDnnOrLoop(const ir::Node& n, LowerContext& lc,
                         LowerResult (*onednn)(const ir::Node&, LowerContext&),
                         LowerResult (*loop)(const ir::Node&, LowerContext&)) {
  if (!lc.options.prefer_loops) {
    LowerResult r = onednn(n, lc);
    if (r.ok() || r.status().code() != absl::StatusCode::kUnimplemented) return r;
  }
  return loop(n, lc);
}

LowerResult LowerNode(const ir::Node& n, LowerContext& lc) {
  switch (n.opcode()) {
    case Opcode::kDotGeneral:
      return LowerDotGeneral(n, lc);
    case Opcode::kConv2d:
    case Opcode::kConv2dBackwardInput:
    case Opcode::kConv2dBackwardFilter:
      return LowerConv(n, lc);
    case Opcode::kMaxPool2d:
    case Opcode::kAvgPool2d:
    case Opcode::kAvgPool2dGrad:
      return OneDnnOrLoop(n, lc, LowerPool, LowerPoolLoop);
    case Opcode::kMaxPool2dGrad:
      return LowerMaxPoolGrad(n, lc);

    case Opcode::kAbs:
    case Opcode::kExp:
    case Opcode::kGelu:
    case Opcode::kLog:
    case Opcode::kRelu:
    case Opcode::kSigmoid:
    case Opcode::kSilu:
    case Opcode::kSqrt:
    case Opcode::kTanh:
      return OneDnnOrLoop(n, lc, LowerOneDnnUnary, LowerUnaryLoop);
    case Opcode::kCos:
    case Opcode::kErf:
    case Opcode::kNeg:
    case Opcode::kRsqrt:
    case Opcode::kSign:
    case Opcode::kSin:
      return LowerUnaryLoop(n, lc);
    case Opcode::kAdd:
    case Opcode::kSub:
    case Opcode::kMul:
    case Opcode::kDiv:
      return OneDnnOrLoop(n, lc, LowerOneDnnBinary, LowerBinaryLoop);
    case Opcode::kMax:
    case Opcode::kMin:
    case Opcode::kPow:
      return LowerBinaryLoop(n, lc);
    case Opcode::kCompare:
      return LowerCompare(n, lc);
    case Opcode::kSelect:
      return LowerSelect(n, lc);
    case Opcode::kLogicalAnd:
    case Opcode::kLogicalOr:
    case Opcode::kLogicalNot:
      return LowerLogical(n, lc);
    case Opcode::kConvert:
      return OneDnnOrLoop(n, lc, LowerOneDnnConvert, LowerConvertLoop);

    case Opcode::kBroadcastInDim:
    case Opcode::kConcatenate:
    case Opcode::kPad:
    case Opcode::kReshape:
    case Opcode::kSlice:
    case Opcode::kTranspose:
      return LowerStructural(n, lc);
    case Opcode::kGather:
    case Opcode::kIota:
    case Opcode::kScatterAdd:
      return LowerIndexing(n, lc);

    case Opcode::kReduceMax:
    case Opcode::kReduceMin:
    case Opcode::kReduceSum:
      return LowerReduce(n, lc);
    case Opcode::kArgmax:
      return LowerArgmax(n, lc);

    case Opcode::kSoftmax:
    case Opcode::kLogSoftmax:
      return OneDnnOrLoop(n, lc, LowerOneDnnSoftmax, LowerSoftmaxLoop);
    case Opcode::kLayerNorm:
      return OneDnnOrLoop(n, lc, LowerOneDnnLayerNorm, LowerLayerNormLoop);
    case Opcode::kRmsNorm:
      return LowerRmsNorm(n, lc);
    case Opcode::kCrossEntropy:
      return LowerCrossEntropy(n, lc);
    case Opcode::kAttention:
      return LowerAttention(n, lc);

    case Opcode::kRandomBits:
    case Opcode::kAllReduce:
    case Opcode::kAllGather:
    case Opcode::kReduceScatter:
      return LowerMisc(n, lc);

    case Opcode::kParameter:
    case Opcode::kConstant:
      return std::unique_ptr<Thunk>();
  }
  return Unimplemented(n, "no lowering");
}

// The composites LowerNode handles itself (oneDNN or a dedicated loop); the compiler leaves them
// whole instead of decomposing them into primitives.
bool LowersNatively(Opcode op) {
  switch (op) {
    case Opcode::kSoftmax:
    case Opcode::kLogSoftmax:
    case Opcode::kLayerNorm:
    case Opcode::kRmsNorm:
    case Opcode::kCrossEntropy:
    case Opcode::kAttention:
      return true;
    default:
      return false;
  }
}

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {}

  std::string name() const override { return "cpu"; }

  absl::StatusOr<std::unique_ptr<Executable>> Compile(const ir::Graph& input) override {
    KILN_RETURN_IF_ERROR(Annotate(ir::Verify(input), "cpu backend: invalid graph"));
    if (!options_.optimize) return Lower(input);
    compiler::CompileOptions copts;
    copts.keep_composite = LowersNatively;
    copts.fuse_loops = options_.fuse && !options_.prefer_loops;
    copts.remat.enabled = options_.remat || options_.remat_memory_limit_bytes > 0;
    copts.remat.memory_limit_bytes = options_.remat_memory_limit_bytes;
    // The process-wide cache: memory, plus disk only where the user asked for it.
    static compiler::CompileCache* const default_cache = [] {
      const char* dir = std::getenv("KILN_CACHE_DIR");
      const char* log = std::getenv("KILN_CACHE_LOG");
      compiler::CompileCacheOptions o;
      o.use_disk = dir != nullptr && *dir != '\0';
      bool verbose = o.use_disk || (log != nullptr && std::string(log) == "1");
      o.log = [verbose](const std::string& m) {
        if (verbose || m.find("WARNING") != std::string::npos)
          std::fprintf(stderr, "%s\n", m.c_str());
      };
      return new compiler::CompileCache(std::move(o));
    }();
    // Optimize's result does not depend on the ISA today, but lowering choices may come to.
    static const std::string backend_key = "cpu/" + OneDnnIsaName();
    compiler::CompileCache* cache = options_.compile_cache ? options_.compile_cache : default_cache;
    absl::StatusOr<ir::Graph> optimized = options_.use_compile_cache
                                              ? cache->GetOrOptimize(input, copts, backend_key)
                                              : compiler::Optimize(input, copts);
    KILN_RETURN_IF_ERROR(Annotate(optimized.status(), "cpu backend: optimizing"));
    absl::StatusOr<std::unique_ptr<Executable>> exe = Lower(*optimized);
    if (exe.ok() && options_.remat_memory_limit_bytes > 0 &&
        (*exe)->plan().arena_bytes > options_.remat_memory_limit_bytes) {
      std::fprintf(stderr,
                   "kiln cpu backend: graph '%s' needs a %.1f MiB arena, over the remat memory "
                   "limit of %.1f MiB: nothing left worth recomputing\n",
                   input.name().c_str(), (*exe)->plan().arena_bytes / 1048576.0,
                   options_.remat_memory_limit_bytes / 1048576.0);
    }
    return exe;
  }

 private:
  absl::StatusOr<std::unique_ptr<Executable>> Lower(const ir::Graph& graph) {
    auto ctx = std::make_shared<CpuContext>();
    LowerContext lc{graph, ctx, options_};
    const int n = graph.num_nodes();
    for (const ir::Node& node : graph.nodes()) {
      if (node.type().shape.rank() > kMaxRank)
        return Unimplemented(node, absl::StrCat("rank above ", kMaxRank));
    }

    // Loop fusion groups (the fusion pass leaves each group's members contiguous). A member reads
    // the operand of a broadcast_in_dim directly, through a broadcasting view.
    PlanSchedule sched;
    sched.step.resize(n);
    sched.reads.resize(n);
    sched.materialized.assign(n, 0);
    std::vector<int> group_of(n, -1);
    std::map<int, std::vector<int>> groups;
    for (const ir::Node& node : graph.nodes()) {
      sched.step[node.id()] = node.id();
      auto it = node.attrs().find(compiler::kFusionAttr);
      if (it == node.attrs().end() || !std::holds_alternative<int64_t>(it->second)) continue;
      int gid = static_cast<int>(std::get<int64_t>(it->second));
      groups[gid].push_back(node.id());
      group_of[node.id()] = gid;
    }
    // The attribute is a hint: a group whose members are not contiguous (a graph rewritten after
    // the fusion pass, e.g. a loaded artifact compiled with KILN_DISABLE_PASSES=fusion) is simply
    // lowered node by node below.
    for (auto it = groups.begin(); it != groups.end();) {
      const std::vector<int>& members = it->second;
      bool contiguous = true;
      for (size_t i = 1; i < members.size(); ++i) contiguous &= members[i] == members[i - 1] + 1;
      if (contiguous) {
        ++it;
        continue;
      }
      for (int m : members) group_of[m] = -1;
      it = groups.erase(it);
    }
    // Output fusions (first member a dot_general) run as one matmul with post-ops; loop groups
    // must hold only loop-fusible ops. A group this backend cannot run fused is lowered node by
    // node instead.
    std::map<int, bool> is_output_fusion;
    for (auto it = groups.begin(); it != groups.end();) {
      const std::vector<int>& members = it->second;
      Opcode head = graph.node(members[0]).opcode();
      bool output = head == Opcode::kDotGeneral || head == Opcode::kConv2d;
      bool ok = !output                       ? true
                : head == Opcode::kDotGeneral ? CanLowerMatmulEpilogue(members, lc)
                                              : CanLowerConvEpilogue(members, lc);
      if (!output)
        for (int m : members)
          ok = ok && (compiler::IsLoopFusible(graph, graph.node(m)) ||
                      compiler::IsLoopReduction(graph, graph.node(m)));
      if (!ok) {
        for (int m : members) group_of[m] = -1;
        it = groups.erase(it);
        continue;
      }
      is_output_fusion[it->first] = output;
      ++it;
    }
    FusionReads reads;
    for (auto& [gid, members] : groups) {
      for (int m : members) {
        sched.step[m] = members.back();
        std::vector<FusionReads::Read>& r = reads.by_member[m];
        for (int op : graph.node(m).operands()) {
          const ir::Node& o = graph.node(op);
          FusionReads::Read read{op, nullptr};
          if (group_of[op] == gid) {
            r.push_back(read);
            continue;  // inside the kernel
          }
          bool absorb = is_output_fusion[gid]
                            ? compiler::IsBiasBroadcast(
                                  graph, op, compiler::EpilogueBiasAxis(graph.node(members[0])))
                            : o.opcode() == Opcode::kBroadcastInDim;
          if (absorb && group_of[op] < 0) {
            read.node = o.operand(0);
            read.broadcast_dims = &o.attr_ints("broadcast_dimensions");
          }
          r.push_back(read);
          sched.reads[m].push_back(read.node);
        }
      }
    }
    for (const ir::Node& node : graph.nodes())
      if (group_of[node.id()] < 0) sched.reads[node.id()] = node.operands();

    // A reshape of a dense row-major buffer is the same bytes: it gets no kernel and no buffer,
    // and reads of it are reads of its (root) operand's buffer (an alias the executable binds
    // each run). Graph outputs keep their own buffer.
    std::vector<char> is_output(n, 0);
    for (const ir::Output& o : graph.outputs()) is_output[o.node] = 1;
    std::vector<int> alias_root(n);
    BufferPlan::Aliases aliases;
    for (const ir::Node& node : graph.nodes()) {
      alias_root[node.id()] = node.id();
      if (node.opcode() == Opcode::kReshape && group_of[node.id()] < 0 && !is_output[node.id()] &&
          graph.node(node.operand(0)).type().dtype == node.type().dtype) {
        alias_root[node.id()] = alias_root[node.operand(0)];
        aliases.push_back({node.id(), alias_root[node.id()]});
      }
    }
    for (std::vector<int>& rs : sched.reads)
      for (int& r : rs) r = alias_root[r];

    // What must run: graph outputs and whatever a running kernel reads (reverse order; a group
    // runs when any member is needed, and then reads all its members' inputs).
    std::vector<char> needed(n, 0);
    for (const ir::Output& o : graph.outputs()) needed[o.node] = 1;
    std::vector<char> group_runs(n, 0);  // by root id
    for (int id = n - 1; id >= 0; --id) {
      int gid = group_of[id];
      if (gid >= 0) {
        const std::vector<int>& members = groups[gid];
        if (id != members.back()) continue;
        bool runs = false;
        for (int m : members) runs |= needed[m] != 0;
        if (!runs) continue;
        group_runs[id] = 1;
        for (int m : members)
          for (int r : sched.reads[m]) needed[r] = 1;
        continue;
      }
      if (!needed[id]) continue;
      for (int r : sched.reads[id]) needed[r] = 1;
    }

    std::vector<std::unique_ptr<Thunk>> thunks;
    for (const ir::Node& node : graph.nodes()) {
      if (node.opcode() == Opcode::kParameter || node.opcode() == Opcode::kConstant) continue;
      if (node.type().shape.num_elements() == 0) continue;  // nothing to compute
      LowerResult thunk;
      int gid = group_of[node.id()];
      if (gid >= 0) {
        if (!group_runs[node.id()]) continue;  // not the root, or nothing needs the group
        try {
          const std::vector<int>& members = groups[gid];
          if (!is_output_fusion[gid])
            thunk = LowerFusedLoop(members, reads, needed, lc);
          else if (graph.node(members[0]).opcode() == Opcode::kConv2d)
            thunk = LowerConvEpilogue(members, lc);
          else
            thunk = LowerMatmulEpilogue(members, lc);
        } catch (const dnnl::error& e) {
          thunk = Unimplemented(node, absl::StrCat("oneDNN: ", e.what()));
        }
      } else {
        if (!needed[node.id()]) continue;  // e.g. a broadcast every consumer absorbed
        for (int op : node.operands())
          if (graph.node(op).type().shape.rank() > kMaxRank)
            return Unimplemented(node, absl::StrCat("operand rank above ", kMaxRank));
        try {
          thunk = LowerNode(node, lc);
        } catch (const dnnl::error& e) {
          thunk = Unimplemented(node, absl::StrCat("oneDNN: ", e.what()));
        }
      }
      if (!thunk.ok()) return thunk.status();
      if (*thunk) thunks.push_back(std::move(*thunk));
    }
    ctx->AllocateWorkspace();
    // Graph outputs computed by a kernel live in the caller's tensors, not in the arena.
    sched.materialized = needed;
    std::vector<int64_t> staging(n, -1);
    int64_t staging_bytes = 0;
    for (const ir::Output& o : graph.outputs()) {
      const ir::Node& node = graph.node(o.node);
      if (node.opcode() == Opcode::kParameter || node.opcode() == Opcode::kConstant ||
          staging[o.node] >= 0 || node.type().byte_size() == 0)
        continue;
      sched.materialized[o.node] = 0;
      staging[o.node] = staging_bytes;
      staging_bytes += AlignUp(node.type().byte_size());
    }
    BufferPlan plan = PlanBuffers(graph, &sched);
    plan.aliases = std::move(aliases);
    plan.staging_offsets = std::move(staging);
    plan.staging_bytes = staging_bytes;
    return std::make_unique<Executable>(graph, std::move(plan), std::move(thunks), "cpu");
  }

  CpuBackendOptions options_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace kiln::runtime
