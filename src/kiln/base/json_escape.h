// JSON string literals for the JSON Kiln writes by hand (Chrome traces, Open Inference Protocol
// responses, model repository indexes), where a full JSON library would be the slow part.
//
//   std::string out = "{\"name\":";
//   AppendJsonString(name, &out);        // "\"conv1 \\\"a\\\"\""
//   out += "}";
//   std::string q = JsonQuote("tab\there");  // "\"tab\\there\""
//
// Output is always valid JSON (RFC 8259) whatever the input: '"' and '\' are escaped; \b \f \n \r
// \t get their short escapes and the other control characters (below U+0020) \u00XX; well-formed
// UTF-8 passes through unchanged; every byte that is not part of a well-formed UTF-8 sequence
// (stray continuation bytes, truncated or overlong sequences, surrogates, values past U+10FFFF)
// becomes \ufffd.
#ifndef KILN_BASE_JSON_ESCAPE_H_
#define KILN_BASE_JSON_ESCAPE_H_

#include <string>
#include <string_view>

namespace kiln {

// Appends `s` as a quoted JSON string literal.
void AppendJsonString(std::string_view s, std::string* out);
// `s` as a quoted JSON string literal.
std::string JsonQuote(std::string_view s);

}  // namespace kiln

#endif  // KILN_BASE_JSON_ESCAPE_H_
