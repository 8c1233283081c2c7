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
#ifndef KILN_IR_GRAPH_H_
#define KILN_IR_GRAPH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
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
  void AddOutput(std::string name, int node) { outputs_.push_back({std::move(name), node}); }
  void ClearOutputs() { outputs_.clear(); }

 private:
  std::string name_ = "main";
  std::vector<Node> nodes_;
  std::vector<Output> outputs_;
};

}  // namespace kiln::ir

#endif  // KILN_IR_GRAPH_H_
