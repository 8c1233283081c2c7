// oneDNN at the process's CPU ISA level (base/cpu_isa.h): the cpu backend caps oneDNN
// (dnnl::set_max_cpu_isa) at the same level as Kiln's own kernels before its first primitive, and
// names the level that ran for run records, thunk names, the compile cache and messages.
//
//   runtime::EnsureOneDnnIsa();                    // before the first oneDNN call (idempotent)
//   std::string isa = runtime::OneDnnIsaName();    // "avx2" under KILN_CPU_ISA=avx2
//   std::string d = runtime::CpuIsaDescription();  // "avx2 (oneDNN avx2), capped from avx512_bf16"
#ifndef KILN_RUNTIME_CPU_ISA_H_
#define KILN_RUNTIME_CPU_ISA_H_

#include <string>

#include "kiln/base/cpu_isa.h"

namespace kiln::runtime {

// Decides the process's level (ActiveCpuIsa) and, when it is below the host's, caps oneDNN at
// it. Every oneDNN entry point of the cpu backend calls it first; cheap after the first call.
void EnsureOneDnnIsa();

// oneDNN's effective ISA ("avx2", "avx512_core_bf16", ...): the process's level as oneDNN names
// it, or lower where oneDNN cannot use the CPU's top level (AMX without OS permission).
std::string OneDnnIsaName();

// True when oneDNN has bf16 matmul and convolution kernels at this level (avx512_core and up:
// oneDNN 2.6 has none below; the compiler then computes bf16 values in f32).
bool OneDnnHasBf16();
// Why, when OneDnnHasBf16() is false: the reason messages quote.
inline constexpr char kOneDnnNoBf16[] = "oneDNN has no bf16 matmul/convolution below avx512_core";
// True when oneDNN's int8 kernels multiply exactly (AVX-512 VNNI; without it they sum pairs of
// u8 x s8 products in saturating s16).
bool OneDnnHasExactInt8();

// "avx2 (oneDNN avx2)", with ", capped from avx512_bf16" when capped: what run records and
// messages quote.
std::string CpuIsaDescription();

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CPU_ISA_H_
