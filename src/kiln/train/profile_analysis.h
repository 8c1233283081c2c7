// What `kiln train --profile-steps A:B` concludes from a profiled window (docs/train.md
// "--profile-steps A:B"): the measured kernel-time table classified into the one limit that
// dominates the step, with the numbers that show it, and the memory breakdown of the process.
// Pure functions over plain tables, so the classification is tested on synthetic profiles;
// trainer_profile.cc fills the tables from the trace and the compiled step.
//
//   std::vector<KernelStat> kernels = ...;   // one row per kernel kind and shapes
//   ProfileVerdict v = ClassifyProfile(kernels, {.steps = 2, .step_seconds = 6.7, ...});
//   log << v.text << "\n" << FormatTopKernels(kernels, in, 8);
//   log << FormatMemoryBreakdown({.parameters = ..., .peak_rss = PeakRssBytes()});
#ifndef KILN_TRAIN_PROFILE_ANALYSIS_H_
#define KILN_TRAIN_PROFILE_ANALYSIS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::train {

enum class KernelKind {
  kMatmul,  // dot_general / convolution, alone or with fused post-ops: rated in FLOP/s
  kMemory,  // everything else (fused loops, reductions, gathers, iota, ...): rated in bytes/s
};

// One row: every kernel of the profiled window with the same description and shapes.
struct KernelStat {
  std::string op;      // "dot_general (onednn matmul+bias)", "fusion (loop: 5 ops, 2 in, 1 out)"
  std::string shapes;  // "f32[512,768] x f32[768,3072] -> f32[512,3072]"
  KernelKind kind = KernelKind::kMemory;
  int64_t calls = 0;        // over the profiled window
  double seconds = 0;       // total over the profiled window
  double flops = 0;         // per call (matmul kinds)
  double bytes = 0;         // per call: read from and written to memory outside the kernel
  double bare_seconds = 0;  // per call: the bare oneDNN primitive for these shapes; 0: unknown
};

struct ProfileInputs {
  int64_t steps = 0;
  double step_seconds = 0;      // input wait + compute, summed over the profiled steps
  double input_seconds = 0;     // waiting for the next batch, summed
  double matmul_peak = 0;       // FLOP/s of a bare square f32 matmul on this backend; 0: unknown
  double memcpy_bandwidth = 0;  // bytes/s (read + written) of a large parallel memcpy; 0: unknown
  // The input pipeline (data/pipeline.h): batches its prefetch queue holds (0: none or unknown)
  // and its mean time to produce one batch on one worker thread (0: unknown), with `workers`
  // threads producing batches side by side (0: unknown, counted as 1).
  int prefetch_depth = 0;
  double produce_seconds = 0;
  int workers = 0;
};

// The thresholds of the classification (docs/train.md lists them; tests pin them).
struct ProfileThresholds {
  double input_share = 0.30;  // input wait at least this share of the step: input-bound
  // A kernel whose mean call is shorter than this is dispatch-dominated: its time counts as
  // overhead (with the step time no kernel covers), not as matmul or memory time.
  double tiny_kernel_seconds = 20e-6;
};

enum class Bound { kInput, kMatmul, kMemory, kOverhead };
std::string_view BoundName(Bound b);  // "input-bound", "matmul-bound", ...

struct ProfileVerdict {
  Bound bound = Bound::kOverhead;
  // Shares of the step time (they sum to 1 with input_share).
  double input_share = 0, matmul_share = 0, memory_share = 0, overhead_share = 0;
  int64_t tiny_kernels = 0;  // calls per step under tiny_kernel_seconds
  double matmul_rate = 0;    // FLOP/s over the matmul kernels (not tiny)
  // Bare time of the same matmuls / their measured time: 1 = at the bare primitive's rate.
  // Rows without bare_seconds count at matmul_peak; 0 when neither is known.
  double matmul_bare_fraction = 0;
  // Rows whose bare measurement ran more than 10% slower than the same matmul inside the step
  // (other load on the machine): they count at their step time, so the fraction is a lower
  // bound. A bare time up to 10% above the step's (operands warm in cache there) also counts at
  // the step's time but is not reported.
  int bare_slowed = 0;
  double memory_rate = 0;  // bytes/s over the memory kernels (not tiny)
  // "verdict: matmul-bound: ...", then one line of all the shares, then the input line (always:
  // "input: 1.2% of step time waiting for data; ...").
  std::string text;
};

// Classifies by shares of measured time: input-bound when the input wait reaches
// t.input_share; otherwise the largest of matmul, memory and overhead time.
ProfileVerdict ClassifyProfile(const std::vector<KernelStat>& kernels, const ProfileInputs& in,
                               const ProfileThresholds& t = {});

// The `top` matmul rows and the `top` other rows by time, one line each: time per step, share
// of the step, calls per step, the achieved rate (GFLOP/s and % of bare for matmuls, GB/s and %
// of memcpy otherwise).
std::string FormatTopKernels(const std::vector<KernelStat>& kernels, const ProfileInputs& in,
                             int top);

// Resident bytes of a training process. Gradients live inside the arena (the step is one
// executable); "other" is peak RSS minus every named part (parameters, optimizer state, arena,
// constants, evaluation, checkpoint staging): code, libraries, oneDNN's caches, the data, the heap.
struct MemoryBreakdown {
  int64_t parameters = 0;          // every resident set the train step keeps
  int64_t gradients = 0;           // one per trained value, inside the arena
  int64_t optimizer_state = 0;     // every resident set
  int64_t arena = 0;               // the train step executable's arena
  int64_t constants = 0;           // its values computed once, outside the arena (iotas, masks)
  int64_t evaluation = 0;          // the evaluator's arena and buffers (it holds no weights)
  int64_t checkpoint_staging = 0;  // the asynchronous checkpoint's host copy, when reserved
  int64_t peak_rss = -1;           // VmHWM; -1: unknown (then no "other")
  int64_t other() const {
    return peak_rss < 0 ? -1
                        : peak_rss - parameters - optimizer_state - arena - constants - evaluation -
                              checkpoint_staging;
  }
};
// "memory: parameters 474.8 MiB, gradients 237.4 MiB (in the arena), ..." (several lines).
std::string FormatMemoryBreakdown(const MemoryBreakdown& m);

// This process's peak resident set (VmHWM of /proc/self/status), or -1 where there is none.
int64_t PeakRssBytes();
// Bytes/s (read + written) of a 64 MiB memcpy split over the hardware threads, the median of 5
// (kiln::MemcpyBytesPerSecond, base/memory.h); measured on the first call and cached.
double MemcpyBandwidth();

}  // namespace kiln::train

#endif  // KILN_TRAIN_PROFILE_ANALYSIS_H_
