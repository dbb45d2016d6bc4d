// Border align on the CPU (docs/semantics.md, "border_align").
//
// Boxes come per image ([N, K, 4]); output [n, c, k, e] is the first maximum of the
// pool_size + 1 bilinear samples of channel e * C + c along border e of box (n, k), the
// samples placed by repeated addition of one step from the border's start.
//
// Forward tasks: (image, block of boxes, block of channels). A task builds its boxes'
// sample taps once (shared by the channels), then runs channels_last input along the
// contiguous channels of each cell (branch-free, so the max vectorises), NCHW input
// plane by plane. Backward tasks own (image, border, block of channels) of the gradient
// and add the boxes in increasing k, each output's grad at the point the forward's walk
// reached at its argmax (the walk replayed, not start + argmax * step): deterministic for
// any thread count, no atomics.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "geometry.h"
#include "memory.h"
#include "parallel.h"

namespace roiops {
namespace {

constexpr int64_t kMaxPoolSize = 1024;  // _geometry.MAX_POOL_SIZE
constexpr int64_t kBoxChunk = 64;       // boxes per forward task

// ---- Argument checks: _kernel_checks._per_image_check's, in its order and words.

inline void check_border_map(const Tensor& t, bool grad) {
  const char* name = grad ? "grad" : "input";
  ROIOPS_CHECK(t.dim() == 4, "roiops: ", name, " must be 4-D ", grad ? "[N, C, K, 4]" : "[N, 4C, H, W]", ", got ",
               t.dim(), "-D");
  const ScalarType s = t.scalar_type();
  ROIOPS_CHECK(is_floating(s), "roiops: ", name, " must be floating point, got ", dtype_name(s));
  ROIOPS_CHECK(s == kHalf || s == kBFloat16 || s == kFloat || s == kDouble, "roiops: ", name, " dtype ",
               dtype_name(s), " is not implemented; expected float16, bfloat16, float32 or float64");
}

inline void check_border_args(const Tensor& map, const Tensor& rois, bool grad, int64_t N, int64_t C, int64_t H,
                              int64_t W, int64_t pool_size) {
  const char* name = grad ? "grad" : "input";
  ROIOPS_CHECK(rois.dim() == 3 && rois.size(2) == 4, "roiops: rois must be [N, K, 4] (rows (x1, y1, x2, y2)), got ",
               shape_name(rois));
  const ScalarType s = rois.scalar_type();
  ROIOPS_CHECK(is_floating(s), "roiops: rois must be floating point, got ", dtype_name(s));
  ROIOPS_CHECK(s == kDouble || map.scalar_type() != kDouble, "roiops: rois must be float64 for a float64 ", name,
               ", got ", dtype_name(s));
  ROIOPS_CHECK(same_device(rois, map), "roiops: rois is on ", device_name(rois), " but ", name, " is on ",
               device_name(map));
  if (grad) check_batch_channels(N, C);
  check_map_size(H, W);
  ROIOPS_CHECK(rois.size(0) == N, "roiops: rois must hold boxes for each of the ", N, " images ([N, K, 4]), got ",
               shape_name(rois));
  ROIOPS_CHECK(pool_size >= 1 && pool_size <= kMaxPoolSize, "roiops: pool_size must be in [1, ", kMaxPoolSize,
               "], got ", pool_size);
  ROIOPS_CHECK(C % 4 == 0, "roiops: input channels (", C, ") must be a multiple of 4 (top, left, bottom, right)");
}

// Boxes contiguous in the opmath type, each coordinate finite and within 2^24 cells.
template <typename T>
void check_boxes(const Tensor& rois) {
  const T* r = rois.const_data_ptr<T>();
  const int64_t K = rois.size(1);
  for (int64_t i = 0; i < rois.size(0) * K * 4; ++i) {
    ROIOPS_CHECK(std::abs(r[i]) <= static_cast<T>(kMaxCoordinate), "roiops: rois[", i / 4 / K, ", ", i / 4 % K,
                 "] has a coordinate that is not finite or beyond 2^24 feature-map cells");
  }
}

// Border e of box (x1, y1, x2, y2): the start point and the step, which moves x for the
// top and bottom borders, y for the left and right ones (semantics.md "border_align").
template <typename T>
struct Walk {
  T x, y, step;
  bool along_x;

  Walk(const T* box, int64_t e, int64_t pool_size) {
    const T n = static_cast<T>(pool_size);
    along_x = e % 2 == 0;
    x = e < 2 ? box[0] : box[2];
    y = e < 2 ? box[1] : box[3];
    const T side = along_x ? (box[2] - box[0]) / n : (box[3] - box[1]) / n;
    step = e < 2 ? side : -side;
  }

  // The moving coordinate of samples 0..pool_size, by repeated addition.
  void positions(int64_t pool_size, T* out) const {
    T p = along_x ? x : y;
    for (int64_t i = 0; i <= pool_size; ++i, p += step) out[i] = p;
  }
};

// One sample's four taps (cell offsets h * W + w and weights, in the bilinear sum's order).
template <typename T>
struct Sample {
  int64_t cell[4];
  T w[4];
  bool inside;
};

template <typename T>
inline Sample<T> sample_at(T x, T y, int64_t H, int64_t W) {
  Sample<T> s;
  Tap<T> ty, tx;
  s.inside = make_tap(y, H, ty) && make_tap(x, W, tx);
  if (!s.inside) return s;
  s.cell[0] = ty.lo * W + tx.lo;
  s.cell[1] = ty.lo * W + tx.hi;
  s.cell[2] = ty.hi * W + tx.lo;
  s.cell[3] = ty.hi * W + tx.hi;
  s.w[0] = ty.h * tx.h;
  s.w[1] = ty.h * tx.l;
  s.w[2] = ty.l * tx.h;
  s.w[3] = ty.l * tx.l;
  return s;
}

// The bilinear sum of a sample (inside the map) at element `at` of its four taps' rows, in
// RoIAlign's order.
template <typename T, typename scalar_t>
inline T sample_value(const Sample<T>& t, const scalar_t* p0, const scalar_t* p1, const scalar_t* p2,
                      const scalar_t* p3, int64_t at) {
  return ((t.w[0] * static_cast<T>(p0[at]) + t.w[1] * static_cast<T>(p1[at])) + t.w[2] * static_cast<T>(p2[at])) +
         t.w[3] * static_cast<T>(p3[at]);
}

template <typename T>
inline Sample<T> walk_sample(const Walk<T>& walk, T p, int64_t H, int64_t W) {
  return walk.along_x ? sample_at(p, walk.y, H, W) : sample_at(walk.x, p, H, W);
}

template <typename scalar_t>
void forward_impl(const Tensor& input, const Tensor& rois, int64_t pool_size, bool channels_last, Tensor& out,
                  Tensor& argmax) {
  using T = opmath_type<scalar_t>;
  const int64_t N = input.size(0), C4 = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t C = C4 / 4, K = rois.size(1), S = pool_size + 1;
  const scalar_t* x = input.const_data_ptr<scalar_t>();
  const T* boxes = rois.const_data_ptr<T>();
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  int32_t* am = argmax.mutable_data_ptr<int32_t>();
  const int64_t sN = input.stride(0), sC = input.stride(1), sCell = input.stride(3);
  const int64_t oN = out.stride(0), oC = out.stride(1), oK = out.stride(2), oE = out.stride(3);
  const int64_t chunks = (K + kBoxChunk - 1) / kBoxChunk;
  const int64_t cb = std::max<int64_t>(1, channels_last ? C : std::min<int64_t>(C, 16));
  const int64_t cblocks = (C + cb - 1) / cb;
  Scratch<Sample<T>> samples;
  Scratch<T> pos;
  Scratch<T> best_s;
  Scratch<int32_t> arg_s;
  parallel_tasks(N * chunks * cblocks, [&](int64_t task) {
    const int64_t n = task / (chunks * cblocks), rest = task % (chunks * cblocks);
    const int64_t k0 = rest / cblocks * kBoxChunk, k1 = std::min(K, k0 + kBoxChunk);
    const int64_t c0 = rest % cblocks * cb, c1 = std::min(C, c0 + cb);
    Sample<T>* sm = samples.get((k1 - k0) * 4 * S);
    T* p = pos.get(S);
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t e = 0; e < 4; ++e) {
        const Walk<T> walk(boxes + (n * K + k) * 4, e, pool_size);
        walk.positions(pool_size, p);
        for (int64_t i = 0; i < S; ++i) sm[((k - k0) * 4 + e) * S + i] = walk_sample(walk, p[i], H, W);
      }
    }
    if (channels_last) {
      T* best = best_s.get(c1 - c0);
      int32_t* arg = arg_s.get(c1 - c0);
      for (int64_t k = k0; k < k1; ++k) {
        for (int64_t e = 0; e < 4; ++e) {
          const scalar_t* base = x + n * sN + (e * C + c0) * sC;
          const Sample<T>* s = sm + ((k - k0) * 4 + e) * S;
          for (int64_t i = 0; i < S; ++i) {
            const Sample<T>& t = s[i];
            const scalar_t *p0 = base + t.cell[0] * sCell, *p1 = base + t.cell[1] * sCell,
                           *p2 = base + t.cell[2] * sCell, *p3 = base + t.cell[3] * sCell;
            for (int64_t c = 0; c < c1 - c0; ++c) {
              const T v = t.inside ? sample_value(t, p0, p1, p2, p3, c) : T(0);
              if (i == 0) {
                best[c] = v;
                arg[c] = 0;
              } else {
                take_first_max(v, static_cast<int32_t>(i), best[c], arg[c]);
              }
            }
          }
          const int64_t at = n * oN + k * oK + e * oE + c0 * oC;
          for (int64_t c = 0; c < c1 - c0; ++c) {
            o[at + c * oC] = static_cast<scalar_t>(best[c]);
            am[at + c * oC] = arg[c];
          }
        }
      }
      return;
    }
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t k = k0; k < k1; ++k) {
        for (int64_t e = 0; e < 4; ++e) {
          const scalar_t* plane = x + n * sN + (e * C + c) * sC;
          const Sample<T>* s = sm + ((k - k0) * 4 + e) * S;
          T best = 0;
          int32_t arg = 0;
          for (int64_t i = 0; i < S; ++i) {
            const Sample<T>& t = s[i];
            const T v = t.inside ? sample_value(t, plane + t.cell[0], plane + t.cell[1], plane + t.cell[2],
                                                plane + t.cell[3], 0)
                                 : T(0);
            if (i == 0) {
              best = v;
            } else {
              take_first_max(v, static_cast<int32_t>(i), best, arg);
            }
          }
          const int64_t at = n * oN + c * oC + k * oK + e * oE;
          o[at] = static_cast<scalar_t>(best);
          am[at] = arg;
        }
      }
    }
  });
}

// Adds each output's grad at its sample's taps into acc (the opmath gradient, in the
// input's layout). Returns false if an argmax lies outside [0, pool_size] (nothing is
// added for it).
template <typename scalar_t>
bool backward_impl(const Tensor& grad, const Tensor& argmax, const Tensor& rois, int64_t pool_size, int64_t H,
                   int64_t W, Tensor& acc) {
  using T = opmath_type<scalar_t>;
  const int64_t N = grad.size(0), C = grad.size(1), K = grad.size(2), S = pool_size + 1;
  const scalar_t* g = grad.const_data_ptr<scalar_t>();
  const int32_t* am = argmax.const_data_ptr<int32_t>();
  const T* boxes = rois.const_data_ptr<T>();
  T* gi = acc.mutable_data_ptr<T>();
  const int64_t gN = grad.stride(0), gC = grad.stride(1), gK = grad.stride(2), gE = grad.stride(3);
  const int64_t aN = argmax.stride(0), aC = argmax.stride(1), aK = argmax.stride(2), aE = argmax.stride(3);
  const int64_t sN = acc.stride(0), sC = acc.stride(1), sCell = acc.stride(3);
  const int64_t cb = std::max<int64_t>(1, std::min<int64_t>(C, 16));
  const int64_t cblocks = (C + cb - 1) / cb;
  std::vector<char> bad(static_cast<size_t>(N * 4 * cblocks), 0);
  Scratch<T> pos;
  parallel_tasks(N * 4 * cblocks, [&](int64_t task) {
    const int64_t n = task / (4 * cblocks), e = task / cblocks % 4;
    const int64_t c0 = task % cblocks * cb, c1 = std::min(C, c0 + cb);
    T* p = pos.get(S);
    for (int64_t k = 0; k < K; ++k) {
      const Walk<T> walk(boxes + (n * K + k) * 4, e, pool_size);
      walk.positions(pool_size, p);
      for (int64_t c = c0; c < c1; ++c) {
        const int32_t a = am[n * aN + c * aC + k * aK + e * aE];
        if (a < 0 || a > pool_size) {
          bad[task] = 1;
          continue;
        }
        const Sample<T> s = walk_sample(walk, p[a], H, W);
        if (!s.inside) continue;
        const T v = static_cast<T>(g[n * gN + c * gC + k * gK + e * gE]);
        T* plane = gi + n * sN + (e * C + c) * sC;
        for (int64_t t = 0; t < 4; ++t) plane[s.cell[t] * sCell] += v * s.w[t];
      }
    }
  });
  return std::none_of(bad.begin(), bad.end(), [](char b) { return b != 0; });
}

}  // namespace

ROIOPS_ENTRY
std::tuple<Tensor, Tensor> border_align_forward(const Tensor& input_, const Tensor& rois_, int64_t pool_size) {
  check_border_map(input_, false);
  check_border_args(input_, rois_, false, input_.size(0), input_.size(1), input_.size(2), input_.size(3), pool_size);
  check_cpu(input_);
  const bool channels_last = is_channels_last(input_);
  const Tensor input = in_layout(input_, channels_last);
  const Tensor rois = in_format(opmath_rois(rois_, input.scalar_type()));
  ROIOPS_DISPATCH_FLOAT(rois.scalar_type(), [&] { check_boxes<scalar_t>(rois); });
  const Options options = options_of(input, channels_last);
  const std::vector<int64_t> sizes{input.size(0), input.size(1) / 4, rois.size(1), 4};
  Tensor out = empty_output(sizes, options);
  Tensor argmax = empty_output(sizes, options.dtype(kInt));
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    forward_impl<scalar_t>(input, rois, pool_size, channels_last, out, argmax);
  });
  return {out, argmax};
}

ROIOPS_ENTRY
Tensor border_align_backward(const Tensor& grad_, const Tensor& argmax_, const Tensor& rois_, int64_t pool_size,
                             int64_t N, int64_t C, int64_t H, int64_t W, bool channels_last) {
  check_border_map(grad_, true);
  check_border_args(grad_, rois_, true, N, C, H, W, pool_size);
  ROIOPS_CHECK(grad_.size(0) == N && grad_.size(1) == C / 4 && grad_.size(2) == rois_.size(1) && grad_.size(3) == 4,
               "roiops: grad must be [N, C / 4, K, 4] = [", N, ", ", C / 4, ", ", rois_.size(1), ", 4] (the forward "
               "output's shape), got ", shape_name(grad_));
  check_argmax(argmax_, grad_);
  check_cpu(grad_);
  const Tensor rois = in_format(opmath_rois(rois_, grad_.scalar_type()));
  ROIOPS_DISPATCH_FLOAT(rois.scalar_type(), [&] { check_boxes<scalar_t>(rois); });
  const Tensor grad = in_layout(grad_, channels_last), argmax = in_layout(argmax_, channels_last);
  const ScalarType s = grad.scalar_type(), acc_type = s == kDouble ? kDouble : kFloat;
  Tensor acc = zeros({N, C, H, W}, Options{acc_type, channels_last});
  bool ok = true;
  ROIOPS_DISPATCH(s, [&] { ok = backward_impl<scalar_t>(grad, argmax, rois, pool_size, H, W, acc); });
  ROIOPS_CHECK(ok, "roiops: argmax holds a sample index outside [0, pool_size = ", pool_size, "]");
  return s == acc_type ? acc : in_layout(to_dtype(acc, s), channels_last);
}

}  // namespace roiops

// The schemas (roiops/ops/_declare.py holds them equal to the op's spec) and the CPU kernels.
STABLE_TORCH_LIBRARY_FRAGMENT(roiops, m) {
  m.def("border_align(Tensor input, Tensor rois, int pool_size) -> (Tensor, Tensor)");
  m.def("_border_align_backward(Tensor grad, Tensor argmax, Tensor rois, int pool_size, int batch_size, "
        "int channels, int height, int width, bool channels_last) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("border_align", TORCH_BOX(&roiops::border_align_forward));
  m.impl("_border_align_backward", TORCH_BOX(&roiops::border_align_backward));
}
