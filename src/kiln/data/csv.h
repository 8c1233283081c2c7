// The one CSV reader of Kiln: `kiln data import csv` (RFC 4180 quoting, a schema's delimiter),
// the digits loader (digits.h) and the CSV inputs of `kiln predict` / `kiln quantize` (plain
// comma-separated numbers, fields trimmed) all split their text here.
//
//   KILN_ASSIGN_OR_RETURN(std::vector<CsvRecord> rows, ParseCsv(text, "clicks.csv"));
//   rows[0].line;        // 1-based line the record starts on
//   rows[0].fields[2];   // the third field, quotes removed ("a ""b""" -> a "b")
//
//   CsvOptions plain;    // numbers only: quotes are ordinary characters, fields trimmed
//   plain.quoting = false;
//   plain.trim = true;
//
// Records end at "\n", "\r\n" or a lone "\r". A UTF-8 byte order mark at the start is skipped.
// Blank lines (one field, empty after trimming) are skipped but counted. With quoting on, a field
// that starts with '"' is quoted: it runs to the next lone '"' ("" is one quote) and may hold the
// delimiter and newlines. Errors (InvalidArgument) name source:line:column: "unterminated quoted
// field", "text after a closing quote", "quote inside an unquoted field".
#ifndef KILN_DATA_CSV_H_
#define KILN_DATA_CSV_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::data {

struct CsvOptions {
  char delimiter = ',';
  bool quoting = true;  // RFC 4180 quotes; false: '"' is an ordinary character
  bool trim = false;    // strip spaces and tabs around each unquoted field
};

struct CsvRecord {
  int64_t line = 0;  // 1-based line where the record starts
  std::vector<std::string> fields;
};

// Every non-blank record of `text`; `source` names it in errors (usually the file name).
absl::StatusOr<std::vector<CsvRecord>> ParseCsv(std::string_view text, const std::string& source,
                                                const CsvOptions& options = {});

// `s` without leading and trailing spaces and tabs.
std::string_view TrimCsvField(std::string_view s);

// The whole of `s` as a number (an optional leading '+'; "inf" and "nan" parse, callers that need
// a finite value check std::isfinite); false for anything else, including "".
bool ParseCsvDouble(std::string_view s, double* v);

}  // namespace kiln::data

#endif  // KILN_DATA_CSV_H_
