#include "kiln/train/metrics.h"

#include <cmath>
#include <utility>

#include "kiln/base/status.h"
#include "nlohmann/json.hpp"

namespace kiln::train {

// ---- JsonlSink ----

absl::StatusOr<std::unique_ptr<JsonlSink>> JsonlSink::Create(const std::string& path, bool append) {
  return Create(Env::Default(), path, append);
}

absl::StatusOr<std::unique_ptr<JsonlSink>> JsonlSink::Create(Env* env, const std::string& path,
                                                             bool append) {
  KILN_ASSIGN_OR_RETURN(
      std::unique_ptr<AppendFile> file,
      data::OpenAppendFile(env, path,
                           append ? data::WriteMode::kAppend : data::WriteMode::kTruncate));
  return std::make_unique<JsonlSink>(std::move(file));
}

JsonlSink::JsonlSink(std::unique_ptr<AppendFile> file) : file_(std::move(file)) {}

JsonlSink::~JsonlSink() {
  if (!closed_) (void)file_->Close();
}

std::string JsonlSink::FormatLine(int64_t step, const std::map<std::string, double>& scalars) {
  nlohmann::ordered_json row;
  row["step"] = step;
  for (const auto& [name, v] : scalars) {
    if (std::isfinite(v)) {
      row[name] = v;
    } else {
      row[name] = nullptr;
    }
  }
  // `replace`: a name that is not valid UTF-8 gets U+FFFD instead of an exception.
  return row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::Status JsonlSink::Write(int64_t step, const std::map<std::string, double>& scalars) {
  if (closed_)
    return absl::FailedPreconditionError("write to closed metrics file " + file_->name());
  if (scalars.count("step")) {
    return absl::InvalidArgumentError("metric name \"step\" is reserved (" + file_->name() + ")");
  }
  std::string line = FormatLine(step, scalars);
  line.push_back('\n');
  KILN_RETURN_IF_ERROR(file_->Append(line));
  return file_->Flush();
}

absl::Status JsonlSink::Flush() {
  if (closed_)
    return absl::FailedPreconditionError("flush of closed metrics file " + file_->name());
  return file_->Flush();
}

absl::Status JsonlSink::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  absl::Status s = file_->Sync();
  absl::Status c = file_->Close();
  return s.ok() ? c : s;
}

// ---- TensorBoardSink ----

absl::StatusOr<std::unique_ptr<TensorBoardSink>> TensorBoardSink::Create(
    const std::string& dir, EventWriter::Options options) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<EventWriter> writer,
                        EventWriter::Create(dir, std::move(options)));
  return std::make_unique<TensorBoardSink>(std::move(writer));
}

TensorBoardSink::TensorBoardSink(std::unique_ptr<EventWriter> writer)
    : writer_(std::move(writer)) {}

absl::Status TensorBoardSink::Write(int64_t step, const std::map<std::string, double>& scalars) {
  std::vector<std::pair<std::string, double>> values(scalars.begin(), scalars.end());
  KILN_RETURN_IF_ERROR(writer_->AddScalars(step, values));
  return writer_->Flush();
}

absl::Status TensorBoardSink::Flush() { return writer_->Flush(); }
absl::Status TensorBoardSink::Close() { return writer_->Close(); }

// ---- MultiSink ----

MultiSink::MultiSink(std::vector<std::unique_ptr<MetricsSink>> sinks) : sinks_(std::move(sinks)) {}

absl::Status MultiSink::ForEach(const std::function<absl::Status(MetricsSink&)>& fn) {
  absl::Status first;
  for (size_t i = 0; i < sinks_.size(); ++i) {
    absl::Status s = fn(*sinks_[i]);
    if (!s.ok() && first.ok()) first = Annotate(s, "metrics sink " + std::to_string(i));
  }
  return first;
}

absl::Status MultiSink::Write(int64_t step, const std::map<std::string, double>& scalars) {
  return ForEach([&](MetricsSink& s) { return s.Write(step, scalars); });
}

absl::Status MultiSink::Flush() {
  return ForEach([](MetricsSink& s) { return s.Flush(); });
}

absl::Status MultiSink::Close() {
  return ForEach([](MetricsSink& s) { return s.Close(); });
}

}  // namespace kiln::train
