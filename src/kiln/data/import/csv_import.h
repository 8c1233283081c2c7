// `kiln data import csv`: a CSV file (plain or gzip) and a YAML schema become record shards plus
// dataset.json (docs/data.md "csv").
//
//   CsvImportOptions o;
//   o.file = "clicks.csv"; o.schema = "clicks.schema.yaml"; o.out_dir = "/data/clicks";
//   KILN_ASSIGN_OR_RETURN(ImportSummary s, ImportCsv(Env::Default(), o, progress));
//
// The schema (YAML):
//   header: true          # default true: the first record names the columns
//   delimiter: ","        # one character; default ","
//   label: clicked        # optional: the label column
//   columns:              # a map (matched to the header by name) or a list of {name, type}
//     user: categorical   #   (matched by name with a header, by position without one)
//     price: numeric
//     clicked: categorical
//     note: ignore
//     age: {type: numeric, default: 0}               # the value of an empty cell
//     country: {type: categorical, vocabulary: [de, fr]}   # fixed ids; other values are errors
// With a header every CSV column must be listed (ignore ones to drop). Each record gets one
// feature per non-ignored column, named like it: numeric -> float_list [1 value], categorical ->
// int64_list [the value's id in the column's vocabulary: its fixed list, else every distinct
// value of the file sorted bytewise, or numerically when all are integers]. The label column's
// vocabulary is the manifest's label vocabulary. Quoting is RFC 4180 ("a ""b""", newlines inside
// quotes). Errors name file:line:column and the column.
#ifndef KILN_DATA_IMPORT_CSV_IMPORT_H_
#define KILN_DATA_IMPORT_CSV_IMPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/import/image_import.h"
#include "kiln/data/import_util.h"

namespace kiln::data {

struct CsvImportOptions {
  std::string file;
  std::string schema;
  std::string out_dir;
  int shards = 4;
  double held_out = 0.1;
  uint64_t seed = 0;
  int threads = 0;  // 0: all cores
};

absl::StatusOr<ImportSummary> ImportCsv(Env* env, const CsvImportOptions& options,
                                        const ProgressFn& progress = nullptr);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_CSV_IMPORT_H_
