// `kiln data import dicom`: DICOM files (any folder layout) become record shards of fixed-size
// 8-bit pixels plus dataset.json, like `kiln data import images` (docs/data.md "dicom").
//
//   DicomImportOptions o;
//   o.src_dir = "/studies"; o.out_dir = "/data/ct"; o.height = o.width = 128;
//   o.label_tag = "0008,0060";                       // Modality: CT, MR, ...
//   KILN_ASSIGN_OR_RETURN(ImportSummary s, ImportDicom(Env::Default(), o, progress));
//
// Decoding is GDCM's (libgdcm): every transfer syntax it decodes (implicit/explicit little and
// big endian, RLE, JPEG baseline/extended/lossless, JPEG-LS, JPEG 2000). GDCM rather than DCMTK
// because Debian's DCMTK decodes no JPEG 2000 and needs each codec registered by hand; GDCM reads
// them all through one ImageReader. An optional engine in its own target (DESIGN.md §3.7).
//
// Each frame becomes pixels this way, in this order (PS3.3 C.7.6.3, C.11.2.1.2):
//   1. stored values -> modality values: v * RescaleSlope + RescaleIntercept (0028,1053/1052;
//      1 and 0 when absent), e.g. Hounsfield units for CT;
//   2. window: --window C,W if given, else the file's first WindowCenter/WindowWidth
//      (0028,1050/1051), else the frame's own min..max; the DICOM linear function maps
//      v <= C - 0.5 - (W-1)/2 to 0, v > C - 0.5 + (W-1)/2 to 255, and between linearly;
//   3. MONOCHROME1 (0 = white) is inverted (255 - y) so that every image reads 0 = black;
//   4. color files (SamplesPerPixel 3: RGB, or YBR which GDCM converts to RGB) skip 1-3 (8-bit
//      values taken as they are) and, with --channels 1, become BT.601 luma (ConvertChannels);
//      gray files with --channels 3 repeat the gray value;
//   5. resized to HxW (ResizeImage: crop or fit, area/bilinear, as the images importer).
// Multi-frame files give their first frame (--frames first) or one example per frame
// (--frames all; "path" is then "<file>#<frame>").
//
// Labels: the value of a header tag (--label-tag GGGG,EEEE, default 0008,0060 Modality), or a
// CSV of "relative path,label" lines (--labels FILE; files it does not name are ignored). Label
// ids index the sorted distinct labels. Files are sorted by relative path and split and sharded
// as the images importer does (seeded permutation; the shards depend only on the inputs and the
// options, never on the thread count); finished shards survive a kill (shard_io.h).
//
// A file GDCM cannot read (not DICOM, truncated, no pixel data, an undecodable syntax) or
// without the label tag fails the import naming it, or with --on-error skip is skipped and
// listed in dataset.json "skipped" with the reason.
//
// Records: tf.train.Example {"image": bytes (H*W*C uint8, HWC), "label": int64, "path": bytes}.
#ifndef KILN_DATA_IMPORT_DICOM_DICOM_IMPORT_H_
#define KILN_DATA_IMPORT_DICOM_DICOM_IMPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/import/image_import.h"
#include "kiln/data/import_util.h"

namespace kiln::data {

struct DicomImportOptions {
  std::string src_dir;
  std::string out_dir;
  int height = 0, width = 0;
  int channels = 1;             // 1 or 3
  std::string resize = "crop";  // "crop" or "fit"
  std::string label_tag = "0008,0060";
  std::string labels_csv;  // "relative path,label" lines; overrides label_tag when set
  std::optional<double> window_center, window_width;  // both or neither
  std::string frames = "first";                       // "first" or "all"
  int shards = 4;
  double held_out = 0.1;
  uint64_t seed = 0;
  int threads = 0;                // 0: all cores
  std::string on_error = "fail";  // "fail" or "skip"
};

absl::StatusOr<ImportSummary> ImportDicom(Env* env, const DicomImportOptions& options,
                                          const ProgressFn& progress = nullptr);

// One frame of a DICOM file's bytes as the importer makes its pixels (steps 1-5 above, with o's
// height, width, channels, resize and window): uint8 HWC, o.height * o.width * o.channels values.
// What `kiln predict --input-dir` runs on each study. Errors name `name` (not DICOM, truncated,
// no pixel data, an undecodable syntax, a frame out of range).
absl::StatusOr<std::vector<uint8_t>> DecodeDicomPixels(const std::string& bytes,
                                                       const std::string& name,
                                                       const DicomImportOptions& o, int frame = 0);

// The DICOM linear window function (PS3.3 C.11.2.1.2.1) on one modality value, to 0..255.
uint8_t ApplyWindow(double value, double center, double width);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_DICOM_DICOM_IMPORT_H_
