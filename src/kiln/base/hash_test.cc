#include "kiln/base/hash.h"

#include <string>

#include "gtest/gtest.h"

namespace kiln {
namespace {

// Published FNV-1a values (Fowler/Noll/Vo test vectors, isthe.com/chongo/tech/comp/fnv).
TEST(Hash, Fnv1aKnownValues) {
  EXPECT_EQ(Fnv1a32(""), 0x811c9dc5u);
  EXPECT_EQ(Fnv1a32("a"), 0xe40c292cu);
  EXPECT_EQ(Fnv1a32("foobar"), 0xbf9cf968u);
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Hash, Fnv1aContinues) {
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
  EXPECT_EQ(Fnv1a32("bar", Fnv1a32("foo")), Fnv1a32("foobar"));
  // Bytes >= 0x80 count as unsigned.
  EXPECT_EQ(Fnv1a64("\xff"), (kFnv1a64Offset ^ 0xffu) * kFnv1a64Prime);
  static_assert(Fnv1a64("") == kFnv1a64Offset);
}

// First outputs of Vigna's reference splitmix64.c (also Rosetta Code's "Pseudo-random numbers/
// Splitmix64" for seed 1234567).
TEST(Hash, SplitMix64ReferenceStream) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64Next(&state), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64Next(&state), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(SplitMix64Next(&state), 0x06c45d188009454full);
  state = 1234567;
  EXPECT_EQ(SplitMix64Next(&state), 6457827717110365317ull);
  EXPECT_EQ(SplitMix64Next(&state), 3203168211198807973ull);
  EXPECT_EQ(SplitMix64Next(&state), 9817491932198370423ull);
  EXPECT_EQ(SplitMix64Next(&state), 4593380528125082431ull);
  EXPECT_EQ(SplitMix64Next(&state), 16408922859458223821ull);
}

TEST(Hash, SplitMix64IsTheFirstOutput) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{1234567}, ~uint64_t{0}}) {
    uint64_t state = seed;
    EXPECT_EQ(SplitMix64(seed), SplitMix64Next(&state));
    EXPECT_EQ(state, seed + kSplitMix64Increment);
  }
  EXPECT_EQ(SplitMix64Finalize(0), 0u);
}

}  // namespace
}  // namespace kiln
