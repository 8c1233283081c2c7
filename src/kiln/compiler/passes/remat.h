// Rematerialization ("remat", opt-in): trades recomputation for memory on a differentiated graph.
// A cheap value made in the forward part and read again only much later (by the backward) is
// recomputed next to its late readers instead of being kept alive in between.
//
//   %h = dot_general(%x, %w)                  %h = dot_general(%x, %w)
//   %a = relu(%h)                             %a = relu(%h)
//   %y = dot_general(%a, %v)                  %y = dot_general(%a, %v)
//   ... many steps, %h still live ...   ->    ...                        # %a no longer live here
//   %g = dot_general(%a, %dy)                 %a2 = relu(%h)
//                                             %g = dot_general(%a2, %dy)
//
// Candidates: elementwise ops and broadcast_in_dim (cheap, memory-bound work) that are not graph
// outputs and whose readers split into early ones and late ones separated by at least `min_gap`
// steps. The late readers get a copy of the value computed just before the first of them; the copy
// reads the same operands, and an operand that would otherwise have died earlier is either
// recomputed too (when it is cheap as well, up to `max_chain` ops deep) or kept alive longer.
// Contractions (dot_general, convolutions), reductions, data movement, composites, sources and
// collectives are never recomputed: their outputs are what the policy keeps.
//
// Each candidate is scored on the live-bytes model of schedule.h (LiveIntervals): the bytes freed
// between the early and the late readers against the operand lifetimes it extends and the copies
// it briefly adds.
// - Policy mode (always): applies, best first, every candidate that frees more byte-steps than it
//   adds and does not raise the peak; re-scores after each.
// - Memory-limit mode (memory_limit_bytes > 0): then, while `measure(graph)` exceeds the limit,
//   applies the candidate that lowers the peak the most, even at a cost in byte-steps, until the
//   graph fits or no candidate lowers the peak. last_report() says what it achieved.
// The pass first puts the graph in the memory schedule (schedule.h) so it scores the order the
// backend will run; copies carry no `fusion` attribute (they run as single kernels). Recomputed
// values are bit-identical to the originals (same ops on the same inputs), so results do not
// change. When the final peak is not lower than the input's, the graph is left unchanged.
// Cost: O(c * n) per applied candidate (c candidates, n nodes), plus one `measure` per step in
// memory-limit mode.
#ifndef KILN_COMPILER_PASSES_REMAT_H_
#define KILN_COMPILER_PASSES_REMAT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "kiln/compiler/execution_plan.h"
#include "kiln/compiler/pass.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

struct RematOptions {
  // Run the pass in compiler::DefaultPipeline (CompileOptions::remat); off by default.
  bool enabled = false;
  // > 0: recompute until the graph needs at most this many bytes (memory-limit mode).
  int64_t memory_limit_bytes = 0;
  // Readers at least this many steps after the previous use are "late".
  int min_gap = 8;
  // How many cheap operands deep a copy may recompute.
  int max_chain = 4;
  // At most this many values are recomputed.
  int max_recomputed = 1000;
  // The bytes a graph needs, for memory-limit mode: e.g. the backend's planned arena. Null: the
  // peak of schedule.h's live-bytes model (PeakLiveBytes).
  std::function<int64_t(const ir::Graph&)> measure;
};

struct RematReport {
  int recomputed = 0;              // values given a late copy
  int added_nodes = 0;             // copies made (a value and its recomputed operands)
  int64_t peak_before = 0;         // PeakLiveBytes of the scheduled input
  int64_t peak_after = 0;          // ... of the result
  int64_t measured_before = 0;     // measure() of the input (memory-limit mode; else the peak)
  int64_t measured_after = 0;      // measure() of the result
  int64_t memory_limit_bytes = 0;  // 0: policy mode only
  bool fits = true;                // measured_after <= memory_limit_bytes (or no limit)
  // "remat: 6 values recomputed (+9 nodes); peak 72.1 MiB -> 60.2 MiB; limit 64.0 MiB: fits"
  std::string ToString() const;
};

class RematPass : public Pass {
 public:
  // `traits`: the backend's (compiler/execution_plan.h), for the memory model of schedule.h.
  explicit RematPass(RematOptions options = {}, BackendTraits traits = PlainTraits())
      : options_(std::move(options)), traits_(std::move(traits)) {}
  std::string name() const override { return "remat"; }
  absl::StatusOr<bool> Run(ir::Graph& graph) override;
  const RematReport& last_report() const { return report_; }

 private:
  RematOptions options_;
  BackendTraits traits_;
  RematReport report_;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASSES_REMAT_H_
