// The server's Prometheus metrics (text exposition format 0.0.4), rendered for GET /metrics.
// Names (docs/serving.md, "Metrics"), each labelled {model, version}:
//   kiln_inference_requests_total{outcome}   counter: success, bad_request, rejected (queue full
//                                            or shutting down), timeout (expired in the queue),
//                                            error
//   kiln_inference_queue_depth               gauge: requests waiting for a batch
//   kiln_inference_queue_duration_seconds    histogram: enqueue -> taken into a batch
//   kiln_inference_compute_duration_seconds  histogram: one batch's run (per batch)
//   kiln_inference_request_duration_seconds  histogram: body read -> response ready
//   kiln_inference_batch_size                histogram: rows per batch (before padding)
//   kiln_inference_request_bytes_total, kiln_inference_response_bytes_total  counters
// and kiln_http_requests_total{code} over every endpoint; with the gRPC service on,
// kiln_grpc_requests_total{method,code} over every RPC (code: OK, INVALID_ARGUMENT, ...).
//
//   ModelMetrics* m = metrics.ForModel("mlp", "1");
//   m->Count(Outcome::kSuccess);  m->queue.Observe(0.0004);
//   std::string text = metrics.Render();
#ifndef KILN_SERVE_METRICS_H_
#define KILN_SERVE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "kiln/base/mutex.h"

namespace kiln::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Appends the _bucket, _sum and _count lines of `name` with `labels` ("a=\"b\",...").
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket (not cumulative), plus +Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

enum class Outcome { kSuccess, kBadRequest, kRejected, kTimeout, kError };
inline constexpr int kNumOutcomes = 5;

struct ModelMetrics {
  ModelMetrics();
  void Count(Outcome o) { requests[static_cast<int>(o)]++; }

  std::atomic<uint64_t> requests[kNumOutcomes] = {};
  std::atomic<uint64_t> bytes_in{0}, bytes_out{0};
  Histogram queue, compute, total, batch_size;
  // The live queue depth; unset (0) once the version is unloaded.
  std::function<int64_t()> queue_depth;
};

class ServerMetrics {
 public:
  // Stable for the server's life (unloaded versions keep their counts).
  ModelMetrics* ForModel(const std::string& model, const std::string& version);
  void SetQueueDepth(ModelMetrics* m, std::function<int64_t()> f);
  void CountHttp(int code);
  // From now on /metrics has kiln_grpc_requests_total (the gRPC service is on).
  void EnableGrpc();
  void CountGrpc(const std::string& method, const std::string& code);
  std::string Render() const;

 private:
  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<ModelMetrics>> models_
      ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> http_ ABSL_GUARDED_BY(mu_);
  bool grpc_ ABSL_GUARDED_BY(mu_) = false;
  // (method, code)
  std::map<std::pair<std::string, std::string>, uint64_t> grpc_calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln::serve

#endif  // KILN_SERVE_METRICS_H_
