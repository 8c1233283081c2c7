#include "kiln/cli/data_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/import/click_log.h"
#include "kiln/data/import_util.h"
#include "kiln/data/shard_io.h"

namespace kiln::cli {
namespace {

std::string Clock(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// Draws ImportProgress: on a terminal a bar redrawn in place (at most 10 times a second), else
// one plain line every 5 seconds and one when a phase ends. Rate and ETA count only the items
// this run processed (resumed shards are not "fast").
class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& err, bool tty, bool quiet) : err_(err), tty_(tty), quiet_(quiet) {}
  ~ProgressPrinter() {
    if (drawn_ && tty_) err_ << "\n";
  }

  void operator()(const data::ImportProgress& p) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    if (p.phase != phase_) {
      if (drawn_ && tty_) err_ << "\n";
      phase_ = p.phase;
      start_ = now;
      last_ = now - std::chrono::hours(1);
      base_ = p.done;
      drawn_ = false;
    }
    const double since_last = std::chrono::duration<double>(now - last_).count();
    const bool end = p.done >= p.total;
    if (since_last < (tty_ ? 0.1 : 5.0) && !end) return;
    if (!tty_ && (p.done == base_ || now == start_) && !end) return;  // no rate yet
    if (end && ended_ == phase_) return;
    if (end) ended_ = phase_;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? (p.done - base_) / elapsed : 0;
    const double eta = rate > 0 ? (p.total - p.done) / rate : -1;
    const double frac = p.total > 0 ? static_cast<double>(p.done) / p.total : 1;
    std::string line = absl::StrFormat("%s: %d/%d %s (%.1f%%), %.1f %s/s, %s %s", p.phase, p.done,
                                       p.total, p.unit, 100 * frac, rate, p.unit,
                                       end ? "elapsed" : "ETA", end ? Clock(elapsed) : Clock(eta));
    if (tty_) {
      const int width = 24, fill = static_cast<int>(frac * width);
      err_ << "\r[" << std::string(fill, '#') << std::string(width - fill, '.') << "] " << line
           << "\x1b[K" << std::flush;
    } else {
      err_ << line << "\n" << std::flush;
    }
    drawn_ = true;
  }

 private:
  std::ostream& err_;
  bool tty_, quiet_;
  std::string phase_, ended_;
  std::chrono::steady_clock::time_point start_, last_;
  int64_t base_ = 0;
  bool drawn_ = false;
};

absl::Status ParseSize(const std::string& s, int* h, int* w) {
  std::vector<std::string> parts = absl::StrSplit(s, 'x');
  if (parts.size() == 1) parts.push_back(parts[0]);
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], h) || !absl::SimpleAtoi(parts[1], w)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--size '", s, "' is not HxW (e.g. 32x32) or a single side"));
  }
  return absl::OkStatus();
}

void PrintSummary(std::ostream& out, const std::string& dir, const data::ImportSummary& s,
                  double seconds, const std::string& unit) {
  std::string splits;
  for (const auto& [name, n] : s.splits)
    absl::StrAppend(&splits, splits.empty() ? "" : ", ", name, " ", n);
  out << "wrote " << s.examples << " examples (" << splits << ") in " << s.shards << " shards to "
      << dir;
  if (s.shards_kept > 0) out << " (" << s.shards_kept << " kept from an earlier run)";
  out << "\n";
  if (s.skipped > 0)
    out << "skipped " << s.skipped << " inputs that did not decode (listed in dataset.json)\n";
  if (s.ignored > 0) out << "ignored " << s.ignored << " files that are not inputs\n";
  for (const auto& [phase, t] : s.phase_seconds) out << absl::StrFormat("  %s: %.2f s\n", phase, t);
  out << absl::StrFormat("%.2f s, %.1f %s/s\n", seconds, seconds > 0 ? s.units / seconds : 0.0,
                         unit);
}

// Checks one decoded example against the schema: every feature present with its kind and
// element count.
absl::Status CheckSchema(const data::DatasetManifest& m, const data::Example& ex) {
  for (const data::FeatureSchema& f : m.features) {
    auto it = ex.features.find(f.name);
    if (it == ex.features.end()) return absl::DataLossError("feature '" + f.name + "' missing");
    int64_t n = 1;
    for (int64_t d : f.shape) n *= d;
    const data::Feature& v = it->second;
    int64_t got = -1;
    if (f.dtype == "uint8" && v.kind == data::Feature::Kind::kBytes && v.bytes_list.size() == 1) {
      got = static_cast<int64_t>(v.bytes_list[0].size());
    } else if (f.dtype == "string" && v.kind == data::Feature::Kind::kBytes) {
      got = static_cast<int64_t>(v.bytes_list.size());
    } else if (f.dtype == "float32" && v.kind == data::Feature::Kind::kFloat) {
      got = static_cast<int64_t>(v.float_list.size());
    } else if (f.dtype == "int64" && v.kind == data::Feature::Kind::kInt64) {
      got = static_cast<int64_t>(v.int64_list.size());
    }
    if (got != n) {
      return absl::DataLossError(absl::StrCat("feature '", f.name, "' is not ", f.dtype, " with ",
                                              n, " elements (a ", data::FeatureKindName(v.kind),
                                              " list)"));
    }
  }
  return absl::OkStatus();
}

// Prints the manifest summary; with `verify`, first checks every shard's size and CRC32C, reads
// every record (framing CRCs, tf.train.Example parse, schema) and compares the counts.
absl::Status InspectDataset(const std::string& dir, bool verify, std::ostream& out) {
  Env* env = Env::Default();
  KILN_ASSIGN_OR_RETURN(data::DatasetManifest m, data::ReadManifest(env, dir));
  out << "dataset " << dir << " (" << m.kind << ", source " << m.source_files << " files, "
      << m.source_bytes << " bytes, fingerprint " << m.source_fingerprint << ")\n";
  out << "features:\n";
  for (const data::FeatureSchema& f : m.features) {
    std::string shape;
    for (int64_t d : f.shape) absl::StrAppend(&shape, shape.empty() ? "" : ",", d);
    out << "  " << f.name << ": " << f.dtype << "[" << shape << "]";
    if (m.statistics.contains(f.name) && m.statistics[f.name].contains("mean")) {
      out << "  mean " << m.statistics[f.name]["mean"].dump() << " std "
          << m.statistics[f.name]["std"].dump() << " min " << m.statistics[f.name]["min"].dump()
          << " max " << m.statistics[f.name]["max"].dump();
    }
    out << "\n";
  }
  if (!m.label_feature.empty()) {
    out << "labels (" << m.label_vocabulary.size() << "):";
    for (size_t i = 0; i < m.label_vocabulary.size() && i < 20; ++i)
      out << " " << m.label_vocabulary[i];
    if (m.label_vocabulary.size() > 20) out << " ...";
    out << "\n";
  }
  for (const auto& [name, vocab] : m.vocabularies) {
    out << "vocabulary " << name << ": " << vocab.size() << " values\n";
  }
  std::map<std::string, int> shard_counts;
  for (const data::ShardEntry& s : m.shards) ++shard_counts[s.split];
  for (const auto& [split, n] : m.SplitExamples()) {
    out << "split " << split << ": " << n << " examples in " << shard_counts[split] << " shards\n";
  }
  if (!m.skipped.empty()) out << "skipped inputs: " << m.skipped.size() << "\n";
  if (!verify) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(data::VerifyShards(env, dir, m));
  int64_t total = 0;
  for (const data::ShardEntry& s : m.shards) {
    const std::string path = JoinPath(dir, s.file);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<data::ExampleReader> r,
                          data::ExampleReader::Open(env, path));
    data::Example ex;
    int64_t n = 0;
    while (true) {
      const uint64_t at = r->offset();
      KILN_ASSIGN_OR_RETURN(bool got, r->Next(&ex));
      if (!got) break;
      absl::Status ok = CheckSchema(m, ex);
      if (!ok.ok()) return Annotate(ok, absl::StrCat(path, " record at offset ", at));
      ++n;
    }
    if (n != s.examples) {
      return absl::DataLossError(
          absl::StrCat(path, " holds ", n, " records; dataset.json says ", s.examples));
    }
    total += n;
  }
  out << "verified " << m.shards.size() << " shards: sizes, CRC32C, " << total
      << " records parsed and matching the schema\n";
  return absl::OkStatus();
}

}  // namespace

DataCommands::DataCommands(CLI::App& app) {
  data_ =
      app.add_subcommand("data", "Import data into record shards and inspect them (docs/data.md)");
  data_->require_subcommand(1);
  CLI::App* import = data_->add_subcommand(
      "import",
      "Convert images, CSV or text into TFRecord shards of tf.train.Example + dataset.json");
  import->require_subcommand(1);

  images_ = import->add_subcommand(
      "images", "Folders of JPEG/PNG files, one folder per label, to fixed-size pixels");
  images_->add_option("src", image_opts_.src_dir, "Folder holding one subfolder per label")
      ->required();
  images_->add_option("--out", image_opts_.out_dir, "Dataset folder to write")->required();
  images_->add_option("--size", size_, "Output HxW in pixels (e.g. 32x32; 32 means 32x32)")
      ->required();
  images_->add_option("--channels", image_opts_.channels, "1 (gray) or 3 (RGB)")
      ->capture_default_str();
  images_
      ->add_option("--resize", image_opts_.resize,
                   "crop: keep the aspect ratio and take the centre; fit: scale to HxW exactly")
      ->capture_default_str();
  images_
      ->add_option("--background", image_opts_.background,
                   "Gray level 0..255 that transparent pixels are composited over")
      ->capture_default_str();
  images_->add_option("--shards", image_opts_.shards, "Shards of the train split")
      ->capture_default_str();
  images_->add_option("--held-out", image_opts_.held_out, "Fraction of the files in split held_out")
      ->capture_default_str();
  images_->add_option("--seed", image_opts_.seed, "Seed of the split permutation")
      ->capture_default_str();
  images_->add_option("--threads", image_opts_.threads, "Decoding threads (0: all cores)")
      ->capture_default_str();
  images_
      ->add_option("--on-error", image_opts_.on_error,
                   "fail: stop at the first file that does not decode; skip: list it and go on")
      ->capture_default_str();
  images_->add_flag("--quiet", quiet_, "No progress output");

  csv_ = import->add_subcommand(
      "csv", "A CSV file (plain or .gz) with a YAML schema to one example per row");
  csv_->add_option("file", csv_opts_.file, "CSV file (.csv or .csv.gz)")->required();
  csv_->add_option("--schema", csv_opts_.schema, "YAML schema: columns and their types, the label")
      ->required();
  csv_->add_option("--out", csv_opts_.out_dir, "Dataset folder to write")->required();
  csv_->add_option("--shards", csv_opts_.shards, "Shards of the train split")
      ->capture_default_str();
  csv_->add_option("--held-out", csv_opts_.held_out, "Fraction of the rows in split held_out")
      ->capture_default_str();
  csv_->add_option("--seed", csv_opts_.seed, "Seed of the split permutation")
      ->capture_default_str();
  csv_->add_option("--threads", csv_opts_.threads, "Encoding threads (0: all cores)")
      ->capture_default_str();
  csv_->add_flag("--quiet", quiet_, "No progress output");

  text_ = import->add_subcommand(
      "text", "Text corpora to a SentencePiece tokenizer and token shards packed to --seq-len");
  text_
      ->add_option("corpus", text_opts_.corpus,
                   "Text files (plain or .gz), UTF-8; with --language-from-dir, one folder per "
                   "language (DIR or LANG=DIR)")
      ->required();
  text_->add_option("--out", text_opts_.out_dir, "Dataset folder to write")->required();
  text_
      ->add_option("--vocab-size", text_opts_.vocab_size, "SentencePiece vocabulary size (at most)")
      ->capture_default_str();
  text_
      ->add_option("--seq-len", text_opts_.seq_len, "Tokens per example (records hold seq_len + 1)")
      ->capture_default_str();
  text_
      ->add_option("--sample-lines", text_opts_.sample_lines,
                   "Lines the tokenizer is trained on (a seeded sample when there are more)")
      ->capture_default_str();
  text_->add_option("--model-type", text_opts_.model_type, "unigram or bpe")->capture_default_str();
  text_
      ->add_option("--character-coverage", text_opts_.character_coverage,
                   "Share of the characters the vocabulary must cover (SentencePiece's)")
      ->capture_default_str();
  text_
      ->add_option("--doc-separator", text_opts_.doc_separator,
                   "blank (blank lines end a document), line, file, or a line that separates them "
                   "(e.g. % for fortune files)")
      ->capture_default_str();
  text_->add_option("--shards", text_opts_.shards, "Shards of the train split")
      ->capture_default_str();
  text_
      ->add_option("--held-out", text_opts_.held_out, "Fraction of the documents in split held_out")
      ->capture_default_str();
  text_->add_option("--seed", text_opts_.seed, "Seed of the sample and the split")
      ->capture_default_str();
  text_->add_option("--threads", text_opts_.threads, "Tokenization threads (0: all cores)")
      ->capture_default_str();
  text_->add_flag("--language-from-dir", text_opts_.language_from_dir,
                  "Each CORPUS is a folder (DIR or LANG=DIR) of one language: balanced tokenizer "
                  "sample, per-language held-out shards");
  text_->add_flag("--quiet", quiet_, "No progress output");

  AddDicom(import);
  AddGenerate();

  inspect_ =
      data_->add_subcommand("inspect", "Verify a dataset's shards and print its manifest summary");
  inspect_->add_option("dir", inspect_dir_, "Dataset folder (holding dataset.json)")->required();
  inspect_->add_flag("--no-verify", inspect_no_verify_, "Skip the shard checksums");
}

int DataCommands::Run(std::ostream& out, std::ostream& err) {
  if (!*data_) return -1;
  const bool tty = &err == &std::cerr && isatty(STDERR_FILENO);
  ProgressPrinter printer(err, tty, quiet_);
  data::ProgressFn progress = [&](const data::ImportProgress& p) { printer(p); };
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (*images_) {
    absl::Status s = ParseSize(size_, &image_opts_.height, &image_opts_.width);
    absl::StatusOr<data::ImportSummary> r =
        s.ok() ? data::ImportImages(Env::Default(), image_opts_, progress) : s;
    if (!r.ok()) {
      err << (tty ? "\n" : "") << "kiln data import images: " << r.status().message() << "\n";
      return 1;
    }
    PrintSummary(out, image_opts_.out_dir, *r, seconds(), "images");
    return 0;
  }
  if (*csv_) {
    absl::StatusOr<data::ImportSummary> r = data::ImportCsv(Env::Default(), csv_opts_, progress);
    if (!r.ok()) {
      err << (tty ? "\n" : "") << "kiln data import csv: " << r.status().message() << "\n";
      return 1;
    }
    PrintSummary(out, csv_opts_.out_dir, *r, seconds(), "rows");
    return 0;
  }
  if (*text_) {
    absl::StatusOr<data::ImportSummary> r = data::ImportText(Env::Default(), text_opts_, progress);
    if (!r.ok()) {
      err << (tty ? "\n" : "") << "kiln data import text: " << r.status().message() << "\n";
      return 1;
    }
    PrintSummary(out, text_opts_.out_dir, *r, seconds(), "tokens");
    return 0;
  }
  if (dicom_ != nullptr && *dicom_) return RunDicom(out, err, progress, tty);
  if (*clicks_) {
    absl::StatusOr<data::ClickLogSummary> r =
        data::GenerateClickLog(Env::Default(), click_opts_, progress);
    if (!r.ok()) {
      err << (tty ? "\n" : "") << "kiln data generate clicks: " << r.status().message() << "\n";
      return 1;
    }
    PrintSummary(out, click_opts_.out_dir, r->import, seconds(), "events");
    out << absl::StrFormat(
        "day %d: click rate %.4f; Bayes-optimal on held_out (%d events, the true "
        "probabilities): auc %.4f recall@%d %.4f\n",
        click_opts_.day, r->click_rate, r->held_out_examples, r->bayes_auc, click_opts_.recall_k,
        r->bayes_recall);
    return 0;
  }
  if (*inspect_) {
    absl::Status s = InspectDataset(inspect_dir_, !inspect_no_verify_, out);
    if (!s.ok()) {
      err << "kiln data inspect: " << s.message() << "\n";
      return 1;
    }
    return 0;
  }
  return -1;
}

void DataCommands::AddGenerate() {
  CLI::App* generate =
      data_->add_subcommand("generate", "Write synthetic datasets with a known optimum");
  generate->require_subcommand(1);
  clicks_ = generate->add_subcommand(
      "clicks",
      "A click log from a hidden preference model (docs/data.md \"Click-log generator\"), with "
      "the Bayes-optimal AUC and recall@K of its held-out split");
  data::ClickLogOptions& o = click_opts_;
  clicks_->add_option("--out", o.out_dir, "Dataset folder to write")->required();
  clicks_->add_option("--users", o.users, "Users (ids 0..U-1)")->capture_default_str();
  clicks_->add_option("--items", o.items, "Items (ids 0..I-1)")->capture_default_str();
  clicks_->add_option("--events", o.events, "Impressions in the log")->capture_default_str();
  clicks_->add_option("--day", o.day, "Day of the log: day D drifts the hidden model D-1 steps")
      ->capture_default_str();
  clicks_->add_option("--seed", o.seed, "Seed of the hidden model, the events and the split")
      ->capture_default_str();
  clicks_->add_option("--dim", o.dim, "Latent dimension of the hidden model")
      ->capture_default_str();
  clicks_->add_option("--drift", o.drift, "Random-walk step per day (relative)")
      ->capture_default_str();
  clicks_->add_option("--held-out", o.held_out, "Fraction of the events in split held_out")
      ->capture_default_str();
  clicks_->add_option("--shards", o.shards, "Shards of the train split")->capture_default_str();
  clicks_->add_option("--recall-k", o.recall_k, "K of the Bayes recall@K reported")
      ->capture_default_str();
  clicks_->add_option("--threads", o.threads, "Encoding threads (0: all cores)")
      ->capture_default_str();
  clicks_->add_flag("--quiet", quiet_, "No progress output");
}

#ifdef KILN_HAVE_GDCM
void DataCommands::AddDicom(CLI::App* import) {
  dicom_ = import->add_subcommand(
      "dicom", "DICOM files (GDCM: every transfer syntax it decodes) to fixed-size 8-bit pixels");
  dicom_->add_option("src", dicom_opts_.src_dir, "Folder of DICOM files (any layout)")->required();
  dicom_->add_option("--out", dicom_opts_.out_dir, "Dataset folder to write")->required();
  dicom_->add_option("--size", dicom_size_, "Output HxW in pixels (e.g. 128x128)")->required();
  dicom_->add_option("--channels", dicom_opts_.channels, "1 (gray) or 3 (RGB)")
      ->capture_default_str();
  dicom_->add_option("--resize", dicom_opts_.resize, "crop or fit (as for images)")
      ->capture_default_str();
  dicom_
      ->add_option("--label-tag", dicom_opts_.label_tag,
                   "Header tag GGGG,EEEE whose value is the label (default: Modality)")
      ->capture_default_str();
  dicom_->add_option("--labels", dicom_opts_.labels_csv,
                     "CSV of 'relative path,label' lines instead of a tag (unnamed files ignored)");
  dicom_->add_option("--window", window_,
                     "C,W: the window applied to modality values (default: the file's, else "
                     "each frame's own range)");
  dicom_->add_option("--frames", dicom_opts_.frames, "first, or all (one example per frame)")
      ->capture_default_str();
  dicom_->add_option("--shards", dicom_opts_.shards, "Shards of the train split")
      ->capture_default_str();
  dicom_->add_option("--held-out", dicom_opts_.held_out, "Fraction of the examples in held_out")
      ->capture_default_str();
  dicom_->add_option("--seed", dicom_opts_.seed, "Seed of the split permutation")
      ->capture_default_str();
  dicom_->add_option("--threads", dicom_opts_.threads, "Decoding threads (0: all cores)")
      ->capture_default_str();
  dicom_
      ->add_option("--on-error", dicom_opts_.on_error,
                   "fail: stop at the first file GDCM cannot read; skip: list it and go on")
      ->capture_default_str();
  dicom_->add_flag("--quiet", quiet_, "No progress output");
}

int DataCommands::RunDicom(std::ostream& out, std::ostream& err, const data::ProgressFn& progress,
                           bool tty) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = ParseSize(dicom_size_, &dicom_opts_.height, &dicom_opts_.width);
  if (s.ok() && !window_.empty()) {
    std::vector<std::string> cw = absl::StrSplit(window_, ',');
    double c = 0, w = 0;
    if (cw.size() != 2 || !absl::SimpleAtod(cw[0], &c) || !absl::SimpleAtod(cw[1], &w)) {
      s = absl::InvalidArgumentError("--window must be C,W (e.g. 40,400), not '" + window_ + "'");
    } else {
      dicom_opts_.window_center = c;
      dicom_opts_.window_width = w;
    }
  }
  absl::StatusOr<data::ImportSummary> r =
      s.ok() ? data::ImportDicom(Env::Default(), dicom_opts_, progress) : s;
  if (!r.ok()) {
    err << (tty ? "\n" : "") << "kiln data import dicom: " << r.status().message() << "\n";
    return 1;
  }
  PrintSummary(out, dicom_opts_.out_dir, *r,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               "images");
  return 0;
}
#else
void DataCommands::AddDicom(CLI::App*) {}
int DataCommands::RunDicom(std::ostream&, std::ostream&, const data::ProgressFn&, bool) {
  return -1;
}
#endif

}  // namespace kiln::cli
