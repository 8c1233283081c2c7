// ZeRO-1's half of TrainStep (train_step.h, "ZeRO-1"): private to nn/train_step*.cc.
#ifndef KILN_NN_INTERNAL_TRAIN_STEP_ZERO_H_
#define KILN_NN_INTERNAL_TRAIN_STEP_ZERO_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kiln/nn/train_step.h"
#include "kiln/runtime/executable.h"
#include "kiln/tensor/tensor.h"

namespace kiln::nn {

// The gradient executable's output: the flattened, padded f32 gradients.
inline constexpr char kZeroGradsOutput[] = "zero/grads";

// InvalidArgument unless ZeRO-1 can run: f32 parameters, data_rank in range, collectives when
// data_parallel > 1, and a non-empty shard on every rank.
absl::Status CheckZeroOptions(const ParamStore& initial, const TrainStepOptions& options);

struct TrainStep::Zero {
  runtime::Collectives* collectives = nullptr;  // null when data_parallel == 1
  int ranks = 1, rank = 0;
  int64_t shard = 0;                   // S
  std::vector<int64_t> param_offsets;  // into the flat parameters
  std::vector<int64_t> param_sizes;
  std::vector<FlatRange> pieces;  // this rank's part of each parameter
  int64_t used = 0;               // elements of this rank's shard that hold parameters
  int grads = -1;                 // index of kZeroGradsOutput in extra_outputs_
  std::unique_ptr<runtime::Executable> update;
  Tensor grad_shard, param_shard, flat_params, grad_norm, norm_out, lr_out;
  std::vector<const Tensor*> inputs;
  std::vector<Tensor*> outputs;
};

}  // namespace kiln::nn

#endif  // KILN_NN_INTERNAL_TRAIN_STEP_ZERO_H_
