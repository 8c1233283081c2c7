// Which OpenBLAS kernels the PyTorch peer runs, and which to give it (DESIGN.md §5: the peer gets
// its best setup). Debian's OpenBLAS 0.3.21 is built with DYNAMIC_ARCH: it picks its kernels
// ("core type") from CPUID at load time and falls back to generic SSE3 kernels ("Prescott") on a
// CPU it does not know, such as an avx512_fp16 Xeon, where its f32 matmul runs ~5x slower than with
// OPENBLAS_CORETYPE=SkylakeX. A benchmark against that peer is wrong, so the driver asks the peer
// which core it runs (openblas_get_corename) and, on such a fallback, restarts it with the newest
// core type the CPU supports, once its results check out.
//
//   CpuInfo cpu = ParseCpuInfo(text_of_proc_cpuinfo);
//   std::string core = BestOpenBlasCore(cpu);          // "SkylakeX"
//   if (IsGenericOpenBlasCore("Prescott", cpu)) ...     // restart the peer with `core`
#ifndef KILN_BENCH_PEER_BLAS_H_
#define KILN_BENCH_PEER_BLAS_H_

#include <set>
#include <string>
#include <string_view>

namespace kiln::bench {

struct CpuInfo {
  std::string model;            // "model name" of the first processor
  std::set<std::string> flags;  // its "flags"
  bool Has(const std::string& flag) const { return flags.count(flag) > 0; }
};

// Parses the text of /proc/cpuinfo (the first processor's model name and flags).
CpuInfo ParseCpuInfo(std::string_view text);
// /proc/cpuinfo of this machine (empty when unreadable).
CpuInfo ReadCpuInfo();
// `cpu` as a CPU of Kiln's ISA `level` (base/cpu_isa.h names: sse41, avx2, avx512, avx512_vnni,
// avx512_bf16) shows it: the flags above that level removed, as libkiln_cpuid_cap.so removes them
// from CPUID for the peers when the benchmark runs under KILN_CPU_ISA. An unknown level keeps all.
CpuInfo CapCpuInfo(CpuInfo cpu, std::string_view level);

// The SIMD level of an OpenBLAS core type's f32 kernels: 0 SSE (the generic fallbacks: Prescott,
// Core2, Nehalem, ...), 1 AVX (Sandybridge, Bulldozer family), 2 AVX2+FMA (Haswell, Zen),
// 3 AVX-512 (SkylakeX), 4 AVX-512 with BF16 (Cooperlake), 5 AMX (SapphireRapids); -1 unknown.
int OpenBlasCoreLevel(std::string_view core);

// The level of the newest core type this CPU runs, and that core type's name ("" below AVX2:
// nothing to upgrade to).
int CpuBlasLevel(const CpuInfo& cpu);
std::string BestOpenBlasCore(const CpuInfo& cpu);

// True when OpenBLAS picked kernels below AVX2 (or a core it does not name) on a CPU with AVX2 or
// AVX-512: the generic fallback the issue describes.
bool IsGenericOpenBlasCore(std::string_view core, const CpuInfo& cpu);

// The CPU flags worth recording beside benchmark results (the SIMD and matrix extensions).
std::string SimdFlags(const CpuInfo& cpu);

}  // namespace kiln::bench

#endif  // KILN_BENCH_PEER_BLAS_H_
