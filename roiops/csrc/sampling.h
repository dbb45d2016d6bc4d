// Separable planning and task machinery of the CPU kernels. A box's RoIAlign samples are
// the product of one plan of sample rows and one of sample columns (AxisPlan, AlignPlan),
// and its RoIPool bins the product of row and column ranges (PoolPlan); both are built
// once per call and shared by all channels. Also here: the instruction-set versions of the
// per-box kernels, task scheduling, scratch buffers, channels-last tiles and backward
// bands. The rules these plans apply to one sample or bin are geometry.h's; the plans'
// own arithmetic (box extents, bin sizes, grids, bin edges) also keeps torchvision's
// operations and order (docs/semantics.md), so float32 results agree with it bit for bit
// where the formulas are the same.
#pragma once

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "geometry.h"

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

// Sample positions of one box along one axis. Samples inside the map are kept bin by
// bin in parallel arrays (lo, hi, l, h), so that loops over them vectorise; inside the
// map a bin's samples are consecutive (positions are monotonic), so sample t of bin b has
// index first_in[b] + t - begin[b] inside its bin.
template <typename T>
struct AxisPlan {
  int64_t grid = 0;                  // samples per bin (<= 0: the bins have none)
  ArenaVector<int32_t> lo, hi;       // taps of the inside samples, bin-major
  ArenaVector<T> l, h;
  ArenaVector<int64_t> begin;        // inside samples of bin b: [begin[b], begin[b + 1])
  ArenaVector<int64_t> first_in;     // per bin: index of its first inside sample
  ArenaVector<int64_t> first_out;    // per bin: index of its first outside sample, or -1
  ArenaVector<T> min_weight;         // per bin: smallest nonzero l or h of its samples (inf: none)
  int64_t cell_lo = 0, cell_hi = -1; // cells touched by any tap: [cell_lo, cell_hi]
  T start = 0, bin = 0;              // the bins: sample_position(start, bin, ...)
  int64_t size = 0;                  // the map's side

  explicit AxisPlan(Arena* arena = nullptr)
      : lo(ArenaAllocator<int32_t>(arena)), hi(ArenaAllocator<int32_t>(arena)), l(ArenaAllocator<T>(arena)),
        h(ArenaAllocator<T>(arena)), begin(ArenaAllocator<int64_t>(arena)), first_in(ArenaAllocator<int64_t>(arena)),
        first_out(ArenaAllocator<int64_t>(arena)), min_weight(ArenaAllocator<T>(arena)) {}

  void build(T start_, T bin_, int64_t grid_, int64_t pooled, int64_t size_) {
    grid = grid_;
    start = start_, bin = bin_, size = size_;
    // Each array is sized once: plans are built per box and call, and growing them sample
    // by sample cost more in malloc and free than the samples themselves.
    begin.assign(pooled + 1, 0);
    first_in.assign(pooled, 0);
    first_out.assign(pooled, -1);
    min_weight.assign(pooled, std::numeric_limits<T>::infinity());
    cell_lo = size, cell_hi = -1;
    auto at = [&](int64_t b, int64_t s) { return sample_position(start, bin, b, s, grid); };
    // The first s in [0, grid) with pred(s), for pred false then true along s.
    auto first = [&](int64_t b, auto pred) {
      int64_t a = 0, e = grid;
      while (a < e) {
        const int64_t m = a + (e - a) / 2;
        if (pred(at(b, m))) e = m; else a = m + 1;
      }
      return a;
    };
    const T top = static_cast<T>(size);
    for (int64_t b = 0; b < pooled; ++b) {
      // Positions are monotonic in s (every rounding step is), so the samples inside
      // [-1, size] are one run [s0, s1), found by bisection: the cost follows the samples
      // inside the map, not the grid (which for a huge box can be 2^25 per bin).
      int64_t s0 = 0, s1 = 0;
      if (grid > 0) {
        if (bin >= 0) {
          s0 = first(b, [&](T v) { return v >= T(-1); });
          s1 = std::max(s0, first(b, [&](T v) { return v > top; }));
        } else {
          s0 = first(b, [&](T v) { return v <= top; });
          s1 = std::max(s0, first(b, [&](T v) { return v < T(-1); }));
        }
        first_out[b] = s0 > 0 ? 0 : (s1 < grid ? s1 : -1);
        if (s1 > s0) first_in[b] = s0;
      }
      begin[b + 1] = begin[b] + (s1 - s0);
    }
    const size_t n = static_cast<size_t>(begin[pooled]);
    lo.resize(n), hi.resize(n), l.resize(n), h.resize(n);
    for (int64_t b = 0; b < pooled; ++b) {
      for (int64_t t = begin[b]; t < begin[b + 1]; ++t) {
        Tap<T> tap;
        make_tap(at(b, first_in[b] + t - begin[b]), size, tap);  // inside by construction
        lo[t] = static_cast<int32_t>(tap.lo);
        hi[t] = static_cast<int32_t>(tap.hi);
        l[t] = tap.l;
        h[t] = tap.h;
        cell_lo = std::min(cell_lo, tap.lo);
        cell_hi = std::max(cell_hi, tap.hi);
        for (const T w : {tap.l, tap.h}) {
          if (w != T(0)) min_weight[b] = std::min(min_weight[b], w);
        }
      }
    }
  }

  // Derivatives of the inside samples (in lo/hi/l/h order): of l with respect to the
  // start of the bins, dl = tap_slope, and with respect to the bin size, dl * d position /
  // d bin (box gradients, semantics.md "roi_align box gradient").
  void slopes(std::vector<T>& dl, std::vector<T>& dl_bin) const {
    dl.resize(lo.size());
    dl_bin.resize(lo.size());
    for (size_t b = 0; b + 1 < begin.size(); ++b) {
      for (int64_t t = begin[b]; t < begin[b + 1]; ++t) {
        const int64_t s = first_in[b] + t - begin[b];
        dl[t] = tap_slope(sample_position(start, bin, static_cast<int64_t>(b), s, grid), size);
        dl_bin[t] = dl[t] * sample_position_slope<T>(static_cast<int64_t>(b), s, grid);
      }
    }
  }

  // Most inside samples of one bin.
  int64_t widest_bin() const {
    int64_t m = 0;
    for (size_t b = 0; b + 1 < begin.size(); ++b) m = std::max(m, begin[b + 1] - begin[b]);
    return m;
  }

  bool empty() const { return lo.empty(); }

  // Position in lo/hi/l/h of sample s of bin b, or -1 when it lies outside the map.
  int64_t find(int64_t b, int64_t s) const {
    const int64_t t = begin[b] + s - first_in[b];
    return s >= first_in[b] && t < begin[b + 1] ? t : -1;
  }
};

// One sample's bilinear neighbours (rows y0, y1; columns x0, x1; y0 < 0: outside the map)
// and weights w1 = hy*hx, w2 = hy*lx, w3 = ly*hx, w4 = ly*lx.
template <typename T>
struct MaxSample {
  int32_t y0, y1, x0, x1;
  T w1, w2, w3, w4;
};

// Boxes with at most this many samples get a MaxSample table (32 bytes each).
constexpr int64_t kMaxSampleTable = 4096;
// Entries of all boxes' tables together in one call (128 MiB of MaxSample<float>).
constexpr int64_t kSampleTableBudget = int64_t(1) << 22;

// RoIAlign plan of one box, shared by all channels: the taps of its sample rows and
// columns (a sample's four weights are products of one row and one column tap).
template <typename T>
struct AlignPlan {
  int64_t batch = 0;
  int64_t grid_h = 0, grid_w = 0;
  T count = 1;
  AxisPlan<T> ys, xs;
  // The box was widened to 1 cell along the axis (aligned=False): its size no longer
  // follows its corners.
  bool clamped_h = false, clamped_w = false;
  // "max" only: the bin grid exceeds kMaxArgmaxGrid samples (then nothing else is built).
  bool grid_too_large = false;
  // "max", small grids: every sample of every bin, [bin * grid_h * grid_w + index], so
  // that backward finds an argmax's neighbours and weights with one lookup.
  std::vector<MaxSample<T>> samples;

  explicit AlignPlan(Arena* arena = nullptr) : ys(arena), xs(arena) {}

  void build(const T* roi, T scale, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned,
             int64_t height, int64_t width, bool max_mode) {
    batch = static_cast<int64_t>(roi[0]);
    const T offset = aligned ? T(0.5) : T(0);
    const T x_start = roi[1] * scale - offset;
    const T y_start = roi[2] * scale - offset;
    T roi_w = roi[3] * scale - offset - x_start;
    T roi_h = roi[4] * scale - offset - y_start;
    clamped_w = !aligned && roi_w < T(1);
    clamped_h = !aligned && roi_h < T(1);
    if (!aligned) {
      roi_w = std::max(roi_w, T(1));
      roi_h = std::max(roi_h, T(1));
    }
    const T bin_h = roi_h / static_cast<T>(ph);
    const T bin_w = roi_w / static_cast<T>(pw);
    grid_h = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(bin_h));
    grid_w = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(bin_w));
    count = static_cast<T>(std::max<int64_t>(grid_h * grid_w, 1));  // grids < 2^26 per axis: no overflow
    samples.clear();
    grid_too_large = max_mode && grid_h > 0 && grid_w > 0 && grid_h * grid_w > kMaxArgmaxGrid;
    if (grid_too_large) {
      grid_h = grid_w = 0;  // an empty plan, never run
      return;
    }
    ys.build(y_start, bin_h, grid_h, ph, height);
    xs.build(x_start, bin_w, grid_w, pw, width);
  }

  // Entries `samples` would take (build_samples), 0 for a plan that gets none.
  int64_t sample_table_size(int64_t ph, int64_t pw) const {
    const int64_t gg = grid_h * grid_w;
    return !empty() && gg <= kMaxSampleTable && ph * pw * gg <= kMaxSampleTable ? ph * pw * gg : 0;
  }

  void build_samples(int64_t ph, int64_t pw) {
    samples.resize(static_cast<size_t>(ph * pw * grid_h * grid_w));
    MaxSample<T>* e = samples.data();
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) {
        for (int64_t iy = 0; iy < grid_h; ++iy) {
          const int64_t ty = ys.find(i, iy);
          for (int64_t ix = 0; ix < grid_w; ++ix, ++e) {
            const int64_t tx = xs.find(j, ix);
            if (ty < 0 || tx < 0) {
              *e = MaxSample<T>{-1, -1, -1, -1, 0, 0, 0, 0};
              continue;
            }
            *e = MaxSample<T>{ys.lo[ty], ys.hi[ty], xs.lo[tx], xs.hi[tx], ys.h[ty] * xs.h[tx], ys.h[ty] * xs.l[tx],
                              ys.l[ty] * xs.h[tx], ys.l[ty] * xs.l[tx]};
          }
        }
      }
    }
  }

  int64_t pw() const { return static_cast<int64_t>(xs.first_out.size()); }

  // No sample of the box lies inside the map.
  bool empty() const { return grid_h <= 0 || grid_w <= 0 || ys.empty() || xs.empty(); }

  // Width of the span of map columns the box's taps touch.
  int64_t x_span() const { return empty() ? 0 : xs.cell_hi - xs.cell_lo + 1; }

  // Index of the first sample of bin (i, j) that lies outside the map (value 0), or -1.
  int64_t first_outside(int64_t i, int64_t j) const {
    if (grid_h <= 0 || grid_w <= 0) return -1;
    int64_t best = -1;
    if (xs.first_out[j] >= 0) best = xs.first_out[j];  // in row 0, unless row 0 is out too
    if (ys.first_out[i] >= 0) {
      const int64_t row = ys.first_out[i] * grid_w;
      if (best < 0 || row < best) best = row;
    }
    return best;
  }

  // Map rows [first, second] that the box's taps touch; first > second when none.
  std::pair<int64_t, int64_t> row_span() const {
    return empty() ? std::make_pair<int64_t, int64_t>(1, 0) : std::make_pair(ys.cell_lo, ys.cell_hi);
  }

  // The same for the taps of bin row i. Positions are monotonic: the extreme rows are
  // those of the row's first and last samples.
  std::pair<int64_t, int64_t> bin_rows(int64_t i) const {
    if (empty() || ys.begin[i] == ys.begin[i + 1]) return {1, 0};
    const int64_t ya = ys.begin[i], yb = ys.begin[i + 1];
    return {std::min(ys.lo[ya], ys.lo[yb - 1]), std::max(ys.hi[ya], ys.hi[yb - 1])};
  }
};

// Caffe (Fast R-CNN, torchvision) or mmdetection (continuous) RoIPool bins of one box.
template <typename T>
struct PoolPlan {
  int64_t batch = 0;
  ArenaVector<int64_t> h0, h1, w0, w1;  // bin i covers rows [h0[i], h1[i]), clipped to the map

  explicit PoolPlan(Arena* arena = nullptr)
      : h0(ArenaAllocator<int64_t>(arena)), h1(ArenaAllocator<int64_t>(arena)), w0(ArenaAllocator<int64_t>(arena)),
        w1(ArenaAllocator<int64_t>(arena)) {}

  void build(const T* roi, T scale, int64_t ph, int64_t pw, bool continuous, int64_t height, int64_t width) {
    batch = static_cast<int64_t>(roi[0]);
    if (continuous) {
      const T x_start = roi[1] * scale, y_start = roi[2] * scale;
      const T roi_w = (roi[3] + 1) * scale - x_start;
      const T roi_h = (roi[4] + 1) * scale - y_start;
      const bool empty = roi_w <= 0 || roi_h <= 0;
      bins(y_start, roi_h / static_cast<T>(ph), ph, height, empty, h0, h1, true);
      bins(x_start, roi_w / static_cast<T>(pw), pw, width, empty, w0, w1, true);
    } else {
      const int64_t x1 = round_half_away(roi[1] * scale);
      const int64_t y1 = round_half_away(roi[2] * scale);
      const int64_t x2 = round_half_away(roi[3] * scale);
      const int64_t y2 = round_half_away(roi[4] * scale);
      const int64_t roi_w = std::max<int64_t>(x2 - x1 + 1, 1);
      const int64_t roi_h = std::max<int64_t>(y2 - y1 + 1, 1);
      bins(static_cast<T>(y1), static_cast<T>(roi_h) / static_cast<T>(ph), ph, height, false, h0, h1, false);
      bins(static_cast<T>(x1), static_cast<T>(roi_w) / static_cast<T>(pw), pw, width, false, w0, w1, false);
    }
  }

 private:
  static void bins(T start, T bin, int64_t pooled, int64_t size, bool empty, ArenaVector<int64_t>& lo,
                   ArenaVector<int64_t>& hi, bool continuous) {
    lo.resize(pooled);
    hi.resize(pooled);
    for (int64_t p = 0; p < pooled; ++p) {
      pool_bin_edges(start, bin, p, size, continuous, lo[p], hi[p]);
      if (empty) hi[p] = lo[p];
    }
  }
};

// The plans (AlignPlan, PoolPlan) of K boxes: build(plan, k) for each, in parallel by
// chunks of boxes, each chunk's arrays from an Arena of its own (one thread builds a chunk).
template <typename Plan>
class BoxPlans {
 public:
  template <typename F>
  BoxPlans(int64_t K, const F& build) : arenas_(static_cast<size_t>((K + kChunk - 1) / kChunk)) {
    plans_.reserve(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) plans_.emplace_back(&arenas_[static_cast<size_t>(k / kChunk)]);
    at::parallel_for(0, static_cast<int64_t>(arenas_.size()), 1, [&](int64_t c0, int64_t c1) {
      for (int64_t k = c0 * kChunk; k < std::min(K, c1 * kChunk); ++k) build(plans_[k], k);
    });
  }
  size_t size() const { return plans_.size(); }
  Plan& operator[](size_t k) { return plans_[k]; }
  const Plan& operator[](size_t k) const { return plans_[k]; }
  auto begin() const { return plans_.begin(); }
  auto end() const { return plans_.end(); }

 private:
  static constexpr int64_t kChunk = 16;
  std::vector<Arena> arenas_;  // declared first: outlives the plans
  std::vector<Plan> plans_;
};

// ---- Instruction sets ---------------------------------------------------------------

// The per-box kernels are compiled twice, for x86-64-v3 (AVX2 and FMA) and for baseline
// x86-64, and the dynamic loader picks the version for the running CPU (function
// multiversioning), so the wheel still runs on any x86-64. ROIOPS_NO_MULTIVERSION turns
// this off. -ffp-contract=off keeps the compiler from fusing operations on its own, so
// both versions compute the same bits; only explicit std::fma calls use FMA.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(ROIOPS_NO_MULTIVERSION)
#define ROIOPS_SIMD __attribute__((target_clones("arch=x86-64-v3", "default")))
inline bool hardware_fma() {
  static const bool has = __builtin_cpu_supports("x86-64-v3");
  return has;
}
#else
#define ROIOPS_SIMD
inline bool hardware_fma() {
#if defined(__aarch64__) || defined(__FMA__)
  return true;
#else
  return false;  // std::fma would be a slow library call
#endif
}
#endif

// May a float32 division t / c (c a sample count) be replaced by Markstein's FMA
// sequence (roi_align.cpp, TermDiv::kFma)? Only where FMA is an instruction, and for the
// counts that sequence was checked exhaustively against division.
template <typename T>
inline bool float_fma_div_ok(T c) {
  return std::is_same_v<T, float> && c <= T(65536) && hardware_fma();
}

// ---- Scheduling shared by the kernels ------------------------------------------------

// Runs f(task) for every task in [0, n) on all threads, handing tasks out one at a time:
// task costs vary (boxes differ in size), and a static split would leave a thread idle.
// Results never depend on which thread runs a task.
template <typename F>
void parallel_tasks(int64_t n, const F& f) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) f(t);
  });
}

// Fresh memory is mapped page by page on first write, and on this kind of machine a 4 KiB
// page fault costs microseconds: writing a new 138 MB gradient took longer than computing
// it. Large buffers we are about to fill ask for 2 MiB pages instead (Linux transparent
// huge pages, "madvise" mode); elsewhere, or if refused, nothing changes.
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

// The memory of large outputs: blocks mapped on their own and advised to 2 MiB pages,
// kept when freed for the next output of about their size, so that their pages stay
// mapped. A 7.8 MB gradient faulted in afresh took 2-3 ms, as long as the rest of its
// backward, whenever glibc had given its heap's top back between two calls; and on heap
// memory the advice cannot apply. At most kCacheLimit bytes are kept
// (ROIOPS_CPU_CACHE_MIB, in MiB, sets it; 0 keeps nothing). Linux only: elsewhere outputs
// come from at::empty.
#if defined(__linux__)
class OutputCache final : public c10::Allocator {
 public:
  static constexpr size_t kMinBytes = size_t(4) << 20;  // 2 MiB pages need two to fit one
  static constexpr size_t kCacheLimit = size_t(256) << 20;

  // Never destroyed: tensors may be freed while the process exits.
  static OutputCache& get() {
    static OutputCache* cache = new OutputCache();
    return *cache;
  }

  c10::DataPtr allocate(size_t n) override {
    Block* b = take(n);
    if (b == nullptr) {
      b = new Block{map(n), n};
      if (b->data == nullptr && n > 0) {  // out of memory: give the kept blocks back, then try again
        release_all();
        b->data = map(n);
      }
      if (b->data == nullptr && n > 0) {
        delete b;
        TORCH_CHECK_WITH(OutOfMemoryError, false, "roiops: out of memory allocating an output of ", n, " bytes");
      }
    }
    return {b->data, b, &OutputCache::give_back, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }

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
    if (n == 0) return nullptr;
    void* data = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) return nullptr;
    prefer_huge_pages(data, n);
    return data;
  }

  static void unmap(Block* b) {
    if (b->data != nullptr) munmap(b->data, b->size);
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

  static void give_back(void* ctx) {
    Block* b = static_cast<Block*>(ctx);
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

// at::empty for an output the kernel writes in full: from OutputCache when large.
inline at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
#if defined(__linux__)
  const size_t bytes = static_cast<size_t>(c10::multiply_integers(sizes)) * options.dtype().itemsize();
  if (bytes >= OutputCache::kMinBytes && options.device().type() == c10::DeviceType::CPU) {
    return at::detail::empty_generic(sizes, &OutputCache::get(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                     c10::typeMetaToScalarType(options.dtype()), options.memory_format_opt());
  }
#endif
  return at::empty(sizes, options);
}

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
      prefer_huge_pages(bufs_[t].get(), static_cast<size_t>(size) * sizeof(T));
    }
    return bufs_[t].get();
  }

 private:
  std::vector<std::unique_ptr<T[]>> bufs_;
  std::vector<int64_t> sizes_;
};

// Boxes of each image, in increasing k (the order every backward accumulates in).
inline std::vector<std::vector<int64_t>> boxes_by_image(const std::vector<int64_t>& batch, int64_t n_images) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n_images));
  for (size_t k = 0; k < batch.size(); ++k) out[static_cast<size_t>(batch[k])].push_back(static_cast<int64_t>(k));
  return out;
}

// Work is split into (image, block of channels) tasks, and for backward also bands of map
// rows: a task's slice of the map, copied into a compact channels-last tile, stays in
// cache while all the image's boxes use it. kTileChannels per block (the tile of a
// 200 x 336 map is then 4 MiB; wider blocks measured slower), fewer when the tasks would
// not keep the threads busy.
constexpr int64_t kTileChannels = 16;

// Calls f(std::integral_constant<int64_t, kN>) with kN = n for the tile width, so that
// the kernels' channel loops are unrolled, else kN = 0 (any n).
template <typename F>
void with_width(int64_t n, const F& f) {
  if (n == kTileChannels) {
    f(std::integral_constant<int64_t, kTileChannels>{});
  } else {
    f(std::integral_constant<int64_t, 0>{});
  }
}

inline int64_t channel_block(int64_t N, int64_t C, int64_t widest) {
  const int64_t want = 2 * static_cast<int64_t>(at::get_num_threads());
  int64_t cb = std::min<int64_t>(C, widest);
  while (cb > 4 && N * ((C + cb - 1) / cb) < want) cb /= 2;
  return std::max<int64_t>(cb, 1);
}

// Channels per task of a channels_last forward that runs each of K boxes in place: all C
// of them, unless the boxes are too few to share out; then blocks of whole vectors of 8,
// at least 32 channels each. Tasks: K * ceil(C / block).
inline int64_t cl_box_channel_block(int64_t K, int64_t C) {
  const int64_t spread = (8 * static_cast<int64_t>(at::get_num_threads()) + K - 1) / std::max<int64_t>(K, 1);
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>(spread, C / 32));
  return want == 1 ? std::max<int64_t>(C, 1) : ((C + want - 1) / want + 7) / 8 * 8;
}

// Is a tile around rect = {y0, y1, x0, x1} worth filling, for boxes whose own reads
// cover `area` cells (with overlaps)? It must not be much larger than that, and fit a
// sane amount of memory.
inline bool tile_pays(const std::array<int64_t, 4>& rect, double area, int64_t H, int64_t W, int64_t cb,
                      size_t elem) {
  const double cells = static_cast<double>(rect[1] - rect[0]) * static_cast<double>(rect[3] - rect[2]);
  return cells <= 2 * area && static_cast<double>(H) * static_cast<double>(W) * cb * elem <= double(256 << 20);
}

// Backward tasks: image n, band b of `rows` map rows, channel block. The band's gradient
// for those channels (about `bytes`) belongs to one task, which adds the boxes touching
// the band in increasing k: no races, and sums that do not depend on the thread count.
struct Bands {
  int64_t rows = 1, per_image = 1;
  std::vector<std::vector<int64_t>> boxes;  // [n * per_image + b]: boxes touching band b of image n

  // spans[k] = {first row, last row} that box k writes to (first > last: none).
  Bands(int64_t n_images, int64_t height, int64_t row_bytes, int64_t bytes, const std::vector<int64_t>& batch,
        const std::vector<std::pair<int64_t, int64_t>>& spans) {
    rows = std::max<int64_t>(1, std::min<int64_t>(height, bytes / std::max<int64_t>(row_bytes, 1)));
    per_image = (height + rows - 1) / rows;
    boxes.resize(static_cast<size_t>(n_images * per_image));
    for (size_t k = 0; k < spans.size(); ++k) {
      if (spans[k].first > spans[k].second) continue;
      for (int64_t b = spans[k].first / rows; b <= spans[k].second / rows; ++b) {
        boxes[static_cast<size_t>(batch[k] * per_image + b)].push_back(static_cast<int64_t>(k));
      }
    }
  }
};

// Asks for the n contiguous elements at p ahead of use: a run the hardware prefetchers
// would only start on after its first misses (a channels-last bin of grad, 1 KiB for 256
// channels, read from memory while the previous bin is added).
template <typename S>
__attribute__((always_inline)) inline void prefetch_run(const S* p, int64_t n) {
  constexpr int64_t kLine = 64 / sizeof(S);
  for (int64_t e = 0; e < n; e += kLine) __builtin_prefetch(p + e);
}

// Asks for a box's block of grad (or argmax) ahead of use: channels [c0, c0 + nc) of its
// ph x pw bins, at p + i * sH + j * sW + c * sC. Channels-last blocks are one short run per
// bin, 1 KiB or more apart, a pattern the hardware prefetchers do not follow.
template <typename S>
inline void prefetch_block(const S* p, int64_t sC, int64_t sH, int64_t sW, int64_t nc, int64_t ph, int64_t pw) {
  if (sC == 1) {
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) prefetch_run(p + i * sH + j * sW, nc);
    }
  } else if (sH == pw && sW == 1 && sC == ph * pw) {  // NCHW: one contiguous run
    prefetch_run(p, nc * sC);
  }
}

// Bytes of gradient accumulator per backward task (a tile that stays in a core's L2).
constexpr int64_t kBandBytes = int64_t(1) << 20;

// ---- Lanes ---------------------------------------------------------------------------

// Eight values of T (float or double) as one vector value (GCC/Clang vector extensions):
// each lane one channel, each operation the scalar one lane by lane, so code on lanes
// computes the same bits as the scalar loop it replaces; the compiler lowers a vector to
// what the instruction set of each ROIOPS_SIMD version has.
template <typename T>
struct Lanes8 {
  typedef T type __attribute__((vector_size(8 * sizeof(T))));
};
template <typename T>
using lanes8 = typename Lanes8<T>::type;

template <typename T>
inline lanes8<T> load8(const T* p) {
  lanes8<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void store8(T* p, lanes8<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define ROIOPS_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#endif
#endif

// An 8 x 8 block transposed: rows r[0..7] in, columns out (out[c][l] = r[l][c]).
template <typename T>
inline void transpose8(const lanes8<T> (&r)[8], lanes8<T> (&out)[8]) {
#ifdef ROIOPS_SHUFFLE
  // Three rounds of two-input shuffles: pairs of rows, pairs of pairs, halves.
  lanes8<T> t[8], u[8];
  for (int a = 0; a < 8; a += 2) {
    t[a] = ROIOPS_SHUFFLE(r[a], r[a + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[a + 1] = ROIOPS_SHUFFLE(r[a], r[a + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int a = 0; a < 8; a += 4) {
    u[a] = ROIOPS_SHUFFLE(t[a], t[a + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[a + 1] = ROIOPS_SHUFFLE(t[a], t[a + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[a + 2] = ROIOPS_SHUFFLE(t[a + 1], t[a + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[a + 3] = ROIOPS_SHUFFLE(t[a + 1], t[a + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int a = 0; a < 4; ++a) {
    out[a] = ROIOPS_SHUFFLE(u[a], u[a + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    out[a + 4] = ROIOPS_SHUFFLE(u[a], u[a + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
#else
  for (int c = 0; c < 8; ++c) {
    for (int l = 0; l < 8; ++l) out[c][l] = r[l][c];
  }
#endif
}

// transpose_block's default order, for a src of at most kChunkRows rows, goes by passes of
// kChunkCols columns, each down all rows, so that the dst rows a pass fills (one run
// each) are finished while still in L1. One pass over all columns wrote an R-FCN tile of
// 1900 cells x 24 lanes (182 KB) three times over, each row block's stores fetching the
// lines again from L2: on an Intel Xeon (2 MiB L2) those tile loads took 1.8x as long.
// Taller sources keep one pass: 64 rows read as 64 short runs per pass were 2-15%
// slower than 8 long ones (the 256-channel tiles).
constexpr int64_t kChunkRows = 32, kChunkCols = 64;

// dst[j * ds + i] = src[i * ss + j] for i < rows, j < cols: a matrix transposed, by 8 x 8
// blocks in registers for float and double (values are only moved or converted).
// kPadRows: dst rows have room for rows rounded up to a multiple of 8, which get zeros.
// kReadPastCols: src rows may be read up to cols rounded up to a multiple of 8.
// Default order: row blocks outer, by passes of kChunkCols columns for short sources.
// kColsOuter: blocks go along src rows within each block of 8 columns, so that dst is
// written 8 rows at a time from start to end; for dst rows that are long and far apart
// (planes), 8 sequential write streams instead of one per column, which measured 5-25%
// faster PS backwards. kPrefetch (default order): while a pass transposes, the lines of
// the next pass are prefetched, one line of each src row per line's worth of columns, for
// src rows far apart (NCHW planes), more streams than the hardware prefetchers follow. On
// an AMD EPYC (Zen 4), 21-class NCHW PS forwards were 13-18% faster right after 5 ms of
// other work (the map then in memory), within 3% either way with the map in cache; a
// burst of the next pass's lines at once gained less, two passes ahead the same, and
// prefetches into L2 only nothing. Always inlined, so that it is compiled for the
// instruction set of the ROIOPS_SIMD caller.
template <bool kPadRows, bool kReadPastCols, bool kColsOuter = false, bool kPrefetch = false, typename S, typename D>
__attribute__((always_inline)) inline void transpose_block(const S* src, int64_t ss, int64_t rows, int64_t cols,
                                                         D* dst, int64_t ds) {
  if constexpr (std::is_same_v<S, D> && std::is_floating_point_v<D>) {
    const auto block = [&](int64_t i, int64_t j) __attribute__((always_inline)) {
      const int64_t ni = std::min<int64_t>(8, rows - i), nj = std::min<int64_t>(8, cols - j);
      // A block with rows or columns beyond what src or dst have: element by element.
      if ((nj < 8 && !kReadPastCols) || (ni < 8 && !kPadRows)) {
        for (int64_t k = 0; k < nj; ++k) {
          for (int64_t l = 0; l < (kPadRows ? 8 : ni); ++l) {
            dst[(j + k) * ds + i + l] = l < ni ? static_cast<D>(src[(i + l) * ss + j + k]) : D(0);
          }
        }
        return;
      }
      // Unrolled, with a test per vector, so that the vectors stay in registers: a loop up
      // to ni or nj would index them at run time, through the stack.
      lanes8<D> r[8], o[8];
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) r[l] = l < ni ? load8(src + (i + l) * ss + j) : lanes8<D>{};
      transpose8<D>(r, o);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        if (k < nj) store8(dst + (j + k) * ds + i, o[k]);
      }
    };
    if constexpr (kColsOuter) {
      for (int64_t j = 0; j < cols; j += 8) {
        for (int64_t i = 0; i < rows; i += 8) block(i, j);
      }
    } else {
      const int64_t pass = rows <= kChunkRows ? kChunkCols : cols;
      for (int64_t j0 = 0; j0 < cols; j0 += pass) {
        const int64_t j1 = std::min(cols, j0 + pass);
        for (int64_t i = 0; i < rows; i += 8) {
          for (int64_t j = j0; j < j1; j += 8) {
            if constexpr (kPrefetch) {
              constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(S));
              if ((j - j0) % kLine == 0 && j + pass < cols) {
                const int64_t l1 = std::min<int64_t>(rows, i + 8);
                for (int64_t l = i; l < l1; ++l) __builtin_prefetch(src + l * ss + j + pass);
              }
            }
            block(i, j);
          }
        }
      }
    }
  } else {
    for (int64_t i = 0; i < (kPadRows ? (rows + 7) / 8 * 8 : rows); ++i) {
      for (int64_t j = 0; j < cols; ++j) dst[j * ds + i] = i < rows ? static_cast<D>(src[i * ss + j]) : D(0);
    }
  }
}

// ---- Tiles ---------------------------------------------------------------------------

// Tiles: a task copies its channel block [c0, c0 + cb) of one image (rows [y0, y1),
// columns [x0, x1)) into a compact channels-last tile in the opmath type, cell (y, x) at
// tile + (y * W + x) * cb, so that the boxes then read it from cache. Also the reverse,
// for backward, where the tile holds a band of rows [y0, y1): cell (y, x) at
// tile + ((y - y0) * W + x) * cb. Transposes go through blocks of kTileX columns so that
// the tile side stays in L1.
constexpr int64_t kTileX = 16;

// From an NCHW image (img points at channel c0).
template <typename scalar_t, typename T>
ROIOPS_SIMD void planes_to_tile(const scalar_t* img, int64_t sC, int64_t W, int64_t cb, int64_t y0, int64_t y1,
                                int64_t x0, int64_t x1, T* __restrict__ tile) {
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t xb = x0; xb < x1; xb += kTileX) {
      const int64_t xe = std::min(x1, xb + kTileX);
      T* __restrict__ dst = tile + y * W * cb;
      for (int64_t c = 0; c < cb; ++c) {
        const scalar_t* __restrict__ src = img + c * sC + y * W;
        for (int64_t x = xb; x < xe; ++x) dst[x * cb + c] = static_cast<T>(src[x]);
      }
    }
  }
}

// From a channels-last image (img points at channel c0; cell (y, x) at y * sH + x * sW).
template <typename scalar_t, typename T>
ROIOPS_SIMD void cells_to_tile(const scalar_t* img, int64_t sH, int64_t sW, int64_t W, int64_t cb, int64_t y0,
                               int64_t y1, int64_t x0, int64_t x1, T* __restrict__ tile) {
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) {
      const scalar_t* __restrict__ src = img + y * sH + x * sW;
      T* __restrict__ dst = tile + (y * W + x) * cb;
      for (int64_t c = 0; c < cb; ++c) dst[c] = static_cast<T>(src[c]);
    }
  }
}

// A band tile -> channel block of an NCHW image (img points at channel c0).
template <typename scalar_t, typename T>
ROIOPS_SIMD void tile_to_planes(const T* __restrict__ tile, int64_t cb, int64_t y0, int64_t y1, int64_t W,
                                scalar_t* img, int64_t sC) {
  for (int64_t y = y0; y < y1; ++y) {
    const T* __restrict__ row = tile + (y - y0) * W * cb;
    for (int64_t xb = 0; xb < W; xb += kTileX) {
      const int64_t xe = std::min(W, xb + kTileX);
      for (int64_t c = 0; c < cb; ++c) {
        scalar_t* __restrict__ dst = img + c * sC + y * W;
        for (int64_t x = xb; x < xe; ++x) dst[x] = static_cast<scalar_t>(row[x * cb + c]);
      }
    }
  }
}

// A band tile of `cells` cells -> channel block of a channels-last image (cell stride sW).
template <typename scalar_t, typename T>
ROIOPS_SIMD void tile_to_cells(const T* __restrict__ tile, int64_t cb, int64_t cells, scalar_t* dst, int64_t sW) {
  for (int64_t e = 0; e < cells; ++e) {
    for (int64_t c = 0; c < cb; ++c) dst[e * sW + c] = static_cast<scalar_t>(tile[e * cb + c]);
  }
}

// ---- Backward tasks ------------------------------------------------------------------

// Channels-last backward bands hold all channels of their rows, so that grad and argmax
// are read as they lie; larger bands, so that fewer boxes straddle two of them and are
// read twice (RoIPool, measured here: 4 MiB 1.7x faster than 1 MiB).
constexpr int64_t kClBandBytes = int64_t(4) << 20;

// Channels per channels-last backward task: all of them, unless `bands` tasks would leave
// threads idle; then blocks of a multiple of 16 channels (whole cache lines of float).
inline int64_t cl_channel_block(int64_t bands, int64_t C) {
  const int64_t want = 4 * static_cast<int64_t>(at::get_num_threads());
  if (bands >= want) return C;
  const int64_t blocks = std::min((want + bands - 1) / bands, std::max<int64_t>(C / 16, 1));
  return std::min(C, ((C + blocks - 1) / blocks + 15) / 16 * 16);
}

// The tasks of a backward: image n, band of rows [y0, y1), channels [c0, c0 + nc).
// channels_last: bands of all channels, split into channel blocks only when too few;
// NCHW: bands of a channels-last tile of a block of channels (kBandBytes).
struct BackwardSplit {
  struct Task {
    int64_t n, band, y0, y1, c0, nc;
    int64_t cells(int64_t W) const { return (y1 - y0) * W; }
  };
  Bands bands;
  int64_t cb, blocks;

  BackwardSplit(int64_t N, int64_t C, int64_t H, int64_t W, size_t elem, bool channels_last,
                const std::vector<int64_t>& batch, const std::vector<std::pair<int64_t, int64_t>>& spans)
      : bands(N, H, W * (channels_last ? C : channel_block(N, C, kTileChannels)) * static_cast<int64_t>(elem),
              channels_last ? kClBandBytes : kBandBytes, batch, spans),
        cb(channels_last ? cl_channel_block(N * bands.per_image, C) : channel_block(N, C, kTileChannels)),
        blocks((C + cb - 1) / cb),
        C_(C),
        H_(H) {}

  int64_t tasks() const { return static_cast<int64_t>(bands.boxes.size()) * blocks; }

  Task task(int64_t t) const {
    const int64_t nb = t / blocks, y0 = (nb % bands.per_image) * bands.rows, c0 = (t % blocks) * cb;
    return {nb / bands.per_image, nb, y0, std::min(H_, y0 + bands.rows), c0, std::min(cb, C_ - c0)};
  }

 private:
  int64_t C_, H_;
};

// Runs body(task, acc, aW) for every task of `split` on all threads, with the task's
// accumulator: cell (y, x) of its band, channel c0 + c, at acc + ((y - y0) * W + x) * aW + c.
// fresh: grad_input (gi, N x C x H x W) holds nothing yet and every task starts from zero;
// otherwise gi holds the sums of earlier boxes, which tasks with boxes carry on from.
// A channels-last float/double gradient accumulates in place; otherwise in a tile of the
// opmath type T, written to gi afterwards.
template <typename T, typename scalar_t, typename F>
void for_each_band(const BackwardSplit& split, at::Tensor& gi, bool fresh, const F& body) {
  const bool channels_last = is_channels_last(gi);
  const int64_t W = gi.size(3), sN = gi.stride(0), sC = gi.stride(1), sH = gi.stride(2), sW = gi.stride(3);
  scalar_t* out = gi.data_ptr<scalar_t>();
  Scratch<T> tile;
  parallel_tasks(split.tasks(), [&](int64_t t) {
    const BackwardSplit::Task task = split.task(t);
    if (!fresh && split.bands.boxes[task.band].empty()) return;
    const int64_t cells = task.cells(W), nc = task.nc, rows = task.y1 - task.y0;
    scalar_t* img = out + task.n * sN + task.c0 * sC;
    if constexpr (std::is_same_v<scalar_t, T>) {
      if (channels_last) {
        T* acc = img + task.y0 * sH;
        if (fresh && nc == sW) {
          std::fill_n(acc, cells * nc, T(0));
        } else if (fresh) {
          for (int64_t e = 0; e < cells; ++e) std::fill_n(acc + e * sW, nc, T(0));
        }
        body(task, acc, sW);
        return;
      }
    }
    T* acc = tile.get(cells * nc);
    if (fresh) {
      std::fill_n(acc, cells * nc, T(0));
    } else if (channels_last) {
      cells_to_tile(img + task.y0 * sH, sH, sW, W, nc, 0, rows, 0, W, acc);
    } else {
      planes_to_tile(img + task.y0 * W, sC, W, nc, 0, rows, 0, W, acc);
    }
    body(task, acc, nc);
    if (channels_last) {
      tile_to_cells(acc, nc, cells, img + task.y0 * sH, sW);
    } else {
      tile_to_planes(acc, nc, task.y0, task.y1, W, img, sC);
    }
  });
}

}  // namespace roiops
