// Bulk classification of DICOM studies, the library half of `kiln predict --input-dir` (docs/cli.md
// "kiln predict"; kiln::predict, the layer beside kiln::serve, which the cli wires): the
// preprocessing of the DICOM import a model was trained on, the list of study files, and the
// pipeline that decodes (GDCM, as the importer does) a chunk of studies on worker threads while
// the classifier runs the previous chunk's batches. What is written and printed stays in the cli.
//
//   KILN_ASSIGN_OR_RETURN(Preprocess pre, ReadPreprocess(dataset_dir));
//   KILN_RETURN_IF_ERROR(CheckCompatible(*model, pre, dataset_dir));
//   KILN_ASSIGN_OR_RETURN(std::vector<std::string> files, ListStudies(root));
//   KILN_RETURN_IF_ERROR(ClassifyStudies(*model, pre, root, files, threads,
//       [&](int64_t base, const std::vector<Study>& chunk) { ... write chunk ...; return
//       OkStatus(); }));
#ifndef KILN_PREDICT_STUDIES_H_
#define KILN_PREDICT_STUDIES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/predict/classifier.h"

namespace kiln::predict {

// The preprocessing and labels of the DICOM import a model was trained on.
struct Preprocess {
  int height = 0, width = 0, channels = 1;
  std::string resize = "crop";
  bool window = false;
  double window_center = 0, window_width = 0;
  std::vector<double> mean, inv_std;  // per channel, dataset.json statistics
  std::vector<std::string> labels;
};

// From the dataset.json of `dir` (InvalidArgument unless `kiln data import dicom` wrote it).
absl::StatusOr<Preprocess> ReadPreprocess(const std::string& dir);

// The model takes the dataset's pixels and gives its labels (and its normalization, if any, is
// for images of the dataset's size); errors name both sides.
absl::Status CheckCompatible(const Classifier& model, const Preprocess& pre,
                             const std::string& dataset);

// Every regular file under `root` (names starting with '.' skipped), relative, sorted.
absl::StatusOr<std::vector<std::string>> ListStudies(const std::string& root);

struct Study {
  std::vector<float> x;               // normalized CHW, empty on failure
  std::string error;                  // why it did not decode
  std::vector<double> probabilities;  // the classifier's, when decoded
};

// Decodes root/files[i] for every i and classifies the decoded ones, `threads` decoding threads
// (a chunk of a few batches ahead of the model); on_chunk(base, chunk) after each chunk, in
// order (chunk[i] is files[base + i]). Stops at the first error of the model (annotated "running
// the model") or of on_chunk. Unimplemented where kiln was built without GDCM.
absl::Status ClassifyStudies(
    Classifier& model, const Preprocess& pre, const std::string& root,
    const std::vector<std::string>& files, int threads,
    const std::function<absl::Status(int64_t base, const std::vector<Study>& chunk)>& on_chunk);

}  // namespace kiln::predict

#endif  // KILN_PREDICT_STUDIES_H_
