// Timing helpers shared by the benchmark drivers (train_bench, matmul_benchmark,
// fused_loop_benchmark).
//
//   double t0 = bench::Seconds();  ...  times.push_back(bench::Seconds() - t0);
//   double typical = bench::Median(times);
#ifndef KILN_BENCH_TIMING_H_
#define KILN_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace kiln::bench {

// Steady-clock time in seconds (only differences mean anything).
inline double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The median (the mean of the middle two for an even count); 0 for no values.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace kiln::bench

#endif  // KILN_BENCH_TIMING_H_
