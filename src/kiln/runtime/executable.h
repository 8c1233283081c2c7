// An Executable is a compiled Graph: a flat list of thunks that run over one preallocated arena.
// Buffers are assigned from liveness intervals at compile time (compiler/buffer_plan.h); running
// allocates nothing when the caller supplies the output tensors (RunInto).
//
//   std::unique_ptr<Backend> cpu = MakeCpuBackend();
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, cpu->Compile(graph));
//   KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, exe->Run({x, w}));   // parameter order
//   KILN_ASSIGN_OR_RETURN(auto named, exe->RunNamed({{"x", x}, {"w", w}}));
#ifndef KILN_RUNTIME_EXECUTABLE_H_
#define KILN_RUNTIME_EXECUTABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/compiler/buffer_plan.h"
#include "kiln/compiler/compile.h"
#include "kiln/compiler/execution_plan.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/collective_stream.h"
#include "kiln/tensor/tensor.h"
#include "nlohmann/json.hpp"

namespace kiln::runtime {

// The one collective seam of the runtime and of training: what a graph's collective ops and a
// train step (nn::TrainStep: data parallel, ZeRO-1, tensor parallel) run through in a
// multi-process job. It is the runtime's view of dist::Communicator: dist::CommunicatorCollectives
// (dist/collectives_adapter.h) implements it over one communicator, dist::MeshCollectives over a
// data x model mesh (the runtime may not depend on dist). Every implementation answers every
// call: two groups of ranks, and whether they still work.
// - The data-parallel ranks (size()): the gradient all_reduce (no `axis` attribute) and ZeRO-1's
//   reduce-scatter and all-gather.
// - The ranks of the SPMD mesh axis (num_shards(): the model-parallel ranks): the collectives
//   the partitioner inserts (all_gather, reduce_scatter, all_reduce with `axis`,
//   runtime/shard_collectives.h runs them). Over one communicator the two groups are the same.
// With none set, or a group of 1, the collectives are identities. Every rank calls the same
// collectives in the same order; sums are rank-order deterministic; DeadlineExceeded when a peer
// does not join in time, after which broken() is true.
//
//   class MyCollectives : public runtime::Collectives { ... every method ... };
//   exe->set_collectives(&my_collectives);
class Collectives {
 public:
  virtual ~Collectives() = default;
  // The data-parallel ranks.
  virtual int size() const = 0;
  // data[i] = sum over the ranks of data[i], in place; `count` elements of `dtype` (f32, bf16:
  // accumulated in f32, s32).
  virtual absl::Status AllReduceSum(void* data, int64_t count, DType dtype) = 0;
  // recv[i] = the sum over the ranks, in rank order, of their send[rank * recv_count + i] (f32,
  // bf16, s32).
  virtual absl::Status ReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                        DType dtype) = 0;
  // recv[r * send_count + i] = rank r's send[i] (any dtype).
  virtual absl::Status AllGather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;

  // The ranks of the mesh axis the SPMD collectives run over (1: every such op is the identity).
  virtual int num_shards() const = 0;
  // recv[r * send_count + i] = send of rank r [i] (rank order; any dtype).
  virtual absl::Status ShardAllGather(const void* send, void* recv, int64_t send_count,
                                      DType dtype) = 0;
  // recv[i] = sum over the ranks of their send[rank * recv_count + i] (f32, bf16, s32).
  virtual absl::Status ShardReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                             DType dtype) = 0;
  // data[i] = sum (max: max) over the ranks of data[i], in place, in rank order (f32, bf16, s32).
  virtual absl::Status ShardAllReduce(void* data, int64_t count, DType dtype, bool max) = 0;

  // Whether a group these run over is broken: a collective timed out, the ranks no longer agree
  // on what was reduced, and every later collective fails. The job should end (and restart from
  // a checkpoint): dist::Communicator::Abort.
  virtual bool broken() const = 0;
};

// Per-run state handed to every thunk: buffers[id] is the storage of node `id` (parameters point
// at the caller's tensors, constants at their literal, the rest into the arena).
struct RunContext {
  std::vector<void*> buffers;
  Collectives* collectives = nullptr;  // borrowed; null: one replica
  // The executable's communication thread (collective_stream.h): asynchronous collectives start
  // on it and are waited for before their first reader; a collective run on the calling thread
  // Quiesces it first. Never null while an Executable runs.
  CollectiveStream* stream = nullptr;
  // The first failure of a thunk that can fail (a collective); the run stops after that thunk.
  absl::Status status;
  // Per node: 1 when its value is fixed for the executable's life (a constant, a parameter bound
  // by Executable::BindConstantParameters, or a view of either), so a thunk may keep work it
  // derived from it (pre-packed weights) across runs. Empty until something is bound.
  std::vector<char> constant;
};

class Thunk {
 public:
  virtual ~Thunk() = default;
  // Shapes are static and checked at compile time, so running cannot fail, except for a
  // collective (its peers may be gone): it sets ctx.status.
  virtual void Run(RunContext& ctx) = 0;
  // For profiles and dumps, e.g. "dot_general %12 (onednn matmul)".
  virtual std::string name() const = 0;
  // Called by Executable::BindConstantParameters with the bound values in ctx.buffers and
  // ctx.constant set: a thunk may derive state from the buffers of constant nodes now (pre-pack
  // weights into the layout its kernel streams) and use it on every later run, and must drop such
  // state for nodes that are no longer constant. Default: nothing to prepare.
  virtual absl::Status PrepareConstants(const RunContext& ctx) { return absl::OkStatus(); }
};

// Not thread-safe: one run at a time per Executable (the run state and arena are members).
class Executable {
 public:
  // `init_thunks` compute the plan's hoisted values (BufferPlan::hoisted) once, here, into
  // buffers of their own; `thunks` run on every Run.
  Executable(ir::Graph graph, compiler::BufferPlan plan, std::vector<std::unique_ptr<Thunk>> thunks,
             std::string backend_name, std::vector<std::unique_ptr<Thunk>> init_thunks = {});

  const ir::Graph& graph() const { return graph_; }
  const compiler::BufferPlan& plan() const { return plan_; }
  const std::string& backend_name() const { return backend_name_; }
  int num_thunks() const { return static_cast<int>(thunks_.size()); }
  const Thunk& thunk(int i) const { return *thunks_[i]; }

  // Inputs in parameter-index order; dtypes and shapes must match (InvalidArgument otherwise,
  // naming the parameter). Returns one fresh tensor per graph output, in output order.
  absl::StatusOr<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs);
  // Inputs and outputs by name.
  absl::StatusOr<std::map<std::string, Tensor>> RunNamed(
      const std::map<std::string, Tensor>& inputs);
  // The allocation-free path: outputs must already have the right dtype and shape. Kernels write
  // each output straight into its tensor (no copy) unless that tensor overlaps an input or
  // another output; then it is computed in the arena (or, for outputs the plan keeps out of the
  // arena, in a staging buffer allocated on the first such call for that output) and copied.
  // An output with an in_place_of parameter (ir::Output) may be given that parameter's input
  // tensor itself: after the run the tensor holds the output. The kernel then writes it in place
  // when the plan allows (num_in_place_outputs()); otherwise the output is computed in the arena
  // or the staging buffer and copied over the input at the end, as for any overlap.
  absl::Status RunInto(const std::vector<const Tensor*>& inputs,
                       const std::vector<Tensor*>& outputs);
  // How many outputs the plan computes in place of their parameter (see RunInto).
  int num_in_place_outputs() const;

  // Fixes parameters' values for this executable's life, as a served model's weights are:
  // `values` maps a position in parameter-index order (as Run's inputs) to its tensor. The
  // executable keeps the tensors (shared storage: they must not be modified afterwards; bind
  // again after changing one) and its thunks may pre-pack them now (Thunk::PrepareConstants),
  // so a later run reads the packed copy. Every later run must pass exactly these tensors (the
  // same storage) at those positions, or it fails with InvalidArgument naming the parameter; so a
  // changed weight is never served from an old pack. Calling it again replaces every binding
  // (an empty map unbinds all) and re-prepares. A parameter that an output is computed in place
  // of cannot be bound (InvalidArgument): a training step's weights change every run.
  absl::Status BindConstantParameters(const std::map<int, Tensor>& values);
  int num_bound_parameters() const { return static_cast<int>(bound_.size()); }
  // Bytes of staging buffers allocated so far (0 until an output had to be staged).
  int64_t staging_bytes_allocated() const { return staging_allocated_; }

  // Called after each thunk with its index and steady-clock start/end in nanoseconds, for
  // per-kernel profiles. Null (the default) costs one branch per run; set only while profiling.
  using ThunkObserver = std::function<void(int thunk, int64_t start_ns, int64_t end_ns)>;
  void set_thunk_observer(ThunkObserver observer) { observer_ = std::move(observer); }

  // The collectives this executable's collective ops run through (borrowed; null: identities).
  // A failed collective stops the run: RunInto returns its status (the outputs are then garbage).
  // Collectives the backend runs asynchronously (ExecutionPlan::done_step) run on this
  // executable's communication thread (collective_stream.h) while the step's kernels go on; every
  // run ends with none in flight, so callers may use the same collectives between runs.
  void set_collectives(Collectives* collectives) { ctx_.collectives = collectives; }

  // Called at the end of each run, on the calling thread, once per asynchronous collective that
  // ran in it (start order): its name and steady-clock nanoseconds when the step handed it to the
  // communication thread, and when that thread began and ended it. For profiles (the time it was
  // in flight against the wait thunks' time: how much of it the step hid). Null: not reported.
  using CollectiveObserver = std::function<void(const std::string& name, int64_t start_ns,
                                                int64_t begin_ns, int64_t end_ns)>;
  void set_collective_observer(CollectiveObserver observer) {
    collective_observer_ = std::move(observer);
  }
  // Asynchronous collectives run on the communication thread so far (tests).
  int64_t async_collectives_run() const { return stream_->ops_run(); }

 private:
  ir::Graph graph_;
  compiler::BufferPlan plan_;
  std::vector<std::unique_ptr<Thunk>> thunks_;
  std::string backend_name_;
  std::shared_ptr<uint8_t> arena_;
  std::shared_ptr<uint8_t> hoisted_;  // the hoisted values, computed once
  RunContext ctx_;
  std::vector<int> params_;       // parameter node ids in index order
  std::vector<void*> arena_ptr_;  // per node: its arena buffer (null: parameter, constant, none)
  std::vector<char> direct_;      // per output, during RunInto: computed into the caller's tensor
  std::vector<int> in_place_input_;  // per output: the input it may be computed over, or -1
  // Per output kept out of the arena: its staging buffer, allocated when its tensor overlaps.
  std::vector<std::shared_ptr<uint8_t>> staged_;
  int64_t staging_allocated_ = 0;
  ThunkObserver observer_;
  CollectiveObserver collective_observer_;
  std::unique_ptr<CollectiveStream> stream_;  // after arena_: destroyed (joined) before it
  std::map<int, Tensor> bound_;               // BindConstantParameters: parameter position -> value
};

// A backend turns graphs into executables, through the one compile path: Compile runs
// compiler::Compile with this backend's traits and the passes it wants, then Lower turns the
// CompiledModule into thunks (reading its plan, re-deriving nothing).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // How this backend runs a graph, as the compiler's execution plan needs it.
  virtual compiler::BackendTraits Traits() const = 0;
  // Compiles `graph` to compute what it says.
  absl::StatusOr<std::unique_ptr<Executable>> Compile(const ir::Graph& graph) {
    return Compile(graph, compiler::ProgramOptions{});
  }
  // ... rewritten first by compiler::Compile's program pipeline under `program` (precision
  // policy, SPMD partitioning over a mesh: compiler::ProgramOptions).
  virtual absl::StatusOr<std::unique_ptr<Executable>> Compile(
      const ir::Graph& graph, const compiler::ProgramOptions& program) = 0;
  // The pipeline switches (disabled passes, IR dumps, verification) this backend compiles with,
  // for a caller that runs a compiler pipeline of its own on a graph it then compiles here
  // (nn::TrainStep runs the program pipeline on its loss graph, before autodiff).
  virtual compiler::PipelineOptions pipeline_options() const { return {}; }
  // `module` must have been compiled for Traits().
  virtual absl::StatusOr<std::unique_ptr<Executable>> Lower(
      const compiler::CompiledModule& module) = 0;
  // What a run records about the backend and how it compiles (run.json's compiler_options):
  // at least "backend", "optimize" and "fusion".
  virtual nlohmann::json Describe() const = 0;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_EXECUTABLE_H_
