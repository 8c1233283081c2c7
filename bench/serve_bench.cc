// `kiln serve`'s request path under load: an in-process InferenceServer on 127.0.0.1 serving an
// MLP (256-1024-1024-10, exported at batch 1), closed-loop clients over keep-alive connections
// at several concurrencies, batching off (max batch 1) against on (max batch 16, preferred 8,16,
// 500 us delay), alternating rounds; plus a bare HttpServer answering a constant string, the
// floor of the HTTP path. Prints req/s, p50 and p99 (medians over rounds, and their ranges).
//
//   build/bench/serve_bench [--seconds 1.5] [--rounds 3]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kiln/compiler/artifact.h"
#include "kiln/ir/parser.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/serve/internal/test_client.h"
#include "kiln/serve/server.h"

namespace kiln::serve {
namespace {

constexpr int kIn = 256, kHidden = 1024, kOut = 10;

std::string Program() {
  char buf[2048];
  snprintf(buf, sizeof(buf), R"(graph @mlp {
  %%0 = parameter() {index=0, name="w1"} : f32[%d,%d]
  %%1 = parameter() {index=1, name="b1"} : f32[%d]
  %%2 = parameter() {index=2, name="w2"} : f32[%d,%d]
  %%3 = parameter() {index=3, name="b2"} : f32[%d]
  %%4 = parameter() {index=4, name="w3"} : f32[%d,%d]
  %%5 = parameter() {index=5, name="x"} : f32[1,%d]
  %%6 = dot_general(%%5, %%0) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[1,%d]
  %%7 = broadcast_in_dim(%%1) {broadcast_dimensions=[1], shape=[1,%d]} : f32[1,%d]
  %%8 = add(%%6, %%7) : f32[1,%d]
  %%9 = relu(%%8) : f32[1,%d]
  %%10 = dot_general(%%9, %%2) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[1,%d]
  %%11 = broadcast_in_dim(%%3) {broadcast_dimensions=[1], shape=[1,%d]} : f32[1,%d]
  %%12 = add(%%10, %%11) : f32[1,%d]
  %%13 = relu(%%12) : f32[1,%d]
  %%14 = dot_general(%%13, %%4) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]} : f32[1,%d]
  return logits=%%14
}
)",
           kIn, kHidden, kHidden, kHidden, kHidden, kHidden, kHidden, kOut, kIn, kHidden, kHidden,
           kHidden, kHidden, kHidden, kHidden, kHidden, kHidden, kHidden, kHidden, kOut);
  return buf;
}

Tensor Filled(Shape s, float scale) {
  Tensor t(DType::kF32, std::move(s));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = scale * ((i % 13) - 6);
  return t;
}

struct Result {
  double rps = 0, p50_us = 0, p99_us = 0;
};

Result Load(int port, int concurrency, double seconds, const std::string& path,
            const std::string& body) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> lat(concurrency);
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      testing::TestClient client(port);
      while (!stop.load()) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = client.Send(body.empty() ? "GET" : "POST", path, body);
        if (r.status != 200) {
          fprintf(stderr, "status %d: %s\n", r.status, r.body.c_str());
          return;
        }
        lat[c].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  Result r;
  if (all.empty()) return r;
  r.rps = all.size() / seconds;
  r.p50_us = all[all.size() / 2];
  r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  double seconds = 1.5;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
  }
  const std::string dir = "/tmp/kiln_serve_bench_mlp";
  auto g = ir::ParseGraph(Program());
  if (!g.ok()) return fprintf(stderr, "%s\n", std::string(g.status().message()).c_str()), 1;
  compiler::ArtifactOptions ao;
  ao.overwrite = true;
  absl::Status w = compiler::WriteArtifact(dir, *g,
                                           {{"w1", Filled(Shape{kIn, kHidden}, 0.01f)},
                                            {"b1", Filled(Shape{kHidden}, 0.1f)},
                                            {"w2", Filled(Shape{kHidden, kHidden}, 0.01f)},
                                            {"b2", Filled(Shape{kHidden}, 0.1f)},
                                            {"w3", Filled(Shape{kHidden, kOut}, 0.01f)}},
                                           ao);
  if (!w.ok()) return fprintf(stderr, "%s\n", std::string(w.message()).c_str()), 1;
  auto backend = runtime::MakeCpuBackend();
  ServerOptions so;
  so.http.threads = 1;
  InferenceServer server(so);
  BatchingConfig off;
  off.max_batch_size = 1;
  BatchingConfig on;
  on.max_batch_size = 16;
  on.preferred_batch_sizes = {8, 16};
  on.max_queue_delay_us = 500;
  for (auto [name, c] : {std::pair{"off", off}, std::pair{"on", on}}) {
    auto m = ServedModel::Load(dir, std::string("batch_") + name, "1", c, backend.get());
    if (!m.ok()) return fprintf(stderr, "%s\n", std::string(m.status().message()).c_str()), 1;
    server.registry().Put(std::move(*m));
  }
  if (!server.Start().ok()) return 1;
  auto echo = HttpServer::Start(HttpServerOptions{}, [](HttpRequest, HttpReplier reply) {
    reply(HttpResponse{200, "application/json", "{\"ok\":true}", {}});
  });
  if (!echo.ok()) return 1;

  std::string body =
      "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,256],\"datatype\":\"FP32\",\"data\":[";
  for (int i = 0; i < kIn; ++i) body += (i ? "," : "") + std::to_string((i % 7) * 0.125);
  body += "]}]}";
  std::map<std::string, std::vector<Result>> results;
  const std::vector<int> concurrency = {1, 8, 32};
  for (int round = 0; round < rounds; ++round) {
    results["echo c=1"].push_back(Load((*echo)->port(), 1, seconds, "/", ""));
    for (int c : concurrency) {
      for (const char* mode : {"off", "on"}) {
        results[std::string("batching ") + mode + " c=" + std::to_string(c)].push_back(Load(
            server.port(), c, seconds, std::string("/v2/models/batch_") + mode + "/infer", body));
      }
    }
  }
  printf(
      "serve_bench: MLP %d-%d-%d-%d, %d rounds of %.1f s, 1 HTTP thread, 1 instance, clients "
      "in-process (the machine is shared: treat the numbers as noisy)\n",
      kIn, kHidden, kHidden, kOut, rounds, seconds);
  printf("%-22s %22s %24s %24s\n", "config", "req/s median (range)", "p50 us median (range)",
         "p99 us median (range)");
  for (auto& [name, rs] : results) {
    std::vector<double> rps, p50, p99;
    for (const Result& r : rs) {
      rps.push_back(r.rps);
      p50.push_back(r.p50_us);
      p99.push_back(r.p99_us);
    }
    auto range = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      char b[64];
      snprintf(b, sizeof(b), "%.0f (%.0f-%.0f)", Median(v), v.front(), v.back());
      return std::string(b);
    };
    printf("%-22s %22s %24s %24s\n", name.c_str(), range(rps).c_str(), range(p50).c_str(),
           range(p99).c_str());
  }
  server.Shutdown(2000);
  (*echo)->Shutdown(1000);
  return 0;
}

}  // namespace
}  // namespace kiln::serve

int main(int argc, char** argv) { return kiln::serve::Main(argc, argv); }
