// The one zero-padded fixed-batch run loop: N rows through an executable compiled for batch B,
// in ceil(N / B) runs, the last batch padded with zero rows and its outputs trimmed. The served
// model (served_model.h), `kiln predict` and the predict library (kiln/predict: calibration, the
// accuracy metric, latency, bulk classification) all run batches through it.
//
//   KILN_ASSIGN_OR_RETURN(auto exe, backend->Compile(artifact.program));   // batch B
//   KILN_ASSIGN_OR_RETURN(FixedBatchRunner runner, FixedBatchRunner::ForArtifact(*exe, artifact));
//   KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, runner.RunAll({{"x", x}}, n));  // x: [n, ...]
//
// The runner owns one [B, ...] buffer per runtime input, allocated once and reused by every run
// (the hot serving path stages request rows straight into them: Stage, then Run); weights are
// passed as bound. Every runtime input must have the leading (batch) dimension B.
#ifndef KILN_SERVE_FIXED_BATCH_RUNNER_H_
#define KILN_SERVE_FIXED_BATCH_RUNNER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/compiler/artifact.h"
#include "kiln/ir/graph.h"
#include "kiln/runtime/executable.h"
#include "kiln/tensor/tensor.h"

namespace kiln::serve {

class FixedBatchRunner {
 public:
  // `args`: every parameter of `exe` in parameter-index order; args[input_args[i]] is runtime
  // input i's batch buffer ([B, ...], the same B for every input, B >= 1), named input_names[i]
  // (optional: only RunRows by name needs names). `exe` must outlive the runner.
  static absl::StatusOr<FixedBatchRunner> Create(runtime::Executable& exe, std::vector<Tensor> args,
                                                 std::vector<int> input_args,
                                                 std::vector<std::string> input_names = {});
  // An artifact's parameters (signature order): weights bound from a.weights, runtime inputs as
  // buffers of their signature shape with the leading dimension set to `batch` (0: the
  // artifact's own), for an executable compiled from a.program (or its rebatched copy).
  static absl::StatusOr<FixedBatchRunner> ForArtifact(runtime::Executable& exe,
                                                      const compiler::Artifact& a,
                                                      int64_t batch = 0);
  // A program's parameters: those named in `weights` bound from it, every other one a runtime
  // input buffer of its own type (runtime inputs in parameter order).
  static absl::StatusOr<FixedBatchRunner> ForProgram(runtime::Executable& exe,
                                                     const ir::Graph& program,
                                                     const std::map<std::string, Tensor>& weights);

  int64_t batch() const { return batch_; }
  size_t num_inputs() const { return input_args_.size(); }
  const std::vector<std::string>& input_names() const { return input_names_; }
  // Bytes of one row of runtime input i.
  int64_t row_bytes(size_t i) const { return row_bytes_[i]; }
  // Runtime input i's batch buffer, e.g. to transform staged rows in place before Run.
  Tensor& input_buffer(size_t i) { return args_[input_args_[i]]; }
  // Every parameter as Run passes them (for BindConstantParameters on the weights).
  const std::vector<Tensor>& args() const { return args_; }
  const std::vector<int>& input_args() const { return input_args_; }

  // Copies `rows` rows from `src` (src_bytes of them: InvalidArgument unless that is rows times
  // the input's row width) into rows [at, at + rows) of input i's buffer (within the batch).
  absl::Status Stage(size_t i, int64_t at, int64_t rows, const void* src, int64_t src_bytes);
  // Zeroes rows [rows, B) of every input buffer (the padding) and runs; `rows` in [0, B]. The
  // outputs are the executable's fresh [B, ...] tensors: rows >= `rows` are padding.
  absl::StatusOr<std::vector<Tensor>> Run(int64_t rows);

  // fn(outputs of one run, its first row, its real rows) for each batch of RunRows.
  using BatchFn =
      std::function<absl::Status(const std::vector<Tensor>& outs, int64_t begin, int64_t rows)>;
  // Runs rows [0, n) of `inputs` (one [n, ...] tensor per runtime input, in input order) in
  // batches of B, calling fn after each. n = 0 runs nothing. InvalidArgument for a count or row
  // width that does not match; a failed run's error names its rows.
  absl::Status RunRows(const std::vector<const Tensor*>& inputs, int64_t n, const BatchFn& fn);
  // The same with the inputs by name (input_names()).
  absl::Status RunRows(const std::map<std::string, Tensor>& inputs, int64_t n, const BatchFn& fn);
  // Every output of all n rows: [n, ...] tensors (the padding trimmed). Every output must have
  // the leading dimension B.
  absl::StatusOr<std::vector<Tensor>> RunAll(const std::map<std::string, Tensor>& inputs,
                                             int64_t n);

  // Rows [first, first + rows) of a [B, ...] output `t` of batch B, as a new [rows, ...] tensor.
  static Tensor Rows(const Tensor& t, int64_t batch, int64_t first, int64_t rows);

 private:
  FixedBatchRunner() = default;

  runtime::Executable* exe_ = nullptr;
  std::vector<Tensor> args_;
  std::vector<int> input_args_;
  std::vector<std::string> input_names_;
  std::vector<int64_t> row_bytes_;
  int64_t batch_ = 0;
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_FIXED_BATCH_RUNNER_H_
