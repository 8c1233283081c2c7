#include "kiln/runtime/reference/reference_backend.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/compiler/buffer_plan.h"
#include "kiln/eval/kernels.h"
#include "kiln/runtime/shard_collectives.h"

namespace kiln::runtime {
namespace reference {
namespace {

using eval::Kernel;
using eval::MakeKernel;

// One reference kernel (kernels.h) over the executable's buffers: slot i is operand i's buffer,
// the last slot the node's own.
class KernelThunk : public Thunk {
 public:
  KernelThunk(const ir::Node& n, Kernel kernel)
      : name_(std::string(ir::OpcodeName(n.opcode())) + " %" + std::to_string(n.id())),
        kernel_(std::move(kernel)),
        ids_(n.operands()),
        slots_(ids_.size() + 1),
        all_reduce_(n.opcode() == ir::Opcode::kAllReduce),
        dtype_(n.type().dtype),
        count_(n.type().shape.num_elements()) {
    ids_.push_back(n.id());
  }
  void Run(RunContext& ctx) override {
    for (size_t i = 0; i < ids_.size(); ++i) slots_[i] = ctx.buffers[ids_[i]];
    kernel_(slots_);
    // all_reduce: its kernel copied the operand; the sum over the ranks is taken in place
    // through the run's collectives (none, or one rank: the copy is the result).
    if (all_reduce_ && ctx.collectives != nullptr && ctx.collectives->size() > 1 && count_ > 0) {
      absl::Status s = ctx.collectives->AllReduceSum(slots_.back(), count_, dtype_);
      if (!s.ok()) ctx.status = absl::Status(s.code(), name_ + ": " + std::string(s.message()));
    }
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Kernel kernel_;
  std::vector<int> ids_;      // the buffer id behind each slot
  std::vector<void*> slots_;  // scratch, refilled each run
  bool all_reduce_;
  DType dtype_;
  int64_t count_;
};

// all_gather / reduce_scatter over more than one replica and all_reduce over a mesh axis or
// with reduction max: the SPMD partitioner's collectives, run through the Shard* calls of the run's
// Collectives (shard_collectives.h).
class ShardCollectiveThunk : public Thunk {
 public:
  ShardCollectiveThunk(const ir::Node& n, const ir::Type& in_type)
      : node_(n),
        in_type_(in_type),
        name_(std::string(ir::OpcodeName(n.opcode())) + " %" + std::to_string(n.id())),
        scratch_(static_cast<size_t>(std::max(n.type().byte_size(), in_type.byte_size()))) {}
  void Run(RunContext& ctx) override {
    if (node_.type().byte_size() == 0) return;
    RunShardCollective(node_, in_type_, ctx.buffers[node_.operand(0)], ctx.buffers[node_.id()],
                       scratch_.data(), ctx);
  }
  std::string name() const override { return name_; }

 private:
  ir::Node node_;
  ir::Type in_type_;
  std::string name_;
  std::vector<uint8_t> scratch_;
};

bool IsShardCollective(const ir::Node& n) {
  if (n.opcode() == ir::Opcode::kAllReduce) return IsShardAllReduce(n);
  return (n.opcode() == ir::Opcode::kAllGather || n.opcode() == ir::Opcode::kReduceScatter) &&
         n.attr_int("replicas") != 1;
}

class ReferenceBackend : public Backend {
 public:
  std::string name() const override { return "reference"; }

  // One plain-loop kernel per node (fusion groups a graph carries are ignored), every value in the
  // arena.
  compiler::BackendTraits Traits() const override {
    compiler::BackendTraits t;
    t.fusion = false;
    return t;
  }

  // The oracle runs the graph as given: no optimization pass (compiler::CompileOptions::optimize
  // off), only the program passes `program` asks for.
  using Backend::Compile;
  absl::StatusOr<std::unique_ptr<Executable>> Compile(
      const ir::Graph& graph, const compiler::ProgramOptions& program) override {
    compiler::CompileOptions options;
    options.optimize = false;
    options.program = program;
    absl::StatusOr<compiler::CompiledModule> m = compiler::Compile(graph, Traits(), options);
    KILN_RETURN_IF_ERROR(Annotate(m.status(), "reference backend"));
    return Lower(*m);
  }

  absl::StatusOr<std::unique_ptr<Executable>> Lower(const compiler::CompiledModule& m) override {
    std::vector<std::unique_ptr<Thunk>> thunks;
    for (const compiler::ExecutionPlan::Kernel& k : m.plan.kernels) {
      const ir::Node& n = m.graph.node(k.members.back());
      std::vector<ir::Type> types;
      for (int o : n.operands()) types.push_back(m.graph.node(o).type());
      if (IsShardCollective(n)) {
        thunks.push_back(std::make_unique<ShardCollectiveThunk>(n, types[0]));
        continue;
      }
      KILN_ASSIGN_OR_RETURN(Kernel kernel, MakeKernel(n, types));
      thunks.push_back(std::make_unique<KernelThunk>(n, std::move(kernel)));
    }
    return std::make_unique<Executable>(m.graph, m.buffers, std::move(thunks), name());
  }

  nlohmann::json Describe() const override {
    return {{"backend", name()}, {"optimize", false}, {"fusion", false}};
  }
};

}  // namespace
}  // namespace reference

std::unique_ptr<Backend> MakeReferenceBackend() {
  return std::make_unique<reference::ReferenceBackend>();
}

}  // namespace kiln::runtime
