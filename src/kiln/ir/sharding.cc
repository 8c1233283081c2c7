#include "kiln/ir/sharding.h"

#include <cctype>
#include <charconv>

#include "absl/strings/str_cat.h"

namespace kiln::ir {
namespace {

bool IsAxisName(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return s != "_";
}

absl::Status Bad(std::string_view text, const std::string& why) {
  return absl::InvalidArgumentError("sharding \"" + std::string(text) + "\": " + why);
}

std::string_view Strip(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool ConsumePrefix(std::string_view* s, std::string_view p) {
  if (s->substr(0, p.size()) != p) return false;
  s->remove_prefix(p.size());
  return true;
}

bool ConsumeSuffix(std::string_view* s, std::string_view p) {
  if (s->size() < p.size() || s->substr(s->size() - p.size()) != p) return false;
  s->remove_suffix(p.size());
  return true;
}

}  // namespace

int Sharding::split_dim() const {
  for (int d = 0; d < rank(); ++d)
    if (!dims[d].axis.empty()) return d;
  return -1;
}

std::string Sharding::ToString() const {
  std::string s = "[";
  for (int d = 0; d < rank(); ++d) {
    if (d > 0) s += ",";
    if (dims[d].axis.empty())
      s += "_";
    else if (dims[d].groups == 1)
      s += dims[d].axis;
    else
      absl::StrAppend(&s, dims[d].groups, "*", dims[d].axis);
  }
  s += "]";
  if (!partial.empty()) absl::StrAppend(&s, " ", partial, "(", partial_axis, ")");
  return s;
}

absl::StatusOr<Sharding> ParseSharding(std::string_view text) {
  std::string_view rest = Strip(text);
  if (!ConsumePrefix(&rest, "[")) return Bad(text, "expected '[' first");
  size_t close = rest.find(']');
  if (close == std::string_view::npos) return Bad(text, "missing ']'");
  std::string_view body = rest.substr(0, close);
  rest = Strip(rest.substr(close + 1));
  Sharding s;
  if (!Strip(body).empty()) {
    while (true) {
      size_t comma = body.find(',');
      std::string_view entry = Strip(body.substr(0, comma));
      Sharding::Dim d;
      if (entry != "_") {
        size_t star = entry.find('*');
        if (star != std::string_view::npos) {
          std::string_view count = Strip(entry.substr(0, star));
          auto [end, ec] = std::from_chars(count.data(), count.data() + count.size(), d.groups);
          if (ec != std::errc() || end != count.data() + count.size() || d.groups < 1)
            return Bad(text,
                       "'" + std::string(entry) + "': the group count must be an integer >= 1");
          entry = Strip(entry.substr(star + 1));
        }
        if (!IsAxisName(entry))
          return Bad(text, "'" + std::string(entry) + "' is not '_' or a mesh axis name");
        d.axis = std::string(entry);
      }
      s.dims.push_back(std::move(d));
      if (comma == std::string_view::npos) break;
      body = body.substr(comma + 1);
    }
  }
  if (!rest.empty()) {
    for (const char* op : {"sum", "max"}) {
      if (ConsumePrefix(&rest, op)) {
        s.partial = op;
        break;
      }
    }
    if (s.partial.empty() || !ConsumePrefix(&rest, "(") || !ConsumeSuffix(&rest, ")") ||
        !IsAxisName(rest))
      return Bad(text, "after ']' expected sum(AXIS) or max(AXIS)");
    s.partial_axis = std::string(rest);
  }
  int split = 0;
  std::string axis = s.partial_axis;
  for (const Sharding::Dim& d : s.dims) {
    if (d.axis.empty()) continue;
    ++split;
    if (!axis.empty() && axis != d.axis)
      return Bad(text,
                 "names two mesh axes ('" + axis + "', '" + d.axis + "'): one axis per value");
    axis = d.axis;
  }
  if (split > 1) return Bad(text, "splits more than one dimension");
  if (split == 1 && !s.partial.empty()) return Bad(text, "a partial value must not also be split");
  return s;
}

absl::Status CheckSharding(const Sharding& s, const Type& type, int64_t axis_size) {
  if (s.rank() != type.shape.rank())
    return absl::InvalidArgumentError(absl::StrCat("sharding ", s.ToString(), " has ", s.rank(),
                                                   " dimensions, the value is ", type.ToString()));
  int d = s.split_dim();
  if (d < 0) return absl::OkStatus();
  int64_t n = type.shape.dim(d), g = s.dims[d].groups;
  if (n % g != 0)
    return absl::InvalidArgumentError(absl::StrCat("sharding ", s.ToString(), ": dimension ", d,
                                                   " of ", type.ToString(), " does not split into ",
                                                   g, " groups"));
  if (axis_size > 0 && (n / g) % axis_size != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "sharding ", s.ToString(), ": dimension ", d, " of ", type.ToString(),
        g > 1 ? absl::StrCat(" (", g, " groups of ", n / g, ")") : std::string(),
        " does not divide over the ", axis_size, " ranks of axis '", s.dims[d].axis, "'"));
  return absl::OkStatus();
}

absl::StatusOr<Sharding> ShardingOf(const Node& node) {
  auto it = node.attrs().find(kShardingAttr);
  if (it == node.attrs().end()) return Sharding::Replicated(node.type().shape.rank());
  if (!std::holds_alternative<std::string>(it->second))
    return absl::InvalidArgumentError("attribute 'sharding' must be a string");
  absl::StatusOr<Sharding> s = ParseSharding(std::get<std::string>(it->second));
  if (!s.ok()) return s.status();
  absl::Status c = CheckSharding(*s, node.type());
  if (!c.ok()) return c;
  return s;
}

}  // namespace kiln::ir
