// A route table for an HTTP service: entries of (method, path pattern with named segments,
// handler, permission), a matcher that answers 404 for an unknown path and 405 (with the methods
// the path takes, for `Allow`) for a known path under another method, and the list of routes, so
// that docs and a deny-by-default test can enumerate every endpoint a service has.
//
//   RouteTable<Handler> routes;
//   routes.Add("POST", "/v2/models/{model}/versions/{version}/infer", &Server::Infer);
//   absl::StatusOr<std::vector<std::string>> segments =
//   SplitPath("/v2/models/my%20m/versions/2/infer"); RouteTable<Handler>::Found f =
//   routes.Find("POST", *segments);
//   // f.status == 200, *f.handler == &Server::Infer, f.params.Get("model") == "my m"
//   // else f.status is 404 or 405: answer NoRouteResponse(f.status, f.allow, method, path)
//
// Paths are split at '/' first, empty segments dropped (a trailing slash, or "//", changes
// nothing), and each segment is then percent-decoded (RFC 3986), so an escaped '/' (%2F) stays
// inside its segment. A pattern segment `{name}` captures one whole segment; any other segment
// matches itself (after decoding). Where two patterns match a path, the one added first wins.
// The permission is a string the control plane attaches to each route (IAM); the table only
// carries it.
#ifndef KILN_HTTP_ROUTER_H_
#define KILN_HTTP_ROUTER_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kiln/http/http_server.h"

namespace kiln::http {

// One route as listed: `GET /v2/models/{model}` with its permission ("" when none).
struct RouteInfo {
  std::string method;
  std::string pattern;
  std::string permission;
};

// The segments a pattern's `{name}`s captured, in path order.
struct PathParams {
  std::vector<std::pair<std::string, std::string>> values;
  // The segment `name` captured, or null.
  const std::string* Find(std::string_view name) const;
  // The segment `name` captured, or "" (an optional segment of another pattern).
  std::string Get(std::string_view name) const;
};

// RFC 3986 percent-decoding of one path segment ("my%20model" -> "my model"); false for a '%'
// not followed by two hex digits.
bool PercentDecode(absl::string_view in, std::string* out);
// The path (no query) split and decoded as above; InvalidArgument ("path: 'm%zz' has a '%' not
// followed by two hex digits") for a bad escape.
absl::StatusOr<std::vector<std::string>> SplitPath(absl::string_view path);

// The answer for a path no route takes: 404 `no such endpoint: <path>`, or 405 `<method>
// <path>: use GET, POST` with `Allow: GET, POST`.
HttpResponse NoRouteResponse(int status, const std::vector<std::string>& allow,
                             absl::string_view method, absl::string_view path);

// The matching, without the handlers (RouteTable adds them).
class RouteMatcher {
 public:
  // InvalidArgument for an empty method, a pattern that does not start with '/', an empty,
  // unclosed or repeated `{name}`, or a (method, pattern) already added.
  absl::Status Add(RouteInfo info);

  struct Match {
    int status = 404;                // 200: `route` matched; 404: no pattern; 405: not this method
    int route = -1;                  // with 200: the index into routes()
    PathParams params;               // with 200
    std::vector<std::string> allow;  // with 405: the methods the path takes, sorted
  };
  Match Find(std::string_view method, const std::vector<std::string>& segments) const;

  // Every route, in the order added.
  const std::vector<RouteInfo>& routes() const { return routes_; }

 private:
  struct Segment {
    std::string text;  // the literal, or the capture's name
    bool capture = false;
  };
  bool Matches(const std::vector<Segment>& pattern, const std::vector<std::string>& segments,
               PathParams* params) const;

  std::vector<RouteInfo> routes_;
  std::vector<std::vector<Segment>> patterns_;  // parallel to routes_
};

template <typename Handler>
class RouteTable {
 public:
  absl::Status Add(std::string method, std::string pattern, Handler handler,
                   std::string permission = "") {
    absl::Status s = matcher_.Add({std::move(method), std::move(pattern), std::move(permission)});
    if (s.ok()) handlers_.push_back(std::move(handler));
    return s;
  }

  struct Found {
    int status = 404;                  // 200, 404 or 405 as RouteMatcher::Match
    const Handler* handler = nullptr;  // with 200
    const RouteInfo* route = nullptr;  // with 200
    PathParams params;
    std::vector<std::string> allow;
  };
  Found Find(std::string_view method, const std::vector<std::string>& segments) const {
    RouteMatcher::Match m = matcher_.Find(method, segments);
    Found f;
    f.status = m.status;
    f.params = std::move(m.params);
    f.allow = std::move(m.allow);
    if (m.route >= 0) {
      f.handler = &handlers_[m.route];
      f.route = &matcher_.routes()[m.route];
    }
    return f;
  }

  const std::vector<RouteInfo>& routes() const { return matcher_.routes(); }

 private:
  RouteMatcher matcher_;
  std::vector<Handler> handlers_;  // parallel to matcher_.routes()
};

}  // namespace kiln::http

#endif  // KILN_HTTP_ROUTER_H_
