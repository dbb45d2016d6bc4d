// Border align on the CPU (docs/semantics.md, "border_align").
//
// Boxes come per image ([N, K, 4]); output [n, c, k, e] is the first maximum of the
// pool_size + 1 bilinear samples of channel e * C + c along border e of box (n, k), the
// samples placed by repeated addition of one step from the border's start.
//
// Forward: image by image, in channels_last (an NCHW image is copied so first: one
// image's map more in memory), tasks of 64 boxes; a border's sample taps are built once
// and each sample reads a cell's channels as one run, the maximum branch-free along them
// so that it vectorises. Backward tasks own (image, border, block of channels) of the
// gradient and add the boxes in increasing k, each output's grad at the point the forward's walk
// reached at its argmax (the walk replayed, not start + argmax * step): deterministic for
// any thread count, no atomics.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "args.h"
#include "bounds.h"
#include "checks.h"
#include "geometry.h"
#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "simd.h"

namespace roiops {
namespace {

constexpr int64_t kMaxPoolSize = 1024;  // _geometry.MAX_POOL_SIZE
constexpr int64_t kBoxChunk = 64;       // boxes per forward task

// ---- Argument checks: _kernel_checks._per_image_check's, in its order and words.

inline void check_border_map(const Tensor& t, bool grad) {
  const char* name = grad ? "grad" : "input";
  ROIOPS_CHECK(t.dim() == 4, "roiops: ", name, " must be 4-D ", grad ? "[N, C, K, 4]" : "[N, 4C, H, W]", ", got ",
               t.dim(), "-D");
  check_kernel_dtype(t, name);
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
template <typename T>
inline Sample<T> walk_sample(const Walk<T>& walk, T p, int64_t H, int64_t W) {
  return walk.along_x ? sample_at(p, walk.y, H, W) : sample_at(walk.x, p, H, W);
}

// The samples of border e of box `box`, in walking order.
template <typename T>
inline void border_samples(const T* box, int64_t e, int64_t pool_size, int64_t H, int64_t W, T* pos, Sample<T>* out) {
  const Walk<T> walk(box, e, pool_size);
  walk.positions(pool_size, pos);
  for (int64_t i = 0; i <= pool_size; ++i) out[i] = walk_sample(walk, pos[i], H, W);
}

// The first maximum over one border's S samples of channels [0, n) of a channels_last map
// (cells `cell` apart from `base`): best and arg, branch-free along the channels so that
// the loops vectorise. A sample off the map is 0.
template <typename scalar_t, typename T>
ROIOPS_SIMD void border_max(const Sample<T>* s, int64_t S, const scalar_t* base, int64_t cell, int64_t n,
                            T* __restrict__ best, int32_t* __restrict__ arg) {
  for (int64_t i = 0; i < S; ++i) {
    const Sample<T>& t = s[i];
    const int32_t at = static_cast<int32_t>(i);
    if (!t.inside) {
      for (int64_t c = 0; c < n; ++c) {
        if (i == 0) {
          best[c] = T(0);
          arg[c] = 0;
        } else {
          take_first_max(T(0), at, best[c], arg[c]);
        }
      }
      continue;
    }
    const scalar_t* __restrict__ p0 = base + t.cell[0] * cell;
    const scalar_t* __restrict__ p1 = base + t.cell[1] * cell;
    const scalar_t* __restrict__ p2 = base + t.cell[2] * cell;
    const scalar_t* __restrict__ p3 = base + t.cell[3] * cell;
    const T w0 = t.w[0], w1 = t.w[1], w2 = t.w[2], w3 = t.w[3];
    if (i == 0) {
      for (int64_t c = 0; c < n; ++c) {
        best[c] = ((w0 * static_cast<T>(p0[c]) + w1 * static_cast<T>(p1[c])) + w2 * static_cast<T>(p2[c])) +
                  w3 * static_cast<T>(p3[c]);
        arg[c] = 0;
      }
    } else {
      for (int64_t c = 0; c < n; ++c) {
        const T v = ((w0 * static_cast<T>(p0[c]) + w1 * static_cast<T>(p1[c])) + w2 * static_cast<T>(p2[c])) +
                    w3 * static_cast<T>(p3[c]);
        take_first_max(v, at, best[c], arg[c]);
      }
    }
  }
}

// Image n's output from its map in channels_last (an NCHW map is copied so first, one image
// at a time: each sample then reads a cell's channels as one run). Tasks: blocks of boxes.
template <typename scalar_t>
void forward_impl(const Tensor& image, const opmath_type<scalar_t>* boxes, int64_t K, int64_t pool_size, Tensor& out,
                  Tensor& argmax, int64_t n) {
  using T = opmath_type<scalar_t>;
  const int64_t C4 = image.size(1), H = image.size(2), W = image.size(3);
  const int64_t C = C4 / 4, S = pool_size + 1;
  const scalar_t* x = image.const_data_ptr<scalar_t>();
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  int32_t* am = argmax.mutable_data_ptr<int32_t>();
  const int64_t sC = image.stride(1), sCell = image.stride(3);
  const int64_t oN = out.stride(0), oC = out.stride(1), oK = out.stride(2), oE = out.stride(3);
  const int64_t chunks = (K + kBoxChunk - 1) / kBoxChunk;
  Scratch<Sample<T>> samples;
  Scratch<T> pos, best_s;
  Scratch<int32_t> arg_s;
  parallel_tasks(chunks, [&](int64_t chunk) {
    const int64_t k0 = chunk * kBoxChunk, k1 = std::min(K, k0 + kBoxChunk);
    Sample<T>* sm = samples.get(S);
    T* p = pos.get(S);
    T* best = best_s.get(std::max<int64_t>(C, 1));
    int32_t* arg = arg_s.get(std::max<int64_t>(C, 1));
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t e = 0; e < 4; ++e) {
        border_samples(boxes + (n * K + k) * 4, e, pool_size, H, W, p, sm);
        border_max(sm, S, x + e * C * sC, sCell, C, best, arg);
        const int64_t at = n * oN + k * oK + e * oE;
        for (int64_t c = 0; c < C; ++c) {
          o[at + c * oC] = static_cast<scalar_t>(best[c]);
          am[at + c * oC] = arg[c];
        }
      }
    }
  });
}

// Adds grads g[c] at the taps of the sample that channel c < n picked (a[c]) into a
// channels_last gradient (cells `cell` apart from `base`), 8 channels at a time: for each
// sample, only the groups of 8 channels in which some channel picked it, each lane masked
// by whether its channel did (the others add nothing). Each channel adds one sample per
// box, its taps in order. bits: scratch of S.
template <typename T>
ROIOPS_SIMD void border_scatter(const Sample<T>* s, int64_t S, const int32_t* __restrict__ a,
                                const T* __restrict__ g, int64_t n, T* base, int64_t cell,
                                uint64_t* __restrict__ bits) {
  constexpr int64_t kGroups = 64;  // groups of 8 channels per pass: one bit each
  using I = std::conditional_t<sizeof(T) == 8, int64_t, int32_t>;  // a lane mask's integers
  const int64_t n8 = n / 8 * 8;
  for (int64_t c0 = 0; c0 < n8; c0 += 8 * kGroups) {
    const int64_t c1 = std::min(n8, c0 + 8 * kGroups);
    std::fill(bits, bits + S, uint64_t(0));
    for (int64_t c = c0; c < c1; ++c) bits[a[c]] |= uint64_t(1) << ((c - c0) / 8);
    for (int64_t i = 0; i < S; ++i) {
      const Sample<T>& t = s[i];
      if (!t.inside) continue;
      const int32_t at = static_cast<int32_t>(i);
      for (uint64_t b = bits[i]; b; b &= b - 1) {
        const int64_t c = c0 + 8 * __builtin_ctzll(b);
        const lanes8<T> m = __builtin_convertvector(load8(a + c), lanes8<I>) == at ? load8(g + c) : lanes8<T>{};
        for (int64_t tap = 0; tap < 4; ++tap) {
          T* d = base + t.cell[tap] * cell + c;
          store8(d, load8(d) + m * t.w[tap]);
        }
      }
    }
  }
  for (int64_t c = n8; c < n; ++c) {
    const Sample<T>& t = s[a[c]];
    if (!t.inside) continue;
    for (int64_t tap = 0; tap < 4; ++tap) base[t.cell[tap] * cell + c] += g[c] * t.w[tap];
  }
}

// Adds each output's grad at its sample's taps into acc (the opmath gradient, in the
// input's layout). Tasks own (image, border, block of channels) of the gradient and add
// the boxes in increasing k. The argmax values are in [0, pool_size] (checked before).
// Not bands of rows, as in the RoI ops' backwards: a left or right border crosses many
// bands, each of which would build its samples again.
template <typename scalar_t>
void backward_impl(const Tensor& grad, const Tensor& argmax, const Tensor& rois, int64_t pool_size, int64_t H,
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
  // channels_last: a cell's channels are contiguous, and so are a box border's grad and argmax
  const bool lanes = sC == 1 && gC == 1 && aC == 1 && C > 1;
  const int64_t cb = std::max<int64_t>(1, lanes ? C : std::min<int64_t>(C, 32));
  const int64_t cblocks = (C + cb - 1) / cb;
  Scratch<T> pos, g_s;
  Scratch<uint64_t> bits_s;
  Scratch<Sample<T>> samples;
  parallel_tasks(N * 4 * cblocks, [&](int64_t task) {
    const int64_t n = task / (4 * cblocks), e = task / cblocks % 4;
    const int64_t c0 = task % cblocks * cb, c1 = std::min(C, c0 + cb);
    T* p = pos.get(S);
    Sample<T>* sm = samples.get(S);
    T* gl = g_s.get(cb);
    uint64_t* bits = bits_s.get(S);
    for (int64_t k = 0; k < K; ++k) {
      border_samples(boxes + (n * K + k) * 4, e, pool_size, H, W, p, sm);
      if (lanes) {
        const scalar_t* gk = g + n * gN + k * gK + e * gE;
        const int32_t* ak = am + n * aN + k * aK + e * aE;
        if (k + 1 < K) {  // runs 2 KiB or more apart: the hardware prefetchers do not follow
          prefetch_run(gk + gK, C);
          prefetch_run(ak + aK, C);
        }
        const T* gv = gl;
        if constexpr (std::is_same_v<scalar_t, T>) {
          gv = gk;
        } else {
          for (int64_t c = 0; c < C; ++c) gl[c] = static_cast<T>(gk[c]);
        }
        border_scatter(sm, S, ak, gv, C, gi + n * sN + e * C, sCell, bits);
        continue;
      }
      for (int64_t c = c0; c < c1; ++c) {
        const Sample<T>& s = sm[am[n * aN + c * aC + k * aK + e * aE]];
        if (!s.inside) continue;
        const T v = static_cast<T>(g[n * gN + c * gC + k * gK + e * gE]);
        T* plane = gi + n * sN + (e * C + c) * sC;
        for (int64_t t = 0; t < 4; ++t) plane[s.cell[t] * sCell] += v * s.w[t];
      }
    }
  });
}

// Whether every argmax value lies in [0, pool_size] (a dense tensor).
inline bool argmax_in_range(const Tensor& argmax, int64_t pool_size) {
  const int32_t* a = argmax.const_data_ptr<int32_t>();
  const int64_t n = argmax.numel();
  std::atomic<bool> ok{true};
  parallel_for(0, n, int64_t(1) << 16, [&](int64_t i0, int64_t i1) {
    bool good = true;
    for (int64_t i = i0; i < i1; ++i) good &= a[i] >= 0 && a[i] <= pool_size;
    if (!good) ok = false;
  });
  return ok;
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
  if (out.numel() == 0) return {out, argmax};
  ROIOPS_DISPATCH(input.scalar_type(), [&] {
    for (int64_t n = 0; n < input.size(0); ++n) {
      const Tensor image = in_layout(narrow_view(input, 0, n, 1), true);
      forward_impl<scalar_t>(image, rois.const_data_ptr<opmath_type<scalar_t>>(), rois.size(1), pool_size, out,
                             argmax, n);
    }
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
  // From the kept blocks when large (memory.h): a fresh gradient's page faults would cost
  // more than zeroing it again.
  Tensor acc = empty_output({N, C, H, W}, Options{acc_type, channels_last});
  fill_zero(acc);
  ROIOPS_CHECK(argmax_in_range(argmax, pool_size), "roiops: argmax holds a sample index outside [0, pool_size = ",
               pool_size, "]");
  ROIOPS_DISPATCH(s, [&] { backward_impl<scalar_t>(grad, argmax, rois, pool_size, H, W, acc); });
  return s == acc_type ? acc : in_layout(to_dtype(acc, s), channels_last);
}

}  // namespace roiops

// The CPU kernels (the schemas are defined from the ops' declarations: setup.py).
STABLE_TORCH_LIBRARY_IMPL(roiops, CPU, m) {
  m.impl("border_align", TORCH_BOX(&roiops::border_align_forward));
  m.impl("_border_align_backward", TORCH_BOX(&roiops::border_align_backward));
}
