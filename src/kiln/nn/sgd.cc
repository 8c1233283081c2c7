#include "kiln/nn/sgd.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/autodiff/grad.h"
#include "kiln/autodiff/graph_copy.h"
#include "kiln/base/status.h"
#include "kiln/ir/builder.h"

namespace kiln::nn {

absl::StatusOr<ir::Graph> BuildSgdTrainStep(const ir::Graph& loss_graph,
                                            const std::vector<std::string>& params,
                                            const std::string& loss_output) {
  if (loss_graph.FindParameter("lr") >= 0) {
    return absl::InvalidArgumentError(
        "the loss graph already has a parameter named 'lr' (the SGD step adds it)");
  }
  for (const std::string& p : params) {
    if (loss_graph.FindOutput(UpdatedName(p)) >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the loss graph already has an output named '", UpdatedName(p), "'"));
    }
  }
  KILN_ASSIGN_OR_RETURN(ir::Graph g, autodiff::Grad(loss_graph, params, loss_output));

  ir::Builder b(loss_graph.name() + "_sgd_step");
  KILN_ASSIGN_OR_RETURN(autodiff::ValueMap map, autodiff::CopyGraph(g, b));
  ir::Value lr = b.Parameter("lr", DType::kF32, Shape{});
  // Keep the loss graph's outputs (the loss first among them, as the caller ordered them).
  for (const ir::Output& o : loss_graph.outputs()) {
    b.Output(o.name, map[g.outputs()[g.FindOutput(o.name)].node]);
  }
  for (const std::string& p : params) {
    const int gi = g.FindOutput("grad/" + p);
    if (gi < 0) return absl::InternalError(absl::StrCat("Grad produced no output grad/", p));
    ir::Value grad = map[g.outputs()[gi].node];
    ir::Value value = map[g.FindParameter(p)];
    ir::Value step = value.dtype() == DType::kF32 ? lr : ir::Convert(lr, value.dtype());
    b.Output(UpdatedName(p), value - step * grad);
  }
  return b.Build();
}

absl::StatusOr<std::unique_ptr<SgdTrainer>> SgdTrainer::Create(runtime::Backend& backend,
                                                               const ir::Graph& loss_graph,
                                                               ParamStore initial) {
  const int loss_index = loss_graph.FindOutput("loss");
  if (loss_index < 0) {
    return absl::InvalidArgumentError("SgdTrainer: the loss graph has no output named 'loss'");
  }
  for (int i = 0; i < initial.size(); ++i) {
    const std::string& name = initial.names()[i];
    const int id = loss_graph.FindParameter(name);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SgdTrainer: parameter '", name, "' is not an input of the loss graph"));
    }
    const ir::Type& want = loss_graph.node(id).type();
    if (want.dtype != initial.value(i).dtype() || want.shape != initial.value(i).shape()) {
      return absl::InvalidArgumentError(absl::StrCat("SgdTrainer: parameter '", name, "' is ",
                                                     initial.value(i).TypeString(),
                                                     " but the graph takes ", want.ToString()));
    }
  }
  KILN_ASSIGN_OR_RETURN(ir::Graph step, BuildSgdTrainStep(loss_graph, initial.names(), "loss"));

  std::unique_ptr<SgdTrainer> t(new SgdTrainer());
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<runtime::Executable>> exe = backend.Compile(step);
  if (!exe.ok()) {
    return Annotate(exe.status(),
                    absl::StrCat("compiling the SGD train step on backend ", backend.name()));
  }
  t->compile_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t->exe_ = std::move(exe).value();
  const ir::Graph& g = t->exe_->graph();

  t->next_ = initial.Clone();
  t->current_ = std::move(initial);
  const std::vector<int> graph_params = g.parameters();
  t->inputs_.assign(graph_params.size(), nullptr);
  t->data_slot_.assign(graph_params.size(), -1);
  t->lr_ = Tensor(DType::kF32, Shape{});
  for (size_t i = 0; i < graph_params.size(); ++i) {
    const std::string& name = g.node(graph_params[i]).attr_str("name");
    if (t->current_.Contains(name)) {
      t->inputs_[i] = t->current_.Find(name);
    } else if (name == "lr") {
      t->inputs_[i] = &t->lr_;
    } else {
      t->data_slot_[i] = static_cast<int>(t->data_names_.size());
      t->data_names_.push_back(name);
    }
  }

  // Outputs: the loss graph's outputs, then new/<p> written into next_.
  t->outputs_.assign(g.outputs().size(), nullptr);
  t->extra_outputs_.reserve(g.outputs().size());  // never reallocates: outputs_ points into it
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const ir::Output& out = g.outputs()[o];
    const int k = [&] {
      for (int i = 0; i < t->next_.size(); ++i) {
        if (UpdatedName(t->next_.names()[i]) == out.name) return i;
      }
      return -1;
    }();
    if (k >= 0) {
      t->outputs_[o] = &t->next_.value(k);
    } else {
      const ir::Type& type = g.node(out.node).type();
      t->extra_outputs_.emplace_back(type.dtype, type.shape);
      t->outputs_[o] = &t->extra_outputs_.back();
      if (out.name == "loss") t->loss_output_ = static_cast<int>(t->extra_outputs_.size()) - 1;
    }
  }
  return t;
}

absl::StatusOr<float> SgdTrainer::Step(const std::vector<const Tensor*>& data, float lr) {
  if (data.size() != data_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("SgdTrainer::Step takes ", data_names_.size(),
                                                   " data inputs, got ", data.size()));
  }
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (data_slot_[i] >= 0) inputs_[i] = data[data_slot_[i]];
  }
  lr_.data<float>()[0] = lr;
  KILN_RETURN_IF_ERROR(exe_->RunInto(inputs_, outputs_));
  // The step wrote the updated values into next_: make them current (swaps storage handles only).
  for (int i = 0; i < current_.size(); ++i) std::swap(current_.value(i), next_.value(i));
  return static_cast<float>(extra_outputs_[loss_output_].GetDouble(0));
}

}  // namespace kiln::nn
