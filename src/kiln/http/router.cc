#include "kiln/http/router.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kiln/http/response.h"

namespace kiln::http {

const std::string* PathParams::Find(std::string_view name) const {
  for (const auto& [k, v] : values)
    if (k == name) return &v;
  return nullptr;
}

std::string PathParams::Get(std::string_view name) const {
  const std::string* v = Find(name);
  return v != nullptr ? *v : std::string();
}

bool PercentDecode(absl::string_view in, std::string* out) {
  out->clear();
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    const int hi = i + 2 < in.size() ? hex(in[i + 1]) : -1;
    const int lo = i + 2 < in.size() ? hex(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

absl::StatusOr<std::vector<std::string>> SplitPath(absl::string_view path) {
  // Split first, then decode each segment: an escaped '/' (%2F) stays inside its segment.
  std::vector<std::string> parts;
  for (absl::string_view piece : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (!PercentDecode(piece, &parts.emplace_back()))
      return absl::InvalidArgumentError(
          absl::StrCat("path: '", piece, "' has a '%' not followed by two hex digits"));
  }
  return parts;
}

HttpResponse NoRouteResponse(int status, const std::vector<std::string>& allow,
                             absl::string_view method, absl::string_view path) {
  if (status != 405) return ErrorResponse(404, absl::StrCat("no such endpoint: ", path));
  const std::string methods = absl::StrJoin(allow, ", ");
  HttpResponse r = ErrorResponse(405, absl::StrCat(method, " ", path, ": use ", methods));
  r.headers.emplace_back("Allow", methods);
  return r;
}

absl::Status RouteMatcher::Add(RouteInfo info) {
  const std::string where = absl::StrCat("route ", info.method, " ", info.pattern);
  if (info.method.empty()) return absl::InvalidArgumentError(where + ": no method");
  if (info.pattern.empty() || info.pattern[0] != '/')
    return absl::InvalidArgumentError(where + ": the pattern must start with '/'");
  std::vector<Segment> pattern;
  for (absl::string_view piece : absl::StrSplit(info.pattern, '/', absl::SkipEmpty())) {
    Segment seg;
    if (piece.front() == '{' || piece.back() == '}') {
      if (piece.size() < 3 || piece.front() != '{' || piece.back() != '}')
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": '", piece, "' is not a capture of the form {name}"));
      seg.capture = true;
      seg.text = std::string(piece.substr(1, piece.size() - 2));
      for (const Segment& s : pattern)
        if (s.capture && s.text == seg.text)
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": {", seg.text, "} appears twice"));
    } else {
      seg.text = std::string(piece);
    }
    pattern.push_back(std::move(seg));
  }
  for (const RouteInfo& r : routes_)
    if (r.method == info.method && r.pattern == info.pattern)
      return absl::InvalidArgumentError(where + ": added twice");
  routes_.push_back(std::move(info));
  patterns_.push_back(std::move(pattern));
  return absl::OkStatus();
}

bool RouteMatcher::Matches(const std::vector<Segment>& pattern,
                           const std::vector<std::string>& segments, PathParams* params) const {
  if (pattern.size() != segments.size()) return false;
  for (size_t i = 0; i < pattern.size(); ++i)
    if (!pattern[i].capture && pattern[i].text != segments[i]) return false;
  params->values.clear();
  for (size_t i = 0; i < pattern.size(); ++i)
    if (pattern[i].capture) params->values.emplace_back(pattern[i].text, segments[i]);
  return true;
}

RouteMatcher::Match RouteMatcher::Find(std::string_view method,
                                       const std::vector<std::string>& segments) const {
  Match m;
  PathParams params;
  for (size_t i = 0; i < routes_.size(); ++i) {
    if (!Matches(patterns_[i], segments, &params)) continue;
    if (routes_[i].method == method) {
      m.status = 200;
      m.route = static_cast<int>(i);
      m.params = std::move(params);
      m.allow.clear();
      return m;
    }
    m.status = 405;
    if (std::find(m.allow.begin(), m.allow.end(), routes_[i].method) == m.allow.end())
      m.allow.push_back(routes_[i].method);
  }
  std::sort(m.allow.begin(), m.allow.end());
  return m;
}

}  // namespace kiln::http
