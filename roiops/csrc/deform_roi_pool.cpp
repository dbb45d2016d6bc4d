// Deformable RoI pooling on the CPU (mmcv's deform_roi_pool): RoIAlign average pooling
// (aligned, no minimum size) whose bin (i, j) of box k starts gamma * (box size) *
// offset[k, :, i, j] away from RoIAlign's.
//
// A box's plan holds, per bin, the taps of its own sample rows and columns (two AxisPlans
// of ph * pw bins, each bin from its shifted start), so that the RoIAlign kernels and
// drivers of align_kernels.h run it as they run a RoIAlign box: the forward sums in the
// same order and arithmetic, so that with no offset (or a zero one) it equals roi_align
// (aligned=True) bit for bit. The input gradient divides the gradient by the count first
// (q = grad / count, then q * w: mmcv's order) and adds boxes in increasing k into the
// slices of grad_input that its tasks own. The offset gradient, which reads the input (an
// op of its own, as roi_align's box gradient), sums per box and block of channels, then
// adds the blocks in order. Deterministic, no atomics, any thread count.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "align_kernels.h"
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

// Inside samples of a bin of `grid` samples from `start`, `bin` cells wide, at most:
// those in [-1, size], spaced |bin| / grid apart (the bound of a chunk's plans). None for
// a bin off the map or at a non-finite start.
template <typename T>
int64_t inside_bound(T start, T bin, int64_t grid, int64_t size) {
  const double a = static_cast<double>(start), b = a + static_cast<double>(bin);
  const double lo = std::max(std::min(a, b), -1.0), hi = std::min(std::max(a, b), static_cast<double>(size));
  if (grid <= 0 || !(hi >= lo - 1)) return 0;  // NaN and infinite starts too
  const double spacing = std::abs(static_cast<double>(bin)) / static_cast<double>(grid);
  if (!(spacing > 0)) return grid;
  return static_cast<int64_t>(std::min(static_cast<double>(grid), std::max(hi - lo, 0.0) / spacing + 2));
}

// The plan of one box: bin (i, j) is bin e = i * pw + j of ys and of xs, each from its
// own start (sh + gain_y * offset[k, 1, i, j] and sw + gain_x * offset[k, 0, i, j]).
// Positions within a bin are monotonic, so a bin's inside samples are found by bisection
// (AxisPlan::build_at): a bin moved far off the map, or to a non-finite start, costs
// nothing and has none.
template <typename T>
struct DeformPlan : PerBinPlan<T> {
  using Base = PerBinPlan<T>;
  using Base::batch, Base::pw, Base::grid_h, Base::grid_w, Base::count, Base::ys, Base::xs;
  T gain_x = 0, gain_y = 0;  // gamma * box width, gamma * box height
  // Slopes of l (tap_slope) of each inside sample, for the offset gradient only.
  ArenaVector<T> dly, dlx;

  explicit DeformPlan(Arena* arena = nullptr)
      : Base(arena), dly(ArenaAllocator<T>(arena)), dlx(ArenaAllocator<T>(arena)) {}

  // off: the box's offset [2, ph, pw] (contiguous), or nullptr.
  void build(const T* roi, const T* off, T scale, T gamma, int64_t ph, int64_t pw_, int64_t sampling_ratio,
             int64_t height, int64_t width, bool slopes) {
    const BoxGrid<T> box(roi, scale, ph, pw_, sampling_ratio, true);
    batch = box.batch, pw = pw_;
    grid_h = box.grid_h, grid_w = box.grid_w;
    count = box.count;
    gain_x = gamma * box.roi_w, gain_y = gamma * box.roi_h;
    const int64_t bins = ph * pw;
    const T sw = box.x_start, sh = box.y_start, bin_w = box.bin_w, bin_h = box.bin_h;
    const auto y_at = [&](int64_t e, int64_t s) {
      return sample_position(off ? sh + gain_y * off[bins + e] : sh, bin_h, e / pw, s, grid_h);
    };
    const auto x_at = [&](int64_t e, int64_t s) {
      return sample_position(off ? sw + gain_x * off[e] : sw, bin_w, e % pw, s, grid_w);
    };
    ys.build_at(grid_h, bins, height, bin_h >= 0, y_at);
    xs.build_at(grid_w, bins, width, bin_w >= 0, x_at);
    if (slopes) {
      slopes_of(ys, y_at, dly);
      slopes_of(xs, x_at, dlx);
    }
  }

 private:
  template <typename At>
  static void slopes_of(const AxisPlan<T>& a, const At& at, ArenaVector<T>& dl) {
    dl.resize(a.lo.size());
    for (size_t e = 0; e + 1 < a.begin.size(); ++e) {
      for (int64_t t = a.begin[e]; t < a.begin[e + 1]; ++t) {
        dl[t] = tap_slope(at(static_cast<int64_t>(e), a.first_in[e] + t - a.begin[e]), a.size);
      }
    }
  }
};

template <typename T>
using Plans = BoxPlans<DeformPlan<T>>;

// A call's boxes in chunks whose plans (and offset-gradient sums, `per_bin` values a bin)
// hold about kPlanEntries entries together at most, at least one box each: plan memory
// stays bounded for any K, however many samples the boxes' bins have.
constexpr int64_t kPlanEntries = int64_t(1) << 21;

struct Chunks {
  const Tensor& rois;    // opmath type, contiguous
  const Tensor& offset;  // likewise, or undefined
  double spatial_scale, gamma;
  int64_t ph, pw, sampling_ratio, H, W, per_bin;

  // The end of the chunk that starts at box k0.
  int64_t operator()(int64_t k0) const {
    const int64_t K = rois.size(0), bins = ph * pw;
    int64_t k = k0, used = 0;
    ROIOPS_DISPATCH_FLOAT(rois.scalar_type(), [&] {
      using T = scalar_t;
      const T* roi = rois.const_data_ptr<T>();
      const T* off = offset.defined() ? offset.const_data_ptr<T>() : nullptr;
      const T scale = static_cast<T>(spatial_scale), g = static_cast<T>(gamma);
      for (; k < K; ++k) {
        const BoxGrid<T> b(roi + 5 * k, scale, ph, pw, sampling_ratio, true);
        const T* o = off ? off + k * 2 * bins : nullptr;
        int64_t n = bins * (1 + per_bin);
        for (int64_t e = 0; e < bins; ++e) {
          const T sx = o ? b.x_start + (g * b.roi_w) * o[e] : b.x_start;
          const T sy = o ? b.y_start + (g * b.roi_h) * o[bins + e] : b.y_start;
          n += inside_bound(sy + static_cast<T>(e / pw) * b.bin_h, b.bin_h, b.grid_h, H) +
               inside_bound(sx + static_cast<T>(e % pw) * b.bin_w, b.bin_w, b.grid_w, W);
        }
        if (k > k0 && used + n > kPlanEntries) break;
        used += n;
      }
    });
    return k;
  }
};

// The plans of rois' boxes [k0, k1); offset: [K, 2, ph, pw] contiguous in T, or nullptr.
template <typename T>
Plans<T> build_plans(const Tensor& rois, const T* offset, int64_t k0, int64_t k1, double spatial_scale, double gamma,
                     int64_t ph, int64_t pw, int64_t sampling_ratio, int64_t H, int64_t W, bool slopes) {
  const T* roi = rois.const_data_ptr<T>() + 5 * k0;
  const T* off = offset ? offset + k0 * 2 * ph * pw : nullptr;
  const T scale = static_cast<T>(spatial_scale), g = static_cast<T>(gamma);
  return Plans<T>(k1 - k0, [&](DeformPlan<T>& p, int64_t k) {
    p.build(roi + 5 * k, off ? off + k * 2 * ph * pw : nullptr, scale, g, ph, pw, sampling_ratio, H, W, slopes);
  });
}

// ---- offset gradient, one box ---------------------------------------------------------

// One sample's terms dv/dx and dv/dy of n channels (taps p1..p4, channel stride cs) added
// to ax and ay. Contiguous float/double channels go by vectors (lane by lane the scalar
// operations, so the same bits): GCC left the plain loop scalar in the tile path.
template <typename S, typename T>
__attribute__((always_inline)) inline void offset_terms(T* __restrict__ ax, T* __restrict__ ay,
                                                        const S* __restrict__ p1, const S* __restrict__ p2,
                                                        const S* __restrict__ p3, const S* __restrict__ p4,
                                                        int64_t cs, int64_t n, T hy, T ly, T hx, T lx, T dx, T dy) {
  // The slopes are 0 or 1, so that dx * (hy * d + ly * e) = (dx * hy) * d + (dx * ly) * e
  // (the same bits, but for the sign of a zero), one multiplication fewer.
  const T x1 = dx * hy, x2 = dx * ly, y1 = dy * hx, y2 = dy * lx;
  int64_t c = 0;
  if constexpr (std::is_same_v<S, T>) {
    // 32-byte vectors (8 floats, 4 doubles): GCC builds 8-double ones from scalars through the stack.
    typedef T vec __attribute__((vector_size(32)));
    constexpr int64_t kL = 32 / sizeof(T);
    const auto load = [](const T* p) {
      vec v;
      __builtin_memcpy(&v, p, sizeof v);
      return v;
    };
    const auto store = [](T* p, vec v) { __builtin_memcpy(p, &v, sizeof v); };
    for (; cs == 1 && c + kL <= n; c += kL) {
      const vec v1 = load(p1 + c), v2 = load(p2 + c), v3 = load(p3 + c), v4 = load(p4 + c);
      store(ax + c, load(ax + c) + (x1 * (v2 - v1) + x2 * (v4 - v3)));
      store(ay + c, load(ay + c) + (y1 * (v3 - v1) + y2 * (v4 - v2)));
    }
  }
  for (; c < n; ++c) {
    const T v1 = static_cast<T>(p1[c * cs]), v2 = static_cast<T>(p2[c * cs]);
    const T v3 = static_cast<T>(p3[c * cs]), v4 = static_cast<T>(p4[c * cs]);
    ax[c] += x1 * (v2 - v1) + x2 * (v4 - v3);
    ay[c] += y1 * (v3 - v1) + y2 * (v4 - v2);
  }
}

// The offset gradient's sums of one box on n channels at img + c * sC (kContig: sC == 1,
// vectorised along them): for each bin e = i * pw + j, the sum over the channels of
// q_c * (sum over the bin's samples of dv/dx) into sums[e], of dv/dy into sums[ph * pw +
// e] (offset's layout), with q_c = grad / count (divided once, after the sum: the order
// of these sums is the kernels' own), g: bin (i, j), channel c at g + i * gH + j * gW +
// c * gC. dv/dx = dlx * (hy * (v2 - v1) + ly * (v4 - v3)), dv/dy = dly * (hx *
// (v3 - v1) + lx * (v4 - v2)), v1..v4 the taps (lo, lo), (lo, hi), (hi, lo), (hi, hi).
// Channels are summed in 8 lanes (c mod 8) added in a fixed order, so that the loop
// vectorises and the bits do not depend on the instruction set. acc: scratch for 2 * n.
template <int64_t kN, bool kContig, typename S, typename G, typename T>
ROIOPS_SIMD void offset_sums(const DeformPlan<T>& p, const S* img, int64_t sC, int64_t sH, int64_t sW, int64_t n_,
                             const G* g, int64_t gC, int64_t gH, int64_t gW, int64_t ph, int64_t pw, T* acc_,
                             T* sums) {
  const int64_t n = kN ? kN : n_, cs = kContig ? 1 : sC, bins = ph * pw;
  T acc_k[kN ? 2 * kN : 1];
  T* __restrict__ ax = kN ? acc_k : acc_;
  T* __restrict__ ay = ax + n;
  for (int64_t i = 0; i < ph; ++i) {
    for (int64_t j = 0; j < pw; ++j) {
      const int64_t e = i * pw + j;
      sums[e] = sums[bins + e] = T(0);
      if (!p.has_samples(e)) continue;
      std::fill(ax, ax + 2 * n, T(0));
      const auto [a0, a1] = p.rows(i, j);
      const auto [b0, b1] = p.cols(i, j);
      for (int64_t a = a0; a < a1; ++a) {
        const T hy = p.ys.h[a], ly = p.ys.l[a], dy = p.dly[a];
        const S* rlo = img + p.ys.lo[a] * sH;
        const S* rhi = img + p.ys.hi[a] * sH;
        for (int64_t b = b0; b < b1; ++b) {
          const T hx = p.xs.h[b], lx = p.xs.l[b], dx = p.dlx[b];
          const S* __restrict__ p1 = rlo + p.xs.lo[b] * sW;
          const S* __restrict__ p2 = rlo + p.xs.hi[b] * sW;
          const S* __restrict__ p3 = rhi + p.xs.lo[b] * sW;
          const S* __restrict__ p4 = rhi + p.xs.hi[b] * sW;
          offset_terms(ax, ay, p1, p2, p3, p4, cs, n, hy, ly, hx, lx, dx, dy);
        }
      }
      const G* __restrict__ gb = g + i * gH + j * gW;
      T sx[8] = {}, sy[8] = {};
      int64_t c = 0;
      for (; c + 8 <= n; c += 8) {
        for (int64_t l = 0; l < 8; ++l) {
          const T gv = static_cast<T>(gb[(c + l) * gC]);
          sx[l] += gv * ax[c + l];
          sy[l] += gv * ay[c + l];
        }
      }
      for (int64_t l = 0; c + l < n; ++l) {
        const T gv = static_cast<T>(gb[(c + l) * gC]);
        sx[l] += gv * ax[c + l];
        sy[l] += gv * ay[c + l];
      }
      sums[e] = (((sx[0] + sx[1]) + (sx[2] + sx[3])) + ((sx[4] + sx[5]) + (sx[6] + sx[7]))) / p.count;
      sums[bins + e] = (((sy[0] + sy[1]) + (sy[2] + sy[3])) + ((sy[4] + sy[5]) + (sy[6] + sy[7]))) / p.count;
    }
  }
}

// ---- drivers --------------------------------------------------------------------------

// The offset gradient of boxes [k0, k1) (plans built with slopes) into go ([K, 2, ph, pw]
// contiguous, T): per box and channel block (box_tasks) the sums of offset_sums, then
// added in block order and multiplied by the box's gain; 0 for a bin with no sample in
// the map.
template <typename scalar_t>
void offset_grad_impl(const Plans<opmath_type<scalar_t>>& plans, const Tensor& input, const Tensor& grad, int64_t k0,
                      int64_t ph, int64_t pw, opmath_type<scalar_t>* go) {
  using T = opmath_type<scalar_t>;
  const int64_t K = static_cast<int64_t>(plans.size()), C = input.size(1), bins = ph * pw;
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
  const scalar_t* grad_p = grad.const_data_ptr<scalar_t>() + k0 * gK;
  const int64_t cb = box_task_block(input), blocks = C > 0 ? (C + cb - 1) / cb : 0;
  std::vector<T> part(static_cast<size_t>(K * blocks * 2 * bins), T(0));
  Scratch<T> acc;
  box_tasks<T, scalar_t>(plans, input, [&](int64_t k, int64_t blk, int64_t c0, int64_t nc, const auto* img,
                                           int64_t vC, int64_t vH, int64_t vW, bool planes) {
    const DeformPlan<T>& p = plans[k];
    const scalar_t* g = grad_p + k * gK + c0 * gC;
    T* sums = part.data() + (k * blocks + blk) * 2 * bins;
    if (planes) {
      offset_sums<0, false>(p, img, vC, vH, vW, nc, g, gC, gH, gW, ph, pw, acc.get(2 * nc), sums);
    } else {
      with_width(nc, [&](auto kN) {
        offset_sums<kN, true>(p, img, vC, vH, vW, nc, g, gC, gH, gW, ph, pw, acc.get(2 * nc), sums);
      });
    }
  });
  for (int64_t k = 0; k < K; ++k) {
    const DeformPlan<T>& p = plans[k];
    T* out = go + (k0 + k) * 2 * bins;
    for (int64_t e = 0; e < bins; ++e) {
      T sx = 0, sy = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const T* s = part.data() + (k * blocks + blk) * 2 * bins;
        sx += s[e];
        sy += s[bins + e];
      }
      const bool inside = !p.empty() && p.has_samples(e);
      out[e] = inside ? p.gain_x * sx : T(0);
      out[bins + e] = inside ? p.gain_y * sy : T(0);
    }
  }
}

// ---- checks ---------------------------------------------------------------------------

// The offset's checks (roiops/_kernel_checks.py's of a per-bin tensor) that come with
// rois': on the map's device, floating point, float64 for a float64 map (other floating
// dtypes are converted to the opmath type, as rois).
void check_offset_type(const std::optional<Tensor>& offset, const Tensor& map, const char* map_name) {
  if (!offset) return;
  ROIOPS_CHECK(same_device(*offset, map), "roiops: offset is on ", device_name(*offset), " but ", map_name,
               " is on ", device_name(map));
  const ScalarType s = offset->scalar_type(), m = map.scalar_type();
  if (s == m || (s == kFloat && m != kDouble)) return;
  ROIOPS_CHECK(is_floating(s), "roiops: offset must be floating point, got ", dtype_name(s));
  ROIOPS_CHECK(m != kDouble, "roiops: offset must be float64 for a float64 ", map_name, ", got ", dtype_name(s));
}

// And after the scalars: [K, 2, pooled_height, pooled_width].
void check_offset_shape(const std::optional<Tensor>& offset, int64_t K, int64_t ph, int64_t pw) {
  if (!offset) return;
  const Tensor& t = *offset;
  ROIOPS_CHECK(t.dim() == 4 && t.size(0) == K && t.size(1) == 2 && t.size(2) == ph && t.size(3) == pw,
               "roiops: offset must be [K, 2, pooled_height, pooled_width] = [", K, ", 2, ", ph, ", ", pw,
               "], got ", shape_name(t));
}

// The checks of a forward or of the offset gradient (map: the input), or of the input
// gradient (map: grad, with the gradient's sizes), up to sampling_ratio and the offset's shape.
void check_args(const Tensor& map, const char* map_name, const Tensor& rois, const std::optional<Tensor>& offset,
                double spatial_scale, int64_t ph, int64_t pw, int64_t sampling_ratio,
                const int64_t* sizes = nullptr) {
  check_map_tensor(map, map_name);
  check_rois_arg(rois, 5, map, map_name);
  check_offset_type(offset, map, map_name);
  if (sizes) check_batch_channels(sizes[0], sizes[1]);
  check_map_size(sizes ? sizes[2] : map.size(2), sizes ? sizes[3] : map.size(3));
  check_pooled(ph, pw);
  check_scale(spatial_scale);
  check_sampling_ratio(sampling_ratio);
  check_offset_shape(offset, rois.size(0), ph, pw);
}

// offset contiguous in the opmath type (rois' rule), or an undefined tensor.
Tensor opmath_offset(const std::optional<Tensor>& offset, ScalarType map_type) {
  return offset ? opmath_rois(*offset, map_type) : Tensor();
}

template <typename T>
const T* offset_data(const Tensor& offset) {
  return offset.defined() ? offset.const_data_ptr<T>() : nullptr;
}

}  // namespace

ROIOPS_ENTRY
Tensor deform_roi_pool_forward(const Tensor& input_, const Tensor& rois_, const std::optional<Tensor>& offset_,
                               double spatial_scale, int64_t ph, int64_t pw, int64_t sampling_ratio, double gamma) {
  check_args(input_, "input", rois_, offset_, spatial_scale, ph, pw, sampling_ratio);
  const ForwardArgs a(input_, rois_, spatial_scale);
  const Tensor &input = a.input, &rois = a.rois;
  const Tensor offset = opmath_offset(offset_, input.scalar_type());
  const int64_t K = rois.size(0), H = input.size(2), W = input.size(3);
  Tensor out = empty_output({K, input.size(1), ph, pw}, a.out_options);
  const Chunks next{rois, offset, spatial_scale, gamma, ph, pw, sampling_ratio, H, W, 0};
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    const auto* off = offset_data<opmath_type<scalar_t>>(offset);
    for (int64_t k0 = 0; k0 < K;) {
      const int64_t k1 = next(k0);
      using T = opmath_type<scalar_t>;
      const Plans<T> plans =
          build_plans<T>(rois, off, k0, k1, spatial_scale, gamma, ph, pw, sampling_ratio, H, W, false);
      per_bin_forward<T, scalar_t>(plans, input, k0, ph, pw, out);
      k0 = k1;
    }
  });
  return out;
}

ROIOPS_ENTRY
Tensor deform_roi_pool_backward(const Tensor& grad_, const Tensor& rois_, const std::optional<Tensor>& offset_,
                                double spatial_scale, int64_t ph, int64_t pw, int64_t N, int64_t C, int64_t H,
                                int64_t W, int64_t sampling_ratio, double gamma, bool channels_last) {
  const int64_t sizes[4] = {N, C, H, W};
  check_args(grad_, "grad", rois_, offset_, spatial_scale, ph, pw, sampling_ratio, sizes);
  check_grad_shape(grad_, rois_.size(0), C, ph, pw);
  const BackwardArgs a(grad_, rois_, N, spatial_scale, channels_last);
  const Tensor &grad = a.grad, &rois = a.rois;
  const Tensor offset = opmath_offset(offset_, grad.scalar_type());
  const int64_t K = rois.size(0);
  Tensor gi = empty_output({N, C, H, W}, a.grad_options);
  const Chunks next{rois, offset, spatial_scale, gamma, ph, pw, sampling_ratio, H, W, 0};
  ROIOPS_DISPATCH(grad.scalar_type(), [&] {
    using T = opmath_type<scalar_t>;
    const T* off = offset_data<T>(offset);
    backward_chunks<scalar_t>(gi, K, next, [&](auto out_type, Tensor& out, int64_t k0, int64_t k1, bool fresh) {
      using out_t = decltype(out_type);
      const Plans<T> plans =
          build_plans<T>(rois, off, k0, k1, spatial_scale, gamma, ph, pw, sampling_ratio, H, W, false);
      Scratch<T> q;
      backward_bands<T, scalar_t, out_t>(
          plans, narrow_view(grad, 0, k0, k1 - k0), nullptr, out, fresh, ph, pw,
          [&](auto kN, const DeformPlan<T>& p, const auto* g, const int32_t*, int64_t gH, int64_t gW, int64_t nc,
              int64_t i0, int64_t i1, T* acc, int64_t y0, int64_t y1, int64_t bH, int64_t aW) {
            avg_backward_cl<kN, true>(p, g, gH, gW, nc, i0, i1, pw, acc, y0, y1, bH, aW, q.get(nc));
          });
    });
  });
  return gi;
}

ROIOPS_ENTRY
Tensor deform_roi_pool_offset_backward(const Tensor& grad_, const Tensor& input_, const Tensor& rois_,
                                       const std::optional<Tensor>& offset_, double spatial_scale, int64_t ph,
                                       int64_t pw, int64_t sampling_ratio, double gamma) {
  check_args(input_, "input", rois_, offset_, spatial_scale, ph, pw, sampling_ratio);
  check_grad_shape(grad_, rois_.size(0), input_.size(1), ph, pw);
  check_grad_like(grad_, input_);
  if (!offset_) return empty({0}, Options{input_.scalar_type()});
  const ForwardArgs a(input_, rois_, spatial_scale);
  const Tensor &input = a.input, &rois = a.rois;
  const Tensor grad = in_layout(grad_, a.channels_last);
  const Tensor offset = opmath_offset(offset_, input.scalar_type());
  const int64_t K = rois.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  Tensor go = empty_output({K, 2, ph, pw}, Options{offset.scalar_type()});
  // The per-block sums of a box count in its chunk's budget (NCHW: one per block).
  const int64_t block = box_task_block(input), per_bin = C > 0 ? 2 * ((C + block - 1) / block) : 0;
  const Chunks next{rois, offset, spatial_scale, gamma, ph, pw, sampling_ratio, H, W, per_bin};
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    using T = opmath_type<scalar_t>;
    const T* off = offset.const_data_ptr<T>();
    for (int64_t k0 = 0; k0 < K;) {
      const int64_t k1 = next(k0);
      const Plans<T> plans =
          build_plans<T>(rois, off, k0, k1, spatial_scale, gamma, ph, pw, sampling_ratio, H, W, true);
      offset_grad_impl<scalar_t>(plans, input, grad, k0, ph, pw, go.mutable_data_ptr<T>());
      k0 = k1;
    }
  });
  return to_dtype(go, offset_->scalar_type());
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("deform_roi_pool", TORCH_BOX(&roiops::deform_roi_pool_forward));
  m.impl("_deform_roi_pool_backward", TORCH_BOX(&roiops::deform_roi_pool_backward));
  m.impl("_deform_roi_pool_offset_backward", TORCH_BOX(&roiops::deform_roi_pool_offset_backward));
}
