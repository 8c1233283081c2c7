#include "kiln/serve/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/serve/clock.h"
#include "kiln/serve/grpc_convert.h"
#include "kiln/serve/proto/inference.grpc.pb.h"

namespace kiln::serve {
namespace {

// absl's status codes are gRPC's, number for number.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    default:
      return "UNKNOWN";
  }
}

// The methods whose requests carry strings take raw bytes and parse them here: a message that
// does not parse (malformed, a string that is not UTF-8) is the client's error,
// INVALID_ARGUMENT, where gRPC's own deserializer would answer INTERNAL.
template <typename Message>
absl::Status ParseRequest(const grpc::ByteBuffer* bytes, Message* msg) {
  grpc::ByteBuffer copy(*bytes);  // shares the slices; the reader needs a mutable buffer
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !msg->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: not a valid ", msg->GetTypeName(),
                     " (malformed protobuf, or a string field that is not UTF-8)"));
  }
  return absl::OkStatus();
}

void Serialize(const google::protobuf::MessageLite& msg, grpc::ByteBuffer* out) {
  std::string bytes = msg.SerializeAsString();
  grpc::Slice slice(std::move(bytes));
  *out = grpc::ByteBuffer(&slice, 1);
}

void FillTensorMetadata(const compiler::TensorSpec& s,
                        inference::ModelMetadataResponse::TensorMetadata* t) {
  t->set_name(s.name);
  t->set_datatype(OipDatatype(s.dtype));
  t->add_shape(-1);  // the batch dimension is variable
  for (int i = 1; i < s.shape.rank(); ++i) t->add_shape(s.shape.dim(i));
}

}  // namespace

using Grpc = inference::GRPCInferenceService;
using RawService = Grpc::WithRawCallbackMethod_ModelReady<
    Grpc::WithRawCallbackMethod_ModelMetadata<Grpc::WithRawCallbackMethod_ModelInfer<
        Grpc::WithRawCallbackMethod_RepositoryIndex<Grpc::WithRawCallbackMethod_RepositoryModelLoad<
            Grpc::WithRawCallbackMethod_RepositoryModelUnload<Grpc::CallbackService>>>>>>;

namespace {

using RepositoryParameters =
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>;

// Load takes no parameters (Triton's "config" and "file:..." overrides would change what loads:
// Kiln reads REPO/<model>/config.yaml and the version folders); unload takes Triton's
// unload_dependents (Kiln has no dependent models). Keys sorted, so the message is stable.
absl::Status CheckRepositoryParameters(const RepositoryParameters& params, bool unload) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : params) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  for (const std::string& k : keys) {
    if (unload && k == "unload_dependents") {
      if (params.at(k).parameter_choice_case() != inference::ModelRepositoryParameter::kBoolParam)
        return absl::InvalidArgumentError("parameters.unload_dependents: expected a bool_param");
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("parameters.", k, ": not supported",
                     unload ? " (only unload_dependents)"
                            : " (a load reads REPO/<model>/config.yaml and its version folders)"));
  }
  return absl::OkStatus();
}

}  // namespace

class GrpcServer::Service final : public RawService {
 public:
  explicit Service(InferenceServer* server) : server_(server) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* resp) override {
    resp->set_live(true);
    return Reply(ctx, "ServerLive", grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* resp) override {
    resp->set_ready(server_->ready());
    return Reply(ctx, "ServerReady", grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* bytes,
                                       grpc::ByteBuffer* out) override {
    inference::ModelReadyRequest req;
    if (absl::Status p = ParseRequest(bytes, &req); !p.ok())
      return Reply(ctx, "ModelReady", ToGrpc(p));
    auto model = server_->FindModel(req.name(), req.version());
    if (!model.ok()) return Reply(ctx, "ModelReady", ToGrpc(model.status()));
    inference::ModelReadyResponse resp;
    resp.set_ready(true);  // a registered version has compiled and warmed up
    Serialize(resp, out);
    return Reply(ctx, "ModelReady", grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* resp) override {
    resp->set_name("kiln");
    resp->set_version(server_->options().server_version);
    for (const std::string& e : server_->Extensions()) resp->add_extensions(e);
    return Reply(ctx, "ServerMetadata", grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* bytes,
                                          grpc::ByteBuffer* out) override {
    inference::ModelMetadataRequest req;
    if (absl::Status p = ParseRequest(bytes, &req); !p.ok())
      return Reply(ctx, "ModelMetadata", ToGrpc(p));
    auto model = server_->FindModel(req.name(), req.version());
    if (!model.ok()) return Reply(ctx, "ModelMetadata", ToGrpc(model.status()));
    const ServedModel& m = **model;
    inference::ModelMetadataResponse resp;
    resp.set_name(m.name());
    for (const std::string& v : server_->registry().Versions(m.name())) resp.add_versions(v);
    resp.set_platform("kiln");
    for (const auto& s : m.inputs()) FillTensorMetadata(s, resp.add_inputs());
    for (const auto& s : m.outputs()) FillTensorMetadata(s, resp.add_outputs());
    Serialize(resp, out);
    return Reply(ctx, "ModelMetadata", grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* bytes,
                                       grpc::ByteBuffer* out) override {
    const int64_t start_us = server_->clock()->NowMicros();
    auto request = std::make_unique<inference::ModelInferRequest>();
    if (absl::Status p = ParseRequest(bytes, request.get()); !p.ok())
      return Reply(ctx, "ModelInfer", ToGrpc(p), start_us);
    const inference::ModelInferRequest* req = request.get();
    InferenceServer::LogEntry log;
    log.model = req->model_name();
    log.version = req->model_version();
    log.id = req->id();
    log.bytes_in = static_cast<int64_t>(req->ByteSizeLong());
    auto found = server_->FindModel(req->model_name(), req->model_version());
    if (!found.ok()) return Reply(ctx, "ModelInfer", ToGrpc(found.status()), start_us, log);
    std::shared_ptr<ServedModel> model = std::move(*found);
    log.model = model->name();
    log.version = model->version();
    ModelMetrics* metrics = server_->registry().MetricsFor(model->name(), model->version());
    metrics->bytes_in += log.bytes_in;
    bool raw = false;
    absl::StatusOr<InferBody> body =
        InferBodyFromProto(*req, server_->options().max_input_elements, &raw);
    if (!body.ok()) {
      metrics->Count(Outcome::kBadRequest);
      metrics->total.Observe((server_->clock()->NowMicros() - start_us) * 1e-6);
      return Reply(ctx, "ModelInfer", ToGrpc(body.status()), start_us, log);
    }
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    log.remote = ctx->peer();
    server_->SubmitInfer(
        std::move(model), std::move(*body), metrics,
        [this, reactor, out, metrics, start_us, raw, log = std::move(log)](InferDone d) mutable {
          if (d.status.ok()) {
            inference::ModelInferResponse resp;
            FillInferResponse(log.model, log.version, log.id, d.outputs, raw, &resp);
            log.bytes_out = static_cast<int64_t>(resp.ByteSizeLong());
            metrics->bytes_out += log.bytes_out;
            Serialize(resp, out);
          }
          metrics->total.Observe((server_->clock()->NowMicros() - start_us) * 1e-6);
          log.queue_us = d.queue_us;
          log.compute_us = d.compute_us;
          log.batch_rows = d.batch_rows;
          grpc::Status s = ToGrpc(d.status);
          Finished(nullptr, "ModelInfer", s, start_us, std::move(log));
          reactor->Finish(std::move(s));
        });
    return reactor;
  }

  // The model-repository extension, over the same ModelRepository as REST's /v2/repository/*.
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* bytes,
                                            grpc::ByteBuffer* out) override {
    inference::RepositoryIndexRequest req;
    if (absl::Status p = ParseRequest(bytes, &req); !p.ok())
      return Reply(ctx, "RepositoryIndex", ToGrpc(p));
    absl::StatusOr<ModelRepository*> repo = Repository(req.repository_name());
    if (!repo.ok()) return Reply(ctx, "RepositoryIndex", ToGrpc(repo.status()));
    inference::RepositoryIndexResponse resp;
    for (const ModelRepository::IndexEntry& e : (*repo)->Index(req.ready())) {
      inference::RepositoryIndexResponse::ModelIndex* m = resp.add_models();
      m->set_name(e.name);
      m->set_version(e.version);
      m->set_state(e.state);
      m->set_reason(e.reason);
    }
    Serialize(resp, out);
    return Reply(ctx, "RepositoryIndex", grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const grpc::ByteBuffer* bytes,
                                                grpc::ByteBuffer* out) override {
    inference::RepositoryModelLoadRequest req;
    return LoadOrUnload<inference::RepositoryModelLoadResponse>(ctx, bytes, out, &req, false);
  }

  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* bytes,
                                                  grpc::ByteBuffer* out) override {
    inference::RepositoryModelUnloadRequest req;
    return LoadOrUnload<inference::RepositoryModelUnloadResponse>(ctx, bytes, out, &req, true);
  }

  // Waits for the repository loads and unloads still to answer (after the server stopped
  // taking calls).
  void JoinJobs() {
    UniqueLock lock(jobs_mu_);
    jobs_cv_.wait(lock.get(), [this] {
      jobs_mu_.AssertHeld();  // the wait holds it while it asks
      return jobs_ == 0;
    });
  }
  ~Service() override { JoinJobs(); }

 private:
  // The server's repository, if `name` is empty or names it (its folder as given, or the
  // folder's last component): FailedPrecondition without one, NotFound for another name.
  absl::StatusOr<ModelRepository*> Repository(const std::string& name) {
    ModelRepository* repo = server_->repository();
    if (repo == nullptr)
      return absl::FailedPreconditionError(
          "this server has no model repository (--model-repository)");
    std::string root = repo->root();
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    const std::string base = root.substr(root.find_last_of('/') + 1);
    if (!name.empty() && name != repo->root() && name != root && name != base)
      return absl::NotFoundError(absl::StrCat("unknown repository '", name,
                                              "' (this server serves one: ", repo->root(), ")"));
    return repo;
  }

  // Load and unload compile or stop models (seconds), so they run on the repository's loader
  // thread, as REST's do (ModelRepository::Submit: one job per model at a time, a second one
  // ABORTED), and answer from there; no gRPC thread waits. Unknown models are NOT_FOUND; a load
  // that fails for its files or config is FAILED_PRECONDITION (the versions serving keep
  // serving); UNAVAILABLE once the server is shutting down.
  template <typename Response, typename Request>
  grpc::ServerUnaryReactor* LoadOrUnload(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* bytes, grpc::ByteBuffer* out,
                                         Request* req, bool unload) {
    const char* method = unload ? "RepositoryModelUnload" : "RepositoryModelLoad";
    const int64_t start_us = server_->clock()->NowMicros();
    if (absl::Status p = ParseRequest(bytes, req); !p.ok()) return Reply(ctx, method, ToGrpc(p));
    InferenceServer::LogEntry log;
    log.model = req->model_name();
    absl::StatusOr<ModelRepository*> repo = Repository(req->repository_name());
    if (!repo.ok()) return Reply(ctx, method, ToGrpc(repo.status()), start_us, log);
    if (req->model_name().empty())
      return Reply(ctx, method, ToGrpc(absl::InvalidArgumentError("model_name: missing")), start_us,
                   log);
    if (absl::Status p = CheckRepositoryParameters(req->parameters(), unload); !p.ok())
      return Reply(ctx, method, ToGrpc(p), start_us, log);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    {
      MutexLock lock(jobs_mu_);
      ++jobs_;
    }
    log.remote = ctx->peer();
    (*repo)->Submit(unload ? ModelRepository::Job::kUnload : ModelRepository::Job::kLoad,
                    req->model_name(),
                    [this, reactor, out, method, start_us, log](absl::Status s) mutable {
                      s = InferenceServer::RepositoryJobStatus(std::move(s));
                      if (s.ok()) Serialize(Response(), out);
                      grpc::Status g = ToGrpc(s);
                      Finished(nullptr, method, g, start_us, std::move(log));
                      reactor->Finish(std::move(g));
                      MutexLock lock(jobs_mu_);
                      if (--jobs_ == 0) jobs_cv_.notify_all();
                    });
    return reactor;
  }

  // Counts the call and writes its access-log line (remote from `ctx` unless already set).
  void Finished(grpc::CallbackServerContext* ctx, const char* method, const grpc::Status& s,
                int64_t start_us, InferenceServer::LogEntry log) {
    server_->metrics().CountGrpc(method, CodeName(s.error_code()));
    if (server_->options().access_log == nullptr) return;
    if (ctx != nullptr) log.remote = ctx->peer();
    log.method = "gRPC";
    log.path = absl::StrCat("/inference.GRPCInferenceService/", method);
    log.status = absl::StrCat("\"", CodeName(s.error_code()), "\"");
    log.total_us = server_->clock()->NowMicros() - start_us;
    server_->LogAccess(log);
  }
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const char* method,
                                  grpc::Status s, int64_t start_us = -1,
                                  InferenceServer::LogEntry log = {}) {
    if (start_us < 0) start_us = server_->clock()->NowMicros();
    Finished(ctx, method, s, start_us, std::move(log));
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(std::move(s));
    return r;
  }

  InferenceServer* const server_;
  Mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  // Repository loads and unloads submitted and not yet answered.
  int64_t jobs_ ABSL_GUARDED_BY(jobs_mu_) = 0;
};

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(InferenceServer* server,
                                                              const GrpcServerOptions& options) {
  if (options.port < 0 || options.port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("gRPC port ", options.port, " is outside 0..65535"));
  if (options.max_message_bytes < 1 || options.max_message_bytes > INT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat(
        "gRPC max message size ", options.max_message_bytes, " is outside 1..2147483647 bytes"));
  std::unique_ptr<GrpcServer> g(new GrpcServer());
  g->inference_ = server;
  g->service_ = std::make_unique<Service>(server);
  const std::string host =
      options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  const std::string address = absl::StrCat(host, ":", options.port);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int selected = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &selected);
  builder.RegisterService(g->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(-1);
  // One port per process: a second server on the same port must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  g->server_ = builder.BuildAndStart();
  if (g->server_ == nullptr || selected == 0)
    return absl::UnavailableError(
        absl::StrCat("gRPC: cannot listen on ", address, " (address in use or not local?)"));
  g->port_ = selected;
  server->metrics().EnableGrpc();
  server->AddFrontend(g.get());
  return g;
}

GrpcServer::~GrpcServer() {
  if (inference_ != nullptr) inference_->RemoveFrontend(this);
  Drain(0);
}

void GrpcServer::Drain(int64_t drain_ms) {
  MutexLock lock(drain_mu_);
  if (drained_ || server_ == nullptr) return;
  drained_ = true;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(drain_ms));
  server_->Wait();
  service_->JoinJobs();
}

}  // namespace kiln::serve
