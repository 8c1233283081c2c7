#include "kiln/base/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

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

}  // namespace kiln
