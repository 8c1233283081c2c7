// The machine's roofline for the serve compute benchmark (serve_compute.cc): what one forward pass
// must do (FLOPs of its contractions, bytes it must read), what this machine can do (the f32 FMA
// peak and the read bandwidth at a working-set size, both measured in the same run), and the floor
// time any implementation is bound by: max(flops / peak, bytes / bandwidth).
//
//   auto cost = CountGraphCost(graph, {"x"});            // from the graph Kiln compiles
//   FmaPeak peak = MeasureFmaPeak(/*threads=*/2);        // best of many short repetitions
//   double gbs = MeasureReadBandwidth(cost->working_set_bytes(), 2).gb_per_s;
//   Roofline r = MakeRoofline(*cost, peak.gflop_per_s, gbs);
//   std::string v = Verdict(r, kiln_us, ort_us, /*target=*/0.8);
//
// The peak is independent FMA chains on every thread (512-bit where the CPU has AVX-512, else
// AVX2+FMA, else scalar; chosen at run time, the build has no -march); the bandwidth is a streaming
// sum over a buffer of the given size, split between the threads and read again and again, so a
// working set that fits a cache is measured from that cache. Both are best-of-N: the load other
// processes put on the machine only lowers them, so a busy machine gives a low roof (and shares of
// it above 100%).
#ifndef KILN_BENCH_ROOFLINE_H_
#define KILN_BENCH_ROOFLINE_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::bench {

// What one run of a graph must do. FLOPs count the contractions only (dot_general: 2 x output
// elements x contracted size; conv2d: 2 x output elements x filter in-channels/groups x kh x kw);
// the elementwise ops around them are not counted (they are << 1% of the FLOPs of a matmul or a
// convolution of any size worth a roofline).
struct GraphCost {
  double flops = 0;
  int64_t contractions = 0;         // dot_general and conv2d nodes counted
  int64_t weight_bytes = 0;         // parameters not named as inputs, and constants
  int64_t input_bytes = 0;          // parameters named as inputs
  int64_t output_bytes = 0;         // the graph's outputs
  int64_t largest_value_bytes = 0;  // the largest value computed inside the graph

  // Bytes that must cross the memory system at least once per run: weights and input read,
  // output written.
  int64_t min_bytes() const { return weight_bytes + input_bytes + output_bytes; }
  // What a run keeps touching: the weights, the input and output, and one layer's input and
  // output at the largest value's size (the runtime's arena reuses the rest).
  int64_t working_set_bytes() const { return min_bytes() + 2 * largest_value_bytes; }
};

// The cost of `g`; parameters whose `name` is in `inputs` are inputs, every other parameter is a
// weight. InvalidArgument (naming the node) for a contraction whose shapes or attributes do not
// add up.
absl::StatusOr<GraphCost> CountGraphCost(const ir::Graph& g, const std::set<std::string>& inputs);

// Which FMA kernel the peak runs.
enum class FmaIsa { kAuto, kAvx512, kAvx2, kScalar };
// "avx512f", "avx2+fma", "scalar" ("auto" for kAuto).
std::string FmaIsaName(FmaIsa isa);
// The widest the process's CPU ISA level runs (ActiveCpuIsa: the CPU's own, or KILN_CPU_ISA's
// cap): kAvx512, kAvx2 or kScalar.
FmaIsa BestFmaIsa();

struct FmaPeak {
  double gflop_per_s = 0;  // best repetition, all threads together
  FmaIsa isa = FmaIsa::kScalar;
  int threads = 1;
  int repetitions = 0;
};

// The f32 multiply-add peak on `threads` OpenMP threads: each runs independent FMA chains for
// about `seconds_per_rep`; the best of at least `repetitions`, and of as many more as fit in
// `budget_seconds` (many short repetitions: on a shared machine the best of them is the one that
// ran with every thread on a core). An ISA the CPU lacks falls back to the best it has (the
// result's `isa` says which ran).
FmaPeak MeasureFmaPeak(int threads, FmaIsa isa = FmaIsa::kAuto, int repetitions = 10,
                       double seconds_per_rep = 0.005, double budget_seconds = 0.25);

struct ReadBandwidth {
  int64_t bytes = 0;    // the working set read
  double gb_per_s = 0;  // best repetition, 1e9 bytes per second, all threads together
  int threads = 1;
  int repetitions = 0;
};

// Streaming read bandwidth over a buffer of `bytes` (at least 64 KiB), each thread summing its
// share of it again and again for about `seconds_per_rep`; the best of at least `repetitions` and
// of as many more as fit in `budget_seconds`.
ReadBandwidth MeasureReadBandwidth(int64_t bytes, int threads, int repetitions = 10,
                                   double seconds_per_rep = 0.005, double budget_seconds = 0.25);

// The kernels under the measurements, exposed so tests can check they compute what they claim.
// `iters` steps of acc = acc * a + b on every chain, every chain starting from `start`; returns
// the mean of the chains' final values (so the loop cannot be optimized away).
float FmaChains(FmaIsa isa, int64_t iters, float start, float a, float b);
// FLOPs one FmaChains call of `iters` steps does with `isa` (after fallback).
double FmaChainsFlops(FmaIsa isa, int64_t iters);
// The sum of `n` floats (n a multiple of 16), read with the widest loads the CPU has.
float StreamSum(const float* p, int64_t n);

// The floor of one run on a machine with `peak_gflop_per_s` and `gb_per_s` at its working set.
struct Roofline {
  GraphCost cost;
  double peak_gflop_per_s = 0, gb_per_s = 0;
  double compute_floor_us = 0;  // flops / peak
  double memory_floor_us = 0;   // min_bytes / bandwidth
  double floor_us = 0;          // the larger of the two
  bool compute_bound = false;   // compute_floor_us >= memory_floor_us
};
Roofline MakeRoofline(const GraphCost& cost, double peak_gflop_per_s, double gb_per_s);

// The share of the binding roof a run of `us` microseconds reaches: floor / us (1 = on the roof).
inline double RoofShare(const Roofline& r, double us) { return us > 0 ? r.floor_us / us : 0; }

// One line: which roof binds, Kiln's and the peer's share of it, and the share `target` x the
// peer's time would need (above 100%: no implementation can reach the target there), e.g.
// "compute-bound: Kiln at 97% of FMA peak, ORT at 82%; 0.80x of ORT would need 103% (beyond the
// roof)"; a note when both run under 20% of the roof. `peer_us` <= 0: the peer did not run.
std::string Verdict(const Roofline& r, double kiln_us, double peer_us, double target = 0.8,
                    const std::string& peer = "ORT");

}  // namespace kiln::bench

#endif  // KILN_BENCH_ROOFLINE_H_
