#include "kiln/compiler/passes/float_normalization.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/compiler/graph_editor.h"
#include "kiln/ir/opcode.h"
#include "kiln/ir/shape_inference.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

constexpr DType kLow = DType::kBF16;
constexpr DType kHigh = DType::kF32;

ir::Type Widened(const ir::Type& t) { return t.dtype == kLow ? ir::Type{kHigh, t.shape} : t; }

// Most first; ties keep the map's opcode order.
std::vector<OpCount> Sorted(const std::map<Opcode, int>& counts) {
  std::vector<OpCount> out;
  for (const auto& [op, count] : counts) out.push_back({op, count});
  std::stable_sort(out.begin(), out.end(),
                   [](const OpCount& a, const OpCount& b) { return a.count > b.count; });
  return out;
}

class Rewriter {
 public:
  Rewriter(const ir::Graph& g, const std::function<bool(const ir::Node&)>& supports_bf16)
      : e_(g), supports_bf16_(supports_bf16) {}

  absl::StatusOr<bool> Run(ir::Graph& graph, std::map<Opcode, int>* counts) {
    for (const ir::Node& n : e_.source().nodes()) {
      if (!ReadsBf16(n) || supports_bf16_(n)) continue;
      std::optional<ir::AttrMap> attrs = F32Form(n);
      if (!attrs) continue;  // no f32 form (its dtype is not its operands'): left to the backend
      e_.set_position(n.id());
      KILN_RETURN_IF_ERROR(ComputeHigh(n, std::move(*attrs)));
      ++(*counts)[n.opcode()];
    }
    if (!e_.changed()) return false;
    KILN_ASSIGN_OR_RETURN(graph, std::move(e_).Build());
    return true;
  }

 private:
  // An op computing on a bf16 operand. Converts are the storage changes themselves.
  bool ReadsBf16(const ir::Node& n) const {
    if (n.opcode() == Opcode::kConvert) return false;
    for (int i = 0; i < static_cast<int>(n.operands().size()); ++i)
      if (e_.type(e_.operand(n.id(), i)).dtype == kLow) return true;
    return false;
  }

  // The attributes of n's f32 form, when its type on widened operands is its own type widened
  // (checked by shape inference before anything is added).
  std::optional<ir::AttrMap> F32Form(const ir::Node& n) const {
    std::vector<ir::Type> types;
    for (int i = 0; i < static_cast<int>(n.operands().size()); ++i)
      types.push_back(Widened(e_.type(e_.operand(n.id(), i))));
    ir::AttrMap attrs = n.attrs();
    attrs.erase(ir::kFusionAttr);  // not the group's member any more (the pass runs before fusion)
    attrs[kFloatNormalizedAttr] = std::string(DTypeName(kLow));
    absl::StatusOr<ir::Type> t = ir::InferType(n.opcode(), types, attrs, Widened(n.type()));
    if (!t.ok()) return std::nullopt;
    return attrs;
  }

  // The f32 copy of bf16 value `id` (resolved) for the op being rewritten: one convert per value
  // and reader. Not shared between readers: a copy shared by a forward op and its backward
  // reader would stay alive between them next to the bf16 value (more memory than f32 itself);
  // a copy per reader lives from just before it to it.
  absl::StatusOr<int> HighOf(int id) {
    auto it = high_.find(id);
    if (it != high_.end()) return it->second;
    KILN_ASSIGN_OR_RETURN(int c,
                          e_.Add(Opcode::kConvert, {id}, {}, ir::Type{kHigh, e_.type(id).shape}));
    high_.emplace(id, c);
    return c;
  }

  // Recomputes `n` on f32 copies of its bf16 operands and replaces it by the bf16 down-convert of
  // the result (or the result itself when it is not bf16: a compare's predicate).
  absl::Status ComputeHigh(const ir::Node& n, ir::AttrMap attrs) {
    high_.clear();
    std::vector<int> operands;
    for (int i = 0; i < static_cast<int>(n.operands().size()); ++i) {
      int o = e_.operand(n.id(), i);
      if (e_.type(o).dtype == kLow) {
        KILN_ASSIGN_OR_RETURN(o, HighOf(o));
      }
      operands.push_back(o);
    }
    KILN_ASSIGN_OR_RETURN(
        int high, e_.Add(n.opcode(), std::move(operands), std::move(attrs), Widened(n.type())));
    if (n.type().dtype != kLow) return e_.Replace(n.id(), high);
    KILN_ASSIGN_OR_RETURN(int low, e_.Add(Opcode::kConvert, {high}, {}, n.type()));
    return e_.Replace(n.id(), low);
  }

  GraphEditor e_;
  const std::function<bool(const ir::Node&)>& supports_bf16_;
  std::unordered_map<int, int> high_;  // bf16 value -> its f32 convert, for the current reader
};

}  // namespace

std::vector<OpCount> FloatNormalizedOps(const ir::Graph& graph) {
  std::map<Opcode, int> counts;
  for (const ir::Node& n : graph.nodes())
    if (n.has_attr(kFloatNormalizedAttr)) ++counts[n.opcode()];
  return Sorted(counts);
}

std::string DescribeOpCounts(const std::vector<OpCount>& ops) {
  std::string out;
  for (const OpCount& c : ops)
    absl::StrAppend(&out, out.empty() ? "" : ", ", c.count, " ",
                    std::string(ir::OpcodeName(c.opcode)));
  return out;
}

std::string F32ComputeNote(const std::vector<OpCount>& ops, const std::string& why) {
  std::string out = absl::StrCat(DescribeOpCounts(ops), " compute in f32 with bf16 storage");
  if (!why.empty()) absl::StrAppend(&out, ": ", why);
  return out;
}

absl::StatusOr<bool> FloatNormalizationPass::Run(ir::Graph& graph) {
  last_changes_.clear();
  if (!supports_bf16_) return false;
  std::map<Opcode, int> counts;
  Rewriter r(graph, supports_bf16_);
  KILN_ASSIGN_OR_RETURN(bool changed, r.Run(graph, &counts));
  last_changes_ = Sorted(counts);
  return changed;
}

}  // namespace kiln::compiler
