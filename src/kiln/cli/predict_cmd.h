// `kiln predict ARTIFACT --input FILE [--output FILE]`: runs an artifact written by
// `kiln export --format kiln` (manifest.json, program.ir, weights.safetensors; docs/formats.md)
// on examples from a file and prints or writes its outputs (docs/cli.md).
//
//   kiln predict /tmp/mlp --input rows.csv                     # CSV of the outputs on stdout
//   kiln predict /tmp/mlp --input x.safetensors --output y.safetensors
//
// Inputs: a safetensors file holding one tensor per runtime input, by name, each either of the
// artifact's exact shape or [N, ...the rest of it]; or CSV rows (.csv, .csv.gz), one example per
// row, the runtime inputs' values flattened and concatenated in signature order (a first line
// with no number in it is a header and skipped). N examples run in batches of the artifact's
// batch size (the leading dimension of its inputs), the last one padded with zeros and its
// outputs trimmed. Outputs: CSV (a header, then one row per example; columns `name` for one value
// per example, `name_0`, `name_1`, ... for several) or, for an --output ending in .safetensors,
// one tensor per output of shape [N, ...].
//
// app.cc registers it like the other commands:
//
//   PredictCommand predict_cmd(app);
//   app.parse(argc, argv);
//   if (int rc = predict_cmd.Run(out, err); rc >= 0) return rc;   // -1: not chosen
#ifndef KILN_CLI_PREDICT_CMD_H_
#define KILN_CLI_PREDICT_CMD_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"

namespace kiln::cli {

struct PredictOptions {
  std::string artifact;  // the exported directory
  std::string input;     // .safetensors, .csv or .csv.gz
  std::string output;    // empty: CSV on `out`; else .csv or .safetensors (replaced if present)
  std::string backend = "cpu";
};

struct PredictResult {
  int64_t examples = 0;
  int64_t batches = 0;  // executable runs
};

// Errors name what was wrong: the artifact (LoadArtifact's messages), an input tensor that is
// missing, unknown or of the wrong dtype or shape, a CSV row's file, line and column, an output
// path that would overwrite the input or the artifact.
absl::StatusOr<PredictResult> RunPredict(const PredictOptions& options, std::ostream& out);

class PredictCommand {
 public:
  explicit PredictCommand(CLI::App& app);

  // The exit code (0, or 1 with "kiln predict: <message>" on err), or -1 if not chosen.
  int Run(std::ostream& out, std::ostream& err);

 private:
  CLI::App* cmd_ = nullptr;
  PredictOptions options_;
};

}  // namespace kiln::cli

#endif  // KILN_CLI_PREDICT_CMD_H_
