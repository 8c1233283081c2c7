#include "kiln/data/digits.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/data/csv.h"

namespace kiln::data {
namespace {

// For messages: the field as written, shortened if long.
std::string Quote(std::string_view s) {
  if (s.size() > 24) return absl::StrCat("'", std::string(s.substr(0, 24)), "...'");
  return absl::StrCat("'", std::string(s), "'");
}

}  // namespace

absl::StatusOr<Dataset> ParseLabeledCsv(std::string_view text, const std::string& source,
                                        const LabeledCsvOptions& options) {
  if (options.num_features < 1 || options.num_classes < 1 || !(options.max_feature > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": bad CSV options (need num_features >= 1, num_classes >= 1, ",
                     "max_feature > 0)"));
  }
  const int64_t f = options.num_features;
  const int64_t columns = f + 1;
  std::vector<float> features;
  std::vector<int32_t> labels;
  CsvOptions csv;
  csv.quoting = false;  // rows of plain numbers
  csv.trim = true;
  KILN_ASSIGN_OR_RETURN(std::vector<CsvRecord> rows, ParseCsv(text, source, csv));
  for (const CsvRecord& row : rows) {
    const std::vector<std::string>& fields = row.fields;
    const std::string where = absl::StrCat(source, ":", row.line, ": ");
    if (static_cast<int64_t>(fields.size()) != columns) {
      return absl::InvalidArgumentError(absl::StrCat(where, "expected ", columns, " columns (", f,
                                                     " features, then the label), got ",
                                                     fields.size()));
    }
    for (int64_t c = 0; c < f; ++c) {
      double v;
      if (!ParseCsvDouble(fields[c], &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "column ", c + 1, ": ", Quote(fields[c]), " is not a number"));
      }
      if (v < 0 || v > options.max_feature) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "column ", c + 1, ": value ", v, " is outside [0, ", options.max_feature, "]"));
      }
      features.push_back(static_cast<float>(v / options.max_feature));
    }
    double label;
    if (!ParseCsvDouble(fields[f], &label) || !std::isfinite(label) || label != std::floor(label)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "column ", columns, " (label): ", Quote(fields[f]), " is not an integer"));
    }
    if (label < 0 || label >= static_cast<double>(options.num_classes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "label ", label, " is outside [0, ", options.num_classes, ")"));
    }
    labels.push_back(static_cast<int32_t>(label));
  }
  if (labels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no data rows"));
  }

  const int64_t n = static_cast<int64_t>(labels.size());
  Dataset ds;
  ds.num_classes = options.num_classes;
  ds.features = Tensor(DType::kF32, Shape{n, f});
  std::memcpy(ds.features.raw_data(), features.data(), features.size() * sizeof(float));
  ds.labels = Tensor(DType::kS32, Shape{n});
  std::memcpy(ds.labels.raw_data(), labels.data(), labels.size() * sizeof(int32_t));
  return ds;
}

namespace {

// Inflates gzip `in` (one or more concatenated members, as gzip and zlib's gzread allow); bytes
// after the last member that do not start another one are ignored, as gzread does.
absl::StatusOr<std::string> Gunzip(const std::string& in, const std::string& path) {
  z_stream z = {};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrCat(path, ": cannot start zlib"));
  }
  std::string out;
  std::vector<char> buf(1 << 16);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(buf.data());
    z.avail_out = static_cast<uInt>(buf.size());
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf.data(), buf.size() - z.avail_out);
    if (rc == Z_STREAM_END) {
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) break;
      inflateReset(&z);  // another member follows
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // the input ended inside a member
    const std::string what = z.msg != nullptr ? z.msg : "unknown error";
    inflateEnd(&z);
    return absl::DataLossError(absl::StrCat(path, ": corrupt gzip data: ", what));
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated or corrupt gzip data (zlib code ", rc, ")"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadMaybeGzippedFile(const std::string& path, Env* env) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path));
  const bool gzip = bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f &&
                    static_cast<uint8_t>(bytes[1]) == 0x8b;
  if (!gzip) return bytes;
  return Gunzip(bytes, path);
}

absl::StatusOr<Dataset> LoadLabeledCsv(const std::string& path, const LabeledCsvOptions& options,
                                       Env* env) {
  KILN_ASSIGN_OR_RETURN(std::string text, ReadMaybeGzippedFile(path, env));
  return ParseLabeledCsv(text, path, options);
}

}  // namespace kiln::data
