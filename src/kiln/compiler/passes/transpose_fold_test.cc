#include "kiln/compiler/passes/transpose_fold.h"

#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;

TEST(TransposeFold, MatrixTransposeOnEitherSide) {
  TransposeFoldPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %a = parameter() {index=0, name="a"} : f32[3,2]
      %b = parameter() {index=1, name="b"} : f32[4,3]
      %at = transpose(%a) {permutation=[1,0]}
      %bt = transpose(%b) {permutation=[1,0]}
      %d = dot_general(%at, %bt) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      return d=%d
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[3,2]
      %1 = parameter() {index=1, name="b"} : f32[4,3]
      %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[1]} : f32[2,4]
      return d=%2
    })");
}

TEST(TransposeFold, BatchedOperandKeepsResultLayout) {
  TransposeFoldPass pass;
  // lhs = transpose(x: [B,K,M] -> [B,M,K]); free dim M maps to x dim 2: a single free dim is
  // always in order.
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[5,3,2]
      %w = parameter() {index=1, name="w"} : f32[5,3,4]
      %xt = transpose(%x) {permutation=[0,2,1]}
      %d = dot_general(%xt, %w) {lhs_batch=[0], lhs_contracting=[2], rhs_batch=[0], rhs_contracting=[1]}
      return d=%d
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[5,3,2]
      %1 = parameter() {index=1, name="w"} : f32[5,3,4]
      %2 = dot_general(%0, %1) {lhs_batch=[0], lhs_contracting=[1], rhs_batch=[0], rhs_contracting=[1]} : f32[5,2,4]
      return d=%2
    })");
}

TEST(TransposeFold, FreeDimsThatWouldReorderStay) {
  TransposeFoldPass pass;
  // lhs free dims (0, 1) of the transpose map to x dims (1, 0): folding would swap them in the
  // result.
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,3,4]
      %1 = parameter() {index=1, name="w"} : f32[4,5]
      %2 = transpose(%0) {permutation=[1,0,2]}
      %3 = dot_general(%2, %1) {lhs_batch=[], lhs_contracting=[2], rhs_batch=[], rhs_contracting=[0]}
      return d=%3
    })");
}

TEST(TransposeFold, TransposeWithOtherUsersStays) {
  TransposeFoldPass pass;
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[3,2]
      %1 = parameter() {index=1, name="b"} : f32[3,4]
      %2 = transpose(%0) {permutation=[1,0]}
      %3 = dot_general(%2, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %4 = exp(%2)
      return d=%3, e=%4
    })");
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[3,2]
      %1 = parameter() {index=1, name="b"} : f32[3,4]
      %2 = transpose(%0) {permutation=[1,0]}
      %3 = dot_general(%2, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      return d=%3, t=%2
    })");
}

TEST(TransposeFold, SharedByTwoDots) {
  TransposeFoldPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %a = parameter() {index=0, name="a"} : f32[3,2]
      %b = parameter() {index=1, name="b"} : f32[3,4]
      %at = transpose(%a) {permutation=[1,0]}
      %d1 = dot_general(%at, %b) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %d2 = dot_general(%at, %at) {lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[0]}
      return d1=%d1, d2=%d2
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[3,2]
      %1 = parameter() {index=1, name="b"} : f32[3,4]
      %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[0]} : f32[2,4]
      %3 = dot_general(%0, %0) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[1]} : f32[3,3]
      return d1=%2, d2=%3
    })");
}

TEST(TransposeFold, TransposedDotResultSwapsOperands) {
  TransposeFoldPass pass;
  // The weight-gradient pattern autodiff emits: transpose(dot(dy, x)) -> dot(x, dy).
  ExpectRewrite(pass, R"(
    graph @g {
      %dy = parameter() {index=0, name="dy"} : f32[6,4]
      %x = parameter() {index=1, name="x"} : f32[6,16]
      %d = dot_general(%dy, %x) {lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[0]}
      %t = transpose(%d) {permutation=[1,0]}
      return g=%t
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="dy"} : f32[6,4]
      %1 = parameter() {index=1, name="x"} : f32[6,16]
      %2 = dot_general(%1, %0) {lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[0]} : f32[16,4]
      return g=%2
    })");
  // Batched, with two free dims on the lhs: [B, L1, L2, R] -> [B, R, L1, L2].
  ExpectRewrite(pass, R"(
    graph @g {
      %a = parameter() {index=0, name="a"} : f32[2,3,4,5]
      %b = parameter() {index=1, name="b"} : f32[2,5,7]
      %d = dot_general(%a, %b) {lhs_batch=[0], lhs_contracting=[3], rhs_batch=[0], rhs_contracting=[1]}
      %t = transpose(%d) {permutation=[0,3,1,2]}
      return g=%t
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[2,3,4,5]
      %1 = parameter() {index=1, name="b"} : f32[2,5,7]
      %2 = dot_general(%1, %0) {lhs_batch=[0], lhs_contracting=[1], rhs_batch=[0], rhs_contracting=[3]} : f32[2,7,3,4]
      return g=%2
    })");
}

TEST(TransposeFold, TransposedDotResultLeftAloneWhenNotASwap) {
  TransposeFoldPass pass;
  // The dot has another user.
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[2,3]
      %1 = parameter() {index=1, name="b"} : f32[3,4]
      %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %3 = transpose(%2) {permutation=[1,0]}
      return t=%3, d=%2
    })");
  // The permutation mixes the lhs free dims: not expressible by swapping operands.
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[3,4,5]
      %1 = parameter() {index=1, name="b"} : f32[5,7]
      %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contracting=[2], rhs_batch=[], rhs_contracting=[0]}
      %3 = transpose(%2) {permutation=[2,1,0]}
      return t=%3
    })");
}

}  // namespace
}  // namespace kiln::compiler
