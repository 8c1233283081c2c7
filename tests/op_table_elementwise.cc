// Op-table rows for the elementwise ops: unary math, binary arithmetic with numpy broadcasting,
// comparisons, logic, select and convert. A plain unary or binary op needs no row here when the
// defaults AddPlainElementwiseRows derives from its opcodes.def columns fit it.
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/op_traits.h"
#include "op_table.h"

namespace kiln::optable {
namespace {

using ir::Opcode;
using ir::Value;

// Odd sizes on purpose: 1 element, a short vector, a tail that misses every SIMD width.
std::vector<Shape> UnaryShapes() { return {Shape{1}, Shape{7}, Shape{3, 17}, Shape{2, 33}}; }

// One row per shape of `fn(x)`.
void AddUnary(std::vector<OpCase>& rows, Opcode op, const std::string& stem,
              std::function<Value(Value)> fn, Gen gen, std::vector<DType> dtypes, bool diff,
              bool exact = false, std::vector<Shape> shapes = UnaryShapes()) {
  for (const Shape& s : shapes) {
    OpCase c = MakeCase(
        stem + "_" + ShapeName(s), op, {{"x", s, gen}},
        [fn](ir::Builder&, const std::vector<Value>& in, DType) { return fn(in[0]); }, dtypes,
        diff);
    c.exact = exact;
    rows.push_back(std::move(c));
  }
}

// Same-shape, broadcast (both sides stretch), trailing-vector, scalar, single-element, a 33-wide
// tail and a rank-3 broadcast that stretches alternate dims of each side.
std::vector<std::pair<Shape, Shape>> BinaryShapes() {
  return {{Shape{3, 17}, Shape{3, 17}},
          {Shape{3, 1}, Shape{1, 17}},
          {Shape{2, 3, 5}, Shape{5}},
          {Shape{7}, Shape{}},
          {Shape{1}, Shape{1}},
          {Shape{2, 33}, Shape{2, 33}},
          {Shape{2, 1, 5}, Shape{1, 3, 1}}};
}

void AddBinary(std::vector<OpCase>& rows, Opcode op, const std::string& stem,
               std::function<Value(Value, Value)> fn, Gen ga, Gen gb, std::vector<DType> dtypes,
               bool diff, bool exact = false,
               std::vector<std::pair<Shape, Shape>> shapes = BinaryShapes()) {
  for (const auto& [sa, sb] : shapes) {
    OpCase c = MakeCase(
        stem + "_" + ShapeName(sa) + "_" + ShapeName(sb), op, {{"a", sa, ga}, {"b", sb, gb}},
        [fn](ir::Builder&, const std::vector<Value>& in, DType) { return fn(in[0], in[1]); },
        dtypes, diff);
    c.exact = exact;
    rows.push_back(std::move(c));
  }
}

// Narrowing target for convert rows. In the f64 finite-difference run the convert becomes the
// identity (a finite difference of a rounding step measures the rounding, not the VJP).
DType Narrow(DType dt, DType target) { return dt == DType::kF64 ? DType::kF64 : target; }

// The plain elementwise rows of opcodes.def (families kUnary and kBinary) without a row of their
// own below, from their columns: dtypes are the floats, and unless kFloatOnly also the integers
// with results compared exactly (abs neg relu sign are exact); a unary op draws its inputs where it
// is smooth (kPositive: [0.2, 5]; kKinkAtZero: away from 0 in [-3, 3]; else [-4, 4]), a binary op
// both operands from [-2, 2]; all are differentiable. An op these defaults do not fit (a narrower
// domain, a tie-prone op) adds its own rows.
void AddPlainElementwiseRows(std::vector<OpCase>& rows) {
  std::set<Opcode> own;
  for (const OpCase& c : rows) own.insert(c.opcode);
  for (int i = 0; i < ir::kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    const ir::OpInfo& info = ir::OpTraits(op);
    if (!info.plain_elementwise() || own.count(op)) continue;
    const std::string stem(info.name);
    const std::vector<DType> dtypes = info.float_only() ? FloatTypes() : FloatAndIntTypes();
    const bool exact = !info.float_only();
    if (info.family == ir::KernelFamily::kUnary) {
      const Gen gen = info.positive_domain() ? Uniform(0.2, 5)
                      : info.kink_at_zero()  ? AwayFromZero(-3, 3)
                                             : Uniform(-4, 4);
      AddUnary(
          rows, op, stem, [op](Value x) { return ir::ElementwiseUnary(op, x); }, gen, dtypes, true,
          exact);
    } else {
      AddBinary(
          rows, op, stem, [op](Value a, Value b) { return ir::ElementwiseBinary(op, a, b); },
          Uniform(-2, 2), Uniform(-2, 2), dtypes, true, false);
    }
  }
}

}  // namespace

std::vector<OpCase> ElementwiseCases() {
  std::vector<OpCase> rows;
  const std::vector<DType> kF = FloatTypes();
  const std::vector<DType> kFI = FloatAndIntTypes();
  const std::vector<DType> kLogic = {DType::kBool, DType::kS32};

  // ---- erf ----
  AddUnary(rows, Opcode::kErf, "erf", ir::Erf, Uniform(-2.5, 2.5), kF, true);
  // ---- gelu ----
  AddUnary(
      rows, Opcode::kGelu, "gelu_erf", [](Value x) { return ir::Gelu(x, false); }, Uniform(-4, 4),
      kF, true);
  AddUnary(
      rows, Opcode::kGelu, "gelu_tanh", [](Value x) { return ir::Gelu(x, true); }, Uniform(-4, 4),
      kF, true);
  // ---- log ----
  AddUnary(rows, Opcode::kLog, "log", ir::Log, Uniform(0.2, 5), kF, true);
  // Near the root: the result's relative accuracy matters here (log_softmax of one class, the
  // cross-entropy of a confident prediction).
  AddUnary(rows, Opcode::kLog, "log_near_one", ir::Log, Uniform(0.9, 1.1), kF, true, false,
           {Shape{33}});
  // ---- logical_not ----
  AddUnary(rows, Opcode::kLogicalNot, "logical_not", ir::LogicalNot, Grid(-1, 0.5, 5), kLogic,
           false);
  // ---- rsqrt ----
  AddUnary(rows, Opcode::kRsqrt, "rsqrt", ir::Rsqrt, Uniform(0.3, 5), kF, true);
  // ---- sigmoid ----
  AddUnary(rows, Opcode::kSigmoid, "sigmoid", ir::Sigmoid, Uniform(-6, 6), kF, true);
  // ---- sign ----
  AddUnary(rows, Opcode::kSign, "sign", ir::Sign, AwayFromZero(-3, 3), kFI, true, true);
  AddUnary(rows, Opcode::kSign, "sign_zeros", ir::Sign, Grid(-1, 0.5, 5), kFI, false, true,
           {Shape{3, 17}});
  // ---- silu ----
  AddUnary(rows, Opcode::kSilu, "silu", ir::Silu, Uniform(-6, 6), kF, true);

  // ---- convert ----
  {
    auto convert_to = [](DType target, bool narrowing) {
      return [target, narrowing](Value x) {
        DType dt = x.dtype();
        return ir::Convert(x, narrowing ? Narrow(dt, target) : target);
      };
    };
    const std::vector<Shape> shapes = {Shape{7}, Shape{3, 17}};
    AddUnary(rows, Opcode::kConvert, "convert_to_bf16", convert_to(DType::kBF16, true),
             Uniform(-300, 300), {DType::kF32}, true, true, shapes);
    AddUnary(rows, Opcode::kConvert, "convert_to_f16", convert_to(DType::kF16, true),
             Uniform(-300, 300), {DType::kF32}, false, true, shapes);
    AddUnary(rows, Opcode::kConvert, "convert_to_f8e4m3", convert_to(DType::kF8E4M3, true),
             Uniform(-500, 500), {DType::kF32}, false, true, shapes);
    AddUnary(rows, Opcode::kConvert, "convert_to_f8e5m2", convert_to(DType::kF8E5M2, true),
             Uniform(-500, 500), {DType::kF32}, false, true, shapes);
    AddUnary(rows, Opcode::kConvert, "convert_to_f32", convert_to(DType::kF32, false),
             Uniform(-300, 300), {DType::kBF16, DType::kS32, DType::kBool}, false, true, shapes);
    // Truncation toward zero, saturating; values are never integers, so no tie can differ.
    AddUnary(rows, Opcode::kConvert, "convert_to_s32", convert_to(DType::kS32, false),
             Uniform(-50.3, 50.3), {DType::kF32, DType::kBF16}, false, true, shapes);
    AddUnary(rows, Opcode::kConvert, "convert_to_s64", convert_to(DType::kS64, false),
             Uniform(-50.3, 50.3), {DType::kS32}, false, true, shapes);
    AddUnary(rows, Opcode::kConvert, "convert_to_bool", convert_to(DType::kBool, false),
             Grid(-1, 0.5, 5), {DType::kF32, DType::kS32}, false, true, shapes);
  }

  // ---- div ----
  // Integer division (s32) must agree between the backends too (truncation, as in XLA).
  AddBinary(rows, Opcode::kDiv, "div", ir::Div, Uniform(-2, 2), AwayFromZero(-2, 2, 0.5), kFI,
            true);
  // ---- pow ----
  AddBinary(rows, Opcode::kPow, "pow", ir::Pow, Uniform(0.5, 2), Uniform(-2, 2), kF, true);
  // ---- max ----
  // Interleaved grids: a and b never tie, and differ by at least 0.125 (no kink within FD reach).
  AddBinary(rows, Opcode::kMax, "max", ir::Max, Grid(-2, 0.25, 17), Grid(-2, 0.25, 17, 0.125), kFI,
            true, true);
  // ---- min ----
  AddBinary(rows, Opcode::kMin, "min", ir::Min, Grid(-2, 0.25, 17), Grid(-2, 0.25, 17, 0.125), kFI,
            true, true);

  // ---- compare ----
  {
    const std::pair<ir::CompareDirection, const char*> dirs[] = {
        {ir::CompareDirection::kEq, "eq"}, {ir::CompareDirection::kNe, "ne"},
        {ir::CompareDirection::kLt, "lt"}, {ir::CompareDirection::kLe, "le"},
        {ir::CompareDirection::kGt, "gt"}, {ir::CompareDirection::kGe, "ge"}};
    for (const auto& [dir, name] : dirs) {
      ir::CompareDirection d = dir;
      // A coarse grid, so equal pairs are common.
      AddBinary(rows, Opcode::kCompare, std::string("compare_") + name,
                [d](Value a, Value b) { return ir::Compare(a, b, d); }, Grid(-1, 0.5, 5),
                Grid(-1, 0.5, 5), kFI, false, true,
                {{Shape{3, 17}, Shape{3, 17}}, {Shape{3, 1}, Shape{1, 5}}});
    }
  }

  // ---- logical_and ----
  AddBinary(rows, Opcode::kLogicalAnd, "logical_and", ir::LogicalAnd, Grid(-1, 0.5, 5),
            Grid(-1, 0.5, 5), kLogic, false, true,
            {{Shape{3, 17}, Shape{3, 17}}, {Shape{3, 1}, Shape{1, 5}}});
  // ---- logical_or ----
  AddBinary(rows, Opcode::kLogicalOr, "logical_or", ir::LogicalOr, Grid(-1, 0.5, 5),
            Grid(-1, 0.5, 5), kLogic, false, true,
            {{Shape{3, 17}, Shape{3, 17}}, {Shape{3, 1}, Shape{1, 5}}});

  // ---- select ----
  {
    struct SelectShapes {
      Shape pred, on_true, on_false;
    };
    const SelectShapes shapes[] = {{Shape{3, 17}, Shape{3, 17}, Shape{3, 17}},
                                   {Shape{3, 1}, Shape{3, 17}, Shape{1, 17}},
                                   {Shape{7}, Shape{7}, Shape{}}};
    for (const SelectShapes& s : shapes) {
      OpCase c = MakeCase(
          "select_" + ShapeName(s.pred) + "_" + ShapeName(s.on_true) + "_" + ShapeName(s.on_false),
          Opcode::kSelect,
          {{"pred", s.pred, Bools(), DType::kBool},
           {"on_true", s.on_true, Uniform(-2, 2)},
           {"on_false", s.on_false, Uniform(-2, 2)}},
          [](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::Select(in[0], in[1], in[2]);
          },
          kFI, true);
      c.exact = true;
      rows.push_back(std::move(c));
    }
  }
  AddPlainElementwiseRows(rows);

  // Tiny inputs: outputs of order x, so the result's relative accuracy shows (an absolute error
  // of 1e-7 would be a 1e-5 relative error here).
  {
    const Gen tiny = Uniform(-1e-2, 1e-2);
    const std::vector<Shape> one = {Shape{33}};
    AddUnary(rows, Opcode::kSin, "sin_near_zero", ir::Sin, tiny, kF, true, false, one);
    AddUnary(rows, Opcode::kTanh, "tanh_near_zero", ir::Tanh, tiny, kF, true, false, one);
    AddUnary(rows, Opcode::kErf, "erf_near_zero", ir::Erf, tiny, kF, true, false, one);
    AddUnary(rows, Opcode::kSilu, "silu_near_zero", ir::Silu, tiny, kF, true, false, one);
    AddUnary(
        rows, Opcode::kGelu, "gelu_erf_near_zero", [](Value x) { return ir::Gelu(x, false); }, tiny,
        kF, true, false, one);
    AddUnary(
        rows, Opcode::kGelu, "gelu_tanh_near_zero", [](Value x) { return ir::Gelu(x, true); }, tiny,
        kF, true, false, one);
  }
  return rows;
}

}  // namespace kiln::optable
