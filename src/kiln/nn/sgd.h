// SgdTrainer is gone: `kiln demo` trains through nn::TrainStep (train_step.h) with a plain-SGD
// OptimizerConfig, and UpdatedName lives in optim.h. This forwarding header only remains until
// its last includer drops it.
#ifndef KILN_NN_SGD_H_
#define KILN_NN_SGD_H_

#include "kiln/nn/optim.h"

#endif  // KILN_NN_SGD_H_
