// The kernels' argument checks: what a direct op call must refuse, read from shapes,
// dtypes, devices and scalars: the checks of roiops/_kernel_checks.py (which the Triton and
// reference kernels run), in the same order and with the same exception types and
// messages, so that every backend refuses a bad call alike (tests/test_contract.py compares
// them). The map tensor is `input`, or `grad` in a backward. The order: the map tensor;
// rois; batch size and channels (a backward's), the map's height and width; the pooled
// size, spatial_scale, sampling_ratio; position-sensitive channels (ps_out_channels);
// grad's shape (a box gradient's: its dtype and device too); a saved argmax. Then
// check_cpu: these kernels take CPU tensors only. Last, the values in the box rows
// (check_rois, from first_invalid, which module.cpp also gives the validation layer).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "bounds.h"
#include "torch_api.h"

namespace roiops {

// Columns of a bezier box row: the batch index, then eight control points (x, y).
constexpr int64_t kBezierWidth = 17;

// A real as Python's f"{v:g}" writes it.
inline std::string format_g(double v) {
  if (std::isnan(v)) return "nan";  // C's %g writes a negative NaN as -nan
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  return buffer;
}

// Floating point (ValueError), of a dtype the kernels have (NotImplementedError: the
// float8 types).
inline void check_kernel_dtype(const Tensor& t, const char* name) {
  const ScalarType s = t.scalar_type();
  ROIOPS_CHECK(is_floating(s), "roiops: ", name, " must be floating point, got ", dtype_name(s));
  ROIOPS_CHECK(kernel_dtype(s), "roiops: ", name, " dtype ", dtype_name(s),
               " is not implemented; expected float16, bfloat16, float32 or float64");
}

// The map tensor: 4-D, of a kernel dtype.
inline void check_map_tensor(const Tensor& t, const char* name) {
  const bool grad = name[0] == 'g';
  ROIOPS_CHECK(t.dim() == 4, "roiops: ", name, " must be 4-D ",
                    grad ? "[K, C, pooled_height, pooled_width]" : "[N, C, H, W]", ", got ", t.dim(), "-D");
  check_kernel_dtype(t, name);
}

// rois: [K, 5] (or [K, 6], rotated), floating point, float64 for a float64 map (other
// floating dtypes are converted to float32: opmath_rois), on the map's device.
inline void check_rois_arg(const Tensor& rois, int64_t width, const Tensor& map, const char* map_name) {
  ROIOPS_CHECK(rois.dim() == 2 && rois.size(1) == width, "roiops: rois must be [K, ", width, "] (rows (",
                    width == 6             ? "batch_index, cx, cy, w, h, theta"
                    : width == kBezierWidth ? "batch_index, x0, y0, ..., x7, y7"
                                            : "batch_index, x1, y1, x2, y2",
               ")), got ",
               shape_name(rois));
  const ScalarType s = rois.scalar_type();
  ROIOPS_CHECK(is_floating(s), "roiops: rois must be floating point, got ", dtype_name(s));
  ROIOPS_CHECK(s == kDouble || map.scalar_type() != kDouble, "roiops: rois must be float64 for a float64 ",
                    map_name, ", got ", dtype_name(s));
  ROIOPS_CHECK(same_device(rois, map), "roiops: rois is on ", device_name(rois), " but ", map_name, " is on ",
               device_name(map));
}

// A backward's batch size and channels.
inline void check_batch_channels(int64_t N, int64_t C) {
  ROIOPS_CHECK(N >= 0 && C >= 0, "roiops: batch size and channels must be non-negative, got batch_size=", N,
                    ", channels=", C);
}

inline void check_map_size(int64_t height, int64_t width) {
  ROIOPS_CHECK(height > 0 && width > 0, "roiops: input height and width must be positive, got height=", height,
                    ", width=", width);
  ROIOPS_CHECK(height <= kMaxMapSide && width <= kMaxMapSide,
                    "roiops: input height and width must be at most 2^24, got ", height, " x ", width);
}

// source: where the pooled size comes from when no argument gives it (roi_pool's backward).
inline void check_pooled(int64_t ph, int64_t pw, const char* source = "") {
  ROIOPS_CHECK(ph > 0 && pw > 0 && ph <= kMaxPooled && pw <= kMaxPooled, "roiops: output size must be in [1, ",
                    kMaxPooled, "], got pooled_height=", ph, ", pooled_width=", pw, source);
}

inline void check_scale(double spatial_scale) {
  ROIOPS_CHECK(spatial_scale >= kMinScale && spatial_scale <= kMaxScale,
                    "roiops: spatial_scale must be in [2^-64, 2^64], got ", format_g(spatial_scale));
}

inline void check_sampling_ratio(int64_t sampling_ratio) {
  ROIOPS_CHECK(sampling_ratio <= kMaxSamplingRatio, "roiops: sampling_ratio must be at most ", kMaxSamplingRatio,
                    " (<= 0 for adaptive), got ", sampling_ratio);
}

// Rotation-invariant RoIAlign: orientations per channel field, dividing the channels.
inline void check_orientations(int64_t orientations, int64_t channels) {
  ROIOPS_CHECK(orientations >= 1 && orientations <= kMaxOrientations, "roiops: num_orientations must be in [1, ",
               kMaxOrientations, "], got ", orientations);
  ROIOPS_CHECK(channels % orientations == 0, "roiops: channels (", channels,
               ") must be a multiple of num_orientations (", orientations, ")");
}

// grad of the forward output's shape.
inline void check_grad_shape(const Tensor& grad, int64_t K, int64_t C_out, int64_t ph, int64_t pw) {
  ROIOPS_CHECK(grad.dim() == 4 && grad.size(0) == K && grad.size(1) == C_out && grad.size(2) == ph &&
                        grad.size(3) == pw,
                    "roiops: grad must be [K, C_out, pooled_height, pooled_width] = [", K, ", ", C_out, ", ", ph, ", ",
                    pw, "] (the forward output's shape), got ", shape_name(grad));
}

// A saved argmax: grad's shape, int32, on grad's device.
inline void check_argmax(const Tensor& argmax, const Tensor& grad) {
  ROIOPS_CHECK(same_shape(argmax, grad), "roiops: argmax must have the shape of grad ", shape_name(grad), ", got ",
               shape_name(argmax));
  ROIOPS_CHECK(argmax.scalar_type() == kInt, "roiops: argmax must be int32, got ",
                    dtype_name(argmax.scalar_type()));
  ROIOPS_CHECK(same_device(argmax, grad), "roiops: argmax is on ", device_name(argmax), " but grad is on ",
               device_name(grad));
}

// The checks of a forward (and of a box gradient, before its grad) up to spatial_scale.
inline void check_forward_args(const Tensor& input, const Tensor& rois, int64_t rois_width,
                               double spatial_scale, int64_t ph, int64_t pw) {
  check_map_tensor(input, "input");
  check_rois_arg(rois, rois_width, input, "input");
  check_map_size(input.size(2), input.size(3));
  check_pooled(ph, pw);
  check_scale(spatial_scale);
}

// The checks of a backward with pooled-size and spatial_scale arguments, up to spatial_scale.
inline void check_backward_args(const Tensor& grad, const Tensor& rois, int64_t rois_width, int64_t N,
                                int64_t C, int64_t H, int64_t W, double spatial_scale, int64_t ph, int64_t pw) {
  check_map_tensor(grad, "grad");
  check_rois_arg(rois, rois_width, grad, "grad");
  check_batch_channels(N, C);
  check_map_size(H, W);
  check_pooled(ph, pw);
  check_scale(spatial_scale);
}

// A box gradient's grad, after its shape: the input's dtype, on its device.
inline void check_grad_like(const Tensor& grad, const Tensor& input) {
  const ScalarType g = grad.scalar_type(), s = input.scalar_type();
  if (g != s) {
    ROIOPS_CHECK(is_floating(g), "roiops: grad must be floating point, got ", dtype_name(g));
    ROIOPS_CHECK(false, "roiops: grad must have the input's dtype ", dtype_name(s), ", got ", dtype_name(g));
  }
  ROIOPS_CHECK(same_device(grad, input), "roiops: grad is on ", device_name(grad), " but input is on ",
               device_name(input));
}

// These kernels' own condition, after the shared checks: the map tensor (and with it every
// other tensor) on the CPU.
inline void check_cpu(const Tensor& map) {
  ROIOPS_CHECK(map.is_cpu(), "roiops: CPU kernel called with non-CPU tensors");
}

// The first invalid value of rois [K, 5], [K, 6] (rotated) or [K, 17] (bezier), any
// strides, as {row, column}, or {-1, -1} if there is none: a batch index (column 0) that
// is not an integer in [0, N), a coordinate (columns 1 to 4, 1 to 16 for bezier rows)
// that is not finite or lies beyond
// kMaxCoordinate cells as the kernels compute it, x * scale in T (an infinite or NaN
// product fails the comparison), or a rotated box's angle (column 5) that is not finite.
// check_coords false: batch indices only (RoIPool's backward reads only them; its argmax
// values are checked instead).
template <typename T>
std::pair<int64_t, int64_t> first_invalid_typed(const Tensor& rois, int64_t batch_size, double spatial_scale,
                                                bool check_coords) {
  const T* r = rois.const_data_ptr<T>();
  const int64_t sk = rois.stride(0), sc = rois.stride(1), cols = check_coords ? rois.size(1) : 1;
  const T scale = static_cast<T>(spatial_scale), limit = static_cast<T>(kMaxCoordinate);
  const int64_t coords_end = rois.size(1) == kBezierWidth ? kBezierWidth : 5;
  for (int64_t k = 0; k < rois.size(0); ++k, r += sk) {
    const T b = r[0];
    if (!(std::isfinite(b) && b == std::floor(b) && b >= 0 && b < batch_size)) return {k, 0};
    for (int64_t i = 1; i < cols; ++i) {
      const T v = r[i * sc];
      if (i < coords_end ? !(std::abs(v * scale) <= limit) : !std::isfinite(v)) return {k, i};
    }
  }
  return {-1, -1};
}

inline std::pair<int64_t, int64_t> first_invalid(const Tensor& rois, int64_t batch_size, double spatial_scale,
                                                 bool check_coords = true) {
  ROIOPS_CHECK(rois.dim() == 2 && (rois.size(1) == 5 || rois.size(1) == 6 || rois.size(1) == kBezierWidth) &&
                   rois.is_cpu(),
               "roiops: rois must be a CPU tensor [K, 5], [K, 6] or [K, 17], got ", shape_name(rois));
  std::pair<int64_t, int64_t> bad;
  ROIOPS_DISPATCH_FLOAT(rois.scalar_type(), [&] {
    bad = first_invalid_typed<scalar_t>(rois, batch_size, spatial_scale, check_coords);
  });
  return bad;
}

// Checks every row of a rois tensor of the opmath type ([K, 5], or [K, 6] rotated).
inline void check_rois(const Tensor& rois, int64_t batch_size, double spatial_scale, bool check_coords = true) {
  const auto [k, column] = first_invalid(rois, batch_size, spatial_scale, check_coords);
  if (k < 0) return;
  const int64_t at = k * rois.stride(0) + column * rois.stride(1);
  const double v = rois.scalar_type() == kDouble ? rois.const_data_ptr<double>()[at] : rois.const_data_ptr<float>()[at];
  ROIOPS_CHECK(column != 0, "roiops: rois row ", k, " has batch index ", v, ", which is not an integer in [0, ",
                    batch_size, ")");
  ROIOPS_CHECK(column == 5 && rois.size(1) == 6, "roiops: rois row ", k, " has coordinate ", v,
                    " (not finite, or beyond 2^24 feature-map cells after spatial_scale)");
  ROIOPS_CHECK(false, "roiops: rois row ", k, " has angle ", v, ", which is not finite");
}

}  // namespace roiops
