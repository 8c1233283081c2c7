// The data a trainer reads: data::OpenTrainData (data/train_data.h) fed from the config's data
// section.
//
//   KILN_ASSIGN_OR_RETURN(TrainData d, OpenTrainData(config, /*language_model=*/false,
//                                                    /*with_train=*/true));
//   KILN_RETURN_IF_ERROR(d.train->Next(x, y));     // x: d.shape.x_dims, y: [batch] labels
//
// `with_train = false` opens only the held-out split (kiln eval); the shapes are the same.
#ifndef KILN_TRAIN_TRAIN_DATA_H_
#define KILN_TRAIN_TRAIN_DATA_H_

#include "absl/status/statusor.h"
#include "kiln/data/train_data.h"
#include "kiln/train/config.h"

namespace kiln::train {

using Batcher = data::Batcher;
using EvalData = data::EvalData;
using DataShape = data::DataShape;
using TrainData = data::TrainData;
using data::MakeInputTensor;
using data::MakeTargetTensor;

// The config's data section as a data::TrainDataConfig (language models: num_classes is
// model.vocab_size).
data::TrainDataConfig TrainDataConfigFor(const TrainConfig& config, bool language_model);

absl::StatusOr<TrainData> OpenTrainData(const TrainConfig& config, bool language_model,
                                        bool with_train, Env* env = Env::Default());

}  // namespace kiln::train

#endif  // KILN_TRAIN_TRAIN_DATA_H_
