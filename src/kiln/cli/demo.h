// `kiln demo`: trains an MLP classifier on scikit-learn's digits through the engine and reports
// what it did. The train step (forward, autodiff backward, SGD update) is one compiled graph run
// once per batch; the held-out set is scored by a second compiled graph.
//
//   DemoOptions opts;                  // defaults: 300 steps, batch 64, lr 0.5, hidden 64, cpu
//   opts.data = "examples/data/digits.csv.gz";
//   KILN_ASSIGN_OR_RETURN(DemoResult r, RunDemo(opts, std::cout));
//   r.held_out_accuracy;               // ~0.95-0.97
#ifndef KILN_CLI_DEMO_H_
#define KILN_CLI_DEMO_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::cli {

struct DemoOptions {
  std::string data = "examples/data/digits.csv.gz";
  int64_t steps = 300;
  int64_t batch = 64;
  double lr = 0.5;
  std::vector<int64_t> hidden = {64};
  uint64_t seed = 0;
  std::string backend = "cpu";
  double held_out_fraction = 0.2;
  int64_t log_every = 0;  // 0: about 10 loss lines over the run
  std::string dump_ir;    // when set, the train-step graph's IR text is written there
};

struct DemoResult {
  double first_loss = 0;  // loss of the first step
  double final_loss = 0;  // mean loss over the last logging interval
  double held_out_accuracy = 0;
  double steps_per_second = 0;
};

// Prints the narration to `out`. Errors: unreadable or malformed data, bad options
// (InvalidArgument naming the flag), engine failures (annotated with what was being done).
absl::StatusOr<DemoResult> RunDemo(const DemoOptions& options, std::ostream& out);

}  // namespace kiln::cli

#endif  // KILN_CLI_DEMO_H_
