// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; Random123):
// the counter-based generator behind random_bits, on every backend. Multipliers
// M0 = 0xD2511F53, M1 = 0xCD9E8D57, Weyl key increments W0 = 0x9E3779B9, W1 = 0xBB67AE85, ten
// rounds with the key bumped between rounds. Known answer: key (0, 0), counter (0, 0, 0, 0) ->
// 0x6627e8d5 0xe169c58d 0xbc57ac4c 0x9b00dbd8. Inline: the cpu kernel calls it per 4 words.
//
//   std::array<uint32_t, 4> words = Philox4x32({lo(i), hi(i), lo(c), hi(c)}, {lo(seed), hi(seed)});
#ifndef KILN_BASE_PHILOX_H_
#define KILN_BASE_PHILOX_H_

#include <array>
#include <cstdint>

namespace kiln {

inline std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> ctr,
                                          std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

}  // namespace kiln

#endif  // KILN_BASE_PHILOX_H_
