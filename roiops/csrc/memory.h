// The memory of the CPU kernels: the arenas of a call's plans' arrays and the per-thread
// scratch of its tasks, both freed before the call returns; and the blocks of large
// outputs and gradients (empty_output, OutputCache), kept when freed for the next output
// of about their size, at most 256 MiB per process (ROIOPS_CPU_CACHE_MIB).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <vector>

#include "torch_api.h"

#if defined(__linux__)
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace roiops {

// Memory for the many small arrays of one call's plans, handed out in order and freed
// all at once when the call ends. Through malloc and free (often by another thread than
// the one that built them) the 16 arrays of each box's plan cost more than computing them.
class Arena {
 public:
  void* allocate(size_t bytes) {
    bytes = (bytes + 15) & ~size_t(15);  // new[] blocks are aligned for any scalar
    if (bytes > left_) {
      const size_t size = std::max(bytes, next_);
      blocks_.emplace_back(new unsigned char[size]);
      cur_ = blocks_.back().get(), left_ = size;
      next_ = std::min(2 * next_, size_t(1) << 20);
    }
    void* p = cur_;
    cur_ += bytes, left_ -= bytes;
    return p;
  }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
  unsigned char* cur_ = nullptr;
  size_t left_ = 0, next_ = size_t(16) << 10;
};

// An allocator from an Arena, or from the heap when it has none.
template <typename U>
struct ArenaAllocator {
  using value_type = U;
  Arena* arena = nullptr;

  ArenaAllocator() = default;
  explicit ArenaAllocator(Arena* a) : arena(a) {}
  template <typename V>
  ArenaAllocator(const ArenaAllocator<V>& other) : arena(other.arena) {}
  U* allocate(size_t n) {
    return static_cast<U*>(arena ? arena->allocate(n * sizeof(U)) : ::operator new(n * sizeof(U)));
  }
  void deallocate(U* p, size_t) {
    if (!arena) ::operator delete(p);
  }
  // A copied container takes its memory from the heap: an arena serves one thread.
  ArenaAllocator select_on_container_copy_construction() const { return ArenaAllocator(); }
  template <typename V>
  bool operator==(const ArenaAllocator<V>& other) const { return arena == other.arena; }
  template <typename V>
  bool operator!=(const ArenaAllocator<V>& other) const { return arena != other.arena; }
};

template <typename U>
using ArenaVector = std::vector<U, ArenaAllocator<U>>;

// Fresh memory is mapped page by page on first write, one fault per 4 KiB page, and for a
// large buffer that the kernel is about to fill the faults can cost as much as filling it.
// Such buffers ask for 2 MiB pages instead (Linux transparent huge pages, "madvise" mode):
// one fault per 2 MiB. Elsewhere, or if refused, nothing changes.
inline void prefer_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t a = (begin + kHuge - 1) & ~(kHuge - 1), b = (begin + bytes) & ~(kHuge - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

// The memory of large outputs and gradients: blocks mapped on their own and advised to
// 2 MiB pages, kept when freed for the next output of about their size, so that their
// pages stay mapped. glibc gives blocks of such sizes back to the system when they are
// freed (unmapping them, or trimming its heap's top), so every call would fault a fresh
// block's pages in again; and on heap memory the advice cannot apply. At most
// kCacheLimit bytes are kept per process (ROIOPS_CPU_CACHE_MIB, in MiB, sets it; 0 turns
// the cache off and outputs come from torch's allocator); torch's memory statistics do
// not count them. Linux only: elsewhere outputs come from torch's allocator.
#if defined(__linux__)
class OutputCache {
 public:
  static constexpr size_t kMinBytes = size_t(4) << 20;  // 2 MiB pages need two to fit one
  static constexpr size_t kCacheLimit = size_t(256) << 20;

  // Never destroyed: tensors may be freed while the process exits.
  static OutputCache& get() {
    static OutputCache* cache = new OutputCache();
    return *cache;
  }

  // A tensor of `sizes` and `strides` on a block of n bytes, which returns to the cache
  // when the tensor's storage is freed.
  Tensor allocate(size_t n, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                  ScalarType dtype) {
    Block* b = take(n);
    if (b == nullptr) {
      b = new Block{map(n), n};
      if (b->data == nullptr) {  // out of memory: give the kept blocks back, then try again
        release_all();
        b->data = map(n);
      }
      if (b->data == nullptr) {
        delete b;
        throw std::bad_alloc();
      }
    }
    return torch::stable::from_blob(b->data, sizes, strides, cpu_device(), dtype, [b](void*) { give_back(b); });
  }

  bool enabled() const { return limit_ > 0; }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

 private:
  struct Block {
    void* data;
    size_t size;
  };

  static void* map(size_t n) {
    void* data = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) return nullptr;
    prefer_huge_pages(data, n);
    return data;
  }

  static void unmap(Block* b) {
    munmap(b->data, b->size);
    delete b;
  }

  void release_all() {
    std::multimap<size_t, Block*> kept;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      kept.swap(free_);
      cached_ = 0;
    }
    for (auto& entry : kept) unmap(entry.second);
  }

  OutputCache() {
    const char* mib = std::getenv("ROIOPS_CPU_CACHE_MIB");
    limit_ = mib != nullptr ? static_cast<size_t>(std::strtoull(mib, nullptr, 10)) << 20 : kCacheLimit;
    // A fork while another thread holds the lock would leave the child's copy locked.
    pthread_atfork([] { get().mutex_.lock(); }, [] { get().mutex_.unlock(); }, [] { get().mutex_.unlock(); });
  }

  // A kept block of n to n + n / 8 bytes, or nullptr.
  Block* take(size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(n);
    if (it == free_.end() || it->first - n > n / 8) return nullptr;
    Block* b = it->second;
    free_.erase(it);
    cached_ -= b->size;
    return b;
  }

  static void give_back(Block* b) {
    OutputCache& cache = get();
    {
      std::lock_guard<std::mutex> lock(cache.mutex_);
      if (cache.cached_ + b->size <= cache.limit_) {
        // First among its size: the block freed last is taken first, its lines likeliest cached.
        cache.free_.emplace_hint(cache.free_.lower_bound(b->size), b->size, b);
        cache.cached_ += b->size;
        return;
      }
    }
    unmap(b);
  }

  std::mutex mutex_;
  std::multimap<size_t, Block*> free_;
  size_t cached_ = 0;
  size_t limit_ = kCacheLimit;
};
#endif

// An output, gradient or buffer the kernel writes in full, uninitialised: from OutputCache
// when large. 4-D tensors take the options' layout, others are contiguous.
inline Tensor empty_output(const std::vector<int64_t>& sizes, const Options& options) {
#if defined(__linux__)
  size_t elements = 1;
  for (const int64_t s : sizes) elements *= static_cast<size_t>(s);
  const size_t bytes = elements * element_size(options.type);
  if (bytes >= OutputCache::kMinBytes && OutputCache::get().enabled()) {
    std::vector<int64_t> strides(sizes.size(), 1);
    if (sizes.size() == 4) {
      const auto dense = dense_strides(sizes[1], sizes[2], sizes[3], options.channels_last);
      strides.assign(dense.begin(), dense.end());
    } else {
      for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
    }
    return OutputCache::get().allocate(bytes, sizes, strides, options.type);
  }
#endif
  return empty(sizes, options);
}

// One scratch buffer per thread, grown on demand and left uninitialised (pages of a large
// tile that a task never touches cost nothing). Each buffer has its cache lines to itself:
// small buffers of two threads that shared a line would take it from each other at every
// write (false sharing).
template <typename T>
class Scratch {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>);
  static constexpr size_t kLine = 64;

 public:
  Scratch() : bufs_(static_cast<size_t>(std::max<int64_t>(num_threads(), 1))), sizes_(bufs_.size(), 0) {}
  T* get(int64_t size) {
    const size_t t = std::min<size_t>(static_cast<size_t>(thread_num()), bufs_.size() - 1);
    if (sizes_[t] < size) {
      const size_t bytes = (static_cast<size_t>(size) * sizeof(T) + kLine - 1) / kLine * kLine;
      bufs_[t].reset(static_cast<T*>(::operator new(bytes, std::align_val_t(kLine))));
      sizes_[t] = size;
      prefer_huge_pages(bufs_[t].get(), bytes);
    }
    return bufs_[t].get();
  }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t(kLine)); }
  };
  std::vector<std::unique_ptr<T, Free>> bufs_;
  std::vector<int64_t> sizes_;
};

}  // namespace roiops
