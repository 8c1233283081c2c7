#include "kiln/data/import/image_import.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/import/image_codec.h"
#include "kiln/data/import/image_transform.h"
#include "kiln/data/import/labeled_import.h"
#include "kiln/data/shard_io.h"

namespace kiln::data {
namespace {

struct SourceFile {
  std::string rel;  // path relative to src_dir
  int64_t label = 0;
  uint64_t size = 0;
};

bool IsImageName(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const char* ext : {".jpg", ".jpeg", ".png"}) {
    const size_t n = std::strlen(ext);
    if (lower.size() > n && lower.compare(lower.size() - n, n, ext) == 0) return true;
  }
  return false;
}

absl::Status Walk(Env* env, const std::string& root, const std::string& rel, int64_t label,
                  std::vector<SourceFile>* files, int64_t* ignored, int depth = 0) {
  if (depth > 32) {
    return absl::InvalidArgumentError(JoinPath(root, rel) +
                                      ": folders nested over 32 deep (a symbolic link loop?)");
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(JoinPath(root, rel)));
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.') continue;
    const std::string r = JoinPath(rel, name);
    KILN_ASSIGN_OR_RETURN(bool is_dir, env->IsDirectory(JoinPath(root, r)));
    if (is_dir) {
      KILN_RETURN_IF_ERROR(Walk(env, root, r, label, files, ignored, depth + 1));
    } else if (IsImageName(name)) {
      KILN_ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(JoinPath(root, r)));
      files->push_back({r, label, size});
    } else {
      ++*ignored;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const ImageImportOptions& o) {
  if (o.src_dir.empty()) return absl::InvalidArgumentError("no source folder given");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.height < 1 || o.width < 1 || o.height > 8192 || o.width > 8192) {
    return absl::InvalidArgumentError("--size must be HxW with 1 <= H, W <= 8192");
  }
  if (o.channels != 1 && o.channels != 3)
    return absl::InvalidArgumentError("--channels must be 1 or 3");
  if (o.resize != "crop" && o.resize != "fit") {
    return absl::InvalidArgumentError("--resize must be crop or fit, not '" + o.resize + "'");
  }
  if (o.on_error != "fail" && o.on_error != "skip") {
    return absl::InvalidArgumentError("--on-error must be fail or skip, not '" + o.on_error + "'");
  }
  if (o.background < 0 || o.background > 255)
    return absl::InvalidArgumentError("--background must be 0..255");
  if (o.shards < 1 || o.shards > 99999)
    return absl::InvalidArgumentError("--shards must be 1..99999");
  if (!(o.held_out >= 0 && o.held_out < 1))
    return absl::InvalidArgumentError("--held-out must be in [0, 1)");
  if (CleanPath(o.out_dir) == CleanPath(o.src_dir)) {
    return absl::InvalidArgumentError("--out must not be the source folder");
  }
  return absl::OkStatus();
}

LabeledDecode DecodeOne(Env* env, const ImageImportOptions& o, const SourceFile& f) {
  auto pixels = [&](const std::string& bytes) -> absl::StatusOr<std::vector<uint8_t>> {
    KILN_ASSIGN_OR_RETURN(Image img, DecodeImage(bytes, f.rel, o.width, o.height));
    if (img.width < 1 || img.height < 1)
      return absl::InvalidArgumentError(f.rel + ": image has no pixels");
    Image px = ConvertChannels(img, o.channels, static_cast<uint8_t>(o.background));
    px = ResizeImage(px, o.height, o.width,
                     o.resize == "crop" ? ResizeMode::kCrop : ResizeMode::kFit);
    return std::move(px.pixels);
  };
  return DecodeLabeledFile(env, o.src_dir, f.rel, o.channels, f.label, f.rel, pixels);
}

std::string PlanFingerprint(const ImageImportOptions& o, const std::vector<SourceFile>& files,
                            const std::vector<std::string>& labels) {
  uint64_t h = Fnv1a64(absl::StrCat("images|", o.height, "x", o.width, "|", o.channels, "|",
                                    o.resize, "|", o.background, "|", o.shards, "|", o.held_out,
                                    "|", o.seed, "|", o.on_error));
  for (const std::string& l : labels) h = Fnv1a64(l + "\n", h);
  for (const SourceFile& f : files) h = Fnv1a64(absl::StrCat(f.rel, "\t", f.size, "\n"), h);
  return Hex64(h);
}

// The manifest: what the shards hold, where they came from, how they were made.
DatasetManifest ImageManifest(const ImageImportOptions& o, const std::vector<std::string>& labels,
                              const std::vector<SourceFile>& files, const LabeledShards& written,
                              uint64_t input_bytes) {
  DatasetManifest m;
  m.kind = "images";
  m.features = {{"image", "uint8", {o.height, o.width, o.channels}, "pixels, HWC row-major"},
                {"label", "int64", {}, "index into label.vocabulary"},
                {"path", "string", {}, "source file relative to the import folder"}};
  m.label_feature = "label";
  m.label_vocabulary = labels;
  written.FillManifest(&m);
  uint64_t fp = Fnv1a64("images\n");
  for (const SourceFile& f : files) {
    auto crc = written.crc_of.find(f.rel);
    fp = Fnv1a64(absl::StrCat(f.rel, "\t", f.size, "\t",
                              Hex32(crc == written.crc_of.end() ? 0 : crc->second), "\n"),
                 fp);
  }
  m.source_fingerprint = Hex64(fp);
  m.source_files = static_cast<int64_t>(files.size());
  m.source_bytes = input_bytes;
  m.import_options = {{"source", o.src_dir},        {"size", {o.height, o.width}},
                      {"channels", o.channels},     {"resize", o.resize},
                      {"background", o.background}, {"shards", o.shards},
                      {"held_out", o.held_out},     {"seed", o.seed},
                      {"on_error", o.on_error}};
  return m;
}

}  // namespace

absl::StatusOr<ImportSummary> ImportImages(Env* env, const ImageImportOptions& o,
                                           const ProgressFn& progress) {
  KILN_RETURN_IF_ERROR(CheckOptions(o));
  KILN_ASSIGN_OR_RETURN(bool src_is_dir, env->IsDirectory(o.src_dir));
  if (!src_is_dir) return absl::InvalidArgumentError(o.src_dir + " is not a folder");
  ImportSummary summary;
  std::vector<std::string> labels;
  std::vector<SourceFile> files;
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> top, env->GetChildren(o.src_dir));
  for (const std::string& name : top) {
    if (name.empty() || name[0] == '.') continue;
    KILN_ASSIGN_OR_RETURN(bool is_dir, env->IsDirectory(JoinPath(o.src_dir, name)));
    if (!is_dir) {
      ++summary.ignored;
      continue;
    }
    labels.push_back(name);
    KILN_RETURN_IF_ERROR(Walk(env, o.src_dir, name, static_cast<int64_t>(labels.size()) - 1, &files,
                              &summary.ignored));
  }
  if (files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.src_dir, " has no .jpg/.jpeg/.png files in class folders (expected SRC/<label>/<file>)"));
  }
  std::sort(files.begin(), files.end(),
            [](const SourceFile& a, const SourceFile& b) { return a.rel < b.rel; });
  for (const SourceFile& f : files) summary.input_bytes += f.size;

  LabeledImport li;
  li.out_dir = o.out_dir;
  li.items = static_cast<int64_t>(files.size());
  li.num_labels = labels.size();
  li.channels = o.channels;
  li.shards = o.shards;
  li.held_out = o.held_out;
  li.seed = o.seed;
  li.threads = ResolveThreads(o.threads);
  li.on_error = o.on_error;
  li.plan_fingerprint = PlanFingerprint(o, files, labels);
  li.key = [&](int64_t i) { return files[i].rel; };
  li.label = [&](int64_t i) { return files[i].label; };
  li.decode = [&](int64_t i) { return DecodeOne(env, o, files[i]); };
  KILN_ASSIGN_OR_RETURN(LabeledShards written, WriteLabeledShards(env, li, progress));
  summary.shards_kept = written.kept;
  const DatasetManifest m = ImageManifest(o, labels, files, written, summary.input_bytes);
  KILN_RETURN_IF_ERROR(WriteManifest(env, o.out_dir, m));
  SummarizeManifest(m, &summary);
  return summary;
}

}  // namespace kiln::data
