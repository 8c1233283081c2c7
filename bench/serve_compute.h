// The compute half of `make bench-serve` (serve_compute.cc): a served model's forward pass in Kiln
// (compiled on the cpu backend, weights bound constant as `kiln serve` binds them, so they are
// pre-packed) against ONNX Runtime on the same weights (exported to ONNX by Debian's python3-torch,
// run by the npm package onnxruntime-node in a persistent node process, bench/ort/peer.js), and
// int8 Kiln (the `kiln quantize` rewrite, min-max calibration) against f32 Kiln. Same threads on
// both sides, alternating rounds, ratios of medians (DESIGN.md §5).
//
//   nlohmann::json rows = RunComputeBench({.threads = 2, .rounds = 5});
#ifndef KILN_BENCH_SERVE_COMPUTE_H_
#define KILN_BENCH_SERVE_COMPUTE_H_

#include <string>

#include "nlohmann/json.hpp"

namespace kiln::bench {

struct ComputeBenchOptions {
  int threads = 2;
  int rounds = 5;                                          // alternating Kiln / ORT rounds
  double seconds_per_round = 0.3;                          // per side, per round (at least 5 runs)
  std::string work_dir = "/tmp/kiln_serve_bench_compute";  // under it, run_<pid>/ per run
  std::string node = "node";                               // runs bench/ort/peer.js
  std::string peer = "bench/ort/peer.js";
  std::string exporter = "bench/ort/export_onnx.py";
  std::string python = "/usr/bin/python3";
  // Where time goes: after each row's timing, Kiln's per-kernel times (the executable's thunk
  // observer over `profile_runs` runs) and ORT's per-node times (a second session of the same
  // model with ORT's own profiler on), printed and stored under the row's "profile".
  bool profile = false;
  int profile_runs = 20;
  // What ORT's kernels are on this CPU: per row, `perf record` on the peer while it runs, its
  // sampled instructions in libonnxruntime classed by width (zmm / ymm / xmm), printed and stored
  // under the row's "ort_kernels" (an "error" where perf or objdump is missing or not allowed).
  bool peer_kernels = true;
};

// One JSON object per row ({"model", "batch", "kiln_us", "ort_us", "ratio", ...}); rows whose peer
// could not run carry "ort_skipped": why. Prints a table as it goes. Each model row also carries
// its "roofline" (roofline.h: FLOPs and bytes counted from the graph Kiln compiles, the floor time
// on this machine, both sides' times as multiples of it, a verdict); `machine`, when given,
// receives what the floor was computed from: the FMA peak (before and after the rows) and the read
// bandwidth at each working set measured.
nlohmann::json RunComputeBench(const ComputeBenchOptions& options,
                               nlohmann::json* machine = nullptr);

}  // namespace kiln::bench

#endif  // KILN_BENCH_SERVE_COMPUTE_H_
