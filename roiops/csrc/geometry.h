// Geometry primitives of docs/semantics.md shared by the CPU kernels: the limits on
// coordinates and sizes and the argument checks built on them, the memory-format rule,
// one axis's bilinear tap with its border rule, sample positions, C's rounding of box
// corners, the first-maximum rule, Precise RoI Pooling's bin windows and hat integrals.
// Each is a rule about one sample, bin or argument, independent of how a kernel plans its
// loops, so an op that does not separate into row and column plans (rotated boxes,
// integrated pooling) reuses them as they are; the separable plans live in plans.h.
// Expressions keep torchvision's operations and order, so float32 results agree with it
// bit for bit where the formulas are the same.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "torch_api.h"

namespace roiops {

// An entry point, registered as a kernel: never inlined into the dispatcher's wrapper, so
// that profilers and benchmarks/callgrind.py find each one by name.
#define ROIOPS_ENTRY __attribute__((noinline))

// float32 holds every integer up to 2^24 and none finer beyond: the bound of coordinates,
// map sides and of positions that a kernel counts in float32.
constexpr int64_t kFloatExact = int64_t(1) << 24;

// Limits of docs/semantics.md ("Limits"); the Python layer checks the same ones first,
// with friendlier messages, but a direct op call reaches the kernels unchecked.
// Coordinates beyond this many feature-map cells are refused: float32 cannot place a
// sample there, and sampling loops sized from them would not end.
constexpr double kMaxCoordinate = static_cast<double>(kFloatExact);
// Columns of a bezier box row: the batch index, then eight control points (x, y).
constexpr int64_t kBezierWidth = 17;
// Maps larger than the coordinate range along an axis could not be addressed by a box.
constexpr int64_t kMaxMapSide = kFloatExact;
// Bins per output side: bin indices stay exact in float32, and one box's output plane
// holds at most 2^32 bins.
constexpr int64_t kMaxPooled = int64_t(1) << 16;
// A fixed sampling_ratio costs ratio^2 samples per bin however small the box: bounded so
// that one bin is at most 2^20 samples (practical values are 0 to 8).
constexpr int64_t kMaxSamplingRatio = 1024;
// Orientations per channel field of rotation-invariant RoIAlign (ReDet uses 8): angle * O
// stays exact in double for float angles.
constexpr int64_t kMaxOrientations = int64_t(1) << 16;
// "max" stores the winner of a bin as the int32 iy * grid_w + ix: a bin's grid must have
// at most this many samples (an adaptive grid of a huge box with a small output may not).
constexpr int64_t kMaxArgmaxGrid = INT32_MAX;
// spatial_scale must be a normal float32 value with room for it: the kernels compute
// x * spatial_scale in float32, where 1e39 would be inf and 1e-46 zero.
constexpr double kMinScale = 0x1p-64, kMaxScale = 0x1p64;

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

// ---- Argument checks ------------------------------------------------------------------
//
// What a direct op call must refuse, read from shapes, dtypes, devices and scalars: the
// checks of roiops/_kernel_checks.py (which the Triton and reference kernels run), in the
// same order and with the same exception types and messages, so that every backend refuses
// a bad call alike (tests/test_contract.py compares them). The map tensor is `input`, or
// `grad` in a backward. The order: the map tensor; rois; batch size and channels (a
// backward's), the map's height and width; the pooled size, spatial_scale, sampling_ratio;
// position-sensitive channels (ps_out_channels); grad's shape (a box gradient's: its dtype
// and device too); a saved argmax. Then check_cpu: these kernels take CPU tensors only.

// A real as Python's f"{v:g}" writes it.
inline std::string format_g(double v) {
  if (std::isnan(v)) return "nan";  // C's %g writes a negative NaN as -nan
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  return buffer;
}

// The map tensor: 4-D, floating point (ValueError), of a dtype the kernels have
// (NotImplementedError: the float8 types).
inline void check_map_tensor(const Tensor& t, const char* name) {
  const bool grad = name[0] == 'g';
  ROIOPS_CHECK(t.dim() == 4, "roiops: ", name, " must be 4-D ",
                    grad ? "[K, C, pooled_height, pooled_width]" : "[N, C, H, W]", ", got ", t.dim(), "-D");
  const ScalarType s = t.scalar_type();
  ROIOPS_CHECK(is_floating(s), "roiops: ", name, " must be floating point, got ", dtype_name(s));
  ROIOPS_CHECK(s == kHalf || s == kBFloat16 || s == kFloat || s == kDouble, "roiops: ",
                              name, " dtype ", dtype_name(s),
                              " is not implemented; expected float16, bfloat16, float32 or float64");
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

// rois contiguous in the kernels' coordinate type: float64 for a float64 map, float32
// otherwise (the checks allow any floating dtype for a map that is not float64).
inline Tensor opmath_rois(const Tensor& rois, ScalarType map_type) {
  const ScalarType t = map_type == kDouble ? kDouble : kFloat;
  return in_format(rois.scalar_type() == t ? rois : to_dtype(rois, t));
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

// The kernels' layout rule: channels_last strides, unless they are also NCHW-contiguous
// (C == 1, or a 1 x 1 map), which counts as NCHW. Outputs take the input's format.
inline bool is_channels_last(const Tensor& t) {
  return is_channels_last_contiguous(t) && !t.is_contiguous();
}

// A 4-D tensor in the kernels' layout, with the strides that layout gives every dimension.
// A contiguous tensor may carry any stride on a dimension of size 1 (a transposed
// [N, C, 1, W] map is a contiguous [N, C, W, 1] with stride(3) = W), and in_format()
// leaves it so; kernels that choose a path by a stride would misread it. The same
// elements at the same addresses: only the size-1 dimensions' strides change.
inline Tensor in_layout(const Tensor& t, bool channels_last) {
  Tensor c = in_format(t, channels_last);
  const std::array<int64_t, 4> sizes{c.size(0), c.size(1), c.size(2), c.size(3)};
  const std::array<int64_t, 4> dense = dense_strides(sizes[1], sizes[2], sizes[3], channels_last);
  for (int64_t d = 0; d < 4; ++d)
    if (c.stride(d) != dense[d]) return as_strided(c, sizes, dense);
  return c;
}

// A forward's tensors once the op's argument checks have passed: the input in its layout,
// rois contiguous in the opmath type with their rows checked, and the options of an output
// in the input's dtype and layout.
struct ForwardArgs {
  bool channels_last;
  Tensor input, rois;
  Options out_options;

  ForwardArgs(const Tensor& input_, const Tensor& rois_, double spatial_scale)
      : channels_last((check_cpu(input_), is_channels_last(input_))),
        input(in_layout(input_, channels_last)),
        rois(opmath_rois(rois_, input_.scalar_type())),
        out_options(options_of(input_, channels_last)) {
    check_rois(rois, input.size(0), spatial_scale);
  }
};

// A backward's, likewise: grad in the gradient's layout, rois (check_coords as
// check_rois's), and the options of the [N, C, H, W] gradient in grad's dtype.
struct BackwardArgs {
  Tensor rois, grad;
  Options grad_options;

  BackwardArgs(const Tensor& grad_, const Tensor& rois_, int64_t N, double spatial_scale, bool channels_last,
               bool check_coords = true)
      : rois((check_cpu(grad_), opmath_rois(rois_, grad_.scalar_type()))),
        grad((check_rois(rois, N, spatial_scale, check_coords), in_layout(grad_, channels_last))),
        grad_options(options_of(grad_, channels_last)) {}
};

// A box-gradient kernel's checked arguments (grad [K, C, ph, pw] of the input's dtype,
// the input, rois [K, 5]; sampling_ratio when the op has one), grad and input in the
// input's layout, rois contiguous in the opmath type.
struct RoisBackwardArgs {
  Tensor grad, input, rois;

  RoisBackwardArgs(const Tensor& grad_, const Tensor& input_, const Tensor& rois_, double spatial_scale,
                   int64_t ph, int64_t pw, std::optional<int64_t> sampling_ratio = std::nullopt)
      : RoisBackwardArgs(grad_, checked(grad_, input_, rois_, spatial_scale, ph, pw, sampling_ratio)) {}

 private:
  RoisBackwardArgs(const Tensor& grad_, const ForwardArgs& f)
      : grad(in_layout(grad_, f.channels_last)), input(f.input), rois(f.rois) {}

  static ForwardArgs checked(const Tensor& grad, const Tensor& input, const Tensor& rois, double spatial_scale,
                             int64_t ph, int64_t pw, std::optional<int64_t> sampling_ratio) {
    check_forward_args(input, rois, 5, spatial_scale, ph, pw);
    if (sampling_ratio) check_sampling_ratio(*sampling_ratio);
    check_grad_shape(grad, rois.size(0), input.size(1), ph, pw);
    check_grad_like(grad, input);
    return ForwardArgs(input, rois, spatial_scale);
  }
};

// Interpolation taps of one sample along one axis: weight h at lo, l at hi.
template <typename T>
struct Tap {
  int64_t lo, hi;
  T l, h;
};

// semantics.md "roi_align avg" border rule along one axis; false for a point with value 0.
template <typename T>
inline bool make_tap(T v, int64_t size, Tap<T>& t) {
  if (!(v >= T(-1) && v <= static_cast<T>(size))) return false;  // NaN too
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

// Derivative of make_tap's l with respect to the point (h has the opposite): 1 where l
// follows it (inside the map, above 0, before the last cell), 0 where the border rule
// holds it constant or the point is outside (value 0). It jumps at every integer
// coordinate and at the borders (semantics.md "roi_align box gradient").
template <typename T>
inline T tap_slope(T v, int64_t size) {
  return v > 0 && v <= static_cast<T>(size) && static_cast<int64_t>(v) < size - 1 ? T(1) : T(0);
}

// Position of sample s of bin b along one axis (semantics.md "roi_align avg"): bins of
// `bin` cells from `start`, each with `grid` samples at the centres of equal parts.
template <typename T>
inline T sample_position(T start, T bin, int64_t b, int64_t s, int64_t grid) {
  return start + static_cast<T>(b) * bin + (static_cast<T>(s) + T(0.5)) * bin / static_cast<T>(grid);
}

// Derivative of sample_position with respect to `bin` (with respect to `start` it is 1).
template <typename T>
inline T sample_position_slope(int64_t b, int64_t s, int64_t grid) {
  return static_cast<T>(b) + (static_cast<T>(s) + T(0.5)) / static_cast<T>(grid);
}

// C's round(), halves away from zero: Caffe-convention RoIPool snaps box corners with it
// (semantics.md "roi_pool").
template <typename T>
inline int64_t round_half_away(T v) {
  return static_cast<int64_t>(std::round(v));
}

// Cells [lo, hi) of RoIPool bin p along one axis (semantics.md "roi_pool"), for bins of
// `bin` cells from `start`, clipped to [0, size]: floor(p * bin) and ceil((p + 1) * bin).
// Caffe (torchvision) adds the integer start after floor/ceil; mmdetection (continuous)
// adds the real start before.
template <typename T>
inline void pool_bin_edges(T start, T bin, int64_t p, int64_t size, bool continuous, int64_t& lo, int64_t& hi) {
  int64_t a, b;
  if (continuous) {
    a = static_cast<int64_t>(std::floor(static_cast<T>(p) * bin + start));
    b = static_cast<int64_t>(std::ceil(static_cast<T>(p + 1) * bin + start));
  } else {
    const int64_t s = static_cast<int64_t>(start);
    a = static_cast<int64_t>(std::floor(static_cast<T>(p) * bin)) + s;
    b = static_cast<int64_t>(std::ceil(static_cast<T>(p + 1) * bin)) + s;
  }
  lo = std::min(std::max<int64_t>(a, 0), size);
  hi = std::min(std::max<int64_t>(b, 0), size);
}

// The running maximum of docs/semantics.md (strictly greater wins, the first NaN wins) with
// positions: does candidate (v, a) come before (best, idx) in row-major order of the first
// maximum? idx < 0: nothing yet. Vectorised loops use take_first_max.
template <typename T>
inline bool first_max(T v, int64_t a, T best, int64_t idx) {
  if (idx < 0) return true;
  if (std::isnan(v)) return !std::isnan(best) || a < idx;
  return !std::isnan(best) && (v > best || (v == best && a < idx));
}

// first_max for a candidate v at `at` that comes after (best, idx) in row-major order, in
// a loop along channels or columns: branch-free, so that the loop vectorises.
template <typename T, typename I>
inline void take_first_max(T v, I at, T& best, I& idx) {
  const bool take = (v > best) | ((v != v) & (best == best));  // v wins: greater, or the first NaN
  best = take ? v : best;
  idx = take ? at : idx;
}

// ---- Precise RoI Pooling (docs/semantics.md "prroi_pool") ----------------------------

// Side of one bin: the box side max(p2 - p1, 0) in map cells, divided into `pooled` bins.
template <typename T>
inline T prroi_bin_size(T p1, T p2, T scale, int64_t pooled) {
  return std::max(p2 - p1, T(0)) * scale / static_cast<T>(pooled);
}

// Start of bin b of a side that starts at p1 (image coordinates); the bin ends at start + bin.
template <typename T>
inline T prroi_bin_start(T p1, T scale, T bin, int64_t b) {
  return p1 * scale + static_cast<T>(b) * bin;
}

// Cells [first, last] of a map side of `size` cells whose hat reaches into the window
// [start, start + len] (floor(start) to ceil(start + len), clipped); first > last: none.
template <typename T>
inline std::pair<int64_t, int64_t> prroi_window_cells(T start, T len, int64_t size) {
  const int64_t first = std::max<int64_t>(static_cast<int64_t>(std::floor(start)), 0);
  const int64_t last = std::min<int64_t>(static_cast<int64_t>(std::ceil(start + len)), size - 1);
  return {first, last};
}

// The hat max(0, 1 - |t|): the weight of a cell at distance t from its centre.
template <typename T>
inline T hat(T t) {
  return std::max(T(0), T(1) - std::abs(t));
}

// Integral of the hat over [a, a + len], len >= 0, as the sum over its two linear pieces
// of (length inside the piece) x (hat at the middle of that part). A window inside one
// piece gets its length as len itself, not as a difference of end points, so that the
// average len^-1 * integral of a short window keeps full precision.
template <typename T>
inline T hat_integral(T a, T len) {
  const T b = a + len;
  const T l0 = std::max(len - std::max(T(-1) - a, T(0)) - std::max(b, T(0)), T(0));       // inside [-1, 0]
  const T l1 = std::max(len - std::max(-a, T(0)) - std::max(b - T(1), T(0)), T(0));       // inside [0, 1]
  return l0 * (T(1) + std::max(a, T(-1)) + l0 * T(0.5)) + l1 * (T(1) - std::max(a, T(0)) - l1 * T(0.5));
}

}  // namespace roiops
