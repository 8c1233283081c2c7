#include "kiln/base/json_escape.h"

#include <string>

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(JsonEscape, QuotesAndBackslash) {
  EXPECT_EQ(JsonQuote(""), "\"\"");
  EXPECT_EQ(JsonQuote("plain"), "\"plain\"");
  EXPECT_EQ(JsonQuote("a\"b\\c/"), "\"a\\\"b\\\\c/\"");
}

TEST(JsonEscape, ControlCharacters) {
  EXPECT_EQ(JsonQuote("\b\f\n\r\t"), "\"\\b\\f\\n\\r\\t\"");
  EXPECT_EQ(JsonQuote(std::string("\x00\x01\x1f", 3)), "\"\\u0000\\u0001\\u001f\"");
  EXPECT_EQ(JsonQuote("\x7f"), "\"\x7f\"");  // DEL needs no escape
}

TEST(JsonEscape, Utf8PassesThrough) {
  EXPECT_EQ(JsonQuote("h\xc3\xa9llo"), "\"h\xc3\xa9llo\"");          // U+00E9
  EXPECT_EQ(JsonQuote("\xe2\x82\xac"), "\"\xe2\x82\xac\"");          // U+20AC
  EXPECT_EQ(JsonQuote("\xf0\x9f\x98\x80"), "\"\xf0\x9f\x98\x80\"");  // U+1F600
  EXPECT_EQ(JsonQuote("\xf4\x8f\xbf\xbf"), "\"\xf4\x8f\xbf\xbf\"");  // U+10FFFF
}

TEST(JsonEscape, InvalidUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(JsonQuote("a\xff"), "\"a\\ufffd\"");                      // not a lead byte
  EXPECT_EQ(JsonQuote("\x80"), "\"\\ufffd\"");                        // stray continuation
  EXPECT_EQ(JsonQuote("\xc3"), "\"\\ufffd\"");                        // truncated
  EXPECT_EQ(JsonQuote("\xc0\xaf"), "\"\\ufffd\\ufffd\"");             // overlong '/'
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // surrogate U+D800
  EXPECT_EQ(JsonQuote("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // > U+10FFFF
}

TEST(JsonEscape, AppendsToExisting) {
  std::string out = "{\"k\":";
  AppendJsonString("v", &out);
  out += "}";
  EXPECT_EQ(out, "{\"k\":\"v\"}");
}

}  // namespace
}  // namespace kiln
