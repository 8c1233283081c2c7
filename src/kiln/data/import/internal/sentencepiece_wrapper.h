// A thin wrapper over libsentencepiece. Its header declares `namespace absl { using
// std::string_view; }`, which clashes with Abseil's own absl::string_view, so only
// sentencepiece_wrapper.cc includes it and this interface uses the standard library alone.
#ifndef KILN_DATA_IMPORT_INTERNAL_SENTENCEPIECE_WRAPPER_H_
#define KILN_DATA_IMPORT_INTERNAL_SENTENCEPIECE_WRAPPER_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::data::internal {

// SentencePieceTrainer::Train with spm_train's flags as a map ({"vocab_size", "8000"}, ...) on
// `sentences` (no input file); the trained model's serialized proto goes to *model (no file is
// written). Returns "" on success, else the library's message.
std::string TrainSentencePiece(const std::vector<std::pair<std::string, std::string>>& flags,
                               const std::vector<std::string>& sentences, std::string* model);

class SentencePieceEncoder {
 public:
  // From a serialized model (the bytes of a .model file); nullptr with *error set when it does
  // not load.
  static std::unique_ptr<SentencePieceEncoder> FromProto(const std::string& model,
                                                         std::string* error);
  virtual ~SentencePieceEncoder() = default;
  // Thread-safe (the model is read-only). "" on success.
  virtual std::string Encode(std::string_view text, std::vector<int>* ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int unk_id() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int pad_id() const = 0;
  virtual std::string Piece(int id) const = 0;
  virtual float Score(int id) const = 0;
};

}  // namespace kiln::data::internal

#endif  // KILN_DATA_IMPORT_INTERNAL_SENTENCEPIECE_WRAPPER_H_
