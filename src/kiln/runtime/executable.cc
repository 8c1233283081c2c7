#include "kiln/runtime/executable.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "kiln/base/memory.h"
#include "kiln/base/status.h"

namespace kiln::runtime {
namespace {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<uint8_t> AllocateArena(int64_t bytes) {
  return AllocatePopulated(bytes, kBufferAlignment);  // zeroed, every page mapped
}

std::string ParamName(const ir::Node& n) {
  return n.has_attr("name") ? n.attr_str("name") : "%" + std::to_string(n.id());
}

}  // namespace

Executable::Executable(ir::Graph graph, compiler::BufferPlan plan,
                       std::vector<std::unique_ptr<Thunk>> thunks, std::string backend_name,
                       std::vector<std::unique_ptr<Thunk>> init_thunks)
    : graph_(std::move(graph)),
      plan_(std::move(plan)),
      thunks_(std::move(thunks)),
      backend_name_(std::move(backend_name)),
      arena_(AllocateArena(plan_.arena_bytes)),
      stream_(std::make_unique<CollectiveStream>()) {
  ctx_.stream = stream_.get();
  params_ = graph_.parameters();
  ctx_.buffers.assign(graph_.num_nodes(), nullptr);
  for (const ir::Node& n : graph_.nodes()) {
    if (n.opcode() == ir::Opcode::kParameter) continue;  // bound per run
    if (n.opcode() == ir::Opcode::kConstant) {
      // Kernels never write a constant's buffer; the literal is shared and immutable in spirit.
      ctx_.buffers[n.id()] = n.literal() ? const_cast<void*>(n.literal()->raw_data()) : nullptr;
      continue;
    }
    int64_t off = n.id() < static_cast<int>(plan_.offsets.size()) ? plan_.offsets[n.id()] : -1;
    if (off < 0) continue;  // not materialized (e.g. inside a fused kernel): no buffer
    KILN_CHECK(off + n.type().byte_size() <= plan_.arena_bytes);
    ctx_.buffers[n.id()] = arena_.get() + off;
  }
  // Hoisted values: their own buffers, computed now (their operands are constants, other
  // hoisted values, or aliases of those) and never again.
  int64_t hoisted_bytes = 0;
  for (int id : plan_.hoisted) hoisted_bytes += AlignUp(graph_.node(id).type().byte_size());
  if (hoisted_bytes > 0) hoisted_ = AllocateArena(hoisted_bytes);
  int64_t at = 0;
  for (int id : plan_.hoisted) {
    ctx_.buffers[id] = hoisted_.get() + at;
    at += AlignUp(graph_.node(id).type().byte_size());
  }
  for (const auto& [node, source] : plan_.aliases) ctx_.buffers[node] = ctx_.buffers[source];
  for (const std::unique_ptr<Thunk>& t : init_thunks) t->Run(ctx_);
  arena_ptr_.assign(graph_.num_nodes(), nullptr);
  for (const ir::Node& n : graph_.nodes())
    if (n.opcode() != ir::Opcode::kParameter && n.opcode() != ir::Opcode::kConstant)
      arena_ptr_[n.id()] = ctx_.buffers[n.id()];
  direct_.assign(graph_.outputs().size(), 0);
  in_place_input_.assign(graph_.outputs().size(), -1);
  staged_.resize(graph_.outputs().size());
  for (size_t i = 0; i < graph_.outputs().size() && i < plan_.in_place_outputs.size(); ++i) {
    if (!plan_.in_place_outputs[i]) continue;
    const int64_t index = graph_.outputs()[i].in_place_of;
    for (size_t k = 0; k < params_.size(); ++k)
      if (graph_.node(params_[k]).attr_int("index") == index)
        in_place_input_[i] = static_cast<int>(k);
  }
}

int Executable::num_in_place_outputs() const {
  int n = 0;
  for (int k : in_place_input_) n += k >= 0;
  return n;
}

absl::StatusOr<std::vector<Tensor>> Executable::Run(const std::vector<Tensor>& inputs) {
  std::vector<const Tensor*> in(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) in[i] = &inputs[i];
  std::vector<Tensor> outputs;
  outputs.reserve(graph_.outputs().size());
  for (const ir::Output& o : graph_.outputs()) {
    const ir::Type& t = graph_.node(o.node).type();
    outputs.emplace_back(t.dtype, t.shape);
  }
  std::vector<Tensor*> out(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) out[i] = &outputs[i];
  KILN_RETURN_IF_ERROR(RunInto(in, out));
  return outputs;
}

absl::StatusOr<std::map<std::string, Tensor>> Executable::RunNamed(
    const std::map<std::string, Tensor>& inputs) {
  std::vector<Tensor> ordered;
  ordered.reserve(params_.size());
  for (int id : params_) {
    std::string name = ParamName(graph_.node(id));
    auto it = inputs.find(name);
    if (it == inputs.end())
      return absl::InvalidArgumentError("missing input for parameter '" + name + "'");
    ordered.push_back(it->second);
  }
  for (const auto& [name, t] : inputs) {
    if (graph_.FindParameter(name) < 0)
      return absl::InvalidArgumentError("unknown input '" + name + "': graph '" + graph_.name() +
                                        "' has no parameter of that name");
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, Run(ordered));
  std::map<std::string, Tensor> named;
  for (size_t i = 0; i < outs.size(); ++i) named[graph_.outputs()[i].name] = std::move(outs[i]);
  return named;
}

absl::Status Executable::RunInto(const std::vector<const Tensor*>& inputs,
                                 const std::vector<Tensor*>& outputs) {
  if (inputs.size() != params_.size())
    return absl::InvalidArgumentError("expected " + std::to_string(params_.size()) +
                                      " inputs, got " + std::to_string(inputs.size()));
  if (outputs.size() != graph_.outputs().size())
    return absl::InvalidArgumentError("expected " + std::to_string(graph_.outputs().size()) +
                                      " outputs, got " + std::to_string(outputs.size()));
  for (size_t i = 0; i < params_.size(); ++i) {
    const ir::Node& p = graph_.node(params_[i]);
    const Tensor* t = inputs[i];
    // Messages are built only on failure: this is the per-step path and must not allocate.
    auto what = [&] {
      return "input " + std::to_string(i) + " (parameter '" + ParamName(p) + "')";
    };
    if (t == nullptr) return absl::InvalidArgumentError(what() + " is null");
    if (t->dtype() != p.type().dtype || t->shape() != p.type().shape)
      return absl::InvalidArgumentError(what() + ": expected " + p.type().ToString() + ", got " +
                                        t->TypeString());
  }
  for (const auto& [i, value] : bound_) {
    if (inputs[i]->raw_data() != value.raw_data())
      return absl::InvalidArgumentError(
          "input " + std::to_string(i) + " (parameter '" + ParamName(graph_.node(params_[i])) +
          "') is bound constant (BindConstantParameters): pass the bound tensor, or bind the new "
          "one");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const ir::Output& o = graph_.outputs()[i];
    const ir::Type& type = graph_.node(o.node).type();
    auto what = [&] { return "output " + std::to_string(i) + " ('" + o.name + "')"; };
    if (outputs[i] == nullptr) return absl::InvalidArgumentError(what() + " is null");
    if (outputs[i]->dtype() != type.dtype || outputs[i]->shape() != type.shape)
      return absl::InvalidArgumentError(what() + ": expected " + type.ToString() + ", got " +
                                        outputs[i]->TypeString());
  }

  for (size_t i = 0; i < params_.size(); ++i)
    ctx_.buffers[params_[i]] = const_cast<void*>(inputs[i]->raw_data());  // thunks only read them
  // Outputs computed into the arena are computed straight into the caller's tensors instead
  // (no copy after the run), unless a tensor overlaps an input or an output already bound that
  // way: then the kernel writes the arena and the result is copied as before.
  auto overlaps = [](const void* a, int64_t na, const void* b, int64_t nb) {
    const uint8_t* pa = static_cast<const uint8_t*>(a);
    const uint8_t* pb = static_cast<const uint8_t*>(b);
    return pa < pb + nb && pb < pa + na;
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    direct_[i] = 0;
    const ir::Output& o = graph_.outputs()[i];
    const ir::Node& n = graph_.node(o.node);
    int64_t bytes = n.type().byte_size();
    const bool staged =
        o.node < static_cast<int>(plan_.outside_arena.size()) && plan_.outside_arena[o.node];
    if (bytes == 0 || (arena_ptr_[o.node] == nullptr && !staged) ||
        ctx_.buffers[o.node] != arena_ptr_[o.node])
      continue;  // a parameter, a constant, unplanned, or bound by an earlier output
    void* dst = outputs[i]->raw_data();
    // The input this output is planned to overwrite in place, when the caller passed it.
    const int donor = in_place_input_[i] >= 0 && inputs[in_place_input_[i]]->raw_data() == dst
                          ? in_place_input_[i]
                          : -1;
    bool clash = false;
    for (size_t k = 0; k < inputs.size() && !clash; ++k)
      clash = static_cast<int>(k) != donor &&
              overlaps(dst, bytes, inputs[k]->raw_data(), inputs[k]->byte_size());
    for (size_t k = 0; k < i && !clash; ++k)
      clash = direct_[k] && overlaps(dst, bytes, outputs[k]->raw_data(), outputs[k]->byte_size());
    if (!clash) {
      ctx_.buffers[o.node] = dst;
      direct_[i] = 1;
    } else if (staged) {
      // No arena slot: compute into this output's staging buffer (allocated on first need and
      // kept, so only outputs that do overlap ever cost memory).
      if (!staged_[i]) {
        staged_[i] = AllocateArena(bytes);
        staging_allocated_ += AlignUp(bytes);
      }
      ctx_.buffers[o.node] = staged_[i].get();
    }
  }
  // Aliases (reshapes) read their source's buffer, wherever it was bound above.
  for (const auto& [node, source] : plan_.aliases) ctx_.buffers[node] = ctx_.buffers[source];
  if (!observer_) {
    for (const std::unique_ptr<Thunk>& t : thunks_) {
      t->Run(ctx_);
      if (!ctx_.status.ok()) break;
    }
  } else {
    for (size_t i = 0; i < thunks_.size(); ++i) {
      int64_t start = SteadyNowNs();
      thunks_[i]->Run(ctx_);
      observer_(static_cast<int>(i), start, SteadyNowNs());
      if (!ctx_.status.ok()) break;
    }
  }
  absl::Status failed = std::exchange(ctx_.status, absl::OkStatus());
  // Nothing stays in flight past the run (a failed run stops before some waits): the arena and
  // the caller's tensors are the caller's again, and so is the communicator.
  absl::Status in_flight = collective_observer_ ? stream_->WaitAll([this](const CollectiveOp& op) {
    collective_observer_(op.name(), op.start_ns, op.begin_ns, op.end_ns);
  })
                                                : stream_->WaitAll();
  if (failed.ok()) failed = std::move(in_flight);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (direct_[i]) continue;
    const ir::Output& o = graph_.outputs()[i];
    size_t bytes = static_cast<size_t>(graph_.node(o.node).type().byte_size());
    const void* src = ctx_.buffers[o.node];
    if (bytes > 0 && src != outputs[i]->raw_data())
      std::memmove(outputs[i]->raw_data(), src, bytes);
  }
  // Parameter and caller output pointers are only valid for this call.
  for (int id : params_) ctx_.buffers[id] = nullptr;
  for (const ir::Output& o : graph_.outputs())
    if (graph_.node(o.node).opcode() != ir::Opcode::kParameter &&
        graph_.node(o.node).opcode() != ir::Opcode::kConstant)
      ctx_.buffers[o.node] = arena_ptr_[o.node];
  return failed;
}

absl::Status Executable::BindConstantParameters(const std::map<int, Tensor>& values) {
  for (const auto& [i, t] : values) {
    if (i < 0 || i >= static_cast<int>(params_.size()))
      return absl::InvalidArgumentError("BindConstantParameters: no parameter at position " +
                                        std::to_string(i) + " (the graph has " +
                                        std::to_string(params_.size()) + ")");
    const ir::Node& p = graph_.node(params_[i]);
    if (t.dtype() != p.type().dtype || t.shape() != p.type().shape)
      return absl::InvalidArgumentError("BindConstantParameters: parameter '" + ParamName(p) +
                                        "' is " + p.type().ToString() + ", got " + t.TypeString());
    const int64_t index = p.attr_int("index");
    for (const ir::Output& o : graph_.outputs())
      if (o.in_place_of == index)
        return absl::InvalidArgumentError("BindConstantParameters: parameter '" + ParamName(p) +
                                          "' is updated in place by output '" + o.name +
                                          "', so it cannot be constant");
  }
  bound_ = values;
  ctx_.constant.assign(graph_.num_nodes(), 0);
  for (const ir::Node& n : graph_.nodes())
    if (n.opcode() == ir::Opcode::kConstant) ctx_.constant[n.id()] = 1;
  for (const auto& [i, t] : bound_) {
    ctx_.constant[params_[i]] = 1;
    ctx_.buffers[params_[i]] = const_cast<void*>(t.raw_data());  // thunks only read them
  }
  // Values hoisted out of the run are computed from constants once: constant too.
  for (int id : plan_.hoisted) ctx_.constant[id] = 1;
  // Views of constants are constant (an alias's source is never itself an alias).
  for (const auto& [node, source] : plan_.aliases) {
    ctx_.buffers[node] = ctx_.buffers[source];
    ctx_.constant[node] = ctx_.constant[source];
  }
  absl::Status status;
  for (const std::unique_ptr<Thunk>& t : thunks_) {
    status = t->PrepareConstants(ctx_);
    if (!status.ok()) break;
  }
  for (int id : params_) ctx_.buffers[id] = nullptr;
  for (const auto& [node, source] : plan_.aliases) ctx_.buffers[node] = ctx_.buffers[source];
  if (!status.ok()) {
    // Leave nothing half-prepared: unbind and let every thunk drop what it derived.
    bound_.clear();
    ctx_.constant.clear();
    for (const std::unique_ptr<Thunk>& t : thunks_) (void)t->PrepareConstants(ctx_);
  }
  return status;
}

}  // namespace kiln::runtime
