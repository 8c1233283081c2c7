// The Status -> HTTP status mapping and the JSON error body.
#include "kiln/http/response.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::http {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(ResponseTest, StatusCodesMapToHttp) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kFailedPrecondition), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kOutOfRange), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kAborted), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kAlreadyExists), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDataLoss), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnknown), 500);
}

TEST(ResponseTest, ErrorResponsesCarryTheMessageAsJson) {
  HttpResponse r = ErrorResponse(absl::UnavailableError("queue \"full\"\n"));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(r.body, R"({"error":"queue \"full\"\n"})");
  EXPECT_THAT(r.headers, ElementsAre(Pair("Retry-After", "1")));
  r = ErrorResponse(absl::NotFoundError("unknown model 'x'"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, R"({"error":"unknown model 'x'"})");
  EXPECT_TRUE(r.headers.empty());
  std::string out;
  AppendJsonString(std::string("a\\b\t\x01", 5), &out);
  EXPECT_EQ(out, R"("a\\b\t\u0001")");
}

}  // namespace
}  // namespace kiln::http
