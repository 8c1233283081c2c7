// Test helper shared by grpc_convert_test.cc and grpc_server_test.cc (and their ASan builds): a
// ModelInferRequest for the test MLP (internal/test_model.h: x f32[N,4]) and two rows for it.
#ifndef KILN_SERVE_INTERNAL_GRPC_TEST_UTIL_H_
#define KILN_SERVE_INTERNAL_GRPC_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/serve/proto/inference.pb.h"

namespace kiln::serve::testing {

// `values` (rows x 4 floats) as input "x" FP32 [rows, 4] of `model`, id "req-7": typed
// fp32_contents, or one raw_input_contents entry when `raw`.
inline inference::ModelInferRequest Request(const std::string& model,
                                            const std::vector<float>& values, bool raw) {
  inference::ModelInferRequest r;
  r.set_model_name(model);
  r.set_id("req-7");
  auto* in = r.add_inputs();
  in->set_name("x");
  in->set_datatype("FP32");
  in->add_shape(static_cast<int64_t>(values.size() / 4));
  in->add_shape(4);
  if (raw) {
    r.add_raw_input_contents(reinterpret_cast<const char*>(values.data()),
                             values.size() * sizeof(float));
  } else {
    for (float v : values) in->mutable_contents()->add_fp32_contents(v);
  }
  return r;
}

inline const std::vector<float> kRows = {0.5f, -1, 2, 0.25f, 1, 1, 1, 1};

}  // namespace kiln::serve::testing

#endif  // KILN_SERVE_INTERNAL_GRPC_TEST_UTIL_H_
