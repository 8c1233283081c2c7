#include "bench/roofline.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kiln/base/cpu_isa.h"

namespace kiln::bench {
namespace {

std::string NodeName(const ir::Node& n) {
  return "%" + std::to_string(n.id()) + " = " + std::string(ir::OpcodeName(n.opcode()));
}

absl::Status Bad(const ir::Node& n, const std::string& what) {
  return absl::InvalidArgumentError("roofline: " + NodeName(n) + ": " + what);
}

// ---- FMA chains: acc = acc * a + b, independent chains so the FMA pipes never wait ----

constexpr int kAvx512Chains = 16;  // of 32 zmm registers; >= 2 pipes x 4 cycles latency
constexpr int kAvx2Chains = 12;    // of 16 ymm registers (two hold a and b)
constexpr int kScalarChains = 8;

// The sum of a vector's lanes (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its header).
__attribute__((target("avx512f"))) float Lanes512(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float t = 0;
  for (float x : lanes) t += x;
  return t;
}

// Chain j starts at start + j * 1e-6 so no two chains are provably equal (a compiler may merge
// identical chains).
__attribute__((target("avx512f"))) float FmaAvx512(int64_t iters, float start, float a, float b) {
  __m512 acc[kAvx512Chains];
  for (int j = 0; j < kAvx512Chains; ++j) acc[j] = _mm512_set1_ps(start + j * 1e-6f);
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kAvx512Chains; ++j) acc[j] = _mm512_fmadd_ps(acc[j], va, vb);
  }
  __m512 s = acc[0];
  for (int j = 1; j < kAvx512Chains; ++j) s = _mm512_add_ps(s, acc[j]);
  return Lanes512(s) / (16.f * kAvx512Chains);
}

__attribute__((target("avx2,fma"))) float FmaAvx2(int64_t iters, float start, float a, float b) {
  __m256 acc[kAvx2Chains];
  for (int j = 0; j < kAvx2Chains; ++j) acc[j] = _mm256_set1_ps(start + j * 1e-6f);
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < kAvx2Chains; ++j) acc[j] = _mm256_fmadd_ps(acc[j], va, vb);
  }
  __m256 s = acc[0];
  for (int j = 1; j < kAvx2Chains; ++j) s = _mm256_add_ps(s, acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float t = 0;
  for (float v : lanes) t += v;
  return t / (8.f * kAvx2Chains);
}

float FmaScalar(int64_t iters, float start, float a, float b) {
  float acc[kScalarChains];
  for (int j = 0; j < kScalarChains; ++j) acc[j] = start + j * 1e-6f;
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kScalarChains; ++j) acc[j] = acc[j] * a + b;
  }
  float t = 0;
  for (float v : acc) t += v;
  return t / kScalarChains;
}

FmaIsa Resolve(FmaIsa isa) {
  const FmaIsa best = BestFmaIsa();
  if (isa == FmaIsa::kAuto) return best;
  auto rank = [](FmaIsa i) { return i == FmaIsa::kAvx512 ? 2 : i == FmaIsa::kAvx2 ? 1 : 0; };
  return rank(isa) <= rank(best) ? isa : best;
}

// ---- streaming sums ----

__attribute__((target("avx512f"))) float SumAvx512(const float* p, int64_t n) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 128 <= n; i += 128) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_loadu_ps(p + i + 16 * j));
  }
  for (; i + 16 <= n; i += 16) acc[0] = _mm512_add_ps(acc[0], _mm512_loadu_ps(p + i));
  __m512 s = acc[0];
  for (int j = 1; j < 8; ++j) s = _mm512_add_ps(s, acc[j]);
  return Lanes512(s);
}

__attribute__((target("avx2"))) float SumAvx2(const float* p, int64_t n) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(p + i + 8 * j));
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_add_ps(acc[0], _mm256_loadu_ps(p + i));
  __m256 s = acc[0];
  for (int j = 1; j < 8; ++j) s = _mm256_add_ps(s, acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float t = 0;
  for (float v : lanes) t += v;
  return t;
}

float SumScalar(const float* p, int64_t n) {
  float acc[16] = {};
  for (int64_t i = 0; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += p[i + j];
  float t = 0;
  for (float v : acc) t += v;
  return t;
}

volatile float g_sink;  // keeps the measured loops' results alive

}  // namespace

absl::StatusOr<GraphCost> CountGraphCost(const ir::Graph& g, const std::set<std::string>& inputs) {
  GraphCost c;
  std::set<int> outputs;
  for (const ir::Output& o : g.outputs()) {
    if (o.node < 0 || o.node >= g.num_nodes())
      return absl::InvalidArgumentError("roofline: output '" + o.name + "' names node " +
                                        std::to_string(o.node) + " of a graph of " +
                                        std::to_string(g.num_nodes()));
    if (outputs.insert(o.node).second) c.output_bytes += g.node(o.node).type().byte_size();
  }
  for (const ir::Node& n : g.nodes()) {
    const int64_t bytes = n.type().byte_size();
    if (n.opcode() == ir::Opcode::kParameter) {
      if (!n.has_attr("name")) return Bad(n, "parameter without a name");
      (inputs.count(n.attr_str("name")) ? c.input_bytes : c.weight_bytes) += bytes;
      continue;
    }
    if (n.opcode() == ir::Opcode::kConstant) {
      c.weight_bytes += bytes;
      continue;
    }
    c.largest_value_bytes = std::max(c.largest_value_bytes, bytes);
    for (int op : n.operands())
      if (op < 0 || op >= n.id()) return Bad(n, "operand %" + std::to_string(op) + " out of order");
    const double out = static_cast<double>(n.type().shape.num_elements());
    if (n.opcode() == ir::Opcode::kDotGeneral) {
      if (n.operands().size() != 2) return Bad(n, "expected 2 operands");
      for (const char* a : {"lhs_contracting", "rhs_contracting"})
        if (!n.has_attr(a) || !std::holds_alternative<std::vector<int64_t>>(n.attrs().at(a)))
          return Bad(n, std::string("missing the int-list attribute ") + a);
      const Shape& lhs = g.node(n.operand(0)).type().shape;
      const Shape& rhs = g.node(n.operand(1)).type().shape;
      const auto& lc = n.attr_ints("lhs_contracting");
      const auto& rc = n.attr_ints("rhs_contracting");
      if (lc.size() != rc.size())
        return Bad(n, "lhs_contracting and rhs_contracting differ in length");
      double k = 1;
      for (size_t i = 0; i < lc.size(); ++i) {
        if (lc[i] < 0 || lc[i] >= lhs.rank() || rc[i] < 0 || rc[i] >= rhs.rank())
          return Bad(n, "contracting dimension out of range for " + lhs.ToString() + " x " +
                            rhs.ToString());
        if (lhs.dim(lc[i]) != rhs.dim(rc[i]))
          return Bad(n, "contracted sizes differ: " + lhs.ToString() + " x " + rhs.ToString());
        k *= static_cast<double>(lhs.dim(lc[i]));
      }
      c.flops += 2 * out * k;
      ++c.contractions;
    } else if (n.opcode() == ir::Opcode::kConv2d) {
      if (n.operands().size() != 2) return Bad(n, "expected 2 operands");
      const Shape& filter = g.node(n.operand(1)).type().shape;
      const Shape& y = n.type().shape;
      if (filter.rank() != 4 || y.rank() != 4)
        return Bad(n, "expected an OIHW filter and an NCHW output, got " + filter.ToString() +
                          " and " + y.ToString());
      if (y.dim(1) != filter.dim(0))
        return Bad(n, "output channels " + std::to_string(y.dim(1)) + " differ from the filter's " +
                          filter.ToString());
      c.flops += 2 * out * static_cast<double>(filter.dim(1) * filter.dim(2) * filter.dim(3));
      ++c.contractions;
    }
  }
  return c;
}

std::string FmaIsaName(FmaIsa isa) {
  switch (isa) {
    case FmaIsa::kAuto:
      return "auto";
    case FmaIsa::kAvx512:
      return "avx512f";
    case FmaIsa::kAvx2:
      return "avx2+fma";
    case FmaIsa::kScalar:
      break;
  }
  return "scalar";
}

FmaIsa BestFmaIsa() {
  // The process's level (base/cpu_isa.h): under KILN_CPU_ISA=avx2 the roof is AVX2's.
  const CpuIsa level = ActiveCpuIsa();
  if (level >= CpuIsa::kAvx512) return FmaIsa::kAvx512;
  if (level >= CpuIsa::kAvx2) return FmaIsa::kAvx2;
  return FmaIsa::kScalar;
}

float FmaChains(FmaIsa isa, int64_t iters, float start, float a, float b) {
  switch (Resolve(isa)) {
    case FmaIsa::kAvx512:
      return FmaAvx512(iters, start, a, b);
    case FmaIsa::kAvx2:
      return FmaAvx2(iters, start, a, b);
    default:
      return FmaScalar(iters, start, a, b);
  }
}

double FmaChainsFlops(FmaIsa isa, int64_t iters) {
  const double steps = static_cast<double>(iters);
  switch (Resolve(isa)) {
    case FmaIsa::kAvx512:
      return steps * kAvx512Chains * 16 * 2;
    case FmaIsa::kAvx2:
      return steps * kAvx2Chains * 8 * 2;
    default:
      return steps * kScalarChains * 2;  // a multiply and an add
  }
}

float StreamSum(const float* p, int64_t n) {
  switch (BestFmaIsa()) {
    case FmaIsa::kAvx512:
      return SumAvx512(p, n);
    case FmaIsa::kAvx2:
      return SumAvx2(p, n);
    default:
      return SumScalar(p, n);
  }
}

FmaPeak MeasureFmaPeak(int threads, FmaIsa isa, int repetitions, double seconds_per_rep,
                       double budget_seconds) {
  FmaPeak peak;
  peak.isa = Resolve(isa);
  threads = std::max(threads, 1);
  // Steps for about seconds_per_rep on one chain set (the threads run side by side).
  int64_t iters = 1 << 14;
  for (;;) {
    const double t0 = Seconds();
    g_sink = FmaChains(peak.isa, iters, 1.f, 0.9999f, 1e-4f);
    const double dt = Seconds() - t0;
    if (dt >= seconds_per_rep / 4 || iters >= (int64_t{1} << 34)) {
      iters = std::max<int64_t>(1, static_cast<int64_t>(iters * seconds_per_rep / dt));
      break;
    }
    iters *= 4;
  }
  for (const double until = Seconds() + budget_seconds;
       peak.repetitions < std::max(repetitions, 1) || Seconds() < until;) {
    int ran = 1;
    const double t0 = Seconds();
#pragma omp parallel num_threads(threads)
    {
      const float v = FmaChains(peak.isa, iters, 1.f + omp_get_thread_num(), 0.9999f, 1e-4f);
#pragma omp master
      ran = omp_get_num_threads();
      if (v == 12345.f) g_sink = v;
    }
    const double dt = Seconds() - t0;
    peak.threads = ran;
    peak.gflop_per_s = std::max(peak.gflop_per_s, ran * FmaChainsFlops(peak.isa, iters) / dt / 1e9);
    ++peak.repetitions;
  }
  return peak;
}

ReadBandwidth MeasureReadBandwidth(int64_t bytes, int threads, int repetitions,
                                   double seconds_per_rep, double budget_seconds) {
  ReadBandwidth bw;
  threads = std::max(threads, 1);
  // Each thread's share: a multiple of 64 floats.
  const int64_t per_thread =
      std::max<int64_t>(64, (std::max<int64_t>(bytes, 64 << 10) / 4 / threads) / 64 * 64);
  const int64_t n = per_thread * threads;
  bw.bytes = n * 4;
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * 4)), &std::free);
  if (!buf) return bw;
  float* p = buf.get();
  // Touched first by the thread that reads it (page placement), then read once to warm up.
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    if (t < threads) {
      std::fill(p + t * per_thread, p + (t + 1) * per_thread, 1.f);
      const float v = StreamSum(p + t * per_thread, per_thread);
      if (v == -1.f) g_sink = v;  // never: the buffer holds ones; keeps the read alive
    }
  }
  // Passes for about seconds_per_rep.
  const double t0 = Seconds();
  g_sink = StreamSum(p, per_thread);
  const double one = std::max(Seconds() - t0, 1e-9);
  const int64_t passes = std::max<int64_t>(1, static_cast<int64_t>(seconds_per_rep / one));
  for (const double until = Seconds() + budget_seconds;
       bw.repetitions < std::max(repetitions, 1) || Seconds() < until;) {
    int ran = 1;
    const double start = Seconds();
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
#pragma omp master
      ran = omp_get_num_threads();
      float s = 0;
      if (t < threads)
        for (int64_t k = 0; k < passes; ++k) s += StreamSum(p + t * per_thread, per_thread);
      if (s == -1.f) g_sink = s;
    }
    const double dt = Seconds() - start;
    bw.threads = ran;
    // A thread the runtime did not start read nothing.
    const double read = static_cast<double>(per_thread) * 4 * passes * std::min(ran, threads);
    bw.gb_per_s = std::max(bw.gb_per_s, read / dt / 1e9);
    ++bw.repetitions;
  }
  return bw;
}

Roofline MakeRoofline(const GraphCost& cost, double peak_gflop_per_s, double gb_per_s) {
  Roofline r;
  r.cost = cost;
  r.peak_gflop_per_s = peak_gflop_per_s;
  r.gb_per_s = gb_per_s;
  r.compute_floor_us = peak_gflop_per_s > 0 ? cost.flops / (peak_gflop_per_s * 1e3) : 0;
  r.memory_floor_us = gb_per_s > 0 ? static_cast<double>(cost.min_bytes()) / (gb_per_s * 1e3) : 0;
  r.compute_bound = r.compute_floor_us >= r.memory_floor_us;
  r.floor_us = std::max(r.compute_floor_us, r.memory_floor_us);
  return r;
}

std::string Verdict(const Roofline& r, double kiln_us, double peer_us, double target,
                    const std::string& peer) {
  char b[512];
  const char* roof = r.compute_bound ? "of the FMA peak" : "of the read bandwidth";
  if (r.compute_bound) {
    if (r.cost.flops >= 1e8)
      snprintf(b, sizeof(b), "compute-bound (%.3f GFLOP at %.0f GFLOP/s)", r.cost.flops / 1e9,
               r.peak_gflop_per_s);
    else
      snprintf(b, sizeof(b), "compute-bound (%.2f MFLOP at %.0f GFLOP/s)", r.cost.flops / 1e6,
               r.peak_gflop_per_s);
  } else {
    snprintf(b, sizeof(b), "memory-bound (%.2f MB at %.0f GB/s over a %.1f MiB working set)",
             r.cost.min_bytes() / 1e6, r.gb_per_s, r.cost.working_set_bytes() / 1048576.0);
  }
  std::string v = b;
  if (r.floor_us <= 0 || kiln_us <= 0) return v + ": no floor (nothing measured)";
  const double ks = RoofShare(r, kiln_us);
  snprintf(b, sizeof(b), ": Kiln at %.0f%% %s", 100 * ks, roof);
  v += b;
  if (peer_us <= 0) return v;
  const double ps = RoofShare(r, peer_us), need = r.floor_us / (target * peer_us);
  snprintf(b, sizeof(b), ", %s at %.0f%%; %.2fx of %s would need %.0f%%%s", peer.c_str(), 100 * ps,
           target, peer.c_str(), 100 * need,
           need > 1     ? ": beyond the roof"
           : ks >= need ? ": reached"
                        : ": within the roof");
  v += b;
  if (ks < 0.2 && ps < 0.2)
    v += " (both under 20% of the roof: per-call work or a busy machine sets this row, not the "
         "roof)";
  return v;
}

}  // namespace kiln::bench
