#include "kiln/train/train_data.h"

namespace kiln::train {

data::TrainDataConfig TrainDataConfigFor(const TrainConfig& c, bool language_model) {
  data::TrainDataConfig sc;
  sc.source = c.data.source;
  sc.batch_size = c.data.batch_size;
  sc.shuffle = c.data.shuffle;
  sc.seed = c.data.seed;
  sc.held_out_fraction = c.data.held_out_fraction;
  sc.remainder = c.data.remainder;
  sc.shuffle_buffer = c.data.shuffle_buffer;
  sc.prefetch = c.data.prefetch;  // -1 = data::kAutoPrefetch
  sc.workers = c.data.workers;    // -1 = data::kAutoWorkers
  const AugmentSection& a = c.data.augment;
  if (a.enabled()) {
    sc.augment.channels = c.model.channels;
    sc.augment.height = c.model.height;
    sc.augment.width = c.model.width;
    sc.augment.random_crop = a.random_crop;
    sc.augment.padding = a.random_crop ? a.padding : 0;
    sc.augment.flip_horizontal = a.flip_horizontal;
    sc.augment.mean = a.mean;
    sc.augment.std = a.std;
  }
  sc.num_classes = c.data.num_classes;
  sc.seq_len = c.data.seq_len;
  sc.language_model = language_model;
  sc.vocab_size = c.model.vocab_size;
  return sc;
}

absl::StatusOr<TrainData> OpenTrainData(const TrainConfig& config, bool language_model,
                                        bool with_train, Env* env) {
  return data::OpenTrainData(TrainDataConfigFor(config, language_model), with_train, env);
}

}  // namespace kiln::train
