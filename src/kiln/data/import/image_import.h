// `kiln data import images`: a folder of class folders of JPEG/PNG files becomes record shards of
// fixed-size pixels plus dataset.json (docs/data.md "images").
//
//   ImageImportOptions o;
//   o.src_dir = "/usr/share/icons/Adwaita/48x48"; o.out_dir = "/data/icons";
//   o.height = o.width = 32;
//   KILN_ASSIGN_OR_RETURN(ImportSummary s, ImportImages(Env::Default(), o, progress));
//
// Labels are the names of SRC_DIR's subfolders, sorted (label id = index); every .jpg, .jpeg or
// .png file (any case) under a label folder, at any depth, is one example; other files are
// counted and ignored. Files are sorted by relative path, permuted with mt19937_64(seed)
// (data::Permutation), the first round(held_out * N) go to split "held_out", the rest to
// "train", and each split is cut into contiguous shards. So the shards depend only on the file
// names, sizes, contents and options, never on the thread count.
//
// Each record is a tf.train.Example with
//   "image": bytes_list, one value of height*width*channels uint8 (HWC, row-major)
//   "label": int64_list, one value (the label id)
//   "path":  bytes_list, one value (the file's path relative to SRC_DIR)
#ifndef KILN_DATA_IMPORT_IMAGE_IMPORT_H_
#define KILN_DATA_IMPORT_IMAGE_IMPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/import_util.h"

namespace kiln::data {

struct ImageImportOptions {
  std::string src_dir;
  std::string out_dir;
  int height = 0, width = 0;
  int channels = 3;             // 1 or 3
  std::string resize = "crop";  // "crop" or "fit"
  int background = 255;         // gray level transparent pixels are composited over
  int shards = 4;               // shards of the train split
  double held_out = 0.1;        // fraction in [0, 1)
  uint64_t seed = 0;
  int threads = 0;                // 0: all cores
  std::string on_error = "fail";  // "fail" or "skip" (a file that does not decode)
};

// What an import did (every importer returns one).
struct ImportSummary {
  int64_t examples = 0;
  int64_t skipped = 0;  // inputs that did not decode (on_error: skip)
  int64_t ignored = 0;  // files that are not inputs (wrong extension, ...)
  int shards = 0;
  int shards_kept = 0;  // finished by an earlier run and verified
  std::map<std::string, int64_t> splits;
  uint64_t input_bytes = 0;
  int64_t units = 0;  // tokens for text, else examples
  // Wall time of the import's main phases, in order (e.g. {"tokenizer", 2.1}).
  std::vector<std::pair<std::string, double>> phase_seconds;
  // Text imports, the "tokenize and write" phase: CPU seconds of the whole process, and of the
  // calling thread outside its parallel loops (the part no thread count speeds up). CPU time
  // hardly depends on what else runs on the machine, so serial / total bounds the speedup that
  // more threads can give (Amdahl) even where the wall times cannot show it.
  double tokenize_cpu_seconds = 0;
  double tokenize_serial_cpu_seconds = 0;
};

absl::StatusOr<ImportSummary> ImportImages(Env* env, const ImageImportOptions& options,
                                           const ProgressFn& progress = nullptr);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_IMAGE_IMPORT_H_
