#include "kiln/base/json_escape.h"

#include <cstdint>
#include <cstdio>

namespace kiln {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] (a byte >= 0x80), or 0.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  const size_t n = (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 0;
  if (n == 0 || s.size() - i - 1 < n) return 0;
  uint32_t cp = n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k <= n; ++k) {
    const uint8_t cc = static_cast<uint8_t>(s[i + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  const bool overlong = (n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000);
  if (overlong || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return 0;
  return n + 1;
}

void AppendAscii(char c, std::string* out) {
  switch (c) {
    case '"':
      out->append("\\\"");
      return;
    case '\\':
      out->append("\\\\");
      return;
    case '\b':
      out->append("\\b");
      return;
    case '\f':
      out->append("\\f");
      return;
    case '\n':
      out->append("\\n");
      return;
    case '\r':
      out->append("\\r");
      return;
    case '\t':
      out->append("\\t");
      return;
    default:
      break;
  }
  if (static_cast<uint8_t>(c) < 0x20) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
    out->append(buf);
  } else {
    out->push_back(c);
  }
}

}  // namespace

void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      AppendAscii(s[i], out);
      ++i;
    } else if (size_t n = Utf8SequenceLength(s, i); n > 0) {
      out->append(s.data() + i, n);
      i += n;
    } else {
      out->append("\\ufffd");
      ++i;
    }
  }
  out->push_back('"');
}

std::string JsonQuote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  AppendJsonString(s, &out);
  return out;
}

}  // namespace kiln
