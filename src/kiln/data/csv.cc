#include "kiln/data/csv.h"

#include <charconv>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::data {

std::string_view TrimCsvField(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool ParseCsvDouble(std::string_view s, double* v) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// RFC 4180 records (with quoting); a quote inside an unquoted field, or text after a closing
// quote, is an error.
absl::StatusOr<std::vector<CsvRecord>> ParseCsv(std::string_view text, const std::string& source,
                                                const CsvOptions& options) {
  const char delim = options.delimiter;
  std::vector<CsvRecord> out;
  size_t i = 0;
  int64_t line = 1;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") i = 3;  // UTF-8 byte order mark
  while (i < text.size()) {
    CsvRecord r;
    r.line = line;
    int64_t col_start = 1;
    size_t line_start = i;
    std::string field;
    bool quoted = false;
    bool done = false;
    auto push = [&] {
      if (options.trim && !quoted) field = std::string(TrimCsvField(field));
      r.fields.push_back(std::move(field));
      field.clear();
    };
    while (!done) {
      if (i >= text.size()) {
        push();
        break;
      }
      const char ch = text[i];
      if (options.quoting && field.empty() && !quoted && ch == '"') {
        quoted = true;
        ++i;
        while (true) {
          if (i >= text.size()) {
            return absl::InvalidArgumentError(
                absl::StrCat(source, ":", r.line, ":", col_start, ": unterminated quoted field"));
          }
          if (text[i] == '"') {
            if (i + 1 < text.size() && text[i + 1] == '"') {
              field.push_back('"');
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (text[i] == '\n') {
            ++line;
            line_start = i + 1;
          }
          field.push_back(text[i++]);
        }
        if (i < text.size() && text[i] != delim && text[i] != '\n' && text[i] != '\r') {
          return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ":", i - line_start + 1,
                                                         ": text after a closing quote"));
        }
        continue;
      }
      if (ch == delim) {
        push();
        quoted = false;
        ++i;
        col_start = static_cast<int64_t>(i - line_start) + 1;
      } else if (ch == '\n' || ch == '\r') {
        push();
        i += (ch == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ? 2 : 1;
        ++line;
        done = true;
      } else {
        if (options.quoting && ch == '"' && !quoted) {
          return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ":", i - line_start + 1,
                                                         ": quote inside an unquoted field"));
        }
        field.push_back(ch);
        ++i;
      }
    }
    const bool blank = r.fields.size() == 1 && r.fields[0].empty();
    if (!blank) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kiln::data
