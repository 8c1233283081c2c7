// Pipeline: runs passes in order, some of them grouped and repeated to a fixed point, with the
// checks and debugging hooks DESIGN.md §2 promises:
// - the input graph is verified; with `verify_each_pass` ir::Verify runs after every pass and a
//   pass that leaves an invalid graph is an Internal error naming it;
// - any pass or group can be disabled by name (`disabled_passes`); an unknown name is an error
//   listing the known ones;
// - with `dump_dir` the IR text (ir::PrintGraph, parseable: the header is a
//   comment) is written before and after every pass and group. Each Run that dumps gets its own
//   folder, dir/<NNNN>-<graph name>/, numbered in the order graphs are compiled in this process
//   and never reusing an existing folder (so several graphs, or a rerun, never overwrite each
//   other's dumps); inside it dumps are 000-before-simplify.ir, 001-before-simplify.algebraic.ir,
//   ... numbered in run order. A dump that cannot be written is logged (KILN_LOG) and reported in
//   dump_status(), never fatal.
// The pipeline reads no environment: the kiln CLI reads KILN_DISABLE_PASSES, KILN_DUMP_IR and
// KILN_VERIFY_EACH_PASS once into these options (ApplyPipelineVariables, compile.h).
//
//   Pipeline p("optimize", options);
//   p.Add<DecomposePass>();
//   p.AddFixedPointGroup("simplify", MakePasses<AlgebraicSimplifierPass, CsePass, DcePass>());
//   KILN_ASSIGN_OR_RETURN(bool changed, p.Run(graph));
//   for (const PassRecord& r : p.last_run()) ...        // what ran, what changed, how long
//
// The pipeline works on a copy and assigns it back only on success, so on error `graph` is
// unchanged. A Pipeline is itself a Pass (nested pipelines run as one opaque pass).
#ifndef KILN_COMPILER_PIPELINE_H_
#define KILN_COMPILER_PIPELINE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/base/env.h"
#include "kiln/compiler/pass.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

#ifdef NDEBUG
inline constexpr bool kVerifyEachPassByDefault = false;
#else
inline constexpr bool kVerifyEachPassByDefault = true;
#endif

struct PipelineOptions {
  // ir::Verify after every pass. Default: on in debug builds (the CLI's KILN_VERIFY_EACH_PASS=1
  // or 0 sets it); tests turn it on.
  bool verify_each_pass = kVerifyEachPassByDefault;
  // Names of passes or groups to skip. An unknown name is an InvalidArgument error (a typo would
  // otherwise silently run the pass): it must be one of this pipeline's passes or of
  // `optional_pass_names`.
  std::vector<std::string> disabled_passes;
  // Further names disabled_passes may hold without being an error: one list (the CLI's
  // KILN_DISABLE_PASSES) serves every pipeline of a process, so DefaultPipeline lists the passes
  // of all its configurations (disabling fusion is fine for a pipeline built without fusion).
  std::vector<std::string> optional_pass_names;
  // Folder for IR dumps (created if missing); empty: no dumps.
  std::string dump_dir;
  // Where dumps go; null means Env::Default().
  Env* env = nullptr;
  // A fixed-point group stops after this many rounds even if it still changes the graph (with a
  // logged warning: a pass pair that undoes each other's work is a bug).
  int max_fixed_point_rounds = 16;
};

// One entry per pass or group considered during the last Run.
struct PassRecord {
  std::string name;      // "decompose", "simplify" (a whole group), "simplify/cse" (inside it)
  int round = 0;         // 1-based round inside a fixed-point group; 0 outside one
  bool skipped = false;  // disabled by name
  bool changed = false;
  int nodes_before = 0, nodes_after = 0;
  double seconds = 0;
};

class Pipeline : public Pass {
 public:
  explicit Pipeline(std::string name, PipelineOptions options = {});

  std::string name() const override { return name_; }
  const PipelineOptions& options() const { return options_; }

  Pipeline& AddPass(std::unique_ptr<Pass> pass);
  template <typename P, typename... Args>
  P& Add(Args&&... args) {
    auto pass = std::make_unique<P>(std::forward<Args>(args)...);
    P& ref = *pass;
    AddPass(std::move(pass));
    return ref;
  }
  // A group run in order, round after round, until a whole round changes nothing.
  Pipeline& AddFixedPointGroup(std::string name, std::vector<std::unique_ptr<Pass>> passes);

  absl::StatusOr<bool> Run(ir::Graph& graph) override;

  // The check Run starts with: every name in disabled_passes is a pass of this pipeline or one of
  // optional_pass_names. InvalidArgument naming the bad name and the known names. For callers
  // that may skip Run (the compile cache).
  absl::Status CheckDisabledPasses() const;

  // Every pass and group name, in order ("simplify", then the passes inside it).
  std::vector<std::string> PassNames() const;
  const std::vector<PassRecord>& last_run() const { return records_; }
  // The first dump error of the last Run; OK when all dumps were written (or none asked for).
  const absl::Status& dump_status() const { return dump_status_; }
  // The last run as a table: one line per pass with rounds, changes, nodes and time.
  std::string Summary() const;

 private:
  struct Entry {
    std::string group;                          // empty for a single pass
    std::vector<std::unique_ptr<Pass>> passes;  // one, or the group's
  };
  struct RunState;

  absl::StatusOr<bool> RunPass(Pass& pass, const std::string& path, int round, RunState& st,
                               ir::Graph& graph);
  void Dump(const std::string& when, const std::string& path, int round, const ir::Graph& graph,
            RunState& st);

  std::string name_;
  PipelineOptions options_;
  std::vector<Entry> entries_;
  std::vector<PassRecord> records_;
  absl::Status dump_status_;
};

// Builds a vector of default-constructed passes, for AddFixedPointGroup.
template <typename... P>
std::vector<std::unique_ptr<Pass>> MakePasses() {
  std::vector<std::unique_ptr<Pass>> v;
  (v.push_back(std::make_unique<P>()), ...);
  return v;
}

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PIPELINE_H_
