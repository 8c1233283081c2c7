// The shape of a compiler pass: a small class with a name and a Run that rewrites a graph in
// place and says whether it changed anything. Pipelines run passes by name, can disable any of
// them, and dump the IR around each.
//
//   class MyPass : public Pass {
//    public:
//     std::string name() const override { return "my-pass"; }
//     absl::StatusOr<bool> Run(ir::Graph& graph) override;
//   };
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
