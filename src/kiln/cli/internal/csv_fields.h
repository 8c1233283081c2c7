// The CSV row helpers `kiln predict` and `kiln quantize` share: their input files are the same
// rows of comma-separated numbers (predict_cmd.h describes the format).
#ifndef KILN_CLI_INTERNAL_CSV_FIELDS_H_
#define KILN_CLI_INTERNAL_CSV_FIELDS_H_

#include <charconv>
#include <string_view>
#include <system_error>
#include <vector>

namespace kiln::cli::internal {

// `s` without leading spaces/tabs and trailing spaces/tabs/CR.
inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The comma-separated fields of `line`, each trimmed (no quoting).
inline std::vector<std::string_view> SplitFields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (size_t i = 0; i <= line.size(); ++i) {
    if (i == line.size() || line[i] == ',') {
      fields.push_back(Trim(line.substr(start, i - start)));
      start = i + 1;
    }
  }
  return fields;
}

// The whole of `s` as a number (an optional leading '+'); false for anything else.
inline bool ParseDouble(std::string_view s, double* v) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace kiln::cli::internal

#endif  // KILN_CLI_INTERNAL_CSV_FIELDS_H_
