// Warm start (`init_from` in a config, `kiln train --init-from DIR`): a fresh run's parameters
// taken from another run's checkpoint before step 1, by name, with include / exclude patterns and
// a prefix rename. Only parameters: the optimizer state, the step counter and the data position
// start fresh (docs/train.md "init_from").
//
//   InitFromConfig c{.checkpoint = "runs/day1", .exclude = {"head/*"}};
//   KILN_ASSIGN_OR_RETURN(InitFromResult r, LoadInitFrom(c, step->params(), env));
//   KILN_RETURN_IF_ERROR(step->Restore(r.params, step->optimizer_state(), 0));
//   log << r.Summary();   // "init_from: loaded 4 tensors (1234 parameters) from ..."
//
// The checkpoint is verified as a resume verifies it (manifest, shard and tensor CRC32C); the
// optimizer state in it ("opt/...") is verified and dropped unread into memory.
#ifndef KILN_TRAIN_INIT_FROM_H_
#define KILN_TRAIN_INIT_FROM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/nn/params.h"
#include "kiln/train/config.h"
#include "nlohmann/json.hpp"

namespace kiln::train {

struct InitFromResult {
  std::string checkpoint;           // the step_<N> directory read
  int64_t step = 0;                 // its step
  nn::ParamStore params;            // every parameter of `like`: loaded or its own initial value
  std::vector<std::string> loaded;  // model names, in model order
  std::vector<std::string> left;    // model names left at their initialization
  int64_t loaded_elements = 0;      // scalars over `loaded`
  std::vector<std::string> notes;   // damaged checkpoints skipped on the way
  // "init_from: loaded N tensors (M parameters) from DIR, left K at their initialisation: a, b"
  std::string Summary() const;
  // For run.json: {checkpoint, step, tensors, parameters, loaded: [...], left: [...]}.
  nlohmann::json ToJson() const;
};

// The checkpoint directory `checkpoint` names: a run directory (its newest checkpoint of that
// run that verifies) or a step_<N> directory (that one). Reads it through `env` (null: default)
// and takes, for each parameter of `like` that the patterns select, the checkpoint tensor of its
// (renamed) name. InvalidArgument naming the tensor, both shapes and dtypes and the checkpoint
// when a selected tensor is missing or differs; NotFound when the directory holds no checkpoint;
// DataLoss when it is damaged.
absl::StatusOr<InitFromResult> LoadInitFrom(const InitFromConfig& config,
                                            const nn::ParamStore& like, Env* env = nullptr);

// fnmatch(3) without flags: `*` and `?` match any characters, `/` included.
bool GlobMatch(const std::string& pattern, const std::string& name);

// The checkpoint name of model parameter `name` under `rename` (checkpoint prefix -> model
// prefix; the longest model prefix that matches wins); `name` itself when none matches.
std::string CheckpointNameFor(const std::string& name,
                              const std::map<std::string, std::string>& rename);

}  // namespace kiln::train

#endif  // KILN_TRAIN_INIT_FROM_H_
