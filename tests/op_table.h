// The op-consistency table (DESIGN.md §3, convention 6; in the spirit of ggml's
// test-backend-ops): one row per test case, each naming the op under test, how to build a graph
// around it, how to draw every operand, which dtypes to run and whether it is differentiable.
// op_table_test.cc runs every row on the reference backend (the oracle) and the cpu backend,
// forward and gradient, with and without composites decomposed. A new op adds rows here.
//
//   OpCase c;
//   c.name = "softmax_3x17";
//   c.opcode = ir::Opcode::kSoftmax;
//   c.operands = {{"x", Shape{3, 17}, Uniform(-3, 3)}};
//   c.build = [](ir::Builder&, const std::vector<ir::Value>& in, DType) {
//     return ir::Softmax(in[0], -1);
//   };
//   c.dtypes = {DType::kF32, DType::kBF16};
//   c.differentiable = true;
//   c.reduction = 17;
//
// Rows live in op_table_{elementwise,structural,nn}.cc, one `// ---- <opname> ----` marker per
// op, and are collected by AllOpCases().
#ifndef KILN_TESTS_OP_TABLE_H_
#define KILN_TESTS_OP_TABLE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/graph.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/shape.h"
#include "kiln/tensor/tensor.h"

namespace kiln::optable {

// How an operand's values are drawn. The float kinds describe values for floating dtypes; for an
// integer dtype the same description maps to small integers (x -> round(4x), see MakeInputs), and
// for bool to random booleans, so one row can serve f32, bf16 and s32.
struct Gen {
  enum class Kind {
    kUniform,       // uniform in [lo, hi]
    kAwayFromZero,  // uniform in [lo, hi] with |x| >= margin (kinks of relu, abs, sign)
    kGrid,          // lo + phase + k * step, k uniform in [0, count): ties on purpose, or none
                    // between two operands whose phases differ (max, min)
    kDistinct,      // a random permutation of distinct multiples of step centred on 0 (no ties
                    // for max, argmax, pooling); exact in bf16 for up to 512 elements
    kInt,           // integers uniform in [lo, hi] (indices, labels), whatever the dtype
    kBool,          // true with probability 1/2
  };
  Kind kind = Kind::kUniform;
  double lo = -2, hi = 2;
  double margin = 0;
  double step = 0;
  int count = 0;
  double phase = 0;
};
Gen Uniform(double lo, double hi);
Gen AwayFromZero(double lo, double hi, double margin = 0.05);
Gen Grid(double lo, double step, int count, double phase = 0);
Gen Distinct(double step = 1.0 / 32);
Gen IntRange(int64_t lo, int64_t hi);
Gen Bools();

struct Operand {
  std::string name;
  Shape shape;
  Gen gen;
  // Fixed dtype (indices, labels, predicates, seeds); unset = the row's dtype. Only operands
  // without a fixed dtype are differentiated.
  std::optional<DType> dtype = std::nullopt;
};

// Builds the op from the parameters (one per operand, in order); `dt` is the row's dtype.
using BuildFn =
    std::function<ir::Value(ir::Builder& b, const std::vector<ir::Value>& in, DType dt)>;
// An extra check of the reference output against the op's definition (iota values, random_bits
// statistics, collective identity). Reports with gtest EXPECT_* macros.
using CheckFn = std::function<void(const std::vector<Tensor>& inputs, const Tensor& out)>;

struct OpCase {
  std::string name;  // "<opname>_<variant>": the test name stem, [A-Za-z0-9_] only
  ir::Opcode opcode;
  std::vector<Operand> operands;
  BuildFn build;
  std::vector<DType> dtypes;
  bool differentiable = false;
  // Longest summation behind one output element (dot, conv, reductions, norms): tolerances grow
  // with it.
  int64_t reduction = 1;
  // The backends must agree bit for bit (data movement, selection, rounding conversions). Integer
  // and bool outputs are always compared exactly.
  bool exact = false;
  CheckFn check;
};

// Row-building shorthands shared by the op_table_*.cc files.
inline std::vector<DType> FloatTypes() { return {DType::kF32, DType::kBF16}; }
inline std::vector<DType> FloatAndIntTypes() { return {DType::kF32, DType::kBF16, DType::kS32}; }
OpCase MakeCase(std::string name, ir::Opcode opcode, std::vector<Operand> operands, BuildFn build,
                std::vector<DType> dtypes, bool differentiable);

// Every row, in a stable order.
const std::vector<OpCase>& AllOpCases();

// The rows of each family (op_table_*.cc).
std::vector<OpCase> ElementwiseCases();
std::vector<OpCase> StructuralCases();
std::vector<OpCase> NnCases();

// The dtype operand `o` gets in a row run at `dt`.
DType OperandDType(const Operand& o, DType dt);

// Deterministic inputs for `c` run at `dt` (seeded from the row name and `salt`).
std::vector<Tensor> MakeInputs(const OpCase& c, DType dt, uint64_t salt = 0);

// The graph for `c` at `dt`: parameters named after the operands, output "out". With
// `with_loss`, also a parameter "cotangent" of out's type (after the operands) and an output
// "loss" = sum(out * cotangent), the scalar whose gradient the tests take.
absl::StatusOr<ir::Graph> BuildCaseGraph(const OpCase& c, DType dt, bool with_loss);

// "3x17", "scalar" for rank 0: used in row names.
std::string ShapeName(const Shape& s);

// A deterministic 64-bit hash of a string (FNV-1a), for seeds.
uint64_t HashName(const std::string& s);

}  // namespace kiln::optable

#endif  // KILN_TESTS_OP_TABLE_H_
