// GraphEditor: the rewrite helper every simplification pass uses. A pass walks the source graph
// in order, adds replacement nodes and redirects uses ("replace all uses of %5 by %9"); Build()
// then produces a fresh graph with the uses resolved, the nodes the rewrite made dead removed, and
// ids renumbered compactly in a topological order that keeps the source order.
//
//   GraphEditor e(graph);
//   for (const ir::Node& n : graph.nodes()) {
//     e.set_position(n.id());                      // new nodes go just before %n
//     if (n.opcode() == ir::Opcode::kNeg && e.operand_node(n.id(), 0).opcode() == ir::Opcode::kNeg)
//       KILN_RETURN_IF_ERROR(e.Replace(n.id(), e.operand(e.operand(n.id(), 0), 0)));
//   }
//   if (!e.changed()) return false;
//   KILN_ASSIGN_OR_RETURN(graph, std::move(e).Build());
//   return true;
//
// Contract of Build():
// - parameters always stay, with their names and indices; outputs keep their names and order;
// - a node is dropped when it was replaced, or when it was live before (reachable from an output)
//   and is not any more; dead code that was already dead is left alone (that is DCE's job), so a
//   pass only removes what its own rewrite orphaned, as XLA's ReplaceInstruction does;
// - the order is the source order with each added node placed just before the source node that
//   was the position when it was added (Kahn's algorithm keeps it topological in any case);
// - the fusion group table is the source's (or set_fusion_groups'); a group the rewrite left with
//   no members, or broke (no longer consecutive, or members its kind does not run:
//   ir::FusionGroupProblem), is dissolved: its members lose their `fusion` attribute.
// Cost: O(n log n) in the number of nodes; literals are shared, not copied.
//
// Passes that rebuild a whole graph (fusion, schedule, remat, dce) use the controls below: an
// explicit order (set_order), which dead code to keep (set_dead_code), per-use operand edits
// (SetOperand), attribute edits (SetAttrs), copies of existing nodes (AddCopy) and a new fusion
// group table.
#ifndef KILN_COMPILER_GRAPH_EDITOR_H_
#define KILN_COMPILER_GRAPH_EDITOR_H_

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"
#include "kiln/tensor/tensor.h"

namespace kiln::compiler {

class GraphEditor {
 public:
  // `source` must outlive the editor and stay unchanged until Build() returns.
  explicit GraphEditor(const ir::Graph& source);

  // What Build keeps besides what the outputs reach and the parameters.
  enum class DeadCode {
    kDropOrphaned,  // source nodes that were dead already (the default: see the contract)
    kKeep,          // every source node, reachable or not, and every added node
    kDrop,          // nothing else: dead code elimination
  };
  void set_dead_code(DeadCode mode) { dead_code_ = mode; }
  // Build emits exactly the nodes of `order` (source and added ids, each once, every operand
  // before its user), in that order; otherwise InvalidArgument. Replacements still apply.
  void set_order(std::vector<int> order) { order_ = std::move(order); }
  // The fusion group table of the built graph (default: the source's).
  void set_fusion_groups(std::vector<ir::FusionGroup> groups) { groups_ = std::move(groups); }

  const ir::Graph& source() const { return source_; }
  // Source nodes have ids 0..source().num_nodes()-1; added nodes follow.
  int num_nodes() const { return source_.num_nodes() + static_cast<int>(added_.size()); }
  // The node as stored (operands not resolved: use operand()).
  const ir::Node& node(int id) const;
  const ir::Type& type(int id) const { return node(id).type(); }
  // The node that now stands for `id` after the replacements made so far.
  int Resolve(int id) const;
  // Operand i of node `id`, resolved.
  int operand(int id, int i) const { return Resolve(operands_of(id)[i]); }
  const ir::Node& operand_node(int id, int i) const { return node(operand(id, i)); }

  // Nodes added from now on are placed just before source node `source_id` (or at the end when
  // it is -1, the default).
  void set_position(int source_id) { position_ = source_id; }

  // Adds a node over (resolved or not) operand ids; its type is inferred (ir::InferType), or
  // `declared` for the ops whose type is declared. Errors are the shape-inference errors.
  absl::StatusOr<int> Add(ir::Opcode op, std::vector<int> operands, ir::AttrMap attrs = {},
                          std::optional<ir::Type> declared = std::nullopt);
  int AddConstant(Tensor literal);
  // A node like `like` (its opcode, type and literal) over `operands` with `attrs`: no inference.
  int AddCopy(const ir::Node& like, std::vector<int> operands, ir::AttrMap attrs);
  // A constant scalar `value` broadcast to `type` (just the scalar when `type` is rank 0).
  absl::StatusOr<int> AddSplat(double value, const ir::Type& type);

  // Every use of `id` (operands and outputs) now reads `by`. Errors: different types, a parameter
  // as `id`, or a replacement that would make `id` stand for itself.
  absl::Status Replace(int id, int by);
  // Only operand `i` of node `id` now reads `by` (types must match).
  absl::Status SetOperand(int id, int i, int by);
  // Node `id` is built with `attrs` instead of its own.
  void SetAttrs(int id, ir::AttrMap attrs);
  // Operands and attributes of `id` with the edits above (operands not resolved).
  const std::vector<int>& operands_of(int id) const;
  const ir::AttrMap& attrs_of(int id) const;

  // True once any Replace or SetOperand succeeded.
  bool changed() const { return changed_; }

  // The rewritten graph (see the contract above). Internal error if the replacements made a
  // cycle (a node replaced by something that uses it). The editor must not be used afterwards.
  absl::StatusOr<ir::Graph> Build() &&;

 private:
  std::vector<char> KeepSet(int n) const;
  absl::StatusOr<std::vector<int>> KahnOrder(const std::vector<char>& keep) const;
  absl::Status CheckOrder(const std::vector<int>& order) const;
  ir::Graph Emit(const std::vector<int>& order, const std::set<int64_t>& dissolve) const;

  const ir::Graph& source_;
  std::deque<ir::Node> added_;       // deque: node() references stay valid while adding
  std::vector<int> added_position_;  // per added node: the source id it goes before, or -1
  std::vector<int> forward_;         // per node: its replacement, or -1
  std::map<int, std::vector<int>> operand_edits_;
  std::map<int, ir::AttrMap> attr_edits_;
  std::optional<std::vector<int>> order_;
  std::optional<std::vector<ir::FusionGroup>> groups_;
  DeadCode dead_code_ = DeadCode::kDropOrphaned;
  int position_ = -1;
  bool changed_ = false;
};

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_GRAPH_EDITOR_H_
