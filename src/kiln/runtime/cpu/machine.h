// What this machine's CPU gives oneDNN: the ISA it dispatches to (one name table for the compile
// cache key, run.json and messages), and the bare matmul rate measured on the spot: the physical
// limit that benchmarks report model FLOP/s against (DESIGN.md §5), and what `kiln train` checks
// before it runs a bf16 precision policy on a CPU where bf16 is slower than f32.
//
//   std::string isa = runtime::OneDnnIsaName();  // "avx512_core_bf16"

//   runtime::MatmulRates r = runtime::MeasureMatmulRates(/*n=*/1024, /*reps=*/3);
//   if (r.bf16 < r.f32) ...  // no AMX: oneDNN's avx512_core_bf16 kernels lose to f32 here
//
// Uses the threads OpenMP is set to. Allocates and first-touches its operands before timing.
#ifndef KILN_RUNTIME_CPU_MACHINE_H_
#define KILN_RUNTIME_CPU_MACHINE_H_

#include <cstdint>
#include <string>

#include "kiln/runtime/cpu/isa.h"  // OneDnnIsaName
#include "kiln/tensor/dtype.h"

namespace kiln::runtime {

// Median seconds of one n x n x n row-major matmul (f32 or bf16 operands and result, no post-ops)
// over `reps` timed runs after 3 untimed ones.
double BareMatmulSeconds(DType dtype, int64_t n, int reps);

struct MatmulRates {
  double f32 = 0;   // FLOP/s
  double bf16 = 0;  // FLOP/s
  int64_t n = 0;
};
MatmulRates MeasureMatmulRates(int64_t n, int reps);

// One line for a user choosing a precision policy: empty when bf16 is at least as fast as f32 on
// this CPU, otherwise a warning naming both rates, the ISA and what to do instead.
std::string Bf16SlowerWarning(const MatmulRates& rates, const std::string& precision);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CPU_MACHINE_H_
