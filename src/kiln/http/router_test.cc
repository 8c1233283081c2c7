// The route table alone: captures, 404 and 405 (with Allow), trailing slashes and
// percent-decoding, bad patterns, enumeration.
#include "kiln/http/router.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::http {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

RouteTable<int> Table() {
  RouteTable<int> t;
  EXPECT_TRUE(t.Add("GET", "/v2/health/live", 1).ok());
  EXPECT_TRUE(t.Add("GET", "/v2/models/{model}", 2).ok());
  EXPECT_TRUE(t.Add("GET", "/v2/models/{model}/versions/{version}", 3).ok());
  EXPECT_TRUE(t.Add("POST", "/v2/models/{model}/versions/{version}/infer", 4, "models.infer").ok());
  EXPECT_TRUE(t.Add("POST", "/v2/models/{model}/infer", 5).ok());
  EXPECT_TRUE(t.Add("PUT", "/v2/models/{model}/infer", 6).ok());
  return t;
}

RouteTable<int>::Found Find(const RouteTable<int>& t, const std::string& method,
                            const std::string& path) {
  absl::StatusOr<std::vector<std::string>> segments = SplitPath(path);
  EXPECT_TRUE(segments.ok()) << segments.status();
  return t.Find(method, *segments);
}

TEST(RouterTest, CapturesNamedSegments) {
  RouteTable<int> t = Table();
  RouteTable<int>::Found f = Find(t, "POST", "/v2/models/mlp/versions/2/infer");
  ASSERT_EQ(f.status, 200);
  EXPECT_EQ(*f.handler, 4);
  EXPECT_EQ(f.route->pattern, "/v2/models/{model}/versions/{version}/infer");
  EXPECT_EQ(f.route->permission, "models.infer");
  EXPECT_THAT(f.params.values, ElementsAre(Pair("model", "mlp"), Pair("version", "2")));
  EXPECT_EQ(f.params.Get("model"), "mlp");
  EXPECT_EQ(f.params.Get("nothing"), "");
  EXPECT_EQ(f.params.Find("nothing"), nullptr);
  f = Find(t, "GET", "/v2/models/mlp");
  ASSERT_EQ(f.status, 200);
  EXPECT_EQ(*f.handler, 2);
  EXPECT_EQ(f.params.Get("version"), "");
  // A capture takes any one segment, a literal one included.
  f = Find(t, "GET", "/v2/models/versions");
  ASSERT_EQ(f.status, 200);
  EXPECT_EQ(f.params.Get("model"), "versions");
}

TEST(RouterTest, UnknownPathIs404AndWrongMethodIs405WithAllow) {
  RouteTable<int> t = Table();
  EXPECT_EQ(Find(t, "GET", "/v2/nothing").status, 404);
  EXPECT_EQ(Find(t, "GET", "/").status, 404);
  EXPECT_EQ(Find(t, "GET", "/v2/models/mlp/versions").status, 404);
  EXPECT_EQ(Find(t, "GET", "/v2/models/mlp/infer/more").status, 404);
  RouteTable<int>::Found f = Find(t, "GET", "/v2/models/mlp/infer");
  EXPECT_EQ(f.status, 405);
  EXPECT_EQ(f.handler, nullptr);
  EXPECT_THAT(f.allow, ElementsAre("POST", "PUT"));
  EXPECT_EQ(Find(t, "DELETE", "/v2/health/live").status, 405);

  HttpResponse r = NoRouteResponse(405, f.allow, "GET", "/v2/models/mlp/infer");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.body, R"({"error":"GET /v2/models/mlp/infer: use POST, PUT"})");
  EXPECT_THAT(r.headers, ElementsAre(Pair("Allow", "POST, PUT")));
  r = NoRouteResponse(404, {}, "GET", "/v2/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, R"({"error":"no such endpoint: /v2/nothing"})");
  EXPECT_TRUE(r.headers.empty());
}

TEST(RouterTest, TrailingSlashesAndEmptySegmentsChangeNothing) {
  RouteTable<int> t = Table();
  for (const char* path : {"/v2/health/live/", "//v2//health/live", "v2/health/live"}) {
    RouteTable<int>::Found f = Find(t, "GET", path);
    ASSERT_EQ(f.status, 200) << path;
    EXPECT_EQ(*f.handler, 1) << path;
  }
}

TEST(RouterTest, SegmentsArePercentDecodedAfterSplitting) {
  RouteTable<int> t = Table();
  RouteTable<int>::Found f = Find(t, "GET", "/v2/models/my%20model/versions/%31");
  ASSERT_EQ(f.status, 200);
  EXPECT_EQ(f.params.Get("model"), "my model");
  EXPECT_EQ(f.params.Get("version"), "1");
  // Literals match decoded segments too; an escaped '/' stays inside its segment.
  EXPECT_EQ(Find(t, "GET", "/v2/health/l%69ve").status, 200);
  f = Find(t, "GET", "/v2/models/ml%2Fp");
  ASSERT_EQ(f.status, 200);
  EXPECT_EQ(f.params.Get("model"), "ml/p");
  for (const char* bad : {"/v2/models/m%zzp", "/v2/models/mlp%", "/v2/models/mlp%4"}) {
    absl::StatusOr<std::vector<std::string>> s = SplitPath(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("has a '%' not followed by two hex digits"),
              std::string::npos)
        << s.status();
  }
}

TEST(RouterTest, BadPatternsAreRefused) {
  RouteTable<int> t;
  EXPECT_FALSE(t.Add("", "/a", 0).ok());
  EXPECT_FALSE(t.Add("GET", "a", 0).ok());
  EXPECT_FALSE(t.Add("GET", "/a/{}", 0).ok());
  EXPECT_FALSE(t.Add("GET", "/a/{b", 0).ok());
  EXPECT_FALSE(t.Add("GET", "/a/{b}/{b}", 0).ok());
  ASSERT_TRUE(t.Add("GET", "/a/{b}", 0).ok());
  EXPECT_FALSE(t.Add("GET", "/a/{b}", 1).ok());  // twice
  EXPECT_TRUE(t.Add("POST", "/a/{b}", 1).ok());
  EXPECT_EQ(t.routes().size(), 2u);
}

TEST(RouterTest, EnumeratesRoutesInTheOrderAdded) {
  RouteTable<int> t = Table();
  std::vector<std::string> listed;
  for (const RouteInfo& r : t.routes())
    listed.push_back(r.method + " " + r.pattern + (r.permission.empty() ? "" : " " + r.permission));
  EXPECT_THAT(listed, ElementsAre("GET /v2/health/live", "GET /v2/models/{model}",
                                  "GET /v2/models/{model}/versions/{version}",
                                  "POST /v2/models/{model}/versions/{version}/infer models.infer",
                                  "POST /v2/models/{model}/infer", "PUT /v2/models/{model}/infer"));
}

}  // namespace
}  // namespace kiln::http
