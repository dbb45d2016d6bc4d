// Geometry shared by the CPU kernels: box checks, RoIAlign sampling plans, RoIPool bins.
// Arithmetic follows design.md sections 3-5 in the order torchvision uses, so float32
// results agree with it bit for bit where the formulas are the same.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace roiops {

// Coordinates beyond this many feature-map cells are refused: float32 cannot place a
// sample there, and sampling loops sized from them would not end.
constexpr double kMaxCoordinate = 16777216.0;  // 2^24

template <typename T>
void check_rois_typed(const at::Tensor& rois, int64_t batch_size, double spatial_scale) {
  const T* r = rois.const_data_ptr<T>();
  for (int64_t k = 0; k < rois.size(0); ++k, r += 5) {
    const T b = r[0];
    TORCH_CHECK_VALUE(std::isfinite(b) && b == std::floor(b) && b >= 0 && b < batch_size,
                      "roiops: rois row ", k, " has batch index ", b,
                      ", which is not an integer in [0, ", batch_size, ")");
    for (int i = 1; i < 5; ++i) {
      TORCH_CHECK_VALUE(std::isfinite(r[i]) && std::abs(r[i] * spatial_scale) <= kMaxCoordinate,
                        "roiops: rois row ", k, " has coordinate ", r[i],
                        " (not finite, or beyond 2^24 feature-map cells)");
    }
  }
}

// Cheap checks of a direct op call; the Python layer has already given friendlier errors.
inline void check_args(const at::Tensor& rois, at::ScalarType input_type, int64_t height, int64_t width,
                       double spatial_scale, int64_t pooled_height, int64_t pooled_width) {
  TORCH_CHECK_VALUE(at::isFloatingType(input_type), "roiops: input must be floating point");
  TORCH_CHECK_VALUE(height > 0 && width > 0, "roiops: input height and width must be positive");
  TORCH_CHECK_VALUE(rois.dim() == 2 && rois.size(1) == 5, "roiops: rois must be [K, 5], got ", rois.sizes());
  TORCH_CHECK_VALUE(rois.scalar_type() == (input_type == at::kDouble ? at::kDouble : at::kFloat),
                    "roiops: rois must be float64 for float64 input, float32 otherwise; got ", rois.scalar_type());
  TORCH_CHECK_VALUE(rois.device().is_cpu(), "roiops: CPU kernel called with non-CPU tensors");
  TORCH_CHECK_VALUE(pooled_height > 0 && pooled_width > 0, "roiops: output size must be positive");
  TORCH_CHECK_VALUE(spatial_scale > 0 && std::isfinite(spatial_scale), "roiops: spatial_scale must be positive and finite");
}

inline void check_input(const at::Tensor& input) {
  TORCH_CHECK_VALUE(input.dim() == 4, "roiops: input must be 4-D [N, C, H, W], got ", input.dim(), "-D");
  TORCH_CHECK_VALUE(input.device().is_cpu(), "roiops: CPU kernel called with non-CPU tensors");
}

// Checks every row of a [K, 5] rois tensor of the opmath type.
inline void check_rois(const at::Tensor& rois, int64_t batch_size, double spatial_scale) {
  AT_DISPATCH_FLOATING_TYPES(rois.scalar_type(), "roiops_check_rois",
                             [&] { check_rois_typed<scalar_t>(rois, batch_size, spatial_scale); });
}

inline bool is_channels_last(const at::Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) && !t.is_contiguous();
}

inline at::MemoryFormat format_of(bool channels_last) {
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// One bilinear sample: four element offsets (in a plane, without the channel) and weights.
template <typename T>
struct Sample {
  int64_t o1, o2, o3, o4;
  T w1, w2, w3, w4;
  int64_t index;  // iy * grid_w + ix inside its bin
};

// Interpolation taps along one axis: weight h at lo, l at hi.
template <typename T>
struct Tap {
  int64_t lo, hi;
  T l, h;
  int64_t index;
};

// Design.md sec. 3 border rule along one axis; false for a point with value 0.
template <typename T>
inline bool make_tap(T v, int64_t size, Tap<T>& t) {
  if (v < T(-1) || v > static_cast<T>(size)) return false;
  if (v <= 0) v = 0;
  int64_t lo = static_cast<int64_t>(v);
  int64_t hi;
  if (lo >= size - 1) {
    hi = lo = size - 1;
    v = static_cast<T>(lo);
  } else {
    hi = lo + 1;
  }
  t.lo = lo;
  t.hi = hi;
  t.l = v - static_cast<T>(lo);
  t.h = T(1) - t.l;
  return true;
}

// Sample positions of one box along one axis, bin by bin.
template <typename T>
struct AxisPlan {
  int64_t grid = 0;                  // samples per bin (<= 0: the bins have none)
  std::vector<Tap<T>> taps;          // samples inside the map, bin-major
  std::vector<int64_t> begin;        // taps of bin b: [begin[b], begin[b + 1])
  std::vector<int64_t> first_out;    // per bin: first sample outside the map, or -1

  void build(T start, T bin, int64_t grid_, int64_t pooled, int64_t size) {
    grid = grid_;
    taps.clear();
    begin.assign(1, 0);
    first_out.assign(pooled, -1);
    for (int64_t b = 0; b < pooled; ++b) {
      for (int64_t s = 0; s < grid; ++s) {
        const T v = start + static_cast<T>(b) * bin +
                    (static_cast<T>(s) + T(0.5)) * bin / static_cast<T>(grid);
        Tap<T> t;
        if (make_tap(v, size, t)) {
          t.index = s;
          taps.push_back(t);
        } else if (first_out[b] < 0) {
          first_out[b] = s;
        }
      }
      begin.push_back(static_cast<int64_t>(taps.size()));
    }
  }
};

// RoIAlign plan of one box: its samples bin by bin, offsets premultiplied by the strides.
template <typename T>
struct AlignPlan {
  int64_t batch = 0;
  int64_t grid_h = 0, grid_w = 0;
  T count = 1;
  AxisPlan<T> ys, xs;
  std::vector<Sample<T>> samples;    // bin-major, row-major inside a bin
  std::vector<int64_t> begin;        // samples of bin (i, j): [begin[i*pw+j], begin[i*pw+j+1])

  void build(const T* roi, T scale, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned,
             int64_t height, int64_t width, int64_t stride_h, int64_t stride_w) {
    batch = static_cast<int64_t>(roi[0]);
    const T offset = aligned ? T(0.5) : T(0);
    const T x_start = roi[1] * scale - offset;
    const T y_start = roi[2] * scale - offset;
    T roi_w = roi[3] * scale - offset - x_start;
    T roi_h = roi[4] * scale - offset - y_start;
    if (!aligned) {
      roi_w = std::max(roi_w, T(1));
      roi_h = std::max(roi_h, T(1));
    }
    const T bin_h = roi_h / static_cast<T>(ph);
    const T bin_w = roi_w / static_cast<T>(pw);
    grid_h = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(bin_h));
    grid_w = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(bin_w));
    count = static_cast<T>(std::max<int64_t>(grid_h * grid_w, 1));
    ys.build(y_start, bin_h, grid_h, ph, height);
    xs.build(x_start, bin_w, grid_w, pw, width);

    samples.clear();
    begin.assign(1, 0);
    for (int64_t i = 0; i < ph; ++i) {
      for (int64_t j = 0; j < pw; ++j) {
        for (int64_t a = ys.begin[i]; a < ys.begin[i + 1]; ++a) {
          const Tap<T>& ty = ys.taps[a];
          for (int64_t b = xs.begin[j]; b < xs.begin[j + 1]; ++b) {
            const Tap<T>& tx = xs.taps[b];
            samples.push_back({ty.lo * stride_h + tx.lo * stride_w, ty.lo * stride_h + tx.hi * stride_w,
                               ty.hi * stride_h + tx.lo * stride_w, ty.hi * stride_h + tx.hi * stride_w,
                               ty.h * tx.h, ty.h * tx.l, ty.l * tx.h, ty.l * tx.l,
                               ty.index * grid_w + tx.index});
          }
        }
        begin.push_back(static_cast<int64_t>(samples.size()));
      }
    }
  }

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
};

// Caffe (Fast R-CNN, torchvision) or mmdetection (continuous) RoIPool bins of one box.
template <typename T>
struct PoolPlan {
  int64_t batch = 0;
  std::vector<int64_t> h0, h1, w0, w1;  // bin i covers rows [h0[i], h1[i]), clipped to the map

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
      // C's round(): half away from zero.
      const int64_t x1 = static_cast<int64_t>(std::round(roi[1] * scale));
      const int64_t y1 = static_cast<int64_t>(std::round(roi[2] * scale));
      const int64_t x2 = static_cast<int64_t>(std::round(roi[3] * scale));
      const int64_t y2 = static_cast<int64_t>(std::round(roi[4] * scale));
      const int64_t roi_w = std::max<int64_t>(x2 - x1 + 1, 1);
      const int64_t roi_h = std::max<int64_t>(y2 - y1 + 1, 1);
      bins(static_cast<T>(y1), static_cast<T>(roi_h) / static_cast<T>(ph), ph, height, false, h0, h1, false);
      bins(static_cast<T>(x1), static_cast<T>(roi_w) / static_cast<T>(pw), pw, width, false, w0, w1, false);
    }
  }

 private:
  // Caffe adds the integer start after floor/ceil; mmdetection adds the real start before.
  static void bins(T start, T bin, int64_t pooled, int64_t size, bool empty, std::vector<int64_t>& lo,
                   std::vector<int64_t>& hi, bool continuous) {
    lo.resize(pooled);
    hi.resize(pooled);
    const int64_t s = static_cast<int64_t>(start);
    for (int64_t p = 0; p < pooled; ++p) {
      int64_t a, b;
      if (continuous) {
        a = static_cast<int64_t>(std::floor(static_cast<T>(p) * bin + start));
        b = static_cast<int64_t>(std::ceil(static_cast<T>(p + 1) * bin + start));
      } else {
        a = static_cast<int64_t>(std::floor(static_cast<T>(p) * bin)) + s;
        b = static_cast<int64_t>(std::ceil(static_cast<T>(p + 1) * bin)) + s;
      }
      lo[p] = std::min(std::max<int64_t>(a, 0), size);
      hi[p] = empty ? lo[p] : std::min(std::max<int64_t>(b, 0), size);
    }
  }
};

// The running maximum of design.md: strictly greater wins, the first NaN wins.
template <typename T>
inline bool beats(T v, T best) {
  return v > best || (std::isnan(v) && !std::isnan(best));
}

}  // namespace roiops
