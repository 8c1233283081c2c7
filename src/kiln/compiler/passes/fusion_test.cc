#include "kiln/compiler/passes/fusion.h"

#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;

TEST(Fusion, ChainBecomesOneGroupWithBroadcastsLeftUnmarked) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @sgd {
      %w = parameter() {index=0, name="w"} : f32[4,3]
      %g = parameter() {index=1, name="g"} : f32[4,3]
      %lr = parameter() {index=2, name="lr"} : f32[]
      %b = broadcast_in_dim(%lr) {broadcast_dimensions=[], shape=[4,3]}
      %s = mul(%g, %b)
      %n = sub(%w, %s)
      return w=%n
    })",
                R"(
    graph @sgd {
      %0 = parameter() {index=0, name="w"} : f32[4,3]
      %1 = parameter() {index=1, name="g"} : f32[4,3]
      %2 = parameter() {index=2, name="lr"} : f32[]
      %3 = broadcast_in_dim(%2) {broadcast_dimensions=[], shape=[4,3]}
      %4 = mul(%1, %3) {fusion=0}
      %5 = sub(%0, %4) {fusion=0}
      return w=%5
    })");
}

TEST(Fusion, LeavesTranscendentalsContractionsAndIntegersAlone) {
  FusionPass fusion(FusionOptions{.fuse_matmul_epilogues = false});
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,2]
      %i = parameter() {index=1, name="i"} : s32[2]
      %e = log(%x)
      %a = add(%e, %x)
      %d = dot_general(%a, %a) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %r = relu(%d)
      %j = add(%i, %i)
      return r=%r, j=%j
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,2]
      %1 = parameter() {index=1, name="i"} : s32[2]
      %2 = log(%0)
      %3 = add(%2, %0) {fusion=0}
      %4 = dot_general(%3, %3) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %5 = relu(%4) {fusion=1}
      %6 = add(%1, %1)
      return r=%5, j=%6
    })");
}

// An outside node between two elementwise ops (a -> log -> b, with a -> b as well) would have to
// run both before and after the group: the merge is refused and the two stay separate.
TEST(Fusion, RefusesMergesThatWouldCreateACycle) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[8]
      %a = neg(%x)
      %e = log(%a)
      %b = add(%a, %e)
      return b=%b
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[8]
      %1 = neg(%0) {fusion=0}
      %2 = log(%1)
      %3 = add(%1, %2) {fusion=1}
      return b=%3
    })");
}

// A member used outside the group is an output of the group; the consumer that came before the
// group's last member in the source moves after the group.
TEST(Fusion, MultiOutputGroupsReorderOutsideConsumers) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[8]
      %y = parameter() {index=1, name="y"} : f32[8]
      %a = mul(%x, %y)
      %e = log(%a)
      %b = sub(%a, %y)
      return e=%e, b=%b
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[8]
      %1 = parameter() {index=1, name="y"} : f32[8]
      %2 = mul(%0, %1) {fusion=0}
      %3 = sub(%2, %1) {fusion=0}
      %4 = log(%2)
      return e=%4, b=%3
    })");
}

TEST(Fusion, DifferentShapesAreDifferentGroups) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[4]
      %s = parameter() {index=1, name="s"} : f32[]
      %t = mul(%s, %s)
      %b = broadcast_in_dim(%t) {broadcast_dimensions=[], shape=[4]}
      %y = add(%x, %b)
      return y=%y
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[4]
      %1 = parameter() {index=1, name="s"} : f32[]
      %2 = mul(%1, %1) {fusion=0}
      %3 = broadcast_in_dim(%2) {broadcast_dimensions=[], shape=[4]}
      %4 = add(%0, %3) {fusion=1}
      return y=%4
    })");
}

TEST(Fusion, CompareSelectAndConvertFuseAcrossBoolAndBf16) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @relu_grad {
      %x = parameter() {index=0, name="x"} : bf16[6]
      %g = parameter() {index=1, name="g"} : f32[6]
      %z = constant() {value=0.0} : bf16[]
      %zb = broadcast_in_dim(%z) {broadcast_dimensions=[], shape=[6]}
      %p = compare(%x, %zb) {direction="gt"}
      %c = convert(%x) : f32[6]
      %m = mul(%g, %c)
      %zf = convert(%zb) : f32[6]
      %s = select(%p, %m, %zf)
      return s=%s
    })",
                R"(
    graph @relu_grad {
      %0 = parameter() {index=0, name="x"} : bf16[6]
      %1 = parameter() {index=1, name="g"} : f32[6]
      %2 = constant() {value=0.0} : bf16[]
      %3 = broadcast_in_dim(%2) {broadcast_dimensions=[], shape=[6]}
      %4 = compare(%0, %3) {direction="gt", fusion=0}
      %5 = convert(%0) {fusion=0} : f32[6]
      %6 = mul(%1, %5) {fusion=0}
      %7 = convert(%3) {fusion=0} : f32[6]
      %8 = select(%4, %6, %7) {fusion=0}
      return s=%8
    })");
}

TEST(Fusion, GroupSizeIsCapped) {
  FusionPass fusion(FusionOptions{.max_group_size = 2});
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[4]
      %a = neg(%x)
      %b = neg(%a)
      %c = neg(%b)
      return c=%c
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[4]
      %1 = neg(%0) {fusion=0}
      %2 = neg(%1) {fusion=0}
      %3 = neg(%2) {fusion=1}
      return c=%3
    })");
}

TEST(Fusion, IdempotentAndUnchangedWithoutFusibleOps) {
  FusionPass fusion;
  ExpectUnchanged(fusion, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[4]
      %1 = neg(%0) {fusion=0}
      %2 = log(%1)
      return y=%2
    })");
  ExpectUnchanged(fusion, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[4]
      %1 = log(%0)
      return y=%1
    })");
}

// dot + bias + relu + residual: one output fusion group led by the dot; the bias broadcast stays
// unmarked (the backend reads the bias vector directly).
TEST(Fusion, MatmulEpilogueWithBiasActivationAndResidual) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @ffn {
      %x = parameter() {index=0, name="x"} : f32[4,8]
      %w = parameter() {index=1, name="w"} : f32[8,8]
      %b = parameter() {index=2, name="b"} : f32[8]
      %d = dot_general(%x, %w) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[4,8]}
      %a = add(%d, %bb)
      %r = relu(%a)
      %y = add(%x, %r)
      %z = neg(%y)
      return z=%z
    })",
                R"(
    graph @ffn {
      fusion 0 kind=matmul_epilogue
      fusion 1 kind=loop
      %0 = parameter() {index=0, name="x"} : f32[4,8]
      %1 = parameter() {index=1, name="w"} : f32[8,8]
      %2 = parameter() {index=2, name="b"} : f32[8]
      %3 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[4,8]}
      %4 = dot_general(%0, %1) {fusion=0, lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %5 = add(%4, %3) {fusion=0}
      %6 = relu(%5) {fusion=0}
      %7 = add(%0, %6) {fusion=0}
      %8 = neg(%7) {fusion=1}
      return z=%8
    })");
}

// The pre-activation is also read elsewhere (an output here): only dot + bias fuse, and the relu
// joins a loop group. A broadcast along the wrong dim is neither a bias nor a residual.
TEST(Fusion, MatmulEpilogueStopsAtSharedValuesAndNonBiasBroadcasts) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[4,4]
      %b = parameter() {index=1, name="b"} : f32[4]
      %d = dot_general(%x, %x) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[4,4]}
      %a = add(%d, %bb)
      %r = relu(%a)
      %e = dot_general(%r, %x) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %cb = broadcast_in_dim(%b) {broadcast_dimensions=[0], shape=[4,4]}
      %f = add(%e, %cb)
      return a=%a, r=%r, f=%f
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[4,4]
      %1 = parameter() {index=1, name="b"} : f32[4]
      %2 = broadcast_in_dim(%1) {broadcast_dimensions=[1], shape=[4,4]}
      %3 = dot_general(%0, %0) {fusion=0, lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %4 = add(%3, %2) {fusion=0}
      %5 = relu(%4) {fusion=1}
      %6 = dot_general(%5, %0) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %7 = broadcast_in_dim(%1) {broadcast_dimensions=[0], shape=[4,4]}
      %8 = add(%6, %7) {fusion=2}
      return a=%4, r=%5, f=%8
    })");
}

// Two matmul chains meeting in one add: it is the residual of neither (which one would depend on
// their order), and runs as a loop group; the second chain keeps its bias.
TEST(Fusion, AnAddOfTwoMatmulChainsIsNobodysResidual) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[4,4]
      %b = parameter() {index=1, name="b"} : f32[4]
      %d1 = dot_general(%x, %x) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %d2 = dot_general(%x, %x) {lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[1]}
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[4,4]}
      %a2 = add(%d2, %bb)
      %s = add(%d1, %a2)
      return s=%s
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[4,4]
      %1 = parameter() {index=1, name="b"} : f32[4]
      %2 = dot_general(%0, %0) {lhs_batch=[], lhs_contracting=[1], rhs_batch=[], rhs_contracting=[0]}
      %3 = broadcast_in_dim(%1) {broadcast_dimensions=[1], shape=[4,4]}
      %4 = dot_general(%0, %0) {fusion=0, lhs_batch=[], lhs_contracting=[0], rhs_batch=[], rhs_contracting=[1]}
      %5 = add(%4, %3) {fusion=0}
      %6 = add(%2, %5) {fusion=1}
      return s=%6
    })");
}

// A reduce_sum of a member joins the group as a sink: the squared gradient of a global norm is
// accumulated in the kernel, never stored. A reduction of a parameter has no group to join.
TEST(Fusion, ReductionsJoinTheirOperandsGroup) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      %w = parameter() {index=0, name="w"} : f32[4,8]
      %g = parameter() {index=1, name="g"} : f32[4,8]
      %sq = mul(%g, %g)
      %n = reduce_sum(%sq) {dimensions=[0,1]}
      %cols = reduce_sum(%g) {dimensions=[0]}
      %u = sub(%w, %g)
      %s = sqrt(%n)
      return w=%u, norm=%s, cols=%cols
    })",
                R"(
    graph @g {
      fusion 0 kind=reduction
      fusion 1 kind=loop
      fusion 2 kind=loop
      %0 = parameter() {index=0, name="w"} : f32[4,8]
      %1 = parameter() {index=1, name="g"} : f32[4,8]
      %2 = mul(%1, %1) {fusion=0}
      %3 = reduce_sum(%2) {dimensions=[0,1], fusion=0}
      %4 = reduce_sum(%1) {dimensions=[0]}
      %5 = sub(%0, %1) {fusion=1}
      %6 = sqrt(%3) {fusion=2}
      return w=%5, norm=%6, cols=%4
    })");
}

// A convolution takes a bias along its channels and an activation; a residual add stays a loop.
TEST(Fusion, ConvolutionEpilogueBiasAndActivation) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @cnn {
      %x = parameter() {index=0, name="x"} : f32[1,2,4,4]
      %f = parameter() {index=1, name="f"} : f32[3,2,3,3]
      %b = parameter() {index=2, name="b"} : f32[3]
      %c = conv2d(%x, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[1,3,4,4]}
      %a = add(%c, %bb)
      %r = relu(%a)
      %y = add(%r, %r)
      return y=%y
    })",
                R"(
    graph @cnn {
      fusion 0 kind=conv_epilogue
      fusion 1 kind=loop
      %0 = parameter() {index=0, name="x"} : f32[1,2,4,4]
      %1 = parameter() {index=1, name="f"} : f32[3,2,3,3]
      %2 = parameter() {index=2, name="b"} : f32[3]
      %3 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[1,3,4,4]}
      %4 = conv2d(%0, %1) {dilation=[1,1], fusion=0, groups=1, padding=[1,1,1,1], strides=[1,1]}
      %5 = add(%4, %3) {fusion=0}
      %6 = relu(%5) {fusion=0}
      %7 = add(%6, %6) {fusion=1}
      return y=%7
    })");
}

// A convolution takes its residual before the activation (ResNet: relu(conv(x) + b + skip)), as
// oneDNN's binary-add and eltwise post-ops; the skip may end another convolution's chain that has
// its activation already.
TEST(Fusion, ConvolutionEpilogueResidualBeforeActivation) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @cnn {
      %x = parameter() {index=0, name="x"} : f32[1,2,4,4]
      %f = parameter() {index=1, name="f"} : f32[2,2,3,3]
      %b = parameter() {index=2, name="b"} : f32[2]
      %c0 = conv2d(%x, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      %s = relu(%c0)
      %c = conv2d(%s, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[1,2,4,4]}
      %a = add(%c, %bb)
      %r = add(%a, %s)
      %y = relu(%r)
      return y=%y
    })",
                R"(
    graph @cnn {
      fusion 0 kind=conv_epilogue
      fusion 1 kind=conv_epilogue
      %0 = parameter() {index=0, name="x"} : f32[1,2,4,4]
      %1 = parameter() {index=1, name="f"} : f32[2,2,3,3]
      %2 = parameter() {index=2, name="b"} : f32[2]
      %3 = conv2d(%0, %1) {dilation=[1,1], fusion=0, groups=1, padding=[1,1,1,1], strides=[1,1]}
      %4 = relu(%3) {fusion=0}
      %5 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[1,2,4,4]}
      %6 = conv2d(%4, %1) {dilation=[1,1], fusion=1, groups=1, padding=[1,1,1,1], strides=[1,1]}
      %7 = add(%6, %5) {fusion=1}
      %8 = add(%7, %4) {fusion=1}
      %9 = relu(%8) {fusion=1}
      return y=%9
    })");
}

// Two convolution chains without an activation meeting in one add (a projection shortcut): the
// add is the residual of neither, whichever convolution comes first; it stays a loop.
TEST(Fusion, TwoOpenConvolutionChainsShareNoResidual) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @cnn {
      %x = parameter() {index=0, name="x"} : f32[1,2,4,4]
      %f = parameter() {index=1, name="f"} : f32[2,2,3,3]
      %b = parameter() {index=2, name="b"} : f32[2]
      %c0 = conv2d(%x, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      %c1 = conv2d(%x, %f) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      %bb = broadcast_in_dim(%b) {broadcast_dimensions=[1], shape=[1,2,4,4]}
      %a1 = add(%c1, %bb)
      %r = add(%c0, %a1)
      %y = relu(%r)
      return y=%y
    })",
                R"(
    graph @cnn {
      fusion 0 kind=conv_epilogue
      fusion 1 kind=loop
      %0 = parameter() {index=0, name="x"} : f32[1,2,4,4]
      %1 = parameter() {index=1, name="f"} : f32[2,2,3,3]
      %2 = parameter() {index=2, name="b"} : f32[2]
      %3 = conv2d(%0, %1) {dilation=[1,1], groups=1, padding=[1,1,1,1], strides=[1,1]}
      %4 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[1,2,4,4]}
      %5 = conv2d(%0, %1) {dilation=[1,1], fusion=0, groups=1, padding=[1,1,1,1], strides=[1,1]}
      %6 = add(%5, %4) {fusion=0}
      %7 = add(%3, %6) {fusion=1}
      %8 = relu(%7) {fusion=1}
      return y=%8
    })");
}

// The pass rewrites the whole table: stale groups (a wrong kind, an unused id) are recomputed, and
// a second run leaves the result alone.
TEST(Fusion, RewritesAStaleGroupTable) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      fusion 4 kind=reduction
      fusion 9 kind=loop
      %x = parameter() {index=0, name="x"} : f32[8]
      %s = reduce_sum(%x) {dimensions=[0], fusion=4}
      %a = neg(%x) {fusion=9}
      %b = abs(%a) {fusion=9}
      return a=%b, s=%s
    })",
                R"(
    graph @g {
      fusion 0 kind=loop
      %0 = parameter() {index=0, name="x"} : f32[8]
      %1 = reduce_sum(%0) {dimensions=[0]}
      %2 = neg(%0) {fusion=0}
      %3 = abs(%2) {fusion=0}
      return a=%3, s=%1
    })");
}

// A generator (here a one-hot: a compare of broadcast views, converted) read by two groups is
// copied into each of them instead of being stored by one and reloaded by the other: the
// cross-entropy gradient reads the one-hot after a reduction that also reads it.
TEST(Fusion, GeneratorsAreCopiedIntoEachGroupThatReadsThem) {
  FusionPass fusion;
  ExpectRewrite(fusion, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,4]
      %l = parameter() {index=1, name="l"} : f32[2]
      %io = iota() {dimension=0} : f32[4]
      %bi = broadcast_in_dim(%io) {broadcast_dimensions=[1], shape=[2,4]}
      %bl = broadcast_in_dim(%l) {broadcast_dimensions=[0], shape=[2,4]}
      %eq = compare(%bi, %bl) {direction="eq"}
      %oh = convert(%eq) : f32[2,4]
      %m = mul(%x, %oh)
      %p = reduce_sum(%m) {dimensions=[1]}
      %bp = broadcast_in_dim(%p) {broadcast_dimensions=[0], shape=[2,4]}
      %d = sub(%x, %bp)
      %gr = sub(%d, %oh)
      return p=%p, g=%gr
    })",
                R"(
    graph @g {
      fusion 0 kind=reduction
      fusion 1 kind=loop
      %0 = parameter() {index=0, name="x"} : f32[2,4]
      %1 = parameter() {index=1, name="l"} : f32[2]
      %2 = iota() {dimension=0} : f32[4]
      %3 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[2,4]}
      %4 = broadcast_in_dim(%1) {broadcast_dimensions=[0], shape=[2,4]}
      %5 = compare(%3, %4) {direction="eq", fusion=0}
      %6 = convert(%5) {fusion=0} : f32[2,4]
      %7 = mul(%0, %6) {fusion=0}
      %8 = reduce_sum(%7) {dimensions=[1], fusion=0}
      %9 = broadcast_in_dim(%8) {broadcast_dimensions=[0], shape=[2,4]}
      %10 = sub(%0, %9) {fusion=1}
      %11 = compare(%3, %4) {direction="eq", fusion=1}
      %12 = convert(%11) {fusion=1} : f32[2,4]
      %13 = sub(%10, %12) {fusion=1}
      return p=%8, g=%13
    })");
}

}  // namespace
}  // namespace kiln::compiler
