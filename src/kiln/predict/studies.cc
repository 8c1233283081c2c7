#include "kiln/predict/studies.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/env.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/import_util.h"
#include "nlohmann/json.hpp"
#ifdef KILN_HAVE_GDCM
#include "kiln/data/import/dicom/dicom_import.h"
#endif

namespace kiln::predict {
namespace {

namespace fs = std::filesystem;

}  // namespace

absl::StatusOr<Preprocess> ReadPreprocess(const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(data::DatasetManifest m, data::ReadManifest(Env::Default(), dir));
  const std::string where = JoinPath(dir, data::kManifestName);
  if (m.kind != "dicom") {
    return absl::InvalidArgumentError(absl::StrCat("--input-dir classifies DICOM studies: ", where,
                                                   " is a dataset of kind '", m.kind,
                                                   "', not one `kiln data import dicom` wrote"));
  }
  Preprocess p;
  const data::FeatureSchema* f = m.FindFeature("image");
  if (f == nullptr || f->shape.size() != 3) {
    return absl::DataLossError(where + ": no [H, W, C] \"image\" feature");
  }
  p.height = static_cast<int>(f->shape[0]);
  p.width = static_cast<int>(f->shape[1]);
  p.channels = static_cast<int>(f->shape[2]);
  p.resize = m.import_options.value("resize", std::string("crop"));
  const nlohmann::json w = m.import_options.value("window", nlohmann::json());
  if (w.is_array() && w.size() == 2) {
    p.window = true;
    p.window_center = w[0].get<double>();
    p.window_width = w[1].get<double>();
  }
  p.mean.assign(p.channels, 0.0);
  p.inv_std.assign(p.channels, 1.0);
  const nlohmann::json st = m.statistics.value("image", nlohmann::json::object());
  if (st.contains("mean") && st.contains("std") && st["mean"].size() == p.mean.size()) {
    for (int c = 0; c < p.channels; ++c) {
      p.mean[c] = st["mean"][c].get<double>();
      const double sd = st["std"][c].get<double>();
      p.inv_std[c] = sd > 0 ? 1.0 / sd : 1.0;
    }
  }
  p.labels = m.label_vocabulary;
  if (p.labels.empty()) return absl::DataLossError(where + " has no label vocabulary");
  return p;
}

absl::Status CheckCompatible(const Classifier& model, const Preprocess& pre,
                             const std::string& dataset) {
  const int64_t f = static_cast<int64_t>(pre.height) * pre.width * pre.channels;
  if (model.features() != f || model.classes() != static_cast<int64_t>(pre.labels.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model takes ", model.features(), " features and gives ", model.classes(),
                     " classes; the dataset ", dataset, " has ", pre.height, "x", pre.width, "x",
                     pre.channels, " = ", f, " pixels and ", pre.labels.size(), " labels"));
  }
  if (const std::optional<serve::InputNormalization>& nz = model.normalization();
      nz && (nz->channels != pre.channels || nz->height * nz->width * nz->channels != f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model was trained with data.augment.normalize for ", nz->channels, "x",
                     nz->height, "x", nz->width, " inputs, but the dataset ", dataset, " gives ",
                     pre.channels, "x", pre.height, "x", pre.width));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListStudies(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError("--input-dir " + root + " is not a folder");
  }
  std::vector<std::string> out;
  fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec);
  if (ec) return absl::InvalidArgumentError("--input-dir " + root + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InvalidArgumentError("--input-dir " + root + ": " + ec.message());
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) out.push_back(fs::relative(it->path(), root).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

#ifndef KILN_HAVE_GDCM
absl::Status ClassifyStudies(
    Classifier&, const Preprocess&, const std::string&, const std::vector<std::string>&, int,
    const std::function<absl::Status(int64_t, const std::vector<Study>&)>&) {
  return absl::UnimplementedError(
      "--input-dir decodes DICOM with GDCM, and this kiln was built without libgdcm-dev");
}
#else
namespace {

// root/file decoded as the importer decoded the training data, normalized with the dataset's
// statistics and then the model's own normalization.
Study Decode(const Classifier& model, const Preprocess& pre, const data::DicomImportOptions& dopt,
             const std::string& root, const std::string& file) {
  Study s;
  absl::StatusOr<std::string> bytes = ReadFileToString(Env::Default(), JoinPath(root, file));
  if (!bytes.ok()) {
    s.error = std::string(bytes.status().message());
    return s;
  }
  absl::StatusOr<std::vector<uint8_t>> px = data::DecodeDicomPixels(*bytes, file, dopt);
  if (!px.ok()) {
    s.error = std::string(px.status().message());
    return s;
  }
  const int64_t hw = static_cast<int64_t>(pre.height) * pre.width;
  s.x.resize(hw * pre.channels);
  for (int c = 0; c < pre.channels; ++c) {
    for (int64_t p = 0; p < hw; ++p) {
      s.x[c * hw + p] =
          static_cast<float>(((*px)[p * pre.channels + c] - pre.mean[c]) * pre.inv_std[c]);
    }
  }
  if (model.normalization()) model.normalization()->ApplyToExample(s.x.data());
  return s;
}

}  // namespace

absl::Status ClassifyStudies(
    Classifier& model, const Preprocess& pre, const std::string& root,
    const std::vector<std::string>& files, int threads,
    const std::function<absl::Status(int64_t, const std::vector<Study>&)>& on_chunk) {
  data::DicomImportOptions dopt;
  dopt.height = pre.height;
  dopt.width = pre.width;
  dopt.channels = pre.channels;
  dopt.resize = pre.resize;
  if (pre.window) {
    dopt.window_center = pre.window_center;
    dopt.window_width = pre.window_width;
  }
  auto decode = [&](int64_t i) { return Decode(model, pre, dopt, root, files[i]); };
  const int64_t n = static_cast<int64_t>(files.size()), b = model.batch();
  // Chunks of a few batches: the next chunk decodes on the worker threads while the model runs
  // this one's batches.
  const int64_t chunk = b * std::max<int64_t>(1, (4 * threads + b - 1) / b);
  std::vector<Study> current(std::min(chunk, n)), next;
  data::ParallelFor(threads, static_cast<int64_t>(current.size()),
                    [&](int64_t i) { current[i] = decode(i); });
  for (int64_t base = 0; base < n; base += chunk) {
    const int64_t next_base = base + chunk;
    std::thread worker;
    if (next_base < n) {
      next.assign(std::min(chunk, n - next_base), Study());
      worker = std::thread([&] {
        data::ParallelFor(threads, static_cast<int64_t>(next.size()),
                          [&](int64_t i) { next[i] = decode(next_base + i); });
      });
    }
    // The decoded studies of this chunk, in order, batch by batch.
    std::vector<int64_t> ok;
    std::vector<const float*> rows;
    for (int64_t i = 0; i < static_cast<int64_t>(current.size()); ++i) {
      if (!current[i].error.empty()) continue;
      ok.push_back(i);
      rows.push_back(current[i].x.data());
    }
    absl::StatusOr<std::vector<std::vector<double>>> probs = model.Classify(rows);
    if (worker.joinable()) worker.join();
    if (!probs.ok()) return Annotate(probs.status(), "running the model");
    for (size_t k = 0; k < ok.size(); ++k) current[ok[k]].probabilities = std::move((*probs)[k]);
    KILN_RETURN_IF_ERROR(on_chunk(base, current));
    current.swap(next);
  }
  return absl::OkStatus();
}
#endif

}  // namespace kiln::predict
