// Explicit per-ISA variants of Kiln's own vectorized kernels, chosen once from the process's
// capped level (base/cpu_isa.h) instead of GCC target_clones, which resolve from CPUID and
// cannot be capped. A kernel body is written once, as a function the compiler inlines into each
// variant; each variant is compiled for its ISA and the dispatcher picks one on first call:
//
//   KILN_ALWAYS_INLINE inline void AxpyBody(float a, const float* x, float* y, int64_t n) {...}
//   KILN_ISA_VARIANTS(void, Axpy, (float a, const float* x, float* y, int64_t n), (a, x, y, n))
//   // defines AxpyV4 (x86-64-v4), AxpyV3 (x86-64-v3), AxpyBase (the baseline ISA) and
//   // Axpy(...), which calls the variant KernelLevelOf(ActiveCpuIsa()) names.
//
// Levels: v4 for avx512 and above, v3 for avx2, base (x86-64, SSE2; what x86-64-v2 CPUs run)
// for sse41. The level that ran is what thunk names and run records quote (CpuIsaDescription).
#ifndef KILN_BASE_ISA_DISPATCH_H_
#define KILN_BASE_ISA_DISPATCH_H_

#include "kiln/base/cpu_isa.h"

namespace kiln {

#define KILN_ALWAYS_INLINE __attribute__((always_inline))
#define KILN_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define KILN_TARGET_V3 __attribute__((target("arch=x86-64-v3")))

enum class KernelLevel { kBase, kV3, kV4 };

inline KernelLevel KernelLevelOf(CpuIsa isa) {
  if (isa >= CpuIsa::kAvx512) return KernelLevel::kV4;
  if (isa >= CpuIsa::kAvx2) return KernelLevel::kV3;
  return KernelLevel::kBase;
}
// The level Kiln's own kernels run at in this process (fixed once decided).
inline KernelLevel ActiveKernelLevel() { return KernelLevelOf(ActiveCpuIsa()); }

// The variant for `level` among three.
template <typename Fn>
Fn PickVariant(KernelLevel level, Fn v4, Fn v3, Fn base) {
  switch (level) {
    case KernelLevel::kV4:
      return v4;
    case KernelLevel::kV3:
      return v3;
    case KernelLevel::kBase:
      break;
  }
  return base;
}

// Defines name##V4, name##V3, name##Base (each the inlined name##Body for its ISA) and the
// dispatching `ret name params`. `params` and `args` are parenthesized lists.
#define KILN_ISA_VARIANTS(ret, name, params, args)                                           \
  KILN_TARGET_V4 ret name##V4 params { return name##Body args; }                             \
  KILN_TARGET_V3 ret name##V3 params { return name##Body args; }                             \
  ret name##Base params { return name##Body args; }                                          \
  ret name params {                                                                          \
    static const auto fn =                                                                   \
        ::kiln::PickVariant(::kiln::ActiveKernelLevel(), &name##V4, &name##V3, &name##Base); \
    return fn args;                                                                          \
  }

}  // namespace kiln

#endif  // KILN_BASE_ISA_DISPATCH_H_
