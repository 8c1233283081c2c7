// Rarely-hot ops: random_bits and the collectives (all_reduce through RunContext::collectives).
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kiln/base/philox.h"
#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {

LowerResult LowerMisc(const ir::Node& n, LowerContext& lc) {
  switch (n.opcode()) {
    // key = (lo32(seed), hi32(seed)); element i comes from block i / 4 with counter words
    // (lo32(i / 4), hi32(i / 4), lo32(counter), hi32(counter)), word i % 4. s32: the word;
    // f32: (word >> 8) * 2^-24.
    case ir::Opcode::kRandomBits: {
      for (int k = 0; k < 2; ++k) {
        const ir::Type& t = lc.operand_type(n, k);
        if (t.dtype != DType::kS64 || t.shape.rank() != 0)
          return Unimplemented(
              n, absl::StrCat(k == 0 ? "seed" : "counter", " must be s64[], got ", t.ToString()));
      }
      DType t = n.type().dtype;
      if (t != DType::kS32 && t != DType::kF32) return UnsupportedDType(n, t);
      bool is_f32 = t == DType::kF32;
      int seed = n.operand(0), counter = n.operand(1), out = n.id();
      int64_t count = n.type().shape.num_elements();
      int64_t blocks = (count + 3) / 4;
      return MakeFnThunk(n, "loop", [=](RunContext& ctx) {
        uint64_t s = static_cast<uint64_t>(*static_cast<const int64_t*>(ctx.buffers[seed]));
        uint64_t c = static_cast<uint64_t>(*static_cast<const int64_t*>(ctx.buffers[counter]));
        std::array<uint32_t, 2> key = {static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32)};
        uint32_t c0 = static_cast<uint32_t>(c), c1 = static_cast<uint32_t>(c >> 32);
        void* y = ctx.buffers[out];
        ParallelFor(blocks, kElementwiseGrain / 4, [&](int64_t b, int64_t e) {
          for (int64_t blk = b; blk < e; ++blk) {
            uint64_t ub = static_cast<uint64_t>(blk);
            std::array<uint32_t, 4> w = Philox4x32(
                {static_cast<uint32_t>(ub), static_cast<uint32_t>(ub >> 32), c0, c1}, key);
            int64_t base = blk * 4, len = std::min<int64_t>(4, count - base);
            for (int64_t j = 0; j < len; ++j) {
              if (is_f32)
                static_cast<float*>(y)[base + j] = static_cast<float>(w[j] >> 8) * 0x1.0p-24f;
              else
                static_cast<int32_t*>(y)[base + j] = static_cast<int32_t>(w[j]);
            }
          }
        });
      });
    }
    // all_reduce: the operand copied into the result, then summed in place over the ranks
    // through the run's Collectives (RunContext), when it has them for more than one rank. A
    // failure (a peer gone: DeadlineExceeded) stops the run. all_gather / reduce_scatter stay
    // identities over one replica (the partitioner that makes them real is not built yet).
    case ir::Opcode::kAllReduce:
    case ir::Opcode::kAllGather:
    case ir::Opcode::kReduceScatter: {
      if (n.opcode() != ir::Opcode::kAllReduce && n.attr_int("replicas") != 1)
        return Unimplemented(
            n, absl::StrCat("the cpu backend runs one replica; this op has replicas = ",
                            n.attr_int("replicas")));
      if (n.opcode() == ir::Opcode::kAllReduce && n.has_attr("reduction") &&
          n.attr_str("reduction") != "sum")
        return Unimplemented(n, "unknown reduction '" + n.attr_str("reduction") + "'");
      int in = n.operand(0), out = n.id();
      int64_t bytes = n.type().byte_size();
      if (n.opcode() == ir::Opcode::kAllReduce) {
        const DType dtype = n.type().dtype;
        const int64_t count = n.type().shape.num_elements();
        std::string what = absl::StrCat("all_reduce %", n.id());
        return MakeFnThunk(n, "collective", [=](RunContext& ctx) {
          if (ctx.buffers[out] != ctx.buffers[in])
            std::memcpy(ctx.buffers[out], ctx.buffers[in], bytes);
          if (ctx.collectives == nullptr || ctx.collectives->size() <= 1 || count == 0) return;
          absl::Status s = ctx.collectives->AllReduceSum(ctx.buffers[out], count, dtype);
          if (!s.ok()) ctx.status = absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
        });
      }
      return MakeFnThunk(n, "copy", [=](RunContext& ctx) {
        std::memcpy(ctx.buffers[out], ctx.buffers[in], bytes);
      });
    }
    default:
      return Unimplemented(n, "not a misc op");
  }
}

}  // namespace kiln::runtime::cpu
