// What this machine's CPU gives oneDNN: the ISA it dispatches to (one name table for the compile
// cache key, run.json and messages), and the bare matmul rate measured on the spot: the physical
// limit that benchmarks report model FLOP/s against (DESIGN.md §5), and what `kiln train` checks
// before it runs a bf16 precision policy on a CPU where bf16 is slower than f32, or has no bf16
// kernels at all (below avx512_core: the compiler then computes bf16 values in f32).
//
//   std::string isa = runtime::OneDnnIsaName();  // "avx512_core_bf16"
//   KILN_ASSIGN_OR_RETURN(runtime::MatmulRates r, runtime::MeasureMatmulRates(1024, 3));
//   if (r.bf16_computes_in_f32) ...   // avx2: no bf16 kernel, r.bf16 == 0
//   else if (r.bf16 < r.f32) ...      // no AMX: oneDNN's avx512_core_bf16 kernels lose to f32
//
// Uses the threads OpenMP is set to. Allocates and first-touches its operands before timing.
// Nothing here throws: a oneDNN refusal is a Status (runtime/cpu/internal/common.h, CatchOneDnn).
#ifndef KILN_RUNTIME_CPU_MACHINE_H_
#define KILN_RUNTIME_CPU_MACHINE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/runtime/cpu/isa.h"  // OneDnnIsaName
#include "kiln/tensor/dtype.h"

namespace kiln::runtime {

// Median seconds of one n x n x n row-major matmul (f32 or bf16 operands and result, no post-ops)
// over `reps` timed runs after 3 untimed ones. Unimplemented, naming the dtype and the ISA, when
// oneDNN has no kernel for it here (bf16 below avx512_core).
absl::StatusOr<double> BareMatmulSeconds(DType dtype, int64_t n, int reps);

struct MatmulRates {
  double f32 = 0;   // FLOP/s
  double bf16 = 0;  // FLOP/s; 0 when bf16_computes_in_f32
  int64_t n = 0;
  // oneDNN has no bf16 matmul at this ISA (!OneDnnHasBf16()): the compiler computes bf16 values
  // in f32 (the float-normalization pass), so there is no bf16 rate; bf16_note says why.
  bool bf16_computes_in_f32 = false;
  std::string bf16_note;
};
// Both rates; the bf16 one only where oneDNN has bf16 kernels (else bf16_computes_in_f32). An
// error only when the f32 matmul cannot be made.
absl::StatusOr<MatmulRates> MeasureMatmulRates(int64_t n, int reps);

// One line for a user choosing a precision policy: empty when bf16 is at least as fast as f32 on
// this CPU, otherwise a warning naming the rates, the ISA and what to do instead; where bf16
// computes in f32 (no bf16 kernels), it says so.
std::string Bf16SlowerWarning(const MatmulRates& rates, const std::string& precision);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CPU_MACHINE_H_
