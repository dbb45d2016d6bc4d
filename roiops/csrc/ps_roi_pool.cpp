// Position-sensitive RoIPool on the CPU (docs/semantics.md, "ps_roi_pool").
//
// Each box's bins are computed once and shared by all channels; the kernels run
// position_sensitive.h's tasks. Sums are torchvision's, in its order: the bin's cells
// added row by row from 0, divided by the bin's area; backward adds grad / area to each
// cell, boxes in increasing k. So float32 and float64 results equal torchvision's bit for
// bit where the semantics agree (bins clipped to the map, see semantics.md).

#include <cmath>
#include <utility>
#include <vector>

#include "args.h"
#include "geometry.h"
#include "memory.h"
#include "position_sensitive.h"
#include "ps_lanes.h"
#include "simd.h"

namespace roiops {
namespace {

// The bins of all boxes, clipped to the map, in one array (built serially: a few hundred
// boxes take microseconds, less than waking the threads). Bin (i, j) of box k covers
// rows [y0, y1) and columns [x0, x1).
class PsPoolBins {
 public:
  struct Bin {
    int64_t y0, y1, x0, x1;
    bool empty() const { return y1 <= y0 || x1 <= x0; }
    int64_t area() const { return (y1 - y0) * (x1 - x0); }
  };

  // rois of the kernel's opmath type T. A ROIOPS_SIMD clone: there floor, ceil and round
  // are instructions, not calls.
  template <typename T>
  ROIOPS_SIMD static PsPoolBins build(const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                                      int64_t H, int64_t W) {
    PsPoolBins b(rois.size(0), ph, pw);
    const T* roi = rois.const_data_ptr<T>();
    const T scale = static_cast<T>(spatial_scale);
    for (int64_t k = 0; k < rois.size(0); ++k, roi += 5) {
      const int64_t x1 = round_half_away(roi[1] * scale), y1 = round_half_away(roi[2] * scale);
      const int64_t x2 = round_half_away(roi[3] * scale), y2 = round_half_away(roi[4] * scale);
      int64_t* e = b.box(k);
      axis<T>(y1, std::max<int64_t>(y2 - y1, 1), ph, H, e);
      axis<T>(x1, std::max<int64_t>(x2 - x1, 1), pw, W, e + 2 * ph);
    }
    return b;
  }

  int64_t size() const { return static_cast<int64_t>(edges_.size()) / (2 * (ph_ + pw_)); }
  // {first row, last row} of box k's bins (first > last: none).
  std::pair<int64_t, int64_t> row_span(int64_t k) const { return {box(k)[0], box(k)[2 * ph_ - 1] - 1}; }
  Bin bin(int64_t k, int64_t i, int64_t j) const {
    const int64_t* e = box(k);
    return {e[i], e[ph_ + i], e[2 * ph_ + j], e[2 * ph_ + pw_ + j]};
  }

 private:
  PsPoolBins(int64_t K, int64_t ph, int64_t pw) : ph_(ph), pw_(pw), edges_(static_cast<size_t>(K * 2 * (ph + pw))) {}
  // Lower edges of the `pooled` bins at e, upper edges at e + pooled.
  template <typename T>
  static void axis(int64_t start, int64_t size, int64_t pooled, int64_t limit, int64_t* e) {
    const T bin = static_cast<T>(size) / static_cast<T>(pooled);
    for (int64_t p = 0; p < pooled; ++p) {
      pool_bin_edges(static_cast<T>(start), bin, p, limit, /*continuous=*/false, e[p], e[pooled + p]);
    }
  }
  int64_t* box(int64_t k) { return edges_.data() + k * 2 * (ph_ + pw_); }
  const int64_t* box(int64_t k) const { return edges_.data() + k * 2 * (ph_ + pw_); }

  int64_t ph_, pw_;
  std::vector<int64_t> edges_;  // per box: row starts, row ends, column starts, column ends
};

// acc[c] = sum of rows [y0, y1) x columns [x0, x1) of the channel at base + c * cs.
template <typename scalar_t, typename T>
ROIOPS_SIMD void pool_bin(const scalar_t* __restrict__ base, int64_t cs, int64_t sH, int64_t sW, int64_t y0,
                          int64_t y1, int64_t x0, int64_t x1, int64_t nc, T* __restrict__ acc) {
  for (int64_t c = 0; c < nc; ++c) acc[c] = T(0);
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) {
      const scalar_t* q = base + y * sH + x * sW;
      for (int64_t c = 0; c < nc; ++c) acc[c] += static_cast<T>(q[c * cs]);
    }
  }
}

// d[c] added to rows [y0, y1) x columns [x0, x1) of the channel at base + c * cs.
template <typename T>
ROIOPS_SIMD void pool_bin_backward(const T* __restrict__ d, T* __restrict__ base, int64_t cs, int64_t sH, int64_t sW,
                                   int64_t y0, int64_t y1, int64_t x0, int64_t x1, int64_t nc) {
  if (sW == 1) {  // NCHW: along the rows, which vectorises (each element gets one term)
    for (int64_t c = 0; c < nc; ++c) {
      for (int64_t y = y0; y < y1; ++y) {
        T* __restrict__ q = base + c * cs + y * sH;
        for (int64_t x = x0; x < x1; ++x) q[x] += d[c];
      }
    }
    return;
  }
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) {
      T* q = base + y * sH + x * sW;
      for (int64_t c = 0; c < nc; ++c) q[c * cs] += d[c];
    }
  }
}

// The cells that bin (i, j) of `boxes` reads, in tile t, and how many reads they take.
inline int64_t cover_bin(const PsPoolBins& bins, const std::vector<int64_t>& boxes, int64_t i, int64_t j,
                         PsTile& t) {
  int64_t reads = 0;
  for (const int64_t k : boxes) {
    const PsPoolBins::Bin b = bins.bin(k, i, j);
    if (b.empty()) continue;
    t.cover(b.y0, b.y1);
    reads += b.area();
  }
  return reads;
}

// One bin for pool_bins_lanes: the lanes it reads, its cells, where its nc means go, and
// the rows [ya, yb) of it to sum now with its running sums (PsRowPart; by default all of
// its rows, from zero to the mean).
template <typename T, typename scalar_t>
struct LanesBin {
  PsLanes<const T> v;
  PsPoolBins::Bin b;
  scalar_t* r;
  int64_t ya, yb;
  T* carry = nullptr;
  bool first = true, last = true;
};

// n bins, at(m) the m-th (a LanesBin): r[c] = the mean of lane c over the bin's cells (0 for
// an empty bin), c < nc. A whole task's (or bin row's) bins per call, so that the loop over
// them is compiled for the ROIOPS_SIMD instruction set too and the sums stay in registers.
template <typename T, typename scalar_t, typename At>
ROIOPS_SIMD void pool_bins_lanes(int64_t n, int64_t nc, const At& at) {
  for (int64_t m = 0; m < n; ++m) {
    const LanesBin<T, scalar_t> e = at(m);
    const PsLanes<const T>& v = e.v;
    const int64_t x0 = e.b.x0, x1 = e.b.x1;
    if (e.b.empty()) {
      if (e.last) std::fill_n(e.r, nc, scalar_t(0));
      continue;
    }
    const T area = static_cast<T>(e.b.area());
    ps_lane_blocks(nc, [&](auto V, int64_t c) __attribute__((always_inline)) {
      lanes8<T> sum[V] = {};
      if (!e.first) {
        for (int u = 0; u < V; ++u) sum[u] = load8(e.carry + c + 8 * u);
      }
      for (int64_t y = e.ya; y < e.yb; ++y) {
        for (int64_t x = x0; x < x1; ++x) {
          const T* q = v.data + (y * v.sH + x * v.sW - v.org) + c;
          for (int u = 0; u < V; ++u) sum[u] += load8(q + 8 * u);
        }
      }
      if (!e.last) {
        for (int u = 0; u < V; ++u) store8(e.carry + c + 8 * u, sum[u]);
        return;
      }
      for (int u = 0; u < V; ++u) ps_store_lanes<T>(sum[u] / area, nc - c - 8 * u, e.r + c + 8 * u);
    });
  }
}

// pool_bin_backward on a task's lanes: d (v.L lanes) added to rows [y0, y1) x columns [x0, x1).
template <typename T>
ROIOPS_SIMD void pool_bin_lanes_backward(const T* __restrict__ d, const PsLanes<T>& v, int64_t y0, int64_t y1,
                                         int64_t x0, int64_t x1) {
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) {
      T* q = v.data + (y * v.sH + x * v.sW - v.org);
      for (int64_t c = 0; c < v.L; c += 8) store8(q + c, load8(q + c) + load8(d + c));
    }
  }
}

// Cells read by all boxes over all bins (the reads of a forward).
inline int64_t total_reads(const PsPoolBins& bins, int64_t ph, int64_t pw) {
  int64_t reads = 0;
  for (int64_t k = 0; k < bins.size(); ++k) {
    int64_t rows = 0, cols = 0;
    for (int64_t i = 0; i < ph; ++i) {
      const PsPoolBins::Bin b = bins.bin(k, i, 0);
      rows += std::max<int64_t>(b.y1 - b.y0, 0);
    }
    for (int64_t j = 0; j < pw; ++j) {
      const PsPoolBins::Bin b = bins.bin(k, 0, j);
      cols += std::max<int64_t>(b.x1 - b.x0, 0);
    }
    reads += rows * cols;
  }
  return reads;
}

// A band's terms (ps_backward_bands): each bin of `boxes` (in increasing k) adds grad / area
// to its cells in the band's rows.
template <typename scalar_t, typename T>
ROIOPS_SIMD void add_band_terms(const PsBand& band, const PsPoolBins& bb, const std::vector<int64_t>& boxes,
                                const scalar_t* grad_p, const Strides& gs, int64_t ph, int64_t pw,
                                T* __restrict__ buf, T* __restrict__ d) {
  for (const int64_t k : boxes) {
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) {
        const PsPoolBins::Bin b = bb.bin(k, i, j);
        const int64_t ya = std::max(b.y0, band.r0), yb = std::min(b.y1, band.r1);
        if (ya >= yb) break;  // the same rows for every j
        if (b.empty()) continue;
        const T area = static_cast<T>(b.area());
        const scalar_t* gk = grad_p + k * gs.n + band.c0 * gs.c + i * gs.h + j * gs.w;
        for (int64_t c = 0; c < band.nc; ++c) d[c] = static_cast<T>(gk[c * gs.c]) / area;
        for (int64_t y = ya; y < yb; ++y) {
          T* row = band.at(buf, y, 0, i * pw + j);
          for (int64_t x = b.x0; x < b.x1; ++x) {
            T* q = row + x * band.cell();
            for (int64_t c = 0; c < band.lanes; c += 8) store8(q + c, load8(q + c) + load8(d + c));
          }
        }
      }
    }
  }
}

// PSRoIPool's parts for position_sensitive.h's drivers: a bin's mean is the sum of its
// cells divided by its area; backward adds grad / area to each of them.
template <typename scalar_t>
struct PoolParts {
  using T = opmath_type<scalar_t>;
  static constexpr int64_t kReach = 0;  // a bin reads only its own rows
  const PsPoolBins bins;
  const int64_t ph, pw;

  PoolParts(const Tensor& rois, double spatial_scale, int64_t ph_, int64_t pw_, int64_t H, int64_t W)
      : bins(PsPoolBins::build<T>(rois, spatial_scale, ph_, pw_, H, W)), ph(ph_), pw(pw_) {}

  int64_t reads() const { return total_reads(bins, ph, pw); }
  int64_t cover(const std::vector<int64_t>& boxes, int64_t i, int64_t j, PsTile& t) const {
    return cover_bin(bins, boxes, i, j, t);
  }

  bool may_use_bands() const { return true; }
  std::pair<int64_t, int64_t> bin_rows(int64_t k, int64_t i) const {
    const PsPoolBins::Bin b = bins.bin(k, i, 0);
    return {b.y0, b.y1 - 1};
  }
  void sum_row(const PsBand& band, const T* buf, int64_t k, int64_t i, const PsRowPart<T>& part,
               const PsOutput<scalar_t>& out) const {
    pool_bins_lanes<T, scalar_t>(pw, band.nc, [&](int64_t j) {
      return LanesBin<T, scalar_t>{band.view(buf, i * pw + j), bins.bin(k, i, j), out.row(i * pw + j, k) + band.c0,
                                   part.ya, part.yb, part.carry_of(j, band.lanes), part.first, part.last};
    });
  }
  void tile_bins(const PsLanes<const T>& v, const std::vector<int64_t>& boxes, int64_t i, int64_t j, int64_t c0,
                 int64_t nc, const PsOutput<scalar_t>& out) const {
    pool_bins_lanes<T, scalar_t>(static_cast<int64_t>(boxes.size()), nc, [&](int64_t m) {
      const int64_t k = boxes[m];
      const PsPoolBins::Bin b = bins.bin(k, i, j);
      return LanesBin<T, scalar_t>{v, b, out.row(i * pw + j, k) + c0, b.y0, b.y1};
    });
  }
  void bin_means(int64_t k, int64_t i, int64_t j, const scalar_t* base, int64_t cs, const Strides& s, int64_t nc,
                 T* acc, scalar_t* r) const {
    const PsPoolBins::Bin b = bins.bin(k, i, j);
    if (b.empty()) {
      for (int64_t c = 0; c < nc; ++c) r[c] = scalar_t(0);
      return;
    }
    const T area = static_cast<T>(b.area());
    pool_bin(base, cs, s.h, s.w, b.y0, b.y1, b.x0, b.x1, nc, acc);
    for (int64_t c = 0; c < nc; ++c) r[c] = static_cast<scalar_t>(acc[c] / area);
  }

  std::pair<int64_t, int64_t> row_span(int64_t k) const { return bins.row_span(k); }
  void add_band(const PsBand& band, const std::vector<int64_t>& boxes, const PsGradRows<scalar_t>& grad, T* buf,
                T* d) const {
    add_band_terms(band, bins, boxes, grad.data, grad.s, ph, pw, buf, d);
  }
  int64_t scratch(int64_t nc) const { return nc; }
  void add_bin(int64_t k, int64_t i, int64_t j, const scalar_t* gk, int64_t gc, int64_t nc, T* d,
               const PsLanes<T>& v, T* base, int64_t cs, const Strides& a) const {
    const PsPoolBins::Bin b = bins.bin(k, i, j);
    if (b.empty()) return;
    const T area = static_cast<T>(b.area());
    for (int64_t c = 0; c < nc; ++c) d[c] = static_cast<T>(gk[c * gc]) / area;
    if (v.data) {
      pool_bin_lanes_backward(d, v, b.y0, b.y1, b.x0, b.x1);
    } else {
      pool_bin_backward(d, base, cs, a.h, a.w, b.y0, b.y1, b.x0, b.x1, nc);
    }
  }
};

}  // namespace

ROIOPS_ENTRY
Tensor ps_roi_pool_forward(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph,
                           int64_t pw) {
  return ps_forward<PoolParts>(input, rois, spatial_scale, ph, pw, std::nullopt);
}

ROIOPS_ENTRY
Tensor ps_roi_pool_backward(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph,
                            int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, bool channels_last) {
  return ps_backward<PoolParts>(grad, rois, spatial_scale, ph, pw, N, C, H, W, channels_last, std::nullopt);
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("ps_roi_pool", TORCH_BOX(&roiops::ps_roi_pool_forward));
  m.impl("_ps_roi_pool_backward", TORCH_BOX(&roiops::ps_roi_pool_backward));
}
