// `kiln predict MODEL --input-dir STUDIES --out FILE`: bulk classification of DICOM studies
// (docs/cli.md "kiln predict", docs/workloads.md "4. Bulk radiology classification"). A batch job:
// decoding (GDCM, the importer's preprocessing) runs on worker threads a chunk ahead of the model,
// which classifies whole batches (kiln/predict/studies.h and classifier.h: the library half);
// here are the flags, the wiring, the result lines (streamed to FILE.partial, renamed to FILE at
// the end), the progress lines and the report.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/cli/backends.h"
#include "kiln/cli/input_normalization.h"
#include "kiln/cli/predict_cmd.h"
#include "kiln/data/shard_io.h"
#include "kiln/predict/classifier.h"
#include "kiln/predict/studies.h"
#include "kiln/train/config.h"
#include "nlohmann/json.hpp"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string ClockText(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// Wall-clock time of day `seconds` from now, HH:MM:SS (local time).
std::string TimeOfDay(double seconds_from_now) {
  const std::time_t t =
      std::time(nullptr) + static_cast<std::time_t>(std::isfinite(seconds_from_now)
                                                        ? std::max(0.0, seconds_from_now)
                                                        : 0.0);
  std::tm tm{};
  localtime_r(&t, &tm);
  return absl::StrFormat("%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

// "90", "90s", "10m", "1h30m", "1.5h" to seconds.
absl::StatusOr<double> ParseDeadline(const std::string& s) {
  double total = 0;
  std::string num;
  bool any = false;
  for (char c : s) {
    if ((c >= '0' && c <= '9') || c == '.') {
      num.push_back(c);
      continue;
    }
    double v = 0, unit = 0;
    if (c == 's') unit = 1;
    if (c == 'm') unit = 60;
    if (c == 'h') unit = 3600;
    if (unit == 0 || num.empty() || !absl::SimpleAtod(num, &v)) {
      return absl::InvalidArgumentError("--deadline '" + s +
                                        "' is not a duration (e.g. 90s, 10m, 1h30m)");
    }
    total += v * unit;
    num.clear();
    any = true;
  }
  if (!num.empty()) {
    double v = 0;
    if (!absl::SimpleAtod(num, &v)) {
      return absl::InvalidArgumentError("--deadline '" + s + "' is not a duration");
    }
    total += v;
    any = true;
  }
  if (!any || !(total > 0)) {
    return absl::InvalidArgumentError("--deadline '" + s + "' must be a positive duration");
  }
  return total;
}

std::string JsonString(const std::string& s) { return nlohmann::json(s).dump(); }

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q.push_back('"');
    q.push_back(c);
  }
  return q + "\"";
}

using predict::Classifier;
using predict::Preprocess;
using predict::Study;

// The flags of --input-dir checked; *deadline: seconds, 0 for none.
absl::Status CheckStudyFlags(const PredictOptions& o, double* deadline) {
  const bool jsonl = absl::EndsWith(o.out, ".jsonl");
  if (o.out.empty() || (!jsonl && !absl::EndsWith(o.out, ".csv"))) {
    return absl::InvalidArgumentError("--input-dir needs --out FILE.jsonl or FILE.csv");
  }
  if (!o.input.empty() || !o.output.empty()) {
    return absl::InvalidArgumentError(
        "--input-dir and --out replace --input and --output: give one pair");
  }
  *deadline = 0;
  if (!o.deadline.empty()) {
    KILN_ASSIGN_OR_RETURN(*deadline, ParseDeadline(o.deadline));
  }
  if (o.batch < 1) return absl::InvalidArgumentError("--batch must be >= 1");
  return absl::OkStatus();
}

// The model: a run directory's newest checkpoint or an exported artifact; *dataset: the DICOM
// import whose preprocessing it was trained with (--dataset, or the run's data.source).
absl::StatusOr<std::unique_ptr<Classifier>> OpenModel(const PredictOptions& o,
                                                      std::string* dataset) {
  std::error_code ec;
  const bool is_run = fs::exists(JoinPath(o.artifact, "config.yaml"), ec) &&
                      !fs::exists(JoinPath(o.artifact, "manifest.json"), ec);
  if (is_run) {
    absl::StatusOr<train::TrainConfig> config =
        train::LoadTrainConfig(JoinPath(o.artifact, "config.yaml"), {"output_dir=" + o.artifact});
    if (!config.ok()) return Annotate(config.status(), "reading run " + o.artifact);
    if (dataset->empty()) {
      if (config->data.source.rfind("dataset:", 0) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("run ", o.artifact, " trained on data.source ", config->data.source,
                         ", not an imported dataset: give --dataset DIR (the DICOM import whose "
                         "preprocessing to repeat)"));
      }
      *dataset = config->data.source.substr(8);
    }
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend, MakeBackendByName(o.backend));
    return Classifier::OpenRun(*config, o.batch, std::move(backend),
                               InputNormalizationOf(*config, "x"));
  }
  if (dataset->empty()) {
    return absl::InvalidArgumentError(
        "--input-dir with an exported artifact needs --dataset DIR: the DICOM import the model "
        "was trained on (its dataset.json gives the size, window, channels, normalization and "
        "label names)");
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Backend> backend, MakeBackendByName(o.backend));
  return Classifier::OpenArtifact(o.artifact, std::move(backend));
}

// Progress lines on `err`: a bar redrawn on a terminal, a line every 5 s otherwise; rate, ETA, the
// predicted finish and, with a deadline, whether it is on time.
class Progress {
 public:
  Progress(std::ostream& err, int64_t n, double deadline, Clock::time_point start)
      : err_(err), n_(n), deadline_(deadline), start_(start) {}

  void Report(int64_t done, bool end) {
    const double elapsed = Seconds(Clock::now() - start_);
    if (!end && Seconds(Clock::now() - last_) < (tty_ ? 0.1 : 5.0)) return;
    last_ = Clock::now();
    const double rate = elapsed > 0 ? done / elapsed : 0;
    const double eta = rate > 0 ? (n_ - done) / rate : NAN;
    std::string line = absl::StrFormat("predict: %d/%d studies (%.1f%%), %.1f studies/s, %s %s",
                                       done, n_, 100.0 * done / n_, rate, end ? "elapsed" : "ETA",
                                       ClockText(end ? elapsed : eta));
    if (!end) {
      absl::StrAppend(&line, ", finish ~", TimeOfDay(eta));
      if (deadline_ > 0) {
        const bool on_time = std::isfinite(eta) && elapsed + eta <= deadline_;
        absl::StrAppend(&line, " (deadline ", TimeOfDay(deadline_ - elapsed), ": ",
                        on_time ? "on time" : "LATE", ")");
      }
    }
    if (tty_) {
      const int width = 24, fill = static_cast<int>(width * done / n_);
      err_ << "\r[" << std::string(fill, '#') << std::string(width - fill, '.') << "] " << line
           << "\x1b[K" << (end ? "\n" : "") << std::flush;
    } else {
      err_ << line << "\n" << std::flush;
    }
  }

 private:
  std::ostream& err_;
  const int64_t n_;
  const double deadline_;
  const Clock::time_point start_;
  const bool tty_ = &err_ == &std::cerr && isatty(STDERR_FILENO);
  Clock::time_point last_ = Clock::now() - std::chrono::hours(1);
};

void WriteCsvHeader(std::ostream& results, const std::vector<std::string>& labels) {
  results << "path,label";
  for (const std::string& l : labels) results << ",p_" << CsvField(l);
  results << ",error\n";
}

// One study's result line: the label and probabilities, or the error.
void WriteResult(std::ostream& results, bool jsonl, const std::vector<std::string>& labels,
                 const std::string& rel, const Study& st) {
  if (!st.error.empty()) {
    if (jsonl) {
      results << "{\"path\":" << JsonString(rel) << ",\"error\":" << JsonString(st.error) << "}\n";
    } else {
      results << CsvField(rel) << ",";
      for (size_t k = 0; k < labels.size(); ++k) results << ",";
      results << "," << CsvField(st.error) << "\n";
    }
    return;
  }
  const std::vector<double>& p = st.probabilities;
  const size_t best = std::max_element(p.begin(), p.end()) - p.begin();
  if (jsonl) {
    results << "{\"path\":" << JsonString(rel) << ",\"label\":" << JsonString(labels[best])
            << ",\"probabilities\":{";
    for (size_t k = 0; k < p.size(); ++k) {
      results << (k ? "," : "") << JsonString(labels[k]) << ":" << absl::StrFormat("%.6g", p[k]);
    }
    results << "}}\n";
  } else {
    results << CsvField(rel) << "," << CsvField(labels[best]);
    for (double v : p) results << "," << absl::StrFormat("%.6g", v);
    results << ",\n";
  }
}

// The final report on `out`; returns the exit code.
int FinishReport(const PredictOptions& o, int64_t classified, int64_t n, double wall, int threads,
                 double deadline, const std::vector<std::pair<std::string, std::string>>& failures,
                 std::ostream& out) {
  const bool late = deadline > 0 && wall > deadline;
  out << absl::StrFormat("classified %d of %d studies in %.2f s (%.1f studies/s, %d threads)",
                         classified, n, wall, n / wall, threads);
  out << "; wrote " << o.out << "\n";
  if (deadline > 0) {
    out << absl::StrFormat("deadline %s: %s (%.2f s of %.2f s)\n", o.deadline,
                           late ? "MISSED" : "met", wall, deadline);
  }
  if (!failures.empty()) {
    out << failures.size() << (failures.size() == 1 ? " study" : " studies")
        << " failed to decode (in " << o.out << " with the error):\n";
    for (const auto& [rel, e] : failures) {  // the decoder's messages start with the name
      out << "  " << (absl::StartsWith(e, rel + ":") ? e : rel + ": " + e) << "\n";
    }
  }
  if (late && !failures.empty()) return kPredictExitLateAndFailures;
  if (late) return kPredictExitLate;
  if (!failures.empty()) return kPredictExitFailures;
  return 0;
}

}  // namespace

int RunPredictStudies(const PredictOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const absl::Status& s) {
    err << "kiln predict: " << s.message() << "\n";
    return 1;
  };
#ifndef KILN_HAVE_GDCM
  (void)out;
  return fail(absl::UnimplementedError(
      "--input-dir decodes DICOM with GDCM, and this kiln was built without libgdcm-dev"));
#else
  double deadline = 0;
  if (absl::Status s = CheckStudyFlags(o, &deadline); !s.ok()) return fail(s);
  const bool jsonl = absl::EndsWith(o.out, ".jsonl");
  const auto start = Clock::now();
  std::string dataset = o.dataset;
  absl::StatusOr<std::unique_ptr<Classifier>> model = OpenModel(o, &dataset);
  if (!model.ok()) return fail(model.status());
  absl::StatusOr<Preprocess> pre = predict::ReadPreprocess(dataset);
  if (!pre.ok()) return fail(pre.status());
  if (absl::Status s = predict::CheckCompatible(**model, *pre, dataset); !s.ok()) return fail(s);
  absl::StatusOr<std::vector<std::string>> files = predict::ListStudies(o.input_dir);
  if (!files.ok()) return fail(files.status());
  const int64_t n = static_cast<int64_t>(files->size());
  if (n == 0) return fail(absl::InvalidArgumentError("--input-dir " + o.input_dir + " is empty"));
  const int threads = data::ResolveThreads(o.threads);

  const std::string partial = o.out + ".partial";
  std::ofstream results(partial, std::ios::trunc);
  if (!results) return fail(absl::InvalidArgumentError("cannot write " + partial));
  if (!jsonl) WriteCsvHeader(results, pre->labels);
  Progress progress(err, n, deadline, start);
  int64_t done = 0, classified = 0;
  std::vector<std::pair<std::string, std::string>> failures;
  absl::Status run =
      predict::ClassifyStudies(**model, *pre, o.input_dir, *files, threads,
                               [&](int64_t base, const std::vector<Study>& chunk) {
                                 for (size_t i = 0; i < chunk.size(); ++i) {
                                   const std::string& rel = (*files)[base + i];
                                   WriteResult(results, jsonl, pre->labels, rel, chunk[i]);
                                   if (chunk[i].error.empty()) {
                                     ++classified;
                                   } else {
                                     failures.emplace_back(rel, chunk[i].error);
                                   }
                                 }
                                 results.flush();
                                 done += static_cast<int64_t>(chunk.size());
                                 if (!o.quiet) progress.Report(done, false);
                                 return absl::OkStatus();
                               });
  results.close();
  if (!run.ok()) return fail(run);
  if (!results || std::rename(partial.c_str(), o.out.c_str()) != 0) {
    return fail(absl::InternalError("cannot write " + o.out));
  }
  const double wall = Seconds(Clock::now() - start);
  if (!o.quiet) progress.Report(done, true);
  return FinishReport(o, classified, n, wall, threads, deadline, failures, out);
#endif
}

}  // namespace kiln::cli
