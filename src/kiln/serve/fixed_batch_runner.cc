#include "kiln/serve/fixed_batch_runner.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"

namespace kiln::serve {
namespace {

Shape WithLeading(int64_t n, const Shape& s) {
  std::vector<int64_t> d = s.dims();
  d[0] = n;
  return Shape(std::move(d));
}

}  // namespace

absl::StatusOr<FixedBatchRunner> FixedBatchRunner::Create(runtime::Executable& exe,
                                                          std::vector<Tensor> args,
                                                          std::vector<int> input_args,
                                                          std::vector<std::string> input_names) {
  if (input_args.empty()) return absl::InvalidArgumentError("the program takes no runtime inputs");
  if (!input_names.empty() && input_names.size() != input_args.size())
    return absl::InvalidArgumentError("FixedBatchRunner: one name per runtime input expected");
  FixedBatchRunner r;
  for (size_t i = 0; i < input_args.size(); ++i) {
    const int a = input_args[i];
    if (a < 0 || a >= static_cast<int>(args.size()))
      return absl::InvalidArgumentError(absl::StrCat("FixedBatchRunner: no argument ", a));
    const Tensor& t = args[a];
    const int64_t b = t.shape().rank() > 0 ? t.shape().dim(0) : 0;
    if (b < 1 || (r.batch_ != 0 && b != r.batch_))
      return absl::InvalidArgumentError(
          absl::StrCat("runtime input ", input_names.empty() ? absl::StrCat(i) : input_names[i],
                       " is ", t.TypeString(),
                       ": every runtime input needs the leading batch "
                       "dimension ",
                       r.batch_ == 0 ? b : r.batch_));
    r.batch_ = b;
    r.row_bytes_.push_back(t.byte_size() / b);
  }
  r.exe_ = &exe;
  r.args_ = std::move(args);
  r.input_args_ = std::move(input_args);
  r.input_names_ = std::move(input_names);
  return r;
}

absl::StatusOr<FixedBatchRunner> FixedBatchRunner::ForArtifact(runtime::Executable& exe,
                                                               const compiler::Artifact& a,
                                                               int64_t batch) {
  std::vector<Tensor> args;
  std::vector<int> input_args;
  std::vector<std::string> names;
  for (const compiler::InputSpec& in : a.signature.inputs) {
    if (in.weight) {
      auto it = a.weights.find(in.name);
      if (it == a.weights.end())
        return absl::InternalError("artifact has no weight '" + in.name + "'");
      args.push_back(it->second);
      continue;
    }
    if (in.shape.rank() == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", in.name, "' is a scalar: a fixed-batch run needs a leading batch dimension"));
    input_args.push_back(static_cast<int>(args.size()));
    names.push_back(in.name);
    args.emplace_back(in.dtype, batch > 0 ? WithLeading(batch, in.shape) : in.shape);
  }
  return Create(exe, std::move(args), std::move(input_args), std::move(names));
}

absl::StatusOr<FixedBatchRunner> FixedBatchRunner::ForProgram(
    runtime::Executable& exe, const ir::Graph& program,
    const std::map<std::string, Tensor>& weights) {
  std::vector<Tensor> args;
  std::vector<int> input_args;
  std::vector<std::string> names;
  for (int p : program.parameters()) {
    const ir::Node& node = program.node(p);
    const std::string& name = node.attr_str("name");
    auto w = weights.find(name);
    if (w != weights.end()) {
      args.push_back(w->second);
      continue;
    }
    input_args.push_back(static_cast<int>(args.size()));
    names.push_back(name);
    args.emplace_back(node.type().dtype, node.type().shape);
  }
  return Create(exe, std::move(args), std::move(input_args), std::move(names));
}

absl::Status FixedBatchRunner::Stage(size_t i, int64_t at, int64_t rows, const void* src,
                                     int64_t src_bytes) {
  if (i >= input_args_.size())
    return absl::InvalidArgumentError(absl::StrCat("no runtime input ", i));
  const int64_t row = row_bytes_[i];
  if (src_bytes != rows * row)
    return absl::InvalidArgumentError(
        absl::StrCat("runtime input ", input_names_.empty() ? absl::StrCat(i) : input_names_[i],
                     ": ", src_bytes, " bytes for ", rows, " rows of ", row, " bytes"));
  if (at < 0 || rows < 0 || at + rows > batch_)
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", at, ", ", at + rows, ") are outside the batch of ", batch_));
  if (rows > 0)
    std::memcpy(static_cast<uint8_t*>(args_[input_args_[i]].raw_data()) + at * row, src, src_bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> FixedBatchRunner::Run(int64_t rows) {
  if (rows < 0 || rows > batch_)
    return absl::InvalidArgumentError(
        absl::StrCat("a run of ", rows, " rows at batch size ", batch_));
  for (size_t i = 0; i < input_args_.size(); ++i) {
    const int64_t row = row_bytes_[i];
    uint8_t* dst = static_cast<uint8_t*>(args_[input_args_[i]].raw_data());
    std::memset(dst + rows * row, 0, (batch_ - rows) * row);  // the padding
  }
  return exe_->Run(args_);
}

absl::Status FixedBatchRunner::RunRows(const std::vector<const Tensor*>& inputs, int64_t n,
                                       const BatchFn& fn) {
  if (inputs.size() != input_args_.size())
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", input_args_.size(), " runtime inputs, got ", inputs.size()));
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("a negative row count ", n));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i]->byte_size() != n * row_bytes_[i])
      return absl::InvalidArgumentError(absl::StrCat(
          "runtime input ", input_names_.empty() ? absl::StrCat(i) : input_names_[i], " is ",
          inputs[i]->TypeString(), ": expected ", n, " rows of ", row_bytes_[i], " bytes"));
  }
  for (int64_t begin = 0; begin < n; begin += batch_) {
    const int64_t rows = std::min(batch_, n - begin);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t row = row_bytes_[i];
      KILN_RETURN_IF_ERROR(Stage(i, 0, rows,
                                 static_cast<const uint8_t*>(inputs[i]->raw_data()) + begin * row,
                                 rows * row));
    }
    absl::StatusOr<std::vector<Tensor>> outs = Run(rows);
    if (!outs.ok())
      return Annotate(outs.status(),
                      absl::StrCat("running examples ", begin + 1, "..", begin + rows));
    KILN_RETURN_IF_ERROR(fn(*outs, begin, rows));
  }
  return absl::OkStatus();
}

absl::Status FixedBatchRunner::RunRows(const std::map<std::string, Tensor>& inputs, int64_t n,
                                       const BatchFn& fn) {
  std::vector<const Tensor*> ordered;
  for (size_t i = 0; i < input_args_.size(); ++i) {
    const std::string name = input_names_.empty() ? std::string() : input_names_[i];
    auto it = inputs.find(name);
    if (it == inputs.end())
      return absl::InvalidArgumentError(absl::StrCat("no value for runtime input '", name, "'"));
    ordered.push_back(&it->second);
  }
  return RunRows(ordered, n, fn);
}

absl::StatusOr<std::vector<Tensor>> FixedBatchRunner::RunAll(
    const std::map<std::string, Tensor>& inputs, int64_t n) {
  std::vector<Tensor> all;
  KILN_RETURN_IF_ERROR(
      RunRows(inputs, n, [&](const std::vector<Tensor>& outs, int64_t begin, int64_t rows) {
        if (all.empty()) {
          for (const Tensor& t : outs) {
            if (t.shape().rank() == 0 || t.shape().dim(0) != batch_)
              return absl::InvalidArgumentError(
                  absl::StrCat("an output is ", t.TypeString(),
                               ": it has no leading batch dimension of ", batch_));
            all.emplace_back(t.dtype(), WithLeading(n, t.shape()));
          }
        }
        for (size_t k = 0; k < outs.size(); ++k) {
          const int64_t row = outs[k].byte_size() / batch_;
          std::memcpy(static_cast<uint8_t*>(all[k].raw_data()) + begin * row, outs[k].raw_data(),
                      rows * row);
        }
        return absl::OkStatus();
      }));
  return all;
}

Tensor FixedBatchRunner::Rows(const Tensor& t, int64_t batch, int64_t first, int64_t rows) {
  Tensor part(t.dtype(), WithLeading(rows, t.shape()));
  const int64_t row = t.byte_size() / batch;
  std::memcpy(part.raw_data(), static_cast<const uint8_t*>(t.raw_data()) + first * row, rows * row);
  return part;
}

}  // namespace kiln::serve
