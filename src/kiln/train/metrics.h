// Where training metrics go: one interface, a JSONL file, TensorBoard event files, and a fan-out.
//
//   std::vector<std::unique_ptr<MetricsSink>> sinks;
//   KILN_ASSIGN_OR_RETURN(sinks.emplace_back(), JsonlSink::Create(out_dir + "/metrics.jsonl"));
//   KILN_ASSIGN_OR_RETURN(sinks.emplace_back(), TensorBoardSink::Create(out_dir));
//   MultiSink metrics(std::move(sinks));
//   KILN_RETURN_IF_ERROR(metrics.Write(step, {{"loss", 0.25}, {"lr", 1e-3}}));
//   KILN_RETURN_IF_ERROR(metrics.Close());
//
// JSONL: one JSON object per Write, on its own line, "step" first and then the scalars in name
// order: {"step":10,"loss":0.25,"lr":0.001}. Non-finite values (NaN, ±inf) have no JSON spelling
// and are written as null. TensorBoard: each Write is one Event with one simple_value per scalar
// (event_writer.h). Both sinks hand each Write to the OS at once (one write(2) call: metrics are
// logged every few steps, so this is cheap), so a killed process loses nothing already written;
// Close adds fsync. A crash mid-write can leave a partial last line / truncated last record:
// readers skip a last line that does not parse (the event reader reports OutOfRange).
#ifndef KILN_TRAIN_METRICS_H_
#define KILN_TRAIN_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/data/record_io.h"
#include "kiln/train/event_writer.h"

namespace kiln::train {

// TFRecord framing and the small file interfaces live in data/ (records are also dataset shards).
using data::AppendFile;
using data::ReadFile;
using data::RecordReader;
using data::RecordWriter;

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Records `scalars` at `step`. InvalidArgument for a name the sink cannot store.
  virtual absl::Status Write(int64_t step, const std::map<std::string, double>& scalars) = 0;
  // Hands everything written so far to the OS (survives a killed process). The sinks here do
  // that in Write already; buffering sinks need it.
  virtual absl::Status Flush() = 0;
  // Flushes, makes durable and closes. Later Writes fail. Idempotent.
  virtual absl::Status Close() = 0;
};

class JsonlSink final : public MetricsSink {
 public:
  // Appends to `path` (creating it) when `append`, else truncates it: a resumed run appends.
  static absl::StatusOr<std::unique_ptr<JsonlSink>> Create(const std::string& path,
                                                           bool append = true);
  // The same through `env` (borrowed; must outlive the sink).
  static absl::StatusOr<std::unique_ptr<JsonlSink>> Create(Env* env, const std::string& path,
                                                           bool append = true);
  explicit JsonlSink(std::unique_ptr<AppendFile> file);
  ~JsonlSink() override;

  // InvalidArgument when a scalar is named "step".
  absl::Status Write(int64_t step, const std::map<std::string, double>& scalars) override;
  absl::Status Flush() override;
  absl::Status Close() override;

  // The line Write appends (without the newline).
  static std::string FormatLine(int64_t step, const std::map<std::string, double>& scalars);

 private:
  std::unique_ptr<AppendFile> file_;
  bool closed_ = false;
};

class TensorBoardSink final : public MetricsSink {
 public:
  static absl::StatusOr<std::unique_ptr<TensorBoardSink>> Create(const std::string& dir,
                                                                 EventWriter::Options options);
  static absl::StatusOr<std::unique_ptr<TensorBoardSink>> Create(const std::string& dir) {
    return Create(dir, EventWriter::Options());
  }
  explicit TensorBoardSink(std::unique_ptr<EventWriter> writer);

  absl::Status Write(int64_t step, const std::map<std::string, double>& scalars) override;
  absl::Status Flush() override;
  absl::Status Close() override;

  EventWriter& writer() { return *writer_; }

 private:
  std::unique_ptr<EventWriter> writer_;
};

// Writes to every sink, even after one fails; returns the first error (annotated with the sink's
// position).
class MultiSink final : public MetricsSink {
 public:
  explicit MultiSink(std::vector<std::unique_ptr<MetricsSink>> sinks);

  absl::Status Write(int64_t step, const std::map<std::string, double>& scalars) override;
  absl::Status Flush() override;
  absl::Status Close() override;

  size_t size() const { return sinks_.size(); }

 private:
  absl::Status ForEach(const std::function<absl::Status(MetricsSink&)>& fn);

  std::vector<std::unique_ptr<MetricsSink>> sinks_;
};

}  // namespace kiln::train

#endif  // KILN_TRAIN_METRICS_H_
