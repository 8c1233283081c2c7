#include "kiln/ir/shape_inference.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/ir/element_semantics.h"
#include "kiln/ir/op_traits.h"

namespace kiln::ir {
namespace {

using ::testing::HasSubstr;
using Ints = std::vector<int64_t>;

Type T(DType dt, Shape s) { return Type{dt, std::move(s)}; }
Type F(Shape s) { return T(DType::kF32, std::move(s)); }
Type I32(Shape s) { return T(DType::kS32, std::move(s)); }
Type I64(Shape s) { return T(DType::kS64, std::move(s)); }
Type B(Shape s) { return T(DType::kBool, std::move(s)); }

struct Valid {
  std::vector<Type> operands;
  AttrMap attrs;
  std::optional<Type> declared;
  Type expected;
};
struct Invalid {
  std::vector<Type> operands;
  AttrMap attrs;
  std::optional<Type> declared;
  std::string error;  // substring of the message
};
struct OpCases {
  std::vector<Valid> valid;
  std::vector<Invalid> invalid;
};

AttrMap ConvAttrs(Ints pad = {1, 1, 1, 1}, int64_t groups = 2) {
  return {{"strides", Ints{1, 1}}, {"padding", pad}, {"dilation", Ints{1, 1}}, {"groups", groups}};
}
AttrMap With(AttrMap m, const std::string& k, AttrValue v) {
  m[k] = std::move(v);
  return m;
}
AttrMap Pool(Ints window, Ints strides, Ints padding) {
  return {{"window", window}, {"strides", strides}, {"padding", padding}};
}
AttrMap AvgPool(Ints window, Ints strides, Ints padding) {
  return With(Pool(window, strides, padding), "count_include_pad", int64_t{0});
}

// Float-only unary ops: valid on f32/bf16, invalid on s32.
OpCases FloatUnary() {
  return {
      {{{F({2, 3})}, {}, {}, F({2, 3})}, {{T(DType::kBF16, {4})}, {}, {}, T(DType::kBF16, {4})}},
      {{{I32({2})}, {}, {}, "floating-point"}, {{F({2}), F({2})}, {}, {}, "operand(s)"}}};
}
// Numeric unary ops: valid on f32 and s32, invalid on bool.
OpCases NumericUnary() {
  return {{{{F({2, 3})}, {}, {}, F({2, 3})}, {{I32({4})}, {}, {}, I32({4})}},
          {{{B({2})}, {}, {}, "numeric"}}};
}
// Numeric binary ops.
OpCases NumericBinary() {
  return {{{{F({2, 3}), F({2, 3})}, {}, {}, F({2, 3})}, {{I32({}), I32({})}, {}, {}, I32({})}},
          {{{F({2, 3}), F({3})}, {}, {}, "operand types differ: f32[2,3] vs f32[3]"},
           {{B({2}), B({2})}, {}, {}, "numeric"}}};
}
OpCases LogicalBinary() {
  return {{{{B({2}), B({2})}, {}, {}, B({2})}, {{I32({2}), I32({2})}, {}, {}, I32({2})}},
          {{{F({2}), F({2})}, {}, {}, "bool or integer"}}};
}

std::map<Opcode, OpCases> Table() {
  std::map<Opcode, OpCases> t;
  using O = Opcode;
  // The plain elementwise rows of opcodes.def, from their columns (no per-op line: a new op is
  // covered by its row): a unary op is float-only or numeric, a binary op numeric. Rows below
  // replace these where an op needs more (gelu's attribute).
  for (int i = 0; i < kNumOpcodes; ++i) {
    const O op = static_cast<O>(i);
    if (OpTraits(op).family == KernelFamily::kUnary)
      t[op] = OpTraits(op).float_only() ? FloatUnary() : NumericUnary();
    if (OpTraits(op).family == KernelFamily::kBinary) t[op] = NumericBinary();
  }
  t[O::kLogicalAnd] = LogicalBinary();
  t[O::kLogicalOr] = LogicalBinary();
  t[O::kLogicalNot] = {
      {{{B({2})}, {}, {}, B({2})}, {{T(DType::kU8, {2})}, {}, {}, T(DType::kU8, {2})}},
      {{{F({2})}, {}, {}, "bool or integer"}}};
  t[O::kGelu] = {{{{F({3})}, {{"approximate", std::string("tanh")}}, {}, F({3})},
                  {{F({3})}, {{"approximate", std::string("none")}}, {}, F({3})}},
                 {{{F({3})}, {{"approximate", std::string("fast")}}, {}, "approximate"},
                  {{F({3})}, {}, {}, "missing attribute 'approximate'"},
                  {{I32({3})}, {{"approximate", std::string("none")}}, {}, "floating-point"}}};
  t[O::kCompare] = {{{{F({2}), F({2})}, {{"direction", std::string("lt")}}, {}, B({2})},
                     {{B({2}), B({2})}, {{"direction", std::string("eq")}}, {}, B({2})}},
                    {{{F({2}), F({2})}, {{"direction", std::string("lte")}}, {}, "direction"},
                     {{F({2}), I32({2})}, {{"direction", std::string("eq")}}, {}, "differ"}}};
  t[O::kSelect] = {{{{B({2, 3}), F({2, 3}), F({2, 3})}, {}, {}, F({2, 3})}},
                   {{{F({2, 3}), F({2, 3}), F({2, 3})}, {}, {}, "predicate must be bool"},
                    {{B({3}), F({2, 3}), F({2, 3})}, {}, {}, "predicate shape"},
                    {{B({2}), F({2}), I32({2})}, {}, {}, "differ"}}};
  t[O::kConvert] = {{{{F({2, 3})}, {}, I32({2, 3}), I32({2, 3})},
                     {{F({2})}, {}, T(DType::kF8E4M3, {2}), T(DType::kF8E4M3, {2})},
                     {{T(DType::kF8E5M2, {2})}, {}, F({2}), F({2})}},
                    {{{F({2, 3})}, {}, I32({3, 2}), "keep the operand's shape"},
                     {{F({2})}, {}, {}, "declared result type is required"}}};
  // Sources.
  t[O::kParameter] = {
      {{{}, {{"index", int64_t{0}}, {"name", std::string("x")}}, F({2}), F({2})},
       {{},
        {{"index", int64_t{3}}, {"name", std::string("w8")}},
        T(DType::kF8E4M3, {4, 4}),
        T(DType::kF8E4M3, {4, 4})}},
      {{{}, {{"index", int64_t{0}}}, F({2}), "missing attribute 'name'"},
       {{}, {{"index", int64_t{-1}}, {"name", std::string("x")}}, F({2}), "index"},
       {{}, {{"index", int64_t{0}}, {"name", std::string("x")}}, {}, "declared"},
       {{}, {{"index", int64_t{0}}, {"name", std::string("x")}}, F({-1}), "negative"}}};
  t[O::kConstant] = {{{{}, {}, F({2}), F({2})}, {{}, {}, B({}), B({})}},
                     {{{}, {}, {}, "declared result type is required"},
                      {{F({})}, {}, F({}), "expected 0 operand(s), got 1"}}};
  t[O::kIota] = {{{{}, {{"dimension", int64_t{1}}}, I32({3, 4}), I32({3, 4})},
                  {{}, {{"dimension", int64_t{0}}}, F({5}), F({5})}},
                 {{{}, {{"dimension", int64_t{2}}}, I32({3, 4}), "out of range"},
                  {{}, {{"dimension", int64_t{0}}}, B({3}), "numeric"},
                  {{}, {{"dimension", std::string("0")}}, I32({3}), "must be an int"}}};
  t[O::kRandomBits] = {{{{I64({}), I64({})}, {}, F({4, 2}), F({4, 2})},
                        {{I64({}), I64({})}, {}, I32({3}), I32({3})}},
                       {{{I64({}), I64({})}, {}, T(DType::kF64, {3}), "s32 (raw bits) or f32"},
                        {{I32({}), I64({})}, {}, F({3}), "seed must be s64[]"},
                        {{I64({}), I64({2})}, {}, F({3}), "counter must be s64[]"}}};
  // Structural.
  t[O::kBroadcastInDim] = {
      {{{F({3})}, {{"shape", Ints{2, 3}}, {"broadcast_dimensions", Ints{1}}}, {}, F({2, 3})},
       {{F({1, 3})}, {{"shape", Ints{4, 3}}, {"broadcast_dimensions", Ints{0, 1}}}, {}, F({4, 3})},
       {{F({})}, {{"shape", Ints{2}}, {"broadcast_dimensions", Ints{}}}, {}, F({2})}},
      {{{F({3})},
        {{"shape", Ints{2, 3}}, {"broadcast_dimensions", Ints{0}}},
        {},
        "cannot broadcast"},
       {{F({2, 3})},
        {{"shape", Ints{2, 3}}, {"broadcast_dimensions", Ints{1, 0}}},
        {},
        "strictly increasing"},
       {{F({3})}, {{"shape", Ints{3}}, {"broadcast_dimensions", Ints{1}}}, {}, "out of range"}}};
  t[O::kReshape] = {{{{F({2, 3})}, {{"shape", Ints{3, 2}}}, {}, F({3, 2})},
                     {{F({1})}, {{"shape", Ints{}}}, {}, F({})}},
                    {{{F({2, 3})}, {{"shape", Ints{4}}}, {}, "cannot reshape f32[2,3]"},
                     {{F({2, 3})}, {{"shape", Ints{-1}}}, {}, "negative"}}};
  t[O::kTranspose] = {{{{F({2, 3, 4})}, {{"permutation", Ints{2, 0, 1}}}, {}, F({4, 2, 3})}},
                      {{{F({2, 3, 4})}, {{"permutation", Ints{0, 0, 1}}}, {}, "not a permutation"},
                       {{F({2, 3})}, {{"permutation", Ints{0}}}, {}, "not a permutation"}}};
  t[O::kSlice] = {{{{F({10, 6})},
                    {{"start", Ints{2, 0}}, {"limit", Ints{8, 6}}, {"stride", Ints{3, 2}}},
                    {},
                    F({2, 3})}},
                  {{{F({10, 6})},
                    {{"start", Ints{0, 0}}, {"limit", Ints{11, 6}}, {"stride", Ints{1, 1}}},
                    {},
                    "out of bounds"},
                   {{F({10, 6})},
                    {{"start", Ints{0, 0}}, {"limit", Ints{1, 6}}, {"stride", Ints{0, 1}}},
                    {},
                    "stride"}}};
  t[O::kConcatenate] = {
      {{{F({2, 3}), F({4, 3})}, {{"dimension", int64_t{0}}}, {}, F({6, 3})},
       {{F({2})}, {{"dimension", int64_t{0}}}, {}, F({2})}},
      {{{F({2, 3}), F({2, 4})}, {{"dimension", int64_t{0}}}, {}, "does not match"},
       {{F({2}), I32({2})}, {{"dimension", int64_t{0}}}, {}, "dtypes differ"},
       {{}, {{"dimension", int64_t{0}}}, {}, "at least one operand"}}};
  t[O::kPad] = {
      {{{F({2, 3})},
        {{"low", Ints{1, 0}}, {"high", Ints{0, 2}}, {"interior", Ints{0, 1}}, {"value", 0.0}},
        {},
        F({3, 7})}},
      {{{F({2, 3})},
        {{"low", Ints{-1, 0}}, {"high", Ints{0, 0}}, {"interior", Ints{0, 0}}, {"value", 0.0}},
        {},
        ">= 0"},
       {{F({2, 3})},
        {{"low", Ints{0, 0}}, {"high", Ints{0, 0}}, {"interior", Ints{0, 0}}},
        {},
        "value"}}};
  t[O::kGather] = {
      {{{F({10, 4}), I32({3, 2})}, {{"axis", int64_t{0}}}, {}, F({3, 2, 4})},
       {{F({10, 4}), I64({5})}, {{"axis", int64_t{1}}}, {}, F({10, 5})}},
      {{{F({10, 4}), F({3})}, {{"axis", int64_t{0}}}, {}, "indices must be s32 or s64"},
       {{F({10, 4}), I32({3})}, {{"axis", int64_t{2}}}, {}, "out of range"}}};
  t[O::kScatterAdd] = {
      {{{F({10, 4}), I32({3}), F({3, 4})}, {{"axis", int64_t{0}}}, {}, F({10, 4})}},
      {{{F({10, 4}), I32({3}), F({3, 5})},
        {{"axis", int64_t{0}}},
        {},
        "updates f32[3,5] must be f32[3,4]"},
       {{F({10, 4}), B({3}), F({3, 4})}, {{"axis", int64_t{0}}}, {}, "indices"}}};
  // Reductions.
  for (O op : {O::kReduceSum, O::kReduceMax, O::kReduceMin})
    t[op] = {{{{F({2, 3, 4})}, {{"dimensions", Ints{0, 2}}}, {}, F({3})},
              {{I32({2, 3})}, {{"dimensions", Ints{}}}, {}, I32({2, 3})}},
             {{{F({2, 3})}, {{"dimensions", Ints{1, 1}}}, {}, "repeats dimension 1"},
              {{F({2, 3})}, {{"dimensions", Ints{2}}}, {}, "out of range"},
              {{B({2})}, {{"dimensions", Ints{0}}}, {}, "numeric"}}};
  t[O::kArgmax] = {{{{F({2, 3})}, {{"axis", int64_t{1}}}, {}, I32({2})}},
                   {{{F({2, 3})}, {{"axis", int64_t{2}}}, {}, "out of range"},
                    {{F({})}, {{"axis", int64_t{0}}}, {}, "rank >= 1"}}};
  // Contractions.
  t[O::kDotGeneral] = {
      {{{F({2, 3}), F({3, 5})},
        {{"lhs_batch", Ints{}},
         {"rhs_batch", Ints{}},
         {"lhs_contracting", Ints{1}},
         {"rhs_contracting", Ints{0}}},
        {},
        F({2, 5})},
       {{F({4, 2, 3}), F({4, 3, 5})},
        {{"lhs_batch", Ints{0}},
         {"rhs_batch", Ints{0}},
         {"lhs_contracting", Ints{2}},
         {"rhs_contracting", Ints{1}}},
        {},
        F({4, 2, 5})}},
      {{{F({2, 3}), F({4, 5})},
        {{"lhs_batch", Ints{}},
         {"rhs_batch", Ints{}},
         {"lhs_contracting", Ints{1}},
         {"rhs_contracting", Ints{0}}},
        {},
        "dot_general: contracting dimension sizes differ: lhs f32[2,3] dim 1 is 3, rhs f32[4,5] "
        "dim 0 is 4"},
       {{F({2, 3}), F({3, 5})},
        {{"lhs_batch", Ints{}},
         {"rhs_batch", Ints{}},
         {"lhs_contracting", Ints{1, 1}},
         {"rhs_contracting", Ints{0, 1}}},
        {},
        "used twice"}}};
  // int8.
  t[O::kQuantize] = {{{{F({2, 3})}, {{"scale", 0.25}}, {}, T(DType::kS8, {2, 3})}},
                     {{{F({2, 3})}, {{"scale", 0.0}}, {}, "positive finite"},
                      {{F({2, 3})}, {{"scale", -1.0}}, {}, "positive finite"},
                      {{F({2})}, {{"scale", 1e300}}, {}, "positive finite"},
                      {{T(DType::kF64, {2})}, {{"scale", 1.0}}, {}, "operand must be f32"}}};
  t[O::kQuantizedDot] = {
      {{{T(DType::kS8, {2, 5, 3}), T(DType::kS8, {3, 4}), F({4})}, {}, {}, F({2, 5, 4})}},
      {{{T(DType::kS8, {2, 3}), T(DType::kS8, {4, 4}), F({4})}, {}, {}, "contracting sizes differ"},
       {{T(DType::kS8, {2, 3}), T(DType::kS8, {3, 4}), F({3})}, {}, {}, "one per output channel"},
       {{F({2, 3}), T(DType::kS8, {3, 4}), F({4})}, {}, {}, "input must be s8"},
       {{T(DType::kS8, {2, 3}), T(DType::kS8, {3, 4, 1}), F({4})}, {}, {}, "w [K, N]"}}};
  t[O::kQuantizedConv2d] = {{{{T(DType::kS8, {2, 4, 8, 8}), T(DType::kS8, {6, 2, 3, 3}), F({6})},
                              ConvAttrs(),
                              {},
                              F({2, 6, 8, 8})}},
                            {{{T(DType::kS8, {2, 4, 8, 8}), T(DType::kS8, {6, 2, 3, 3}), F({2})},
                              ConvAttrs(),
                              {},
                              "scale f32[2] must be f32[6]"},
                             {{T(DType::kS8, {2, 4, 8, 8}), T(DType::kS8, {6, 2, 3, 3}), I32({6})},
                              ConvAttrs(),
                              {},
                              "scale must be f32"},
                             {{T(DType::kS8, {2, 4, 8, 8}), F({6, 2, 3, 3}), F({6})},
                              ConvAttrs(),
                              {},
                              "weights must be s8"},
                             {{T(DType::kS8, {2, 4, 8, 8}), T(DType::kS8, {6, 4, 3, 3}), F({6})},
                              ConvAttrs(),
                              {},
                              "filter in-channels"}}};
  t[O::kConv2d] = {
      {{{F({2, 4, 8, 8}), F({6, 2, 3, 3})}, ConvAttrs(), {}, F({2, 6, 8, 8})},
       {{F({1, 1, 8, 8}), F({1, 1, 3, 3})},
        {{"strides", Ints{2, 2}},
         {"padding", Ints{0, 0, 0, 0}},
         {"dilation", Ints{2, 2}},
         {"groups", int64_t{1}}},
        {},
        F({1, 1, 2, 2})}},
      {{{F({2, 4, 8, 8}), F({6, 4, 3, 3})}, ConvAttrs(), {}, "filter in-channels"},
       {{F({2, 4, 2, 2}), F({6, 2, 5, 5})}, ConvAttrs({0, 0, 0, 0}), {}, "larger than the padded"},
       {{I32({2, 4, 8, 8}), I32({6, 2, 3, 3})}, ConvAttrs(), {}, "floating-point"}}};
  t[O::kConv2dBackwardFilter] = {
      {{{F({2, 4, 8, 8}), F({2, 6, 8, 8})},
        With(ConvAttrs(), "filter_shape", Ints{6, 2, 3, 3}),
        {},
        F({6, 2, 3, 3})}},
      {{{F({2, 4, 8, 8}), F({2, 6, 7, 7})},
        With(ConvAttrs(), "filter_shape", Ints{6, 2, 3, 3}),
        {},
        "grad_out f32[2,6,7,7] does not match"},
       {{F({2, 4, 8, 8}), F({2, 6, 8, 8})}, ConvAttrs(), {}, "filter_shape"}}};
  t[O::kConv2dBackwardInput] = {{{{F({2, 6, 8, 8}), F({6, 2, 3, 3})},
                                  With(ConvAttrs(), "input_shape", Ints{2, 4, 8, 8}),
                                  {},
                                  F({2, 4, 8, 8})}},
                                {{{F({2, 6, 8, 8}), F({6, 2, 3, 3})},
                                  With(ConvAttrs(), "input_shape", Ints{2, 4, 8}),
                                  {},
                                  "input_shape"},
                                 {{F({2, 6, 8, 8}), F({6, 2, 3, 3})},
                                  With(ConvAttrs(), "input_shape", Ints{2, 4, 9, 9}),
                                  {},
                                  "does not match"}}};
  // Pooling.
  t[O::kMaxPool2d] = {
      {{{F({1, 1, 5, 5})}, Pool({3, 3}, {2, 2}, {1, 1, 1, 1}), {}, F({1, 1, 3, 3})},
       {{I32({1, 2, 4, 4})}, Pool({2, 2}, {2, 2}, {0, 0, 0, 0}), {}, I32({1, 2, 2, 2})}},
      {{{F({1, 5, 5})}, Pool({3, 3}, {2, 2}, {1, 1, 1, 1}), {}, "rank-4"},
       {{F({1, 1, 5, 5})}, Pool({2, 2}, {2, 2}, {2, 0, 0, 0}), {}, "smaller than"},
       {{F({1, 1, 5, 5})}, Pool({0, 2}, {2, 2}, {0, 0, 0, 0}), {}, "window"}}};
  t[O::kMaxPool2dGrad] = {{{{F({1, 1, 4, 4}), F({1, 1, 2, 2})},
                            Pool({2, 2}, {2, 2}, {0, 0, 0, 0}),
                            {},
                            F({1, 1, 4, 4})}},
                          {{{F({1, 1, 4, 4}), F({1, 1, 3, 3})},
                            Pool({2, 2}, {2, 2}, {0, 0, 0, 0}),
                            {},
                            "does not match"}}};
  t[O::kAvgPool2d] = {
      {{{F({1, 3, 8, 8})}, AvgPool({2, 2}, {2, 2}, {0, 0, 0, 0}), {}, F({1, 3, 4, 4})},
       {{F({1, 3, 8, 8})}, AvgPool({3, 3}, {1, 1}, {1, 1, 1, 1}), {}, F({1, 3, 8, 8})}},
      {{{F({1, 3, 8, 8})}, Pool({2, 2}, {2, 2}, {0, 0, 0, 0}), {}, "count_include_pad"},
       {{F({1, 3, 8, 8})},
        With(Pool({2, 2}, {2, 2}, {0, 0, 0, 0}), "count_include_pad", int64_t{2}),
        {},
        "count_include_pad"},
       {{I32({1, 3, 8, 8})}, AvgPool({2, 2}, {2, 2}, {0, 0, 0, 0}), {}, "floating-point"}}};
  t[O::kAvgPool2dGrad] = {
      {{{F({1, 3, 4, 4})},
        With(AvgPool({2, 2}, {2, 2}, {0, 0, 0, 0}), "input_shape", Ints{1, 3, 8, 8}),
        {},
        F({1, 3, 8, 8})}},
      {{{F({1, 3, 3, 3})},
        With(AvgPool({2, 2}, {2, 2}, {0, 0, 0, 0}), "input_shape", Ints{1, 3, 8, 8}),
        {},
        "does not match"}}};
  // Composites.
  for (O op : {O::kSoftmax, O::kLogSoftmax})
    t[op] = {{{{F({2, 3})}, {{"axis", int64_t{1}}}, {}, F({2, 3})}},
             {{{F({2, 3})}, {{"axis", int64_t{2}}}, {}, "out of range"},
              {{F({2, 3})}, {}, {}, "missing attribute 'axis'"},
              {{I32({2, 3})}, {{"axis", int64_t{1}}}, {}, "floating-point"}}};
  t[O::kLayerNorm] = {
      {{{F({2, 8}), F({8}), F({8})}, {{"epsilon", 1e-5}}, {}, F({2, 8})}},
      {{{F({2, 8}), F({4}), F({8})}, {{"epsilon", 1e-5}}, {}, "gamma f32[4] must be [8]"},
       {{F({2, 8}), F({8}), F({8})}, {{"epsilon", -1.0}}, {}, "epsilon"}}};
  t[O::kRmsNorm] = {{{{F({2, 8}), F({8})}, {{"epsilon", 1e-6}}, {}, F({2, 8})}},
                    {{{F({2, 8}), F({2, 8})}, {{"epsilon", 1e-6}}, {}, "gamma"}}};
  AttrMap att = {{"causal", int64_t{0}}, {"scale", 0.35}};
  t[O::kAttention] = {
      {{{F({2, 4, 8}), F({2, 6, 8}), F({2, 6, 16})}, att, {}, F({2, 4, 16})},
       {{F({4, 8}), F({6, 8}), F({6, 8})}, With(att, "causal", int64_t{1}), {}, F({4, 8})}},
      {{{F({2, 4, 8}), F({2, 6, 8}), F({2, 5, 16})}, att, {}, "Sk"},
       {{F({2, 4, 8}), F({3, 6, 8}), F({3, 6, 16})}, att, {}, "batch dims"},
       {{F({2, 4, 8}), F({2, 6, 8}), F({2, 6, 16})},
        With(att, "causal", int64_t{2}),
        {},
        "causal"}}};
  t[O::kCrossEntropy] = {
      {{{F({4, 10}), I32({4})}, {}, {}, F({4})},
       {{T(DType::kBF16, {2, 3, 10}), I64({2, 3})}, {}, {}, T(DType::kBF16, {2, 3})}},
      {{{F({4, 10}), F({4})}, {}, {}, "labels must be s32 or s64"},
       {{F({4, 10}), I32({5})}, {}, {}, "labels s32[5] must have shape [4]"}}};
  // Collectives.
  t[O::kAllReduce] = {{{{F({2, 3})}, {{"reduction", std::string("sum")}}, {}, F({2, 3})}},
                      {{{F({2, 3})}, {{"reduction", std::string("prod")}}, {}, "reduction"}}};
  t[O::kAllGather] = {
      {{{F({2, 3})}, {{"dimension", int64_t{1}}, {"replicas", int64_t{4}}}, {}, F({2, 12})}},
      {{{F({2, 3})}, {{"dimension", int64_t{2}}, {"replicas", int64_t{4}}}, {}, "out of range"},
       {{F({2, 3})}, {{"dimension", int64_t{0}}, {"replicas", int64_t{0}}}, {}, "replicas"}}};
  t[O::kReduceScatter] = {
      {{{F({8, 3})}, {{"dimension", int64_t{0}}, {"replicas", int64_t{4}}}, {}, F({2, 3})}},
      {{{F({8, 3})}, {{"dimension", int64_t{0}}, {"replicas", int64_t{3}}}, {}, "not divisible"}}};
  return t;
}

bool TakesDeclared(Opcode op) { return OpTraits(op).declared_type(); }

TEST(ShapeInferenceTest, TableCoversEveryOpcode) {
  std::map<Opcode, OpCases> table = Table();
  EXPECT_EQ(static_cast<int>(table.size()), kNumOpcodes);
  for (int i = 0; i < kNumOpcodes; ++i) {
    Opcode op = static_cast<Opcode>(i);
    ASSERT_TRUE(table.count(op)) << "no shape inference cases for " << OpcodeName(op);
    EXPECT_FALSE(table[op].valid.empty()) << OpcodeName(op);
    EXPECT_FALSE(table[op].invalid.empty()) << OpcodeName(op);
  }
}

// The derived cases above trust the kFloatOnly column; the per-element rules the kernels run
// must agree with it (an integer rule exactly when the op is not float-only), so a row that
// forgets the flag fails here rather than accepting integers no kernel computes.
TEST(ShapeInferenceTest, FloatOnlyColumnMatchesTheElementRules) {
  int plain = 0;
  for (int i = 0; i < kNumOpcodes; ++i) {
    const Opcode op = static_cast<Opcode>(i);
    const OpInfo& info = OpTraits(op);
    if (!info.plain_elementwise()) continue;
    ++plain;
    bool has_int_rule;
    if (info.family == KernelFamily::kUnary) {
      AttrMap attrs;
      if (op == Opcode::kGelu) attrs["approximate"] = std::string("none");
      Node n(1, op, {0}, F({2}), attrs);
      ASSERT_NE(UnaryFor(n).f, nullptr) << OpcodeName(op) << " has no rule in element_semantics";
      has_int_rule = UnaryFor(n).i != nullptr;
    } else {
      ASSERT_NE(BinaryFor(op).f, nullptr) << OpcodeName(op) << " has no rule in element_semantics";
      has_int_rule = BinaryFor(op).i != nullptr;
    }
    EXPECT_EQ(info.float_only(), !has_int_rule) << OpcodeName(op);
  }
  EXPECT_GE(plain, 22);
}

TEST(ShapeInferenceTest, DeclaredTypeColumnsAreTheDocumentedOps) {
  std::vector<std::string> declared;
  for (int i = 0; i < kNumOpcodes; ++i)
    if (TakesDeclared(static_cast<Opcode>(i)))
      declared.emplace_back(OpcodeName(static_cast<Opcode>(i)));
  EXPECT_EQ(declared,
            (std::vector<std::string>{"constant", "convert", "iota", "parameter", "random_bits"}));
}

TEST(ShapeInferenceTest, ValidCases) {
  for (const auto& [op, cases] : Table()) {
    for (const Valid& c : cases.valid) {
      absl::StatusOr<Type> t = InferType(op, c.operands, c.attrs, c.declared);
      ASSERT_TRUE(t.ok()) << OpcodeName(op) << ": " << t.status();
      EXPECT_EQ(*t, c.expected) << OpcodeName(op) << ": got " << t->ToString();
    }
  }
}

TEST(ShapeInferenceTest, InvalidCases) {
  for (const auto& [op, cases] : Table()) {
    for (const Invalid& c : cases.invalid) {
      absl::StatusOr<Type> t = InferType(op, c.operands, c.attrs, c.declared);
      ASSERT_FALSE(t.ok()) << OpcodeName(op) << " accepted a bad case, got " << t->ToString()
                           << " (want error containing '" << c.error << "')";
      EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
      std::string msg(t.status().message());
      EXPECT_THAT(msg, HasSubstr(c.error)) << OpcodeName(op);
      // Every error names its op.
      EXPECT_EQ(msg.rfind(std::string(OpcodeName(op)) + ": ", 0), 0u) << msg;
    }
  }
}

// For ops that infer their type, a declared type must match exactly.
TEST(ShapeInferenceTest, DeclaredTypeIsChecked) {
  for (const auto& [op, cases] : Table()) {
    if (TakesDeclared(op)) continue;
    const Valid& c = cases.valid[0];
    EXPECT_TRUE(InferType(op, c.operands, c.attrs, c.expected).ok()) << OpcodeName(op);
    Type wrong = c.expected;
    wrong.shape.mutable_dims().push_back(7);
    absl::StatusOr<Type> t = InferType(op, c.operands, c.attrs, wrong);
    ASSERT_FALSE(t.ok()) << OpcodeName(op);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("does not match the inferred type"));
  }
}

// Storage-only f8 dtypes are rejected by every op but convert, parameter and constant.
TEST(ShapeInferenceTest, StorageOnlyDTypesAreRejected) {
  for (const auto& [op, cases] : Table()) {
    const Valid& c = cases.valid[0];
    if (op == Opcode::kConvert || c.operands.empty()) continue;
    std::vector<Type> operands = c.operands;
    operands[0].dtype = DType::kF8E5M2;
    absl::StatusOr<Type> t = InferType(op, operands, c.attrs, std::nullopt);
    ASSERT_FALSE(t.ok()) << OpcodeName(op);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("storage-only")) << OpcodeName(op);
  }
  EXPECT_FALSE(
      InferType(Opcode::kIota, {}, {{"dimension", int64_t{0}}}, Type{DType::kF8E4M3, Shape{4}})
          .ok());
}

TEST(ShapeInferenceTest, ArityIsChecked) {
  for (const auto& [op, cases] : Table()) {
    if (OpcodeArity(op) < 0) continue;
    const Valid& c = cases.valid[0];
    std::vector<Type> operands = c.operands;
    operands.push_back(F({1}));
    absl::StatusOr<Type> t = InferType(op, operands, c.attrs, c.declared);
    ASSERT_FALSE(t.ok()) << OpcodeName(op);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("operand(s), got"));
  }
}

TEST(ShapeInferenceTest, MessagesNameShapes) {
  absl::StatusOr<Type> t =
      InferType(Opcode::kConv2d, {F({2, 4, 8, 8}), F({6, 4, 3, 3})}, ConvAttrs());
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("input [N,C,H,W] [2,4,8,8], filter [O,I,kH,kW] [6,4,3,3]"));

  t = InferType(Opcode::kReshape, {F({2, 3})}, {{"shape", Ints{4}}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(),
            "reshape: cannot reshape f32[2,3] (6 elements) to [4] (4 elements)");

  t = InferType(Opcode::kDotGeneral, {F({4, 2, 3}), F({5, 3, 2})},
                {{"lhs_batch", Ints{0}},
                 {"rhs_batch", Ints{0}},
                 {"lhs_contracting", Ints{2}},
                 {"rhs_contracting", Ints{1}}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(),
            "dot_general: batch dimension sizes differ: lhs f32[4,2,3] dim 0 is 4, rhs f32[5,3,2] "
            "dim 0 is 5");
}

TEST(ShapeInferenceTest, AttributeKindsAreChecked) {
  absl::StatusOr<Type> t = InferType(Opcode::kSoftmax, {F({2})}, {{"axis", 0.5}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "softmax: attribute 'axis' must be an int");
  // Float attributes accept ints.
  EXPECT_TRUE(InferType(Opcode::kRmsNorm, {F({2, 8}), F({8})}, {{"epsilon", int64_t{0}}}).ok());
}

TEST(ShapeInferenceTest, ConvOutputSizeFormula) {
  // out = floor((in + lo + hi - dilation*(k-1) - 1) / stride) + 1, checked against a brute-force
  // count of window positions.
  for (int64_t in = 1; in <= 9; ++in)
    for (int64_t k = 1; k <= 3; ++k)
      for (int64_t s = 1; s <= 3; ++s)
        for (int64_t d = 1; d <= 2; ++d)
          for (int64_t lo = 0; lo <= 2; ++lo) {
            int64_t hi = (lo + 1) % 3;
            int64_t positions = 0;
            for (int64_t start = -lo; start + d * (k - 1) < in + hi; start += s) ++positions;
            AttrMap attrs = {{"strides", Ints{s, 1}},
                             {"padding", Ints{lo, hi, 0, 0}},
                             {"dilation", Ints{d, 1}},
                             {"groups", int64_t{1}}};
            absl::StatusOr<Type> t =
                InferType(Opcode::kConv2d, {F({1, 1, in, 1}), F({1, 1, k, 1})}, attrs);
            if (positions == 0) {
              EXPECT_FALSE(t.ok());
            } else {
              ASSERT_TRUE(t.ok()) << t.status();
              EXPECT_EQ(t->shape.dim(2), positions) << in << " " << k << " " << s << " " << d;
            }
          }
}

}  // namespace
}  // namespace kiln::ir

namespace kiln::ir {
namespace {

// Absurd attributes must give an error, never signed overflow (found by fuzzing the parser).
TEST(ShapeInferenceOverflowTest, HugeSizesAreErrors) {
  Type x{DType::kF32, Shape{3, 4}};
  int64_t big = int64_t{1} << 62;
  EXPECT_FALSE(InferType(Opcode::kPad, {x},
                         {{"low", std::vector<int64_t>{0, 0}},
                          {"high", std::vector<int64_t>{0, 0}},
                          {"interior", std::vector<int64_t>{big, 0}},
                          {"value", 0.0}})
                   .ok());
  EXPECT_FALSE(
      InferType(Opcode::kAllGather, {x}, {{"dimension", int64_t{0}}, {"replicas", big}}).ok());
  EXPECT_FALSE(
      InferType(Opcode::kReshape, {x}, {{"shape", std::vector<int64_t>{big, big, 0}}}).ok());
  Type huge{DType::kF32, Shape{big, big}};
  EXPECT_FALSE(InferType(Opcode::kNeg, {huge}, {}).ok());
}

}  // namespace
}  // namespace kiln::ir
