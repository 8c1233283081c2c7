// `kiln demo`: trains an MLP classifier on scikit-learn's digits through the engine and reports
// what it did. The train step (forward, autodiff backward, SGD update) is one compiled graph run
// once per batch; the held-out set is scored by a second compiled graph.
//
//   DemoOptions opts;                  // defaults: 300 steps, batch 64, lr 0.5, hidden 64, cpu
//   opts.data = "examples/data/digits.csv.gz";   // empty: FindDefaultDigitsData
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
  // Empty: the bundled examples/data/digits.csv.gz, found by FindDefaultDigitsData.
  std::string data;
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

// Where the bundled digits data may be, in search order: examples/data/digits.csv.gz under the
// current directory, under the kiln binary's folder and its four parents (build/src/kiln/cli/kiln
// sits four levels below the source tree), then under the source tree kiln was built from.
std::vector<std::string> DefaultDigitsDataCandidates();

// The first of `candidates` that exists; otherwise NotFound listing every place looked and how to
// pass --data.
absl::StatusOr<std::string> FindDefaultDigitsData(const std::vector<std::string>& candidates);

// Prints the narration to `out`. Errors: unreadable or malformed data, bad options
// (InvalidArgument naming the flag), engine failures (annotated with what was being done).
absl::StatusOr<DemoResult> RunDemo(const DemoOptions& options, std::ostream& out);

}  // namespace kiln::cli

#endif  // KILN_CLI_DEMO_H_
