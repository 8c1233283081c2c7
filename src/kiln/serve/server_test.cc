// The inference server over 127.0.0.1 (port 0): every endpoint, every error code, keep-alive,
// the binary extension, metrics, the access log, the repository API, fuzzed bodies.
#include "kiln/serve/server.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "kiln/http/internal/test_client.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/serve/internal/job_gate.h"
#include "kiln/serve/internal/test_model.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"

namespace kiln::serve {
namespace {

using json = nlohmann::json;
using http::testing::ClientResponse;
using http::testing::TestClient;
using testing::JobGate;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::MakeTempDir("server_test");
    ASSERT_TRUE(testing::WriteTestMlp(dir_ + "/mlp").ok());
    backend_ = runtime::MakeCpuBackend();
    ServerOptions o;
    o.http.max_body_bytes = 256 << 10;
    o.http.threads = 2;
    o.access_log = &log_;
    o.server_version = "test";
    server_ = std::make_unique<InferenceServer>(o);
    BatchingConfig c;
    c.max_batch_size = 8;
    c.preferred_batch_sizes = {4};
    c.max_queue_delay_us = 500;
    auto m = ServedModel::Load(dir_ + "/mlp", "mlp", "1", c, backend_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    server_->registry().Put(std::move(*m));
    // A model that never fills a batch by itself: one queue slot, a 10 s delay.
    BatchingConfig slow = c;
    slow.preferred_batch_sizes = {8};
    slow.max_queue_delay_us = 10000000;
    slow.max_queue_size = 1;
    auto s = ServedModel::Load(dir_ + "/mlp", "slow", "1", slow, backend_.get(), &slow_clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_->registry().Put(std::move(*s));
    ASSERT_TRUE(server_->Start().ok());
    port_ = server_->port();
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { server_->Shutdown(5000); }

  // Logits of the artifact run directly (batch 2, row 0).
  std::vector<double> Direct(const std::vector<float>& row) {
    auto a = compiler::LoadArtifact(dir_ + "/mlp");
    auto exe = backend_->Compile(a->program);
    Tensor x(DType::kF32, Shape{2, 4});
    for (int j = 0; j < 4; ++j) x.SetDouble(j, row[j]);
    auto outs = (*exe)->Run(*a->BindInputs({{"x", x}}));
    return {(*outs)[0].GetDouble(0), (*outs)[0].GetDouble(1), (*outs)[0].GetDouble(2)};
  }

  std::string dir_;
  std::unique_ptr<runtime::Backend> backend_;
  std::ostringstream log_;
  ManualClock slow_clock_{0};  // "slow"'s batcher: its timeouts pass when a test says so
  std::unique_ptr<InferenceServer> server_;
  int port_ = 0;
};

const char kInfer[] = R"({"id":"req-7","inputs":[{"name":"x","shape":[2,4],"datatype":"FP32",)"
                      R"("data":[[0.5,-1,2,0.25],[1,1,1,1]]}]})";

TEST_F(ServerTest, EveryEndpointOnOneKeepAliveConnection) {
  TestClient c(port_);
  ASSERT_TRUE(c.connected());
  auto r = c.Send("GET", "/v2/health/live");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.keep_alive);
  EXPECT_EQ(c.Send("GET", "/v2/health/ready").status, 200);
  r = c.Send("GET", "/v2");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["name"], "kiln");
  for (const char* path : {"/v2/models/mlp", "/v2/models/mlp/versions/1"}) {
    r = c.Send("GET", path);
    ASSERT_EQ(r.status, 200) << path;
    json meta = json::parse(r.body);
    EXPECT_EQ(meta["name"], "mlp");
    EXPECT_EQ(meta["inputs"][0]["name"], "x");
    EXPECT_EQ(meta["inputs"][0]["datatype"], "FP32");
    EXPECT_EQ(meta["inputs"][0]["shape"], json::parse("[-1,4]"));
    EXPECT_EQ(meta["outputs"][1]["name"], "prediction");
    EXPECT_EQ(meta["outputs"][1]["datatype"], "INT32");
  }
  for (const char* path : {"/v2/models/mlp/ready", "/v2/models/mlp/versions/1/ready"}) {
    r = c.Send("GET", path);
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(json::parse(r.body)["ready"], true);
  }
  for (const char* path : {"/v2/models/mlp/infer", "/v2/models/mlp/versions/1/infer"}) {
    r = c.Send("POST", path, kInfer);
    ASSERT_EQ(r.status, 200) << r.body;
    json out = json::parse(r.body);
    EXPECT_EQ(out["model_name"], "mlp");
    EXPECT_EQ(out["model_version"], "1");
    EXPECT_EQ(out["id"], "req-7");
    ASSERT_EQ(out["outputs"].size(), 2u);
    EXPECT_EQ(out["outputs"][0]["shape"], json::parse("[2,3]"));
    std::vector<double> want0 = Direct({0.5f, -1, 2, 0.25f}), want1 = Direct({1, 1, 1, 1});
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(out["outputs"][0]["data"][j].get<double>(), want0[j], 1e-5);
      EXPECT_NEAR(out["outputs"][0]["data"][3 + j].get<double>(), want1[j], 1e-5);
    }
    EXPECT_EQ(out["outputs"][1]["datatype"], "INT32");
  }
  r = c.Send("GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("kiln_inference_requests_total{model=\"mlp\",version=\"1\",outcome="
                        "\"success\"} 2"),
            std::string::npos)
      << r.body;
  EXPECT_NE(r.body.find("kiln_inference_batch_size_count{model=\"mlp\",version=\"1\"}"),
            std::string::npos);
  EXPECT_NE(r.body.find("kiln_inference_queue_depth{model=\"slow\",version=\"1\"} 0"),
            std::string::npos);
  EXPECT_NE(r.body.find("kiln_inference_request_duration_seconds_bucket{model=\"mlp\""),
            std::string::npos);
  // The access log: one JSON line per request so far.
  std::istringstream lines(log_.str());
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    json l = json::parse(line);
    EXPECT_TRUE(l.contains("status"));
    ++n;
  }
  EXPECT_EQ(n, 10);  // the 9 requests above and /metrics
}

TEST_F(ServerTest, ErrorsNameWhatWasWrong) {
  TestClient c(port_);
  auto expect = [&](int status, const std::string& method, const std::string& path,
                    const std::string& body, const std::string& needle) {
    auto r = c.Send(method, path, body);
    EXPECT_EQ(r.status, status) << path << " " << body << " -> " << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_NE(e.value("error", "").find(needle), std::string::npos) << r.body;
  };
  expect(404, "GET", "/v2/models/nope", "", "unknown model 'nope'");
  expect(404, "POST", "/v2/models/nope/infer", kInfer, "unknown model");
  expect(404, "GET", "/v2/models/mlp/versions/9", "", "has no version '9'");
  expect(404, "GET", "/v2/nothing", "", "no such endpoint");
  expect(405, "GET", "/v2/models/mlp/infer", "", "use POST");
  expect(400, "POST", "/v2/models/mlp/infer", "{not json", "body");
  expect(400, "POST", "/v2/models/mlp/infer", "{}", "inputs: missing");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[1,5],"datatype":"FP32","data":[1,2,3,4,5]}]})",
         "inputs[0].shape");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[9,4],"datatype":"FP32","data":[]}]})",
         "inputs[0].data");
  // A negative dimension is named with its value (not "more than N elements").
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[1,-3],"datatype":"FP32","data":[1,2,3]}]})",
         "inputs[0].shape[1] is -3: dimensions must be >= 0");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[-9223372036854775808,4],"datatype":"FP32",)"
         R"("data":[1,2,3,4]}]})",
         "inputs[0].shape[0] is -9223372036854775808: dimensions must be >= 0");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[1,4.5],"datatype":"FP32","data":[1,2,3,4]}]})",
         "inputs[0].shape[1]: expected an integer dimension >= 0");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"INT32","data":[1,2,3,4]}]})",
         "inputs[0].datatype");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,"a",4]}]})",
         "element 2 is not a number");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"y","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})",
         "has no input 'y'");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}],)"
         R"("outputs":[{"name":"probs"}]})",
         "outputs[0].name");
  expect(400, "POST", "/v2/models/mlp/infer", R"({"parameters":{"priority":"high"},"inputs":[]})",
         "parameters.priority");
  expect(400, "POST", "/v2/models/mlp/infer",
         R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}],)"
         R"("parameters":{"priority":5}})",
         "priority 5");
  // Every error above kept the connection open.
  EXPECT_EQ(c.Send("GET", "/v2/health/live").status, 200);
}

// Path segments are percent-decoded after splitting: an escaped '/' stays in the model name.
TEST_F(ServerTest, WrongMethodIs405WithAllowAndTrailingSlashesChangeNothing) {
  TestClient c(port_);
  ClientResponse r = c.Send("GET", "/v2/models/mlp/infer");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["Allow"], "POST");
  EXPECT_NE(r.body.find("GET /v2/models/mlp/infer: use POST"), std::string::npos) << r.body;
  r = c.Send("DELETE", "/metrics");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["Allow"], "GET");
  EXPECT_EQ(c.Send("GET", "/v2/models/mlp/ready/").status, 200);
  EXPECT_EQ(c.Send("GET", "//v2//health/live").status, 200);
  EXPECT_EQ(c.Send("GET", "/v2/models/mlp/versions").status, 404);
  // Without --model-repository the repository routes are 404.
  r = c.Send("POST", "/v2/repository/index", "{}");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("no model repository"), std::string::npos) << r.body;
}

// Outcomes by code and type, never by message text; one Status -> HTTP mapping (http::).
TEST(ServerOutcomeTest, ATimeoutIsToldByItsTypeAndStatusesMapToHttpOnce) {
  EXPECT_EQ(InferenceServer::OutcomeFor(QueueTimeoutError()), Outcome::kTimeout);
  EXPECT_EQ(InferenceServer::OutcomeFor(absl::UnavailableError("timeout")), Outcome::kRejected);
  EXPECT_EQ(InferenceServer::OutcomeFor(absl::InvalidArgumentError("x")), Outcome::kBadRequest);
  EXPECT_EQ(InferenceServer::OutcomeFor(absl::InternalError("x")), Outcome::kError);
  EXPECT_EQ(InferenceServer::ErrorResponse(QueueTimeoutError()).status, 503);
  EXPECT_EQ(InferenceServer::ErrorResponse(absl::NotFoundError("x")).status, 404);
  EXPECT_EQ(InferenceServer::RepositoryJobStatus(absl::DataLossError("bad file")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(InferenceServer::RepositoryJobStatus(absl::AbortedError("busy")).code(),
            absl::StatusCode::kAborted);
}

// The server reads time through ServerOptions::clock: a clock that moves 250 us per reading
// makes a request take exactly 250 us in the access log.
TEST(ServerClockTest, RequestTimingReadsTheInjectedClock) {
  class SteppingClock : public Clock {
   public:
    int64_t NowMicros() override { return now_ += 250; }
    void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                   int64_t deadline_us) override {}

   private:
    std::atomic<int64_t> now_{0};
  } clock;
  std::ostringstream log;
  ServerOptions o;
  o.clock = &clock;
  o.access_log = &log;
  InferenceServer server(o);
  EXPECT_EQ(server.clock(), &clock);
  HttpRequest req;
  req.method = "GET";
  req.target = "/v2/health/live";
  int status = 0;
  server.Handle(std::move(req), [&](HttpResponse r) { status = r.status; });
  EXPECT_EQ(status, 200);
  EXPECT_NE(log.str().find("\"total_us\":250"), std::string::npos) << log.str();
  EXPECT_EQ(InferenceServer(ServerOptions{}).clock(), RealClock::Get());
}

// Each REST route the server has is in docs/serving.md's protocol table, as `METHOD PATTERN`.
TEST(ServerRoutesTest, DocsListEveryRoute) {
  InferenceServer server{ServerOptions{}};
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/docs/serving.md");
  ASSERT_TRUE(in.good());
  std::stringstream docs;
  docs << in.rdbuf();
  ASSERT_GE(server.Routes().size(), 13u);
  for (const http::RouteInfo& r : server.Routes()) {
    EXPECT_TRUE(r.permission.empty()) << r.pattern;  // serve has no IAM
    const std::string listed = "`" + r.method + " " + r.pattern + "`";
    EXPECT_NE(docs.str().find(listed), std::string::npos)
        << listed << " is a route of InferenceServer but docs/serving.md does not list it";
  }
}

TEST_F(ServerTest, PercentEncodedPathSegmentsAreDecoded) {
  TestClient c(port_);
  EXPECT_EQ(c.Send("GET", "/v2/models/ml%70/ready").status, 200);
  EXPECT_EQ(c.Send("GET", "/v2/models/%6Dlp/versions/%31").status, 200);
  auto r = c.Send("GET", "/v2/models/ml%2Fp");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("unknown model 'ml/p'"), std::string::npos) << r.body;
  for (const char* bad : {"/v2/models/m%zzp", "/v2/models/mlp%", "/v2/models/mlp%4"}) {
    r = c.Send("GET", bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_NE(r.body.find("has a '%' not followed by two hex digits"), std::string::npos) << r.body;
  }
}

TEST_F(ServerTest, BodyOverTheLimitIs413) {
  TestClient c(port_);
  std::string big(300 << 10, ' ');
  auto r = c.Send("POST", "/v2/models/mlp/infer", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(r.body.find("too large"), std::string::npos);
  EXPECT_FALSE(r.keep_alive);
}

TEST_F(ServerTest, QueueFullAndTimeoutAre503WithRetryAfter) {
  // The first request waits in "slow"'s one-slot queue until its 300 ms timeout passes on the
  // model's manual clock.
  std::shared_ptr<ServedModel> slow = server_->registry().Find("slow", "");
  ASSERT_NE(slow, nullptr);
  std::thread waiter([&] {
    TestClient c(port_);
    auto r = c.Send("POST", "/v2/models/slow/infer",
                    R"({"parameters":{"timeout":300000},"inputs":[{"name":"x","shape":[1,4],)"
                    R"("datatype":"FP32","data":[1,2,3,4]}]})");
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.headers["Retry-After"], "1");
    EXPECT_NE(r.body.find("timeout"), std::string::npos) << r.body;
  });
  for (int i = 0; i < 10000 && slow->queue_depth() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(slow->queue_depth(), 1);
  TestClient c(port_);
  auto r = c.Send("POST", "/v2/models/slow/infer",
                  R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.headers["Retry-After"], "1");
  EXPECT_NE(r.body.find("maximum queue size"), std::string::npos) << r.body;
  // 1 us before the timeout the worker looks and leaves it queued; at the timeout it answers.
  slow_clock_.AdvanceMicros(299999);
  const int64_t waits = slow_clock_.waits();
  for (int i = 0; i < 10000 && slow_clock_.waits() < waits + 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(slow->queue_depth(), 1);
  slow_clock_.AdvanceMicros(1);
  waiter.join();
  r = c.Send("GET", "/metrics");
  EXPECT_NE(r.body.find("{model=\"slow\",version=\"1\",outcome=\"rejected\"} 1"),
            std::string::npos);
  EXPECT_NE(r.body.find("{model=\"slow\",version=\"1\",outcome=\"timeout\"} 1"), std::string::npos);
}

TEST_F(ServerTest, BinaryTensorExtension) {
  std::string header =
      R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}],)"
      R"("outputs":[{"name":"logits","parameters":{"binary_data":true}},{"name":"prediction"}]})";
  float x[4] = {0.5f, -1, 2, 0.25f};
  std::string body = header + std::string(reinterpret_cast<const char*>(x), sizeof(x));
  TestClient c(port_);
  auto r = c.Send("POST", "/v2/models/mlp/infer", body,
                  {{"Inference-Header-Content-Length", std::to_string(header.size())}});
  ASSERT_EQ(r.status, 200) << r.body;
  const size_t n = std::stoul(r.headers["Inference-Header-Content-Length"]);
  json out = json::parse(r.body.substr(0, n));
  EXPECT_EQ(out["outputs"][0]["parameters"]["binary_data_size"], 12);
  ASSERT_EQ(r.body.size(), n + 12);
  float logits[3];
  std::memcpy(logits, r.body.data() + n, 12);
  std::vector<double> want = Direct({0.5f, -1, 2, 0.25f});
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(logits[j], want[j], 1e-5);
  EXPECT_EQ(out["outputs"][1]["data"].size(), 1u);
  // A declared size past the end of the body.
  r = c.Send("POST", "/v2/models/mlp/infer", header + "abc",
             {{"Inference-Header-Content-Length", std::to_string(header.size())}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("binary_data_size"), std::string::npos) << r.body;
  r = c.Send("POST", "/v2/models/mlp/infer", header,
             {{"Inference-Header-Content-Length", "99999"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("Inference-Header-Content-Length"), std::string::npos);
}

// Random bytes, truncations and mutations of a valid body: 4xx every time, never 500, and the
// server still answers afterwards.
TEST_F(ServerTest, FuzzedBodiesGet4xx) {
  std::mt19937 rng(11);
  TestClient c(port_);
  const std::string valid = kInfer;
  for (int i = 0; i < 300; ++i) {
    std::string body;
    switch (i % 3) {
      case 0:
        body.resize(rng() % 200);
        for (char& ch : body) ch = static_cast<char>(rng());
        break;
      case 1:
        body = valid.substr(0, rng() % valid.size());
        break;
      default:
        body = valid;
        for (int k = 0; k < 3; ++k) body[rng() % body.size()] = "{}[],:\"019-e."[rng() % 13];
    }
    std::map<std::string, std::string> h;
    if (i % 7 == 0) h["Inference-Header-Content-Length"] = std::to_string(rng() % 300);
    auto r = c.Send("POST", "/v2/models/mlp/infer", body, h);
    ASSERT_NE(r.status, 0) << "connection lost on body " << i;
    EXPECT_TRUE((r.status >= 400 && r.status < 500) || r.status == 200)
        << r.status << " for " << body;
  }
  EXPECT_EQ(c.Send("GET", "/v2/health/live").status, 200);
}

TEST(RepositoryTest, LoadReloadUnloadAndAFailedReloadKeepsServing) {
  const std::string repo = test_support::MakeTempDir("server_repo");
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/mlp/1").ok());
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/mlp/2").ok());
  {
    std::ofstream cfg(repo + "/mlp/config.yaml");
    cfg << "max_batch_size: 4\npreferred_batch_sizes: [2]\nmax_queue_delay_us: 100\n"
           "version_policy: latest\nnum_versions: 2\n";
  }
  std::filesystem::create_directories(repo + "/broken/1");
  auto backend = runtime::MakeCpuBackend();
  InferenceServer server(ServerOptions{});
  ModelRepository repository(repo, ModelConfig{}, backend.get(), &server.registry());
  ASSERT_TRUE(repository.LoadAll().ok());
  server.set_repository(&repository);
  ASSERT_TRUE(server.Start().ok());
  TestClient c(server.port());
  auto r = c.Send("POST", "/v2/repository/index", "{}");
  ASSERT_EQ(r.status, 200);
  json index = json::parse(r.body);
  ASSERT_EQ(index.size(), 3u) << r.body;  // mlp 1, mlp 2, broken (unavailable)
  EXPECT_EQ(index[0]["name"], "broken");
  EXPECT_EQ(index[0]["state"], "UNAVAILABLE");
  EXPECT_NE(index[0]["reason"].get<std::string>().find("manifest.json"), std::string::npos)
      << index[0];
  EXPECT_EQ(c.Send("GET", "/v2/models/mlp/versions/1/ready").status, 200);
  r = c.Send("POST", "/v2/repository/index", R"({"ready": true})");
  EXPECT_EQ(json::parse(r.body).size(), 2u) << r.body;  // the two ready versions only
  EXPECT_EQ(c.Send("POST", "/v2/repository/index", R"({"ready": 1})").status, 400);
  r = c.Send("GET", "/v2/models/mlp");
  EXPECT_EQ(json::parse(r.body)["versions"], json::parse(R"(["1","2"])"));
  // A bad config: the reload fails and both versions keep serving.
  {
    std::ofstream cfg(repo + "/mlp/config.yaml");
    cfg << "max_batch_size: 0\n";
  }
  r = c.Send("POST", "/v2/repository/models/mlp/load");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("max_batch_size"), std::string::npos) << r.body;
  r = c.Send("POST", "/v2/models/mlp/infer",
             R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["model_version"], "2");
  // A good config: latest 1 now.
  {
    std::ofstream cfg(repo + "/mlp/config.yaml");
    cfg << "max_batch_size: 4\nnum_versions: 1\n";
  }
  EXPECT_EQ(c.Send("POST", "/v2/repository/models/mlp/load").status, 200);
  EXPECT_EQ(c.Send("GET", "/v2/models/mlp/versions/1").status, 404);
  EXPECT_EQ(c.Send("GET", "/v2/models/mlp/versions/2").status, 200);
  EXPECT_EQ(c.Send("POST", "/v2/repository/models/mlp/unload").status, 200);
  EXPECT_EQ(c.Send("GET", "/v2/models/mlp").status, 404);
  EXPECT_EQ(c.Send("POST", "/v2/repository/models/nope/load").status, 404);
  server.Shutdown(1000);
}

// POST /v2/repository/models/{m}/load compiles on the repository's loader thread, not on the HTTP
// thread that read it: with one HTTP thread and the load held, health and inference still answer
// at once, a second load or an unload of the same model is 409, and the held load answers 200
// once it has finished, serving its new version.
TEST(RepositoryTest, ALoadRunsOffTheHttpThread) {
  const std::string repo = test_support::MakeTempDir("server_repo_async");
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/mlp/1").ok());
  auto backend = runtime::MakeCpuBackend();
  std::unique_ptr<ModelRepository> repository;  // outlives the server
  ServerOptions o;
  o.http.threads = 1;
  InferenceServer server(o);
  repository =
      std::make_unique<ModelRepository>(repo, ModelConfig{}, backend.get(), &server.registry());
  ASSERT_TRUE(repository->LoadAll().ok());
  JobGate gate;
  repository->set_job_hook_for_testing([&](const std::string& name) { gate.Enter(name); });
  server.set_repository(repository.get());
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/mlp/2").ok());
  ClientResponse held;
  std::thread loader(
      [&] { held = TestClient(server.port()).Send("POST", "/v2/repository/models/mlp/load"); });
  JobGate::Guard guard{gate, loader};
  ASSERT_TRUE(gate.WaitEntered(1));
  // On another connection, bounded (a blocking client cannot time out by itself): health, an
  // inference and a second load and an unload of the model.
  auto during = std::async(std::launch::async, [&] {
    TestClient c(server.port());
    return std::vector<ClientResponse>{
        c.Send("GET", "/v2/health/live"),
        c.Send("POST", "/v2/models/mlp/infer",
               R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})"),
        c.Send("POST", "/v2/repository/models/mlp/load"),
        c.Send("POST", "/v2/repository/models/mlp/unload")};
  });
  // Loose (the machine may be loaded): the HTTP thread is not waiting for the held load.
  const bool prompt = during.wait_for(std::chrono::seconds(8)) == std::future_status::ready;
  if (!prompt) gate.Release();  // so that `during` can finish
  ASSERT_TRUE(prompt) << "the one HTTP thread did not answer while a load was held";
  const std::vector<ClientResponse> r = during.get();
  EXPECT_EQ(r[0].status, 200);
  EXPECT_EQ(r[1].status, 200) << r[1].body;
  EXPECT_EQ(json::parse(r[1].body, nullptr, false).value("model_version", ""), "1");  // not yet 2
  EXPECT_EQ(r[2].status, 409) << r[2].body;
  EXPECT_NE(r[2].body.find("model 'mlp' is already loading or unloading"), std::string::npos)
      << r[2].body;
  EXPECT_EQ(r[3].status, 409) << r[3].body;
  gate.Release();
  loader.join();
  EXPECT_EQ(held.status, 200) << held.body;
  EXPECT_EQ(gate.entered(), std::vector<std::string>{"mlp"});  // the refused ones never ran
  TestClient c(server.port());
  ClientResponse after =
      c.Send("POST", "/v2/models/mlp/infer",
             R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]})");
  EXPECT_EQ(json::parse(after.body, nullptr, false).value("model_version", ""), "2") << after.body;
  // The model is free again once answered.
  EXPECT_EQ(c.Send("POST", "/v2/repository/models/mlp/load").status, 200);
  server.Shutdown(1000);
}

// Shutdown while a load runs and another waits behind it: the waiting one is answered 503 at
// once (never started), the running one finishes and answers before the server stops.
TEST(RepositoryTest, ShutdownRefusesQueuedLoadsAndFinishesTheRunningOne) {
  const std::string repo = test_support::MakeTempDir("server_repo_shutdown");
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/a/1").ok());
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/b/1").ok());
  auto backend = runtime::MakeCpuBackend();
  std::unique_ptr<ModelRepository> repository;
  InferenceServer server(ServerOptions{});
  repository =
      std::make_unique<ModelRepository>(repo, ModelConfig{}, backend.get(), &server.registry());
  JobGate gate;
  repository->set_job_hook_for_testing([&](const std::string& name) { gate.Enter(name); });
  server.set_repository(repository.get());
  ASSERT_TRUE(server.Start().ok());
  ClientResponse ra, rb;
  std::thread ta, tb, stopper;
  JobGate::Guard ga{gate, ta}, gb{gate, tb}, gs{gate, stopper};
  ta = std::thread(
      [&] { ra = TestClient(server.port()).Send("POST", "/v2/repository/models/a/load"); });
  ASSERT_TRUE(gate.WaitEntered(1));
  tb = std::thread(
      [&] { rb = TestClient(server.port()).Send("POST", "/v2/repository/models/b/load"); });
  // b waits behind a once the server has read its request.
  for (int i = 0; i < 4000 && repository->jobs() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(repository->jobs(), 2);
  stopper = std::thread([&] { server.Shutdown(10000); });
  tb.join();
  EXPECT_EQ(rb.status, 503) << rb.body;
  EXPECT_NE(rb.body.find("shutting down: model 'b' was not loaded"), std::string::npos) << rb.body;
  gate.Release();
  ta.join();
  stopper.join();
  EXPECT_EQ(ra.status, 200) << ra.body;
  EXPECT_EQ(gate.entered(), std::vector<std::string>{"a"});
}

TEST(ModelConfigTest, UnknownKeysAndBadTypesAreNamed) {
  auto c = ParseModelConfig("max_batch: 3\n", "m/config.yaml", ModelConfig{});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("unknown key 'max_batch'"), std::string::npos);
  c = ParseModelConfig("instances: many\n", "m/config.yaml", ModelConfig{});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("m/config.yaml:1: instances"), std::string::npos)
      << c.status();
  c = ParseModelConfig("version_policy: specific\nversions: [1, 3]\n", "x", ModelConfig{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Select({1, 2, 3, 4}), (std::vector<int64_t>{1, 3}));
}

}  // namespace
}  // namespace kiln::serve
