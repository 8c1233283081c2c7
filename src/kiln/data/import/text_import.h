// `kiln data import text`: text corpora become a SentencePiece tokenizer (libsentencepiece) and
// token shards packed to a fixed sequence length (docs/data.md "text").
//
//   TextImportOptions o;
//   o.corpus = {"/usr/share/games/fortunes/de/liebe", ...}; o.out_dir = "/data/fortunes";
//   o.vocab_size = 4000; o.seq_len = 128; o.doc_separator = "%";
//   KILN_ASSIGN_OR_RETURN(ImportSummary s, ImportText(Env::Default(), o, progress));
//
// Steps, each deterministic:
// 1. Documents: every file (plain or gzip) is cut into documents by `doc_separator`: "blank"
//    (a run of blank lines ends one), "line" (each line is one), "file" (the whole file is one)
//    or any other text (a line equal to it ends one, e.g. "%" for fortune files). Lines keep their
//    order, CR LF is read as LF, empty documents are dropped.
// 2. Tokenizer: SentencePiece (unigram or BPE) trained on a sample of at most `sample_lines`
//    non-empty lines: all lines when there are fewer, else the lines at the first sample_lines
//    positions of Permutation(lines, mt19937_64(seed)), kept in corpus order; one training thread
//    (so the model does not depend on the thread count). Ids: unk 0, bos 1, eos 2, pad 3.
//    Saved as DIR/tokenizer.model (the SentencePiece model proto, what spm_encode and the Python
//    module load) and DIR/tokenizer.vocab (piece TAB score per line, id order).
// 3. Split: documents permuted with mt19937_64(seed); the first round(held_out * D) go to
//    "held_out", the rest to "train", each kept in corpus order, and cut into contiguous groups of
//    documents, one per shard.
// 4. Shards: each shard's documents tokenized in parallel, concatenated as doc tokens + eos, and
//    packed into windows of seq_len + 1 tokens starting every seq_len tokens (consecutive windows
//    share one token: inputs tokens[0:L], targets tokens[1:L+1]); the last partial window of each
//    shard is dropped (counted in the manifest).
// Each record is a tf.train.Example with "tokens": int64_list of seq_len + 1 ids.
//
// Multilingual corpora (`language_from_dir`): every corpus entry is a folder, "DIR" or
// "LANG=DIR", holding one language (LANG, default the folder's name). Its files, at any depth
// (symlinks followed, names starting with '.' skipped), are read in sorted order, except index
// files ending in ".dat" and, of a file X and its UTF-8 copy X.u8 beside it (fortune packages), X
// when X.u8 is not empty, else the empty X.u8 (bookworm's fortunes-pl ships empty .u8 files beside
// UTF-8 originals); a file that is not UTF-8 is an error naming it and the byte offset. Then, per
// language:
// - the tokenizer sample is balanced: each language gets an equal share of sample_lines, a
//   language with fewer lines gives all of them and its unused share goes to the others
//   (water-filling from the smallest language up); lines drawn by a seeded permutation per
//   language, kept in corpus order;
// - the split is per language (each language's documents permuted with its own seed; at least
//   one held-out document for a language of two or more when held_out > 0); train documents of
//   every language, in language order, are cut into `shards` shards; the held-out split gets one
//   shard per language, so windows of a held-out shard never mix languages. dataset.json
//   "languages" lists each language with its files, documents, sample lines and held-out shard
//   (what the `tokens:` source's per-language evaluation reads).
#ifndef KILN_DATA_IMPORT_TEXT_IMPORT_H_
#define KILN_DATA_IMPORT_TEXT_IMPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/data/import/image_import.h"
#include "kiln/data/import_util.h"

namespace kiln::data {

inline constexpr char kTokenizerModel[] = "tokenizer.model";
inline constexpr char kTokenizerVocab[] = "tokenizer.vocab";

struct TextImportOptions {
  std::vector<std::string> corpus;
  std::string out_dir;
  int vocab_size = 8000;
  int seq_len = 128;
  int64_t sample_lines = 200000;
  std::string model_type = "unigram";  // or "bpe"
  double character_coverage =
      0.9995;  // SentencePiece's: the share of characters the vocabulary covers
  std::string doc_separator = "blank";
  int shards = 4;
  double held_out = 0.05;
  uint64_t seed = 0;
  int threads = 0;  // tokenization threads; 0: all cores
  // Each corpus entry is "DIR" or "LANG=DIR": one language per folder (see the top of the file).
  bool language_from_dir = false;
};

absl::StatusOr<ImportSummary> ImportText(Env* env, const TextImportOptions& options,
                                         const ProgressFn& progress = nullptr);

}  // namespace kiln::data

#endif  // KILN_DATA_IMPORT_TEXT_IMPORT_H_
