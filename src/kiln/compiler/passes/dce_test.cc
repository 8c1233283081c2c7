#include "kiln/compiler/passes/dce.h"

#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;

TEST(Dce, RemovesUnusedNodesAndRenumbers) {
  DcePass dce;
  ExpectRewrite(dce, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %dead = exp(%x)
      %dead2 = add(%dead, %x)
      %y = neg(%x)
      %c = constant() {value=1.0} : f32[]
      return y=%y
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = neg(%0)
      return y=%1
    })");
}

TEST(Dce, KeepsUnusedParametersAndOutputOrder) {
  DcePass dce;
  ExpectRewrite(dce, R"(
    graph @g {
      %a = parameter() {index=1, name="a"} : f32[2]
      %dead = exp(%a)
      %b = parameter() {index=0, name="b"} : s32[]
      %y = neg(%a)
      return second=%y, first=%a, again=%y
    })",
                R"(
    graph @g {
      %0 = parameter() {index=1, name="a"} : f32[2]
      %1 = parameter() {index=0, name="b"} : s32[]
      %2 = neg(%0)
      return second=%2, first=%0, again=%2
    })");
}

TEST(Dce, UnchangedWhenEverythingIsLive) {
  DcePass dce;
  ExpectUnchanged(dce, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="unused"} : f32[2]
      %2 = exp(%0)
      return y=%2
    })");
}

TEST(Dce, RandomBitsIsPureAndRemovable) {
  DcePass dce;
  ExpectRewrite(dce, R"(
    graph @g {
      %s = parameter() {index=0, name="seed"} : s64[]
      %r = random_bits(%s, %s) : f32[4]
      return seed=%s
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="seed"} : s64[]
      return seed=%0
    })");
}

}  // namespace
}  // namespace kiln::compiler
