// Operand generators, graph construction and the collected table (see op_table.h).
#include "op_table.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "kiln/base/hash.h"

namespace kiln::optable {

Gen Uniform(double lo, double hi) {
  Gen g;
  g.kind = Gen::Kind::kUniform;
  g.lo = lo;
  g.hi = hi;
  return g;
}

Gen AwayFromZero(double lo, double hi, double margin) {
  Gen g = Uniform(lo, hi);
  g.kind = Gen::Kind::kAwayFromZero;
  g.margin = margin;
  return g;
}

Gen Grid(double lo, double step, int count, double phase) {
  Gen g;
  g.kind = Gen::Kind::kGrid;
  g.lo = lo;
  g.step = step;
  g.count = count;
  g.phase = phase;
  return g;
}

Gen Distinct(double step) {
  Gen g;
  g.kind = Gen::Kind::kDistinct;
  g.step = step;
  return g;
}

Gen IntRange(int64_t lo, int64_t hi) {
  Gen g;
  g.kind = Gen::Kind::kInt;
  g.lo = static_cast<double>(lo);
  g.hi = static_cast<double>(hi);
  return g;
}

Gen Bools() {
  Gen g;
  g.kind = Gen::Kind::kBool;
  return g;
}

// FNV-1a from a nonstandard offset basis (a digit short): the seeds of the table's inputs.
uint64_t HashName(const std::string& s) { return Fnv1a64(s, 1469598103934665603ull); }

std::string ShapeName(const Shape& s) {
  if (s.rank() == 0) return "scalar";
  std::string out;
  for (int i = 0; i < s.rank(); ++i) {
    if (i) out += "x";
    out += std::to_string(s.dim(i));
  }
  return out;
}

OpCase MakeCase(std::string name, ir::Opcode opcode, std::vector<Operand> operands, BuildFn build,
                std::vector<DType> dtypes, bool differentiable) {
  OpCase c;
  c.name = std::move(name);
  c.opcode = opcode;
  c.operands = std::move(operands);
  c.build = std::move(build);
  c.dtypes = std::move(dtypes);
  c.differentiable = differentiable;
  return c;
}

DType OperandDType(const Operand& o, DType dt) { return o.dtype.value_or(dt); }

namespace {

// Values for one operand as doubles, before rounding to its dtype.
std::vector<double> Draw(const Gen& g, DType dtype, int64_t n, std::mt19937_64& rng) {
  std::vector<double> v(n);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto uniform_int = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const bool is_bool = dtype == DType::kBool;
  const bool is_int = IsInteger(dtype);
  if (g.kind == Gen::Kind::kInt) {
    for (auto& x : v)
      x = static_cast<double>(uniform_int(static_cast<int64_t>(g.lo), static_cast<int64_t>(g.hi)));
    return v;
  }
  if (is_bool || g.kind == Gen::Kind::kBool) {
    for (auto& x : v) x = static_cast<double>(uniform_int(0, 1));
    return v;
  }
  if (g.kind == Gen::Kind::kDistinct) {
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), int64_t{0});
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < n; ++i) {
      double k = static_cast<double>(perm[i] - n / 2);
      v[i] = is_int ? k : k * g.step;
    }
    return v;
  }
  if (is_int) {
    // Small integers with the same sign structure as the float description.
    int64_t lo = std::llround(4 * g.lo), hi = std::llround(4 * g.hi);
    if (g.kind == Gen::Kind::kGrid) {
      lo = std::llround(4 * (g.lo + g.phase));
      hi = std::llround(4 * (g.lo + g.phase + (g.count - 1) * g.step));
    }
    int64_t min_abs = g.kind == Gen::Kind::kAwayFromZero
                          ? std::max<int64_t>(1, std::llround(std::ceil(4 * g.margin)))
                          : 0;
    for (auto& x : v) {
      int64_t k;
      do {
        k = uniform_int(lo, hi);
      } while (std::llabs(k) < min_abs);
      x = static_cast<double>(k);
    }
    return v;
  }
  switch (g.kind) {
    case Gen::Kind::kUniform:
      for (auto& x : v) x = g.lo + (g.hi - g.lo) * unit(rng);
      break;
    case Gen::Kind::kAwayFromZero:
      for (auto& x : v) {
        do {
          x = g.lo + (g.hi - g.lo) * unit(rng);
        } while (std::abs(x) < g.margin);
      }
      break;
    case Gen::Kind::kGrid:
      for (auto& x : v)
        x = g.lo + g.phase + g.step * static_cast<double>(uniform_int(0, g.count - 1));
      break;
    default:
      break;
  }
  return v;
}

}  // namespace

std::vector<Tensor> MakeInputs(const OpCase& c, DType dt, uint64_t salt) {
  std::mt19937_64 rng(HashName(c.name) ^ (salt * 0x9e3779b97f4a7c15ull));
  std::vector<Tensor> inputs;
  for (const Operand& o : c.operands) {
    DType odt = OperandDType(o, dt);
    std::vector<double> v = Draw(o.gen, odt, o.shape.num_elements(), rng);
    inputs.push_back(Tensor::FromDoubles(odt, o.shape, v));
  }
  return inputs;
}

absl::StatusOr<ir::Graph> BuildCaseGraph(const OpCase& c, DType dt, bool with_loss) {
  ir::Builder b(c.name);
  std::vector<ir::Value> params;
  for (const Operand& o : c.operands)
    params.push_back(b.Parameter(o.name, OperandDType(o, dt), o.shape));
  ir::Value out = c.build(b, params, dt);
  b.Output("out", out);
  if (with_loss && b.status().ok()) {
    ir::Value cot = b.Parameter("cotangent", out.dtype(), out.shape());
    ir::Value prod = ir::Mul(out, cot);
    std::vector<int64_t> dims(out.rank());
    std::iota(dims.begin(), dims.end(), int64_t{0});
    b.Output("loss", dims.empty() ? prod : ir::ReduceSum(prod, dims));
  }
  return b.Build();
}

const std::vector<OpCase>& AllOpCases() {
  static const std::vector<OpCase>* cases = [] {
    auto* all = new std::vector<OpCase>();
    for (auto family : {ElementwiseCases, StructuralCases, NnCases}) {
      std::vector<OpCase> rows = family();
      for (OpCase& r : rows) all->push_back(std::move(r));
    }
    return all;
  }();
  return *cases;
}

}  // namespace kiln::optable
