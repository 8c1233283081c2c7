// The instruction-set level this process runs at: one process-wide decision, taken once, that
// Kiln's own kernels (explicit per-ISA variants, base/isa_dispatch.h) and oneDNN (the cpu
// backend sets dnnl::set_max_cpu_isa from it, runtime/cpu/isa.h) both follow. The level is the
// host's (CPUID), or lower where a cap asks for it, so that an AVX-512 machine also runs, and
// tests, the AVX2 and x86-64-v2 code paths:
//
//   KILN_RETURN_IF_ERROR(kiln::SetCpuIsaCap(kiln::CpuIsa::kAvx2));  // before any kernel runs
//   kiln::CpuIsa isa = kiln::ActiveCpuIsa();                        // kAvx2 from now on
//   std::string name = kiln::CpuIsaName(isa);                       // "avx2"
//
// Levels, lowest first (each includes the ones before it):
//   sse41        x86-64-v2 (SSE4.2, POPCNT): Kiln's baseline kernels, oneDNN's sse41 ones
//   avx2         x86-64-v3 (AVX2, FMA, BMI2, F16C): Kiln's v3 kernels, oneDNN's avx2 ones
//   avx512       x86-64-v4 (AVX-512 F/BW/DQ/VL/CD): Kiln's v4 kernels, oneDNN's avx512_core
//   avx512_vnni  + AVX-512 VNNI (int8 dot products): oneDNN's avx512_core_vnni, the VNNI gemv
//   avx512_bf16  + AVX-512 BF16: oneDNN's avx512_core_bf16, its bf16 matmul and convolution
//   amx          + AMX tiles: oneDNN's avx512_core_amx
//
// The libraries read no environment: the kiln CLI, the test support library and the benchmarks
// read KILN_CPU_ISA and pass its value to ApplyCpuIsaSetting before the first kernel (docs/cli.md,
// "Environment").
#ifndef KILN_BASE_CPU_ISA_H_
#define KILN_BASE_CPU_ISA_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

enum class CpuIsa : int { kSse41 = 0, kAvx2, kAvx512, kAvx512Vnni, kAvx512Bf16, kAmx };

// "sse41", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx".
std::string CpuIsaName(CpuIsa isa);
// Every level, lowest first.
std::vector<CpuIsa> AllCpuIsas();
// The inverse of CpuIsaName, plus "native" (the host's level). InvalidArgument naming the value
// and the choices otherwise.
absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name);

// The highest level this CPU (and its OS) supports, from CPUID.
CpuIsa HostCpuIsa();

// Caps the process's level at `cap` (a cap above the host's level is the host's level). Must come
// before the level is first used (ActiveCpuIsa, any kernel): FailedPrecondition naming both
// levels when it was already decided otherwise; the same effective level again is fine.
absl::Status SetCpuIsaCap(CpuIsa cap);

// Applies a KILN_CPU_ISA value, as every program that reads the variable does: empty does nothing;
// otherwise ParseCpuIsa, then SetCpuIsaCap (its errors). A level above this CPU's is OutOfRange
// naming both when `strict` (tests and benchmarks: a silent native run would report the wrong
// machine), and the CPU's own level otherwise (the kiln CLI).
absl::Status ApplyCpuIsaSetting(std::string_view value, bool strict);

// The process's level: min(host, cap). Decided on first call and fixed from then on.
CpuIsa ActiveCpuIsa();

// True when SetCpuIsaCap lowered the level below the host's.
bool CpuIsaCapped();

}  // namespace kiln

#endif  // KILN_BASE_CPU_ISA_H_
