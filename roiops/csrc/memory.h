// Memory the CPU kernels take for a call's own use and free before it returns: the
// arenas of its plans' arrays and the per-thread scratch of its tasks. Outputs come from
// torch's allocator (at::empty).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

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

// One scratch buffer per thread, grown on demand and left uninitialised (pages of a large
// tile that a task never touches cost nothing).
template <typename T>
class Scratch {
 public:
  Scratch() : bufs_(static_cast<size_t>(std::max(at::get_num_threads(), 1))), sizes_(bufs_.size(), 0) {}
  T* get(int64_t size) {
    const size_t t = std::min<size_t>(static_cast<size_t>(at::get_thread_num()), bufs_.size() - 1);
    if (sizes_[t] < size) {
      bufs_[t].reset(new T[static_cast<size_t>(size)]);
      sizes_[t] = size;
    }
    return bufs_[t].get();
  }

 private:
  std::vector<std::unique_ptr<T[]>> bufs_;
  std::vector<int64_t> sizes_;
};

}  // namespace roiops
