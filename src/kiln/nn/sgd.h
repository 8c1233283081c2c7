// Plain SGD, expressed as graph code: the whole training step (forward, backward from autodiff,
// and the update p <- p - lr * grad) is one compiled graph, run once per step with the new
// parameters fed back in.
//
//   KILN_ASSIGN_OR_RETURN(ir::Graph loss, mlp.LossGraph(64));           // params, x, labels
//   KILN_ASSIGN_OR_RETURN(ir::Graph step, BuildSgdTrainStep(loss, names));
//   // step(params..., x, labels, lr f32[]) -> {"loss", "new/<param>"...}
//
//   std::unique_ptr<runtime::Backend> cpu = runtime::MakeCpuBackend();
//   KILN_ASSIGN_OR_RETURN(auto trainer, SgdTrainer::Create(*cpu, loss, std::move(params)));
//   KILN_ASSIGN_OR_RETURN(float l, trainer->Step({&x, &labels}, /*lr=*/0.5f));
//
// SgdTrainer keeps two parameter sets and swaps them each step (the step reads one and writes
// the other), so a step allocates nothing: inputs and outputs go through Executable::RunInto.
#ifndef KILN_NN_SGD_H_
#define KILN_NN_SGD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"
#include "kiln/nn/params.h"
#include "kiln/runtime/executable.h"

namespace kiln::nn {

// The output name of a parameter's updated value in a train-step graph.
inline std::string UpdatedName(const std::string& param) { return "new/" + param; }

// From `loss_graph` (any parameters; output `loss_output`, a floating scalar) builds the SGD
// train step: the same parameters in the same order, then "lr" (f32[], the learning rate,
// converted to each parameter's dtype for its update). Outputs: the loss graph's outputs, same
// names and order, then "new/<p>" = p - lr * d(loss)/dp for each p in `params`, in order.
// Errors: those of autodiff::Grad (unknown or non-floating params, no VJP for an op), or a loss
// graph that already has a parameter "lr" or an output "new/<p>".
absl::StatusOr<ir::Graph> BuildSgdTrainStep(const ir::Graph& loss_graph,
                                            const std::vector<std::string>& params,
                                            const std::string& loss_output = "loss");

class SgdTrainer {
 public:
  // `loss_graph` takes the parameters in `initial` (by name, any order in the graph) plus data
  // inputs (e.g. x, labels) and outputs "loss". Every parameter of `initial` is trained; the
  // graph's other parameters are the per-step data inputs, in graph parameter order.
  static absl::StatusOr<std::unique_ptr<SgdTrainer>> Create(runtime::Backend& backend,
                                                            const ir::Graph& loss_graph,
                                                            ParamStore initial);

  // One step on one batch: `data` holds the data inputs in graph order. Returns the loss before
  // the update. The parameters are updated in place (see params()).
  absl::StatusOr<float> Step(const std::vector<const Tensor*>& data, float lr);

  const ParamStore& params() const { return current_; }
  const runtime::Executable& executable() const { return *exe_; }
  const ir::Graph& train_step_graph() const { return exe_->graph(); }
  // Names of the data inputs, in the order Step takes them.
  const std::vector<std::string>& data_inputs() const { return data_names_; }
  // Wall time of backend->Compile for the train step.
  double compile_seconds() const { return compile_seconds_; }

 private:
  SgdTrainer() = default;

  std::unique_ptr<runtime::Executable> exe_;
  ParamStore current_, next_;
  std::vector<std::string> data_names_;
  std::vector<int> data_slot_;  // graph parameter index -> index into Step's `data`, or -1
  Tensor lr_;
  std::vector<Tensor> extra_outputs_;  // outputs other than new/<p> (the loss among them)
  int loss_output_ = -1;               // index of the loss in extra_outputs_
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor*> outputs_;
  double compile_seconds_ = 0;
};

}  // namespace kiln::nn

#endif  // KILN_NN_SGD_H_
