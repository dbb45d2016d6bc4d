// Bezier alignment on the CPU (ABCNet's BezierAlign, mmcv's bezier_align): bin (i, j) of
// box k averages an axis-aligned grid of bilinear samples around its own centre, which
// lies between the box's two cubic Bezier curves at u = j / pw, a fraction v = i / ph of
// the way from the top curve to the bottom one (docs/semantics.md, "bezier_align").
//
// A box's plan holds, per bin, the taps of its own sample rows and columns (two AxisPlans
// of ph * pw bins, each bin from its own start, as deformable RoI pooling's), so that the
// RoIAlign kernels and drivers of align_kernels.h run it as they run a RoIAlign box. The
// bin centres follow mmcv's CPU arithmetic (Bernstein terms partly in double), computed
// once per bin. The input gradient adds (grad * w) / count (RoIAlign's and mmcv's order)
// and boxes in increasing k into the slices of grad_input that its tasks own:
// deterministic, no atomics, any thread count. The control points get no gradient.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "align_kernels.h"
#include "args.h"
#include "checks.h"
#include "geometry.h"
#include "memory.h"
#include "parallel.h"
#include "plans.h"

namespace roiops {
namespace {

// A cubic Bezier curve's coordinate at u in mmcv's arithmetic: (1 - u)^3 p0, 3u(1 - u)^2 p1
// and 3u^2(1 - u) p2 in double, u^3 p3 in T, summed in double and rounded once to T.
template <typename T>
T bezier_point(T p0, T p1, T p2, T p3, T u) {
  const double ud = static_cast<double>(u), om = 1.0 - ud;
  const double a = om * om * om * static_cast<double>(p0);
  const double b = 3.0 * ud * om * om * static_cast<double>(p1);
  const double c = 3.0 * ud * ud * om * static_cast<double>(p2);
  const T d = u * u * u * p3;
  return static_cast<T>(a + b + c + static_cast<double>(d));
}

// One box's sizes: its control points scaled (top curve P0..P3 at p[0..7], the bottom
// curve stored right to left at p[8..15]), bins as wide as the larger x span of the
// curves' end points over pw and as high as the larger y span over ph (1 cell at least
// when not aligned), and the sampling grid.
template <typename T>
struct BezierBox : GridRule<T> {
  int64_t batch;
  T p[16];

  BezierBox(const T* roi, T scale, int64_t ph, int64_t pw, int64_t sampling_ratio, bool aligned) {
    batch = static_cast<int64_t>(roi[0]);
    for (int n = 0; n < 16; ++n) p[n] = roi[1 + n] * scale;
    T roi_w = std::max(std::abs(p[0] - p[6]), std::abs(p[14] - p[8]));
    T roi_h = std::max(std::abs(p[1] - p[7]), std::abs(p[15] - p[9]));
    this->set(roi_h, roi_w, ph, pw, sampling_ratio, aligned);
  }

  // Axis a's (0: x, 1: y) coordinate of the top curve (bottom: the bottom one) at u.
  T curve(bool bottom, int a, T u) const {
    const T* q = p + a;
    return bottom ? bezier_point(q[14], q[12], q[10], q[8], u) : bezier_point(q[0], q[2], q[4], q[6], u);
  }

  // Samples along one axis a bin has at most inside [-1, size]: a fixed grid, or an
  // adaptive one spaced at least half a cell apart.
  static int64_t inside_bound(int64_t grid, int64_t size) { return std::max<int64_t>(std::min(grid, 2 * size + 6), 0); }
};

// The plan of one box: each bin sampled from its own start, its centre minus half a bin.
template <typename T>
struct BezierPlan : PerBinPlan<T> {
  using Base = PerBinPlan<T>;
  using Base::batch, Base::pw, Base::grid_h, Base::grid_w, Base::count, Base::ys, Base::xs;
  // The curves' points per column j: top x, top y, bottom x, bottom y at 4 * j.
  ArenaVector<T> points;

  explicit BezierPlan(Arena* arena = nullptr) : Base(arena), points(ArenaAllocator<T>(arena)) {}

  void build(const T* roi, T scale, int64_t ph, int64_t pw_, int64_t sampling_ratio, bool aligned, int64_t height,
             int64_t width) {
    const BezierBox<T> box(roi, scale, ph, pw_, sampling_ratio, aligned);
    batch = box.batch, pw = pw_;
    grid_h = box.grid_h, grid_w = box.grid_w;
    count = box.count;
    points.resize(static_cast<size_t>(4 * pw));
    for (int64_t j = 0; j < pw; ++j) {
      const T u = static_cast<T>(j) / static_cast<T>(pw);
      for (int n = 0; n < 4; ++n) points[4 * j + n] = box.curve(n >= 2, n % 2, u);
    }
    const double o = aligned ? 0.5 : 0.0;
    // The bin's centre along axis a: (bottom * v in T) + top * (1 - v) - o in double, rounded once.
    const auto centre = [&](int64_t e, int a) {
      const T v = static_cast<T>(e / pw) / static_cast<T>(ph);
      const T* q = points.data() + 4 * (e % pw) + a;
      const double below = static_cast<double>(q[2] * v), above = static_cast<double>(q[0]);
      return static_cast<T>(below + above * (1.0 - static_cast<double>(v)) - o);
    };
    const T bin_h = box.bin_h, bin_w = box.bin_w, half_h = T(0.5) * bin_h, half_w = T(0.5) * bin_w;
    ys.build_at(grid_h, ph * pw, height, true,
                [&](int64_t e, int64_t s) { return sample_position(centre(e, 1) - half_h, bin_h, 0, s, grid_h); });
    xs.build_at(grid_w, ph * pw, width, true,
                [&](int64_t e, int64_t s) { return sample_position(centre(e, 0) - half_w, bin_w, 0, s, grid_w); });
  }
};

template <typename T>
using Plans = BoxPlans<BezierPlan<T>>;

// A call's boxes in chunks whose plans hold about kPlanEntries entries together at most
// (at least one box each): plan memory stays bounded for any K.
constexpr int64_t kPlanEntries = int64_t(1) << 21;

struct Chunks {
  const Tensor& rois;  // opmath type, contiguous
  double spatial_scale;
  int64_t ph, pw, sampling_ratio, H, W;
  bool aligned;

  // The end of the chunk that starts at box k0.
  int64_t operator()(int64_t k0) const {
    const int64_t K = rois.size(0), bins = ph * pw;
    int64_t k = k0, used = 0;
    ROIOPS_DISPATCH_FLOAT(rois.scalar_type(), [&] {
      using T = scalar_t;
      const T* roi = rois.const_data_ptr<T>();
      const T scale = static_cast<T>(spatial_scale);
      for (; k < K; ++k) {
        const BezierBox<T> b(roi + kBezierWidth * k, scale, ph, pw, sampling_ratio, aligned);
        const int64_t n =
            bins * (1 + BezierBox<T>::inside_bound(b.grid_h, H) + BezierBox<T>::inside_bound(b.grid_w, W));
        if (k > k0 && used + n > kPlanEntries) break;
        used += n;
      }
    });
    return k;
  }
};

// The plans of rois' boxes [k0, k1).
template <typename T>
Plans<T> build_plans(const Chunks& c, int64_t k0, int64_t k1) {
  const T* roi = c.rois.const_data_ptr<T>() + kBezierWidth * k0;
  const T scale = static_cast<T>(c.spatial_scale);
  return Plans<T>(k1 - k0, [&](BezierPlan<T>& p, int64_t k) {
    p.build(roi + kBezierWidth * k, scale, c.ph, c.pw, c.sampling_ratio, c.aligned, c.H, c.W);
  });
}

}  // namespace

ROIOPS_ENTRY
Tensor bezier_align_forward(const Tensor& input_, const Tensor& rois_, double spatial_scale, int64_t ph, int64_t pw,
                            int64_t sampling_ratio, bool aligned) {
  check_forward_args(input_, rois_, kBezierWidth, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  const ForwardArgs a(input_, rois_, spatial_scale);
  const Tensor &input = a.input, &rois = a.rois;
  const int64_t K = rois.size(0);
  Tensor out = empty_output({K, input.size(1), ph, pw}, a.out_options);
  const Chunks next{rois, spatial_scale, ph, pw, sampling_ratio, input.size(2), input.size(3), aligned};
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    for (int64_t k0 = 0; k0 < K;) {
      const int64_t k1 = next(k0);
      using T = opmath_type<scalar_t>;
      per_bin_forward<T, scalar_t>(build_plans<T>(next, k0, k1), input, k0, ph, pw, out);
      k0 = k1;
    }
  });
  return out;
}

ROIOPS_ENTRY
Tensor bezier_align_backward(const Tensor& grad_, const Tensor& rois_, double spatial_scale, int64_t ph, int64_t pw,
                             int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio, bool aligned,
                             bool channels_last) {
  check_backward_args(grad_, rois_, kBezierWidth, N, C, H, W, spatial_scale, ph, pw);
  check_sampling_ratio(sampling_ratio);
  check_grad_shape(grad_, rois_.size(0), C, ph, pw);
  const BackwardArgs a(grad_, rois_, N, spatial_scale, channels_last);
  const Tensor &grad = a.grad, &rois = a.rois;
  const int64_t K = rois.size(0);
  Tensor gi = empty_output({N, C, H, W}, a.grad_options);
  const Chunks next{rois, spatial_scale, ph, pw, sampling_ratio, H, W, aligned};
  ROIOPS_DISPATCH(grad.scalar_type(), [&] {
    using T = opmath_type<scalar_t>;
    backward_chunks<scalar_t>(gi, K, next, [&](auto out_type, Tensor& out, int64_t k0, int64_t k1, bool fresh) {
      using out_t = decltype(out_type);
      const Plans<T> plans = build_plans<T>(next, k0, k1);
      Scratch<T> q;
      backward_bands<T, scalar_t, out_t>(
          plans, narrow_view(grad, 0, k0, k1 - k0), nullptr, out, fresh, ph, pw,
          [&](auto kN, const BezierPlan<T>& p, const auto* g, const int32_t*, int64_t gH, int64_t gW, int64_t nc,
              int64_t i0, int64_t i1, T* acc, int64_t y0, int64_t y1, int64_t bH, int64_t aW) {
            avg_backward_cl<kN>(p, g, gH, gW, nc, i0, i1, pw, acc, y0, y1, bH, aW, q.get(nc));
          });
    });
  });
  return gi;
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("bezier_align", TORCH_BOX(&roiops::bezier_align_forward));
  m.impl("_bezier_align_backward", TORCH_BOX(&roiops::bezier_align_backward));
}
