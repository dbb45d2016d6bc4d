// Position-sensitive RoIPool on the CPU (docs/semantics.md, "ps_roi_pool").
//
// Each box's bins are computed once and shared by all channels; the kernels run
// position_sensitive.h's tasks. Sums are torchvision's, in its order: the bin's cells
// added row by row from 0, divided by the bin's area; backward adds grad / area to each
// cell, boxes in increasing k. So float32 and float64 results equal torchvision's bit for
// bit where the semantics agree (bins clipped to the map, see semantics.md).
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <vector>

#include "geometry.h"
#include "position_sensitive.h"
#include "registry.h"
#include "sampling.h"

namespace roiops {
namespace {

// Bins of one box: bin i covers rows [h0[i], h1[i]), columns [w0[j], w1[j]), clipped to the map.
struct PsPoolPlan {
  int64_t batch = 0;
  std::vector<int64_t> h0, h1, w0, w1;

  template <typename T>
  void build(const T* roi, T scale, int64_t ph, int64_t pw, int64_t H, int64_t W) {
    batch = static_cast<int64_t>(roi[0]);
    const int64_t x1 = round_half_away(roi[1] * scale), y1 = round_half_away(roi[2] * scale);
    const int64_t x2 = round_half_away(roi[3] * scale), y2 = round_half_away(roi[4] * scale);
    edges<T>(y1, std::max<int64_t>(y2 - y1, 1), ph, H, h0, h1);
    edges<T>(x1, std::max<int64_t>(x2 - x1, 1), pw, W, w0, w1);
  }

 private:
  template <typename T>
  static void edges(int64_t start, int64_t size, int64_t pooled, int64_t limit, std::vector<int64_t>& lo,
                    std::vector<int64_t>& hi) {
    lo.resize(pooled);
    hi.resize(pooled);
    const T bin = static_cast<T>(size) / static_cast<T>(pooled);
    for (int64_t p = 0; p < pooled; ++p) {
      pool_bin_edges(static_cast<T>(start), bin, p, limit, /*continuous=*/false, lo[p], hi[p]);
    }
  }
};

template <typename T>
std::vector<PsPoolPlan> build_plans(const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw, int64_t H,
                                    int64_t W) {
  const int64_t K = rois.size(0);
  std::vector<PsPoolPlan> plans(static_cast<size_t>(K));
  const T* roi = rois.const_data_ptr<T>();
  const T scale = static_cast<T>(spatial_scale);
  at::parallel_for(0, K, 64, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) plans[k].build(roi + 5 * k, scale, ph, pw, H, W);
  });
  return plans;
}

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
inline int64_t cover_bin(const std::vector<PsPoolPlan>& plans, const std::vector<int64_t>& boxes, int64_t i,
                         int64_t j, PsTile& t) {
  int64_t reads = 0;
  for (const int64_t k : boxes) {
    const PsPoolPlan& p = plans[k];
    const int64_t y0 = p.h0[i], y1 = p.h1[i], x0 = p.w0[j], x1 = p.w1[j];
    if (y1 <= y0 || x1 <= x0) continue;
    t.cover(y0, y1);
    reads += (y1 - y0) * (x1 - x0);
  }
  return reads;
}

// pool_bin on a task's lanes: acc (v.L lanes) = sum of rows [y0, y1) x columns [x0, x1).
template <typename T>
ROIOPS_SIMD void pool_bin_lanes(const PsLanes<const T>& v, int64_t y0, int64_t y1, int64_t x0, int64_t x1,
                                T* __restrict__ acc) {
  for (int64_t c = 0; c < v.L; c += 8) {
    lanes8<T> sum{};
    for (int64_t y = y0; y < y1; ++y) {
      for (int64_t x = x0; x < x1; ++x) sum += load8(v.data + (y * v.sH + x * v.sW - v.org) + c);
    }
    store8(acc + c, sum);
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

// Cells read by all boxes of `plans` over all bins (the reads of a forward).
inline int64_t total_reads(const std::vector<PsPoolPlan>& plans) {
  int64_t reads = 0;
  for (const PsPoolPlan& p : plans) {
    int64_t rows = 0, cols = 0;
    for (size_t i = 0; i < p.h0.size(); ++i) rows += std::max<int64_t>(p.h1[i] - p.h0[i], 0);
    for (size_t j = 0; j < p.w0.size(); ++j) cols += std::max<int64_t>(p.w1[j] - p.w0[j], 0);
    reads += rows * cols;
  }
  return reads;
}

template <typename scalar_t>
void forward_impl(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  int64_t C_out, at::Tensor& out) {
  using T = at::opmath_type<scalar_t>;
  const int64_t N = input.size(0), H = input.size(2), W = input.size(3), bins = ph * pw;
  const std::vector<PsPoolPlan> plans = build_plans<T>(rois, spatial_scale, ph, pw, H, W);
  const Strides s(input);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  PsOutput<scalar_t> result(out);
  std::optional<PsBinMajor<T>> bm;
  if (s.w != 1 && PsBinMajor<T>::use(total_reads(plans), N, H * W, C_out, bins)) {
    bm.emplace(N, H, W, C_out, bins, input.options().dtype(c10::CppTypeToScalarType<T>::value), false);
    bm->load(in);
  }
  Scratch<T> scratch;
  const auto task = [&](int64_t n, int64_t bin, int64_t c0, int64_t nc, const std::vector<int64_t>& boxes) {
    const int64_t i = bin / pw, j = bin % pw;
    const scalar_t* base = in + n * s.n + (c0 * bins + bin) * s.c;
    PsTile t(nc, W);
    PsLanes<const T> v{};
    const bool lanes = bm || (s.w == 1 && ps_use_tile<T>(t, cover_bin(plans, boxes, i, j, t), nc));
    T* acc = ps_forward_storage(bm, lanes, t, base, bins * s.c, n, bin, c0, nc, scratch, v);
    for (const int64_t k : boxes) {
      const PsPoolPlan& p = plans[k];
      const int64_t y0 = p.h0[i], y1 = p.h1[i], x0 = p.w0[j], x1 = p.w1[j];
      scalar_t* r = result.row(bin, k) + c0;
      if (y1 <= y0 || x1 <= x0) {
        for (int64_t c = 0; c < nc; ++c) r[c] = scalar_t(0);
        continue;
      }
      if (lanes) {
        pool_bin_lanes(v, y0, y1, x0, x1, acc);
      } else {
        pool_bin(base, bins * s.c, s.h, s.w, y0, y1, x0, x1, nc, acc);
      }
      const T area = static_cast<T>((y1 - y0) * (x1 - x0));
      for (int64_t c = 0; c < nc; ++c) r[c] = static_cast<scalar_t>(acc[c] / area);
    }
  };
  ps_tasks(ps_batch(rois), N, C_out, bins, task);
  result.finish();
}

template <typename scalar_t>
void backward_impl(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                   int64_t N, int64_t H, int64_t W, const PsBackward& args) {
  using T = at::opmath_type<scalar_t>;
  const int64_t C_out = grad.size(1), bins = ph * pw;
  const std::vector<PsPoolPlan> plans = build_plans<T>(rois, spatial_scale, ph, pw, H, W);
  const Strides a(args.acc);
  const Strides gs(grad);  // grad read where it lies: a bin's channels gs.c apart
  const scalar_t* grad_p = grad.const_data_ptr<scalar_t>();
  T* acc_p = args.acc.data_ptr<T>();
  std::optional<PsBinMajor<T>> bm;
  if (a.w != 1 && PsBinMajor<T>::use(total_reads(plans), N, H * W, C_out, bins)) {
    bm.emplace(N, H, W, C_out, bins, args.acc.options(), true);
  }
  Scratch<T> scratch;
  const auto task = [&](int64_t n, int64_t bin, int64_t c0, int64_t nc, const std::vector<int64_t>& boxes) {
    const int64_t i = bin / pw, j = bin % pw;
    T* base = acc_p + n * a.n + (c0 * bins + bin) * a.c;
    PsTile t(nc, W);
    PsLanes<T> v{};
    const bool lanes = bm || (a.w == 1 && ps_use_tile<T>(t, cover_bin(plans, boxes, i, j, t), nc));
    T* d = args.storage(bm, lanes, t, base, bins * a.c, n, bin, c0, nc, nc, scratch, v);
    for (const int64_t k : boxes) {
      const PsPoolPlan& p = plans[k];
      const int64_t y0 = p.h0[i], y1 = p.h1[i], x0 = p.w0[j], x1 = p.w1[j];
      if (y1 <= y0 || x1 <= x0) continue;
      const T area = static_cast<T>((y1 - y0) * (x1 - x0));
      const scalar_t* gk = grad_p + k * gs.n + c0 * gs.c + i * gs.h + j * gs.w;
      for (int64_t c = 0; c < nc; ++c) d[c] = static_cast<T>(gk[c * gs.c]) / area;
      if (lanes) {
        pool_bin_lanes_backward(d, v, y0, y1, x0, x1);
      } else {
        pool_bin_backward(d, base, bins * a.c, a.h, a.w, y0, y1, x0, x1, nc);
      }
    }
    if (lanes && !bm) ps_store_tile(v.data, t, nc, base, bins * a.c);
  };
  ps_tasks(ps_batch(rois), N, C_out, bins, task);
  if (bm) bm->store(acc_p);
}

}  // namespace

at::Tensor ps_roi_pool_forward(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t ph,
                               int64_t pw) {
  PsForward a(input, rois, spatial_scale, ph, pw);
  if (a.out.numel() == 0) return a.out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.input.scalar_type(), "roiops_ps_roi_pool_forward", [&] {
    forward_impl<scalar_t>(a.input, a.rois, spatial_scale, ph, pw, a.C_out, a.out);
  });
  return a.out;
}

at::Tensor ps_roi_pool_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale, int64_t ph,
                                int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, bool channels_last) {
  PsBackward a(grad, rois, spatial_scale, ph, pw, N, C, H, W, channels_last);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.grad.scalar_type(), "roiops_ps_roi_pool_backward", [&] {
    backward_impl<scalar_t>(a.grad, a.rois, spatial_scale, ph, pw, N, H, W, a);
  });
  return a.result();
}

namespace {

// The Python entry points, in roiops._C (registry.h).
const Registrar registrar([](pybind11::module_& m) {
  m.def("ps_roi_pool_forward", &ps_roi_pool_forward);
  m.def("ps_roi_pool_backward", &ps_roi_pool_backward);
});

}  // namespace

}  // namespace roiops
