// The IR: a Graph is one static-shape SSA function. Nodes are stored in a topological order
// (every operand precedes its user); a node's id is its index in that order.
//
//   Graph g = ...;                       // usually from Builder::Build() or ParseGraph()
//   for (const Node& n : g.nodes())
//     printf("%%%d = %s : %s\n", n.id(), OpcodeName(n.opcode()).data(),
//     n.type().ToString().c_str());
//   g.outputs()[0].name;                 // outputs are bound by name
//
// Attributes live in a sorted map so printing is deterministic; opcodes.def lists the attributes
// each op carries. Typed getters abort on a missing attribute (a verifier failure upstream).
//
// Fused kernels are typed: the graph holds a table of fusion groups (an id and a kind each), and a
// member node carries the integer attribute `fusion` (kFusionAttr) naming its group. Members of a
// group are consecutive nodes; the verifier checks that and that the kind fits the members.
//
//   g.AddFusionGroup({0, FusionKind::kMatmulEpilogue});   // then members get {fusion=0}
//   for (int m : g.FusionMembers(0)) ...                  // in node order
#ifndef KILN_IR_GRAPH_H_
#define KILN_IR_GRAPH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/ir/opcode.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/shape.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ir {

struct Type {
  DType dtype = DType::kF32;
  Shape shape;

  std::string ToString() const { return std::string(DTypeName(dtype)) + shape.ToString(); }
  int64_t byte_size() const { return shape.num_elements() * DTypeSize(dtype); }
  bool operator==(const Type& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const Type& o) const { return !(*this == o); }
};

// int64 | float (double) | string | list of int64.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;
using AttrMap = std::map<std::string, AttrValue>;

class Node {
 public:
  Node(int id, Opcode opcode, std::vector<int> operands, Type type, AttrMap attrs,
       std::shared_ptr<const Tensor> literal = nullptr)
      : id_(id),
        opcode_(opcode),
        operands_(std::move(operands)),
        type_(std::move(type)),
        attrs_(std::move(attrs)),
        literal_(std::move(literal)) {}

  int id() const { return id_; }
  Opcode opcode() const { return opcode_; }
  const std::vector<int>& operands() const { return operands_; }
  int operand(int i) const { return operands_[i]; }
  const Type& type() const { return type_; }
  const AttrMap& attrs() const { return attrs_; }
  // The value of a constant node; null for every other op.
  const Tensor* literal() const { return literal_.get(); }
  const std::shared_ptr<const Tensor>& shared_literal() const { return literal_; }

  bool has_attr(const std::string& name) const { return attrs_.count(name) > 0; }
  int64_t attr_int(const std::string& name) const;
  double attr_float(const std::string& name) const;  // accepts an int attribute too
  const std::string& attr_str(const std::string& name) const;
  const std::vector<int64_t>& attr_ints(const std::string& name) const;

 private:
  int id_;
  Opcode opcode_;
  std::vector<int> operands_;
  Type type_;
  AttrMap attrs_;
  std::shared_ptr<const Tensor> literal_;
};

struct Output {
  std::string name;
  int node;
  // Input-output donation (XLA's input_output_alias, JAX's donate_argnums): the `index` of a
  // parameter of the same type whose buffer the caller may pass as this output's tensor, so the
  // value is computed in place over the input (a training step's parameter update); -1: none.
  // Printed `name=%v in_place_of %p`. Whether a compiled program really writes in place, rather
  // than computing elsewhere and copying over the input at the end, is the execution plan's call
  // (compiler/execution_plan.h: ExecutionPlan::in_place_outputs).
  int64_t in_place_of = -1;
};

// The attribute a fusion group member carries: the id of its group in Graph::fusion_groups().
inline constexpr char kFusionAttr[] = "fusion";

// What a fusion group runs as (one kernel each).
enum class FusionKind {
  kLoop,            // cheap elementwise ops of one shape, one pass over memory
  kReduction,       // a loop group with reduce_sum sinks accumulated in the same pass
  kMatmulEpilogue,  // dot_general + [bias add] [activation] [residual add]: one matmul, post-ops
  kConvEpilogue,    // conv2d + [bias add] [activation]: one convolution with post-ops
};

// "loop", "reduction", "matmul_epilogue", "conv_epilogue" (the IR text spelling).
std::string_view FusionKindName(FusionKind kind);
// The kind spelled `name`, or false.
bool ParseFusionKind(std::string_view name, FusionKind* kind);

struct FusionGroup {
  int64_t id = 0;
  FusionKind kind = FusionKind::kLoop;
  bool operator==(const FusionGroup& o) const { return id == o.id && kind == o.kind; }
};

class Graph {
 public:
  Graph() = default;
  explicit Graph(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_[id]; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const std::vector<Output>& outputs() const { return outputs_; }

  // Parameter node ids ordered by their `index` attribute.
  std::vector<int> parameters() const;
  // Id of the parameter called `name`, or -1.
  int FindParameter(const std::string& name) const;
  // Id of the parameter whose `index` attribute is `index`, or -1.
  int ParameterWithIndex(int64_t index) const;
  // Index into outputs() of the output called `name`, or -1.
  int FindOutput(const std::string& name) const;

  // Low-level mutation, used by Builder, the parser and passes. AddNode does not check types:
  // run Verify() (verifier.h) on graphs assembled by hand.
  int AddNode(Opcode opcode, std::vector<int> operands, Type type, AttrMap attrs,
              std::shared_ptr<const Tensor> literal = nullptr) {
    int id = num_nodes();
    nodes_.emplace_back(id, opcode, std::move(operands), std::move(type), std::move(attrs),
                        std::move(literal));
    return id;
  }
  void AddOutput(std::string name, int node, int64_t in_place_of = -1) {
    outputs_.push_back({std::move(name), node, in_place_of});
  }
  void ClearOutputs() { outputs_.clear(); }
  void SetOutputInPlaceOf(size_t output, int64_t parameter_index) {
    outputs_[output].in_place_of = parameter_index;
  }

  // Fusion groups, sorted by id (ids need not be dense). Membership is the `fusion` attribute of
  // the member nodes; copies of the graph keep both.
  const std::vector<FusionGroup>& fusion_groups() const { return fusion_groups_; }
  // The group with id `id`, or null.
  const FusionGroup* FindFusionGroup(int64_t id) const;
  // Adds (or replaces the kind of) group `group.id`.
  void AddFusionGroup(FusionGroup group);
  void set_fusion_groups(std::vector<FusionGroup> groups);
  void ClearFusionGroups() { fusion_groups_.clear(); }
  // The group node `id` is a member of (its integer `fusion` attribute), or -1.
  int64_t FusionGroupOf(int id) const;
  // Ids of the members of group `group`, in node order.
  std::vector<int> FusionMembers(int64_t group) const;
  // Members of every group at once: group id -> member ids in node order (groups with no member
  // are absent; ids a node names without a table entry are present, for the verifier to report).
  std::map<int64_t, std::vector<int>> FusionMembersByGroup() const;

 private:
  std::string name_ = "main";
  std::vector<Node> nodes_;
  std::vector<Output> outputs_;
  std::vector<FusionGroup> fusion_groups_;
};

// The id a node's `fusion` attribute names, or -1 (no attribute, or not an integer).
int64_t FusionAttrOf(const Node& node);

}  // namespace kiln::ir

#endif  // KILN_IR_GRAPH_H_
