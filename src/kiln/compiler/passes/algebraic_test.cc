#include "kiln/compiler/passes/algebraic.h"

#include "gtest/gtest.h"
#include "kiln/compiler/passes/internal/pass_test_util.h"

namespace kiln::compiler {
namespace {

using testing::ExpectRewrite;
using testing::ExpectUnchanged;

TEST(Algebraic, AddSubZeroMulDivOne) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,3]
      %z = constant() {value=0.0} : f32[]
      %zb = broadcast_in_dim(%z) {broadcast_dimensions=[], shape=[2,3]}
      %o = constant() {value=1.0} : f32[2,3]
      %nz = constant() {value=-0.0} : f32[3]
      %nzb = broadcast_in_dim(%nz) {broadcast_dimensions=[1], shape=[2,3]}
      %a = add(%x, %zb)
      %b = add(%zb, %a)
      %c = sub(%b, %nzb)
      %d = mul(%c, %o)
      %e = mul(%o, %d)
      %f = div(%e, %o)
      return f=%f
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,3]
      return f=%0
    })");
}

TEST(Algebraic, NotZeroOrOneIsLeftAlone) {
  AlgebraicSimplifierPass pass;
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = constant() {value=[0,1]} : f32[2]
      %2 = add(%0, %1)
      %3 = mul(%0, %1)
      %4 = constant() {value=1.0} : f32[2]
      %5 = sub(%0, %4)
      %6 = div(%4, %0)
      %7 = constant() {value=0.0} : f32[2]
      %8 = sub(%7, %0)
      return a=%2, b=%3, c=%5, d=%6, e=%8
    })");
}

TEST(Algebraic, MulByZeroOnlyForIntegers) {
  AlgebraicSimplifierPass pass;
  // Floats keep x * 0 (NaN * 0 and inf * 0 are NaN).
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = constant() {value=0.0} : f32[2]
      %2 = mul(%0, %1)
      return y=%2
    })");
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : s32[2]
      %z = constant() {value=0} : s32[]
      %zb = broadcast_in_dim(%z) {broadcast_dimensions=[], shape=[2]}
      %m = mul(%x, %zb)
      %n = mul(%zb, %x)
      return m=%m, n=%n
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : s32[2]
      %1 = constant() {value=0} : s32[]
      %2 = broadcast_in_dim(%1) {broadcast_dimensions=[], shape=[2]}
      return m=%2, n=%2
    })");
}

TEST(Algebraic, DoubleNegation) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %a = neg(%x)
      %b = neg(%a)
      %c = neg(%b)
      %d = neg(%c)
      %e = neg(%d)
      return a=%a, e=%e
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = neg(%0)
      %2 = neg(%0)
      return a=%1, e=%2
    })");  // merging the two negations is CSE's job
}

TEST(Algebraic, TransposeCompositionAndIdentity) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,3,4]
      %i = transpose(%x) {permutation=[0,1,2]}
      %t1 = transpose(%i) {permutation=[1,2,0]}
      %t2 = transpose(%t1) {permutation=[2,0,1]}
      %u1 = transpose(%x) {permutation=[1,0,2]}
      %u2 = transpose(%u1) {permutation=[0,2,1]}
      %u3 = exp(%u2)
      return back=%t2, composed=%u3
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,3,4]
      %1 = transpose(%0) {permutation=[1,2,0]}
      %2 = exp(%1)
      return back=%0, composed=%2
    })");
}

TEST(Algebraic, ReshapeChains) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,6]
      %r0 = reshape(%x) {shape=[2,6]}
      %r1 = reshape(%r0) {shape=[12]}
      %r2 = reshape(%r1) {shape=[3,4]}
      %r3 = reshape(%r2) {shape=[2,6]}
      %r4 = reshape(%r2) {shape=[4,3]}
      return same=%r3, other=%r4
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,6]
      %1 = reshape(%0) {shape=[4,3]}
      return same=%0, other=%1
    })");
}

TEST(Algebraic, BroadcastIdentityAndComposition) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[3]
      %y = parameter() {index=1, name="y"} : f32[2,3]
      %i = broadcast_in_dim(%y) {broadcast_dimensions=[0,1], shape=[2,3]}
      %b1 = broadcast_in_dim(%x) {broadcast_dimensions=[1], shape=[2,3]}
      %b2 = broadcast_in_dim(%b1) {broadcast_dimensions=[0,2], shape=[2,5,3]}
      %s = reduce_sum(%b2) {dimensions=[1]}
      %t = add(%s, %i)
      return t=%t
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[3]
      %1 = parameter() {index=1, name="y"} : f32[2,3]
      %2 = broadcast_in_dim(%0) {broadcast_dimensions=[2], shape=[2,5,3]}
      %3 = reduce_sum(%2) {dimensions=[1]}
      %4 = add(%3, %1)
      return t=%4
    })");
  // A size-1 dim that stretches is a real broadcast.
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[1,3]
      %1 = broadcast_in_dim(%0) {broadcast_dimensions=[0,1], shape=[2,3]}
      return y=%1
    })");
}

TEST(Algebraic, ConvertSameDtypeAndExactRoundTrips) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %b = parameter() {index=1, name="b"} : bf16[2]
      %i = parameter() {index=2, name="i"} : s8[2]
      %same = convert(%x) : f32[2]
      %up = convert(%same) : f64[2]
      %down = convert(%up) : f32[2]
      %bw = convert(%b) : f32[2]
      %bh = convert(%bw) : f16[2]
      %iw = convert(%i) : s32[2]
      %if = convert(%iw) : f32[2]
      return x=%down, h=%bh, f=%if
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="b"} : bf16[2]
      %2 = parameter() {index=2, name="i"} : s8[2]
      %3 = convert(%1) : f16[2]
      %4 = convert(%2) : f32[2]
      return x=%0, h=%3, f=%4
    })");
}

TEST(Algebraic, LossyConvertPairsAreLeftAlone) {
  AlgebraicSimplifierPass pass;
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = convert(%0) : bf16[2]
      %2 = convert(%1) : f32[2]
      %3 = parameter() {index=1, name="i"} : s32[2]
      %4 = convert(%3) : f32[2]
      %5 = convert(%4) : s32[2]
      %6 = convert(%0) : s32[2]
      %7 = convert(%6) : f32[2]
      %8 = parameter() {index=2, name="h"} : f16[2]
      %9 = convert(%8) : bf16[2]
      %10 = convert(%9) : f16[2]
      return a=%2, b=%5, c=%7, d=%10
    })");
}

TEST(Algebraic, ConvertIsExactTable) {
  EXPECT_TRUE(ConvertIsExact(DType::kF32, DType::kF64));
  EXPECT_TRUE(ConvertIsExact(DType::kBF16, DType::kF32));
  EXPECT_TRUE(ConvertIsExact(DType::kF16, DType::kF32));
  EXPECT_TRUE(ConvertIsExact(DType::kU8, DType::kBF16));
  EXPECT_TRUE(ConvertIsExact(DType::kF8E4M3, DType::kBF16));
  EXPECT_TRUE(ConvertIsExact(DType::kF8E5M2, DType::kF16));
  EXPECT_TRUE(ConvertIsExact(DType::kBool, DType::kF8E4M3));
  EXPECT_FALSE(ConvertIsExact(DType::kF64, DType::kF32));
  EXPECT_FALSE(ConvertIsExact(DType::kS32, DType::kF32));
  EXPECT_FALSE(ConvertIsExact(DType::kS64, DType::kF64));
  EXPECT_FALSE(ConvertIsExact(DType::kF16, DType::kBF16));
  EXPECT_FALSE(ConvertIsExact(DType::kBF16, DType::kF16));
  EXPECT_FALSE(ConvertIsExact(DType::kU8, DType::kS8));
  EXPECT_FALSE(ConvertIsExact(DType::kF32, DType::kS64));
  // Exhaustive check of the 16-bit and 8-bit float claims: every bit pattern round-trips (NaN to
  // NaN).
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (f == f) ASSERT_EQ(FloatToBf16(f), b);
    float h = F16ToFloat(static_cast<uint16_t>(b));
    if (h == h) ASSERT_EQ(FloatToF16(h), b);
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (DType wide : {DType::kF16, DType::kBF16}) {
      float v = F8E4M3ToFloat(static_cast<uint8_t>(b));
      if (v != v) continue;
      float w = wide == DType::kF16 ? F16ToFloat(FloatToF16(v)) : Bf16ToFloat(FloatToBf16(v));
      ASSERT_EQ(w, v) << b;
      ASSERT_EQ(FloatToF8E4M3(w), b);
      float v2 = F8E5M2ToFloat(static_cast<uint8_t>(b));
      if (v2 != v2) continue;
      float w2 = wide == DType::kF16 ? F16ToFloat(FloatToF16(v2)) : Bf16ToFloat(FloatToBf16(v2));
      ASSERT_EQ(w2, v2) << b;
      ASSERT_EQ(FloatToF8E5M2(w2), b);
    }
  }
}

TEST(Algebraic, SelectWithConstantPredicateOrEqualBranches) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2]
      %y = parameter() {index=1, name="y"} : f32[2]
      %p = parameter() {index=2, name="p"} : bool[2]
      %t = constant() {value=true} : bool[]
      %tb = broadcast_in_dim(%t) {broadcast_dimensions=[], shape=[2]}
      %f = constant() {value=false} : bool[2]
      %a = select(%tb, %x, %y)
      %b = select(%f, %x, %y)
      %c = select(%p, %x, %x)
      return a=%a, b=%b, c=%c
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="y"} : f32[2]
      %2 = parameter() {index=2, name="p"} : bool[2]
      return a=%0, b=%1, c=%0
    })");
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2]
      %1 = parameter() {index=1, name="y"} : f32[2]
      %2 = constant() {value=[true,false]} : bool[2]
      %3 = select(%2, %0, %1)
      return a=%3
    })");
}

TEST(Algebraic, SelectOfOneAndZeroIsAConvert) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %p = parameter() {index=0, name="p"} : bool[2,3]
      %one = constant() {value=1.0} : f64[]
      %zero = constant() {value=0.0} : f64[]
      %o = broadcast_in_dim(%one) {broadcast_dimensions=[], shape=[2,3]}
      %z = broadcast_in_dim(%zero) {broadcast_dimensions=[], shape=[2,3]}
      %s = select(%p, %o, %z)
      return s=%s
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="p"} : bool[2,3]
      %1 = convert(%0) : f64[2,3]
      return s=%1
    })");
  // -0.0 on the false side, or the branches the other way round: kept.
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="p"} : bool[2]
      %1 = constant() {value=1.0} : f32[2]
      %2 = constant() {value=-0.0} : f32[2]
      %3 = constant() {value=0.0} : f32[2]
      %4 = select(%0, %1, %2)
      %5 = select(%0, %3, %1)
      return a=%4, b=%5
    })");
}

TEST(Algebraic, FullSlice) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[2,3]
      %s = slice(%x) {limit=[2,3], start=[0,0], stride=[1,1]}
      %e = exp(%s)
      return e=%e
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,3]
      %1 = exp(%0)
      return e=%1
    })");
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,3]
      %1 = slice(%0) {limit=[2,3], start=[0,1], stride=[1,1]}
      %2 = slice(%0) {limit=[2,3], start=[0,0], stride=[1,2]}
      return a=%1, b=%2
    })");
}

TEST(Algebraic, RewritesOnlyOrphanedNodes) {
  AlgebraicSimplifierPass pass;
  // The zero constant still feeds another output, so it stays; the pre-existing dead exp stays
  // too (that is DCE's job).
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[]
      %dead = exp(%x)
      %z = constant() {value=0.0} : f32[]
      %a = add(%x, %z)
      %b = mul(%a, %x)
      return b=%b, z=%z
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[]
      %1 = exp(%0)
      %2 = constant() {value=0.0} : f32[]
      %3 = mul(%0, %0)
      return b=%3, z=%2
    })");
}

// The gradient of three slices of a fused projection: a sum of zero pads that tile the last dim
// becomes one concatenate (in slot order, whatever the add order), and an empty pad goes away.
TEST(Algebraic, SumOfTilingPadsIsAConcatenate) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %q = parameter() {index=0, name="q"} : f32[2,4]
      %k = parameter() {index=1, name="k"} : f32[2,4]
      %v = parameter() {index=2, name="v"} : f32[2,4]
      %pv = pad(%v) {high=[0,0], interior=[0,0], low=[0,8], value=0.0}
      %pk = pad(%k) {high=[0,4], interior=[0,0], low=[0,4], value=0.0}
      %pq = pad(%q) {high=[0,8], interior=[0,0], low=[0,0], value=0.0}
      %s1 = add(%pv, %pk)
      %s2 = add(%s1, %pq)
      %same = pad(%q) {high=[0,0], interior=[0,0], low=[0,0], value=1.0}
      return g=%s2, same=%same
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="q"} : f32[2,4]
      %1 = parameter() {index=1, name="k"} : f32[2,4]
      %2 = parameter() {index=2, name="v"} : f32[2,4]
      %3 = concatenate(%0, %1, %2) {dimension=1}
      return g=%3, same=%0
    })");
}

// Overlapping slots, a gap, padding along two dims, or a nonzero pad value stay as they are.
TEST(Algebraic, PadsThatDoNotTileStay) {
  AlgebraicSimplifierPass pass;
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="a"} : f32[2,4]
      %1 = pad(%0) {high=[0,4], interior=[0,0], low=[0,0], value=0.0}
      %2 = pad(%0) {high=[0,2], interior=[0,0], low=[0,2], value=0.0}
      %3 = add(%1, %2)
      %4 = pad(%0) {high=[0,5], interior=[0,0], low=[0,0], value=0.0}
      %5 = pad(%0) {high=[0,0], interior=[0,0], low=[0,5], value=0.0}
      %6 = add(%4, %5)
      %7 = pad(%0) {high=[1,4], interior=[0,0], low=[0,0], value=0.0}
      %8 = pad(%0) {high=[0,0], interior=[0,0], low=[1,4], value=0.0}
      %9 = add(%7, %8)
      %10 = pad(%0) {high=[0,4], interior=[0,0], low=[0,0], value=1.0}
      %11 = pad(%0) {high=[0,0], interior=[0,0], low=[0,4], value=0.0}
      %12 = add(%10, %11)
      return a=%3, b=%6, c=%9, d=%12
    })");
}

// A gradient summed with a scatter into zeros (a tied embedding) becomes one scatter into it, in
// either operand order; a scatter into something else than zeros, or of another type, stays.
TEST(Algebraic, AddOfAScatterIntoZerosScattersIntoTheOtherOperand) {
  AlgebraicSimplifierPass pass;
  ExpectRewrite(pass, R"(
    graph @g {
      %x = parameter() {index=0, name="x"} : f32[5,3]
      %i = parameter() {index=1, name="i"} : s32[4]
      %u = parameter() {index=2, name="u"} : f32[4,3]
      %z = constant() {value=0.0} : f32[]
      %zb = broadcast_in_dim(%z) {broadcast_dimensions=[], shape=[5,3]}
      %s = scatter_add(%zb, %i, %u) {axis=0}
      %a = add(%x, %s)
      %b = add(%s, %a)
      return b=%b
    })",
                R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[5,3]
      %1 = parameter() {index=1, name="i"} : s32[4]
      %2 = parameter() {index=2, name="u"} : f32[4,3]
      %3 = scatter_add(%0, %1, %2) {axis=0}
      %4 = scatter_add(%3, %1, %2) {axis=0}
      return b=%4
    })");
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[5,3]
      %1 = parameter() {index=1, name="i"} : s32[4]
      %2 = parameter() {index=2, name="u"} : f32[4,3]
      %3 = constant() {value=1.0} : f32[]
      %4 = broadcast_in_dim(%3) {broadcast_dimensions=[], shape=[5,3]}
      %5 = scatter_add(%4, %1, %2) {axis=0}
      %6 = add(%0, %5)
      return a=%6
    })");
}

// The label-pick rule (reduce_sum of select(iota == labels, x, 0) -> a gather) needs exactly that
// form: an iota offset by a shard start (a tensor-parallel program), float labels that need not
// be integers, or a sum over another dim stay as they are. (cpu_backend_test checks the rewrite
// and its results.)
TEST(Algebraic, LabelPickNeedsAWholeIotaAndIntegerLabels) {
  AlgebraicSimplifierPass pass;
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,6]
      %1 = parameter() {index=1, name="l"} : s32[2]
      %2 = iota() {dimension=0} : f32[6]
      %3 = constant() {value=6.0} : f32[]
      %4 = broadcast_in_dim(%3) {broadcast_dimensions=[], shape=[6]}
      %5 = add(%2, %4)
      %6 = broadcast_in_dim(%5) {broadcast_dimensions=[1], shape=[2,6]}
      %7 = convert(%1) : f32[2]
      %8 = broadcast_in_dim(%7) {broadcast_dimensions=[0], shape=[2,6]}
      %9 = compare(%6, %8) {direction="eq"}
      %10 = constant() {value=0.0} : f32[]
      %11 = broadcast_in_dim(%10) {broadcast_dimensions=[], shape=[2,6]}
      %12 = select(%9, %0, %11)
      %13 = reduce_sum(%12) {dimensions=[1]}
      return p=%13
    })");
  ExpectUnchanged(pass, R"(
    graph @g {
      %0 = parameter() {index=0, name="x"} : f32[2,6]
      %1 = parameter() {index=1, name="l"} : f32[2]
      %2 = iota() {dimension=0} : f32[6]
      %3 = broadcast_in_dim(%2) {broadcast_dimensions=[1], shape=[2,6]}
      %4 = broadcast_in_dim(%1) {broadcast_dimensions=[0], shape=[2,6]}
      %5 = compare(%3, %4) {direction="eq"}
      %6 = constant() {value=0.0} : f32[]
      %7 = broadcast_in_dim(%6) {broadcast_dimensions=[], shape=[2,6]}
      %8 = select(%5, %0, %7)
      %9 = reduce_sum(%8) {dimensions=[1]}
      %10 = reduce_sum(%8) {dimensions=[0]}
      return p=%9, q=%10
    })");
}

}  // namespace
}  // namespace kiln::compiler
