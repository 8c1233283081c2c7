// Only this file includes the SentencePiece headers (see the header).
#include "kiln/data/import/internal/sentencepiece_wrapper.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

namespace kiln::data::internal {
namespace {

class Encoder final : public SentencePieceEncoder {
 public:
  sentencepiece::SentencePieceProcessor sp;
  std::string Encode(std::string_view text, std::vector<int>* ids) const override {
    auto s = sp.Encode(text, ids);
    return s.ok() ? std::string() : std::string(s.message());
  }
  int vocab_size() const override { return sp.GetPieceSize(); }
  int unk_id() const override { return sp.unk_id(); }
  int bos_id() const override { return sp.bos_id(); }
  int eos_id() const override { return sp.eos_id(); }
  int pad_id() const override { return sp.pad_id(); }
  std::string Piece(int id) const override { return sp.IdToPiece(id); }
  float Score(int id) const override { return sp.GetScore(id); }
};

class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

}  // namespace

std::string TrainSentencePiece(const std::vector<std::pair<std::string, std::string>>& flags,
                               const std::vector<std::string>& sentences, std::string* model) {
  std::unordered_map<std::string, std::string> kwargs(flags.begin(), flags.end());
  VectorIterator it(sentences);
  auto s = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, model);
  return s.ok() ? std::string() : std::string(s.message());
}

std::unique_ptr<SentencePieceEncoder> SentencePieceEncoder::FromProto(const std::string& model,
                                                                      std::string* error) {
  auto e = std::make_unique<Encoder>();
  auto s = e->sp.LoadFromSerializedProto(model);
  if (!s.ok()) {
    *error = std::string(s.message());
    return nullptr;
  }
  return e;
}

}  // namespace kiln::data::internal
