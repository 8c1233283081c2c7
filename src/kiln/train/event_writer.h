// TensorBoard event files: training scalars that `tensorboard --logdir` (and anything that reads
// TensorFlow's event format) plots without a converter.
//
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<EventWriter> w, EventWriter::Create("/runs/r1"));
//   KILN_RETURN_IF_ERROR(w->AddScalar("loss", /*step=*/10, 0.25, /*wall_time=*/1.7e9));
//   KILN_RETURN_IF_ERROR(w->AddScalars(10, {{"lr", 1e-3}, {"examples_per_sec", 5120}}));
//   KILN_RETURN_IF_ERROR(w->Close());
//
// The file `<dir>/events.out.tfevents.<10-digit unix secs>.<hostname><suffix>` (the name
// TensorFlow's C++ EventsWriter uses) holds TFRecord-framed (record_io.h) serialized `Event`
// protos. The first is Event{wall_time, file_version: "brain.Event:2"}; each Add* call appends one
// Event{wall_time, step, summary: Summary{value: [Value{tag, simple_value}, ...]}}. Protos are
// encoded by hand exactly as protobuf serializes proto3 (fields in number order, zero scalars
// omitted, oneof members always written): the tests compare with files written through protobuf.
// Field numbers and wire types are in docs/formats.md "TensorBoard event files".
//
// Values are stored as f32 (simple_value is a float). Event files are append-only logs: after a
// resume from a checkpoint at step S, call AddSessionStart(S) so TensorBoard drops the points a
// killed run wrote past S (SessionLog START purges orphaned data).
#ifndef KILN_TRAIN_EVENT_WRITER_H_
#define KILN_TRAIN_EVENT_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/data/record_io.h"

namespace kiln::train {

// TFRecord framing and the small file interfaces live in data/ (records are also dataset shards).
using data::AppendFile;
using data::ReadFile;
using data::RecordReader;
using data::RecordWriter;

inline constexpr char kEventFileVersion[] = "brain.Event:2";

// SessionLog.SessionStatus.
enum class SessionStatus : int { kUnspecified = 0, kStart = 1, kStop = 2, kCheckpoint = 3 };

// A decoded Event, limited to the fields Kiln writes (others are skipped when decoding).
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                           // Event.file_version (3)
  std::vector<std::pair<std::string, float>> values;  // Event.summary (5): tag, simple_value
  SessionStatus session_status = SessionStatus::kUnspecified;  // Event.session_log (7).status
  bool has_summary = false;
  bool has_session_log = false;
};

// Serialized Event protos.
std::string EncodeFileVersionEvent(double wall_time,
                                   std::string_view file_version = kEventFileVersion);
std::string EncodeScalarsEvent(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& values);
std::string EncodeSessionLogEvent(double wall_time, int64_t step, SessionStatus status);

// Parses one serialized Event. DataLoss on malformed protobuf (bad varint, length past the end,
// wrong wire type for a known field, group wire types). `source` names the bytes in errors.
absl::StatusOr<Event> DecodeEvent(std::string_view bytes, const std::string& source = "<event>");

// Reads every Event of an event file, checking the framing CRCs and that the first record is a
// file_version event. A truncated final record (a writer still running) ends the list quietly
// when `allow_truncated_tail`.
absl::StatusOr<std::vector<Event>> ReadEventFile(const std::string& path,
                                                 bool allow_truncated_tail = false);
absl::StatusOr<std::vector<Event>> ReadEventFile(Env* env, const std::string& path,
                                                 bool allow_truncated_tail = false);

class EventWriter {
 public:
  struct Options {
    std::string hostname;  // empty: gethostname()
    std::string suffix;    // appended to the file name, e.g. ".rank0"
    // Wall-clock seconds since the Unix epoch, used for the file name and when an Add* call gives
    // no wall_time. Null: env->NowMicros() if env is set, else the system clock.
    std::function<double()> clock;
    // Files through this Env (MemEnv, FaultInjectionEnv in tests); null: POSIX directly.
    Env* env = nullptr;
  };

  // Creates `dir` (and parents) if needed and a new event file in it, and writes the
  // file_version event. If a file of that name exists (two writers in one second), ".1", ".2",
  // ... is appended rather than overwriting it.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& dir,
                                                             Options options);
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& dir);
  ~EventWriter();

  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // InvalidArgument for an empty or non-UTF-8 tag.
  absl::Status AddScalar(std::string_view tag, int64_t step, double value, double wall_time);
  absl::Status AddScalar(std::string_view tag, int64_t step, double value);
  // All values in one Event (one record).
  absl::Status AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                          double wall_time);
  absl::Status AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  absl::Status AddSessionStart(int64_t step);

  absl::Status Flush();  // to the OS: survives a killed process
  absl::Status Sync();   // Flush + fsync: survives a machine crash
  absl::Status Close();  // Sync + close; idempotent

  const std::string& path() const { return path_; }
  double Now() const;

 private:
  EventWriter(std::unique_ptr<RecordWriter> writer, std::string path, Options options);

  std::unique_ptr<RecordWriter> writer_;
  std::string path_;
  Options options_;
};

// The file name (no directory) for `unix_seconds` and `hostname`.
std::string EventFileName(int64_t unix_seconds, const std::string& hostname,
                          const std::string& suffix = "");

}  // namespace kiln::train

#endif  // KILN_TRAIN_EVENT_WRITER_H_
