#include "kiln/base/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <utility>

namespace kiln::log {
namespace {

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}

Sink& CurrentSink() {
  static Sink sink;
  return sink;
}

std::atomic<int>& MinSeverity() {
  static std::atomic<int> min{static_cast<int>(Severity::kInfo)};
  return min;
}

void WriteToStderr(Severity severity, std::string_view message) {
  std::string line = "kiln: ";
  if (severity != Severity::kInfo) {
    line += SeverityName(severity);
    line += ": ";
  }
  line += message;
  if (line.empty() || line.back() != '\n') line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

std::string_view SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kDebug:
      return "debug";
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kError:
      return "error";
  }
  return "unknown";
}

Sink SetSink(Sink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  return std::exchange(CurrentSink(), std::move(sink));
}

Severity SetMinSeverity(Severity severity) {
  return static_cast<Severity>(MinSeverity().exchange(static_cast<int>(severity)));
}

bool Enabled(Severity severity) {
  return static_cast<int>(severity) >= MinSeverity().load(std::memory_order_relaxed);
}

void Write(Severity severity, const char* file, int line, std::string_view message) {
  if (!Enabled(severity)) return;
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (CurrentSink()) {
    CurrentSink()(severity, file, line, message);
  } else {
    WriteToStderr(severity, message);
  }
}

}  // namespace kiln::log
