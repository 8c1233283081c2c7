// For the X-macros that generate code for some kernel families only (builder.h, builder.cc):
// KILN_IR_DECLARE_<family>(name) and KILN_IR_DEFINE_<family>(name) expand to nothing for every
// family but kUnary and kBinary, which the includer defines. A new family adds a line to each
// block (the build fails on a family without one). Include it before opcodes.def; each block is
// guarded, so builder.cc may include it again after builder.h did.
#ifndef KILN_IR_DECLARE_kNone
#define KILN_IR_DECLARE_kNone(name)
#define KILN_IR_DECLARE_kCompare(name)
#define KILN_IR_DECLARE_kSelect(name)
#define KILN_IR_DECLARE_kLogical(name)
#define KILN_IR_DECLARE_kConvert(name)
#define KILN_IR_DECLARE_kStructural(name)
#define KILN_IR_DECLARE_kIndexing(name)
#define KILN_IR_DECLARE_kReduce(name)
#define KILN_IR_DECLARE_kArgmax(name)
#define KILN_IR_DECLARE_kDot(name)
#define KILN_IR_DECLARE_kConv(name)
#define KILN_IR_DECLARE_kPool(name)
#define KILN_IR_DECLARE_kMaxPoolGrad(name)
#define KILN_IR_DECLARE_kSoftmax(name)
#define KILN_IR_DECLARE_kLayerNorm(name)
#define KILN_IR_DECLARE_kRmsNorm(name)
#define KILN_IR_DECLARE_kCrossEntropy(name)
#define KILN_IR_DECLARE_kAttention(name)
#define KILN_IR_DECLARE_kRandom(name)
#define KILN_IR_DECLARE_kCollective(name)
#endif
#ifndef KILN_IR_DEFINE_kNone
#define KILN_IR_DEFINE_kNone(name)
#define KILN_IR_DEFINE_kCompare(name)
#define KILN_IR_DEFINE_kSelect(name)
#define KILN_IR_DEFINE_kLogical(name)
#define KILN_IR_DEFINE_kConvert(name)
#define KILN_IR_DEFINE_kStructural(name)
#define KILN_IR_DEFINE_kIndexing(name)
#define KILN_IR_DEFINE_kReduce(name)
#define KILN_IR_DEFINE_kArgmax(name)
#define KILN_IR_DEFINE_kDot(name)
#define KILN_IR_DEFINE_kConv(name)
#define KILN_IR_DEFINE_kPool(name)
#define KILN_IR_DEFINE_kMaxPoolGrad(name)
#define KILN_IR_DEFINE_kSoftmax(name)
#define KILN_IR_DEFINE_kLayerNorm(name)
#define KILN_IR_DEFINE_kRmsNorm(name)
#define KILN_IR_DEFINE_kCrossEntropy(name)
#define KILN_IR_DEFINE_kAttention(name)
#define KILN_IR_DEFINE_kRandom(name)
#define KILN_IR_DEFINE_kCollective(name)
#endif
