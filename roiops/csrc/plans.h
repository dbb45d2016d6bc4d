// Separable sampling plans of the CPU kernels. A box's RoIAlign samples are the product
// of one plan of sample rows and one of sample columns (AxisPlan, AlignPlan), and its
// RoIPool bins the product of row and column ranges (PoolPlan); both are built once per
// call and shared by all channels (BoxPlans). The rules these plans apply to one sample
// or bin are geometry.h's; the plans' own arithmetic (box extents, bin sizes, grids, bin
// edges) also keeps torchvision's operations and order (docs/semantics.md), so float32
// results agree with it bit for bit where the formulas are the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "bounds.h"
#include "geometry.h"
#include "memory.h"

namespace roiops {

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
    start = start_, bin = bin_;
    build_at(grid_, pooled, size_, bin_ >= 0,
             [this](int64_t b, int64_t s) { return sample_position(start, bin, b, s, grid); });
  }

  // The same for bins of any starts: sample s of bin b at at(b, s), monotonic in s,
  // ascending or descending in every bin (slopes() needs build's bins).
  template <typename At>
  void build_at(int64_t grid_, int64_t pooled, int64_t size_, bool ascending, const At& at) {
    grid = grid_;
    size = size_;
    // Each array is sized once: plans are built per box and call, and growing them sample
    // by sample cost more in malloc and free than the samples themselves.
    begin.assign(pooled + 1, 0);
    first_in.assign(pooled, 0);
    first_out.assign(pooled, -1);
    min_weight.assign(pooled, std::numeric_limits<T>::infinity());
    cell_lo = size, cell_hi = -1;
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
        if (ascending) {
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

  // Cells [first, second] that the taps of bin b touch; first > second when none.
  // Positions are monotonic: the extreme cells are those of the bin's first and last samples.
  std::pair<int64_t, int64_t> bin_cells(int64_t b) const {
    const int64_t a = begin[b], e = begin[b + 1];
    if (a == e) return {1, 0};
    return {std::min(lo[a], lo[e - 1]), std::max(hi[a], hi[e - 1])};
  }

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

// RoIAlign's rule from a box's sides (semantics.md "roi_align avg"): the sides at least 1
// cell when not aligned, the bins, the sample grids (a positive sampling_ratio, else
// ceil(bin)) and the divisor. Shared by the ops that size their bins the same way.
template <typename T>
struct GridRule {
  T bin_h, bin_w;
  int64_t grid_h, grid_w;
  T count;

  void set(T& roi_h, T& roi_w, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned) {
    if (!aligned) {
      roi_w = std::max(roi_w, T(1));
      roi_h = std::max(roi_h, T(1));
    }
    bin_h = roi_h / static_cast<T>(ph);
    bin_w = roi_w / static_cast<T>(pw);
    grid_h = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(bin_h));
    grid_w = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(bin_w));
    count = static_cast<T>(std::max<int64_t>(grid_h * grid_w, 1));  // grids < 2^26 per axis: no overflow
  }
};

// The sampling grid of one box (semantics.md "roi_align avg"), in torchvision's arithmetic.
template <typename T>
struct BoxGrid : GridRule<T> {
  int64_t batch;
  T x_start, y_start, roi_w, roi_h;
  // The box was widened to 1 cell along the axis (aligned=False).
  bool clamped_h, clamped_w;

  BoxGrid(const T* roi, T scale, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned) {
    batch = static_cast<int64_t>(roi[0]);
    const T offset = aligned ? T(0.5) : T(0);
    x_start = roi[1] * scale - offset;
    y_start = roi[2] * scale - offset;
    roi_w = roi[3] * scale - offset - x_start;
    roi_h = roi[4] * scale - offset - y_start;
    clamped_w = !aligned && roi_w < T(1);
    clamped_h = !aligned && roi_h < T(1);
    this->set(roi_h, roi_w, ph, pw, sampling_ratio, aligned);
  }
};

// The plan of a box whose bins each start elsewhere (deformable RoI pooling, Bezier
// alignment): bin (i, j) is bin e = i * pw + j of ys and of xs, each built from its own
// start (AxisPlan::build_at: a bin far off the map costs its bisection only), with the
// interface of AlignPlan that align_kernels.h's kernels and drivers run.
template <typename T>
struct PerBinPlan {
  int64_t batch = 0, pw = 1;
  int64_t grid_h = 0, grid_w = 0;
  T count = 1;
  AxisPlan<T> ys, xs;

  explicit PerBinPlan(Arena* arena = nullptr) : ys(arena), xs(arena) {}

  std::pair<int64_t, int64_t> rows(int64_t i, int64_t j) const {
    const int64_t e = i * pw + j;
    return {ys.begin[e], ys.begin[e + 1]};
  }
  std::pair<int64_t, int64_t> cols(int64_t i, int64_t j) const {
    const int64_t e = i * pw + j;
    return {xs.begin[e], xs.begin[e + 1]};
  }
  T min_weight(int64_t i, int64_t j) const { return ys.min_weight[i * pw + j] * xs.min_weight[i * pw + j]; }
  // Whether bin e has a sample inside the map.
  bool has_samples(int64_t e) const { return ys.begin[e] < ys.begin[e + 1] && xs.begin[e] < xs.begin[e + 1]; }

  bool empty() const { return grid_h <= 0 || grid_w <= 0 || ys.empty() || xs.empty(); }
  int64_t x_span() const { return empty() ? 0 : xs.cell_hi - xs.cell_lo + 1; }
  // Map rows [first, second] that the box's taps touch; first > second when none.
  std::pair<int64_t, int64_t> row_span() const {
    return empty() ? std::make_pair<int64_t, int64_t>(1, 0) : std::make_pair(ys.cell_lo, ys.cell_hi);
  }

  // Does bin (i, j) have samples whose taps reach map rows [y0, y1)?
  bool reaches(int64_t i, int64_t j, int64_t y0, int64_t y1) const {
    const int64_t e = i * pw + j;
    const auto [r0, r1] = ys.bin_cells(e);
    return has_samples(e) && r0 < y1 && r1 >= y0;
  }

  // Bin rows [i0, i1) from the first to the last with a bin that reaches map rows [y0, y1).
  std::pair<int64_t, int64_t> bins_in_band(int64_t ph, int64_t y0, int64_t y1) const {
    int64_t i0 = ph, i1 = 0;
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) {
        if (reaches(i, j, y0, y1)) i0 = std::min(i0, i), i1 = i + 1;
      }
    }
    return {i0, i1};
  }
};

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
    const BoxGrid<T> box(roi, scale, ph, pw, sampling_ratio, aligned);
    batch = box.batch;
    grid_h = box.grid_h, grid_w = box.grid_w;
    count = box.count;
    clamped_h = box.clamped_h, clamped_w = box.clamped_w;
    samples.clear();
    grid_too_large = max_mode && grid_h > 0 && grid_w > 0 && grid_h * grid_w > kMaxArgmaxGrid;
    if (grid_too_large) {
      grid_h = grid_w = 0;  // an empty plan, never run
      return;
    }
    ys.build(box.y_start, box.bin_h, grid_h, ph, height);
    xs.build(box.x_start, box.bin_w, grid_w, pw, width);
  }

  // Inside samples of bin (i, j): sample rows [rows.first, rows.second) of ys, columns of xs.
  std::pair<int64_t, int64_t> rows(int64_t i, int64_t) const { return {ys.begin[i], ys.begin[i + 1]}; }
  std::pair<int64_t, int64_t> cols(int64_t, int64_t j) const { return {xs.begin[j], xs.begin[j + 1]}; }
  // A lower bound of the nonzero weights of bin (i, j)'s taps.
  T min_weight(int64_t i, int64_t j) const { return ys.min_weight[i] * xs.min_weight[j]; }

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

  // The same for the taps of bin row i.
  std::pair<int64_t, int64_t> bin_rows(int64_t i) const {
    return empty() ? std::make_pair<int64_t, int64_t>(1, 0) : ys.bin_cells(i);
  }

  // Bin rows [i0, i1) from the first to the last whose taps reach map rows [y0, y1).
  std::pair<int64_t, int64_t> bins_in_band(int64_t ph, int64_t y0, int64_t y1) const {
    int64_t i0 = ph, i1 = 0;
    for (int64_t i = 0; i < ph; ++i) {
      const auto [r0, r1] = ys.bin_cells(i);
      if (r0 <= r1 && r0 < y1 && r1 >= y0) i0 = std::min(i0, i), i1 = i + 1;
    }
    return {i0, i1};
  }
  // Whether bin (i, j) of those rows may reach the band: a bin's rows follow from i alone.
  bool reaches(int64_t, int64_t, int64_t, int64_t) const { return true; }
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
    parallel_for(0, static_cast<int64_t>(arenas_.size()), 1, [&](int64_t c0, int64_t c1) {
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

}  // namespace roiops
