#include "kiln/compiler/passes/mixed_precision.h"

#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

constexpr DType kLow = DType::kBF16;
constexpr DType kHigh = DType::kF32;

bool IsContraction(Opcode op) {
  return op == Opcode::kDotGeneral || op == Opcode::kConv2d || op == Opcode::kConv2dBackwardInput ||
         op == Opcode::kConv2dBackwardFilter;
}

// Single-operand ops that only move data: computing them on the bf16 value is exact.
bool IsDataMovement(Opcode op) {
  return op == Opcode::kReshape || op == Opcode::kTranspose || op == Opcode::kBroadcastInDim ||
         op == Opcode::kSlice;
}

class Rewriter {
 public:
  Rewriter(const ir::Graph& g, PrecisionPolicy policy) : e_(g), policy_(policy) {}

  absl::StatusOr<bool> Run(ir::Graph& graph) {
    for (const ir::Node& n : e_.source().nodes()) {
      if (n.type().dtype != kHigh) continue;
      e_.set_position(n.id());
      const Opcode op = n.opcode();
      if (IsContraction(op)) {
        // ---- dot_general ----
        // ---- conv2d ----
        // ---- conv2d_backward_input ----
        // ---- conv2d_backward_filter ----
        if (!AllOperandsHigh(n)) continue;
        KILN_RETURN_IF_ERROR(ComputeLow(n));
      } else if (policy_ == PrecisionPolicy::kBf16 &&
                 ir::OpcodeKind(op) == ir::OpKind::kElementwise && op != Opcode::kConvert &&
                 n.type().shape.rank() > 0) {
        // ---- elementwise (bf16 policy) ----
        KILN_RETURN_IF_ERROR(ComputeLow(n));
      } else if (IsDataMovement(op)) {
        // ---- reshape ----
        // ---- transpose ----
        // ---- broadcast_in_dim ----
        // ---- slice ----
        if (!IsUpConvert(e_.operand(n.id(), 0))) continue;
        KILN_RETURN_IF_ERROR(ComputeLow(n));
      }
    }
    if (!e_.changed()) return false;
    KILN_ASSIGN_OR_RETURN(graph, std::move(e_).Build());
    return true;
  }

 private:
  bool AllOperandsHigh(const ir::Node& n) const {
    for (int i = 0; i < static_cast<int>(n.operands().size()); ++i) {
      if (e_.type(e_.operand(n.id(), i)).dtype != kHigh) return false;
    }
    return true;
  }

  // convert(y) with y bf16 and the result f32: its bf16 copy is y itself.
  bool IsUpConvert(int id) const {
    const ir::Node& n = e_.node(id);
    return n.opcode() == Opcode::kConvert && n.type().dtype == kHigh &&
           e_.type(e_.operand(id, 0)).dtype == kLow;
  }

  // The bf16 copy of f32 value `id` (resolved): one convert per value.
  absl::StatusOr<int> LowOf(int id) {
    if (IsUpConvert(id)) return e_.operand(id, 0);
    auto it = low_.find(id);
    if (it != low_.end()) return it->second;
    KILN_ASSIGN_OR_RETURN(int c,
                          e_.Add(Opcode::kConvert, {id}, {}, ir::Type{kLow, e_.type(id).shape}));
    low_.emplace(id, c);
    return c;
  }

  // Recomputes `n` on bf16 copies of its f32 operands and replaces it by the f32 up-convert of
  // the result (dropped by Build when every reader is itself rewritten to bf16).
  absl::Status ComputeLow(const ir::Node& n) {
    std::vector<int> operands;
    for (int i = 0; i < static_cast<int>(n.operands().size()); ++i) {
      int o = e_.operand(n.id(), i);
      if (e_.type(o).dtype == kHigh) {
        KILN_ASSIGN_OR_RETURN(o, LowOf(o));
      }
      operands.push_back(o);
    }
    KILN_ASSIGN_OR_RETURN(int low, e_.Add(n.opcode(), std::move(operands), n.attrs()));
    if (e_.type(low).dtype != kLow) {
      return absl::InternalError(std::string("mixed-precision: ") +
                                 std::string(ir::OpcodeName(n.opcode())) +
                                 " on bf16 operands gave " + e_.type(low).ToString());
    }
    KILN_ASSIGN_OR_RETURN(int up, e_.Add(Opcode::kConvert, {low}, {}, n.type()));
    return e_.Replace(n.id(), up);
  }

  GraphEditor e_;
  PrecisionPolicy policy_;
  std::unordered_map<int, int> low_;  // f32 value -> its bf16 convert
};

}  // namespace

absl::StatusOr<PrecisionPolicy> ParsePrecisionPolicy(const std::string& name) {
  if (name == "f32") return PrecisionPolicy::kF32;
  if (name == "mixed_bf16") return PrecisionPolicy::kMixedBf16;
  if (name == "bf16") return PrecisionPolicy::kBf16;
  return absl::InvalidArgumentError("unknown precision policy '" + name +
                                    "' (allowed: f32, mixed_bf16, bf16)");
}

std::string PrecisionPolicyName(PrecisionPolicy policy) {
  switch (policy) {
    case PrecisionPolicy::kF32:
      return "f32";
    case PrecisionPolicy::kMixedBf16:
      return "mixed_bf16";
    case PrecisionPolicy::kBf16:
      return "bf16";
  }
  return "f32";
}

absl::StatusOr<bool> MixedPrecisionPass::Run(ir::Graph& graph) {
  if (policy_ == PrecisionPolicy::kF32) return false;
  for (const std::string& name : master_weights_) {
    const int id = graph.FindParameter(name);
    if (id < 0) continue;
    const DType dtype = graph.node(id).type().dtype;
    if (dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("precision ", PrecisionPolicyName(policy_),
                                                     " keeps f32 master weights, but parameter '",
                                                     name, "' is ", std::string(DTypeName(dtype)),
                                                     " (use precision f32 for a non-f32 model)"));
    }
  }
  Rewriter r(graph, policy_);
  return r.Run(graph);
}

}  // namespace kiln::compiler
