// Rarely-hot ops: random_bits and the collectives (all_reduce through RunContext::collectives).
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/base/philox.h"
#include "kiln/runtime/cpu/internal/common.h"
#include "kiln/runtime/shard_collectives.h"

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
    // all_reduce (sum, data parallel): the operand copied into the result, then summed in place
    // over the ranks through the run's Collectives (RunContext), when it has them for more than
    // one rank. A failure (a peer gone: DeadlineExceeded) stops the run. The SPMD partitioner's
    // collectives (all_reduce over a mesh axis or with reduction max, all_gather /
    // reduce_scatter over more than one replica) run through the Shard* calls of the run's
    // Collectives (runtime/shard_collectives.h); over one replica they are copies.
    case ir::Opcode::kAllReduce:
    case ir::Opcode::kAllGather:
    case ir::Opcode::kReduceScatter: {
      int in = n.operand(0), out = n.id();
      int64_t bytes = n.type().byte_size();
      const bool sum = n.opcode() == ir::Opcode::kAllReduce && !runtime::IsShardAllReduce(n);
      if (sum) {
        const DType dtype = n.type().dtype;
        const int64_t count = n.type().shape.num_elements();
        std::string what = absl::StrCat("all_reduce %", n.id());
        return MakeFnThunk(n, "collective", [=](RunContext& ctx) {
          if (ctx.buffers[out] != ctx.buffers[in])
            std::memcpy(ctx.buffers[out], ctx.buffers[in], bytes);
          if (ctx.collectives == nullptr || ctx.collectives->size() <= 1 || count == 0) return;
          if (ctx.stream != nullptr) ctx.stream->Quiesce();  // after those in flight, never beside
          absl::Status s = ctx.collectives->AllReduceSum(ctx.buffers[out], count, dtype);
          if (!s.ok()) ctx.status = absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
        });
      }
      if (n.opcode() != ir::Opcode::kAllReduce && n.attr_int("replicas") == 1)
        return MakeFnThunk(n, "copy", [=](RunContext& ctx) {
          std::memcpy(ctx.buffers[out], ctx.buffers[in], bytes);
        });
      const ir::Type in_type = lc.operand_type(n, 0);
      auto scratch = std::make_shared<std::vector<uint8_t>>(
          static_cast<size_t>(std::max(bytes, in_type.byte_size())));
      const ir::Node node = n;
      return MakeFnThunk(n, "collective", [=](RunContext& ctx) {
        if (bytes == 0) return;
        if (ctx.stream != nullptr) ctx.stream->Quiesce();  // after those in flight, never beside
        runtime::RunShardCollective(node, in_type, ctx.buffers[in], ctx.buffers[out],
                                    scratch->data(), ctx);
      });
    }
    default:
      return Unimplemented(n, "not a misc op");
  }
}

namespace {

// The all-reduce itself, on the stream's thread: the operand copied into the result, then summed
// in place over the ranks. The buffer plan keeps both untouched until the wait.
class AllReduceOp : public CollectiveOp {
 public:
  AllReduceOp(const ir::Node& n)
      : name_(absl::StrCat("all_reduce %", n.id(), " ", n.type().ToString())),
        what_(absl::StrCat("all_reduce %", n.id())),
        bytes_(n.type().byte_size()),
        count_(n.type().shape.num_elements()),
        dtype_(n.type().dtype) {}
  absl::Status Execute() override {
    if (out_ != in_) std::memcpy(out_, in_, static_cast<size_t>(bytes_));
    absl::Status s = collectives_->AllReduceSum(out_, count_, dtype_);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what_, ": ", s.message()));
    return absl::OkStatus();
  }
  const std::string& name() const override { return name_; }

  // Set by the start thunk before each Start (the stream's mutex orders them for the thread).
  Collectives* collectives_ = nullptr;
  const void* in_ = nullptr;
  void* out_ = nullptr;
  const std::string name_, what_;
  const int64_t bytes_, count_;
  const DType dtype_;
};

class AllReduceStartThunk : public Thunk {
 public:
  AllReduceStartThunk(const ir::Node& n, std::shared_ptr<AllReduceOp> op)
      : in_(n.operand(0)), out_(n.id()), name_(ThunkName(n, "start")), op_(std::move(op)) {}
  void Run(RunContext& ctx) override {
    void* out = ctx.buffers[out_];
    const void* in = ctx.buffers[in_];
    if (ctx.collectives == nullptr || ctx.collectives->size() <= 1 || op_->count_ == 0 ||
        ctx.stream == nullptr) {
      // One replica: the copy is the result (no stream needed); no stream: run it here.
      if (out != in) std::memcpy(out, in, static_cast<size_t>(op_->bytes_));
      if (ctx.collectives == nullptr || ctx.collectives->size() <= 1 || op_->count_ == 0) return;
      op_->collectives_ = ctx.collectives;
      op_->in_ = out;
      op_->out_ = out;
      absl::Status s = op_->Execute();
      if (!s.ok()) ctx.status = std::move(s);
      return;
    }
    op_->collectives_ = ctx.collectives;
    op_->in_ = in;
    op_->out_ = out;
    ctx.stream->Start(op_.get());
  }
  std::string name() const override { return name_; }

 private:
  const int in_, out_;
  const std::string name_;
  std::shared_ptr<AllReduceOp> op_;
};

class AllReduceWaitThunk : public Thunk {
 public:
  AllReduceWaitThunk(const ir::Node& n, std::shared_ptr<AllReduceOp> op)
      : name_(ThunkName(n, "wait")), op_(std::move(op)) {}
  void Run(RunContext& ctx) override {
    if (ctx.stream == nullptr) return;
    absl::Status s = ctx.stream->Wait(op_.get());  // OK when it did not start (one replica)
    if (!s.ok()) ctx.status = std::move(s);
  }
  std::string name() const override { return name_; }

 private:
  const std::string name_;
  std::shared_ptr<AllReduceOp> op_;
};

}  // namespace

AsyncThunks LowerAsyncAllReduce(const ir::Node& n, LowerContext&) {
  auto op = std::make_shared<AllReduceOp>(n);
  return {std::make_unique<AllReduceStartThunk>(n, op),
          std::make_unique<AllReduceWaitThunk>(n, op)};
}

}  // namespace kiln::runtime::cpu
