// Precise RoI Pooling on the CPU (docs/semantics.md, "prroi_pool"): each bin is the
// exact average, over its window, of the map's hat-function interpolation.
//
// The integral separates: out(i, j) = sum_h iy_i(h) * sum_w ix_j(w) * F(h, w), with ix_j(w)
// the hat integral of cell w over bin column j divided by the bin width (likewise iy).
// A box's plan holds these weights for the cells each bin touches and is shared by all
// channels. Per bin row the kernels first sum the bin row's map rows, weighted, into one
// row over the box's columns, then each bin takes its weighted part of that row: the cost
// follows the cells the box touches.
//  - NCHW: tasks of (image, block of channels); per plane the loops run along map rows;
//  - channels_last: the input is read in place and the loops run along channels; forward
//    tasks are boxes, backward tasks bands of map rows (tiles.h, BackwardSplit).
// Backward tasks own disjoint slices of grad_input and add boxes in increasing k; the box
// gradient sums each box's channels in order: deterministic, no atomics.

#include <cmath>
#include <vector>

#include "args.h"
#include "checks.h"
#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "prroi.h"
#include "simd.h"
#include "tiles.h"

namespace roiops {
namespace {

// One box side's bins: the cells each bin touches and their weights.
template <typename T>
struct PrAxis {
  T bin = 0;                        // bin side in map cells (> 0)
  std::vector<int64_t> first;       // per bin: its first cell
  std::vector<int64_t> begin;       // weights of bin b: [begin[b], begin[b + 1]), cell first[b] + t - begin[b]
  std::vector<T> avg;               // hat integral over the bin / bin side
  std::vector<T> at_start, at_end;  // hat at the bin's start and end (box gradient only)
  int64_t cell_lo = 0, cell_hi = -1;  // cells touched by any bin

  void build(T p1, T p2, T scale, int64_t pooled, int64_t size, bool edges) {
    bin = prroi_bin_size(p1, p2, scale, pooled);
    first.resize(pooled);
    begin.assign(1, 0);
    avg.clear(), at_start.clear(), at_end.clear();
    cell_lo = size, cell_hi = -1;
    for (int64_t b = 0; b < pooled; ++b) {
      const T start = prroi_bin_start(p1, scale, bin, b);
      const auto [c0, c1] = prroi_window_cells(start, bin, size);
      first[b] = c0;
      for (int64_t w = c0; w <= c1; ++w) {
        const T a = start - static_cast<T>(w);  // the window relative to the cell's centre
        avg.push_back(hat_integral(a, bin) / bin);  // not times 1 / bin, inf for a subnormal bin
        if (edges) {
          at_start.push_back(hat(a));
          at_end.push_back(hat(a + bin));
        }
      }
      if (c0 <= c1) cell_lo = std::min(cell_lo, c0), cell_hi = std::max(cell_hi, c1);
      begin.push_back(static_cast<int64_t>(avg.size()));
    }
  }

  int64_t span() const { return cell_hi - cell_lo + 1; }
};

// Plan of one box, shared by all channels. Bins of zero area (x2 <= x1 or y2 <= y1) are 0.
template <typename T>
struct PrPlan {
  int64_t batch = 0;
  bool zero = true;
  PrAxis<T> ys, xs;

  void build(const T* roi, T scale, int64_t ph, int64_t pw, int64_t H, int64_t W, bool edges) {
    batch = static_cast<int64_t>(roi[0]);
    const T dh = prroi_bin_size(roi[2], roi[4], scale, ph), dw = prroi_bin_size(roi[1], roi[3], scale, pw);
    zero = !(dw * dh > T(0));
    if (zero) return;
    ys.build(roi[2], roi[4], scale, ph, H, edges);
    xs.build(roi[1], roi[3], scale, pw, W, edges);
  }

  // Nothing to read or write: zero area, or no cell of the map touched.
  bool empty() const { return zero || ys.cell_lo > ys.cell_hi || xs.cell_lo > xs.cell_hi; }
};

// Map rows [first, second] that box `roi` writes to in backward (first > second: none),
// the rows PrPlan::build would find, without building it.
template <typename T>
std::pair<int64_t, int64_t> row_span(const T* roi, T scale, int64_t ph, int64_t pw, int64_t H) {
  const T dh = prroi_bin_size(roi[2], roi[4], scale, ph), dw = prroi_bin_size(roi[1], roi[3], scale, pw);
  if (!(dw * dh > T(0))) return {1, 0};
  // Bin starts grow with the bin index, so the first and last bins bound the span.
  const int64_t first = prroi_window_cells(prroi_bin_start(roi[2], scale, dh, 0), dh, H).first;
  const int64_t last = prroi_window_cells(prroi_bin_start(roi[2], scale, dh, ph - 1), dh, H).second;
  return {first, last};
}

// ---- forward --------------------------------------------------------------------------

// One box on one NCHW plane (rows contiguous, W apart). row: scratch of xs.span().
template <typename scalar_t, typename T>
ROIOPS_SIMD void forward_plane(const PrPlan<T>& p, const scalar_t* plane, int64_t W, int64_t ph, int64_t pw,
                               T* __restrict__ row, scalar_t* out, int64_t oH, int64_t oW) {
  const int64_t x0 = p.xs.cell_lo, nx = p.xs.span();
  for (int64_t i = 0; i < ph; ++i) {
    std::fill(row, row + nx, T(0));
    for (int64_t t = p.ys.begin[i]; t < p.ys.begin[i + 1]; ++t) {
      const T wy = p.ys.avg[t];
      const scalar_t* __restrict__ src = plane + (p.ys.first[i] + t - p.ys.begin[i]) * W + x0;
      for (int64_t x = 0; x < nx; ++x) row[x] += wy * static_cast<T>(src[x]);
    }
    for (int64_t j = 0; j < pw; ++j) {
      const T* __restrict__ wx = p.xs.avg.data() + p.xs.begin[j];
      const T* __restrict__ r = row + (p.xs.first[j] - x0);
      const int64_t n = p.xs.begin[j + 1] - p.xs.begin[j];
      T v = 0;
      for (int64_t t = 0; t < n; ++t) v += wx[t] * r[t];
      out[i * oH + j * oW] = static_cast<scalar_t>(v);
    }
  }
}

// One box, n contiguous channels (cell (y, x) at img + y * sH + x * sW). row: scratch of
// xs.span() * n, acc: of n. Output channel c of bin (i, j) goes to out[i * oH + j * oW + c * oC].
template <typename scalar_t, typename T>
ROIOPS_SIMD void forward_cl(const PrPlan<T>& p, const scalar_t* img, int64_t sH, int64_t sW, int64_t n, int64_t ph,
                            int64_t pw, T* __restrict__ row, T* __restrict__ acc, scalar_t* out, int64_t oH, int64_t oW,
                            int64_t oC) {
  const int64_t x0 = p.xs.cell_lo, nx = p.xs.span();
  for (int64_t i = 0; i < ph; ++i) {
    std::fill(row, row + nx * n, T(0));
    for (int64_t t = p.ys.begin[i]; t < p.ys.begin[i + 1]; ++t) {
      const T wy = p.ys.avg[t];
      const scalar_t* src = img + (p.ys.first[i] + t - p.ys.begin[i]) * sH + x0 * sW;
      for (int64_t x = 0; x < nx; ++x) {
        const scalar_t* __restrict__ s = src + x * sW;
        T* __restrict__ d = row + x * n;
        for (int64_t c = 0; c < n; ++c) d[c] += wy * static_cast<T>(s[c]);
      }
    }
    for (int64_t j = 0; j < pw; ++j) {
      std::fill(acc, acc + n, T(0));
      const T* r = row + (p.xs.first[j] - x0) * n;
      for (int64_t t = p.xs.begin[j]; t < p.xs.begin[j + 1]; ++t, r += n) {
        const T wx = p.xs.avg[t];
        for (int64_t c = 0; c < n; ++c) acc[c] += wx * r[c];
      }
      scalar_t* o = out + i * oH + j * oW;
      for (int64_t c = 0; c < n; ++c) o[c * oC] = static_cast<scalar_t>(acc[c]);
    }
  }
}

// Zeros for channels [0, n) of a box's bins (an empty plan).
template <typename scalar_t>
void zero_bins(scalar_t* out, int64_t n, int64_t ph, int64_t pw, int64_t oC, int64_t oH, int64_t oW) {
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) out[c * oC + i * oH + j * oW] = scalar_t(0);
    }
  }
}

template <typename scalar_t>
void forward_impl(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  Tensor& out) {
  using T = opmath_type<scalar_t>;
  const int64_t K = rois.size(0), N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
  const int64_t oK = out.stride(0), oC = out.stride(1), oH = out.stride(2), oW = out.stride(3);
  if (K == 0 || C == 0) return;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const T* roi = rois.const_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  Scratch<T> row, acc;

  if (is_channels_last(input)) {
    // Each box reads its cells in place, all channels at once; only when the boxes are
    // too few to share out do tasks take a block of a box's channels.
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((8 * num_threads() + K - 1) / K, C / 32));
    const int64_t cb = (C + blocks - 1) / blocks;
    parallel_tasks(K * blocks, [&](int64_t t) {
      const int64_t k = t / blocks, c0 = (t % blocks) * cb, nc = std::min(cb, C - c0);
      PrPlan<T> p;
      p.build(roi + 5 * k, scale, ph, pw, H, W, false);
      scalar_t* ok = o + k * oK + c0 * oC;
      if (p.empty()) return zero_bins(ok, nc, ph, pw, oC, oH, oW);
      forward_cl(p, in + p.batch * sN + c0, sH, sW, nc, ph, pw, row.get(p.xs.span() * nc), acc.get(nc), ok, oH, oW,
                 oC);
    });
    return;
  }
  std::vector<int64_t> batch(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) batch[k] = static_cast<int64_t>(roi[5 * k]);
  const auto by_image = boxes_by_image(batch, N);
  // A block's planes stay in cache while all the image's boxes read them; each box's
  // plan is built once per block.
  const int64_t cb = channel_block(N, C, kTileChannels), blocks = (C + cb - 1) / cb;
  parallel_tasks(N * blocks, [&](int64_t t) {
    const int64_t n = t / blocks, c0 = (t % blocks) * cb, nc = std::min(cb, C - c0);
    PrPlan<T> p;
    for (const int64_t k : by_image[n]) {
      p.build(roi + 5 * k, scale, ph, pw, H, W, false);
      scalar_t* ok = o + k * oK + c0 * oC;
      if (p.empty()) {
        zero_bins(ok, nc, ph, pw, oC, oH, oW);
        continue;
      }
      T* r = row.get(p.xs.span());
      for (int64_t c = 0; c < nc; ++c) {
        forward_plane(p, in + n * sN + (c0 + c) * sC, W, ph, pw, r, ok + c * oC, oH, oW);
      }
    }
  });
}

// ---- gradient to the input ------------------------------------------------------------

// One box's grad of one channel (bin (i, j) at g[i * gH + j * gW]) added to one NCHW plane
// of the opmath type (rows W apart). row: scratch of xs.span().
template <typename scalar_t, typename T>
ROIOPS_SIMD void backward_plane(const PrPlan<T>& p, const scalar_t* g, int64_t gH, int64_t gW, int64_t ph, int64_t pw,
                                T* __restrict__ row, T* plane, int64_t W) {
  const int64_t x0 = p.xs.cell_lo, nx = p.xs.span();
  for (int64_t i = 0; i < ph; ++i) {
    if (p.ys.begin[i] == p.ys.begin[i + 1]) continue;
    std::fill(row, row + nx, T(0));
    for (int64_t j = 0; j < pw; ++j) {
      const T gv = static_cast<T>(g[i * gH + j * gW]);
      const T* __restrict__ wx = p.xs.avg.data() + p.xs.begin[j];
      T* __restrict__ r = row + (p.xs.first[j] - x0);
      const int64_t n = p.xs.begin[j + 1] - p.xs.begin[j];
      for (int64_t t = 0; t < n; ++t) r[t] += gv * wx[t];
    }
    for (int64_t t = p.ys.begin[i]; t < p.ys.begin[i + 1]; ++t) {
      const T wy = p.ys.avg[t];
      T* __restrict__ dst = plane + (p.ys.first[i] + t - p.ys.begin[i]) * W + x0;
      for (int64_t x = 0; x < nx; ++x) dst[x] += wy * row[x];
    }
  }
}

// One box's grad of n contiguous channels (bin (i, j) at g + i * gH + j * gW) added to the
// rows [y0, y1) it touches of a band: cell (y, x), channel c at acc + (y - y0) * aH + x * aW + c.
// row: scratch of xs.span() * n.
template <typename scalar_t, typename T>
ROIOPS_SIMD void backward_cl(const PrPlan<T>& p, const scalar_t* g, int64_t gH, int64_t gW, int64_t n, int64_t ph,
                             int64_t pw, T* __restrict__ row, T* acc, int64_t y0, int64_t y1, int64_t aH, int64_t aW) {
  const int64_t x0 = p.xs.cell_lo, nx = p.xs.span();
  for (int64_t i = 0; i < ph; ++i) {
    const int64_t r0 = std::max(p.ys.first[i], y0);
    const int64_t r1 = std::min(p.ys.first[i] + p.ys.begin[i + 1] - p.ys.begin[i], y1);
    if (r0 >= r1) continue;
    std::fill(row, row + nx * n, T(0));
    for (int64_t j = 0; j < pw; ++j) {
      const scalar_t* __restrict__ gj = g + i * gH + j * gW;
      T* r = row + (p.xs.first[j] - x0) * n;
      for (int64_t t = p.xs.begin[j]; t < p.xs.begin[j + 1]; ++t, r += n) {
        const T wx = p.xs.avg[t];
        T* __restrict__ d = r;
        for (int64_t c = 0; c < n; ++c) d[c] += wx * static_cast<T>(gj[c]);
      }
    }
    for (int64_t y = r0; y < r1; ++y) {
      const T wy = p.ys.avg[p.ys.begin[i] + y - p.ys.first[i]];
      T* dst = acc + (y - y0) * aH + x0 * aW;
      for (int64_t x = 0; x < nx; ++x) {
        T* __restrict__ d = dst + x * aW;
        const T* __restrict__ s = row + x * n;
        for (int64_t c = 0; c < n; ++c) d[c] += wy * s[c];
      }
    }
  }
}

template <typename scalar_t>
void backward_impl(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                   Tensor& gi) {
  using T = opmath_type<scalar_t>;
  const int64_t K = rois.size(0), N = gi.size(0), C = gi.size(1), H = gi.size(2), W = gi.size(3);
  if (gi.numel() == 0) return;
  const T* roi = rois.const_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  const scalar_t* grad_p = grad.const_data_ptr<scalar_t>();
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
  std::vector<int64_t> batch(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) batch[k] = static_cast<int64_t>(roi[5 * k]);
  Scratch<T> row;

  if (is_channels_last(gi)) {
    std::vector<std::pair<int64_t, int64_t>> spans(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) spans[k] = row_span(roi + 5 * k, scale, ph, pw, H);
    const BackwardSplit split(N, C, H, W, sizeof(T), true, batch, spans);
    for_each_band<T, scalar_t>(split, gi, true, [&](const BackwardSplit::Task& task, T* acc, int64_t aW) {
      PrPlan<T> p;
      for (const int64_t k : split.bands.boxes[task.band]) {
        p.build(roi + 5 * k, scale, ph, pw, H, W, false);
        if (p.empty()) continue;
        backward_cl(p, grad_p + k * gK + task.c0 * gC, gH, gW, task.nc, ph, pw, row.get(p.xs.span() * task.nc), acc,
                    task.y0, task.y1, W * aW, aW);
      }
    });
    return;
  }
  // NCHW: tasks of (image, block of channels) own those planes; float and double planes
  // accumulate in place, half types in opmath planes rounded once at the end.
  const auto by_image = boxes_by_image(batch, N);
  const int64_t cb = channel_block(N, C, kTileChannels), blocks = (C + cb - 1) / cb;
  scalar_t* gi_p = gi.mutable_data_ptr<scalar_t>();
  Scratch<T> planes;
  parallel_tasks(N * blocks, [&](int64_t t) {
    const int64_t n = t / blocks, c0 = (t % blocks) * cb, nc = std::min(cb, C - c0);
    scalar_t* dst = gi_p + (n * C + c0) * H * W;
    T* acc;
    if constexpr (std::is_same_v<T, scalar_t>) {
      acc = dst;
    } else {
      acc = planes.get(nc * H * W);
    }
    std::fill(acc, acc + nc * H * W, T(0));
    PrPlan<T> p;
    for (const int64_t k : by_image[n]) {
      p.build(roi + 5 * k, scale, ph, pw, H, W, false);
      if (p.empty()) continue;
      T* r = row.get(p.xs.span());
      for (int64_t c = 0; c < nc; ++c) {
        backward_plane(p, grad_p + k * gK + (c0 + c) * gC, gH, gW, ph, pw, r, acc + c * H * W, W);
      }
    }
    if constexpr (!std::is_same_v<T, scalar_t>) {
      for (int64_t e = 0; e < nc * H * W; ++e) dst[e] = static_cast<scalar_t>(acc[e]);
    }
  });
}

// ---- gradient to the boxes ------------------------------------------------------------
//
// With out the bin's value and A = dw * dh, d out / d xe = (X_e - out) / dw, where
// X_e = sum_{h,w} F(h, w) * iy(h) * hat(xe - w) is the average of the map along the bin's
// right edge; d out / d xs = (out - X_s) / dw; likewise for y with Y_s, Y_e and dh. The
// edges move with the box corners as xs = x1*s + j*dw: d xs / d x1 = s * (1 - j/pw),
// d xs / d x2 = s * j/pw, d xe with j + 1. The factor s / dw is common to every bin of the
// box, so the kernels sum, over channels and bins, g * ((out - X_s) * (1 - j/pw) +
// (X_e - out) * (1 - (j+1)/pw)) for x1 and g * ((out - X_s) * j/pw + (X_e - out) * (j+1)/pw)
// for x2 (and the same for y), then scale. The interpolated map is continuous, so these are
// the derivatives wherever the area is positive; a box of zero area (x2 <= x1 or y2 <= y1,
// where a bin's average jumps from 0) gets 0, the derivative from the side of empty boxes.

// Bin-edge factors of one axis: (1 - b/pooled, b/pooled) for b = 0 .. pooled.
template <typename T>
std::vector<T> edge_fractions(int64_t pooled) {
  std::vector<T> f(static_cast<size_t>(pooled + 1));
  for (int64_t b = 0; b <= pooled; ++b) f[b] = static_cast<T>(b) / static_cast<T>(pooled);
  return f;
}

// The four sums of one box, n channels at once: d[q * n + c] for q = x1, y1, x2, y2.
// Channel c of cell (y, x) at img + y * sH + x * sW + c * sC, of bin (i, j) of grad at
// g + i * gH + j * gW + c * gC. Loops run along channels (channels_last), or, kPlane, along
// the map rows of one NCHW plane (n == 1, sW == 1). buf: scratch of 3 * xs.span() * n + 5 * n.
template <bool kPlane, typename scalar_t, typename T>
ROIOPS_SIMD void rois_backward_box(const PrPlan<T>& p, const scalar_t* img, int64_t sH, int64_t sW_,
                                   const scalar_t* g, int64_t gH, int64_t gW, int64_t n_, int64_t ph, int64_t pw,
                                   const T* fy, const T* fx, T* buf, T* __restrict__ d) {
  const int64_t n = kPlane ? 1 : n_, sW = kPlane ? 1 : sW_;
  const int64_t x0 = p.xs.cell_lo, nx = p.xs.span();
  T* __restrict__ ri = buf;                // per column: rows weighted by iy
  T* __restrict__ rs = buf + nx * n;       // by hat(ys - h)
  T* __restrict__ re = buf + 2 * nx * n;   // by hat(ye - h)
  T* __restrict__ v = buf + 3 * nx * n;    // out, X_s, X_e, Y_s, Y_e of one bin
  T *vo = v, *vxs = v + n, *vxe = v + 2 * n, *vys = v + 3 * n, *vye = v + 4 * n;
  std::fill(d, d + 4 * n, T(0));
  for (int64_t i = 0; i < ph; ++i) {
    if (p.ys.begin[i] == p.ys.begin[i + 1]) continue;
    std::fill(buf, buf + 3 * nx * n, T(0));
    for (int64_t t = p.ys.begin[i]; t < p.ys.begin[i + 1]; ++t) {
      const T wy = p.ys.avg[t], ws = p.ys.at_start[t], we = p.ys.at_end[t];
      const scalar_t* src = img + (p.ys.first[i] + t - p.ys.begin[i]) * sH + x0 * sW;
      for (int64_t x = 0; x < nx; ++x) {
        const scalar_t* __restrict__ s = src + x * sW;
        for (int64_t c = 0; c < n; ++c) {
          const T f = static_cast<T>(s[c]);
          ri[x * n + c] += wy * f;
          rs[x * n + c] += ws * f;
          re[x * n + c] += we * f;
        }
      }
    }
    for (int64_t j = 0; j < pw; ++j) {
      std::fill(v, v + 5 * n, T(0));
      const int64_t off = (p.xs.first[j] - x0) * n;
      for (int64_t t = p.xs.begin[j]; t < p.xs.begin[j + 1]; ++t) {
        const T wx = p.xs.avg[t], ws = p.xs.at_start[t], we = p.xs.at_end[t];
        const int64_t e = off + (t - p.xs.begin[j]) * n;
        for (int64_t c = 0; c < n; ++c) {
          vo[c] += wx * ri[e + c];
          vxs[c] += ws * ri[e + c];
          vxe[c] += we * ri[e + c];
          vys[c] += wx * rs[e + c];
          vye[c] += wx * re[e + c];
        }
      }
      const T ax = T(1) - fx[j], bx = T(1) - fx[j + 1], ay = T(1) - fy[i], by = T(1) - fy[i + 1];
      const scalar_t* __restrict__ gb = g + i * gH + j * gW;
      for (int64_t c = 0; c < n; ++c) {
        const T gv = static_cast<T>(gb[c]);
        const T xs = gv * (vo[c] - vxs[c]), xe = gv * (vxe[c] - vo[c]);
        const T ys = gv * (vo[c] - vys[c]), ye = gv * (vye[c] - vo[c]);
        d[c] += xs * ax + xe * bx;
        d[n + c] += ys * ay + ye * by;
        d[2 * n + c] += xs * fx[j] + xe * fx[j + 1];
        d[3 * n + c] += ys * fy[i] + ye * fy[i + 1];
      }
    }
  }
}

template <typename scalar_t>
void rois_backward_impl(const Tensor& grad, const Tensor& input, const Tensor& rois, double spatial_scale,
                        int64_t ph, int64_t pw, Tensor& grad_rois) {
  using T = opmath_type<scalar_t>;
  const int64_t K = rois.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const scalar_t* grad_p = grad.const_data_ptr<scalar_t>();
  const T* roi = rois.const_data_ptr<T>();
  T* out = grad_rois.mutable_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  const bool channels_last = is_channels_last(input);
  const std::vector<T> fy = edge_fractions<T>(ph), fx = edge_fractions<T>(pw);
  Scratch<T> buf, sums;
  parallel_tasks(K, [&](int64_t k) {
    T* o = out + 5 * k;
    std::fill(o, o + 5, T(0));
    PrPlan<T> p;
    p.build(roi + 5 * k, scale, ph, pw, H, W, true);
    if (p.empty() || C == 0) return;
    const scalar_t* img = in + p.batch * sN;
    const scalar_t* g = grad_p + k * gK;
    // Sums per channel (channels_last: all channels at once), added in channel order.
    const int64_t n = channels_last ? C : 1;
    T* b = buf.get(3 * p.xs.span() * n + 5 * n);
    T* d = sums.get(4 * n);
    T total[4] = {0, 0, 0, 0};
    for (int64_t c = 0; c < C; c += n) {
      if (channels_last) {
        rois_backward_box<false>(p, img, sH, sW, g, gH, gW, n, ph, pw, fy.data(), fx.data(), b, d);
      } else {
        rois_backward_box<true>(p, img + c * sC, sH, sW, g + c * gC, gH, gW, n, ph, pw, fy.data(), fx.data(), b, d);
      }
      for (int q = 0; q < 4; ++q) {
        for (int64_t e = 0; e < n; ++e) total[q] += d[q * n + e];
      }
    }
    const T sx = scale / p.xs.bin, sy = scale / p.ys.bin;
    o[1] = total[0] * sx;
    o[2] = total[1] * sy;
    o[3] = total[2] * sx;
    o[4] = total[3] * sy;
  });
}

}  // namespace

// ---- entry points ---------------------------------------------------------------------

ROIOPS_ENTRY
Tensor prroi_pool_forward(const Tensor& input_, const Tensor& rois_, double spatial_scale, int64_t ph,
                          int64_t pw) {
  check_forward_args(input_, rois_, 5, spatial_scale, ph, pw);
  const ForwardArgs a(input_, rois_, spatial_scale);
  const Tensor &input = a.input, &rois = a.rois;
  Tensor out = empty_output({rois.size(0), input.size(1), ph, pw}, a.out_options);
  ROIOPS_DISPATCH(input.scalar_type(), [&] { forward_impl<scalar_t>(input, rois, spatial_scale, ph, pw, out); });
  return out;
}

ROIOPS_ENTRY
Tensor prroi_pool_backward(const Tensor& grad_, const Tensor& rois_, double spatial_scale, int64_t ph,
                           int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, bool channels_last) {
  check_backward_args(grad_, rois_, 5, N, C, H, W, spatial_scale, ph, pw);
  check_grad_shape(grad_, rois_.size(0), C, ph, pw);
  const BackwardArgs a(grad_, rois_, N, spatial_scale, channels_last);
  const Tensor &grad = a.grad, &rois = a.rois;
  Tensor gi = empty_output({N, C, H, W}, a.grad_options);
  ROIOPS_DISPATCH(grad.scalar_type(), [&] { backward_impl<scalar_t>(grad, rois, spatial_scale, ph, pw, gi); });
  return gi;
}

ROIOPS_ENTRY
Tensor prroi_pool_rois_backward(const Tensor& grad_, const Tensor& input_, const Tensor& rois_,
                                double spatial_scale, int64_t ph, int64_t pw) {
  const RoisBackwardArgs a(grad_, input_, rois_, spatial_scale, ph, pw);
  const Tensor &grad = a.grad, &input = a.input, &rois = a.rois;
  Tensor grad_rois = empty({rois.size(0), 5}, Options{rois.scalar_type()});
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    rois_backward_impl<scalar_t>(grad, input, rois, spatial_scale, ph, pw, grad_rois);
  });
  return to_dtype(grad_rois, rois_.scalar_type());  // in rois' dtype (a no-op for rois of the opmath type)
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("prroi_pool", TORCH_BOX(&roiops::prroi_pool_forward));
  m.impl("_prroi_pool_backward", TORCH_BOX(&roiops::prroi_pool_backward));
  m.impl("_prroi_pool_rois_backward", TORCH_BOX(&roiops::prroi_pool_rois_backward));
}
