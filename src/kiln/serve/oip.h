// The Open Inference Protocol (KServe v2) REST bodies: parsing an infer request (JSON tensors,
// parsed with simdjson On-Demand, and the binary-tensor extension) and writing the responses.
// Field names and rules are the protocol's (docs/serving.md, "Protocol"):
//
//   {"id": "42", "parameters": {"priority": 1, "timeout": 5000, "binary_data_output": false},
//    "inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.1, ...],
//                "parameters": {"binary_data_size": 256}}],
//    "outputs": [{"name": "logits", "parameters": {"binary_data": true}}]}
//
// With the binary extension the HTTP body is the JSON header (Inference-Header-Content-Length
// bytes), then the raw little-endian bytes of each input that has `binary_data_size`, in input
// order. Errors are InvalidArgument naming the field ("inputs[0].shape: ...").
//
//   KILN_ASSIGN_OR_RETURN(InferBody b, ParseInferRequest(json, binary_tail));
#ifndef KILN_SERVE_OIP_H_
#define KILN_SERVE_OIP_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/json_escape.h"
#include "kiln/http/response.h"
#include "kiln/tensor/tensor.h"

namespace kiln::serve {

// "FP32", "FP16", "BF16", "FP64", "INT8", "UINT8", "INT32", "INT64", "BOOL"; others: "" / false.
const char* OipDatatype(DType t);
bool ParseOipDatatype(std::string_view name, DType* t);

struct InferInput {
  std::string name;
  Tensor tensor;  // of the declared datatype and shape
};

struct RequestedOutput {
  std::string name;
  int binary = -1;  // parameters.binary_data: -1 unset, 0 false, 1 true
};

struct InferBody {
  std::string id;
  bool has_id = false;
  int64_t priority = 0;    // parameters.priority; 0: unset
  int64_t timeout_us = 0;  // parameters.timeout (microseconds); 0: unset
  bool binary_data_output = false;
  std::vector<InferInput> inputs;
  std::vector<RequestedOutput> outputs;  // empty: all outputs
  int64_t elements = 0;                  // summed over the inputs
};

// `json` is the JSON part of the body; `binary` what follows it (empty without the extension).
// `max_elements` bounds each input's declared element count before anything is allocated.
absl::StatusOr<InferBody> ParseInferRequest(std::string_view json, std::string_view binary,
                                            int64_t max_elements);

// A request's negative dimension, REST and gRPC alike: InvalidArgument
// "inputs[0].shape[1] is -3: dimensions must be >= 0" for field "inputs[0].shape[1]", value -3.
absl::Status NegativeDimension(const std::string& field, int64_t value);

// The repository index request body {"ready": bool}: its `ready` (false when absent).
absl::StatusOr<bool> ParseIndexReady(std::string_view json);

// A tensor's values as a JSON array (floats in shortest round-trip form).
void AppendJsonData(const Tensor& t, std::string* out);
// JSON string literals: kiln::AppendJsonString (base/json_escape.h), found unqualified here;
// {"error": "<message>"}: the HTTP layer's.
using http::ErrorJson;

}  // namespace kiln::serve

#endif  // KILN_SERVE_OIP_H_
