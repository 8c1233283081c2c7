// The inference server: the Open Inference Protocol (KServe v2) REST endpoints over HttpServer,
// served from a ModelRegistry (and a ModelRepository for the repository API), with Prometheus
// metrics and a JSON access log. Endpoints, errors and formats: docs/serving.md.
//
//   InferenceServer server(options);
//   server.registry().Put(std::move(model));      // or a ModelRepository on server.registry()
//   KILN_RETURN_IF_ERROR(server.Start());         // listens; server.port()
//   ...
//   server.Shutdown(30000);                       // not ready, stop accepting, drain, stop models
//
// Other protocol front ends (the gRPC service, grpc_server.h) serve the same registry through
// SubmitInfer, the inference path the REST handler uses, and register with AddFrontend so that
// Shutdown drains them too.
//
// Status codes: 200; 400 a malformed request (the message names the field); 404 an unknown
// path, model or version; 405 a wrong method; 413 a body over the limit; 503 (Retry-After) a
// full queue, a request timeout or a server shutting down. 500 only for a broken invariant.
#ifndef KILN_SERVE_SERVER_H_
#define KILN_SERVE_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "kiln/base/mutex.h"
#include "kiln/http/http_server.h"
#include "kiln/http/router.h"
#include "kiln/serve/clock.h"
#include "kiln/serve/metrics.h"
#include "kiln/serve/oip.h"
#include "kiln/serve/repository.h"

namespace kiln::serve {

// The HTTP layer's types, by their short names here (serve is one of its users).
using http::HttpReplier;
using http::HttpRequest;
using http::HttpResponse;
using http::HttpServer;
using http::HttpServerOptions;

struct ServerOptions {
  HttpServerOptions http;
  // The largest element count one input may declare (checked before allocating).
  int64_t max_input_elements = int64_t{1} << 26;
  // One JSON line per sampled request; null: none. Written under a lock.
  std::ostream* access_log = nullptr;
  double access_log_sample = 1.0;  // fraction of requests logged, spread evenly
  std::string server_version = "0.0.0";
  // The time source of request timing (the total-latency histograms, the access log's total_us),
  // REST and gRPC alike; null: RealClock::Get(). Must outlive the server. The models' batchers
  // take theirs at ServedModel::Load.
  Clock* clock = nullptr;
};

// One requested output of an inference, in the order the request asked for them.
struct InferOutput {
  std::string name;
  Tensor tensor;
  bool binary = false;  // the REST binary extension was asked for it
};

// What an inference came to: OK with the requested outputs, or why not (InvalidArgument naming
// the field, Unavailable for a full queue / a queue timeout / shutting down, else Internal).
struct InferDone {
  absl::Status status;
  std::vector<InferOutput> outputs;
  int64_t queue_us = -1;  // -1: it never reached a batch
  int64_t compute_us = -1;
  int64_t batch_rows = 0;
};

// A protocol front end beside REST (the gRPC service): stops taking requests and answers the
// ones in flight, for at most `drain_ms`, while the models still run.
class Frontend {
 public:
  virtual ~Frontend() = default;
  virtual void Drain(int64_t drain_ms) = 0;
};

class InferenceServer {
 public:
  explicit InferenceServer(ServerOptions options);
  ~InferenceServer();  // Shutdown(0)

  ModelRegistry& registry() { return registry_; }
  ServerMetrics& metrics() { return metrics_; }
  // Enables /v2/repository/... (must outlive the server).
  void set_repository(ModelRepository* repo) { repository_ = repo; }
  ModelRepository* repository() const { return repository_; }  // null: none

  const ServerOptions& options() const { return options_; }
  // options().clock, or the real clock.
  Clock* clock() const { return clock_; }
  // Borrowed (must outlive the server or be removed by Shutdown first): drained by Shutdown
  // together with the HTTP server, before the models stop.
  void AddFrontend(Frontend* f);
  void RemoveFrontend(Frontend* f);

  absl::Status Start();
  int port() const { return http_ ? http_->port() : 0; }
  // True from Start until Shutdown begins.
  bool ready() const { return ready_.load(); }
  // The extensions GET /v2 and ServerMetadata list.
  std::vector<std::string> Extensions() const;
  // name/version (empty: the highest), or NotFound naming what is missing ("unknown model 'x'",
  // "model 'x' has no version '9' (versions: 1, 2)").
  absl::StatusOr<std::shared_ptr<ServedModel>> FindModel(const std::string& name,
                                                         const std::string& version) const;

  // The protocol-neutral inference path REST and gRPC share: `body`'s inputs matched to the
  // model's signature and its outputs resolved (InvalidArgument naming the field), the request
  // queued on the model's batcher. `done` is called exactly once (on a batcher worker, or here
  // for a request that never queued) after the outcome and queue time are counted in `metrics`.
  void SubmitInfer(std::shared_ptr<ServedModel> model, InferBody body, ModelMetrics* metrics,
                   std::function<void(InferDone)> done);
  // Ready turns false, the listener closes, requests read are answered (for up to drain_ms),
  // then every model finishes its queue and stops. Idempotent.
  void Shutdown(int64_t drain_ms);

  // One access-log line (JSON; sampled by access_log_sample with every other request). HTTP
  // writes its status code as `status`; gRPC the code's name, quoted ("\"OK\"").
  struct LogEntry {
    std::string remote, method, path, model, version, id;
    std::string status;  // a JSON value, written as given
    int64_t bytes_in = 0, bytes_out = 0, total_us = 0;
    int64_t queue_us = -1, compute_us = -1, batch_rows = 0;  // queue_us < 0: not written
  };
  void LogAccess(const LogEntry& e);

  // How a model's status maps to metrics (a queue timeout by its type, IsQueueTimeout) and to
  // HTTP (http::ErrorResponse: 400, 404, 503 + Retry-After, 500).
  static Outcome OutcomeFor(const absl::Status& s);
  static HttpResponse ErrorResponse(const absl::Status& s);
  // What a repository load or unload answers, for REST and gRPC alike: OK, NotFound, Aborted (one
  // is running) and Unavailable (shutting down) as they are; any other failure (the model's files
  // or config) FailedPrecondition, so REST says 400 and gRPC FAILED_PRECONDITION.
  static absl::Status RepositoryJobStatus(absl::Status s);

  // One request (the HTTP server calls it; tests may too).
  void Handle(HttpRequest request, HttpReplier reply);
  // The REST endpoints, in the order Handle matches them (docs/serving.md lists each one).
  const std::vector<http::RouteInfo>& Routes() const { return routes_.routes(); }

 private:
  struct Call {  // one request's context, for metrics and the access log
    int64_t start_us = 0;
    std::string method, path, remote, model, version, id;
    int64_t bytes_in = 0;
    int64_t queue_us = -1, compute_us = -1, batch_rows = 0;
    ModelMetrics* metrics = nullptr;
  };
  // One endpoint: the segments its pattern captured, the request, its context.
  using RouteHandler = void (InferenceServer::*)(const http::PathParams&, HttpRequest&, Call&,
                                                 HttpReplier&);
  using RouteTable = http::RouteTable<RouteHandler>;
  void AddRoutes();
  void GetMetrics(const http::PathParams& params, HttpRequest& req, Call& call, HttpReplier& reply);
  void GetServerMetadata(const http::PathParams& params, HttpRequest& req, Call& call,
                         HttpReplier& reply);
  void GetLive(const http::PathParams& params, HttpRequest& req, Call& call, HttpReplier& reply);
  void GetReady(const http::PathParams& params, HttpRequest& req, Call& call, HttpReplier& reply);
  void GetModelMetadata(const http::PathParams& params, HttpRequest& req, Call& call,
                        HttpReplier& reply);
  void GetModelReady(const http::PathParams& params, HttpRequest& req, Call& call,
                     HttpReplier& reply);
  void PostInfer(const http::PathParams& params, HttpRequest& req, Call& call, HttpReplier& reply);
  void PostRepositoryIndex(const http::PathParams& params, HttpRequest& req, Call& call,
                           HttpReplier& reply);
  void PostRepositoryLoad(const http::PathParams& params, HttpRequest& req, Call& call,
                          HttpReplier& reply);
  void PostRepositoryUnload(const http::PathParams& params, HttpRequest& req, Call& call,
                            HttpReplier& reply);
  // The model {model} (and {version}) name, or null after answering 404.
  std::shared_ptr<ServedModel> RoutedModel(const http::PathParams& params, Call& call,
                                           HttpReplier& reply);
  // False after answering 404 when the server has no repository.
  bool HasRepository(Call& call, HttpReplier& reply);
  void RepositoryJob(ModelRepository::Job job, const http::PathParams& params, Call& call,
                     HttpReplier& reply);
  void Infer(std::shared_ptr<ServedModel> model, HttpRequest& req, Call& call, HttpReplier& reply);
  void Finish(Call& call, HttpResponse response, HttpReplier& reply);

  const ServerOptions options_;
  Clock* const clock_;
  ServerMetrics metrics_;
  ModelRegistry registry_;
  ModelRepository* repository_ = nullptr;
  RouteTable routes_;
  std::unique_ptr<HttpServer> http_;
  std::atomic<bool> ready_{false};
  std::atomic<uint64_t> log_counter_{0};
  Mutex log_mu_;  // one access-log line at a time
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  std::vector<Frontend*> frontends_ ABSL_GUARDED_BY(shutdown_mu_);
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_SERVER_H_
