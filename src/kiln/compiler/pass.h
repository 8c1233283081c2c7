// The shape of a compiler pass: a small class with a name and a Run that rewrites a graph in
// place and says whether it changed anything. Pipelines (pipeline.h) run passes in order, verify
// the graph after each, can disable any of them by name, and dump the IR around each.
//
//   class MyPass : public Pass {
//    public:
//     std::string name() const override { return "my-pass"; }
//     absl::StatusOr<bool> Run(ir::Graph& graph) override;
//   };
//
// Conventions every pass follows (see passes/*.h):
// - its header comment says what it rewrites, what it leaves alone, and its cost;
// - Run is idempotent: a second Run on its own output returns false;
// - it keeps parameter names and indices and output names and order; when it rewrites, node ids
//   come out renumbered compactly in a topological order (GraphEditor::Build does this);
// - on error the graph is left unchanged.
// Names are lowercase words joined by '-', unique within a pipeline (they are the handles for
// KILN_DISABLE_PASSES and the dump file names).
#ifndef KILN_COMPILER_PASS_H_
#define KILN_COMPILER_PASS_H_

#include <string>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::compiler {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  // Rewrites `graph`; returns true when it changed. On error `graph` is left unchanged.
  virtual absl::StatusOr<bool> Run(ir::Graph& graph) = 0;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_PASS_H_
