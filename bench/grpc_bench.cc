// `kiln serve`'s gRPC service against its REST endpoint in the same run: an in-process
// InferenceServer and GrpcServer on 127.0.0.1 serving a tiny model (x f32[1,16] -> x + b,
// batching off: max batch 1), closed-loop clients at concurrency 1 and 8, alternating REST JSON,
// gRPC typed contents and gRPC raw contents round by round. Prints req/s, p50 and p99 per
// configuration (medians over rounds, ranges in parentheses).
//
//   build/src/kiln/serve/grpc_bench [--seconds 1] [--rounds 3]
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench/timing.h"
#include "kiln/compiler/artifact.h"
#include "kiln/http/internal/test_client.h"
#include "kiln/ir/parser.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/serve/grpc_server.h"
#include "kiln/serve/proto/inference.grpc.pb.h"

namespace kiln::serve {
namespace {

constexpr char kTiny[] = R"(graph @tiny {
  %0 = parameter() {index=0, name="b"} : f32[16]
  %1 = parameter() {index=1, name="x"} : f32[1,16]
  %2 = broadcast_in_dim(%0) {broadcast_dimensions=[1], shape=[1,16]} : f32[1,16]
  %3 = add(%1, %2) : f32[1,16]
  return y=%3
}
)";

enum class Mode { kRest, kGrpcTyped, kGrpcRaw };
const char* Name(Mode m) {
  return m == Mode::kRest ? "REST JSON" : m == Mode::kGrpcTyped ? "gRPC typed" : "gRPC raw";
}

struct Result {
  double rps = 0, p50_us = 0, p99_us = 0;
  int64_t errors = 0;
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

Result RunLoad(Mode mode, int concurrency, double seconds, int http_port, int grpc_port) {
  std::string body = R"({"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[)";
  for (int i = 0; i < 16; ++i) body += (i ? "," : "") + std::to_string(0.25 * i);
  body += "]}]}";
  inference::ModelInferRequest req;
  req.set_model_name("tiny");
  auto* in = req.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(16);
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = 0.25f * i;
  if (mode == Mode::kGrpcRaw) {
    req.add_raw_input_contents(reinterpret_cast<const char*>(x.data()), 16 * sizeof(float));
  } else {
    for (float v : x) in->mutable_contents()->add_fp32_contents(v);
  }
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> lat(concurrency);
  std::vector<int64_t> errors(concurrency, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<kiln::http::testing::TestClient> http;
      std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
      if (mode == Mode::kRest) {
        http = std::make_unique<kiln::http::testing::TestClient>(http_port);
      } else {
        grpc::ChannelArguments args;
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per client
        stub = inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
            "127.0.0.1:" + std::to_string(grpc_port), grpc::InsecureChannelCredentials(), args));
      }
      while (!stop.load(std::memory_order_relaxed)) {
        const double t0 = bench::Seconds();
        bool ok;
        if (http) {
          ok = http->Send("POST", "/v2/models/tiny/infer", body).status == 200;
        } else {
          grpc::ClientContext ctx;
          inference::ModelInferResponse resp;
          ok = stub->ModelInfer(&ctx, req, &resp).ok();
        }
        lat[c].push_back((bench::Seconds() - t0) * 1e6);
        if (!ok) errors[c]++;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  std::vector<double> all;
  Result r;
  for (int c = 0; c < concurrency; ++c) {
    all.insert(all.end(), lat[c].begin(), lat[c].end());
    r.errors += errors[c];
  }
  r.rps = all.size() / seconds;
  r.p50_us = Percentile(all, 0.50);
  r.p99_us = Percentile(all, 0.99);
  return r;
}

int Main(int argc, char** argv) {
  double seconds = 1;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  const std::string dir = "/tmp/kiln_grpc_bench_tiny";
  auto g = ir::ParseGraph(kTiny);
  if (!g.ok()) return fprintf(stderr, "%s\n", g.status().ToString().c_str()), 1;
  Tensor b(DType::kF32, Shape{16});
  for (int i = 0; i < 16; ++i) b.data<float>()[i] = 1;
  compiler::ArtifactOptions ao;
  ao.overwrite = true;
  absl::Status w = compiler::WriteArtifact(dir, *g, {{"b", b}}, ao);
  if (!w.ok()) return fprintf(stderr, "%s\n", w.ToString().c_str()), 1;
  auto backend = runtime::MakeCpuBackend();
  ServerOptions o;
  o.http.threads = 1;
  InferenceServer server(o);
  BatchingConfig c;
  c.max_batch_size = 1;
  auto m = ServedModel::Load(dir, "tiny", "1", c, backend.get());
  if (!m.ok()) return fprintf(stderr, "%s\n", m.status().ToString().c_str()), 1;
  server.registry().Put(std::move(*m));
  if (absl::Status s = server.Start(); !s.ok())
    return fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  auto grpc = GrpcServer::Start(&server, GrpcServerOptions{});
  if (!grpc.ok()) return fprintf(stderr, "%s\n", grpc.status().ToString().c_str()), 1;

  const Mode modes[] = {Mode::kRest, Mode::kGrpcTyped, Mode::kGrpcRaw};
  std::map<std::pair<int, int>, std::vector<Result>> results;  // (concurrency, mode)
  for (int round = 0; round < rounds; ++round)
    for (int conc : {1, 8})
      for (Mode mode : modes)
        results[{conc, static_cast<int>(mode)}].push_back(
            RunLoad(mode, conc, seconds, server.port(), (*grpc)->port()));
  printf("tiny model x f32[1,16] -> x + b, max batch 1, %d rounds of %.1f s, medians (ranges)\n",
         rounds, seconds);
  printf("%-11s %3s %24s %22s %22s %6s\n", "protocol", "c", "req/s", "p50 us", "p99 us", "errors");
  for (int conc : {1, 8}) {
    for (Mode mode : modes) {
      auto& v = results[{conc, static_cast<int>(mode)}];
      std::vector<double> rps, p50, p99;
      int64_t errors = 0;
      for (const Result& r : v) {
        rps.push_back(r.rps);
        p50.push_back(r.p50_us);
        p99.push_back(r.p99_us);
        errors += r.errors;
      }
      auto cell = [](const std::vector<double>& x) {
        char buf[64];
        snprintf(buf, sizeof(buf), "%.0f (%.0f-%.0f)", bench::Median(x),
                 *std::min_element(x.begin(), x.end()), *std::max_element(x.begin(), x.end()));
        return std::string(buf);
      };
      printf("%-11s %3d %24s %22s %22s %6lld\n", Name(mode), conc, cell(rps).c_str(),
             cell(p50).c_str(), cell(p99).c_str(), static_cast<long long>(errors));
    }
  }
  server.Shutdown(2000);
  return 0;
}

}  // namespace
}  // namespace kiln::serve

int main(int argc, char** argv) { return kiln::serve::Main(argc, argv); }
