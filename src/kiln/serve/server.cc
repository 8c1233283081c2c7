#include "kiln/serve/server.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/base/log.h"
#include "kiln/http/response.h"
#include "kiln/http/router.h"
#include "kiln/serve/batcher.h"
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
    return IsQueueTimeout(s) ? Outcome::kTimeout : Outcome::kRejected;
  return Outcome::kError;
}

HttpResponse InferenceServer::ErrorResponse(const absl::Status& s) {
  return http::ErrorResponse(s);
}

absl::Status InferenceServer::RepositoryJobStatus(absl::Status s) {
  const absl::StatusCode c = s.code();
  if (!s.ok() && c != absl::StatusCode::kNotFound && c != absl::StatusCode::kAborted &&
      c != absl::StatusCode::kUnavailable)
    return absl::FailedPreconditionError(s.message());
  return s;
}

namespace {

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
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
      registry_(&metrics_) {
  AddRoutes();
}

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
  MutexLock lock(shutdown_mu_);
  frontends_.push_back(f);
}

void InferenceServer::RemoveFrontend(Frontend* f) {
  MutexLock lock(shutdown_mu_);
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
  MutexLock lock(shutdown_mu_);
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
  const int64_t total_us = clock_->NowMicros() - call.start_us;
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
  MutexLock lock(log_mu_);
  *options_.access_log << line << std::flush;
}

void InferenceServer::AddRoutes() {
  auto add = [this](const char* method, const char* pattern, RouteHandler handler) {
    absl::Status s = routes_.Add(method, pattern, handler);
    if (!s.ok()) {  // the patterns below are fixed: a programmer's bug
      KILN_LOG(ERROR) << s;
      std::abort();
    }
  };
  add("GET", "/metrics", &InferenceServer::GetMetrics);
  add("GET", "/v2", &InferenceServer::GetServerMetadata);
  add("GET", "/v2/health/live", &InferenceServer::GetLive);
  add("GET", "/v2/health/ready", &InferenceServer::GetReady);
  for (const char* model : {"/v2/models/{model}", "/v2/models/{model}/versions/{version}"}) {
    add("GET", model, &InferenceServer::GetModelMetadata);
    add("GET", absl::StrCat(model, "/ready").c_str(), &InferenceServer::GetModelReady);
    add("POST", absl::StrCat(model, "/infer").c_str(), &InferenceServer::PostInfer);
  }
  add("POST", "/v2/repository/index", &InferenceServer::PostRepositoryIndex);
  add("POST", "/v2/repository/models/{model}/load", &InferenceServer::PostRepositoryLoad);
  add("POST", "/v2/repository/models/{model}/unload", &InferenceServer::PostRepositoryUnload);
}

void InferenceServer::Handle(HttpRequest req, HttpReplier reply) {
  Call call;
  call.start_us = clock_->NowMicros();
  call.method = req.method;
  call.remote = req.remote;
  call.bytes_in = static_cast<int64_t>(req.body.size());
  std::string_view path = req.target;
  if (size_t q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  call.path = std::string(path);
  absl::StatusOr<std::vector<std::string>> segments = http::SplitPath(call.path);
  if (!segments.ok()) return Finish(call, ErrorResponse(segments.status()), reply);
  RouteTable::Found route = routes_.Find(req.method, *segments);
  if (route.status != 200)
    return Finish(call, http::NoRouteResponse(route.status, route.allow, req.method, call.path),
                  reply);
  (this->*(*route.handler))(route.params, req, call, reply);
}

void InferenceServer::GetMetrics(const http::PathParams&, HttpRequest&, Call& call,
                                 HttpReplier& reply) {
  HttpResponse r = Json(200, metrics_.Render());
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  Finish(call, std::move(r), reply);
}

void InferenceServer::GetServerMetadata(const http::PathParams&, HttpRequest&, Call& call,
                                        HttpReplier& reply) {
  Finish(call,
         Json(200, absl::StrCat("{\"name\":\"kiln\",\"version\":", Quoted(options_.server_version),
                                ",\"extensions\":[",
                                absl::StrJoin(Extensions(), ",",
                                              [](std::string* o, const std::string& e) {
                                                o->append(Quoted(e));
                                              }),
                                "]}")),
         reply);
}

void InferenceServer::GetLive(const http::PathParams&, HttpRequest&, Call& call,
                              HttpReplier& reply) {
  Finish(call, Json(200, "{\"live\":true}"), reply);
}

void InferenceServer::GetReady(const http::PathParams&, HttpRequest&, Call& call,
                               HttpReplier& reply) {
  const bool ready = ready_.load();
  Finish(call, Json(ready ? 200 : 400, ready ? "{\"ready\":true}" : "{\"ready\":false}"), reply);
}

std::shared_ptr<ServedModel> InferenceServer::RoutedModel(const http::PathParams& params,
                                                          Call& call, HttpReplier& reply) {
  call.model = params.Get("model");
  call.version = params.Get("version");
  absl::StatusOr<std::shared_ptr<ServedModel>> found = FindModel(call.model, call.version);
  if (!found.ok()) {
    Finish(call, ErrorResponse(found.status()), reply);
    return nullptr;
  }
  call.version = (*found)->version();
  return std::move(*found);
}

void InferenceServer::GetModelMetadata(const http::PathParams& params, HttpRequest&, Call& call,
                                       HttpReplier& reply) {
  std::shared_ptr<ServedModel> model = RoutedModel(params, call, reply);
  if (model == nullptr) return;
  Finish(call,
         Json(200, absl::StrCat("{\"name\":", Quoted(model->name()), ",\"versions\":[",
                                absl::StrJoin(registry_.Versions(model->name()), ",",
                                              [](std::string* o, const std::string& v) {
                                                o->append(Quoted(v));
                                              }),
                                "],\"platform\":\"kiln\",\"inputs\":", SpecsJson(model->inputs()),
                                ",\"outputs\":", SpecsJson(model->outputs()), "}")),
         reply);
}

void InferenceServer::GetModelReady(const http::PathParams& params, HttpRequest&, Call& call,
                                    HttpReplier& reply) {
  std::shared_ptr<ServedModel> model = RoutedModel(params, call, reply);
  if (model == nullptr) return;
  Finish(call,
         Json(200, absl::StrCat("{\"name\":", Quoted(model->name()),
                                ",\"version\":", Quoted(model->version()), ",\"ready\":true}")),
         reply);
}

void InferenceServer::PostInfer(const http::PathParams& params, HttpRequest& req, Call& call,
                                HttpReplier& reply) {
  std::shared_ptr<ServedModel> model = RoutedModel(params, call, reply);
  if (model == nullptr) return;
  call.metrics = registry_.MetricsFor(model->name(), model->version());
  Infer(std::move(model), req, call, reply);
}

bool InferenceServer::HasRepository(Call& call, HttpReplier& reply) {
  if (repository_ != nullptr) return true;
  Finish(call, http::ErrorResponse(404, "this server has no model repository (--model-repository)"),
         reply);
  return false;
}

void InferenceServer::PostRepositoryIndex(const http::PathParams&, HttpRequest& req, Call& call,
                                          HttpReplier& reply) {
  if (!HasRepository(call, reply)) return;
  bool ready_only = false;
  if (!req.body.empty()) {
    absl::StatusOr<bool> r = ParseIndexReady(req.body);
    if (!r.ok()) return Finish(call, http::ErrorResponse(400, r.status().message()), reply);
    ready_only = *r;
  }
  Finish(call, Json(200, repository_->IndexJson(ready_only)), reply);
}

void InferenceServer::PostRepositoryLoad(const http::PathParams& params, HttpRequest&, Call& call,
                                         HttpReplier& reply) {
  RepositoryJob(ModelRepository::Job::kLoad, params, call, reply);
}

void InferenceServer::PostRepositoryUnload(const http::PathParams& params, HttpRequest&, Call& call,
                                           HttpReplier& reply) {
  RepositoryJob(ModelRepository::Job::kUnload, params, call, reply);
}

void InferenceServer::RepositoryJob(ModelRepository::Job job, const http::PathParams& params,
                                    Call& call, HttpReplier& reply) {
  if (!HasRepository(call, reply)) return;
  // Loading compiles (seconds): on the repository's loader thread, answered from there, so this
  // I/O thread goes on serving.
  call.model = params.Get("model");
  repository_->Submit(job, call.model, [this, call, reply](absl::Status s) mutable {
    if (s.ok()) return Finish(call, Json(200, "{}"), reply);
    Finish(call, ErrorResponse(RepositoryJobStatus(std::move(s))), reply);
  });
}

}  // namespace kiln::serve
