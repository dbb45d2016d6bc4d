// Mask pasting on the CPU (docs/semantics.md, "paste_masks"): each box's mask resampled
// into the box's window of its own H x W image plane, the rest of the plane 0. Each plane
// is written once, row by row (zeros, the window's values, zeros), by tasks of (box, band
// of rows): memory traffic is the output's, computation the windows' pixels.
//
// Two rules, each in its peer's arithmetic, fused multiply-adds where that peer's CPU
// build has them (GCC contracts ATen's kernels):
//  - continuous (detectron2): pixel centres mapped into the box as a grid_sample grid,
//    bilinear with zero padding;
//  - torchvision: the mask padded with zeros, resized to the integer box by
//    upsample_bilinear2d (align_corners=False) and copied into the image.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "args.h"
#include "checks.h"
#include "memory.h"
#include "parallel.h"
#include "simd.h"
#include "torch_api.h"

namespace roiops {
namespace {

// Rows per task: enough tasks for the threads when boxes are few, whole planes otherwise.
constexpr int64_t kBand = 64;

// ATen's CPU resize (this arithmetic measured on its AVX2 build) sums four products in one
// pass while the output's height plus width is at most this, two passes beyond.
constexpr int64_t kOnePassSides = 128;

// One output column (or row) of a box: its two taps into the mask (-1: outside it, value
// 0) and their weights.
template <typename T>
struct Tap {
  int64_t lo, hi;
  T wl, wh;
};

// ---- continuous rule (detectron2's paste, grid_sample's arithmetic) ------------------

// Pixel p's tap along one axis of a box [a, b) over a mask side of m cells: detectron2's
// grid coordinate ((p + 0.5 - a) / (b - a)) * 2 - 1, each step rounded, then grid_sample's
// unnormalisation fma(g + 1, m / 2, -0.5). False for a coordinate that is not finite (a
// box of zero size): the pixel is 0.
template <typename T>
ROIOPS_SIMD bool continuous_tap(int64_t p, T a, T side, int64_t m, Tap<T>& t) {
  const T g = (static_cast<T>(p) + T(0.5) - a) / side * T(2) - T(1);
  const T x = std::fma(g + T(1), static_cast<T>(m) / T(2), T(-0.5));
  if (!std::isfinite(x)) return false;
  const T f = std::floor(x);
  // floor of a coordinate far outside is still a whole number, but may not fit int64
  const int64_t lo = f < T(-1) ? -2 : (f > static_cast<T>(m) ? m + 1 : static_cast<int64_t>(f));
  t.wh = x - f;
  t.wl = T(1) - t.wh;
  t.lo = lo >= 0 && lo < m ? lo : -1;
  t.hi = lo + 1 >= 0 && lo + 1 < m ? lo + 1 : -1;
  return true;
}

// Pixels [lo, hi) of one axis whose sample can reach the mask (coordinate in (-1, m)),
// clipped to [0, size), with two pixels of margin for rounding; empty for a box of zero or
// non-finite size.
inline std::pair<int64_t, int64_t> continuous_span(double a, double b, int64_t m, int64_t size) {
  const double side = b - a;
  if (!(side != 0 && std::isfinite(side))) return {0, 0};
  const double u = a + side * (-0.5 / static_cast<double>(m)) - 0.5;
  const double v = a + side * ((static_cast<double>(m) + 0.5) / static_cast<double>(m)) - 0.5;
  const double lo = std::floor(std::min(u, v)) - 2, hi = std::ceil(std::max(u, v)) + 3;
  const auto clip = [size](double x) { return static_cast<int64_t>(std::min(std::max(x, 0.0), double(size))); };
  return {clip(lo), clip(hi)};
}

// ---- torchvision rule (upsample_bilinear2d, align_corners=False) ----------------------

// Output index d's taps of a resize from `in` to `out` cells, in ATen's arithmetic: the
// source index scale * (d + 0.5) - 0.5 (fused where ATen's build fuses it), clamped at 0,
// its floor (taken in float, as ATen's floorf) capped at in - 1, and the clamped fraction.
// The taps index the padded mask; `pad` shifts them onto the mask (-1 outside it).
template <typename T>
ROIOPS_SIMD Tap<T> resize_tap(int64_t d, int64_t in, int64_t out, T scale, int64_t pad, int64_t m, bool fused) {
  int64_t lo, hi;
  T l1;
  if (in == out) {
    lo = hi = d;
    l1 = T(0);
  } else {
    const T at = static_cast<T>(d) + T(0.5);
    T s = fused ? std::fma(scale, at, T(-0.5)) : scale * at - T(0.5);
    if (s < T(0)) s = T(0);
    lo = std::min(static_cast<int64_t>(std::floor(static_cast<float>(s))), in - 1);
    l1 = std::min(std::max(s - static_cast<T>(lo), T(0)), T(1));
    hi = lo + (lo < in - 1 ? 1 : 0);
  }
  const auto onto = [pad, m](int64_t i) { return i - pad >= 0 && i - pad < m ? i - pad : -1; };
  return {onto(lo), onto(hi), T(1) - l1, l1};
}

// ---- shared driver -------------------------------------------------------------------

template <typename S, typename T>
inline T at(const S* plane, int64_t W, int64_t y, int64_t x) {
  return y >= 0 && x >= 0 ? static_cast<T>(plane[y * W + x]) : T(0);
}

// Columns [c0, c1) of one output row of the continuous rule (tx[c - c0] and valid[c - c0]
// are column c's tap), grid_sample's sum: the first product rounded, the others fused.
template <typename S, typename O, typename T>
ROIOPS_SIMD void continuous_row(const S* plane, int64_t mw, const Tap<T>& ty, const Tap<T>* tx, const uint8_t* valid,
                                int64_t c0, int64_t c1, T cut, O* row) {
  for (int64_t c = c0; c < c1; ++c) {
    const Tap<T>& t = tx[c - c0];
    T v = T(0);
    if (valid[c - c0]) {
      const T nw = ty.wl * t.wl, ne = ty.wl * t.wh, sw = ty.wh * t.wl, se = ty.wh * t.wh;
      v = at<S, T>(plane, mw, ty.lo, t.lo) * nw;
      v = std::fma(at<S, T>(plane, mw, ty.lo, t.hi), ne, v);
      v = std::fma(at<S, T>(plane, mw, ty.hi, t.lo), sw, v);
      v = std::fma(at<S, T>(plane, mw, ty.hi, t.hi), se, v);
    }
    if constexpr (std::is_same_v<O, bool>) {
      row[c] = v >= cut;
    } else {
      row[c] = static_cast<O>(v);
    }
  }
}

// Columns [c0, c1) of one output row of the torchvision rule, as ATen computes a resize
// (fused as its build fuses it): a small output in one pass whose weights are the products
// of the axes' weights, summed in this order; a larger one (`separable`) as a row pass
// then a column pass.
template <typename S, typename T>
ROIOPS_SIMD void torchvision_row(const S* plane, int64_t mw, const Tap<T>& ty, const Tap<T>* tx, int64_t c0,
                                 int64_t c1, bool fused, bool separable, S* row) {
  for (int64_t c = c0; c < c1; ++c) {
    const Tap<T>& t = tx[c - c0];
    const T w00 = ty.wl * t.wl, w01 = ty.wl * t.wh, w10 = ty.wh * t.wl, w11 = ty.wh * t.wh;
    const T v00 = at<S, T>(plane, mw, ty.lo, t.lo), v01 = at<S, T>(plane, mw, ty.lo, t.hi);
    const T v10 = at<S, T>(plane, mw, ty.hi, t.lo), v11 = at<S, T>(plane, mw, ty.hi, t.hi);
    T v;
    if (separable) {  // a row pass, then a column pass over its results
      const T r0 = fused ? std::fma(v00, t.wl, v01 * t.wh) : v00 * t.wl + v01 * t.wh;
      const T r1 = fused ? std::fma(v10, t.wl, v11 * t.wh) : v10 * t.wl + v11 * t.wh;
      v = fused ? std::fma(r0, ty.wl, r1 * ty.wh) : r0 * ty.wl + r1 * ty.wh;
    } else {
      v = fused ? std::fma(v11, w11, std::fma(v10, w10, std::fma(v00, w00, v01 * w01)))
                : v00 * w00 + v01 * w01 + v10 * w10 + v11 * w11;
    }
    row[c] = static_cast<S>(v);
  }
}

// Writes rows [r0, r1) of box k's output plane: row r's window [c0, c1) from value(y-tap,
// x-taps), zeros elsewhere. rows(r) is the row's tap, or false for a row outside the window.
template <typename O, typename T, typename RowTap, typename Value>
void write_rows(O* plane, int64_t W, int64_t r0, int64_t r1, int64_t c0, int64_t c1, const RowTap& rows,
                const Value& value) {
  for (int64_t r = r0; r < r1; ++r) {
    O* row = plane + r * W;
    Tap<T> ty;
    if (c0 >= c1 || !rows(r, ty)) {
      std::memset(static_cast<void*>(row), 0, sizeof(O) * static_cast<size_t>(W));
      continue;
    }
    std::memset(static_cast<void*>(row), 0, sizeof(O) * static_cast<size_t>(c0));
    value(ty, row);
    std::memset(static_cast<void*>(row + c1), 0, sizeof(O) * static_cast<size_t>(W - c1));
  }
}

// Tasks (box, band of rows) over K planes of H x W.
template <typename F>
void plane_tasks(int64_t K, int64_t H, const F& f) {
  const int64_t bands = std::max<int64_t>((H + kBand - 1) / kBand, 1);
  const int64_t per = K >= 4 * num_threads() ? bands : 1;  // whole planes when boxes are many
  const int64_t band = per == 1 ? kBand : std::max<int64_t>(H, 1);
  const int64_t tasks_per_box = per == 1 ? bands : 1;
  parallel_tasks(K * tasks_per_box, [&](int64_t t) {
    const int64_t k = t / tasks_per_box, r0 = (t % tasks_per_box) * band;
    f(k, r0, std::min(H, r0 + band));
  });
}

template <typename S, typename O>
void continuous_impl(const Tensor& masks, const Tensor& boxes, int64_t H, int64_t W, double threshold, Tensor& out,
                     bool box_window) {
  using T = opmath_type<S>;
  const int64_t K = masks.size(0), mh = masks.size(1), mw = masks.size(2);
  const S* m = masks.const_data_ptr<S>();
  const T* b = boxes.const_data_ptr<T>();
  O* o = out.mutable_data_ptr<O>();
  const T cut = static_cast<T>(threshold);
  // A threshold <= 0 passes the value 0 too: then every pixel of the box's region (its
  // window, or the whole plane) is computed, not only those its mask reaches.
  const bool zero_passes = std::is_same_v<O, bool> && T(0) >= cut;
  Scratch<Tap<T>> scratch;
  plane_tasks(K, H, [&](int64_t k, int64_t r0, int64_t r1) {
    const T* box = b + 4 * k;
    const S* plane = m + k * mh * mw;
    auto [c0, c1] = continuous_span(box[0], box[2], mw, W);
    auto [y0, y1] = continuous_span(box[1], box[3], mh, H);
    if (box_window) {  // detectron2's CPU window: [floor(x0) - 1, ceil(x1) + 1) of each axis
      const auto win = [](T lo, T hi, int64_t size) {
        return std::make_pair(std::max<int64_t>(static_cast<int64_t>(std::floor(lo)) - 1, 0),
                              std::min<int64_t>(static_cast<int64_t>(std::ceil(hi)) + 1, size));
      };
      const auto [wx0, wx1] = win(box[0], box[2], W);
      const auto [wy0, wy1] = win(box[1], box[3], H);
      c0 = std::max(c0, wx0), c1 = std::min(c1, wx1), y0 = std::max(y0, wy0), y1 = std::min(y1, wy1);
      if (zero_passes) c0 = wx0, c1 = wx1, y0 = wy0, y1 = wy1;
    } else if (zero_passes) {
      c0 = 0, c1 = W, y0 = 0, y1 = H;
    }
    const T xa = box[0], xs = box[2] - box[0], ya = box[1], ys = box[3] - box[1];
    Tap<T>* tx = scratch.get(std::max<int64_t>(c1 - c0, 1));
    std::vector<uint8_t> valid(static_cast<size_t>(std::max<int64_t>(c1 - c0, 0)));
    for (int64_t c = c0; c < c1; ++c) valid[c - c0] = continuous_tap(c, xa, xs, mw, tx[c - c0]);
    write_rows<O, T>(
        o + k * H * W, W, r0, r1, c0, c1,
        [&](int64_t r, Tap<T>& ty) {
          if (r < y0 || r >= y1) return false;
          if (!continuous_tap(r, ya, ys, mh, ty)) ty = {-1, -1, T(0), T(0)};  // value 0
          return true;
        },
        [&](const Tap<T>& ty, O* row) { continuous_row(plane, mw, ty, tx, valid.data(), c0, c1, cut, row); });
  });
}

template <typename S>
void torchvision_impl(const Tensor& masks, const Tensor& boxes, int64_t H, int64_t W, int64_t pad,
                                  bool fused, Tensor& out) {
  using T = opmath_type<S>;
  const int64_t K = masks.size(0), mh = masks.size(1), mw = masks.size(2);
  const int64_t ih = mh + 2 * pad, iw = mw + 2 * pad;  // the padded mask
  const S* m = masks.const_data_ptr<S>();
  const int64_t* b = boxes.const_data_ptr<int64_t>();
  S* o = out.mutable_data_ptr<S>();
  Scratch<Tap<T>> scratch;
  plane_tasks(K, H, [&](int64_t k, int64_t r0, int64_t r1) {
    const int64_t* box = b + 4 * k;
    const S* plane = m + k * mh * mw;
    // The box's resized mask is h x w, its cell (d, e) at image pixel (box[1] + d, box[0] + e).
    const int64_t w = std::max<int64_t>(box[2] - box[0] + 1, 1), h = std::max<int64_t>(box[3] - box[1] + 1, 1);
    const int64_t c0 = std::max<int64_t>(box[0], 0), c1 = std::min<int64_t>(box[2] + 1, W);
    const int64_t y0 = std::max<int64_t>(box[1], 0), y1 = std::min<int64_t>(box[3] + 1, H);
    const T sx = static_cast<T>(iw) / static_cast<T>(w), sy = static_cast<T>(ih) / static_cast<T>(h);
    const bool separable = h + w > kOnePassSides;
    Tap<T>* tx = scratch.get(std::max<int64_t>(c1 - c0, 1));
    for (int64_t c = c0; c < c1; ++c) tx[c - c0] = resize_tap(c - box[0], iw, w, sx, pad, mw, fused);
    write_rows<S, T>(
        o + k * H * W, W, r0, r1, c0, c1,
        [&](int64_t r, Tap<T>& ty) {
          if (r < y0 || r >= y1) return false;
          ty = resize_tap(r - box[1], ih, h, sy, pad, mh, fused);
          return true;
        },
        [&](const Tap<T>& ty, S* row) { torchvision_row(plane, mw, ty, tx, c0, c1, fused, separable, row); });
  });
}

// masks [K, Mh, Mw] floating (any type the kernels have), boxes [K, 4] of `box_type` on its
// device, the image's sides.
void check_paste_args(const Tensor& masks, const Tensor& boxes, int64_t height, int64_t width, bool integer_boxes) {
  ROIOPS_CHECK(masks.dim() == 3, "roiops: masks must be 3-D [K, M, M], got ", masks.dim(), "-D");
  check_kernel_dtype(masks, "masks");
  const ScalarType s = masks.scalar_type();
  ROIOPS_CHECK(boxes.dim() == 2 && boxes.size(1) == 4 && boxes.size(0) == masks.size(0),
               "roiops: boxes must be [K, 4] with K = masks.shape[0] = ", masks.size(0), ", got ",
               shape_name(boxes));
  const ScalarType bs = boxes.scalar_type();
  if (integer_boxes) {
    ROIOPS_CHECK(bs == ScalarType::Long, "roiops: boxes must be int64, got ", dtype_name(bs));
  } else {
    ROIOPS_CHECK(bs == (s == kDouble ? kDouble : kFloat), "roiops: boxes must be ",
                 s == kDouble ? "float64" : "float32", " for ", dtype_name(s), " masks, got ", dtype_name(bs));
  }
  ROIOPS_CHECK(same_device(boxes, masks), "roiops: boxes is on ", device_name(boxes), " but masks is on ",
               device_name(masks));
  ROIOPS_CHECK(height >= 0 && width >= 0 && height <= kMaxMapSide && width <= kMaxMapSide,
               "roiops: image height and width must be in [0, 2^24], got ", height, " x ", width);
  ROIOPS_CHECK(masks.size(1) > 0 && masks.size(2) > 0 && masks.size(1) <= kMaxMapSide &&
                   masks.size(2) <= kMaxMapSide,
               "roiops: masks must have sides in [1, 2^24], got ", masks.size(1), " x ", masks.size(2));
}

}  // namespace

ROIOPS_ENTRY
Tensor paste_masks_forward(const Tensor& masks_, const Tensor& boxes_, int64_t height, int64_t width,
                           double threshold, bool binary, bool box_window) {
  check_paste_args(masks_, boxes_, height, width, false);
  ROIOPS_CHECK(!binary || std::isfinite(threshold), "roiops: threshold must be finite, got ", format_g(threshold));
  check_cpu(masks_);
  const Tensor masks = in_format(masks_), boxes = in_format(boxes_);
  Tensor out = empty_output({masks.size(0), height, width}, Options{binary ? ScalarType::Bool : masks.scalar_type()});
  ROIOPS_DISPATCH(masks.scalar_type(), [&] {
    if (binary) {
      continuous_impl<scalar_t, bool>(masks, boxes, height, width, threshold, out, box_window);
    } else {
      continuous_impl<scalar_t, scalar_t>(masks, boxes, height, width, threshold, out, box_window);
    }
  });
  return out;
}

ROIOPS_ENTRY
Tensor paste_masks_torchvision_forward(const Tensor& masks_, const Tensor& boxes_, int64_t height, int64_t width,
                                       int64_t padding, bool fused) {
  check_paste_args(masks_, boxes_, height, width, true);
  ROIOPS_CHECK(padding >= 0 && padding <= kMaxMapSide, "roiops: padding must be in [0, 2^24], got ", padding);
  check_cpu(masks_);
  const Tensor masks = in_format(masks_), boxes = in_format(boxes_);
  Tensor out = empty_output({masks.size(0), height, width}, Options{masks.scalar_type()});
  ROIOPS_DISPATCH(masks.scalar_type(),
                  [&] { torchvision_impl<scalar_t>(masks, boxes, height, width, padding, fused, out); });
  return out;
}

}  // namespace roiops

STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) {
  m.def("paste_masks(Tensor masks, Tensor boxes, int height, int width, float threshold, bool binary, "
        "bool box_window) -> Tensor");
  m.def("paste_masks_torchvision(Tensor masks, Tensor boxes, int height, int width, int padding, bool fused) "
        "-> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("paste_masks", TORCH_BOX(&roiops::paste_masks_forward));
  m.impl("paste_masks_torchvision", TORCH_BOX(&roiops::paste_masks_torchvision_forward));
}
