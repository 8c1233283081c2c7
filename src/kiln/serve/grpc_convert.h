// The Open Inference Protocol's gRPC messages (proto/inference.proto) to and from the
// protocol-neutral request the REST handler also builds (InferBody, oip.h), so both protocols
// run one inference path (InferenceServer::SubmitInfer). Rules (docs/serving.md, "gRPC"):
//
//   - An input's values are either its typed `contents` (the field that matches its datatype:
//     fp32_contents for FP32, int_contents for INT8/INT32, uint_contents for UINT8, ...) or one
//     `raw_input_contents` entry per input (little-endian, row-major); FP16 and BF16 only raw.
//   - Request parameters: `priority` and `timeout` (microseconds) as int64_param or uint64_param,
//     `binary_data_output` (bool_param: answer in raw_output_contents). Others are ignored.
//   - The answer is raw_output_contents when the request sent raw inputs, asked for
//     binary_data_output, or an output has no typed field (FP16, BF16); else typed contents.
//
//   bool raw = false;
//   KILN_ASSIGN_OR_RETURN(InferBody body, InferBodyFromProto(request, max_elements, &raw));
//   FillInferResponse(name, version, request.id(), done.outputs, raw, &response);
//
// Errors are InvalidArgument naming the field ("inputs[0].contents.fp32_contents: ..."), or
// ResourceExhausted for an input declaring more than `max_elements` elements.
#ifndef KILN_SERVE_GRPC_CONVERT_H_
#define KILN_SERVE_GRPC_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/serve/oip.h"
#include "kiln/serve/proto/inference.pb.h"
#include "kiln/serve/server.h"

namespace kiln::serve {

// `raw_outputs` is set to whether the answer should use raw_output_contents.
absl::StatusOr<InferBody> InferBodyFromProto(const inference::ModelInferRequest& request,
                                             int64_t max_elements, bool* raw_outputs);

// The response for `outputs` (the requested outputs, in order).
void FillInferResponse(const std::string& model, const std::string& version, const std::string& id,
                       const std::vector<InferOutput>& outputs, bool raw_outputs,
                       inference::ModelInferResponse* response);

// A tensor of an answer read back (typed or raw): tests and clients. InvalidArgument when the
// datatype is unknown or the contents do not fill the shape.
absl::StatusOr<Tensor> TensorFromOutput(const inference::ModelInferResponse& response, int index);

}  // namespace kiln::serve

#endif  // KILN_SERVE_GRPC_CONVERT_H_
