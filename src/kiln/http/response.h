// How every Kiln HTTP service (`kiln serve`, the control plane) answers an error: the one
// mapping from absl::Status codes to HTTP status codes, and the JSON error body
// `{"error": "<message>"}` (503 also says `Retry-After: 1`).
//
//   HttpStatusFor(absl::StatusCode::kNotFound);             // 404
//   HttpResponse r = ErrorResponse(absl::UnavailableError("queue full"));
//   // r.status == 503, r.body == {"error":"queue full"}, r.headers has Retry-After: 1
//   std::string out;
//   AppendJsonString("say \"hi\"", &out);                   // out == "\"say \\\"hi\\\"\""
#ifndef KILN_HTTP_RESPONSE_H_
#define KILN_HTTP_RESPONSE_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kiln/base/json_escape.h"
#include "kiln/http/http_server.h"

namespace kiln::http {

// A JSON string literal with escapes: base's (base/json_escape.h).
using ::kiln::AppendJsonString;
// {"error": "<message>"}
std::string ErrorJson(std::string_view message);

// OK 200; InvalidArgument, FailedPrecondition, OutOfRange 400; Unauthenticated 401;
// PermissionDenied 403; NotFound 404; Aborted, AlreadyExists 409; Unavailable 503; any other
// code 500 (a broken invariant, never bad input).
int HttpStatusFor(absl::StatusCode code);
// `status` with ErrorJson(message) as its body; a 503 also says `Retry-After: 1`.
HttpResponse ErrorResponse(int status, absl::string_view message);
// ErrorResponse(HttpStatusFor(s.code()), s.message()).
HttpResponse ErrorResponse(const absl::Status& s);

}  // namespace kiln::http

#endif  // KILN_HTTP_RESPONSE_H_
