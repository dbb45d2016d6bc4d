// Rotation-invariant RoIAlign on the CPU (docs/semantics.md, "riroi_align_rotated").
//
// The blend weights of a box are constant over its bins, so the op is rotated RoIAlign
// (aligned=False) of every channel, A, followed by a blend pass over the output:
// out[k, c' O + o] = r * A[k, c' O + i0] + l * A[k, c' O + i1]. Its gradient is the
// adjoint blend of grad (in the opmath type) followed by rotated RoIAlign's backward. Both
// passes run one box per task over dense NCHW or channels_last blocks of [C, ph, pw].

#include <cfloat>
#include <cmath>
#include <vector>

#include "args.h"
#include "checks.h"
#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "rotated.h"
#include "simd.h"

namespace roiops {
namespace {

// A box's orientation bin and blend weights (semantics.md "riroi_align_rotated").
template <typename T>
struct Orientation {
  int64_t ind;
  T r, l;
};

// From the sampling angles of rows (batch, cx, cy, w, h, theta) of rois (opmath, checked):
// the orientation angle is theta, or -theta when clockwise; f = t * O / (2 pi) in double,
// made finite; ind = floor(f) mod O, l = f - floor(f), r = 1 - l, rounded once to T.
template <typename T>
std::vector<Orientation<T>> orientations(const Tensor& rois, int64_t O, bool clockwise) {
  const int64_t K = rois.size(0);
  const T* r = rois.const_data_ptr<T>();
  std::vector<Orientation<T>> out(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) {
    double t = static_cast<double>(r[6 * k + 5]);
    if (clockwise) t = -t;
    double f = (t * static_cast<double>(O)) / (2 * M_PI);
    f = std::isnan(f) ? 0.0 : std::fmin(std::fmax(f, -DBL_MAX), DBL_MAX);
    const double whole = std::floor(f), frac = f - whole;
    double ind = std::fmod(whole, static_cast<double>(O));
    if (ind < 0) ind += static_cast<double>(O);
    out[static_cast<size_t>(k)] = {static_cast<int64_t>(ind), static_cast<T>(1.0 - frac), static_cast<T>(frac)};
  }
  return out;
}

// One box's [C, P] block (NCHW: channel-major; channels_last: bin-major): dst channel c =
// r * src channel j0[c] + l * src channel j1[c], in T. Inner loops run along contiguous
// bins (NCHW) or channels (channels_last, a gather of the two source channels).
template <typename T, typename S, typename D>
ROIOPS_SIMD void blend_box(const S* __restrict__ src, D* __restrict__ dst, int64_t C, int64_t P, bool channels_last,
                           T r, T l, const int64_t* __restrict__ j0, const int64_t* __restrict__ j1) {
  if (channels_last) {
    for (int64_t p = 0; p < P; ++p) {
      const S* sp = src + p * C;
      D* dp = dst + p * C;
      for (int64_t c = 0; c < C; ++c)
        dp[c] = static_cast<D>(r * static_cast<T>(sp[j0[c]]) + l * static_cast<T>(sp[j1[c]]));
    }
    return;
  }
  for (int64_t c = 0; c < C; ++c) {
    const S *s0 = src + j0[c] * P, *s1 = src + j1[c] * P;
    D* dc = dst + c * P;
    for (int64_t p = 0; p < P; ++p) dc[p] = static_cast<D>(r * static_cast<T>(s0[p]) + l * static_cast<T>(s1[p]));
  }
}

// dst[k, c' O + o] = r * src[k, c' O + i0] + l * src[k, c' O + i1] for K dense [C, P]
// blocks. Forward (adjoint false): i0 = (o - ind) mod O, i1 = i0 + 1; its adjoint:
// i0 = (o + ind) mod O, i1 = i0 - 1 (mod O), which sends each output's r and l parts back
// to the orientations it read.
template <typename T, typename S, typename D>
void blend(const S* src, D* dst, int64_t K, int64_t C, int64_t P, int64_t O, bool channels_last,
           const std::vector<Orientation<T>>& orient, bool adjoint) {
  parallel_tasks(K, [&](int64_t k) {
    const Orientation<T> b = orient[static_cast<size_t>(k)];
    // The two source channels of each output channel.
    std::vector<int64_t> j0(static_cast<size_t>(C)), j1(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const int64_t o = c % O, i0 = adjoint ? (o + b.ind) % O : (o - b.ind + O) % O;
      const int64_t i1 = adjoint ? (i0 + O - 1) % O : (i0 + 1) % O;
      j0[c] = c - o + i0;
      j1[c] = c - o + i1;
    }
    blend_box(src + k * C * P, dst + k * C * P, C, P, channels_last, b.r, b.l, j0.data(), j1.data());
  });
}

}  // namespace

ROIOPS_ENTRY
Tensor riroi_align_rotated_forward(const Tensor& input, const Tensor& rois_, double spatial_scale, int64_t ph,
                                   int64_t pw, int64_t sampling_ratio, int64_t num_orientations, bool clockwise) {
  check_forward_args(input, rois_, 6, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  check_orientations(num_orientations, input.size(1));
  const bool channels_last = is_channels_last(input);
  const int64_t K = rois_.size(0), C = input.size(1);
  // Before A: a kept block freed last (the caller's previous output) goes to the output.
  Tensor out = empty_output({K, C, ph, pw}, options_of(input, channels_last));
  // Checks the rows and the remaining arguments; A in the input's dtype and layout.
  const Tensor a = roi_align_rotated_forward(input, rois_, spatial_scale, ph, pw, sampling_ratio, false);
  const Tensor rois = opmath_rois(rois_, input.scalar_type());
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    using T = opmath_type<scalar_t>;
    blend(a.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), K, C, ph * pw, num_orientations,
          channels_last, orientations<T>(rois, num_orientations, clockwise), false);
  });
  return out;
}

ROIOPS_ENTRY
Tensor riroi_align_rotated_backward(const Tensor& grad_, const Tensor& rois_, double spatial_scale, int64_t ph,
                                    int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio,
                                    int64_t num_orientations, bool clockwise, bool channels_last) {
  check_backward_args(grad_, rois_, 6, N, C, H, W, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  check_orientations(num_orientations, C);
  check_grad_shape(grad_, rois_.size(0), C, ph, pw);
  const BackwardArgs a(grad_, rois_, N, spatial_scale, channels_last);  // grad dense in the gradient's layout
  const int64_t K = a.grad.size(0);
  Tensor grad_a;
  ROIOPS_DISPATCH(grad_.scalar_type(), [&] {
    using T = opmath_type<scalar_t>;
    // The gradient of A in T: rotated RoIAlign's backward sums in T and rounds once.
    grad_a = empty_output({K, C, ph, pw}, Options{scalar_type_of<T>, channels_last});
    blend(a.grad.const_data_ptr<scalar_t>(), grad_a.mutable_data_ptr<T>(), K, C, ph * pw, num_orientations,
          channels_last, orientations<T>(a.rois, num_orientations, clockwise), true);
  });
  const Tensor gi = roi_align_rotated_backward(grad_a, a.rois, spatial_scale, ph, pw, N, C, H, W, sampling_ratio,
                                               false, channels_last);
  if (gi.scalar_type() == grad_.scalar_type()) return gi;
  Tensor out = empty_output({N, C, H, W}, a.grad_options);
  copy_into(out, gi);
  return out;
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("riroi_align_rotated", TORCH_BOX(&roiops::riroi_align_rotated_forward));
  m.impl("_riroi_align_rotated_backward", TORCH_BOX(&roiops::riroi_align_rotated_backward));
}
