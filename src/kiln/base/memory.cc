#include "kiln/base/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kiln {
namespace {

// Below this, malloc's recycled memory is usually already mapped.
constexpr size_t kMmapThreshold = 1 << 20;

}  // namespace

std::shared_ptr<uint8_t> AllocatePopulated(int64_t bytes, int64_t alignment) {
  size_t a = static_cast<size_t>(alignment > 0 ? alignment : 1);
  size_t n = static_cast<size_t>(bytes > 0 ? bytes : 0);
  n = (n + a - 1) / a * a;
  if (n == 0) n = a;  // every pointer stays valid, even for empty arenas
  if (n >= kMmapThreshold) {
    void* p =
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Anonymous pages are zero; MAP_POPULATE mapped them all.
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [n](uint8_t* q) { munmap(q, n); });
  }
  void* p = std::aligned_alloc(a, n);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

int64_t ParseProcStatusBytes(std::string_view status_text, std::string_view field) {
  std::istringstream in{std::string(status_text)};
  const std::string prefix = std::string(field) + ":";
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    std::istringstream fields(line.substr(prefix.size()));
    int64_t kib = -1;
    std::string unit;
    fields >> kib >> unit;
    if (fields.fail() || kib < 0 || unit != "kB") return -1;
    return kib * 1024;
  }
  return -1;
}

int64_t ProcStatusBytes(std::string_view field) {
  std::ifstream f("/proc/self/status");
  if (!f) return -1;
  std::stringstream text;
  text << f.rdbuf();
  return ParseProcStatusBytes(text.str(), field);
}

double MemcpyBytesPerSecond(int threads, int reps) {
  constexpr size_t kBytes = size_t{64} << 20;
  threads = std::max(threads, 1);
  reps = std::max(reps, 1);
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);  // first touch before timing
  const size_t chunk = (kBytes + threads - 1) / threads;
  std::vector<double> times;
  for (int i = 0; i < reps + 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t lo = std::min(kBytes, t * chunk), hi = std::min(kBytes, lo + chunk);
        std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
      });
    }
    for (std::thread& th : pool) th.join();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i >= 2) times.push_back(s);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return 2.0 * static_cast<double>(kBytes) / times[times.size() / 2];
}

}  // namespace kiln
