#include "kiln/serve/metrics.h"

#include <charconv>

#include "absl/strings/str_cat.h"

namespace kiln::serve {
namespace {

const std::vector<double> kLatencyBounds = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                            0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                            0.5,     1,      2.5,     5,      10};
const std::vector<double> kBatchBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
const char* const kOutcomeNames[kNumOutcomes] = {"success", "bad_request", "rejected", "timeout",
                                                 "error"};

std::string Number(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void Header(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  MutexLock lock(mu_);
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  MutexLock lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(out, name, "_bucket{", labels, ",le=\"",
                    i < bounds_.size() ? Number(bounds_[i]) : "+Inf", "\"} ", cumulative, "\n");
  }
  absl::StrAppend(out, name, "_sum{", labels, "} ", Number(sum_), "\n");
  absl::StrAppend(out, name, "_count{", labels, "} ", count_, "\n");
}

ModelMetrics::ModelMetrics()
    : queue(kLatencyBounds),
      compute(kLatencyBounds),
      total(kLatencyBounds),
      batch_size(kBatchBounds) {}

ModelMetrics* ServerMetrics::ForModel(const std::string& model, const std::string& version) {
  MutexLock lock(mu_);
  auto& m = models_[{model, version}];
  if (!m) m = std::make_unique<ModelMetrics>();
  return m.get();
}

void ServerMetrics::SetQueueDepth(ModelMetrics* m, std::function<int64_t()> f) {
  MutexLock lock(mu_);
  m->queue_depth = std::move(f);
}

void ServerMetrics::CountHttp(int code) {
  MutexLock lock(mu_);
  http_[code]++;
}

void ServerMetrics::EnableGrpc() {
  MutexLock lock(mu_);
  grpc_ = true;
}

void ServerMetrics::CountGrpc(const std::string& method, const std::string& code) {
  MutexLock lock(mu_);
  grpc_calls_[{method, code}]++;
}

std::string ServerMetrics::Render() const {
  MutexLock lock(mu_);
  std::string out;
  auto labels = [](const std::pair<std::string, std::string>& k) {
    return absl::StrCat("model=\"", LabelValue(k.first), "\",version=\"", LabelValue(k.second),
                        "\"");
  };
  Header(&out, "kiln_inference_requests_total", "counter",
         "Inference requests by model, version and outcome.");
  for (const auto& [k, m] : models_)
    for (int o = 0; o < kNumOutcomes; ++o)
      absl::StrAppend(&out, "kiln_inference_requests_total{", labels(k), ",outcome=\"",
                      kOutcomeNames[o], "\"} ", m->requests[o].load(), "\n");
  Header(&out, "kiln_inference_queue_depth", "gauge", "Requests waiting for a batch.");
  for (const auto& [k, m] : models_)
    absl::StrAppend(&out, "kiln_inference_queue_depth{", labels(k), "} ",
                    m->queue_depth ? m->queue_depth() : 0, "\n");
  struct H {
    const char* name;
    const char* help;
    Histogram ModelMetrics::*h;
  };
  const H hs[] = {
      {"kiln_inference_queue_duration_seconds", "Time from enqueue to batch dispatch.",
       &ModelMetrics::queue},
      {"kiln_inference_compute_duration_seconds", "Time to run one batch.", &ModelMetrics::compute},
      {"kiln_inference_request_duration_seconds", "Time from request read to response ready.",
       &ModelMetrics::total},
      {"kiln_inference_batch_size", "Rows per executed batch, before padding.",
       &ModelMetrics::batch_size},
  };
  for (const H& h : hs) {
    Header(&out, h.name, "histogram", h.help);
    for (const auto& [k, m] : models_) ((*m).*(h.h)).Render(h.name, labels(k), &out);
  }
  Header(&out, "kiln_inference_request_bytes_total", "counter", "Inference request body bytes.");
  for (const auto& [k, m] : models_)
    absl::StrAppend(&out, "kiln_inference_request_bytes_total{", labels(k), "} ",
                    m->bytes_in.load(), "\n");
  Header(&out, "kiln_inference_response_bytes_total", "counter", "Inference response body bytes.");
  for (const auto& [k, m] : models_)
    absl::StrAppend(&out, "kiln_inference_response_bytes_total{", labels(k), "} ",
                    m->bytes_out.load(), "\n");
  Header(&out, "kiln_http_requests_total", "counter", "HTTP requests by status code.");
  for (const auto& [code, n] : http_)
    absl::StrAppend(&out, "kiln_http_requests_total{code=\"", code, "\"} ", n, "\n");
  if (grpc_) {
    Header(&out, "kiln_grpc_requests_total", "counter", "gRPC requests by method and status code.");
    for (const auto& [k, n] : grpc_calls_)
      absl::StrAppend(&out, "kiln_grpc_requests_total{method=\"", LabelValue(k.first), "\",code=\"",
                      LabelValue(k.second), "\"} ", n, "\n");
  }
  return out;
}

}  // namespace kiln::serve
