// Zeroed host memory whose pages are already mapped, for arenas and workspaces that must never
// page-fault while a step runs. Large blocks come from mmap with MAP_POPULATE (the kernel maps
// every page in one call, several times cheaper than faulting them in one by one from a memset on
// these VMs); small ones from aligned_alloc + memset.
//
//   std::shared_ptr<uint8_t> arena = AllocatePopulated(64 << 20, 64);
#ifndef KILN_BASE_MEMORY_H_
#define KILN_BASE_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string_view>

namespace kiln {

// Every buffer of an arena starts at a multiple of this (a cache line; what oneDNN wants).
inline constexpr int64_t kBufferAlignment = 64;

// `bytes` rounded up to a multiple of `alignment` (a power of two).
inline constexpr int64_t AlignUp(int64_t bytes, int64_t alignment = kBufferAlignment) {
  return (bytes + alignment - 1) & ~(alignment - 1);
}

// `bytes` zeroed bytes (at least `alignment`, a power of two up to the page size) aligned to
// `alignment`, every page mapped. Throws std::bad_alloc when the memory is not available.
std::shared_ptr<uint8_t> AllocatePopulated(int64_t bytes, int64_t alignment);

// The bytes of a "<field>: <n> kB" line of a /proc/<pid>/status text (VmHWM, VmRSS, ...), or -1
// when the field is absent or malformed.
int64_t ParseProcStatusBytes(std::string_view status_text, std::string_view field);
// The same for this process (/proc/self/status), or -1 where there is none.
int64_t ProcStatusBytes(std::string_view field);

// memcpy bandwidth in bytes read + written per second: 64 MiB copied in one slice per thread on
// `threads` threads, the median of `reps` copies after 2 untimed ones (the buffers are touched
// before timing). The memory-bound limit that benchmarks and the profile rate kernels against.
double MemcpyBytesPerSecond(int threads, int reps);

}  // namespace kiln

#endif  // KILN_BASE_MEMORY_H_
