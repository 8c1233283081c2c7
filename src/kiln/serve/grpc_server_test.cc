// The gRPC service over 127.0.0.1 (port 0) beside the REST server, with the generated stub:
// health and metadata, ModelInfer with typed and raw contents equal to REST's answers, errors
// and their codes (never INTERNAL for bad input, also over randomly mangled requests), gRPC and
// REST requests batched together in one batch, metrics, and a drain that answers a queued call.
#include "kiln/serve/grpc_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "kiln/http/internal/test_client.h"
#include "kiln/runtime/cpu/cpu_backend.h"
#include "kiln/serve/grpc_convert.h"
#include "kiln/serve/internal/grpc_test_util.h"
#include "kiln/serve/internal/job_gate.h"
#include "kiln/serve/internal/test_model.h"
#include "kiln/serve/proto/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/support/temp_dir.h"

namespace kiln::serve {
namespace {

using json = nlohmann::json;
using Stub = inference::GRPCInferenceService::Stub;

constexpr int64_t kMaxMessage = 64 << 10;

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::MakeTempDir("grpc_server_test");
    ASSERT_TRUE(testing::WriteTestMlp(dir_ + "/mlp").ok());
    backend_ = runtime::MakeCpuBackend();
    ServerOptions o;
    o.server_version = "test";
    o.max_input_elements = 1 << 20;
    o.access_log = &log_;
    server_ = std::make_unique<InferenceServer>(o);
    BatchingConfig c;
    c.max_batch_size = 8;
    c.preferred_batch_sizes = {4};
    c.max_queue_delay_us = 500;
    Add("mlp", c);
    // Never fills a batch by itself: one queue slot, a 10 s delay.
    BatchingConfig slow = c;
    slow.preferred_batch_sizes = {8};
    slow.max_queue_delay_us = 10000000;
    slow.max_queue_size = 1;
    Add("slow", slow, &slow_clock_);  // its timeouts pass when a test says so
    // Four single-row requests fill its preferred batch; alone, one would wait 20 s.
    BatchingConfig batchy = c;
    batchy.max_queue_delay_us = 20000000;
    Add("batchy", batchy);
    ASSERT_TRUE(server_->Start().ok());
    GrpcServerOptions g;
    g.max_message_bytes = kMaxMessage;
    auto grpc = GrpcServer::Start(server_.get(), g);
    ASSERT_TRUE(grpc.ok()) << grpc.status();
    grpc_ = std::move(*grpc);
    ASSERT_GT(grpc_->port(), 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = inference::GRPCInferenceService::NewStub(channel_);
  }
  void TearDown() override {
    server_->Shutdown(5000);
    grpc_.reset();
  }

  void Add(const std::string& name, const BatchingConfig& c, Clock* clock = nullptr) {
    auto m = ServedModel::Load(dir_ + "/mlp", name, "1", c, backend_.get(), clock);
    ASSERT_TRUE(m.ok()) << m.status();
    server_->registry().Put(std::move(*m));
  }

  // Logits of the artifact run directly (batch 2, row 0).
  std::vector<float> Direct(const std::vector<float>& row) {
    auto a = compiler::LoadArtifact(dir_ + "/mlp");
    auto exe = backend_->Compile(a->program);
    Tensor x(DType::kF32, Shape{2, 4});
    for (int j = 0; j < 4; ++j) x.data<float>()[j] = row[j];
    auto outs = (*exe)->Run(*a->BindInputs({{"x", x}}));
    const float* l = (*outs)[0].data<float>();
    return {l[0], l[1], l[2]};
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }

  grpc::Status Infer(const inference::ModelInferRequest& req, inference::ModelInferResponse* resp) {
    auto ctx = Context();
    return stub_->ModelInfer(ctx.get(), req, resp);
  }

  std::string Metrics() {
    return http::testing::TestClient(server_->port()).Send("GET", "/metrics").body;
  }

  std::string dir_;
  std::unique_ptr<runtime::Backend> backend_;
  std::ostringstream log_;
  ManualClock slow_clock_{0};  // "slow"'s batcher
  std::unique_ptr<InferenceServer> server_;
  std::unique_ptr<GrpcServer> grpc_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
};

using testing::kRows;
using testing::Request;

TEST_F(GrpcServerTest, HealthAndMetadata) {
  {
    inference::ServerLiveResponse r;
    auto ctx = Context();
    ASSERT_TRUE(stub_->ServerLive(ctx.get(), {}, &r).ok());
    EXPECT_TRUE(r.live());
  }
  {
    inference::ServerReadyResponse r;
    auto ctx = Context();
    ASSERT_TRUE(stub_->ServerReady(ctx.get(), {}, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  {
    inference::ServerMetadataResponse r;
    auto ctx = Context();
    ASSERT_TRUE(stub_->ServerMetadata(ctx.get(), {}, &r).ok());
    EXPECT_EQ(r.name(), "kiln");
    EXPECT_EQ(r.version(), "test");
    ASSERT_GE(r.extensions_size(), 1);
    EXPECT_EQ(r.extensions(0), "binary_tensor_data");
  }
  for (const char* version : {"", "1"}) {
    inference::ModelReadyRequest q;
    q.set_name("mlp");
    q.set_version(version);
    inference::ModelReadyResponse r;
    auto ctx = Context();
    ASSERT_TRUE(stub_->ModelReady(ctx.get(), q, &r).ok());
    EXPECT_TRUE(r.ready());
    inference::ModelMetadataRequest mq;
    mq.set_name("mlp");
    mq.set_version(version);
    inference::ModelMetadataResponse m;
    auto ctx2 = Context();
    ASSERT_TRUE(stub_->ModelMetadata(ctx2.get(), mq, &m).ok());
    EXPECT_EQ(m.name(), "mlp");
    EXPECT_EQ(m.platform(), "kiln");
    ASSERT_EQ(m.versions_size(), 1);
    EXPECT_EQ(m.versions(0), "1");
    ASSERT_EQ(m.inputs_size(), 1);
    EXPECT_EQ(m.inputs(0).name(), "x");
    EXPECT_EQ(m.inputs(0).datatype(), "FP32");
    ASSERT_EQ(m.inputs(0).shape_size(), 2);
    EXPECT_EQ(m.inputs(0).shape(0), -1);
    EXPECT_EQ(m.inputs(0).shape(1), 4);
    ASSERT_EQ(m.outputs_size(), 2);
    EXPECT_EQ(m.outputs(0).name(), "logits");
    EXPECT_EQ(m.outputs(1).name(), "prediction");
    EXPECT_EQ(m.outputs(1).datatype(), "INT32");
  }
  inference::ModelReadyRequest q;
  q.set_name("nope");
  inference::ModelReadyResponse r;
  auto ctx = Context();
  grpc::Status s = stub_->ModelReady(ctx.get(), q, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "unknown model 'nope'");
  inference::ModelMetadataRequest mq;
  mq.set_name("mlp");
  mq.set_version("9");
  inference::ModelMetadataResponse m;
  auto ctx2 = Context();
  s = stub_->ModelMetadata(ctx2.get(), mq, &m);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "model 'mlp' has no version '9' (versions: 1)");
}

TEST_F(GrpcServerTest, InferTypedAndRawEqualRest) {
  // REST's answer for the same rows.
  http::testing::TestClient c(server_->port());
  auto rest = c.Send("POST", "/v2/models/mlp/infer",
                     R"({"inputs":[{"name":"x","shape":[2,4],"datatype":"FP32",)"
                     R"("data":[0.5,-1,2,0.25,1,1,1,1]}]})");
  ASSERT_EQ(rest.status, 200) << rest.body;
  json want = json::parse(rest.body)["outputs"];
  const std::vector<float> direct0 = Direct({0.5f, -1, 2, 0.25f}), direct1 = Direct({1, 1, 1, 1});

  for (bool raw : {false, true}) {
    SCOPED_TRACE(raw ? "raw" : "typed");
    inference::ModelInferResponse resp;
    grpc::Status s = Infer(Request("mlp", kRows, raw), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.model_name(), "mlp");
    EXPECT_EQ(resp.model_version(), "1");
    EXPECT_EQ(resp.id(), "req-7");
    ASSERT_EQ(resp.outputs_size(), 2);
    EXPECT_EQ(resp.raw_output_contents_size(), raw ? 2 : 0);  // answered the way it was asked
    EXPECT_EQ(resp.outputs(0).has_contents(), !raw);
    auto logits = TensorFromOutput(resp, 0);
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_EQ(logits->TypeString(), "f32[2,3]");
    for (int j = 0; j < 6; ++j) {
      // Bit for bit REST's (shortest round-trip floats parse back exactly).
      EXPECT_EQ(logits->data<float>()[j], want[0]["data"][j].get<float>()) << j;
    }
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(logits->data<float>()[j], direct0[j], 1e-5);
      EXPECT_NEAR(logits->data<float>()[3 + j], direct1[j], 1e-5);
    }
    auto pred = TensorFromOutput(resp, 1);
    ASSERT_TRUE(pred.ok()) << pred.status();
    EXPECT_EQ(resp.outputs(1).datatype(), "INT32");
    EXPECT_EQ(pred->TypeString(), "s32[2]");
    for (int j = 0; j < 2; ++j) EXPECT_EQ(pred->data<int32_t>()[j], want[1]["data"][j].get<int>());
  }
  // One requested output, a version, and raw answers asked for by parameter.
  inference::ModelInferRequest req = Request("mlp", kRows, false);
  req.set_model_version("1");
  req.add_outputs()->set_name("prediction");
  (*req.mutable_parameters())["binary_data_output"].set_bool_param(true);
  inference::ModelInferResponse resp;
  ASSERT_TRUE(Infer(req, &resp).ok());
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(resp.outputs(0).name(), "prediction");
  ASSERT_EQ(resp.raw_output_contents_size(), 1);
  EXPECT_EQ(resp.raw_output_contents(0).size(), 8u);
  // The access log has the gRPC calls beside the REST one.
  server_->Shutdown(5000);
  const std::string log = log_.str();
  EXPECT_NE(log.find("\"method\":\"POST\",\"path\":\"/v2/models/mlp/infer\",\"status\":200"),
            std::string::npos)
      << log;
  const std::string infer =
      "\"method\":\"gRPC\",\"path\":\"/inference.GRPCInferenceService/ModelInfer\","
      "\"status\":\"OK\"";
  size_t at = log.find(infer);
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find("\"model\":\"mlp\",\"version\":\"1\",\"id\":\"req-7\",\"queue_us\":"),
            std::string::npos)
      << line;
  EXPECT_NE(log.rfind("\"remote\":\"ipv4:127.0.0.1:", at), std::string::npos) << log;
}

TEST_F(GrpcServerTest, BadRequestsGetTheRightCodes) {
  struct Case {
    const char* what;
    std::function<void(inference::ModelInferRequest&)> mangle;
    grpc::StatusCode code;
    const char* message;  // a part of the message
  };
  const std::vector<Case> cases = {
      {"shape",
       [](auto& r) {
         r.mutable_inputs(0)->set_shape(0, 4);
         r.mutable_inputs(0)->set_shape(1, 2);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].shape: [4,2]; 'x' takes FP32 [N,4]"},
      {"negative dimension", [](auto& r) { r.mutable_inputs(0)->set_shape(1, -3); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].shape[1] is -3: dimensions must be >= 0"},
      {"too many rows",
       [](auto& r) {
         r.mutable_inputs(0)->clear_contents();
         r.mutable_inputs(0)->set_shape(0, 9);
         r.add_raw_input_contents(std::string(9 * 16, '\0'));
       },
       grpc::StatusCode::INVALID_ARGUMENT,
       "inputs[0].shape: [9,4]; 'x' takes FP32 [N,4] with N in 1..8"},
      {"count and shape", [](auto& r) { r.mutable_inputs(0)->set_shape(0, 3); },
       grpc::StatusCode::INVALID_ARGUMENT, "fp32_contents: 8 values, but shape [3,4] needs 12"},
      {"dtype", [](auto& r) { r.mutable_inputs(0)->set_datatype("FP64"); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].contents: fp32_contents given for FP64"},
      {"unknown dtype", [](auto& r) { r.mutable_inputs(0)->set_datatype("FLOAT"); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].datatype: 'FLOAT' is not one of"},
      {"count", [](auto& r) { r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].contents.fp32_contents: 9 values"},
      {"wrong field", [](auto& r) { r.mutable_inputs(0)->mutable_contents()->add_int_contents(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "int_contents given for FP32"},
      {"no contents", [](auto& r) { r.mutable_inputs(0)->clear_contents(); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].contents: missing"},
      {"raw and typed", [](auto& r) { r.add_raw_input_contents(std::string(32, '\0')); },
       grpc::StatusCode::INVALID_ARGUMENT, "given together with raw_input_contents"},
      {"raw size",
       [](auto& r) {
         r.mutable_inputs(0)->clear_contents();
         r.add_raw_input_contents(std::string(31, '\0'));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "raw_input_contents[0]: 31 bytes, but FP32"},
      {"raw count",
       [](auto& r) {
         r.mutable_inputs(0)->clear_contents();
         r.add_raw_input_contents(std::string(32, '\0'));
         r.add_raw_input_contents(std::string(32, '\0'));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "raw_input_contents: 2 entries for 1 inputs"},
      {"input name", [](auto& r) { r.mutable_inputs(0)->set_name("y"); },
       grpc::StatusCode::INVALID_ARGUMENT, "inputs[0].name: model 'mlp' has no input 'y'"},
      {"output name", [](auto& r) { r.add_outputs()->set_name("probs"); },
       grpc::StatusCode::INVALID_ARGUMENT, "outputs[0].name: model 'mlp' has no output 'probs'"},
      {"priority", [](auto& r) { (*r.mutable_parameters())["priority"].set_string_param("hi"); },
       grpc::StatusCode::INVALID_ARGUMENT, "parameters.priority: expected an int64_param"},
      {"priority level", [](auto& r) { (*r.mutable_parameters())["priority"].set_int64_param(3); },
       grpc::StatusCode::INVALID_ARGUMENT, "priority 3"},
      {"no inputs", [](auto& r) { r.clear_inputs(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "inputs: missing"},
      {"model", [](auto& r) { r.set_model_name("nope"); }, grpc::StatusCode::NOT_FOUND,
       "unknown model 'nope'"},
      {"version", [](auto& r) { r.set_model_version("2"); }, grpc::StatusCode::NOT_FOUND,
       "model 'mlp' has no version '2' (versions: 1)"},
      {"huge shape",
       [](auto& r) {
         r.mutable_inputs(0)->set_shape(0, int64_t{1} << 40);
         r.mutable_inputs(0)->set_shape(1, int64_t{1} << 40);
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, "inputs[0].shape: more than 1048576 elements"},
      {"message over the limit",
       [](auto& r) {
         r.mutable_inputs(0)->clear_contents();
         r.add_raw_input_contents(std::string(kMaxMessage + 1, '\0'));
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    inference::ModelInferRequest req = Request("mlp", kRows, false);
    c.mangle(req);
    inference::ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos) << s.error_message();
  }
  const std::string m = Metrics();
  EXPECT_NE(m.find("kiln_inference_requests_total{model=\"mlp\",version=\"1\",outcome=\"bad_"
                   "request\"} 18"),
            std::string::npos)
      << m;  // the 18 cases that reached the model (not the 2 NOT_FOUND, nor the oversized)
  EXPECT_NE(m.find("kiln_grpc_requests_total{method=\"ModelInfer\",code=\"INVALID_ARGUMENT\"} 17"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("kiln_grpc_requests_total{method=\"ModelInfer\",code=\"NOT_FOUND\"} 2"),
            std::string::npos);
  EXPECT_NE(log_.str().find("\"path\":\"/inference.GRPCInferenceService/ModelInfer\",\"status\":"
                            "\"INVALID_ARGUMENT\""),
            std::string::npos);
}

// Bytes that are no message of the .proto: the client's error, not the server's.
TEST_F(GrpcServerTest, UnparsableMessagesAreInvalidArgument) {
  grpc::GenericStub generic(channel_);
  struct Case {
    const char* method;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"ModelInfer", std::string("\x0a\x02\xff\xfe", 4)},  // model_name, not UTF-8
      {"ModelInfer", std::string("\x2a\x7f\x01", 3)},      // inputs: 127 bytes, 1 there
      {"ModelReady", std::string("\x0a\x01\x80", 3)},
      {"ModelMetadata", std::string("\xff\xff\xff", 3)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.method);
    grpc::Slice slice(c.bytes);
    grpc::ByteBuffer req(&slice, 1), resp;
    auto ctx = Context();
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(ctx.get(), absl::StrCat("/inference.GRPCInferenceService/", c.method), {},
                      &req, &resp, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("request: not a valid inference."), std::string::npos)
        << status.error_message();
  }
}

TEST_F(GrpcServerTest, MangledRequestsNeverInternal) {
  std::mt19937 rng(11);
  const char* dtypes[] = {"FP32",  "FP16",  "BF16", "FP64",  "INT8", "UINT8",
                          "INT32", "INT64", "BOOL", "BYTES", "",     "fp32"};
  int ok = 0;
  for (int i = 0; i < 300; ++i) {
    inference::ModelInferRequest req = Request("mlp", kRows, rng() % 2 == 0);
    auto* in = req.mutable_inputs(0);
    switch (rng() % 6) {
      case 0:
        in->set_datatype(dtypes[rng() % 12]);
        break;
      case 1:
        in->set_shape(rng() % 2, static_cast<int64_t>(rng() % 20) - 3);
        break;
      case 2:
        in->add_shape(rng() % 3);
        break;
      case 3:
        if (req.raw_input_contents_size() > 0)
          req.mutable_raw_input_contents(0)->resize(rng() % 64);
        else
          in->mutable_contents()->add_int64_contents(rng());
        break;
      case 4:
        (*req.mutable_parameters())[rng() % 2 ? "timeout" : "priority"].set_int64_param(
            static_cast<int64_t>(rng() % 5) - 2);
        break;
      default:
        break;
    }
    inference::ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    ASSERT_NE(s.error_code(), grpc::StatusCode::INTERNAL) << i << ": " << s.error_message();
    ASSERT_NE(s.error_code(), grpc::StatusCode::UNKNOWN) << i << ": " << s.error_message();
    ok += s.ok();
  }
  EXPECT_GT(ok, 0);  // the unmangled ones still answer
  EXPECT_LT(ok, 300);
}

TEST_F(GrpcServerTest, QueueFullAndTimeoutAreUnavailable) {
  inference::ModelInferRequest req = Request("slow", {1, 2, 3, 4}, false);
  // 2 s in the queue, on the model's manual clock.
  (*req.mutable_parameters())["timeout"].set_int64_param(2000000);
  grpc::ClientContext ctx;
  inference::ModelInferResponse first;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status first_status;
  stub_->async()->ModelInfer(&ctx, &req, &first, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    first_status = s;
    done = true;
    cv.notify_all();
  });
  auto slow = server_->registry().Find("slow", "");
  for (int i = 0; i < 2000 && slow->queue_depth() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(slow->queue_depth(), 1);
  inference::ModelInferResponse second;
  grpc::Status s = Infer(Request("slow", {1, 2, 3, 4}, false), &second);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("exceeds maximum queue size"), std::string::npos)
      << s.error_message();
  slow_clock_.AdvanceMicros(2000000);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done; }));
  EXPECT_EQ(first_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(first_status.error_message().find("timeout"), std::string::npos)
      << first_status.error_message();
}

TEST_F(GrpcServerTest, GrpcAndRestRequestsShareOneBatch) {
  // Two gRPC and two REST single-row requests to `batchy` (preferred batch 4, a 20 s delay):
  // they are answered at once only if all four ran in one batch.
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::atomic<int> answered{0};
  std::vector<std::vector<float>> rows = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}};
  std::vector<std::vector<float>> got(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      if (k < 2) {
        inference::ModelInferResponse resp;
        grpc::Status s = Infer(Request("batchy", rows[k], k == 1), &resp);
        if (!s.ok()) return;
        auto t = TensorFromOutput(resp, 0);
        if (!t.ok()) return;
        got[k].assign(t->data<float>(), t->data<float>() + 3);
      } else {
        std::string body = R"({"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[)";
        for (int j = 0; j < 4; ++j) body += (j ? "," : "") + std::to_string(rows[k][j]);
        body += "]}]}";
        auto r = http::testing::TestClient(server_->port())
                     .Send("POST", "/v2/models/batchy/infer", body);
        if (r.status != 200) return;
        const json out = json::parse(r.body);
        for (const auto& v : out["outputs"][0]["data"]) got[k].push_back(v.get<float>());
      }
      answered++;
    });
  }
  for (auto& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(answered.load(), 4);
  EXPECT_LT(seconds, 10.0);  // not the 20 s delay: the fourth request completed the batch
  for (int k = 0; k < 4; ++k) {
    const std::vector<float> want = Direct(rows[k]);
    ASSERT_EQ(got[k].size(), 3u) << k;
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(got[k][j], want[j], 1e-5) << k;
  }
  const std::string m = Metrics();
  // One batch of 4 rows: the histogram of batchy has a single observation, of 4.
  EXPECT_NE(m.find("kiln_inference_batch_size_count{model=\"batchy\",version=\"1\"} 1\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("kiln_inference_batch_size_sum{model=\"batchy\",version=\"1\"} 4\n"),
            std::string::npos);
  EXPECT_NE(m.find("kiln_inference_requests_total{model=\"batchy\",version=\"1\",outcome=\""
                   "success\"} 4"),
            std::string::npos);
  EXPECT_NE(m.find("kiln_grpc_requests_total{method=\"ModelInfer\",code=\"OK\"} 2"),
            std::string::npos);
}

TEST_F(GrpcServerTest, ShutdownAnswersAQueuedCallThenRefuses) {
  // `slow` would hold this request 10 s; the drain sends it at once.
  inference::ModelInferRequest req = Request("slow", {1, 2, 3, 4}, false);
  grpc::ClientContext ctx;
  inference::ModelInferResponse resp;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub_->async()->ModelInfer(&ctx, &req, &resp, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
    cv.notify_all();
  });
  auto slow = server_->registry().Find("slow", "");
  for (int i = 0; i < 2000 && slow->queue_depth() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(slow->queue_depth(), 1);
  const auto start = std::chrono::steady_clock::now();
  server_->Shutdown(5000);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 4.0);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return done; }));
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto t = TensorFromOutput(resp, 0);
  ASSERT_TRUE(t.ok());
  const std::vector<float> want = Direct({1, 2, 3, 4});
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(t->data<float>()[j], want[j], 1e-5);
  lock.unlock();
  // The port is closed now.
  inference::ServerLiveResponse live;
  auto ctx2 = std::make_unique<grpc::ClientContext>();
  ctx2->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  EXPECT_FALSE(stub_->ServerLive(ctx2.get(), {}, &live).ok());
}

// The repository RPCs over the same ModelRepository as REST's /v2/repository/*: the index equals
// REST's, a reload picks up a new version, a failed reload keeps the old one serving, unload,
// and the errors (unknown model or repository, parameters, no repository at all).
TEST_F(GrpcServerTest, RepositoryIndexLoadAndUnload) {
  const std::string repo = test_support::MakeTempDir("grpc_repo");
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/mlp/1").ok());
  std::filesystem::create_directories(repo + "/broken/1");  // no manifest.json
  ServerOptions o;
  o.server_version = "test";
  InferenceServer server(o);
  ModelConfig defaults;
  defaults.batching.max_batch_size = 4;
  ModelRepository repository(repo, defaults, backend_.get(), &server.registry());
  ASSERT_TRUE(repository.LoadAll().ok());
  server.set_repository(&repository);
  ASSERT_TRUE(server.Start().ok());
  auto grpc = GrpcServer::Start(&server, GrpcServerOptions{});
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  auto stub = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*grpc)->port()), grpc::InsecureChannelCredentials()));
  auto index = [&](bool ready, const std::string& repository_name = "") {
    inference::RepositoryIndexRequest q;
    q.set_ready(ready);
    q.set_repository_name(repository_name);
    inference::RepositoryIndexResponse r;
    auto ctx = Context();
    grpc::Status s = stub->RepositoryIndex(ctx.get(), q, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::string text;  // name/version/state per entry
    for (const auto& m : r.models())
      absl::StrAppend(&text, m.name(), "/", m.version(), "/", m.state(),
                      m.reason().empty() ? "" : "!", " ");
    return std::make_pair(text, r);
  };
  auto load = [&](const std::string& model, bool unload,
                  const std::map<std::string, std::string>& params = {}) {
    inference::RepositoryModelLoadRequest q;
    q.set_model_name(model);
    for (const auto& [k, v] : params) (*q.mutable_parameters())[k].set_string_param(v);
    auto ctx = Context();
    if (!unload) {
      inference::RepositoryModelLoadResponse r;
      return stub->RepositoryModelLoad(ctx.get(), q, &r);
    }
    inference::RepositoryModelUnloadRequest u;
    u.set_model_name(model);
    for (const auto& [k, v] : params) (*u.mutable_parameters())[k].set_bool_param(v == "true");
    inference::RepositoryModelUnloadResponse r;
    return stub->RepositoryModelUnload(ctx.get(), u, &r);
  };
  auto infer_version = [&]() -> std::string {
    inference::ModelInferResponse r;
    auto ctx = Context();
    grpc::Status s = stub->ModelInfer(ctx.get(), Request("mlp", kRows, false), &r);
    return s.ok() ? r.model_version() : "error: " + s.error_message();
  };

  auto [text, full] = index(false);
  EXPECT_EQ(text, "broken//UNAVAILABLE! mlp/1/READY ");
  EXPECT_NE(full.models(0).reason().find("manifest.json"), std::string::npos)
      << full.models(0).reason();
  EXPECT_EQ(index(true).first, "mlp/1/READY ");
  EXPECT_EQ(index(true, repo).first, "mlp/1/READY ");
  // The same index as REST's.
  json rest = json::parse(
      http::testing::TestClient(server.port()).Send("POST", "/v2/repository/index", "{}").body);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0]["reason"], full.models(0).reason());
  EXPECT_EQ(rest[1]["version"], "1");

  // A new version: the reload serves it (latest 1).
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/mlp/2").ok());
  grpc::Status s = load("mlp", false);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(index(false).first, "broken//UNAVAILABLE! mlp/2/READY ");
  EXPECT_EQ(infer_version(), "2");
  // A broken newer version: the reload fails naming it, version 2 keeps serving.
  std::filesystem::create_directories(repo + "/mlp/3");
  s = load("mlp", false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("mlp/3"), std::string::npos) << s.error_message();
  EXPECT_EQ(index(true).first, "mlp/2/READY ");
  EXPECT_EQ(infer_version(), "2");
  std::filesystem::remove_all(repo + "/mlp/3");

  // Errors.
  s = load("nope", false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), absl::StrCat("no model 'nope' in repository ", repo));
  s = load("", false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "model_name: missing");
  s = load("mlp", false, {{"config", "{}"}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "parameters.config: not supported (a load reads REPO/<model>/config.yaml and its "
            "version folders)");
  {
    inference::RepositoryIndexRequest q;
    q.set_repository_name("elsewhere");
    inference::RepositoryIndexResponse r;
    auto ctx = Context();
    s = stub->RepositoryIndex(ctx.get(), q, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(),
              absl::StrCat("unknown repository 'elsewhere' (this server serves one: ", repo, ")"));
  }

  // Unload (unload_dependents is accepted: Kiln has no dependent models), then again.
  s = load("mlp", true, {{"unload_dependents", "true"}});
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(infer_version(), "error: unknown model 'mlp'");
  auto [after, after_full] = index(false);
  EXPECT_EQ(after, "broken//UNAVAILABLE! mlp//UNAVAILABLE! ");
  EXPECT_EQ(after_full.models(1).reason(), "not loaded");
  s = load("mlp", true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "model 'mlp' is not loaded");
  const std::string metrics = http::testing::TestClient(server.port()).Send("GET", "/metrics").body;
  EXPECT_NE(
      metrics.find(
          R"(kiln_grpc_requests_total{method="RepositoryModelLoad",code="FAILED_PRECONDITION"} 1)"),
      std::string::npos)
      << metrics;
  server.Shutdown(2000);
  grpc->reset();

  // The fixture's server has no repository.
  inference::RepositoryIndexResponse r;
  auto ctx = Context();
  s = stub_->RepositoryIndex(ctx.get(), {}, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "this server has no model repository (--model-repository)");
}

// RepositoryModelLoad runs on the repository's loader thread, the same one REST's load uses: while
// a gRPC load is held (a test hook), ServerLive and ModelInfer answer, a second load of the model
// over gRPC is ABORTED and over REST 409; the held load answers OK when it finishes.
TEST_F(GrpcServerTest, RepositoryLoadsShareRestsLoaderThread) {
  const std::string repo = test_support::MakeTempDir("grpc_repo_async");
  ASSERT_TRUE(testing::WriteTestMlp(repo + "/mlp/1").ok());
  std::unique_ptr<ModelRepository> repository;  // outlives the server
  ServerOptions o;
  o.http.threads = 1;
  InferenceServer server(o);
  repository =
      std::make_unique<ModelRepository>(repo, ModelConfig{}, backend_.get(), &server.registry());
  ASSERT_TRUE(repository->LoadAll().ok());
  testing::JobGate gate;
  repository->set_job_hook_for_testing([&](const std::string& name) { gate.Enter(name); });
  server.set_repository(repository.get());
  ASSERT_TRUE(server.Start().ok());
  auto grpc = GrpcServer::Start(&server, GrpcServerOptions{});
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  auto stub = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*grpc)->port()), grpc::InsecureChannelCredentials()));
  auto load = [&]() {
    inference::RepositoryModelLoadRequest q;
    q.set_model_name("mlp");
    inference::RepositoryModelLoadResponse r;
    auto ctx = Context();
    return stub->RepositoryModelLoad(ctx.get(), q, &r);
  };
  grpc::Status held = grpc::Status(grpc::StatusCode::UNKNOWN, "not answered");
  std::thread loader([&] { held = load(); });
  testing::JobGate::Guard guard{gate, loader};
  ASSERT_TRUE(gate.WaitEntered(1));
  {
    inference::ServerLiveResponse r;
    auto ctx = Context();
    EXPECT_TRUE(stub->ServerLive(ctx.get(), {}, &r).ok());
    inference::ModelInferResponse ir;
    auto ctx2 = Context();
    grpc::Status s = stub->ModelInfer(ctx2.get(), Request("mlp", kRows, false), &ir);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  grpc::Status again = load();
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ABORTED) << again.error_message();
  EXPECT_NE(again.error_message().find("model 'mlp' is already loading or unloading"),
            std::string::npos)
      << again.error_message();
  http::testing::TestClient c(server.port());
  EXPECT_EQ(c.Send("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(c.Send("POST", "/v2/repository/models/mlp/load").status, 409);
  gate.Release();
  loader.join();
  EXPECT_TRUE(held.ok()) << held.error_message();
  EXPECT_TRUE(load().ok());  // free again
  server.Shutdown(2000);
  grpc->reset();
}

TEST_F(GrpcServerTest, SecondServerOnTheSamePortFails) {
  GrpcServerOptions g;
  g.port = grpc_->port();
  auto again = GrpcServer::Start(server_.get(), g);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find(absl::StrCat("127.0.0.1:", g.port)), std::string::npos)
      << again.status();
}

}  // namespace
}  // namespace kiln::serve
