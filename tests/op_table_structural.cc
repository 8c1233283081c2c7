// Op-table rows for data movement, reductions, sources (parameter, constant, iota, random_bits)
// and the collectives (the identity in a single-process run).
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "op_table.h"

namespace kiln::optable {
namespace {

using ir::Opcode;
using ir::Value;

std::vector<DType> AllButF16() { return {DType::kF32, DType::kBF16, DType::kS32, DType::kBool}; }

std::string Ints(const std::vector<int64_t>& v) {
  if (v.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += "_";
    s += v[i] < 0 ? "m" + std::to_string(-v[i]) : std::to_string(v[i]);
  }
  return s;
}

// The output is the (only float or integer) input, bit for bit.
CheckFn IdentityCheck() {
  return [](const std::vector<Tensor>& in, const Tensor& out) {
    ASSERT_FALSE(in.empty());
    EXPECT_TRUE(out.BitwiseEquals(in[0]))
        << "expected the identity of " << in[0].TypeString() << ", got " << out.TypeString();
  };
}

// Row-major multi-index of flat index i.
std::vector<int64_t> Unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.rank());
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = i % s.dim(d);
    i /= s.dim(d);
  }
  return idx;
}

}  // namespace

std::vector<OpCase> StructuralCases() {
  std::vector<OpCase> rows;
  const std::vector<DType> kF = FloatTypes();
  const std::vector<DType> kFI = FloatAndIntTypes();

  auto add = [&rows](OpCase c, bool exact) {
    c.exact = exact;
    rows.push_back(std::move(c));
  };

  // ---- parameter ----
  for (const Shape& s : {Shape{3, 5}, Shape{}, Shape{1}}) {
    OpCase c = MakeCase(
        "parameter_" + ShapeName(s), Opcode::kParameter, {{"x", s, Uniform(-2, 2)}},
        [](ir::Builder&, const std::vector<Value>& in, DType) { return in[0]; }, AllButF16(), true);
    c.check = IdentityCheck();
    add(std::move(c), true);
  }

  // ---- constant ----
  {
    auto literal = [](DType dt, Shape s) {
      std::vector<double> v(s.num_elements());
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 7) - 3.0;
      return Tensor::FromDoubles(dt, s, v);
    };
    OpCase only = MakeCase(
        "constant_3x5", Opcode::kConstant, {},
        [literal](ir::Builder& b, const std::vector<Value>&, DType dt) {
          return b.Constant(literal(dt, Shape{3, 5}));
        },
        AllButF16(), false);
    only.check = [literal](const std::vector<Tensor>&, const Tensor& out) {
      EXPECT_TRUE(out.BitwiseEquals(literal(out.dtype(), Shape{3, 5})));
    };
    add(std::move(only), true);
    add(MakeCase(
            "constant_plus_x_3x5", Opcode::kConstant, {{"x", Shape{3, 5}, Uniform(-2, 2)}},
            [literal](ir::Builder& b, const std::vector<Value>& in, DType dt) {
              return ir::Add(in[0], b.Constant(literal(dt, Shape{3, 5})));
            },
            kFI, true),
        false);
    add(MakeCase(
            "constant_scalar_times_x_7", Opcode::kConstant, {{"x", Shape{7}, Uniform(-2, 2)}},
            [](ir::Builder& b, const std::vector<Value>& in, DType dt) {
              return ir::Mul(in[0], b.Scalar(3.0, dt));
            },
            kFI, true),
        false);
  }

  // ---- iota ----
  {
    struct IotaCase {
      Shape shape;
      int64_t dim;
    };
    for (const IotaCase& ic : {IotaCase{Shape{7}, 0}, IotaCase{Shape{3, 5}, 1},
                               IotaCase{Shape{2, 3, 4}, 0}, IotaCase{Shape{1, 33}, 1}}) {
      OpCase c = MakeCase(
          "iota_" + ShapeName(ic.shape) + "_d" + std::to_string(ic.dim), Opcode::kIota, {},
          [ic](ir::Builder& b, const std::vector<Value>&, DType dt) {
            return b.Iota(dt, ic.shape, ic.dim);
          },
          {DType::kF32, DType::kBF16, DType::kS32, DType::kS64}, false);
      c.check = [ic](const std::vector<Tensor>&, const Tensor& out) {
        ASSERT_EQ(out.shape(), ic.shape);
        for (int64_t i = 0; i < out.num_elements(); ++i) {
          double want = static_cast<double>(Unravel(i, ic.shape)[ic.dim]);
          ASSERT_EQ(out.GetDouble(i), want) << "iota element " << i;
        }
      };
      add(std::move(c), true);
    }
  }

  // ---- random_bits ----
  for (const Shape& s : {Shape{1}, Shape{7}, Shape{3, 17}, Shape{64, 64}}) {
    OpCase c = MakeCase(
        "random_bits_" + ShapeName(s), Opcode::kRandomBits,
        {{"seed", Shape{}, IntRange(0, 1 << 30), DType::kS64},
         {"counter", Shape{}, IntRange(0, 1 << 20), DType::kS64}},
        [s](ir::Builder&, const std::vector<Value>& in, DType dt) {
          return ir::RandomBits(in[0], in[1], dt, s);
        },
        {DType::kF32, DType::kS32}, false);
    c.check = [](const std::vector<Tensor>&, const Tensor& out) {
      const int64_t n = out.num_elements();
      if (out.dtype() == DType::kF32) {
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) {
          double x = out.GetDouble(i);
          ASSERT_TRUE(x >= 0.0 && x < 1.0) << "uniform sample " << i << " = " << x;
          sum += x;
        }
        // Mean of n U[0,1) has std 0.29/sqrt(n): 5 sigma.
        if (n >= 1000) {
          EXPECT_NEAR(sum / n, 0.5, 5 * 0.2887 / std::sqrt(static_cast<double>(n)));
        }
      } else {
        ASSERT_EQ(out.dtype(), DType::kS32);
        int64_t ones = 0;
        for (int64_t i = 0; i < n; ++i)
          ones += __builtin_popcount(static_cast<uint32_t>(out.data<int32_t>()[i]));
        // Each bit is a fair coin: 5 sigma on the fraction of set bits.
        if (n >= 1000) {
          double bits = 32.0 * n;
          EXPECT_NEAR(ones / bits, 0.5, 5 * 0.5 / std::sqrt(bits));
        }
      }
    };
    add(std::move(c), true);
  }
  // dropout is builder sugar over random_bits, compare and select.
  add(MakeCase(
          "random_bits_dropout_3x17", Opcode::kRandomBits,
          {{"x", Shape{3, 17}, Uniform(-2, 2)},
           {"seed", Shape{}, IntRange(0, 1 << 30), DType::kS64},
           {"counter", Shape{}, IntRange(0, 1 << 20), DType::kS64}},
          [](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::Dropout(in[0], 0.25, in[1], in[2]);
          },
          kF, true),
      false);

  // ---- broadcast_in_dim ----
  {
    struct Bcast {
      Shape in, out;
      std::vector<int64_t> dims;
    };
    for (const Bcast& bc :
         {Bcast{Shape{3}, Shape{2, 3, 4}, {1}}, Bcast{Shape{3, 1}, Shape{3, 5}, {0, 1}},
          Bcast{Shape{}, Shape{4, 5}, {}}, Bcast{Shape{5, 7}, Shape{5, 3, 7}, {0, 2}},
          Bcast{Shape{1, 17}, Shape{2, 3, 17}, {1, 2}}}) {
      add(MakeCase(
              "broadcast_in_dim_" + ShapeName(bc.in) + "_to_" + ShapeName(bc.out),
              Opcode::kBroadcastInDim, {{"x", bc.in, Uniform(-2, 2)}},
              [bc](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::BroadcastInDim(in[0], bc.out, bc.dims);
              },
              AllButF16(), true),
          true);
    }
  }

  // ---- concatenate ----
  {
    struct Concat {
      std::vector<Shape> shapes;
      int64_t dim;
    };
    for (const Concat& cc :
         {Concat{{Shape{3, 5}, Shape{4, 5}}, 0}, Concat{{Shape{3, 5}, Shape{3, 1}, Shape{3, 7}}, 1},
          Concat{{Shape{2, 1, 3}, Shape{2, 4, 3}}, 1}, Concat{{Shape{1}, Shape{1}}, 0}}) {
      std::vector<Operand> ops;
      std::string name = "concatenate";
      for (size_t i = 0; i < cc.shapes.size(); ++i) {
        ops.push_back({"x" + std::to_string(i), cc.shapes[i], Uniform(-2, 2)});
        name += "_" + ShapeName(cc.shapes[i]);
      }
      int64_t dim = cc.dim;
      add(MakeCase(
              name + "_d" + std::to_string(dim), Opcode::kConcatenate, ops,
              [dim](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::Concatenate(in, dim);
              },
              AllButF16(), true),
          true);
    }
  }

  // ---- gather ----
  {
    struct GatherCase {
      std::string name;
      Shape table, indices;
      int64_t axis;
      Gen index_gen;
      DType index_type;
    };
    const GatherCase cases[] = {
        {"gather_7x5_i3_a0", Shape{7, 5}, Shape{3}, 0, IntRange(0, 6), DType::kS32},
        {"gather_7x5_i2x4_a1", Shape{7, 5}, Shape{2, 4}, 1, IntRange(0, 4), DType::kS32},
        {"gather_3x7x2_i5_a1_s64", Shape{3, 7, 2}, Shape{5}, 1, IntRange(0, 6), DType::kS64},
        {"gather_17_scalar_a0", Shape{17}, Shape{}, 0, IntRange(0, 16), DType::kS32},
        // Out-of-range indices clamp to [0, size - 1].
        {"gather_clamp_7x5_i9_a0", Shape{7, 5}, Shape{9}, 0, IntRange(-4, 11), DType::kS32},
    };
    for (const GatherCase& g : cases) {
      int64_t axis = g.axis;
      add(MakeCase(
              g.name, Opcode::kGather,
              {{"table", g.table, Uniform(-2, 2)},
               {"indices", g.indices, g.index_gen, g.index_type}},
              [axis](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::Gather(in[0], in[1], axis);
              },
              kFI, true),
          true);
    }
  }

  // ---- scatter_add ----
  {
    struct ScatterCase {
      std::string name;
      Shape operand, indices, updates;
      int64_t axis;
      Gen index_gen;
    };
    const ScatterCase cases[] = {
        // 9 indices into 7 rows: duplicates accumulate.
        {"scatter_add_7x5_i9_a0", Shape{7, 5}, Shape{9}, Shape{9, 5}, 0, IntRange(0, 6)},
        {"scatter_add_4x6_i2x3_a1", Shape{4, 6}, Shape{2, 3}, Shape{4, 2, 3}, 1, IntRange(0, 5)},
        {"scatter_add_17_i33_a0", Shape{17}, Shape{33}, Shape{33}, 0, IntRange(0, 16)},
        // Out-of-range indices are dropped.
        {"scatter_add_drop_7x5_i9_a0", Shape{7, 5}, Shape{9}, Shape{9, 5}, 0, IntRange(-3, 9)},
    };
    for (const ScatterCase& s : cases) {
      int64_t axis = s.axis;
      OpCase c = MakeCase(
          s.name, Opcode::kScatterAdd,
          {{"operand", s.operand, Uniform(-2, 2)},
           {"indices", s.indices, s.index_gen, DType::kS32},
           {"updates", s.updates, Uniform(-2, 2)}},
          [axis](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::ScatterAdd(in[0], in[1], in[2], axis);
          },
          kFI, true);
      c.reduction = 4;  // a few duplicates per row, summed in any order
      add(std::move(c), false);
    }
  }

  // ---- pad ----
  {
    struct PadCase {
      Shape shape;
      std::vector<int64_t> low, high, interior;
      double value;
      std::vector<DType> dtypes;
    };
    const PadCase cases[] = {
        {Shape{3, 5}, {1, 0}, {0, 2}, {0, 0}, 0.0, kFI},
        {Shape{3, 5}, {0, 1}, {2, 1}, {1, 2}, -1.5, kF},
        {Shape{7}, {3}, {0}, {0}, 2.0, kFI},
        {Shape{2, 1, 3}, {0, 1, 1}, {1, 0, 1}, {0, 0, 1}, -1.0, kFI},
    };
    for (const PadCase& p : cases) {
      add(MakeCase(
              "pad_" + ShapeName(p.shape) + "_lo" + Ints(p.low) + "_hi" + Ints(p.high) + "_in" +
                  Ints(p.interior),
              Opcode::kPad, {{"x", p.shape, Uniform(-2, 2)}},
              [p](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::Pad(in[0], p.low, p.high, p.interior, p.value);
              },
              p.dtypes, true),
          true);
    }
  }

  // ---- reshape ----
  {
    for (const auto& [from, to] : std::vector<std::pair<Shape, Shape>>{{Shape{3, 4}, Shape{2, 6}},
                                                                       {Shape{2, 3, 5}, Shape{30}},
                                                                       {Shape{30}, Shape{5, 1, 6}},
                                                                       {Shape{1}, Shape{}}}) {
      Shape target = to;
      add(MakeCase(
              "reshape_" + ShapeName(from) + "_to_" + ShapeName(to), Opcode::kReshape,
              {{"x", from, Uniform(-2, 2)}},
              [target](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::Reshape(in[0], target);
              },
              AllButF16(), true),
          true);
    }
  }

  // ---- slice ----
  {
    struct SliceCase {
      Shape shape;
      std::vector<int64_t> start, limit, stride;
    };
    const SliceCase cases[] = {
        {Shape{7}, {1}, {6}, {2}},
        {Shape{3, 17}, {0, 3}, {3, 17}, {1, 4}},
        {Shape{2, 3, 5}, {1, 0, 1}, {2, 3, 4}, {1, 2, 1}},
        {Shape{5, 5}, {0, 0}, {5, 5}, {1, 1}},
    };
    for (const SliceCase& s : cases) {
      add(MakeCase(
              "slice_" + ShapeName(s.shape) + "_s" + Ints(s.start) + "_l" + Ints(s.limit) + "_st" +
                  Ints(s.stride),
              Opcode::kSlice, {{"x", s.shape, Uniform(-2, 2)}},
              [s](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::Slice(in[0], s.start, s.limit, s.stride);
              },
              kFI, true),
          true);
    }
  }

  // ---- transpose ----
  {
    for (const auto& [shape, perm] :
         std::vector<std::pair<Shape, std::vector<int64_t>>>{{Shape{3, 5}, {1, 0}},
                                                             {Shape{2, 3, 5}, {2, 0, 1}},
                                                             {Shape{2, 3, 4, 5}, {0, 2, 1, 3}},
                                                             {Shape{1, 7}, {1, 0}},
                                                             {Shape{3, 17, 2}, {1, 2, 0}}}) {
      std::vector<int64_t> p = perm;
      add(MakeCase(
              "transpose_" + ShapeName(shape) + "_p" + Ints(perm), Opcode::kTranspose,
              {{"x", shape, Uniform(-2, 2)}},
              [p](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::Transpose(in[0], p);
              },
              AllButF16(), true),
          true);
    }
  }

  // ---- reduce_sum ----
  // ---- reduce_max ----
  // ---- reduce_min ----
  {
    struct ReduceCase {
      Shape shape;
      std::vector<int64_t> dims;
    };
    const ReduceCase cases[] = {{Shape{3, 17}, {1}}, {Shape{2, 3, 5}, {0, 2}},
                                {Shape{33}, {0}},    {Shape{7, 1, 3}, {1}},
                                {Shape{4, 6}, {0}},  {Shape{2, 3, 4}, {0, 1, 2}}};
    for (const ReduceCase& r : cases) {
      int64_t len = 1;
      for (int64_t d : r.dims) len *= r.shape.dim(static_cast<int>(d));
      std::string suffix = ShapeName(r.shape) + "_d" + Ints(r.dims);
      std::vector<int64_t> dims = r.dims;
      OpCase sum = MakeCase(
          "reduce_sum_" + suffix, Opcode::kReduceSum, {{"x", r.shape, Uniform(-2, 2)}},
          [dims](ir::Builder&, const std::vector<Value>& in, DType) {
            return ir::ReduceSum(in[0], dims);
          },
          kFI, true);
      sum.reduction = len;
      add(std::move(sum), false);
      add(MakeCase(
              "reduce_max_" + suffix, Opcode::kReduceMax, {{"x", r.shape, Distinct()}},
              [dims](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::ReduceMax(in[0], dims);
              },
              kFI, true),
          true);
      add(MakeCase(
              "reduce_min_" + suffix, Opcode::kReduceMin, {{"x", r.shape, Distinct()}},
              [dims](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::ReduceMin(in[0], dims);
              },
              kFI, true),
          true);
    }
  }

  // ---- argmax ----
  {
    for (const auto& [shape, axis] : std::vector<std::pair<Shape, int64_t>>{
             {Shape{7}, 0}, {Shape{3, 17}, 1}, {Shape{5, 4, 3}, 1}, {Shape{4, 6}, 0}}) {
      int64_t a = axis;
      add(MakeCase(
              "argmax_" + ShapeName(shape) + "_a" + std::to_string(axis), Opcode::kArgmax,
              {{"x", shape, Distinct()}},
              [a](ir::Builder&, const std::vector<Value>& in, DType) {
                return ir::ArgMax(in[0], a);
              },
              kFI, false),
          true);
    }
    // Ties on purpose: the first maximum wins.
    add(MakeCase(
            "argmax_ties_3x17_a1", Opcode::kArgmax, {{"x", Shape{3, 17}, Grid(-1, 0.5, 3)}},
            [](ir::Builder&, const std::vector<Value>& in, DType) { return ir::ArgMax(in[0], 1); },
            kFI, false),
        true);
  }

  // ---- all_gather ----
  // ---- all_reduce ----
  // ---- reduce_scatter ----
  // A single-process run has one replica: every collective is the identity.
  for (const Shape& s : {Shape{3, 5}, Shape{7}}) {
    OpCase ar = MakeCase(
        "all_reduce_" + ShapeName(s), Opcode::kAllReduce, {{"x", s, Uniform(-2, 2)}},
        [](ir::Builder&, const std::vector<Value>& in, DType) { return ir::AllReduce(in[0]); }, kFI,
        true);
    ar.check = IdentityCheck();
    add(std::move(ar), true);
    int64_t last = s.rank() - 1;
    OpCase ag = MakeCase(
        "all_gather_" + ShapeName(s), Opcode::kAllGather, {{"x", s, Uniform(-2, 2)}},
        [last](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::AllGather(in[0], last, 1);
        },
        kFI, true);
    ag.check = IdentityCheck();
    add(std::move(ag), true);
    OpCase rs = MakeCase(
        "reduce_scatter_" + ShapeName(s), Opcode::kReduceScatter, {{"x", s, Uniform(-2, 2)}},
        [](ir::Builder&, const std::vector<Value>& in, DType) {
          return ir::ReduceScatter(in[0], 0, 1);
        },
        kFI, true);
    rs.check = IdentityCheck();
    add(std::move(rs), true);
  }
  return rows;
}

}  // namespace kiln::optable
