#include "kiln/compiler/passes/cse.h"

#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;

TEST(Cse, MergesDuplicatedSubgraphInOneRun) {
  CsePass cse;
  ExpectRewrite(cse, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %a1 = exp(%x)
      %b1 = mul(%a1, %x)
      %a2 = exp(%x)
      %b2 = mul(%a2, %x)
      %s = add(%b1, %b2)
      return s=%s, b2=%b2
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = exp(%0)
      %2 = mul(%1, %0)
      %3 = add(%2, %2)
      return s=%3, b2=%2
    })");
}

TEST(Cse, CommutativeOperandsMatchInEitherOrder) {
  CsePass cse;
  ExpectRewrite(cse, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %y = parameter() {index=1, name="y"} : f32[2]
      %a = add(%x, %y)
      %b = add(%y, %x)
      %e1 = compare(%x, %y) {direction="eq"}
      %e2 = compare(%y, %x) {direction="eq"}
      %s = sub(%a, %b)
      return s=%s, e1=%e1, e2=%e2
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="y"} : f32[2]
      %2 = add(%0, %1)
      %3 = compare(%0, %1) {direction="eq"}
      %4 = sub(%2, %2)
      return s=%4, e1=%3, e2=%3
    })");
}

TEST(Cse, NonCommutativeOperandOrderMatters) {
  CsePass cse;
  ExpectUnchanged(cse, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="y"} : f32[2]
      %2 = sub(%0, %1)
      %3 = sub(%1, %0)
      %4 = compare(%0, %1) {direction="lt"}
      %5 = compare(%1, %0) {direction="lt"}
      return a=%2, b=%3, c=%4, d=%5
    })");
}

TEST(Cse, ConstantsByLiteralBytes) {
  CsePass cse;
  // 0.0 and -0.0 compare equal as numbers but are different constants; equal bytes merge.
  ExpectRewrite(cse, R"(
    graph @g {
      %a = constant() {value=0.0} : f32[]
      %b = constant() {value=-0.0} : f32[]
      %c = constant() {value=0x00000000} : f32[]
      %d = constant() {value=0.0} : f64[]
      %e = constant() {value=[1,2]} : s32[2]
      %f = constant() {value=[1,2]} : s32[2]
      %g = constant() {value=[1,3]} : s32[2]
      return a=%a, b=%b, c=%c, d=%d, e=%e, f=%f, g=%g
    })",
                R"(
    graph @g {
      %0 = constant() {value=0.0} : f32[]
      %1 = constant() {value=-0.0} : f32[]
      %2 = constant() {value=0.0} : f64[]
      %3 = constant() {value=[1,2]} : s32[2]
      %4 = constant() {value=[1,3]} : s32[2]
      return a=%0, b=%1, c=%0, d=%2, e=%3, f=%3, g=%4
    })");
}

TEST(Cse, AttributesMustBeIdenticalBitForBit) {
  CsePass cse;
  ExpectUnchanged(cse, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = pad(%0) {high=[1], interior=[0], low=[0], value=0.0}
      %2 = pad(%0) {high=[1], interior=[0], low=[0], value=-0.0}
      %3 = reduce_sum(%0) {dimensions=[0]}
      %4 = slice(%0) {limit=[1], start=[0], stride=[1]}
      %5 = slice(%0) {limit=[2], start=[1], stride=[1]}
      return a=%1, b=%2, c=%3, d=%4, e=%5
    })");
}

TEST(Cse, DeclaredTypesMustMatch) {
  CsePass cse;
  ExpectUnchanged(cse, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = convert(%0) : bf16[2]
      %2 = convert(%0) : f16[2]
      %3 = iota() {dimension=0} : s32[3]
      %4 = iota() {dimension=0} : s64[3]
      return a=%1, b=%2, c=%3, d=%4
    })");
}

TEST(Cse, RandomBitsIsPureSoEqualCallsMerge) {
  CsePass cse;
  ExpectRewrite(cse, R"(
    graph @g {
      %s = parameter() {index=0, name="seed"} : s64[]
      %c = parameter() {index=1, name="counter"} : s64[]
      %r1 = random_bits(%s, %c) : f32[4]
      %r2 = random_bits(%s, %c) : f32[4]
      %r3 = random_bits(%c, %s) : f32[4]
      %r4 = random_bits(%s, %c) : s32[4]
      return a=%r1, b=%r2, c=%r3, d=%r4
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="seed"} : s64[]
      %1 = parameter() {index=1, name="counter"} : s64[]
      %2 = random_bits(%0, %1) : f32[4]
      %3 = random_bits(%1, %0) : f32[4]
      %4 = random_bits(%0, %1) : s32[4]
      return a=%2, b=%2, c=%3, d=%4
    })");
}

TEST(Cse, ParametersNeverMerge) {
  CsePass cse;
  ExpectUnchanged(cse, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="y"} : f32[2]
      %2 = add(%0, %1)
      return s=%2
    })");
}

TEST(Cse, LeavesPreexistingDeadCodeToDce) {
  CsePass cse;
  // The duplicate is merged; the unrelated dead exp stays (removing it is DCE's job).
  ExpectRewrite(cse, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %dead = exp(%x)
      %a = neg(%x)
      %b = neg(%x)
      %s = add(%a, %b)
      return s=%s
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = exp(%0)
      %2 = neg(%0)
      %3 = add(%2, %2)
      return s=%3
    })");
}

}  // namespace
}  // namespace kiln::compiler
