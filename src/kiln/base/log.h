// One logger for the libraries: nothing under src/kiln (except the CLI's own user-facing output)
// prints to stderr directly; it logs through here, and the program decides where messages go.
//
//   KILN_LOG(WARNING) << "compile cache " << dir << " is not writable; compiling without it";
//
// Severities: DEBUG INFO WARNING ERROR. By default, messages at INFO and above go to stderr as
// "kiln: warning: <message>" (INFO has no severity word, DEBUG is dropped). A program or a test
// replaces the sink (SetSink) to capture or redirect messages, and SetMinSeverity filters them.
// Thread-safe: each message is formatted on its own and handed to the sink under one lock, so
// lines of concurrent messages never interleave.
#ifndef KILN_BASE_LOG_H_
#define KILN_BASE_LOG_H_

#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace kiln::log {

enum class Severity { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning", "error".
std::string_view SeverityName(Severity severity);

// Receives every message at or above the minimum severity. `file` and `line` name where it was
// logged.
using Sink = std::function<void(Severity severity, std::string_view file, int line,
                                std::string_view message)>;

// Replaces the sink; a null sink restores the default (stderr). Returns the previous sink (null
// for the default), so a scope can restore it.
Sink SetSink(Sink sink);
// Messages below `severity` are dropped before formatting reaches the sink. Default: kInfo.
// Returns the previous minimum.
Severity SetMinSeverity(Severity severity);
bool Enabled(Severity severity);

// Hands one message to the sink (what KILN_LOG does when the statement ends).
void Write(Severity severity, const char* file, int line, std::string_view message);

// One message being built; written when it goes out of scope (the end of the KILN_LOG statement).
class Message {
 public:
  Message(Severity severity, const char* file, int line)
      : severity_(severity), file_(file), line_(line) {}
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  ~Message() { Write(severity_, file_, line_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  Severity severity_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Makes `KILN_LOG(X) << ...` a single statement that formats nothing when X is disabled.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace kiln::log

#define KILN_LOG_SEVERITY_DEBUG ::kiln::log::Severity::kDebug
#define KILN_LOG_SEVERITY_INFO ::kiln::log::Severity::kInfo
#define KILN_LOG_SEVERITY_WARNING ::kiln::log::Severity::kWarning
#define KILN_LOG_SEVERITY_ERROR ::kiln::log::Severity::kError

#define KILN_LOG(severity)                            \
  !::kiln::log::Enabled(KILN_LOG_SEVERITY_##severity) \
      ? (void)0                                       \
      : ::kiln::log::Voidify() &                      \
            ::kiln::log::Message(KILN_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()

#endif  // KILN_BASE_LOG_H_
