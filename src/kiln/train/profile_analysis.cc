#include "kiln/train/profile_analysis.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kiln/base/memory.h"

namespace kiln::train {

std::string_view BoundName(Bound b) {
  switch (b) {
    case Bound::kInput:
      return "input-bound";
    case Bound::kMatmul:
      return "matmul-bound";
    case Bound::kMemory:
      return "memory-bound";
    case Bound::kOverhead:
      return "overhead-bound";
  }
  return "?";
}

namespace {

// How much slower than the same matmul inside the step a bare measurement may be before it counts
// as slowed by other load: inside the step a matmul's operands can be warm in cache.
constexpr double kBareSlack = 0.10;

double Share(double part, double whole) { return whole > 0 ? part / whole : 0; }

bool Tiny(const KernelStat& k, const ProfileThresholds& t) {
  return k.calls > 0 && k.seconds / static_cast<double>(k.calls) < t.tiny_kernel_seconds;
}

std::string VerdictLine(const ProfileVerdict& v, const ProfileInputs& in,
                        const ProfileThresholds& t, double uncovered, int64_t calls_per_step) {
  const double steps = static_cast<double>(std::max<int64_t>(in.steps, 1));
  switch (v.bound) {
    case Bound::kInput: {
      // W workers finish a batch every produce_seconds / W: a pipeline slower than the step on
      // average cannot be hidden by a deeper queue; a faster one that still leaves the step
      // waiting is bursty.
      const double compute = (in.step_seconds - in.input_seconds) / steps;
      const bool slower =
          in.produce_seconds > 0 && in.produce_seconds / std::max(in.workers, 1) >= compute;
      return absl::StrFormat(
          "input-bound: %.0f%% of step time waiting for data; %s", 100 * v.input_share,
          in.produce_seconds <= 0
              ? "raise data.prefetch (or set it to auto) or simplify decoding and augmentation"
          : slower
              ? "the pipeline needs longer per batch than the step computes, which no prefetch "
                "depth hides: raise data.workers (if cores are free), simplify decoding and "
                "augmentation, or read fewer bytes per example"
              : "production keeps up on average but comes in bursts: a deeper data.prefetch "
                "absorbs them");
    }
    case Bound::kMatmul: {
      std::string bare = v.matmul_bare_fraction > 0
                             ? absl::StrFormat(" = %.0f%% of the bare oneDNN rate for their shapes",
                                               100 * v.matmul_bare_fraction)
                             : " (bare rate not measured)";
      if (v.bare_slowed > 0) {
        absl::StrAppend(&bare, absl::StrFormat(" (at least: %d of the bare measurements ran slower "
                                               "than the step, so the machine is busy; rerun on a "
                                               "quiet one)",
                                               v.bare_slowed));
      }
      std::string peak = in.matmul_peak > 0 ? absl::StrFormat(" (square f32 peak %.0f GFLOP/s)",
                                                              in.matmul_peak / 1e9)
                                            : "";
      // Far below the bare rate, the time is not the arithmetic: dispatch, thread wake-up, cold
      // caches. Closer to it, the shapes, layouts and fused post-ops cost the difference.
      const bool far = v.matmul_bare_fraction > 0 && v.matmul_bare_fraction < 0.25;
      return absl::StrFormat(
          "matmul-bound: matmul/conv kernels are %.0f%% of the step at %.1f GFLOP/s%s%s; %s",
          100 * v.matmul_share, v.matmul_rate / 1e9, bare, peak,
          far ? "that far below the bare rate the time is not the arithmetic (dispatch, thread "
                "wake-up, cold caches): see the largest kernels below"
              : "the gap to the bare rate is the shapes, layouts and fused post-ops");
    }
    case Bound::kMemory: {
      std::string bw = in.memcpy_bandwidth > 0
                           ? absl::StrFormat(" = %.0f%% of memcpy bandwidth (%.1f GB/s)",
                                             100 * v.memory_rate / in.memcpy_bandwidth,
                                             in.memcpy_bandwidth / 1e9)
                           : "";
      return absl::StrFormat(
          "memory-bound kernels: non-matmul kernels are %.0f%% of the step at %.1f GB/s%s; the "
          "largest are listed below",
          100 * v.memory_share, v.memory_rate / 1e9, bw);
    }
    case Bound::kOverhead:
      return absl::StrFormat(
          "overhead-bound: %.0f%% of the step is dispatch: %d kernels/step, %d of them under "
          "%.0f us, and %.2f ms/step outside any kernel; fewer, larger kernels (a larger batch, "
          "more fusion) would help",
          100 * v.overhead_share, calls_per_step, v.tiny_kernels, 1e6 * t.tiny_kernel_seconds,
          1e3 * uncovered / steps);
  }
  return "";
}

}  // namespace

ProfileVerdict ClassifyProfile(const std::vector<KernelStat>& kernels, const ProfileInputs& in,
                               const ProfileThresholds& t) {
  ProfileVerdict v;
  const double steps = static_cast<double>(std::max<int64_t>(in.steps, 1));
  double kernel_s = 0, matmul_s = 0, memory_s = 0, tiny_s = 0, flops = 0, bytes = 0, bare_s = 0;
  bool bare_known = true;
  int64_t calls = 0, tiny_calls = 0;
  for (const KernelStat& k : kernels) {
    kernel_s += k.seconds;
    calls += k.calls;
    if (Tiny(k, t)) {
      tiny_s += k.seconds;
      tiny_calls += k.calls;
    } else if (k.kind == KernelKind::kMatmul) {
      matmul_s += k.seconds;
      flops += k.flops * static_cast<double>(k.calls);
      if (k.bare_seconds > 0) {
        // The bare primitive does not beat the same matmul inside the step by much (the step's
        // operands may be warmer in cache: a few percent); when its measurement is more than
        // kBareSlack slower, other load slowed it. Either way the step's own time stands in
        // for a bare time above it; only the first case is reported as a disturbance.
        const double mean = k.seconds / static_cast<double>(k.calls);
        if (k.bare_seconds > mean * (1 + kBareSlack)) ++v.bare_slowed;
        bare_s += std::min(k.bare_seconds, mean) * static_cast<double>(k.calls);
      } else if (in.matmul_peak > 0) {
        bare_s += k.flops * static_cast<double>(k.calls) / in.matmul_peak;
      } else {
        bare_known = false;
      }
    } else {
      memory_s += k.seconds;
      bytes += k.bytes * static_cast<double>(k.calls);
    }
  }
  const double uncovered = std::max(0.0, in.step_seconds - in.input_seconds - kernel_s);
  const double whole = std::max(in.step_seconds, in.input_seconds + kernel_s);
  v.input_share = Share(in.input_seconds, whole);
  v.matmul_share = Share(matmul_s, whole);
  v.memory_share = Share(memory_s, whole);
  v.overhead_share = Share(uncovered + tiny_s, whole);
  v.tiny_kernels = static_cast<int64_t>(static_cast<double>(tiny_calls) / steps);
  v.matmul_rate = Share(flops, matmul_s);
  v.matmul_bare_fraction = bare_known ? Share(bare_s, matmul_s) : 0;
  v.memory_rate = Share(bytes, memory_s);
  if (v.input_share >= t.input_share) {
    v.bound = Bound::kInput;
  } else if (v.matmul_share >= v.memory_share && v.matmul_share >= v.overhead_share) {
    v.bound = Bound::kMatmul;
  } else if (v.memory_share >= v.overhead_share) {
    v.bound = Bound::kMemory;
  } else {
    v.bound = Bound::kOverhead;
  }
  const int64_t calls_per_step = static_cast<int64_t>(static_cast<double>(calls) / steps);
  v.text = absl::StrFormat(
      "verdict: %s\nshares of the step: matmul/conv %.1f%%, other kernels %.1f%%, overhead "
      "%.1f%% (%.2f ms/step outside kernels + %d kernels/step under %.0f us), input wait %.1f%%",
      VerdictLine(v, in, t, uncovered, calls_per_step), 100 * v.matmul_share, 100 * v.memory_share,
      100 * v.overhead_share, 1e3 * uncovered / steps, v.tiny_kernels, 1e6 * t.tiny_kernel_seconds,
      100 * v.input_share);
  absl::StrAppend(&v.text, absl::StrFormat("\ninput: %.1f%% of step time waiting for data (%.3f "
                                           "ms/step)",
                                           100 * v.input_share, 1e3 * in.input_seconds / steps));
  if (in.produce_seconds > 0) {
    if (in.workers > 1) {
      absl::StrAppend(&v.text, absl::StrFormat("; the pipeline produces a batch in %.3f ms on each "
                                               "of its %d worker threads",
                                               1e3 * in.produce_seconds, in.workers));
    } else {
      absl::StrAppend(&v.text, absl::StrFormat("; the pipeline produces a batch in %.3f ms on its "
                                               "thread",
                                               1e3 * in.produce_seconds));
    }
  }
  if (in.prefetch_depth > 0) {
    absl::StrAppend(&v.text, absl::StrFormat(", prefetch queue %d batches", in.prefetch_depth));
  }
  return v;
}

namespace {

std::string KernelLine(const KernelStat& k, const ProfileInputs& in) {
  const double steps = static_cast<double>(std::max<int64_t>(in.steps, 1));
  std::string rate;
  if (k.kind == KernelKind::kMatmul) {
    const double r = Share(k.flops * static_cast<double>(k.calls), k.seconds);
    const double bare = k.bare_seconds > 0 ? k.flops / k.bare_seconds : in.matmul_peak;
    rate = absl::StrFormat("%.1f GFLOP/s", r / 1e9);
    if (bare > 0) {
      absl::StrAppend(&rate, absl::StrFormat(" = %.0f%% of bare %.3g%s", 100 * r / bare, bare / 1e9,
                                             k.bare_seconds > 0 ? "" : " (square)"));
      if (r > bare * (1 + kBareSlack)) absl::StrAppend(&rate, " (bare slowed by other load)");
    }
  } else {
    const double r = Share(k.bytes * static_cast<double>(k.calls), k.seconds);
    rate = absl::StrFormat("%.2f GB/s", r / 1e9);
    if (in.memcpy_bandwidth > 0) {
      absl::StrAppend(&rate, absl::StrFormat(" = %.0f%% of memcpy", 100 * r / in.memcpy_bandwidth));
    }
  }
  return absl::StrFormat("\n  %9.3f ms %5.1f%%  x%-4g %s  %s  %s", 1e3 * k.seconds / steps,
                         100 * Share(k.seconds, in.step_seconds),
                         static_cast<double>(k.calls) / steps, k.op, k.shapes, rate);
}

}  // namespace

std::string FormatTopKernels(const std::vector<KernelStat>& kernels, const ProfileInputs& in,
                             int top) {
  std::vector<const KernelStat*> rows;
  for (const KernelStat& k : kernels) rows.push_back(&k);
  std::stable_sort(rows.begin(), rows.end(), [](const KernelStat* a, const KernelStat* b) {
    return a->seconds > b->seconds;
  });
  std::string out;
  for (KernelKind kind : {KernelKind::kMatmul, KernelKind::kMemory}) {
    std::string lines;
    int n = 0;
    for (const KernelStat* k : rows) {
      if (k->kind != kind || n >= top) continue;
      lines += KernelLine(*k, in);
      ++n;
    }
    if (n == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : "\n", "largest ",
                    kind == KernelKind::kMatmul ? "matmul/conv" : "other",
                    " kernels (per step):", lines);
  }
  return out;
}

std::string FormatMemoryBreakdown(const MemoryBreakdown& m) {
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::string out = absl::StrFormat(
      "memory (MiB): parameters %.1f, gradients %.1f (inside the arena), optimizer state %.1f, "
      "arena %.1f, constants %.1f, evaluation %.1f, checkpoint staging %.1f",
      mib(m.parameters), mib(m.gradients), mib(m.optimizer_state), mib(m.arena), mib(m.constants),
      mib(m.evaluation), mib(m.checkpoint_staging));
  if (m.peak_rss >= 0) {
    absl::StrAppend(
        &out, absl::StrFormat(", other %.1f; peak RSS %.1f", mib(m.other()), mib(m.peak_rss)));
  } else {
    absl::StrAppend(&out, "; peak RSS unknown (no /proc/self/status)");
  }
  return out;
}

int64_t PeakRssBytes() { return ProcStatusBytes("VmHWM"); }

double MemcpyBandwidth() {
  static const double bandwidth = MemcpyBytesPerSecond(
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), /*reps=*/5);
  return bandwidth;
}

}  // namespace kiln::train
