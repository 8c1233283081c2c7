// Float normalization ("float-normalization", as XLA's FloatNormalization): keeps bf16 storage
// but computes in f32 every op whose bf16 form the backend cannot run (BackendTraits::
// supports_bf16 says no): its bf16 operands are converted to f32, the op runs in f32, and its
// result is converted back to bf16, so every reader still sees the bf16 value it saw before.
//
//   %2 = convert(%0) : bf16[8,16]
//   %3 = convert(%1) : bf16[16,4]
//   %4 = dot_general(%2, %3) {...} : bf16[8,4]
//     -> (a backend without a bf16 matmul)
//   %2 = convert(%0) : bf16[8,16]
//   %3 = convert(%1) : bf16[16,4]
//   %4 = convert(%2) : f32[8,16]
//   %5 = convert(%3) : f32[16,4]
//   %6 = dot_general(%4, %5) {float_normalized="bf16", ...} : f32[8,4]
//   %7 = convert(%6) : bf16[8,4]
//
//   FloatNormalizationPass pass(traits.supports_bf16);
//   KILN_ASSIGN_OR_RETURN(bool changed, pass.Run(graph));
//   std::string ops = DescribeOpCounts(pass.last_changes());   // "38 dot_general, 4 conv2d"
//
// Semantics: the reference backend computes a bf16 op by widening its operands to f32, computing
// in f32 (contractions accumulate in f32) and rounding the result to bf16 once; the rewrite is
// that same math, so results stay what the reference gives. The converts pair with the mixed
// precision pass's (convert(convert(x: f32 -> bf16) -> f32) rounds x to bf16: it is kept) and the
// fusion pass runs them in the neighbouring loops.
//
// The rewritten node carries the string attribute float_normalized="bf16" (kFloatNormalizedAttr),
// so what ran in f32 can be read off any optimized graph, also one served from the compile cache
// (FloatNormalizedOps).
//
// What it rewrites: nodes with at least one bf16 operand that supports_bf16 refuses. What it
// leaves alone: everything when supports_bf16 is null, converts, sources (parameter, constant,
// iota, random_bits: no bf16 operand), non-bf16 operands (indices, predicates) and non-float
// results (a compare's bool). A second run changes nothing (the rewritten node reads f32).
// Cost: one pass over the nodes; one convert per bf16 value each rewritten op reads (not shared
// between readers, so that only the bf16 value stays alive between a forward op and the backward
// op reading the same value; the schedule pass puts each copy just before its reader), and one per
// rewritten op's result.
#ifndef KILN_COMPILER_PASSES_FLOAT_NORMALIZATION_H_
#define KILN_COMPILER_PASSES_FLOAT_NORMALIZATION_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/compiler/pass.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

// The attribute of a node the pass computes in f32; its value is the storage type it kept.
inline constexpr char kFloatNormalizedAttr[] = "float_normalized";

// How many nodes of one opcode, for reports.
struct OpCount {
  ir::Opcode opcode;
  int count = 0;
  bool operator==(const OpCount& o) const { return opcode == o.opcode && count == o.count; }
};

// The nodes of `graph` carrying kFloatNormalizedAttr, counted per opcode, most first (ties in
// opcode order).
std::vector<OpCount> FloatNormalizedOps(const ir::Graph& graph);
// "38 dot_general, 4 conv2d"; empty for none.
std::string DescribeOpCounts(const std::vector<OpCount>& ops);
// The report line of `ops` (non-empty) with the backend's reason: "38 dot_general, 4 conv2d
// compute in f32 with bf16 storage: <why>" (": <why>" left out when `why` is empty).
std::string F32ComputeNote(const std::vector<OpCount>& ops, const std::string& why);

class FloatNormalizationPass : public Pass {
 public:
  // Null `supports_bf16`: every bf16 op runs as it is (the pass changes nothing).
  explicit FloatNormalizationPass(std::function<bool(const ir::Node&)> supports_bf16)
      : supports_bf16_(std::move(supports_bf16)) {}
  std::string name() const override { return "float-normalization"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;

  // What the last Run rewrote, per opcode (as FloatNormalizedOps counts them).
  const std::vector<OpCount>& last_changes() const { return last_changes_; }

 private:
  std::function<bool(const ir::Node&)> supports_bf16_;
  std::vector<OpCount> last_changes_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_FLOAT_NORMALIZATION_H_
