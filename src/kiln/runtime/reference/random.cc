// Reference kernel for random_bits: stateless, counter-based Philox4x32-10.
//
// Layout (the contract every backend reproduces bit for bit):
//   key      = (lo32(seed), hi32(seed))
//   element i of the output (row-major) comes from block b = i / 4:
//     counter words = (lo32(b), hi32(b), lo32(counter), hi32(counter))
//     word          = Philox4x32-10(counter words, key)[i % 4]
//   s32 output: the word, bit-cast.
//   f32 output: (word >> 8) * 2^-24, uniform on [0, 1) with 24 random bits (exact in f32).
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; Random123):
// multipliers M0 = 0xD2511F53, M1 = 0xCD9E8D57, Weyl key increments W0 = 0x9E3779B9,
// W1 = 0xBB67AE85, ten rounds with the key bumped between rounds. Known answer:
// key (0, 0), counter (0, 0, 0, 0) -> 0x6627e8d5 0xe169c58d 0xbc57ac4c 0x9b00dbd8.
#include "kiln/base/status.h"
#include "kiln/runtime/reference/kernels.h"

namespace kiln::runtime::reference {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
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

namespace {

uint32_t Lo32(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t Hi32(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

}  // namespace

// Operands seed s64[] and counter s64[]; result s32 (raw bits) or f32 (uniform [0, 1)), laid out
// as described at the top of this file.
absl::StatusOr<Kernel> MakeRandomKernel(const ir::Graph& g, const ir::Node& n) {
  for (int k = 0; k < 2; ++k) {
    const ir::Type& t = OperandType(g, n, k);
    if (t.dtype != DType::kS64 || t.shape.rank() != 0)
      return Unsupported(
          n, std::string(k == 0 ? "seed" : "counter") + " must be s64[], got " + t.ToString());
  }
  DType out_t = n.type().dtype;
  if (out_t != DType::kS32 && out_t != DType::kF32)
    return Unsupported(n, "result dtype must be s32 or f32, got " + std::string(DTypeName(out_t)));
  int64_t count = n.type().shape.num_elements();
  int seed = n.operand(0), counter = n.operand(1), y = n.id();
  return Kernel([=](RunContext& ctx) {
    uint64_t s = static_cast<uint64_t>(*static_cast<const int64_t*>(In(ctx, seed)));
    uint64_t c = static_cast<uint64_t>(*static_cast<const int64_t*>(In(ctx, counter)));
    std::array<uint32_t, 2> key = {Lo32(s), Hi32(s)};
    std::array<uint32_t, 4> block{};
    for (int64_t i = 0; i < count; ++i) {
      if (i % 4 == 0) {
        uint64_t b = static_cast<uint64_t>(i / 4);
        block = Philox4x32({Lo32(b), Hi32(b), Lo32(c), Hi32(c)}, key);
      }
      uint32_t word = block[i % 4];
      if (out_t == DType::kS32)
        static_cast<int32_t*>(Out(ctx, y))[i] = static_cast<int32_t>(word);
      else
        static_cast<float*>(Out(ctx, y))[i] = static_cast<float>(word >> 8) * 0x1.0p-24f;
    }
  });
}

}  // namespace kiln::runtime::reference
