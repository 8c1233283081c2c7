// `kiln quantize ARTIFACT --calibration DATA --out DIR [--budget 0.5]`: post-training int8 for the
// matmuls and convolutions of an exported artifact, behind an accuracy gate (docs/quantize.md).
//
//   kiln quantize /tmp/mlp --calibration digits.csv.gz --out /tmp/mlp_int8 --budget 0.5
//
// It calibrates the activation scale of every matmul/conv whose weights are artifact weights on
// the calibration examples (min-max or a percentile of |x|), quantizes those weights per output
// channel (symmetric s8), rewrites the program (quantize -> quantized_dot / quantized_conv2d ->
// the rest unchanged; compiler/passes/quantize_int8.h), measures the held-out metric and the
// latency of both programs, and writes the int8 artifact (an ordinary `kiln export` artifact) plus
// DIR/quantize.json only when the metric dropped by at most the budget; otherwise it writes nothing
// and fails with both numbers. Data: what `kiln predict --input` reads plus labels (a CSV column,
// or a safetensors tensor "labels").
//
// app.cc registers it like the other commands:
//
//   QuantizeCommand quantize_cmd(app);
//   if (int rc = quantize_cmd.Run(out, err); rc >= 0) return rc;   // -1: not chosen
#ifndef KILN_CLI_QUANTIZE_CMD_H_
#define KILN_CLI_QUANTIZE_CMD_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kiln::cli {

struct QuantizeOptions {
  std::string artifact;     // the f32 artifact directory
  std::string calibration;  // examples for calibration (.csv, .csv.gz, .safetensors)
  std::string eval;         // held-out examples; empty: the calibration file's rows after
                            // the first calibration_rows
  std::string out;          // the int8 artifact directory (must not exist unless overwrite)
  double budget = 0.5;      // largest allowed drop: accuracy points, or relative MSE in percent
  std::string method = "minmax";       // minmax | percentile
  double percentile = 99.99;           // of |x|, for --method percentile
  std::string labels_column = "last";  // CSV: last | first | none | a 0-based column index
  int64_t calibration_rows = 512;      // examples of --calibration used to calibrate (0: all)
  double input_scale = 1.0;            // every float input value read is multiplied by it (the data
                             // pipeline's scaling, which the artifact does not hold: digits 1/16)
  int latency_runs = 30;  // timed runs per program (alternating)
  bool overwrite = false;
  std::string backend = "cpu";
};

struct QuantizeResult {
  bool accepted = false;  // the drop is within the budget and DIR was written
  nlohmann::json report;  // what DIR/quantize.json holds (docs/quantize.md "Report")
};

// Errors: bad flags, data or artifact (naming the file, line and column); a refusal is not an
// error: accepted = false, nothing written.
absl::StatusOr<QuantizeResult> RunQuantize(const QuantizeOptions& options, std::ostream& out);

// The report's note when the int8 program measured slower than f32 (empty otherwise): the batch,
// the ratio and, for the cpu backend, the ISA level and why (report["cpu"]: without AVX-512 VNNI
// int8 runs on Kiln's exact widening GEMM, no faster per multiply than f32).
std::string Int8SpeedNote(const nlohmann::json& report);

class QuantizeCommand {
 public:
  explicit QuantizeCommand(CLI::App& app);

  // The exit code (0; 1 with "kiln quantize: <message>" on err for an error or a refusal), or -1
  // if not chosen.
  int Run(std::ostream& out, std::ostream& err);

 private:
  CLI::App* cmd_ = nullptr;
  QuantizeOptions options_;
};

}  // namespace kiln::cli

#endif  // KILN_CLI_QUANTIZE_CMD_H_
