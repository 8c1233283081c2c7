// A token dataset: the token shards and SentencePiece tokenizer that `kiln data import text`
// writes (import/text_import.h), which the `tokens:DIR` source spec reads for the GPT (docs/data.md
// "tokens:").
//
//   KILN_ASSIGN_OR_RETURN(TokenDatasetInfo t, ReadTokenDataset(Env::Default(), "/data/fortunes"));
//   t.vocab_size;   // the tokenizer's ids: model.vocab_size must equal it (or be 0)
//   t.seq_len;      // tokens per example (records hold seq_len + 1)
//   t.languages;    // multilingual imports: each language's held-out examples
//
// The input pipeline (pipeline.h) reads "tokens:DIR" as it reads "dataset:DIR" for a text import
// (the import's own train / held_out split; x, y s32 [seq_len], the targets shifted by one), and
// with PipelineConfig::language set, only that language's held-out examples. This header holds
// what both the pipeline and data::OpenTrainData (train_data.h) need from the manifest.
#ifndef KILN_DATA_TOKEN_DATASET_H_
#define KILN_DATA_TOKEN_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"

namespace kiln::data {

// One language of a multilingual text import (dataset.json "languages").
struct TokenLanguage {
  std::string name;
  int64_t held_out_begin = 0;     // its first example in the held_out split (shard order)
  int64_t held_out_examples = 0;  // windows of seq_len + 1 tokens in its held-out shard
};

struct TokenDatasetInfo {
  int64_t vocab_size = 0;
  int64_t seq_len = 0;
  std::string tokenizer_model;           // DIR/tokenizer.model
  std::vector<TokenLanguage> languages;  // empty: not a multilingual import
};

// From a text import's manifest; InvalidArgument for another kind, DataLoss naming the key for
// a malformed manifest.
absl::StatusOr<TokenDatasetInfo> TokenDatasetFromManifest(const DatasetManifest& m,
                                                          const std::string& dir);
absl::StatusOr<TokenDatasetInfo> ReadTokenDataset(Env* env, const std::string& dir);

// Language `name` of the manifest (NotFound listing the languages there are).
absl::StatusOr<TokenLanguage> FindTokenLanguage(const DatasetManifest& m, const std::string& dir,
                                                const std::string& name);

}  // namespace kiln::data

#endif  // KILN_DATA_TOKEN_DATASET_H_
