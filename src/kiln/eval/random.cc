// Reference kernel for random_bits: stateless, counter-based Philox4x32-10.
//
// Layout (the contract every backend reproduces bit for bit):
//   key      = (lo32(seed), hi32(seed))
//   element i of the output (row-major) comes from block b = i / 4:
//     counter words = (lo32(b), hi32(b), lo32(counter), hi32(counter))
//     word          = Philox4x32-10(counter words, key)[i % 4]
//   s32 output: the word, bit-cast.
//   f32 output: (word >> 8) * 2^-24, uniform on [0, 1) with 24 random bits (exact in f32).
// Philox4x32-10 itself is base/philox.h (one implementation for every backend).
#include "kiln/base/status.h"
#include "kiln/eval/kernels.h"

namespace kiln::eval {
namespace {

uint32_t Lo32(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t Hi32(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

}  // namespace

// Operands seed s64[] and counter s64[]; result s32 (raw bits) or f32 (uniform [0, 1)), laid out
// as described at the top of this file.
absl::StatusOr<Kernel> MakeRandomKernel(const ir::Node& n, OperandTypes types) {
  for (int k = 0; k < 2; ++k) {
    const ir::Type& t = types[k];
    if (t.dtype != DType::kS64 || t.shape.rank() != 0)
      return Unsupported(
          n, std::string(k == 0 ? "seed" : "counter") + " must be s64[], got " + t.ToString());
  }
  DType out_t = n.type().dtype;
  if (out_t != DType::kS32 && out_t != DType::kF32)
    return Unsupported(n, "result dtype must be s32 or f32, got " + std::string(DTypeName(out_t)));
  int64_t count = n.type().shape.num_elements();
  int seed = 0, counter = 1, y = ResultSlot(n);
  return Kernel([=](Buffers ctx) {
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

}  // namespace kiln::eval
