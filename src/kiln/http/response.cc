#include "kiln/http/response.h"

#include <cstdio>

namespace kiln::http {

std::string ErrorJson(std::string_view message) {
  std::string out = "{\"error\":";
  AppendJsonString(message, &out);
  out.push_back('}');
  return out;
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kAlreadyExists:
      return 409;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

HttpResponse ErrorResponse(int status, absl::string_view message) {
  HttpResponse r;
  r.status = status;
  r.body = ErrorJson(std::string_view(message.data(), message.size()));
  if (status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

HttpResponse ErrorResponse(const absl::Status& s) {
  return ErrorResponse(HttpStatusFor(s.code()), s.message());
}

}  // namespace kiln::http
