#include "kiln/compiler/passes/quantize_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

using ir::Opcode;

// The parameter name of node `id`, or "" when it is not a parameter.
std::string ParamName(const ir::Graph& g, int id) {
  const ir::Node& n = g.node(id);
  return n.opcode() == Opcode::kParameter ? n.attr_str("name") : std::string();
}

bool IsF32Weight(const ir::Graph& g, int id, const std::set<std::string>& weights, int rank) {
  const ir::Node& n = g.node(id);
  return n.opcode() == Opcode::kParameter && weights.count(n.attr_str("name")) &&
         n.type().dtype == DType::kF32 && n.type().shape.rank() == rank;
}

bool IsF32Activation(const ir::Graph& g, int id, const std::set<std::string>& weights) {
  return g.node(id).type().dtype == DType::kF32 && !weights.count(ParamName(g, id));
}

ir::AttrMap WithoutFusion(const ir::AttrMap& attrs) {
  ir::AttrMap a = attrs;
  a.erase("fusion");
  return a;
}

// Appends a copy of `n` (operands through `map`) to `g`; returns its id.
int CopyNode(const ir::Node& n, const std::vector<int>& map, ir::Graph& g) {
  std::vector<int> ops;
  for (int o : n.operands()) ops.push_back(map[o]);
  return g.AddNode(n.opcode(), std::move(ops), n.type(), WithoutFusion(n.attrs()),
                   n.shared_literal());
}

absl::StatusOr<int> AddInferred(ir::Graph& g, Opcode op, std::vector<int> operands,
                                ir::AttrMap attrs) {
  std::vector<ir::Type> types;
  for (int o : operands) types.push_back(g.node(o).type());
  KILN_ASSIGN_OR_RETURN(ir::Type t, ir::InferType(op, types, attrs));
  return g.AddNode(op, std::move(operands), std::move(t), std::move(attrs));
}

int8_t QuantizeValue(float x, float scale) {
  float q = x / scale;
  if (std::isnan(q)) return 0;
  return static_cast<int8_t>(std::nearbyint(std::fmin(std::fmax(q, -127.f), 127.f)));
}

}  // namespace

std::vector<Int8Site> FindInt8Sites(const ir::Graph& program,
                                    const std::set<std::string>& weights) {
  std::vector<Int8Site> sites;
  for (const ir::Node& n : program.nodes()) {
    Int8Site s;
    s.node = n.id();
    s.op = n.opcode();
    if (n.type().dtype != DType::kF32) continue;
    if (n.opcode() == Opcode::kDotGeneral) {
      const int x = n.operand(0), w = n.operand(1);
      const int xr = program.node(x).type().shape.rank();
      if (!n.attr_ints("lhs_batch").empty() || !n.attr_ints("rhs_batch").empty()) continue;
      if (!IsF32Weight(program, w, weights, 2) || !IsF32Activation(program, x, weights)) continue;
      if (n.attr_ints("lhs_contracting") != std::vector<int64_t>{xr - 1}) continue;
      const std::vector<int64_t>& rc = n.attr_ints("rhs_contracting");
      if (rc.size() != 1) continue;
      s.transposed = rc[0] == 1;
      s.activation = x;
      s.weight = ParamName(program, w);
    } else if (n.opcode() == Opcode::kConv2d) {
      const int x = n.operand(0), w = n.operand(1);
      if (!IsF32Weight(program, w, weights, 4) || !IsF32Activation(program, x, weights)) continue;
      s.activation = x;
      s.weight = ParamName(program, w);
    } else {
      continue;
    }
    sites.push_back(std::move(s));
  }
  return sites;
}

std::string CalibrationOutput(int k) { return absl::StrCat("__calibration_", k); }

absl::StatusOr<ir::Graph> CalibrationProgram(const ir::Graph& program,
                                             const std::vector<Int8Site>& sites) {
  ir::Graph g(program.name() + "_calibration");
  std::vector<int> map(program.num_nodes(), -1);
  for (const ir::Node& n : program.nodes()) map[n.id()] = CopyNode(n, map, g);
  for (const ir::Output& o : program.outputs()) g.AddOutput(o.name, map[o.node], o.in_place_of);
  for (size_t k = 0; k < sites.size(); ++k)
    g.AddOutput(CalibrationOutput(static_cast<int>(k)), map[sites[k].activation]);
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(g), "calibration program"));
  return g;
}

float SymmetricScale(double absmax) {
  if (!(absmax > 0) || !std::isfinite(absmax)) return 1.f;
  const float s = static_cast<float>(absmax / 127.0);
  return s > 0 ? s : 1.f;
}

absl::StatusOr<QuantizedWeight> QuantizeWeight(const Tensor& w, const Int8Site& site) {
  if (w.dtype() != DType::kF32)
    return absl::InvalidArgumentError(
        absl::StrCat("weight '", site.weight, "' is ", w.TypeString(), ", expected f32"));
  const Shape& s = w.shape();
  const float* v = w.data<float>();
  // Element (c, j) of channel c: its offset in w, and its offset in q.
  int64_t channels = 0, per = 0;
  std::function<int64_t(int64_t, int64_t)> at, out_at;
  Shape qshape;
  if (site.op == Opcode::kConv2d) {
    channels = s.dim(0);
    per = s.num_elements() / std::max<int64_t>(channels, 1);
    at = out_at = [per](int64_t c, int64_t j) { return c * per + j; };
    qshape = s;
  } else if (!site.transposed) {  // [K, N]
    channels = s.dim(1);
    per = s.dim(0);
    at = out_at = [channels](int64_t c, int64_t j) { return j * channels + c; };
    qshape = s;
  } else {  // [N, K] -> [K, N]
    channels = s.dim(0);
    per = s.dim(1);
    at = [per](int64_t c, int64_t j) { return c * per + j; };
    out_at = [channels](int64_t c, int64_t j) { return j * channels + c; };
    qshape = Shape{s.dim(1), s.dim(0)};
  }
  QuantizedWeight r;
  r.q = Tensor(DType::kS8, qshape);
  int8_t* q = r.q.data<int8_t>();
  for (int64_t c = 0; c < channels; ++c) {
    double absmax = 0;
    for (int64_t j = 0; j < per; ++j) {
      const float x = v[at(c, j)];
      if (!std::isfinite(x))
        return absl::InvalidArgumentError(
            absl::StrCat("weight '", site.weight, "' holds a non-finite value (channel ", c, ")"));
      absmax = std::max(absmax, std::fabs(static_cast<double>(x)));
    }
    const float scale = SymmetricScale(absmax);
    r.scales.push_back(scale);
    for (int64_t j = 0; j < per; ++j) {
      const float x = v[at(c, j)];
      const int8_t qv = QuantizeValue(x, scale);
      q[out_at(c, j)] = qv;
      r.max_abs_error = std::max(
          r.max_abs_error, std::fabs(static_cast<double>(x) - static_cast<double>(qv) * scale));
    }
  }
  return r;
}

absl::StatusOr<Int8Program> RewriteInt8(const ir::Graph& program,
                                        const std::map<std::string, Tensor>& weights,
                                        const std::vector<Int8Site>& sites,
                                        const std::vector<float>& activation_scales) {
  if (activation_scales.size() != sites.size())
    return absl::InvalidArgumentError("RewriteInt8: one activation scale per site expected");
  Int8Program out;
  std::map<int, int> site_of;  // source node -> site index
  for (size_t k = 0; k < sites.size(); ++k) site_of[sites[k].node] = static_cast<int>(k);
  // Parameters only sites read (through their weight operand) are dropped.
  std::vector<int> other_uses(program.num_nodes(), 0);
  for (const ir::Node& n : program.nodes())
    for (size_t i = 0; i < n.operands().size(); ++i)
      if (!(site_of.count(n.id()) && i == 1)) ++other_uses[n.operand(i)];
  for (const ir::Output& o : program.outputs()) ++other_uses[o.node];
  // New parameter indices: kept ones in index order, then the int8 weights and scales.
  std::map<int64_t, int64_t> new_index;
  int64_t next = 0;
  for (int p : program.parameters()) {
    if (other_uses[p] > 0) new_index[program.node(p).attr_int("index")] = next++;
  }
  ir::Graph g(program.name());
  std::vector<int> map(program.num_nodes(), -1);
  std::map<std::string, int> int8_param;  // weight name -> its s8 parameter in g
  for (const ir::Node& n : program.nodes()) {
    if (n.opcode() == Opcode::kParameter) {
      if (other_uses[n.id()] == 0) continue;
      ir::AttrMap a = n.attrs();
      a["index"] = new_index.at(n.attr_int("index"));
      map[n.id()] = g.AddNode(Opcode::kParameter, {}, n.type(), std::move(a));
      if (weights.count(n.attr_str("name")))
        out.weights[n.attr_str("name")] = weights.at(n.attr_str("name"));
      continue;
    }
    auto it = site_of.find(n.id());
    if (it == site_of.end()) {
      map[n.id()] = CopyNode(n, map, g);
      continue;
    }
    const Int8Site& site = sites[it->second];
    auto w = weights.find(site.weight);
    if (w == weights.end())
      return absl::InvalidArgumentError(absl::StrCat("no weight '", site.weight, "'"));
    KILN_ASSIGN_OR_RETURN(QuantizedWeight qw, QuantizeWeight(w->second, site));
    Int8Layer layer;
    layer.site = site;
    layer.activation_scale = activation_scales[it->second];
    layer.weight_scales = qw.scales;
    layer.weight_max_abs_error = qw.max_abs_error;
    layer.int8_weight = site.weight + ".int8";
    if (!int8_param.count(site.weight)) {
      int id = g.AddNode(Opcode::kParameter, {}, ir::Type{DType::kS8, qw.q.shape()},
                         {{"index", next++}, {"name", layer.int8_weight}});
      int8_param[site.weight] = id;
      out.weights[layer.int8_weight] = qw.q;
    }
    layer.scale_param = absl::StrCat(site.weight, ".scale");
    if (out.weights.count(layer.scale_param)) absl::StrAppend(&layer.scale_param, ".", site.node);
    Tensor scale(DType::kF32, Shape{static_cast<int64_t>(qw.scales.size())});
    for (size_t c = 0; c < qw.scales.size(); ++c)
      scale.data<float>()[c] = layer.activation_scale * qw.scales[c];
    const int scale_id = g.AddNode(Opcode::kParameter, {}, ir::Type{DType::kF32, scale.shape()},
                                   {{"index", next++}, {"name", layer.scale_param}});
    out.weights[layer.scale_param] = std::move(scale);
    KILN_ASSIGN_OR_RETURN(int xq,
                          AddInferred(g, Opcode::kQuantize, {map[site.activation]},
                                      {{"scale", static_cast<double>(layer.activation_scale)}}));
    ir::AttrMap attrs;
    if (site.op == Opcode::kConv2d) {
      for (const char* a : {"strides", "padding", "dilation", "groups"}) attrs[a] = n.attrs().at(a);
    }
    const Opcode op = site.op == Opcode::kConv2d ? Opcode::kQuantizedConv2d : Opcode::kQuantizedDot;
    KILN_ASSIGN_OR_RETURN(map[n.id()],
                          AddInferred(g, op, {xq, int8_param[site.weight], scale_id}, attrs));
    if (g.node(map[n.id()]).type() != n.type())
      return absl::InternalError(absl::StrCat("int8 rewrite of %", n.id(), " changed its type"));
    out.layers.push_back(std::move(layer));
  }
  for (const ir::Output& o : program.outputs()) {
    int64_t in_place = o.in_place_of;
    if (in_place >= 0) in_place = new_index.count(in_place) ? new_index.at(in_place) : -1;
    g.AddOutput(o.name, map[o.node], in_place);
  }
  KILN_RETURN_IF_ERROR(Annotate(ir::Verify(g), "int8 program"));
  out.program = std::move(g);
  return out;
}

absl::StatusOr<bool> QuantizeInt8Pass::Run(ir::Graph& graph) {
  std::set<std::string> names;
  for (const auto& [name, t] : weights_) names.insert(name);
  const std::vector<Int8Site> sites = FindInt8Sites(graph, names);
  if (sites.empty()) return false;
  KILN_ASSIGN_OR_RETURN(Int8Program q, RewriteInt8(graph, weights_, sites, activation_scales_));
  graph = q.program;
  result_ = std::move(q);
  return true;
}

}  // namespace kiln::compiler
