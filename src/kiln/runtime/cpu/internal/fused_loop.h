// The cpu backend's fused elementwise kernel (fused_loop.cc): one thunk per loop fusion group
// (compiler/passes/fusion.h).
#ifndef KILN_RUNTIME_CPU_INTERNAL_FUSED_LOOP_H_
#define KILN_RUNTIME_CPU_INTERNAL_FUSED_LOOP_H_

#include <map>
#include <vector>

#include "kiln/runtime/cpu/internal/common.h"

namespace kiln::runtime::cpu {

// What each fused member's operands read: the operand itself, or (for a broadcast_in_dim the
// kernel absorbs) the broadcast's operand through a broadcasting view.
struct FusionReads {
  struct Read {
    int node = -1;
    const std::vector<int64_t>* broadcast_dims = nullptr;  // the broadcast's `dims`, or null
  };
  std::map<int, std::vector<Read>> by_member;
  const std::vector<Read>& at(int member) const { return by_member.at(member); }
};

// `members`: the group's nodes in order (contiguous ids, the last one is where the kernel runs);
// `needed[id]`: the member's value is read outside the group or is a graph output (stored).
LowerResult LowerFusedLoop(const std::vector<int>& members, const FusionReads& reads,
                           const std::vector<char>& needed, LowerContext& lc);

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_FUSED_LOOP_H_
