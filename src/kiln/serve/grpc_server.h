// The Open Inference Protocol's gRPC service, `inference.GRPCInferenceService`
// (proto/inference.proto: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
// ModelInfer, and the model-repository extension's RepositoryIndex, RepositoryModelLoad and
// RepositoryModelUnload over the server's ModelRepository, as REST's /v2/repository/*), on its
// own port beside an InferenceServer's REST endpoints. It serves the same
// registry through the same inference path (InferenceServer::SubmitInfer: one batcher, one set
// of model metrics), on gRPC's callback API so that no gRPC thread waits for a batch. Also the
// standard health service `grpc.health.v1.Health`, NOT_SERVING once draining.
//
//   InferenceServer server(options);  ...  server.Start();
//   GrpcServerOptions g;  g.host = "127.0.0.1";  g.port = 0;
//   KILN_ASSIGN_OR_RETURN(auto grpc, GrpcServer::Start(&server, g));   // grpc->port()
//   ...
//   server.Shutdown(30000);   // drains REST and gRPC together, then stops the models
//
// Errors map to gRPC codes as absl's codes do (they are the same numbers): INVALID_ARGUMENT
// naming the field, NOT_FOUND for an unknown model or version, UNAVAILABLE for a full queue, a
// queue timeout or a server shutting down, RESOURCE_EXHAUSTED for an input over
// ServerOptions::max_input_elements or a message over max_message_bytes; FAILED_PRECONDITION for
// a repository load that failed (or no repository); ABORTED for a repository load or unload of
// a model that has one running already (REST's 409); INTERNAL only for a broken invariant.
// Requests are counted in /metrics as kiln_grpc_requests_total{method,code} and, for
// ModelInfer, in the model's kiln_inference_* metrics with the REST requests.
#ifndef KILN_SERVE_GRPC_SERVER_H_
#define KILN_SERVE_GRPC_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "kiln/base/mutex.h"
#include "kiln/serve/server.h"

namespace grpc {
class Server;
}

namespace kiln::serve {

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the kernel picks one (see port())
  // The largest request message accepted (larger: RESOURCE_EXHAUSTED before it is parsed);
  // answers are not limited.
  int64_t max_message_bytes = int64_t{64} << 20;
};

class GrpcServer : public Frontend {
 public:
  // Binds and starts serving `server`'s models (`server` must outlive this, or Shutdown first);
  // registers with server->AddFrontend. Errors name the address.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(InferenceServer* server,
                                                           const GrpcServerOptions& options);
  ~GrpcServer() override;  // Drain(0), and leaves the server's front ends

  int port() const { return port_; }
  // Health turns NOT_SERVING, new calls are refused, calls in flight are answered (for at most
  // drain_ms, then cancelled). Idempotent.
  void Drain(int64_t drain_ms) override;

  class Service;

 private:
  GrpcServer() = default;
  InferenceServer* inference_ = nullptr;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  Mutex drain_mu_;
  bool drained_ ABSL_GUARDED_BY(drain_mu_) = false;
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_GRPC_SERVER_H_
