// Loaders for small labeled CSV datasets such as scikit-learn's handwritten digits
// (examples/data/digits.csv.gz: 1797 rows of 64 pixel intensities 0..16, then the class 0..9;
// no header). Gzip-compressed and plain files are both read, through kiln::Env.
//
//   KILN_ASSIGN_OR_RETURN(Dataset digits, LoadDigitsCsv("examples/data/digits.csv.gz"));
//   digits.features;   // f32[1797,64], pixels scaled by 1/16 into [0, 1]
//   digits.labels;     // s32[1797]
//
// A malformed row is an InvalidArgument error naming the file, the line and what was wrong,
// e.g. "digits.csv:7: expected 65 columns (64 features, then the label), got 64".
#ifndef KILN_DATA_DIGITS_H_
#define KILN_DATA_DIGITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset.h"

namespace kiln::data {

struct LabeledCsvOptions {
  int64_t num_features = 64;
  int64_t num_classes = 10;
  // Features must lie in [0, max_feature]; they are divided by it (so land in [0, 1]).
  double max_feature = 16.0;
};

// Parses CSV text: each non-blank line holds num_features numbers then an integer label.
// `source` names the text in error messages (usually the file name).
absl::StatusOr<Dataset> ParseLabeledCsv(std::string_view text, const std::string& source,
                                        const LabeledCsvOptions& options = {});

// Reads `path` (gzip or plain) through `env` and parses it. NotFound if the file does not exist,
// DataLoss if the gzip stream is corrupt or truncated.
absl::StatusOr<Dataset> LoadLabeledCsv(const std::string& path,
                                       const LabeledCsvOptions& options = {},
                                       Env* env = Env::Default());

// The digits layout: 64 features in [0, 16], 10 classes.
inline absl::StatusOr<Dataset> LoadDigitsCsv(const std::string& path, Env* env = Env::Default()) {
  return LoadLabeledCsv(path, LabeledCsvOptions{}, env);
}

// The whole file, gunzipped when it is gzip-compressed (it starts with the gzip magic 1f 8b).
absl::StatusOr<std::string> ReadMaybeGzippedFile(const std::string& path,
                                                 Env* env = Env::Default());

}  // namespace kiln::data

#endif  // KILN_DATA_DIGITS_H_
