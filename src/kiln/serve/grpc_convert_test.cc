// The gRPC conversions alone (grpc_convert.h), without a server: every datatype typed and raw
// and back, range and form errors, and 20,000 mutated messages (fixed seed) answered OK,
// InvalidArgument or ResourceExhausted. Also built under ASan+UBSan (serve_asan_grpc_convert_test).
#include "kiln/serve/grpc_convert.h"

#include <google/protobuf/stubs/logging.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/serve/internal/grpc_test_util.h"

namespace kiln::serve {
namespace {

using testing::kRows;
using testing::Request;

// Random and mutated bytes that parse as a ModelInferRequest: the conversion answers OK,
// InvalidArgument or ResourceExhausted, and never crashes (serve_asan_grpc_convert_test runs this
// under ASan and UBSan).
TEST(GrpcConvertTest, MutatedMessagesAreRejectedCleanly) {
  inference::ModelInferRequest base = Request("mlp", kRows, false);
  inference::ModelInferRequest raw = Request("mlp", kRows, true);
  (*raw.mutable_parameters())["priority"].set_int64_param(1);
  raw.add_outputs()->set_name("logits");
  const std::string seeds[] = {base.SerializeAsString(), raw.SerializeAsString()};
  std::mt19937 rng(7);
  int parsed = 0, accepted = 0;
  google::protobuf::LogSilencer quiet;  // protobuf logs every string field that is not UTF-8
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = seeds[i % 2];
    const int edits = 1 + rng() % 4;
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes.erase(at, 1 + rng() % 8);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(rng()));
      }
    }
    inference::ModelInferRequest req;
    if (!req.ParseFromString(bytes)) continue;
    ++parsed;
    bool raw_out = false;
    absl::StatusOr<InferBody> body = InferBodyFromProto(req, 1 << 16, &raw_out);
    if (body.ok()) {
      ++accepted;
      continue;
    }
    ASSERT_TRUE(body.status().code() == absl::StatusCode::kInvalidArgument ||
                body.status().code() == absl::StatusCode::kResourceExhausted)
        << body.status();
  }
  EXPECT_GT(parsed, 1000);  // about 8% of the mutations still parse
  EXPECT_GT(accepted, 0);
}

// The conversions alone, on every datatype (the served test model only takes FP32).
TEST(GrpcConvertTest, EveryDatatypeTypedAndRaw) {
  struct Case {
    const char* datatype;
    std::function<void(inference::InferTensorContents*)> fill;  // 3 values
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {"FP32",
       [](auto* c) {
         c->add_fp32_contents(1.5f), c->add_fp32_contents(-2), c->add_fp32_contents(0);
       },
       {1.5, -2, 0}},
      {"FP64",
       [](auto* c) {
         c->add_fp64_contents(0.1), c->add_fp64_contents(2), c->add_fp64_contents(-3);
       },
       {0.1, 2, -3}},
      {"INT8",
       [](auto* c) { c->add_int_contents(-128), c->add_int_contents(127), c->add_int_contents(0); },
       {-128, 127, 0}},
      {"INT32",
       [](auto* c) { c->add_int_contents(-70000), c->add_int_contents(5), c->add_int_contents(1); },
       {-70000, 5, 1}},
      {"INT64",
       [](auto* c) {
         c->add_int64_contents(int64_t{1} << 40), c->add_int64_contents(-1),
             c->add_int64_contents(2);
       },
       {double(int64_t{1} << 40), -1, 2}},
      {"UINT8",
       [](auto* c) { c->add_uint_contents(255), c->add_uint_contents(0), c->add_uint_contents(7); },
       {255, 0, 7}},
      {"BOOL",
       [](auto* c) {
         c->add_bool_contents(true), c->add_bool_contents(false), c->add_bool_contents(true);
       },
       {1, 0, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.datatype);
    inference::ModelInferRequest req;
    auto* in = req.add_inputs();
    in->set_name("t");
    in->set_datatype(c.datatype);
    in->add_shape(3);
    c.fill(in->mutable_contents());
    bool raw = true;
    auto body = InferBodyFromProto(req, 100, &raw);
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_FALSE(raw);
    const Tensor& t = body->inputs[0].tensor;
    ASSERT_EQ(t.num_elements(), 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t.GetDouble(i), c.want[i]) << i;
    // Back out, typed and raw: the same tensor, bit for bit.
    for (bool raw_out : {false, true}) {
      inference::ModelInferResponse resp;
      FillInferResponse("m", "1", "", {{"t", t, false}}, raw_out, &resp);
      EXPECT_EQ(resp.raw_output_contents_size(), raw_out ? 1 : 0);
      EXPECT_EQ(resp.outputs(0).datatype(), c.datatype);
      auto back = TensorFromOutput(resp, 0);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_TRUE(back->BitwiseEquals(t));
    }
  }
  // Out of range for the datatype, and FP16 (raw only) sent typed, and answered raw regardless.
  inference::ModelInferRequest req;
  auto* in = req.add_inputs();
  in->set_name("t");
  in->set_datatype("UINT8");
  in->add_shape(1);
  in->mutable_contents()->add_uint_contents(256);
  bool raw = false;
  auto body = InferBodyFromProto(req, 100, &raw);
  EXPECT_EQ(body.status().message(),
            "inputs[0].contents.uint_contents: element 0 (256) is outside [0, 255] of UINT8");
  in->set_datatype("FP16");
  in->mutable_contents()->clear_uint_contents();
  in->mutable_contents()->add_fp32_contents(1);
  body = InferBodyFromProto(req, 100, &raw);
  EXPECT_EQ(body.status().message(),
            "inputs[0].contents: FP16 has no typed contents: send its bytes in raw_input_contents");
  in->clear_contents();
  req.add_raw_input_contents(std::string("\x00\x3c", 2));  // 1.0 in FP16
  body = InferBodyFromProto(req, 100, &raw);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_TRUE(raw);
  EXPECT_EQ(body->inputs[0].tensor.GetDouble(0), 1.0);
  inference::ModelInferResponse resp;
  FillInferResponse("m", "1", "", {{"t", body->inputs[0].tensor, false}}, false, &resp);
  EXPECT_EQ(resp.raw_output_contents_size(), 1);  // FP16 has no typed field
}

}  // namespace
}  // namespace kiln::serve
