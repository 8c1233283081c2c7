#include "kiln/train/trace.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kiln/base/json_escape.h"
#include "kiln/base/status.h"

namespace kiln::train {
namespace {

std::atomic<int> next_tid{1};

// Nanoseconds as microseconds with exactly three decimals: an exact decimal, no rounding.
void AppendMicros(int64_t ns, std::string* out) {
  if (ns < 0) {
    out->push_back('-');
    ns = -ns;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  out->append(buf);
}

void AppendDouble(double v, std::string* out) {
  if (!std::isfinite(v)) {
    out->append("null");
    return;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  out->append(buf, r.ptr);
}

void AppendArgs(const std::vector<std::pair<std::string, TraceArg>>& args, std::string* out) {
  out->push_back('{');
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) out->push_back(',');
    AppendJsonString(args[i].first, out);
    out->push_back(':');
    const TraceArg& v = args[i].second;
    if (const int64_t* iv = std::get_if<int64_t>(&v)) {
      out->append(std::to_string(*iv));
    } else if (const double* dv = std::get_if<double>(&v)) {
      AppendDouble(*dv, out);
    } else {
      AppendJsonString(std::get<std::string>(v), out);
    }
  }
  out->push_back('}');
}

void AppendMetadata(const char* what, int64_t pid, int tid, const std::string& name,
                    std::string* out) {
  absl::StrAppend(out, "{\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid,
                  ",\"args\":{\"name\":");
  AppendJsonString(name, out);
  out->append("}}");
}

}  // namespace

// ---- ScopedEvent ----

Profiler::ScopedEvent& Profiler::ScopedEvent::operator=(ScopedEvent&& other) noexcept {
  if (this != &other) {
    End();
    profiler_ = std::exchange(other.profiler_, nullptr);
    event_ = std::move(other.event_);
  }
  return *this;
}

Profiler::ScopedEvent& Profiler::ScopedEvent::Arg(std::string key, int64_t v) {
  if (profiler_) event_->args.emplace_back(std::move(key), v);
  return *this;
}

Profiler::ScopedEvent& Profiler::ScopedEvent::Arg(std::string key, double v) {
  if (profiler_) event_->args.emplace_back(std::move(key), v);
  return *this;
}

Profiler::ScopedEvent& Profiler::ScopedEvent::Arg(std::string key, std::string v) {
  if (profiler_) event_->args.emplace_back(std::move(key), std::move(v));
  return *this;
}

void Profiler::ScopedEvent::End() {
  if (!profiler_) return;
  event_->dur_ns = NowNs() - event_->ts_ns;
  std::exchange(profiler_, nullptr)->Record(std::move(*event_));
  event_.reset();
}

// ---- Profiler ----

Profiler::Profiler(Options options)
    : options_(std::move(options)),
      pid_(options_.pid >= 0 ? options_.pid : static_cast<int64_t>(::getpid())),
      enabled_(options_.enabled) {}

int64_t Profiler::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Profiler::CurrentTid() {
  thread_local const int tid = next_tid.fetch_add(1, std::memory_order_relaxed);
  return tid;
}

Profiler::ScopedEvent Profiler::StartScope(std::string_view cat, std::string_view name) {
  ScopedEvent s;
  s.profiler_ = this;
  s.event_ = std::make_unique<TraceEvent>();
  s.event_->name.assign(name.data(), name.size());
  s.event_->cat.assign(cat.data(), cat.size());
  s.event_->ph = 'X';
  s.event_->tid = CurrentTid();
  s.event_->ts_ns = NowNs();  // last, so setup is not charged to the scope
  return s;
}

void Profiler::Record(TraceEvent event) {
  MutexLock lock(mu_);
  if (events_.size() >= options_.max_events) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(event));
}

void Profiler::AddComplete(std::string_view cat, std::string_view name, int64_t start_ns,
                           int64_t end_ns, std::vector<std::pair<std::string, TraceArg>> args,
                           int tid) {
  if (!enabled()) return;
  TraceEvent e;
  e.name.assign(name.data(), name.size());
  e.cat.assign(cat.data(), cat.size());
  e.ph = 'X';
  e.ts_ns = start_ns;
  e.dur_ns = std::max<int64_t>(0, end_ns - start_ns);
  e.tid = tid >= 0 ? tid : CurrentTid();
  e.args = std::move(args);
  Record(std::move(e));
}

void Profiler::AddInstant(std::string_view cat, std::string_view name) {
  if (!enabled()) return;
  TraceEvent e;
  e.name.assign(name.data(), name.size());
  e.cat.assign(cat.data(), cat.size());
  e.ph = 'i';
  e.ts_ns = NowNs();
  e.tid = CurrentTid();
  Record(std::move(e));
}

void Profiler::AddCounter(std::string_view name, const std::map<std::string, double>& values) {
  if (!enabled()) return;
  TraceEvent e;
  e.name.assign(name.data(), name.size());
  e.ph = 'C';
  e.ts_ns = NowNs();
  e.tid = CurrentTid();
  for (const auto& [k, v] : values) e.args.emplace_back(k, v);
  Record(std::move(e));
}

void Profiler::SetThreadName(std::string name) {
  const int tid = CurrentTid();
  MutexLock lock(mu_);
  thread_names_[tid] = std::move(name);
}

int Profiler::NewTrack(std::string name) {
  const int tid = next_tid.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(mu_);
  thread_names_[tid] = std::move(name);
  return tid;
}

void Profiler::SetOtherData(std::string key, TraceArg value) {
  MutexLock lock(mu_);
  other_data_[std::move(key)] = std::move(value);
}

void Profiler::Reserve(size_t n) {
  n = std::min(n, options_.max_events);
  MutexLock lock(mu_);
  if (events_.capacity() >= n) return;
  const size_t size = events_.size();
  events_.resize(n);  // constructs (touches) every slot; clear() below keeps the capacity
  events_.resize(size);
}

std::vector<TraceEvent> Profiler::Events() const {
  MutexLock lock(mu_);
  return events_;
}

size_t Profiler::dropped() const {
  MutexLock lock(mu_);
  return dropped_;
}

void Profiler::Clear() {
  MutexLock lock(mu_);
  events_.clear();
  dropped_ = 0;
}

std::string Profiler::ToJson() const {
  std::vector<const TraceEvent*> sorted;
  std::map<int, std::string> names;
  size_t dropped;
  MutexLock lock(mu_);
  sorted.reserve(events_.size());
  for (const TraceEvent& e : events_) sorted.push_back(&e);
  names = thread_names_;
  dropped = dropped_;
  // Thread, then start, then longest first: an enclosing scope precedes what it encloses.
  std::stable_sort(sorted.begin(), sorted.end(), [](const TraceEvent* a, const TraceEvent* b) {
    return std::make_tuple(a->tid, a->ts_ns, -a->dur_ns) <
           std::make_tuple(b->tid, b->ts_ns, -b->dur_ns);
  });

  std::string out;
  out.reserve(128 * (sorted.size() + names.size() + 1));
  out.append("{\"traceEvents\":[\n");
  AppendMetadata("process_name", pid_, 0, options_.process_name, &out);
  for (const auto& [tid, name] : names) {
    out.append(",\n");
    AppendMetadata("thread_name", pid_, tid, name, &out);
  }
  for (const TraceEvent* e : sorted) {
    out.append(",\n{\"name\":");
    AppendJsonString(e->name, &out);
    if (e->ph != 'C') {
      out.append(",\"cat\":");
      AppendJsonString(e->cat, &out);
    }
    absl::StrAppend(&out, ",\"ph\":\"", std::string(1, e->ph), "\",\"ts\":");
    AppendMicros(e->ts_ns, &out);
    if (e->ph == 'X') {
      out.append(",\"dur\":");
      AppendMicros(e->dur_ns, &out);
    }
    if (e->ph == 'i') out.append(",\"s\":\"t\"");
    absl::StrAppend(&out, ",\"pid\":", pid_, ",\"tid\":", e->tid);
    if (!e->args.empty()) {
      out.append(",\"args\":");
      AppendArgs(e->args, &out);
    }
    out.push_back('}');
  }
  absl::StrAppend(&out,
                  "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"kiln\","
                  "\"clock\":\"steady (CLOCK_MONOTONIC)\",\"dropped_events\":",
                  dropped);
  std::vector<std::pair<std::string, TraceArg>> other(other_data_.begin(), other_data_.end());
  if (!other.empty()) {
    std::string obj;
    AppendArgs(other, &obj);  // "{...}": its members join otherData's
    obj.front() = ',';
    obj.pop_back();
    out.append(obj);
  }
  out.append("}}\n");
  return out;
}

absl::Status Profiler::WriteJson(const std::string& path, Env* env) const {
  const std::string tmp = path + ".tmp";
  KILN_RETURN_IF_ERROR(WriteStringToFile(env, ToJson(), tmp, /*sync=*/true));
  return env->RenameFile(tmp, path);
}

}  // namespace kiln::train
