// IR text printer. The format is specified in docs/ir.md; parser.cc reads it back.
//
// The output is canonical: attributes in sorted order, nodes as %<id>, floats in the shortest
// form that round-trips, constants as a readable number (or list) only when that reproduces the
// exact bytes, otherwise as hex. Equal graphs print to equal text (the compile cache hashes it).
#include "kiln/ir/printer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/ir/internal/text_format.h"

namespace kiln::ir {

// Helpers shared with parser.cc, declared in internal/text_format.h.
namespace text_internal {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '$' || c == '-';
}

bool IsIdentStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsIdentChar(char c) { return IsIdentStart(c) || (c >= '0' && c <= '9') || c == '.'; }

// A word the lexer reads as one identifier token that is not a number keyword.
bool IsBareIdent(std::string_view s) {
  if (s.empty() || !IsIdentStart(s[0])) return false;
  for (char c : s)
    if (!IsIdentChar(c)) return false;
  return s != "nan" && s != "inf";
}

// Encodes one readable constant element into element `i` of a buffer of dtype `t`.
// `is_int` says which of `d` / `v` holds the value. Returns an error message, or "" on success.
std::string EncodeElement(DType t, bool is_int, int64_t v, double d, void* base, int64_t i) {
  switch (t) {
    case DType::kS8:
    case DType::kU8:
    case DType::kS32:
    case DType::kS64: {
      if (!is_int) return std::string("expected an integer for ") + std::string(DTypeName(t));
      int64_t lo = INT64_MIN, hi = INT64_MAX;
      if (t == DType::kS8) lo = -128, hi = 127;
      if (t == DType::kU8) lo = 0, hi = 255;
      if (t == DType::kS32) lo = INT32_MIN, hi = INT32_MAX;
      if (v < lo || v > hi)
        return std::to_string(v) + " is out of range for " + std::string(DTypeName(t));
      if (t == DType::kS8) static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      if (t == DType::kU8) static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      if (t == DType::kS32) static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      if (t == DType::kS64) static_cast<int64_t*>(base)[i] = v;
      return "";
    }
    case DType::kBool:
      return "expected true or false for bool";  // handled by the caller
    case DType::kF64:
      static_cast<double*>(base)[i] = is_int ? static_cast<double>(v) : d;
      return "";
    default:  // f32 and narrower floats: round through f32 as StoreFromDouble does
      StoreFromDouble(base, t, i, is_int ? static_cast<double>(v) : d);
      return "";
  }
}

// Reads a float token: decimal (as std::from_chars), inf, nan, or nan(0x<16 hex digits: bits>).
bool ParseFloatText(std::string_view s, double* out) {
  bool neg = !s.empty() && s[0] == '-';
  std::string_view body = neg ? s.substr(1) : s;
  if (body == "inf" || body == "nan") {
    double v = body == "inf" ? HUGE_VAL : std::nan("");
    *out = neg ? -v : v;
    return true;
  }
  if (body.size() == 23 && body.substr(0, 6) == "nan(0x" && body.back() == ')') {
    if (neg) return false;
    uint64_t bits = 0;
    auto r = std::from_chars(body.data() + 6, body.data() + 22, bits, 16);
    if (r.ec != std::errc() || r.ptr != body.data() + 22) return false;
    std::memcpy(out, &bits, sizeof bits);
    return std::isnan(*out);
  }
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace text_internal

namespace {

using text_internal::IsBareIdent;
using text_internal::IsNameChar;

constexpr uint64_t kCanonicalNan = 0x7ff8000000000000ull;
constexpr int64_t kMaxReadableElements = 16;

uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

// Adds ".0" when a finite number printed by to_chars would read back as an int.
void MarkFloat(std::string& s) {
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
}

std::string FormatNonFinite(double d) {
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  uint64_t bits = DoubleBits(d);
  if ((bits & ~(1ull << 63)) == kCanonicalNan) return (bits >> 63) ? "-nan" : "nan";
  char buf[40];
  std::snprintf(buf, sizeof buf, "nan(0x%016llx)", static_cast<unsigned long long>(bits));
  return buf;
}

// Shortest text that reads back as exactly `d`; always distinguishable from an int.
std::string FormatDouble(double d) {
  if (!std::isfinite(d)) return FormatNonFinite(d);
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  MarkFloat(s);
  return s;
}

std::string FormatFloat(float f) {
  if (!std::isfinite(f)) {
    if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
    return std::signbit(f) ? "-nan" : "nan";
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  std::string s(buf, r.ptr);
  MarkFloat(s);
  return s;
}

std::string QuoteString(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// For @graph and %value names: bare when every char is a name char, else quoted.
std::string SigilName(std::string_view s) {
  bool bare = !s.empty();
  for (char c : s) bare = bare && IsNameChar(c);
  return bare ? std::string(s) : QuoteString(s);
}

std::string IdentOrQuoted(const std::string& s) { return IsBareIdent(s) ? s : QuoteString(s); }

std::string FormatAttr(const AttrValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return FormatDouble(*d);
  if (const auto* s = std::get_if<std::string>(&v)) return QuoteString(*s);
  const auto& list = std::get<std::vector<int64_t>>(v);
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(list[i]);
  }
  return out + "]";
}

// Element `i` of `t` as readable text, or "" when no readable text reproduces its bytes.
std::string ReadableElement(const Tensor& t, int64_t i) {
  const DType dt = t.dtype();
  const int64_t size = DTypeSize(dt);
  const auto* bytes = static_cast<const uint8_t*>(t.raw_data()) + i * size;
  std::string text;
  bool is_int = false;
  int64_t iv = 0;
  double dv = 0;
  switch (dt) {
    case DType::kBool:
      if (bytes[0] > 1) return "";
      return bytes[0] ? "true" : "false";
    case DType::kS8:
      iv = static_cast<const int8_t*>(t.raw_data())[i];
      is_int = true;
      break;
    case DType::kU8:
      iv = static_cast<const uint8_t*>(t.raw_data())[i];
      is_int = true;
      break;
    case DType::kS32:
      iv = static_cast<const int32_t*>(t.raw_data())[i];
      is_int = true;
      break;
    case DType::kS64:
      iv = static_cast<const int64_t*>(t.raw_data())[i];
      is_int = true;
      break;
    case DType::kF64:
      dv = static_cast<const double*>(t.raw_data())[i];
      text = FormatDouble(dv);  // exact for every value, NaN payloads included
      break;
    default: {  // f32 and narrower: every value is exactly an f32
      float f = static_cast<float>(LoadAsDouble(t.raw_data(), dt, i));
      text = FormatFloat(f);
      break;
    }
  }
  if (is_int) return std::to_string(iv);
  // Check the text reads back to the same bytes (e.g. f8e4m3 has two NaN encodings).
  uint8_t check[8] = {0};
  if (!text_internal::ParseFloatText(text, &dv)) return "";
  text_internal::EncodeElement(dt, false, 0, dv, check, 0);
  if (std::memcmp(check, bytes, static_cast<size_t>(size)) != 0) return "";
  return text;
}

std::string FormatLiteral(const Tensor& t) {
  const int64_t n = t.num_elements();
  const int64_t size = DTypeSize(t.dtype());
  const auto* bytes = static_cast<const uint8_t*>(t.raw_data());
  if (n == 0) return "[]";
  bool splat = true;
  for (int64_t i = 1; i < n && splat; ++i)
    splat = std::memcmp(bytes, bytes + i * size, static_cast<size_t>(size)) == 0;
  if (splat) {
    std::string e = ReadableElement(t, 0);
    if (!e.empty()) return e;
  } else if (n <= kMaxReadableElements) {
    std::string out = "[";
    for (int64_t i = 0; i < n; ++i) {
      std::string e = ReadableElement(t, i);
      if (e.empty()) {
        out.clear();
        break;
      }
      if (i) out += ",";
      out += e;
    }
    if (!out.empty()) return out + "]";
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out = "0x";
  out.reserve(2 + 2 * static_cast<size_t>(t.byte_size()));
  for (int64_t i = 0; i < t.byte_size(); ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 15];
  }
  return out;
}

}  // namespace

std::string PrintGraph(const Graph& graph) {
  std::string out = "graph @" + SigilName(graph.name()) + " {\n";
  for (const FusionGroup& g : graph.fusion_groups())
    out +=
        "  fusion " + std::to_string(g.id) + " kind=" + std::string(FusionKindName(g.kind)) + "\n";
  for (const Node& n : graph.nodes()) {
    out += "  %" + std::to_string(n.id()) + " = " + std::string(OpcodeName(n.opcode())) + "(";
    for (size_t i = 0; i < n.operands().size(); ++i) {
      if (i) out += ", ";
      out += "%" + std::to_string(n.operands()[i]);
    }
    out += ")";
    std::vector<std::pair<std::string, std::string>> attrs;
    for (const auto& [name, value] : n.attrs()) attrs.emplace_back(name, FormatAttr(value));
    if (n.literal() != nullptr) attrs.emplace_back("value", FormatLiteral(*n.literal()));
    std::stable_sort(attrs.begin(), attrs.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    if (!attrs.empty()) {
      out += " {";
      for (size_t i = 0; i < attrs.size(); ++i) {
        if (i) out += ", ";
        out += IdentOrQuoted(attrs[i].first) + "=" + attrs[i].second;
      }
      out += "}";
    }
    out += " : " + n.type().ToString() + "\n";
  }
  out += "  return";
  for (size_t i = 0; i < graph.outputs().size(); ++i) {
    const Output& o = graph.outputs()[i];
    out += i ? ", " : " ";
    out += IdentOrQuoted(o.name) + "=%" + std::to_string(o.node);
    if (o.in_place_of >= 0)
      out += " in_place_of %" + std::to_string(graph.ParameterWithIndex(o.in_place_of));
  }
  out += "\n}\n";
  return out;
}

}  // namespace kiln::ir
