#include "kiln/data/import/dicom/dicom_import.h"

#include <gdcmImage.h>
#include <gdcmImageApplyLookupTable.h>
#include <gdcmImageChangePhotometricInterpretation.h>
#include <gdcmImageReader.h>
#include <gdcmReader.h>
#include <gdcmStringFilter.h>
#include <gdcmTrace.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kiln/base/crc32c.h"
#include "kiln/base/log.h"
#include "kiln/base/status.h"
#include "kiln/data/dataset.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/example_proto.h"
#include "kiln/data/import/dicom/internal/isolated.h"
#include "kiln/data/import/image_codec.h"
#include "kiln/data/import/image_transform.h"
#include "kiln/data/import/labeled_import.h"
#include "kiln/data/shard_io.h"

namespace kiln::data {
namespace {

// One example to make: a file (and a frame of it).
struct Item {
  std::string rel;
  int frame = 0;
  int frames = 1;  // of the file
  int64_t label = 0;
  uint64_t size = 0;
};

absl::Status CheckOptions(const DicomImportOptions& o) {
  if (o.src_dir.empty()) return absl::InvalidArgumentError("no source folder given");
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (o.height < 1 || o.width < 1 || o.height > 8192 || o.width > 8192)
    return absl::InvalidArgumentError("--size must be HxW with 1 <= H, W <= 8192");
  if (o.channels != 1 && o.channels != 3)
    return absl::InvalidArgumentError("--channels must be 1 or 3");
  if (o.resize != "crop" && o.resize != "fit")
    return absl::InvalidArgumentError("--resize must be crop or fit, not '" + o.resize + "'");
  if (o.frames != "first" && o.frames != "all")
    return absl::InvalidArgumentError("--frames must be first or all, not '" + o.frames + "'");
  if (o.on_error != "fail" && o.on_error != "skip")
    return absl::InvalidArgumentError("--on-error must be fail or skip, not '" + o.on_error + "'");
  if (o.window_center.has_value() != o.window_width.has_value())
    return absl::InvalidArgumentError("--window needs both a center and a width (C,W)");
  if (o.window_width && !(*o.window_width >= 1))
    return absl::InvalidArgumentError("--window width must be >= 1");
  if (o.shards < 1 || o.shards > 99999)
    return absl::InvalidArgumentError("--shards must be 1..99999");
  if (!(o.held_out >= 0 && o.held_out < 1))
    return absl::InvalidArgumentError("--held-out must be in [0, 1)");
  if (CleanPath(o.out_dir) == CleanPath(o.src_dir))
    return absl::InvalidArgumentError("--out must not be the source folder");
  return absl::OkStatus();
}

absl::StatusOr<gdcm::Tag> ParseTag(const std::string& s) {
  std::vector<std::string> parts = absl::StrSplit(s, ',');
  uint32_t g = 0, e = 0;
  if (parts.size() != 2 || parts[0].size() != 4 || parts[1].size() != 4 ||
      !absl::SimpleHexAtoi(parts[0], &g) || !absl::SimpleHexAtoi(parts[1], &e)) {
    return absl::InvalidArgumentError(
        "--label-tag must be GGGG,EEEE in hex (e.g. 0008,0060), not '" + s + "'");
  }
  return gdcm::Tag(static_cast<uint16_t>(g), static_cast<uint16_t>(e));
}

std::string TagValue(const gdcm::File& file, const gdcm::Tag& tag) {
  gdcm::StringFilter sf;
  sf.SetFile(file);
  if (!file.GetDataSet().FindDataElement(tag)) return "";
  return std::string(absl::StripAsciiWhitespace(sf.ToString(tag)));
}

double FirstNumber(const std::string& s, double fallback) {
  std::vector<std::string> parts = absl::StrSplit(s, '\\');
  double v = 0;
  if (!parts.empty() && absl::SimpleAtod(absl::StripAsciiWhitespace(parts[0]), &v)) return v;
  return fallback;
}

absl::Status Walk(Env* env, const std::string& root, const std::string& rel,
                  std::vector<std::pair<std::string, uint64_t>>* files) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(JoinPath(root, rel)));
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.') continue;
    const std::string r = rel.empty() ? name : JoinPath(rel, name);
    KILN_ASSIGN_OR_RETURN(bool is_dir, env->IsDirectory(JoinPath(root, r)));
    if (is_dir) {
      KILN_RETURN_IF_ERROR(Walk(env, root, r, files));
    } else {
      KILN_ASSIGN_OR_RETURN(uint64_t size, env->GetFileSize(JoinPath(root, r)));
      files->push_back({r, size});
    }
  }
  return absl::OkStatus();
}

// What planning reads from a file's header: its label and frame count, or why it cannot.
struct Header {
  std::string label, error;
  int frames = 1;
};

Header ReadHeader(Env* env, const DicomImportOptions& o, const gdcm::Tag& tag,
                  const std::string& rel) {
  Header h;
  absl::StatusOr<std::string> bytes = ReadFileToString(env, JoinPath(o.src_dir, rel));
  if (!bytes.ok()) {
    h.error = std::string(bytes.status().message());
    return h;
  }
  // GDCM in a child process (internal/isolated.h): "frames\nlabel" back.
  absl::StatusOr<std::string> got = internal::RunIsolated([&]() -> absl::StatusOr<std::string> {
    std::istringstream in(*bytes);
    gdcm::Reader r;
    r.SetStream(in);
    if (!r.ReadUpToTag(gdcm::Tag(0x7fe0, 0x0010))) {
      return absl::InvalidArgumentError(rel + ": not a DICOM file GDCM can read");
    }
    const int frames =
        std::max(1, static_cast<int>(FirstNumber(TagValue(r.GetFile(), {0x0028, 0x0008}), 1)));
    return absl::StrCat(frames, "\n", o.labels_csv.empty() ? TagValue(r.GetFile(), tag) : "");
  });
  if (!got.ok()) {
    h.error = absl::StartsWith(got.status().message(), rel + ":")
                  ? std::string(got.status().message())
                  : absl::StrCat(rel, ": ", got.status().message());
    return h;
  }
  const size_t nl = got->find('\n');
  h.frames = std::max(1, std::atoi(got->substr(0, nl).c_str()));
  if (o.labels_csv.empty()) {
    h.label = got->substr(nl + 1);
    if (h.label.empty()) h.error = absl::StrCat(rel, ": no value for the label tag ", o.label_tag);
  }
  return h;
}

absl::StatusOr<std::map<std::string, std::string>> ReadLabelsCsv(Env* env,
                                                                 const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  std::map<std::string, std::string> labels;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const size_t comma = line.rfind(',');
    if (comma == absl::string_view::npos || comma == 0 || comma + 1 == line.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": expected 'relative path,label'"));
    }
    labels[std::string(absl::StripAsciiWhitespace(line.substr(0, comma)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(comma + 1)));
  }
  return labels;
}

// Modality values of one frame (slope/intercept applied) of a gray image, or 8-bit color.
struct Frame {
  std::vector<double> gray;    // height*width modality values, when gray
  std::vector<uint8_t> color;  // height*width*3 RGB, when color
  int height = 0, width = 0;
  bool monochrome1 = false;
  std::optional<double> center, width_w;  // the file's first WindowCenter / WindowWidth
};

template <typename T>
void ToDoubles(const char* src, int64_t n, double slope, double intercept,
               std::vector<double>* out) {
  out->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    (*out)[i] = static_cast<double>(v) * slope + intercept;
  }
}

absl::StatusOr<Frame> DecodeFrame(const std::string& bytes, const std::string& rel, int frame) {
  std::istringstream in(bytes);
  gdcm::ImageReader r;
  r.SetStream(in);
  if (!r.Read()) return absl::InvalidArgumentError(rel + ": GDCM cannot read its image");
  gdcm::Image image = r.GetImage();
  gdcm::PhotometricInterpretation pi = image.GetPhotometricInterpretation();
  if (pi == gdcm::PhotometricInterpretation::PALETTE_COLOR) {
    gdcm::ImageApplyLookupTable lut;
    lut.SetInput(image);
    if (!lut.Apply()) return absl::InvalidArgumentError(rel + ": palette lookup failed");
    image = lut.GetOutput();
  } else if (pi == gdcm::PhotometricInterpretation::YBR_FULL ||
             pi == gdcm::PhotometricInterpretation::YBR_FULL_422) {
    gdcm::ImageChangePhotometricInterpretation to_rgb;
    to_rgb.SetInput(image);
    to_rgb.SetPhotometricInterpretation(gdcm::PhotometricInterpretation::RGB);
    if (to_rgb.Change()) image = to_rgb.GetOutput();
  }
  const gdcm::PixelFormat pf = image.GetPixelFormat();
  Frame f;
  f.width = static_cast<int>(image.GetDimension(0));
  f.height = static_cast<int>(image.GetDimension(1));
  const int frames =
      image.GetNumberOfDimensions() > 2 ? static_cast<int>(image.GetDimension(2)) : 1;
  if (f.width < 1 || f.height < 1) return absl::InvalidArgumentError(rel + ": image has no pixels");
  if (frame >= frames) return absl::InvalidArgumentError(absl::StrCat(rel, ": no frame ", frame));
  std::vector<char> buf(image.GetBufferLength());
  if (!image.GetBuffer(buf.data())) {
    return absl::InvalidArgumentError(
        rel + ": GDCM cannot decode its pixel data (transfer syntax " +
        std::string(r.GetFile().GetHeader().GetDataSetTransferSyntax().GetString()) + ")");
  }
  const int spp = pf.GetSamplesPerPixel();
  const int64_t px = static_cast<int64_t>(f.width) * f.height;
  const int64_t frame_bytes = px * spp * pf.GetPixelSize() / std::max<int>(1, spp);
  if (static_cast<int64_t>(buf.size()) < frame_bytes * (frame + 1))
    return absl::InvalidArgumentError(rel + ": pixel data shorter than its dimensions");
  const char* src = buf.data() + frame_bytes * frame;
  if (spp == 3) {
    if (pf.GetScalarType() != gdcm::PixelFormat::UINT8)
      return absl::InvalidArgumentError(rel + ": color pixels other than 8-bit are not supported");
    f.color.resize(px * 3);
    if (image.GetPlanarConfiguration() == 1) {  // RRR.. GGG.. BBB..
      for (int64_t i = 0; i < px; ++i)
        for (int c = 0; c < 3; ++c) f.color[i * 3 + c] = static_cast<uint8_t>(src[c * px + i]);
    } else {
      std::memcpy(f.color.data(), src, px * 3);
    }
    return f;
  }
  if (spp != 1)
    return absl::InvalidArgumentError(absl::StrCat(rel, ": ", spp, " samples per pixel"));
  f.monochrome1 = pi == gdcm::PhotometricInterpretation::MONOCHROME1;
  const double nan = std::nan("");
  const double wc = FirstNumber(TagValue(r.GetFile(), {0x0028, 0x1050}), nan);
  const double ww = FirstNumber(TagValue(r.GetFile(), {0x0028, 0x1051}), nan);
  if (std::isfinite(wc) && std::isfinite(ww) && ww >= 1) f.center = wc, f.width_w = ww;
  const double slope = image.GetSlope(), intercept = image.GetIntercept();
  switch (pf.GetScalarType()) {
    case gdcm::PixelFormat::UINT8:
      ToDoubles<uint8_t>(src, px, slope, intercept, &f.gray);
      break;
    case gdcm::PixelFormat::INT8:
      ToDoubles<int8_t>(src, px, slope, intercept, &f.gray);
      break;
    case gdcm::PixelFormat::UINT16:
      ToDoubles<uint16_t>(src, px, slope, intercept, &f.gray);
      break;
    case gdcm::PixelFormat::INT16:
      ToDoubles<int16_t>(src, px, slope, intercept, &f.gray);
      break;
    case gdcm::PixelFormat::UINT32:
      ToDoubles<uint32_t>(src, px, slope, intercept, &f.gray);
      break;
    case gdcm::PixelFormat::INT32:
      ToDoubles<int32_t>(src, px, slope, intercept, &f.gray);
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(rel, ": pixel type ", pf.GetScalarTypeAsString(), " is not supported"));
  }
  return f;
}

// The decode itself, in this process (DecodeDicomPixels runs it in a child).
absl::StatusOr<std::vector<uint8_t>> DecodeDicomPixelsHere(const std::string& bytes,
                                                           const std::string& name,
                                                           const DicomImportOptions& o, int frame);

}  // namespace

absl::StatusOr<std::vector<uint8_t>> DecodeDicomPixels(const std::string& bytes,
                                                       const std::string& name,
                                                       const DicomImportOptions& o, int frame) {
  // GDCM in a child process (internal/isolated.h), the decoded pixels sent back.
  absl::StatusOr<std::string> pixels = internal::RunIsolated([&]() -> absl::StatusOr<std::string> {
    gdcm::Trace::SetWarning(false);  // GDCM's own stderr chatter; errors come back as Status
    gdcm::Trace::SetDebug(false);
    gdcm::Trace::SetError(false);
    KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> px, DecodeDicomPixelsHere(bytes, name, o, frame));
    return std::string(px.begin(), px.end());
  });
  if (!pixels.ok()) {
    if (absl::StartsWith(pixels.status().message(), name + ":")) return pixels.status();
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", pixels.status().message()));
  }
  return std::vector<uint8_t>(pixels->begin(), pixels->end());
}

namespace {

absl::StatusOr<std::vector<uint8_t>> DecodeDicomPixelsHere(const std::string& bytes,
                                                           const std::string& name,
                                                           const DicomImportOptions& o, int frame) {
  KILN_ASSIGN_OR_RETURN(Frame decoded, DecodeFrame(bytes, name, frame));
  Frame* f = &decoded;
  Image img;
  img.height = f->height;
  img.width = f->width;
  if (!f->color.empty()) {
    img.channels = 3;
    img.pixels = std::move(f->color);
  } else {
    double c = 0, w = 0;
    if (o.window_center) {
      c = *o.window_center, w = *o.window_width;
    } else if (f->center) {
      c = *f->center, w = *f->width_w;
    } else {  // the frame's own range: min -> 0, max -> 255
      auto [lo, hi] = std::minmax_element(f->gray.begin(), f->gray.end());
      c = (*lo + *hi) / 2 + 0.5, w = std::max(2.0, *hi - *lo + 1);
    }
    img.channels = 1;
    img.pixels.resize(f->gray.size());
    for (size_t i = 0; i < f->gray.size(); ++i) {
      uint8_t y = ApplyWindow(f->gray[i], c, w);
      img.pixels[i] = f->monochrome1 ? static_cast<uint8_t>(255 - y) : y;
    }
  }
  Image px = ConvertChannels(img, o.channels);
  px =
      ResizeImage(px, o.height, o.width, o.resize == "crop" ? ResizeMode::kCrop : ResizeMode::kFit);
  return std::move(px.pixels);
}

LabeledDecode DecodeOne(Env* env, const DicomImportOptions& o, const Item& item) {
  const std::string path =
      item.frames > 1 && o.frames == "all" ? absl::StrCat(item.rel, "#", item.frame) : item.rel;
  return DecodeLabeledFile(
      env, o.src_dir, item.rel, o.channels, item.label, path,
      [&](const std::string& bytes) { return DecodeDicomPixels(bytes, item.rel, o, item.frame); });
}

std::string PlanFingerprint(const DicomImportOptions& o, const std::vector<Item>& items,
                            const std::vector<std::string>& labels) {
  uint64_t h = Fnv1a64(absl::StrCat(
      "dicom|", o.height, "x", o.width, "|", o.channels, "|", o.resize, "|", o.label_tag, "|",
      o.labels_csv, "|", o.window_center.value_or(-1e300), ",", o.window_width.value_or(-1e300),
      "|", o.frames, "|", o.shards, "|", o.held_out, "|", o.seed, "|", o.on_error));
  for (const std::string& l : labels) h = Fnv1a64(l + "\n", h);
  for (const Item& i : items) h = Fnv1a64(absl::StrCat(i.rel, "#", i.frame, "\t", i.size, "\n"), h);
  return Hex64(h);
}

// The items to import: every readable file with a label, sorted, each frame its own item with
// --frames all. Unreadable ones fail or go to `skipped`.
absl::Status PlanItems(Env* env, const DicomImportOptions& o, int threads, std::vector<Item>* items,
                       std::vector<std::string>* labels, nlohmann::json* skipped,
                       ImportSummary* summary) {
  std::vector<std::pair<std::string, uint64_t>> files;
  KILN_RETURN_IF_ERROR(Walk(env, o.src_dir, "", &files));
  std::sort(files.begin(), files.end());
  std::map<std::string, std::string> csv;
  if (!o.labels_csv.empty()) {
    KILN_ASSIGN_OR_RETURN(csv, ReadLabelsCsv(env, o.labels_csv));
    std::vector<std::pair<std::string, uint64_t>> named;
    for (const auto& f : files) {
      if (csv.count(f.first))
        named.push_back(f);
      else
        ++summary->ignored;
    }
    files.swap(named);
  }
  if (files.empty()) return absl::InvalidArgumentError(o.src_dir + " has no files to import");
  KILN_ASSIGN_OR_RETURN(gdcm::Tag tag, ParseTag(o.label_tag));
  std::vector<Header> headers(files.size());
  ParallelFor(threads, static_cast<int64_t>(files.size()),
              [&](int64_t i) { headers[i] = ReadHeader(env, o, tag, files[i].first); });
  std::set<std::string> distinct;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!o.labels_csv.empty()) headers[i].label = csv[files[i].first];
    if (!headers[i].error.empty()) continue;
    distinct.insert(headers[i].label);
  }
  labels->assign(distinct.begin(), distinct.end());
  for (size_t i = 0; i < files.size(); ++i) {
    const Header& h = headers[i];
    if (!h.error.empty()) {
      if (o.on_error == "fail")
        return absl::InvalidArgumentError(h.error + " (--on-error skip skips such files)");
      KILN_LOG(WARNING) << "skipping " << h.error;
      skipped->push_back({{"file", files[i].first}, {"error", h.error}});
      continue;
    }
    const int64_t label =
        std::lower_bound(labels->begin(), labels->end(), h.label) - labels->begin();
    const int n = o.frames == "all" ? h.frames : 1;
    for (int k = 0; k < n; ++k)
      items->push_back({files[i].first, k, h.frames, label, files[i].second});
    summary->input_bytes += files[i].second;
  }
  if (items->empty()) return absl::InvalidArgumentError(o.src_dir + " has no readable DICOM files");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImportSummary> ImportDicom(Env* env, const DicomImportOptions& o,
                                          const ProgressFn& progress) {
  KILN_RETURN_IF_ERROR(CheckOptions(o));
  KILN_ASSIGN_OR_RETURN(bool src_is_dir, env->IsDirectory(o.src_dir));
  if (!src_is_dir) return absl::InvalidArgumentError(o.src_dir + " is not a folder");
  gdcm::Trace::SetWarning(false);  // GDCM's own stderr chatter; errors come back as Status
  gdcm::Trace::SetDebug(false);
  gdcm::Trace::SetError(false);
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  ImportSummary summary;
  std::vector<Item> items;
  std::vector<std::string> labels;
  nlohmann::json plan_skipped = nlohmann::json::array();
  KILN_RETURN_IF_ERROR(PlanItems(env, o, threads, &items, &labels, &plan_skipped, &summary));

  LabeledImport li;
  li.out_dir = o.out_dir;
  li.items = static_cast<int64_t>(items.size());
  li.num_labels = labels.size();
  li.channels = o.channels;
  li.shards = o.shards;
  li.held_out = o.held_out;
  li.seed = o.seed;
  li.threads = threads;
  li.on_error = o.on_error;
  li.block_per_thread = 16;
  li.plan_fingerprint = PlanFingerprint(o, items, labels);
  li.key = [&](int64_t i) { return items[i].rel; };
  li.label = [&](int64_t i) { return items[i].label; };
  li.decode = [&](int64_t i) { return DecodeOne(env, o, items[i]); };
  li.skip_entry = [&](int64_t i, const std::string& error) {
    return nlohmann::json{{"file", items[i].rel}, {"frame", items[i].frame}, {"error", error}};
  };
  KILN_ASSIGN_OR_RETURN(LabeledShards written, WriteLabeledShards(env, li, progress));
  summary.shards_kept = written.kept;

  DatasetManifest m;
  m.kind = "dicom";
  m.features = {{"image",
                 "uint8",
                 {o.height, o.width, o.channels},
                 "pixels, HWC row-major: modality values windowed to 0..255, 0 = black"},
                {"label", "int64", {}, "index into label.vocabulary"},
                {"path", "string", {}, "source file relative to the import folder (#frame)"}};
  m.label_feature = "label";
  m.label_vocabulary = labels;
  m.skipped = plan_skipped;
  written.FillManifest(&m);
  uint64_t fp = Fnv1a64("dicom\n");
  std::set<std::string> seen;
  for (const Item& it : items) {
    if (!seen.insert(it.rel).second) continue;
    auto crc = written.crc_of.find(it.rel);
    fp = Fnv1a64(absl::StrCat(it.rel, "\t", it.size, "\t",
                              Hex32(crc == written.crc_of.end() ? 0 : crc->second), "\n"),
                 fp);
  }
  m.source_fingerprint = Hex64(fp);
  m.source_files = static_cast<int64_t>(seen.size());
  m.source_bytes = summary.input_bytes;
  nlohmann::json window = nullptr;
  if (o.window_center) window = {*o.window_center, *o.window_width};
  m.import_options = {{"source", o.src_dir},      {"size", {o.height, o.width}},
                      {"channels", o.channels},   {"resize", o.resize},
                      {"label_tag", o.label_tag}, {"labels", o.labels_csv},
                      {"window", window},         {"frames", o.frames},
                      {"shards", o.shards},       {"held_out", o.held_out},
                      {"seed", o.seed},           {"on_error", o.on_error}};
  KILN_RETURN_IF_ERROR(WriteManifest(env, o.out_dir, m));
  SummarizeManifest(m, &summary);
  return summary;
}

uint8_t ApplyWindow(double v, double c, double w) {
  const double lo = c - 0.5 - (w - 1) / 2, hi = c - 0.5 + (w - 1) / 2;
  if (v <= lo) return 0;
  if (v > hi) return 255;
  const double y = ((v - (c - 0.5)) / (w - 1) + 0.5) * 255.0;
  return static_cast<uint8_t>(std::clamp(std::lround(y), 0L, 255L));
}

}  // namespace kiln::data
