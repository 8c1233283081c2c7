#include "kiln/base/coding.h"

namespace kiln {

bool GetFixed32(std::string_view* input, uint32_t* value) {
  if (input->size() < 4) return false;
  *value = DecodeFixed32(input->data());
  input->remove_prefix(4);
  return true;
}

bool GetFixed64(std::string_view* input, uint64_t* value) {
  if (input->size() < 8) return false;
  *value = DecodeFixed64(input->data());
  input->remove_prefix(8);
  return true;
}

VarintResult ParseVarint64(std::string_view* input, uint64_t* value) {
  uint64_t v = 0;
  for (size_t i = 0; i < kMaxVarint64Bytes; ++i) {
    if (i >= input->size()) return VarintResult::kTruncated;
    const uint8_t b = static_cast<uint8_t>((*input)[i]);
    if (i == kMaxVarint64Bytes - 1 && b > 1) return VarintResult::kOverflow;
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      *value = v;
      input->remove_prefix(i + 1);
      return VarintResult::kOk;
    }
  }
  return VarintResult::kOverflow;  // unreachable: the 10th byte is 0 or 1 here, so it ends
}

}  // namespace kiln
