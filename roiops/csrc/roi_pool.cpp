// RoIPool on the CPU, Caffe and mmdetection conventions (docs/semantics.md, "roi_pool").
//
// Tasks as in roi_align.cpp: (image, block of channels) for forward, read in place when
// channels_last and from a channels-last tile of the block when NCHW (per-plane kernels
// when the boxes cover little of the map); backward tasks own bands of rows (all channels
// when channels_last, a block of channels when NCHW) and add boxes in increasing k.
//
// The result must equal a row-major scan that keeps the first maximum (strictly greater
// wins, the first NaN wins). That is: NaN if the bin holds one, else the maximum; and the
// smallest flat index h * W + w among the elements equal to it. This rule does not depend
// on the order of the scan, which lets the per-plane kernel reduce columns first
// (vectorised along the row), then across columns.

#include <algorithm>
#include <array>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "args.h"
#include "checks.h"
#include "geometry.h"
#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "plans.h"
#include "simd.h"
#include "tiles.h"

namespace roiops {
namespace {

template <typename T>
BoxPlans<PoolPlan<T>> build_plans(const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw, bool continuous,
                                  int64_t H, int64_t W) {
  const T* roi = rois.const_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  return BoxPlans<PoolPlan<T>>(rois.size(0), [&](PoolPlan<T>& p, int64_t k) {
    p.build(roi + 5 * k, scale, ph, pw, continuous, H, W);
  });
}

// colv/colr <- the first maximum of (colv, row): per column, the larger value and the
// row it came from; ties keep the earlier row. Branch-free so that it vectorises.
template <typename scalar_t, typename T>
inline void column_max(T* __restrict__ colv, int32_t* __restrict__ colr, const scalar_t* __restrict__ row,
                       int32_t h, int64_t n) {
  for (int64_t x = 0; x < n; ++x) take_first_max(static_cast<T>(row[x]), h, colv[x], colr[x]);
}

// One box on one NCHW plane (rows contiguous). Per bin row: colv/colr hold, per column of
// the box, the column's first maximum over the bin's rows; then each bin reduces its
// columns by the rule above.
template <typename scalar_t, typename T>
ROIOPS_SIMD void forward_plane(const PoolPlan<T>& p, const scalar_t* plane, int64_t W, int64_t ph, int64_t pw, T* colv,
                               int32_t* colr, scalar_t* out, int32_t* am, int64_t oH, int64_t oW) {
  const int64_t xa = p.w0[0], xb = p.w1[pw - 1], nx = xb - xa;
  for (int64_t i = 0; i < ph; ++i) {
    const int64_t h0 = p.h0[i], h1 = p.h1[i];
    if (h0 < h1 && nx > 0) {
      const scalar_t* r0 = plane + h0 * W + xa;
      for (int64_t x = 0; x < nx; ++x) {
        colv[x] = static_cast<T>(r0[x]);
        colr[x] = static_cast<int32_t>(h0);
      }
      for (int64_t h = h0 + 1; h < h1; ++h) column_max(colv, colr, plane + h * W + xa, static_cast<int32_t>(h), nx);
    }
    for (int64_t j = 0; j < pw; ++j) {
      T best = 0;
      int64_t idx = -1;
      if (h0 < h1 && p.w0[j] < p.w1[j]) {
        for (int64_t x = p.w0[j]; x < p.w1[j]; ++x) {
          const T v = colv[x - xa];
          const int64_t at = colr[x - xa] * W + x;
          if (first_max(v, at, best, idx)) {
            best = v;
            idx = at;
          }
        }
      }
      out[i * oH + j * oW] = static_cast<scalar_t>(best);
      am[i * oH + j * oW] = static_cast<int32_t>(idx);
    }
  }
}

// One box, n contiguous channels (cell (y, x) at img + y * sH + x * sW): a row-major scan
// of each bin, vectorised along channels. Output channel c at out[... + c * oC].
// kN > 0: n == kN is known at compile time, and the running maximum stays in registers.
template <int64_t kN, typename S, typename T, typename scalar_t>
ROIOPS_SIMD void forward_cl(const PoolPlan<T>& p, const S* img, int64_t sH, int64_t sW, int64_t W, int64_t n_,
                            int64_t ph, int64_t pw, T* best_, int32_t* idx_, scalar_t* out, int32_t* am, int64_t oH,
                            int64_t oW, int64_t oC) {
  const auto scan = [&](int64_t i, int64_t j, const int64_t n, T* __restrict__ best, int32_t* __restrict__ idx)
                        __attribute__((always_inline)) {
    if (p.h0[i] >= p.h1[i] || p.w0[j] >= p.w1[j]) {
      std::fill(best, best + n, T(0));
      std::fill(idx, idx + n, -1);
      return;
    }
    const S* __restrict__ first = img + p.h0[i] * sH + p.w0[j] * sW;
    const int32_t first_at = static_cast<int32_t>(p.h0[i] * W + p.w0[j]);
    for (int64_t c = 0; c < n; ++c) {
      best[c] = static_cast<T>(first[c]);
      idx[c] = first_at;
    }
    for (int64_t h = p.h0[i]; h < p.h1[i]; ++h) {
      for (int64_t w = h == p.h0[i] ? p.w0[j] + 1 : p.w0[j]; w < p.w1[j]; ++w) {
        const S* __restrict__ v = img + h * sH + w * sW;
        const int32_t at = static_cast<int32_t>(h * W + w);
        for (int64_t c = 0; c < n; ++c) take_first_max(static_cast<T>(v[c]), at, best[c], idx[c]);
      }
    }
  };
  max_bins<kN>(n_, ph, pw, best_, idx_, out, am, oH, oW, oC, scan);
}

// Rows and columns of the map that box p reads: {y0, y1, x0, x1}, empty when y0 >= y1.
template <typename T>
std::array<int64_t, 4> pool_rect(const PoolPlan<T>& p, int64_t ph, int64_t pw) {
  std::array<int64_t, 4> r = {p.h0[0], p.h1[ph - 1], p.w0[0], p.w1[pw - 1]};  // bins are monotonic
  if (r[0] >= r[1] || r[2] >= r[3]) r = {0, 0, 0, 0};
  return r;
}

template <typename scalar_t>
void forward_impl(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  bool continuous, Tensor& out, Tensor& argmax) {
  using T = opmath_type<scalar_t>;
  const int64_t K = rois.size(0), N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
  const int64_t oK = out.stride(0), oC = out.stride(1), oH = out.stride(2), oW = out.stride(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  int32_t* am = argmax.mutable_data_ptr<int32_t>();
  if (K == 0 || C == 0) return;
  const auto plans = build_plans<T>(rois, spatial_scale, ph, pw, continuous, H, W);
  std::vector<int64_t> batch(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) batch[k] = plans[k].batch;
  const auto by_image = boxes_by_image(batch, N);
  const bool channels_last = is_channels_last(input);
  // A bin reads every cell it covers, so unlike roi_align both layouts go through tiles
  // when the boxes cover the map (see use_tile in align_kernels.h).
  const int64_t cb = channel_block(N, C, kTileChannels), blocks = (C + cb - 1) / cb;
  std::vector<std::array<int64_t, 4>> rect(static_cast<size_t>(N), {H, 0, W, 0});
  std::vector<char> tiled(static_cast<size_t>(N), 0);
  for (int64_t n = 0; n < N; ++n) {
    double area = 0;
    for (const int64_t k : by_image[n]) {
      const auto r = pool_rect(plans[k], ph, pw);
      if (r[0] >= r[1]) continue;
      rect[n] = {std::min(rect[n][0], r[0]), std::max(rect[n][1], r[1]), std::min(rect[n][2], r[2]),
                 std::max(rect[n][3], r[3])};
      area += static_cast<double>(r[1] - r[0]) * static_cast<double>(r[3] - r[2]);
    }
    tiled[n] = rect[n][0] < rect[n][1] && tile_pays(rect[n], area, H, W, cb, sizeof(T));
  }

  Scratch<T> tile, best;
  Scratch<int32_t> idx;
  parallel_tasks(N * blocks, [&](int64_t t) {
    const int64_t n = t / blocks, c0 = (t % blocks) * cb, nc = std::min(cb, C - c0);
    if (tiled[n]) {
      T* buf = tile.get(H * W * nc);
      const auto& r = rect[n];
      if (channels_last) {
        cells_to_tile(in + n * sN + c0, sH, sW, W, nc, r[0], r[1], r[2], r[3], buf);
      } else {
        planes_to_tile(in + n * sN + c0 * sC, sC, W, nc, r[0], r[1], r[2], r[3], buf);
      }
      with_width(nc, [&](auto kN) {
        for (const int64_t k : by_image[n]) {
          forward_cl<kN>(plans[k], static_cast<const T*>(buf), W * nc, nc, W, nc, ph, pw, best.get(nc), idx.get(nc),
                         o + k * oK + c0 * oC, am + k * oK + c0 * oC, oH, oW, oC);
        }
      });
    } else if (channels_last) {
      for (const int64_t k : by_image[n]) {
        forward_cl<0>(plans[k], in + n * sN + c0, sH, sW, W, nc, ph, pw, best.get(nc), idx.get(nc),
                      o + k * oK + c0 * oC, am + k * oK + c0 * oC, oH, oW, oC);
      }
    } else {
      for (int64_t c = c0; c < c0 + nc; ++c) {
        for (const int64_t k : by_image[n]) {
          forward_plane(plans[k], in + n * sN + c * sC, W, ph, pw, best.get(W), idx.get(W), o + k * oK + c * oC,
                        am + k * oK + c * oC, oH, oW);
        }
      }
    }
  });
}

// Bounds of argmax values: the smallest index (unsigned, so that -1, no maximum, sorts
// above every index), the largest, and the smallest signed value (< -1: invalid).
struct ArgmaxBounds {
  uint32_t lo = UINT32_MAX;
  int32_t hi = -1, low = 0;
};

// Scratch of argmax_rows for NCHW: element-wise bounds of one box's ph * pw positions.
struct ArgmaxScratch {
  std::vector<uint32_t> lo;
  std::vector<int32_t> hi, low;
};

ROIOPS_SIMD inline ArgmaxBounds bounds_of(const int32_t* __restrict__ a, int64_t n, ArgmaxBounds b) {
  for (int64_t e = 0; e < n; ++e) {
    b.lo = std::min(b.lo, static_cast<uint32_t>(a[e]));
    b.hi = std::max(b.hi, a[e]);
    b.low = std::min(b.low, a[e]);
  }
  return b;
}

ROIOPS_SIMD inline void bounds_elementwise(const int32_t* __restrict__ a, int64_t n, uint32_t* __restrict__ lo,
                                           int32_t* __restrict__ hi, int32_t* __restrict__ low) {
  for (int64_t e = 0; e < n; ++e) {
    lo[e] = std::min(lo[e], static_cast<uint32_t>(a[e]));
    hi[e] = std::max(hi[e], a[e]);
    low[e] = std::min(low[e], a[e]);
  }
}

// rows[i] = the map rows that bin row i of one box sends gradient to (first > second:
// none); false if an argmax value is < -1 or beyond the map. Read in memory order, in
// vector loops: channels-last, a bin row is one run of pw * C values; NCHW, the C runs of
// ph * pw values are first reduced element-wise.
bool argmax_rows(const int32_t* box, int64_t sC, int64_t sH, int64_t C, int64_t ph, int64_t pw, int64_t H,
                 int64_t W, std::pair<int64_t, int64_t>* rows, ArgmaxScratch& s) {
  int32_t low = 0;
  auto set_row = [&](int64_t i, const ArgmaxBounds& b) {
    rows[i] = b.hi >= 0 ? std::make_pair<int64_t, int64_t>(b.lo / W, b.hi / W) : std::make_pair<int64_t, int64_t>(1, 0);
    low = std::min(low, b.low);
  };
  if (sC == 1) {
    for (int64_t i = 0; i < ph; ++i) set_row(i, bounds_of(box + i * sH, pw * C, ArgmaxBounds{}));
  } else {
    s.lo.assign(static_cast<size_t>(ph * pw), UINT32_MAX);
    s.hi.assign(s.lo.size(), -1);
    s.low.assign(s.lo.size(), 0);
    for (int64_t c = 0; c < C; ++c) bounds_elementwise(box + c * sC, ph * pw, s.lo.data(), s.hi.data(), s.low.data());
    for (int64_t i = 0; i < ph; ++i) {
      ArgmaxBounds b;
      for (int64_t e = i * pw; e < (i + 1) * pw; ++e) {
        b.lo = std::min(b.lo, s.lo[e]);
        b.hi = std::max(b.hi, s.hi[e]);
        b.low = std::min(b.low, s.low[e]);
      }
      set_row(i, b);
    }
  }
  return low >= -1 && std::none_of(rows, rows + ph, [&](const auto& r) { return r.second >= H; });
}

// grad goes to the argmax element. Tasks own rows [y0, y1) x a block of channels of one
// image and add their boxes' terms in increasing k, per (cell, channel) in the order
// (k, i, j) as torchvision does: the sums are bit-exact. Bands and accumulators as in
// roi_align.cpp's backward (tiles.h): channels_last reads grad and argmax in place, and
// accumulates a float/double gradient in place; NCHW accumulates in a channels-last tile
// (in place, NCHW's scattered writes to 16 planes measured slower).
// `rows[k * ph + i]` is the range of map rows that bin row i of box k sends gradient to
// (first > second: none), so that a task reads only the bin rows that reach its band.
// Adds box k's gradient values whose argmax lies in band rows [y0, y1) (map elements [lo,
// hi)) into acc (cell (a - lo) at (a - lo) * aW, nc channels): grad and argmax share the
// strides gC, gH, gW, the box's first element at e0; rows[i] is bin row i's span of map
// rows. A function of its own, so that the scatter loop compiles alike wherever the band
// task runs.
template <typename scalar_t, typename T>
ROIOPS_SIMD void add_box(const scalar_t* g, const int32_t* am, int64_t e0, int64_t gC, int64_t gH, int64_t gW,
                         int64_t nc, int64_t ph, int64_t pw, const std::pair<int64_t, int64_t>* rows, int64_t y0,
                         int64_t y1, int64_t lo, int64_t hi, T* acc, int64_t aW, bool channels_last) {
  auto one = [&](int64_t e, int64_t c) {
    const int64_t a = am[e];
    if (a >= lo && a < hi) acc[(a - lo) * aW + c] += static_cast<T>(g[e]);
  };
  auto reaches = [&](int64_t i) {
    return rows[i].first <= rows[i].second && rows[i].first < y1 && rows[i].second >= y0;
  };
  if (channels_last) {  // channels innermost: read in memory order
    for (int64_t i = 0; i < ph; ++i) {
      if (!reaches(i)) continue;
      for (int64_t j = 0; j < pw; ++j) {
        for (int64_t c = 0; c < nc; ++c) one(e0 + i * gH + j * gW + c, c);
      }
    }
  } else {
    for (int64_t c = 0; c < nc; ++c) {
      for (int64_t i = 0; i < ph; ++i) {
        if (!reaches(i)) continue;
        for (int64_t j = 0; j < pw; ++j) one(e0 + c * gC + i * gH + j * gW, c);
      }
    }
  }
}

template <typename scalar_t>
void backward_impl(const Tensor& grad, const Tensor& argmax, const std::vector<int64_t>& batch,
                   const std::vector<std::pair<int64_t, int64_t>>& rows, Tensor& gi) {
  using T = opmath_type<scalar_t>;
  const int64_t N = gi.size(0), C = gi.size(1), H = gi.size(2), W = gi.size(3);
  const int64_t ph = grad.size(2), pw = grad.size(3);
  if (gi.numel() == 0) return;
  const bool channels_last = is_channels_last(gi);
  const int64_t K = grad.size(0);
  std::vector<std::pair<int64_t, int64_t>> spans(static_cast<size_t>(K), {1, 0});
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t i = 0; i < ph; ++i) {
      const auto& r = rows[k * ph + i];
      if (r.first > r.second) continue;
      spans[k] = spans[k].first > spans[k].second
                     ? r
                     : std::make_pair(std::min(spans[k].first, r.first), std::max(spans[k].second, r.second));
    }
  }
  const BackwardSplit split(N, C, H, W, sizeof(T), channels_last, batch, spans);
  // grad and argmax share strides: box k, bin (i, j), channel c at k * gK + c * gC + i * gH + j * gW.
  const scalar_t* grad_p = grad.const_data_ptr<scalar_t>();
  const int32_t* am_p = argmax.const_data_ptr<int32_t>();
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);

  for_each_band<T, scalar_t>(split, gi, /*fresh=*/true, [&](const BackwardSplit::Task& task, T* acc, int64_t aW) {
    const int64_t y0 = task.y0, y1 = task.y1, c0 = task.c0, nc = task.nc;
    const scalar_t* g = grad_p + c0 * gC;
    const int32_t* am = am_p + c0 * gC;
    const int64_t lo = y0 * W, hi = y1 * W;  // argmax values inside the band
    const std::vector<int64_t>& list = split.bands.boxes[task.band];
    for (size_t q = 0; q < list.size(); ++q) {
      const int64_t k = list[q];
      if (q + 1 < list.size() && nc < C) {
        prefetch_block(g + list[q + 1] * gK, gC, gH, gW, nc, ph, pw);
        prefetch_block(am + list[q + 1] * gK, gC, gH, gW, nc, ph, pw);
      }
      add_box(g, am, k * gK, gC, gH, gW, nc, ph, pw, &rows[k * ph], y0, y1, lo, hi, acc, aW, channels_last);
    }
  });
}

}  // namespace

ROIOPS_ENTRY
std::tuple<Tensor, Tensor> roi_pool_forward(const Tensor& input_, const Tensor& rois_,
                                            double spatial_scale, int64_t ph, int64_t pw, bool continuous) {
  check_forward_args(input_, rois_, 5, spatial_scale, ph, pw);
  ROIOPS_CHECK(input_.size(2) * input_.size(3) <= INT32_MAX,
                    "roiops: roi_pool needs H * W < 2^31 (its argmax is the int32 h * W + w), got input height ",
                    input_.size(2), " and width ", input_.size(3));
  const ForwardArgs a(input_, rois_, spatial_scale);
  const Tensor &input = a.input, &rois = a.rois;
  Tensor out = empty_output({rois.size(0), input.size(1), ph, pw}, a.out_options);
  Tensor argmax = empty_output({rois.size(0), input.size(1), ph, pw}, a.out_options.dtype(kInt));
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    forward_impl<scalar_t>(input, rois, spatial_scale, ph, pw, continuous, out, argmax);
  });
  return {out, argmax};
}

ROIOPS_ENTRY
Tensor roi_pool_backward(const Tensor& grad_, const Tensor& argmax_, const Tensor& rois_, int64_t N,
                         int64_t C, int64_t H, int64_t W, bool channels_last) {
  // The shared checks (checks.h) of a backward without spatial_scale, its pooled size grad's.
  check_map_tensor(grad_, "grad");
  check_rois_arg(rois_, 5, grad_, "grad");
  check_batch_channels(N, C);
  check_map_size(H, W);
  check_pooled(grad_.size(2), grad_.size(3), " (grad's last two sizes)");
  check_grad_shape(grad_, rois_.size(0), C, grad_.size(2), grad_.size(3));
  check_argmax(argmax_, grad_);
  // Only batch indices: the coordinates were checked (with spatial_scale, which this op
  // does not receive) by the forward, and the argmax values are checked below.
  const BackwardArgs a(grad_, rois_, N, 1.0, channels_last, /*check_coords=*/false);
  const Tensor &grad = a.grad, &rois = a.rois;
  const Tensor argmax = in_layout(argmax_, channels_last);
  // Per box and bin row: the map rows its argmax values point to, each value checked to
  // lie in [-1, H * W) so that no access leaves the map.
  const int64_t K = grad.size(0), ph = grad.size(2), pw = grad.size(3);
  const int32_t* am = argmax.const_data_ptr<int32_t>();
  std::vector<std::pair<int64_t, int64_t>> rows(static_cast<size_t>(K * ph));
  std::vector<char> bad(static_cast<size_t>(K), 0);
  parallel_for(0, K, 16, [&](int64_t k0, int64_t k1) {
    ArgmaxScratch scratch;
    for (int64_t k = k0; k < k1; ++k) {
      bad[k] = !argmax_rows(am + k * argmax.stride(0), argmax.stride(1), argmax.stride(2), C, ph, pw, H, W,
                            rows.data() + k * ph, scratch);
    }
  });
  for (int64_t k = 0; k < K; ++k) {
    ROIOPS_CHECK(!bad[k], "roiops: argmax holds an index outside the map (box ", k, ")");
  }
  std::vector<int64_t> batch(static_cast<size_t>(K));
  ROIOPS_DISPATCH_FLOAT(rois.scalar_type(), [&] {
    const scalar_t* rr = rois.const_data_ptr<scalar_t>();
    for (int64_t k = 0; k < K; ++k) batch[k] = static_cast<int64_t>(rr[5 * k]);
  });
  Tensor gi = empty_output({N, C, H, W}, a.grad_options);
  ROIOPS_DISPATCH(grad.scalar_type(), [&] { backward_impl<scalar_t>(grad, argmax, batch, rows, gi); });
  return gi;
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("roi_pool", TORCH_BOX(&roiops::roi_pool_forward));
  m.impl("_roi_pool_backward", TORCH_BOX(&roiops::roi_pool_backward));
}
