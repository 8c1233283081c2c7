#include "kiln/serve/server.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kiln/base/log.h"
#include "kiln/serve/clock.h"
#include "kiln/serve/oip.h"

namespace kiln::serve {

namespace {

HttpResponse Json(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse Error(int status, const std::string& message) {
  HttpResponse r = Json(status, ErrorJson(message));
  if (status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

std::string Quoted(std::string_view s) {
  std::string out;
  AppendJsonString(s, &out);
  return out;
}

// [-1, 4] for an input of [B, 4]: the batch dimension is variable.
std::string ShapeJson(const Shape& s) {
  std::vector<std::string> d = {"-1"};
  for (int i = 1; i < s.rank(); ++i) d.push_back(std::to_string(s.dim(i)));
  return "[" + absl::StrJoin(d, ",") + "]";
}

std::string SpecsJson(const std::vector<compiler::TensorSpec>& specs) {
  std::vector<std::string> out;
  for (const auto& s : specs)
    out.push_back(absl::StrCat("{\"name\":", Quoted(s.name), ",\"datatype\":\"",
                               OipDatatype(s.dtype), "\",\"shape\":", ShapeJson(s.shape), "}"));
  return "[" + absl::StrJoin(out, ",") + "]";
}

}  // namespace

Outcome InferenceServer::OutcomeFor(const absl::Status& s) {
  if (s.ok()) return Outcome::kSuccess;
  if (s.code() == absl::StatusCode::kInvalidArgument) return Outcome::kBadRequest;
  if (s.code() == absl::StatusCode::kUnavailable)
    return s.message().find("timeout") != std::string_view::npos ? Outcome::kTimeout
                                                                 : Outcome::kRejected;
  return Outcome::kError;
}

HttpResponse InferenceServer::ErrorResponse(const absl::Status& s) {
  switch (OutcomeFor(s)) {
    case Outcome::kBadRequest:
      return Error(400, std::string(s.message()));
    case Outcome::kRejected:
    case Outcome::kTimeout:
      return Error(503, std::string(s.message()));
    default:
      return Error(500, std::string(s.message()));
  }
}

namespace {

// RFC 3986 percent-decoding of one path segment ("my%20model" -> "my model"); false for a '%'
// not followed by two hex digits.
bool PercentDecode(std::string_view in, std::string* out) {
  out->clear();
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    const int hi = i + 2 < in.size() ? hex(in[i + 1]) : -1;
    const int lo = i + 2 < in.size() ? hex(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

std::string UtcNow() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int64_t ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  snprintf(out, sizeof(out), "%s.%03dZ", buf, static_cast<int>(ms));
  return out;
}

}  // namespace

InferenceServer::InferenceServer(ServerOptions options)
    : options_(std::move(options)), registry_(&metrics_) {}

InferenceServer::~InferenceServer() { Shutdown(0); }

absl::Status InferenceServer::Start() {
  auto http = HttpServer::Start(options_.http, [this](HttpRequest req, HttpReplier reply) {
    Handle(std::move(req), std::move(reply));
  });
  if (!http.ok()) return http.status();
  http_ = std::move(*http);
  ready_ = true;
  return absl::OkStatus();
}

void InferenceServer::AddFrontend(Frontend* f) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  frontends_.push_back(f);
}

void InferenceServer::RemoveFrontend(Frontend* f) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  std::erase(frontends_, f);
}

std::vector<std::string> InferenceServer::Extensions() const {
  std::vector<std::string> e = {"binary_tensor_data", "schedule_policy"};
  if (repository_ != nullptr) e.push_back("model_repository");
  return e;
}

absl::StatusOr<std::shared_ptr<ServedModel>> InferenceServer::FindModel(
    const std::string& name, const std::string& version) const {
  std::shared_ptr<ServedModel> model = registry_.Find(name, version);
  if (model != nullptr) return model;
  std::vector<std::string> versions = registry_.Versions(name);
  if (versions.empty()) return absl::NotFoundError(absl::StrCat("unknown model '", name, "'"));
  return absl::NotFoundError(absl::StrCat("model '", name, "' has no version '", version,
                                          "' (versions: ", absl::StrJoin(versions, ", "), ")"));
}

void InferenceServer::Shutdown(int64_t drain_ms) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  ready_ = false;
  for (auto& m : registry_.All()) m->Flush();  // queued requests stop waiting for batches
  // Repository loads queued and not started are answered 503 now; a running one finishes.
  if (repository_ != nullptr) repository_->CloseLoader();
  // Every front end answers what it took in (models still run), all at once.
  std::vector<std::thread> drains;
  for (Frontend* f : frontends_) drains.emplace_back([f, drain_ms] { f->Drain(drain_ms); });
  if (http_) http_->Shutdown(drain_ms);
  for (auto& t : drains) t.join();
  frontends_.clear();
  // A repository load still running answers (into connections closed by now) before the models
  // stop and the HTTP server goes; those queued behind it were refused above.
  if (repository_ != nullptr) repository_->StopLoader();
  for (auto& m : registry_.All()) m->Stop();
  http_.reset();
}

void InferenceServer::Finish(Call& call, HttpResponse response, HttpReplier& reply) {
  metrics_.CountHttp(response.status);
  const int64_t total_us = RealClock::Get()->NowMicros() - call.start_us;
  if (call.metrics != nullptr) {
    call.metrics->total.Observe(total_us * 1e-6);
    call.metrics->bytes_in += call.bytes_in;
    call.metrics->bytes_out += response.body.size();
  }
  if (options_.access_log != nullptr) {
    LogEntry e;
    e.remote = call.remote;
    e.method = call.method;
    e.path = call.path;
    e.model = call.model;
    e.version = call.version;
    e.id = call.id;
    e.status = std::to_string(response.status);
    e.bytes_in = call.bytes_in;
    e.bytes_out = static_cast<int64_t>(response.body.size());
    e.total_us = total_us;
    e.queue_us = call.queue_us;
    e.compute_us = call.compute_us;
    e.batch_rows = call.batch_rows;
    LogAccess(e);
  }
  reply(std::move(response));
}

void InferenceServer::LogAccess(const LogEntry& e) {
  if (options_.access_log == nullptr || options_.access_log_sample <= 0) return;
  const uint64_t k = log_counter_++;
  const double r = options_.access_log_sample;
  if (r < 1 && std::floor((k + 1) * r) <= std::floor(k * r)) return;
  std::string line = absl::StrCat("{\"time\":\"", UtcNow(), "\",\"remote\":", Quoted(e.remote),
                                  ",\"method\":", Quoted(e.method), ",\"path\":", Quoted(e.path),
                                  ",\"status\":", e.status, ",\"bytes_in\":", e.bytes_in,
                                  ",\"bytes_out\":", e.bytes_out, ",\"total_us\":", e.total_us);
  if (!e.model.empty())
    absl::StrAppend(&line, ",\"model\":", Quoted(e.model), ",\"version\":", Quoted(e.version));
  if (!e.id.empty()) absl::StrAppend(&line, ",\"id\":", Quoted(e.id));
  if (e.queue_us >= 0)
    absl::StrAppend(&line, ",\"queue_us\":", e.queue_us, ",\"compute_us\":", e.compute_us,
                    ",\"batch\":", e.batch_rows);
  line += "}\n";
  std::lock_guard<std::mutex> lock(log_mu_);
  *options_.access_log << line << std::flush;
}

void InferenceServer::Handle(HttpRequest req, HttpReplier reply) {
  Call call;
  call.start_us = RealClock::Get()->NowMicros();
  call.method = req.method;
  call.remote = req.remote;
  call.bytes_in = static_cast<int64_t>(req.body.size());
  std::string_view path = req.target;
  if (size_t q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  call.path = std::string(path);
  // Split first, then decode each segment: an escaped '/' (%2F) stays inside its segment.
  std::vector<std::string> parts;
  for (absl::string_view piece : absl::StrSplit(call.path, '/', absl::SkipEmpty())) {
    const std::string segment(piece.data(), piece.size());
    if (!PercentDecode(segment, &parts.emplace_back()))
      return Finish(call,
                    Error(400, absl::StrCat("path: '", segment,
                                            "' has a '%' not followed by two hex digits")),
                    reply);
  }
  Route(parts, req, call, reply);
}

void InferenceServer::Route(const std::vector<std::string>& p, HttpRequest& req, Call& call,
                            HttpReplier& reply) {
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";
  auto method_error = [&](const char* want) {
    Finish(call, Error(405, absl::StrCat(req.method, " ", call.path, ": use ", want)), reply);
  };
  if (p.size() == 1 && p[0] == "metrics") {
    if (!get) return method_error("GET");
    HttpResponse r = Json(200, metrics_.Render());
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    return Finish(call, std::move(r), reply);
  }
  if (p.empty() || p[0] != "v2")
    return Finish(call, Error(404, "no such endpoint: " + call.path), reply);
  if (p.size() == 1) {
    if (!get) return method_error("GET");
    return Finish(call,
                  Json(200, absl::StrCat("{\"name\":\"kiln\",\"version\":",
                                         Quoted(options_.server_version), ",\"extensions\":[",
                                         absl::StrJoin(Extensions(), ",",
                                                       [](std::string* o, const std::string& e) {
                                                         o->append(Quoted(e));
                                                       }),
                                         "]}")),
                  reply);
  }
  if (p.size() == 3 && p[1] == "health" && (p[2] == "live" || p[2] == "ready")) {
    if (!get) return method_error("GET");
    if (p[2] == "live") return Finish(call, Json(200, "{\"live\":true}"), reply);
    const bool ready = ready_.load();
    return Finish(call, Json(ready ? 200 : 400, ready ? "{\"ready\":true}" : "{\"ready\":false}"),
                  reply);
  }
  if (p.size() >= 2 && p[1] == "repository") return Repository(p, req, reply);
  if (p.size() < 3 || p[1] != "models")
    return Finish(call, Error(404, "no such endpoint: " + call.path), reply);
  // /v2/models/{m}[/versions/{v}][/ready|/infer]
  call.model = p[2];
  size_t at = 3;
  if (p.size() >= 5 && p[3] == "versions") {
    call.version = p[4];
    at = 5;
  } else if (p.size() == 4 && p[3] == "versions") {
    return Finish(call, Error(404, "no such endpoint: " + call.path), reply);
  }
  if (p.size() > at + 1 || (p.size() == at + 1 && p[at] != "ready" && p[at] != "infer"))
    return Finish(call, Error(404, "no such endpoint: " + call.path), reply);
  absl::StatusOr<std::shared_ptr<ServedModel>> found = FindModel(call.model, call.version);
  if (!found.ok()) return Finish(call, Error(404, std::string(found.status().message())), reply);
  std::shared_ptr<ServedModel> model = std::move(*found);
  call.version = model->version();
  if (p.size() == at) {
    if (!get) return method_error("GET");
    return Finish(
        call,
        Json(200, absl::StrCat("{\"name\":", Quoted(model->name()), ",\"versions\":[",
                               absl::StrJoin(registry_.Versions(model->name()), ",",
                                             [](std::string* o, const std::string& v) {
                                               o->append(Quoted(v));
                                             }),
                               "],\"platform\":\"kiln\",\"inputs\":", SpecsJson(model->inputs()),
                               ",\"outputs\":", SpecsJson(model->outputs()), "}")),
        reply);
  }
  if (p[at] == "ready") {
    if (!get) return method_error("GET");
    return Finish(call,
                  Json(200, absl::StrCat("{\"name\":", Quoted(model->name()), ",\"version\":",
                                         Quoted(model->version()), ",\"ready\":true}")),
                  reply);
  }
  if (!post) return method_error("POST");
  call.metrics = registry_.MetricsFor(model->name(), model->version());
  Infer(std::move(model), req, call, reply);
}

void InferenceServer::Repository(const std::vector<std::string>& p, HttpRequest& req,
                                 HttpReplier& reply) {
  Call call;
  call.start_us = RealClock::Get()->NowMicros();
  call.method = req.method;
  call.remote = req.remote;
  call.path = absl::StrCat("/", absl::StrJoin(p, "/"));
  if (repository_ == nullptr)
    return Finish(call, Error(404, "this server has no model repository (--model-repository)"),
                  reply);
  if (req.method != "POST")
    return Finish(call, Error(405, absl::StrCat(req.method, " ", call.path, ": use POST")), reply);
  if (p.size() == 3 && p[2] == "index") {
    bool ready_only = false;
    if (!req.body.empty()) {
      absl::StatusOr<bool> r = ParseIndexReady(req.body);
      if (!r.ok()) return Finish(call, Error(400, std::string(r.status().message())), reply);
      ready_only = *r;
    }
    return Finish(call, Json(200, repository_->IndexJson(ready_only)), reply);
  }
  if (p.size() == 5 && p[2] == "models" && (p[4] == "load" || p[4] == "unload")) {
    // Loading compiles (seconds): on the repository's loader thread, answered from there, so
    // this I/O thread goes on serving.
    call.model = p[3];
    repository_->Submit(
        p[4] == "load" ? ModelRepository::Job::kLoad : ModelRepository::Job::kUnload, p[3],
        [this, call, reply](absl::Status s) mutable {
          if (s.ok()) return Finish(call, Json(200, "{}"), reply);
          int code = 400;
          if (s.code() == absl::StatusCode::kNotFound) code = 404;
          if (s.code() == absl::StatusCode::kAborted) code = 409;
          if (s.code() == absl::StatusCode::kUnavailable) code = 503;
          Finish(call, Error(code, std::string(s.message())), reply);
        });
    return;
  }
  Finish(call, Error(404, "no such endpoint: " + call.path), reply);
}

}  // namespace kiln::serve
