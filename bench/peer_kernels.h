// What the peer's kernels really are (DESIGN.md §5), for the serve compute benchmark: ONNX
// Runtime's library has no symbols and its logs say nothing about MLAS, so this samples the peer
// process with `perf record -e cpu-clock` while it computes, disassembles the sampled addresses
// of its libonnxruntime with objdump and weighs them by instruction class: 512-bit (zmm), 256-bit
// (ymm), 128-bit or scalar SIMD (xmm), `pause` (a thread pool spinning) and other. The verdict
// comes from the width of the sampled FMAs (a kernel's inner loop).
//
//   json k = ProfilePeerKernels(peer_pid, "/tmp/work", [&] { RunPeerForHalfASecond(); });
//   k["summary"]  // "...: its FMAs are 512-bit (zmm): AVX-512 kernels", or k["error"]
#ifndef KILN_BENCH_PEER_KERNELS_H_
#define KILN_BENCH_PEER_KERNELS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace kiln::bench {

// Runs `run` with `perf record` attached to `pid`, then ClassifySamples on what it recorded in
// the library whose path contains `library` (from /proc/pid/maps). {"error": why} where perf or
// objdump is missing, not allowed, or recorded nothing there.
nlohmann::json ProfilePeerKernels(pid_t pid, const std::string& work_dir,
                                  const std::function<void()>& run,
                                  const std::string& library = "libonnxruntime.so");

// `perf report --stdio --sort dso,sym` text -> the percentage of all samples at each address of
// a symbol-less library whose name contains `dso` ("  19.32%  libonnxruntime.so.1  [.] 0x18156d2").
std::map<uint64_t, double> ParsePerfReport(const std::string& report, const std::string& dso);

// The sampled addresses grouped into [first, last + 16) ranges with gaps under 4 KiB, at most
// `max_ranges` of them (those with the most samples).
std::vector<std::pair<uint64_t, uint64_t>> SampleRanges(const std::map<uint64_t, double>& share,
                                                        size_t max_ranges = 64);

// `objdump -d --no-show-raw-insn` text -> instruction text by address ("vfmadd231ps %zmm0,...").
std::map<uint64_t, std::string> ParseObjdump(const std::string& text);

// Classes every sampled address found in `insn` by it and the (up to) three instructions before
// it, nearest first (a cpu-clock sample lands just after the instruction that held the core: the
// prefetch after a memory-bound FMA, the pop after a pause). JSON: {zmm,ymm,xmm,pause,other}_share,
// fma_shares, top (3 vector instructions), share_of_samples_in_library, share_of_those_classified,
// path (the verdict) and summary (one line); {"error"} when no sampled address was disassembled.
nlohmann::json ClassifySamples(const std::map<uint64_t, double>& share,
                               const std::map<uint64_t, std::string>& insn,
                               const std::string& library);

}  // namespace kiln::bench

#endif  // KILN_BENCH_PEER_KERNELS_H_
