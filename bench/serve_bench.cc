// `make bench-serve`: `kiln serve`'s request path and compute, written to bench/out/serve.json
// with a table on stdout (docs/serving.md, "Measured").
//
// Serving (an in-process InferenceServer on 127.0.0.1, 2 HTTP threads, 1 instance; load generated
// by clients in the same process over keep-alive connections, so clients and server share the
// machine's cores):
//   - overhead: a tiny model (16 floats in, x + x out, batch 1, no batching) at concurrency 1
//     against a bare Beast server (HttpServer) echoing the same body, in the same rounds: the
//     added p50 and p99;
//   - closed loop at c = 1, 8, 64 on an MLP 256-1024-1024-10 exported at batch 1 and served with
//     the batcher (max batch 16, no queue delay: batches form from what queues while a batch
//     runs, queue limit 128): req/s and p50/p95/p99;
//   - batching's payoff: the same at c = 64 with max batch 1;
//   - open-loop Poisson arrivals at 50% and 90% of the saturation throughput (the best closed-loop
//     req/s), and at 200%: the share of 503s (and that each carries Retry-After), p99 of the
//     served requests, and that the server still answers /v2/health/live afterwards. Open-loop
//     latency counts from each request's scheduled arrival, so a generator that falls behind
//     shows as latency (no coordinated omission).
// Compute (serve_compute.h): Kiln against ONNX Runtime on the same weights, and int8 against f32,
// with the machine's roofline measured in the same run (roofline.h) and what ORT's kernels run
// (perf samples of the peer; --no-peer-kernels skips it).
//
//   build/bench/serve_bench [--seconds 2] [--rounds 3] [--threads 2] [--out bench/out/serve.json]
//                           [--skip-serve] [--skip-compute] [--profile] [--no-peer-kernels]
#include <omp.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/cpu_isa_env.h"
#include "bench/serve_compute.h"
#include "bench/timing.h"
#include "kiln/compiler/artifact.h"
#include "kiln/http/internal/test_client.h"
#include "kiln/ir/parser.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/runtime/cpu/machine.h"
#include "kiln/serve/server.h"
#include "nlohmann/json.hpp"

namespace kiln::serve {
namespace {

using nlohmann::json;

constexpr int kIn = 256, kHidden = 1024, kOut = 10, kTiny = 16;

std::string MlpProgram() {
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

std::string TinyProgram() {
  return R"(graph @tiny {
  %0 = parameter() {index=0, name="x"} : f32[1,16]
  %1 = add(%0, %0) : f32[1,16]
  return y=%1
}
)";
}

Tensor Filled(Shape s, float scale) {
  Tensor t(DType::kF32, std::move(s));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = scale * ((i % 13) - 6);
  return t;
}

std::string InferBody(int n) {
  std::string body = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1," + std::to_string(n) +
                     "],\"datatype\":\"FP32\",\"data\":[";
  for (int i = 0; i < n; ++i) body += (i ? "," : "") + std::to_string((i % 7) * 0.125);
  return body + "]}]}";
}

// Latency percentiles of one load run, and what came back.
struct Result {
  double seconds = 0, rps = 0, p50_us = 0, p95_us = 0, p99_us = 0;
  int64_t ok = 0, rejected = 0, rejected_with_retry_after = 0, other = 0;
  double offered_rps = 0;  // open loop: the arrival rate asked for
};

void Summarize(std::vector<double>& lat, Result& r) {
  std::sort(lat.begin(), lat.end());
  if (lat.empty()) return;
  auto at = [&](double q) { return lat[std::min(lat.size() - 1, size_t(q * lat.size()))]; };
  r.p50_us = at(0.50);
  r.p95_us = at(0.95);
  r.p99_us = at(0.99);
}

struct Tally {
  std::mutex mu;
  std::vector<double> ok_lat;
  Result r;
  void Add(const http::testing::ClientResponse& resp, double us) {
    std::lock_guard<std::mutex> l(mu);
    if (resp.status == 200) {
      ++r.ok;
      ok_lat.push_back(us);
    } else if (resp.status == 503) {
      ++r.rejected;
      if (resp.headers.count("Retry-After")) ++r.rejected_with_retry_after;
    } else {
      ++r.other;
    }
  }
};

// Closed loop: `concurrency` clients, each sends its next request when the last one is answered.
Result ClosedLoop(int port, int concurrency, double seconds, const std::string& path,
                  const std::string& body) {
  std::atomic<bool> stop{false};
  Tally tally;
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      http::testing::TestClient client(port);
      while (!stop.load()) {
        const double t0 = bench::Seconds();
        auto resp = client.Send(body.empty() ? "GET" : "POST", path, body);
        tally.Add(resp, (bench::Seconds() - t0) * 1e6);
        if (resp.status == 0) return;
      }
    });
  }
  const double start = bench::Seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  Result r = tally.r;
  r.seconds = bench::Seconds() - start;
  r.rps = r.ok / r.seconds;
  Summarize(tally.ok_lat, r);
  return r;
}

// Open loop: Poisson arrivals at `rate` per second for `seconds`, served by a pool of `clients`
// connections; latency counts from the scheduled arrival.
Result OpenLoop(int port, double rate, double seconds, int clients, const std::string& path,
                const std::string& body, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<double> arrivals;
  for (double t = gap(rng); t < seconds; t += gap(rng)) arrivals.push_back(t);
  std::atomic<size_t> next{0};
  Tally tally;
  const double start = bench::Seconds() + 0.01;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      std::unique_ptr<http::testing::TestClient> client;
      for (;;) {
        const size_t i = next.fetch_add(1);
        if (i >= arrivals.size()) return;
        const double when = start + arrivals[i];
        const double now = bench::Seconds();
        if (when > now) std::this_thread::sleep_for(std::chrono::duration<double>(when - now));
        if (!client) client = std::make_unique<http::testing::TestClient>(port);
        auto resp = client->Send("POST", path, body);
        tally.Add(resp, (bench::Seconds() - when) * 1e6);
        if (resp.status == 0 || !resp.keep_alive) client.reset();
      }
    });
  }
  for (auto& t : threads) t.join();
  Result r = tally.r;
  r.seconds = bench::Seconds() - start;
  r.rps = r.ok / r.seconds;
  r.offered_rps = rate;
  Summarize(tally.ok_lat, r);
  return r;
}

double Median(std::vector<double> v) { return bench::Median(std::move(v)); }

json ToJson(const std::vector<Result>& rs) {
  std::vector<double> rps, p50, p95, p99;
  int64_t ok = 0, rej = 0, rej_ra = 0, other = 0;
  for (const Result& r : rs) {
    rps.push_back(r.rps);
    p50.push_back(r.p50_us);
    p95.push_back(r.p95_us);
    p99.push_back(r.p99_us);
    ok += r.ok;
    rej += r.rejected;
    rej_ra += r.rejected_with_retry_after;
    other += r.other;
  }
  json j = {
      {"rps", Median(rps)},
      {"p50_us", Median(p50)},
      {"p95_us", Median(p95)},
      {"p99_us", Median(p99)},
      {"rps_range",
       {*std::min_element(rps.begin(), rps.end()), *std::max_element(rps.begin(), rps.end())}},
      {"p50_us_range",
       {*std::min_element(p50.begin(), p50.end()), *std::max_element(p50.begin(), p50.end())}},
      {"ok", ok},
      {"rejected_503", rej},
      {"rejected_503_with_retry_after", rej_ra},
      {"other_status", other},
      {"rounds", rs.size()}};
  if (!rs.empty() && rs[0].offered_rps > 0) j["offered_rps"] = rs[0].offered_rps;
  return j;
}

void PrintRow(const std::string& name, const json& j) {
  printf("%-34s %10.0f %10.0f %10.0f %10.0f", name.c_str(), j["rps"].get<double>(),
         j["p50_us"].get<double>(), j["p95_us"].get<double>(), j["p99_us"].get<double>());
  const int64_t total =
      j["ok"].get<int64_t>() + j["rejected_503"].get<int64_t>() + j["other_status"].get<int64_t>();
  if (j["rejected_503"].get<int64_t>() > 0 || j["other_status"].get<int64_t>() > 0)
    printf("   503: %.1f%% (%lld with Retry-After), other: %lld",
           100.0 * j["rejected_503"].get<int64_t>() / std::max<int64_t>(total, 1),
           static_cast<long long>(j["rejected_503_with_retry_after"].get<int64_t>()),
           static_cast<long long>(j["other_status"].get<int64_t>()));
  printf("\n");
  fflush(stdout);
}

absl::Status WriteModels(const std::string& root) {
  auto g = ir::ParseGraph(MlpProgram());
  if (!g.ok()) return g.status();
  compiler::ArtifactOptions ao;
  ao.overwrite = true;
  absl::Status w = compiler::WriteArtifact(root + "/mlp", *g,
                                           {{"w1", Filled(Shape{kIn, kHidden}, 0.01f)},
                                            {"b1", Filled(Shape{kHidden}, 0.1f)},
                                            {"w2", Filled(Shape{kHidden, kHidden}, 0.01f)},
                                            {"b2", Filled(Shape{kHidden}, 0.1f)},
                                            {"w3", Filled(Shape{kHidden, kOut}, 0.01f)}},
                                           ao);
  if (!w.ok()) return w;
  auto tiny = ir::ParseGraph(TinyProgram());
  if (!tiny.ok()) return tiny.status();
  return compiler::WriteArtifact(root + "/tiny", *tiny, {}, ao);
}

// The three served models: the tiny one (overhead), the MLP with the batcher and without it.
absl::Status LoadModels(InferenceServer& server, const std::string& root,
                        runtime::Backend* backend) {
  BatchingConfig tiny;
  tiny.max_batch_size = 1;
  BatchingConfig off;
  off.max_batch_size = 1;
  off.max_queue_size = 128;
  BatchingConfig on;
  on.max_batch_size = 16;
  on.max_queue_size = 128;
  struct M {
    const char* name;
    const char* dir;
    BatchingConfig c;
  };
  for (const M& m :
       {M{"tiny", "tiny", tiny}, M{"mlp_unbatched", "mlp", off}, M{"mlp", "mlp", on}}) {
    auto sm = ServedModel::Load(root + "/" + m.dir, m.name, "1", m.c, backend);
    if (!sm.ok()) return sm.status();
    server.registry().Put(std::move(*sm));
  }
  return absl::OkStatus();
}

const char kMlpPath[] = "/v2/models/mlp/infer";
const std::vector<int> kConcurrency = {1, 8, 64};

// Closed loop, `rounds` rounds: the echo and the tiny model alternate within each round (the
// overhead is their difference), then the MLP at each concurrency, with and without batching.
json ClosedLoopRows(int server_port, int echo_port, double seconds, int rounds) {
  const std::string tiny_body = InferBody(kTiny), mlp_body = InferBody(kIn);
  std::map<std::string, std::vector<Result>> res;
  for (int round = 0; round < rounds; ++round) {
    res["echo"].push_back(ClosedLoop(echo_port, 1, seconds / 2, "/echo", tiny_body));
    res["tiny"].push_back(
        ClosedLoop(server_port, 1, seconds / 2, "/v2/models/tiny/infer", tiny_body));
    for (int c : kConcurrency)
      res["mlp c=" + std::to_string(c)].push_back(
          ClosedLoop(server_port, c, seconds, kMlpPath, mlp_body));
    res["mlp_unbatched c=64"].push_back(
        ClosedLoop(server_port, 64, seconds, "/v2/models/mlp_unbatched/infer", mlp_body));
  }
  json rows;
  for (auto& [name, rs] : res) rows[name] = ToJson(rs);
  PrintRow("bare Beast echo, 16 floats, c=1", rows["echo"]);
  PrintRow("tiny model (16 floats), c=1", rows["tiny"]);
  for (int c : kConcurrency)
    PrintRow("mlp, batcher, c=" + std::to_string(c), rows["mlp c=" + std::to_string(c)]);
  PrintRow("mlp, max batch 1, c=64", rows["mlp_unbatched c=64"]);
  return rows;
}

// The server's overhead over the echo and batching's payoff (into `out`); returns the
// saturation throughput (the best closed-loop req/s of the batched MLP).
double ReportClosedLoop(json& rows, json* out) {
  json overhead = {
      {"p50_us", rows["tiny"]["p50_us"].get<double>() - rows["echo"]["p50_us"].get<double>()},
      {"p99_us", rows["tiny"]["p99_us"].get<double>() - rows["echo"]["p99_us"].get<double>()},
      {"target_p50_us", 50}};
  overhead["meets_target"] = overhead["p50_us"].get<double>() <= 50;
  (*out)["overhead"] = overhead;
  printf(
      "server overhead over the bare echo at c=1: p50 %+.0f us, p99 %+.0f us (target p50 <= 50)\n",
      overhead["p50_us"].get<double>(), overhead["p99_us"].get<double>());

  double saturation = 0;
  for (int c : kConcurrency)
    saturation = std::max(saturation, rows["mlp c=" + std::to_string(c)]["rps"].get<double>());
  const double on64 = rows["mlp c=64"]["rps"].get<double>();
  const double off64 = rows["mlp_unbatched c=64"]["rps"].get<double>();
  (*out)["batching_payoff_c64"] = {
      {"with_batcher_rps", on64}, {"max_batch_1_rps", off64}, {"ratio", on64 / off64}};
  printf("batching's payoff at c=64: %.2fx the throughput (%.0f vs %.0f req/s)\n", on64 / off64,
         on64, off64);
  return saturation;
}

// Open loop: Poisson arrivals at 50%, 90% and 200% of `saturation`.
json OpenLoopRows(int server_port, double saturation, double seconds, int rounds) {
  const std::string mlp_body = InferBody(kIn);
  std::map<std::string, std::vector<Result>> open;
  for (int round = 0; round < rounds; ++round) {
    for (double f : {0.5, 0.9, 2.0}) {
      const int clients = f > 1 ? 192 : 96;
      open["poisson " + std::to_string(int(f * 100)) + "%"].push_back(
          OpenLoop(server_port, f * saturation, seconds, clients, kMlpPath, mlp_body, 17 + round));
    }
  }
  json orows;
  for (auto& [name, rs] : open) orows[name] = ToJson(rs);
  for (const char* n : {"poisson 50%", "poisson 90%", "poisson 200%"})
    PrintRow(std::string("mlp, open loop, ") + (n + 8) + " of saturation", orows[n]);
  return orows;
}

// At 2x saturation: how much was refused (503 with Retry-After) and whether the server lives.
json Overload(const json& over, bool alive) {
  const int64_t total = over["ok"].get<int64_t>() + over["rejected_503"].get<int64_t>() +
                        over["other_status"].get<int64_t>();
  json o = {
      {"share_503", double(over["rejected_503"].get<int64_t>()) / std::max<int64_t>(total, 1)},
      {"all_503_have_retry_after",
       over["rejected_503"].get<int64_t>() == over["rejected_503_with_retry_after"].get<int64_t>()},
      {"other_status", over["other_status"].get<int64_t>()},
      {"served_p99_us", over["p99_us"]},
      {"server_alive_after", alive}};
  printf(
      "at 2x saturation: %.1f%% answered 503 (all with Retry-After: %s), served p99 %.0f us, "
      "server alive after: %s\n",
      100 * o["share_503"].get<double>(), o["all_503_have_retry_after"].get<bool>() ? "yes" : "NO",
      over["p99_us"].get<double>(), alive ? "yes" : "NO");
  return o;
}

json RunServeBench(double seconds, int rounds) {
  json out;
  const std::string root = "/tmp/kiln_serve_bench_models";
  absl::Status w = WriteModels(root);
  if (!w.ok()) return {{"error", std::string(w.message())}};
  auto backend = runtime::MakeCpuBackend();
  ServerOptions so;
  so.http.threads = 2;
  InferenceServer server(so);
  if (absl::Status s = LoadModels(server, root, backend.get()); !s.ok())
    return {{"error", std::string(s.message())}};
  if (!server.Start().ok()) return {{"error", "server did not start"}};
  HttpServerOptions eo;
  eo.threads = 2;
  auto echo = HttpServer::Start(eo, [](HttpRequest req, HttpReplier reply) {
    reply(HttpResponse{200, "application/json", std::move(req.body), {}});
  });
  if (!echo.ok()) return {{"error", "echo server did not start"}};
  printf(
      "serve: in-process server on 127.0.0.1 (2 HTTP threads, 1 instance), clients in the same "
      "process, %d rounds of %.1f s, medians (the machine is shared: noisy)\n",
      rounds, seconds);
  printf("%-34s %10s %10s %10s %10s\n", "config", "req/s", "p50 us", "p95 us", "p99 us");

  json rows = ClosedLoopRows(server.port(), (*echo)->port(), seconds, rounds);
  const double saturation = ReportClosedLoop(rows, &out);
  json orows = OpenLoopRows(server.port(), saturation, seconds, rounds);
  http::testing::TestClient probe(server.port());
  const bool alive = probe.Send("GET", "/v2/health/live").status == 200;
  out["overload_2x"] = Overload(orows["poisson 200%"], alive);
  out["saturation_rps"] = saturation;
  out["closed_loop"] = rows;
  out["open_loop"] = orows;
  out["setup"] = {{"mlp", "256-1024-1024-10, exported at batch 1"},
                  {"batcher", "max batch 16, no queue delay, queue limit 128, 1 instance"},
                  {"http_threads", 2},
                  {"rounds", rounds},
                  {"seconds", seconds}};
  server.Shutdown(2000);
  (*echo)->Shutdown(1000);
  return out;
}

int Main(int argc, char** argv) {
  double seconds = 2;
  int rounds = 3, threads = 2;
  std::string out_path = "bench/out/serve.json";
  bool serve = true, compute = true, profile = false, peer_kernels = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--seconds") {
      seconds = atof(next().c_str());
    } else if (a == "--rounds") {
      rounds = std::max(1, atoi(next().c_str()));
    } else if (a == "--threads") {
      threads = std::max(1, atoi(next().c_str()));
    } else if (a == "--out") {
      out_path = next();
    } else if (a == "--skip-serve") {
      serve = false;
    } else if (a == "--skip-compute") {
      compute = false;
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--no-peer-kernels") {
      peer_kernels = false;
    } else {
      fprintf(stderr, "serve_bench: unknown flag '%s'\n", a.c_str());
      return 2;
    }
  }
  // A peer that failed to start (no node) must not kill us on the first write to its pipe.
  signal(SIGPIPE, SIG_IGN);
  omp_set_num_threads(threads);
  json out = {{"bench", "serve"},
              {"isa", runtime::OneDnnIsaName()},
              {"threads", threads},
              {"hardware_threads", std::thread::hardware_concurrency()}};
  if (serve) out["serve"] = RunServeBench(seconds, rounds);
  if (compute) {
    bench::ComputeBenchOptions co;
    co.threads = threads;
    co.rounds = std::max(rounds, 3) + 2;
    co.profile = profile;
    co.peer_kernels = peer_kernels;
    json machine;
    out["compute"] = bench::RunComputeBench(co, &machine);
    out["compute_roofline_machine"] = machine;
  }
  std::ofstream f(out_path);
  f << out.dump(2) << "\n";
  if (!f) {
    fprintf(stderr, "serve_bench: cannot write %s\n", out_path.c_str());
    return 1;
  }
  printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace
}  // namespace kiln::serve

int main(int argc, char** argv) {
  // KILN_CPU_ISA first: the level is decided before any kernel or oneDNN call.
  if (int rc = kiln::bench::ApplyCpuIsaEnvironment("serve_bench"); rc != 0) return rc;
  return kiln::serve::Main(argc, argv);
}
