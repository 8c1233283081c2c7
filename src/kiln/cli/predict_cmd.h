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
// outputs trimmed. An artifact of a model trained with data.augment.normalize records it
// (input_normalization.h) and its inputs are normalized that way first (--no-normalize: they
// come normalized already). Outputs: CSV (a header, then one row per example; columns `name` for
// one value per example, `name_0`, `name_1`, ... for several) or, for an --output ending in
// .safetensors, one tensor per output of shape [N, ...].
//
// `kiln predict RUN_OR_EXPORT --input-dir STUDIES --out results.jsonl|.csv [--dataset DIR]
// [--deadline 10m] [--threads N]` classifies every DICOM file under STUDIES (a batch job: decode
// on worker threads while the model runs batches, progress with rate, ETA and the predicted
// finish against the deadline, a final report; studies that fail to decode are listed by name
// with the reason; exit codes below). docs/cli.md "kiln predict".
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
  std::string artifact;  // the exported directory (or, with input_dir, a run directory)
  std::string input;     // .safetensors, .csv or .csv.gz
  std::string output;    // empty: CSV on `out`; else .csv or .safetensors (replaced if present)
  std::string backend = "cpu";
  // The inputs are already normalized: skip the artifact's input_normalization (the training
  // pipeline's data.augment.normalize, which kiln export records; input_normalization.h).
  bool no_normalize = false;
  // Bulk classification of DICOM studies (predict_studies.cc): every file under input_dir,
  // decoded as `kiln data import dicom` decoded the model's training data (`dataset`, or the
  // run's data.source), one result line per study in `out` (.jsonl or .csv).
  std::string input_dir;
  std::string out;
  std::string dataset;
  std::string deadline;  // "90s", "10m", "1h30m"; empty: none
  int threads = 0;       // decoding threads; 0: all cores
  int64_t batch = 32;    // a run directory's batch (an artifact has its own)
  bool quiet = false;
};

// Exit codes of `kiln predict --input-dir` besides 0 (every study classified, the deadline, if
// any, met) and 1 (an error before or while running: nothing or a partial FILE.partial written).
inline constexpr int kPredictExitFailures = 3;         // some studies did not decode (listed)
inline constexpr int kPredictExitLate = 4;             // all classified, the deadline missed
inline constexpr int kPredictExitLateAndFailures = 5;  // both

// Runs the bulk DICOM job of `o` (input_dir set); returns the exit code, messages on err, the
// final report on out.
int RunPredictStudies(const PredictOptions& o, std::ostream& out, std::ostream& err);

struct PredictResult {
  int64_t examples = 0;
  int64_t batches = 0;      // executable runs
  bool normalized = false;  // the artifact's input_normalization was applied to the inputs
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
