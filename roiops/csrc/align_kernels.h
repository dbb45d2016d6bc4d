// The RoIAlign-style kernels and drivers of the CPU ops whose bins average bilinear
// samples (roi_align "avg", deform_roi_pool): the kernels of one box along contiguous
// channels, for any plan with AlignPlan's interface (rows, cols, count, min_weight,
// bins_in_band, reaches: plans.h), and the drivers that share a call's work into tasks
// (docs/architecture.md "CPU kernels"): forward tasks, backward bands, and the per-box
// passes of gradients that read the map.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "plans.h"
#include "simd.h"
#include "tiles.h"

namespace roiops {

// The image of each of a call's boxes (plans[k].batch).
template <typename PlanList>
std::vector<int64_t> batches(const PlanList& plans) {
  std::vector<int64_t> b(plans.size());
  for (size_t k = 0; k < plans.size(); ++k) b[k] = plans[k].batch;
  return b;
}

// ---- avg, one box -------------------------------------------------------------------

// Sample values are summed in torchvision's order and arithmetic (semantics.md "roi_align
// avg"): per bin, samples in row-major order, each w1*v1 + w2*v2 + w3*v3 + w4*v4, the sum divided by
// the count; samples outside the map add nothing. float32 results are then torchvision's
// bit for bit, and a 0-weight tap on an infinite value gives NaN as it does there.

// One box (Plan: AlignPlan, or a plan with its rows, cols and count) on n contiguous
// channels (cell (y, x) at img + y * sH + x * sW), vectorised along them.
// Output channel c of bin (i, j) goes to out[i * oH + j * oW + c * oC].
template <int64_t kN, typename Plan, typename S, typename T, typename scalar_t>
ROIOPS_SIMD void avg_forward_cl(const Plan& p, const S* img, int64_t sH, int64_t sW, int64_t n_, int64_t ph,
                                int64_t pw, T* acc_, scalar_t* out, int64_t oH, int64_t oW, int64_t oC) {
  const int64_t n = kN ? kN : n_;
  T acc_k[kN ? kN : 1];
  T* __restrict__ acc = kN ? acc_k : acc_;
  for (int64_t i = 0; i < ph; ++i) {
    for (int64_t j = 0; j < pw; ++j) {
      std::fill(acc, acc + n, T(0));
      const auto [a0, a1] = p.rows(i, j);
      const auto [b0, b1] = p.cols(i, j);
      for (int64_t a = a0; a < a1; ++a) {
        const T hy = p.ys.h[a], ly = p.ys.l[a];
        const S* rlo = img + p.ys.lo[a] * sH;
        const S* rhi = img + p.ys.hi[a] * sH;
        for (int64_t b = b0; b < b1; ++b) {
          const T hx = p.xs.h[b], lx = p.xs.l[b];
          const T w1 = hy * hx, w2 = hy * lx, w3 = ly * hx, w4 = ly * lx;
          const S* __restrict__ p1 = rlo + p.xs.lo[b] * sW;
          const S* __restrict__ p2 = rlo + p.xs.hi[b] * sW;
          const S* __restrict__ p3 = rhi + p.xs.lo[b] * sW;
          const S* __restrict__ p4 = rhi + p.xs.hi[b] * sW;
          for (int64_t c = 0; c < n; ++c) {
            acc[c] += w1 * static_cast<T>(p1[c]) + w2 * static_cast<T>(p2[c]) + w3 * static_cast<T>(p3[c]) +
                      w4 * static_cast<T>(p4[c]);
          }
        }
      }
      scalar_t* o = out + i * oH + j * oW;
      for (int64_t c = 0; c < n; ++c) o[c * oC] = static_cast<scalar_t>(acc[c] / p.count);
    }
  }
}

// How the terms g * w / count of a bin are evaluated; each way gives the bits of
// torchvision's (g * w) / count:
//  - kPow2: times the exact inverse of a power-of-two count;
//  - kFma: float32 quotient from the rounded reciprocal with one FMA correction
//    (Markstein's theorem: correctly rounded when no term is subnormal or near it; also
//    checked against division for every float32 significand and every count up to
//    65536). A division per term took most of an adaptive backward's time;
//  - kDivide: the division itself, where kFma is not known to be exact;
//  - kDivided: g is already q = grad / count (deform_roi_pool divides first): q * w.
enum class TermDiv { kPow2, kFma, kDivide, kDivided };

template <typename T>
struct Divisor {
  T count, inv;
  bool pow2, fma;
  T tiny;  // kFma only where every nonzero |g * w| is at least this (far above subnormal)
  explicit Divisor(T c)
      : count(c), inv(T(1) / c), pow2((static_cast<int64_t>(c) & (static_cast<int64_t>(c) - 1)) == 0),
        fma(float_fma_div_ok<T>(c)), tiny(T(0x1p-100) * c) {}
};

// dst[c] += g[c] * w / count. The pragma keeps GCC from unrolling a 16-channel loop
// into scalar code, which it does with the three variants.
template <TermDiv kHow, typename G, typename T>
inline void add_term(T* __restrict__ dst, const G* __restrict__ g, T w, T count, T inv, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) {
    const T t = static_cast<T>(g[c]) * w;
    if constexpr (kHow == TermDiv::kPow2) {
      dst[c] += t * inv;
    } else if constexpr (kHow == TermDiv::kDivided) {
      dst[c] += t;
    } else if constexpr (kHow == TermDiv::kFma) {
      const T q = t * inv;
      dst[c] += std::fma(std::fma(-q, count, t), inv, q);
    } else {
      dst[c] += t / count;
    }
  }
}

// kFma for a bin if its gradient is finite and no nonzero term g * w can come near the
// subnormal range (w_min: a lower bound of the bin's nonzero weights).
template <typename G, typename T>
inline TermDiv term_div(const Divisor<T>& d, const G* __restrict__ g, int64_t n, T w_min) {
  if (d.pow2) return TermDiv::kPow2;
  if (!d.fma) return TermDiv::kDivide;
  T g_min = std::numeric_limits<T>::infinity();
  bool finite = true;
  for (int64_t c = 0; c < n; ++c) {
    const T a = std::abs(static_cast<T>(g[c]));
    finite &= a <= std::numeric_limits<T>::max();
    g_min = std::min(g_min, a == T(0) ? std::numeric_limits<T>::infinity() : a);
  }
  return finite && g_min * w_min >= d.tiny ? TermDiv::kFma : TermDiv::kDivide;
}

// Backward of one box for n contiguous channels, the adjoint of avg_forward_cl in
// torchvision's order (per cell: bins, then samples, then taps w1..w4), restricted to
// map rows [y0, y1) of a band whose row y starts at band + (y - y0) * bH, and to the bin
// rows [i0, i1) that reach it (bins_in_band). g points at the box's gradient (bin (i, j) at
// g + i * gH + j * gW, channels contiguous). kDivideFirst: each bin's gradient is divided
// by the count first, into q_ (n values, unless kN is known), and the terms are q * w.
template <int64_t kN, bool kDivideFirst = false, typename Plan, typename G, typename T>
ROIOPS_SIMD void avg_backward_cl(const Plan& p, const G* g, int64_t gH, int64_t gW, int64_t n_, int64_t i0,
                                 int64_t i1, int64_t pw, T* band, int64_t y0, int64_t y1, int64_t bH, int64_t sW,
                                 T* q_ = nullptr) {
  const int64_t n = kN ? kN : n_;
  const Divisor<T> d(p.count);
  const T count = d.count, inv = d.inv;  // registers: the band's stores could alias d
  T q_k[kN ? kN : 1];
  T* __restrict__ q = kN ? q_k : q_;
  auto bin = [&](auto how, const auto* gb, int64_t i, int64_t j) {
    const auto [a0, a1] = p.rows(i, j);
    const auto [b0, b1] = p.cols(i, j);
    for (int64_t a = a0; a < a1; ++a) {
      const int64_t ylo = p.ys.lo[a], yhi = p.ys.hi[a];
      T* rlo = ylo >= y0 && ylo < y1 ? band + (ylo - y0) * bH : nullptr;
      T* rhi = yhi >= y0 && yhi < y1 ? band + (yhi - y0) * bH : nullptr;
      if (!rlo && !rhi) continue;
      const T hy = p.ys.h[a], ly = p.ys.l[a];
      for (int64_t b = b0; b < b1; ++b) {
        const T hx = p.xs.h[b], lx = p.xs.l[b];
        const int64_t xl = p.xs.lo[b] * sW, xh = p.xs.hi[b] * sW;
        if (rlo) {
          add_term<how()>(rlo + xl, gb, hy * hx, count, inv, n);
          add_term<how()>(rlo + xh, gb, hy * lx, count, inv, n);
        }
        if (rhi) {
          add_term<how()>(rhi + xl, gb, ly * hx, count, inv, n);
          add_term<how()>(rhi + xh, gb, ly * lx, count, inv, n);
        }
      }
    }
  };
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = 0; j < pw; ++j) {
      if (!p.reaches(i, j, y0, y1)) continue;
      const G* gb = g + i * gH + j * gW;
      if (j + 1 < pw || i + 1 < i1) prefetch_run(j + 1 < pw ? gb + gW : g + (i + 1) * gH, n);
      if constexpr (kDivideFirst) {
        for (int64_t c = 0; c < n; ++c) q[c] = static_cast<T>(gb[c]) / count;
        bin(std::integral_constant<TermDiv, TermDiv::kDivided>{}, static_cast<const T*>(q), i, j);
        continue;
      }
      switch (term_div(d, gb, n, p.min_weight(i, j))) {
        case TermDiv::kPow2: bin(std::integral_constant<TermDiv, TermDiv::kPow2>{}, gb, i, j); break;
        case TermDiv::kFma: bin(std::integral_constant<TermDiv, TermDiv::kFma>{}, gb, i, j); break;
        case TermDiv::kDivide: bin(std::integral_constant<TermDiv, TermDiv::kDivide>{}, gb, i, j); break;
        case TermDiv::kDivided: break;  // not a choice of term_div's
      }
    }
  }
}

// Should the NCHW forward of image n go through channels-last tiles? Only if transposing
// the rectangle around its boxes costs less than the boxes' own reads; otherwise (few
// boxes on a large map) per-plane kernels run. rect = {y0, y1, x0, x1} around the boxes.
template <typename T, typename PlanList>
bool use_tile(const PlanList& plans, const std::vector<int64_t>& boxes, int64_t H, int64_t W, int64_t cb,
              std::array<int64_t, 4>& rect) {
  rect = {H, 0, W, 0};
  double area = 0;
  for (const int64_t k : boxes) {
    const auto& p = plans[k];
    if (p.empty()) continue;
    rect = {std::min(rect[0], p.ys.cell_lo), std::max(rect[1], p.ys.cell_hi + 1), std::min(rect[2], p.xs.cell_lo),
            std::max(rect[3], p.xs.cell_hi + 1)};
    area += static_cast<double>(p.ys.cell_hi - p.ys.cell_lo + 1) * static_cast<double>(p.x_span());
  }
  return rect[0] < rect[1] && tile_pays(rect, area, H, W, cb, sizeof(T));
}

// Forward and backward run boxes in chunks, each with its own plans: plan memory (of the
// order of a kilobyte per box, more than the output row of a box with few channels) stays
// bounded for any K.
constexpr int64_t kBoxChunk = int64_t(1) << 14;

// ---- drivers ------------------------------------------------------------------------

// NCHW input in tasks of (image n, block blk of cb channels from c0): body(n, blk, c0, nc,
// tile, boxes), with the block copied into a channels-last tile around the image's boxes
// (cell (y, x), channel c0 + c at tile + (y * W + x) * nc), or tile = nullptr where a tile
// does not pay (use_tile); boxes: the image's boxes in increasing k.
template <typename T, typename scalar_t, typename PlanList, typename Body>
void tile_tasks(const PlanList& plans, const Tensor& input, int64_t cb, const Body& body) {
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), blocks = (C + cb - 1) / cb;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const auto by_image = boxes_by_image(batches(plans), N);
  std::vector<std::array<int64_t, 4>> rect(static_cast<size_t>(N));
  std::vector<char> tiled(static_cast<size_t>(N), 0);
  for (int64_t n = 0; n < N; ++n) tiled[n] = use_tile<T>(plans, by_image[n], H, W, cb, rect[n]);
  Scratch<T> tile;
  parallel_tasks(N * blocks, [&](int64_t t) {
    const int64_t n = t / blocks, blk = t % blocks, c0 = blk * cb, nc = std::min(cb, C - c0);
    T* buf = nullptr;
    if (tiled[n]) {
      buf = tile.get(H * W * nc);
      const auto& r = rect[n];
      planes_to_tile(in + n * sN + c0 * sC, sC, W, nc, r[0], r[1], r[2], r[3], buf);
    }
    body(n, blk, c0, nc, static_cast<const T*>(buf), by_image[n]);
  });
}

// A forward's tasks. channels_last input is read in place: box(kN, k, c0, nc, img, vH, vW)
// for each box and block of its channels (all of them unless the boxes are too few to
// share out). NCHW: (image, block of channels) tasks copy the block into a channels-last
// tile around the image's boxes and call box() on it for each of them, or, where a tile
// does not pay, plane(k, c, plane) for each channel and box. img points at channel c0 of
// the box's image, cell (y, x) at img + y * vH + x * vW; kN: nc when known at compile time.
template <typename T, typename scalar_t, typename PlanList, typename Box, typename Plane>
void forward_tasks(const PlanList& plans, const Tensor& input, const Box& box, const Plane& plane) {
  const int64_t K = static_cast<int64_t>(plans.size()), N = input.size(0), C = input.size(1), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  if (K == 0 || C == 0) return;
  if (is_channels_last(input)) {
    const int64_t cb = cl_box_channel_block(K, C), blocks = (C + cb - 1) / cb;
    parallel_tasks(K * blocks, [&](int64_t t) {
      const int64_t k = t / blocks, c0 = (t % blocks) * cb, nc = std::min(cb, C - c0);
      box(std::integral_constant<int64_t, 0>{}, k, c0, nc, in + plans[k].batch * sN + c0, sH, sW);
    });
    return;
  }
  tile_tasks<T, scalar_t>(plans, input, channel_block(N, C, kTileChannels),
                          [&](int64_t n, int64_t, int64_t c0, int64_t nc, const T* buf, const auto& boxes) {
                            if (buf) {
                              with_width(nc, [&](auto kN) {
                                for (const int64_t k : boxes) box(kN, k, c0, nc, buf, W * nc, nc);
                              });
                              return;
                            }
                            for (int64_t c = c0; c < c0 + nc; ++c) {
                              const scalar_t* p = in + n * sN + c * sC;  // rows contiguous: sW == 1, sH == W
                              for (const int64_t k : boxes) plane(k, c, p);
                            }
                          });
}

// The average-pooling forward of boxes [k0, k0 + plans.size()) of out, whose plans each
// bin's samples (PerBinPlan: deformable RoI pooling, Bezier alignment), in place or from
// tiles (forward_tasks).
template <typename T, typename scalar_t, typename PlanList>
void per_bin_forward(const PlanList& plans, const Tensor& input, int64_t k0, int64_t ph, int64_t pw, Tensor& out) {
  const int64_t C = input.size(1), W = input.size(3);
  const int64_t oK = out.stride(0), oC = out.stride(1), oH = out.stride(2), oW = out.stride(3);
  scalar_t* o = out.mutable_data_ptr<scalar_t>() + k0 * oK;
  if (plans.size() == 0 || C == 0) return;
  Scratch<T> acc;
  forward_tasks<T, scalar_t>(
      plans, input,
      [&](auto kN, int64_t k, int64_t c0, int64_t nc, const auto* img, int64_t vH, int64_t vW) {
        avg_forward_cl<kN>(plans[k], img, vH, vW, nc, ph, pw, acc.get(nc), o + k * oK + c0 * oC, oH, oW, oC);
      },
      // A plane of NCHW input is a channels-last image of one channel.
      [&](int64_t k, int64_t c, const scalar_t* plane) {
        avg_forward_cl<1>(plans[k], plane, W, 1, 1, ph, pw, static_cast<T*>(nullptr), o + k * oK + c * oC, oH, oW,
                          oC);
      });
}

// Bins [e0, e1) of n channels of one box's NCHW grad (or argmax; channel stride sC, bins
// contiguous) -> channels-last dst, bin e at dst + e * n.
template <int64_t kN, typename S, typename D>
ROIOPS_SIMD void bins_to_cl(const S* src, int64_t sC, int64_t n_, int64_t e0, int64_t e1, D* __restrict__ dst) {
  const int64_t n = kN ? kN : n_;
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t e = e0; e < e1; ++e) dst[e * n + c] = static_cast<D>(src[c * sC + e]);
  }
}

// A backward's input gradient: each task owns rows [y0, y1) x channels [c0, c0 + nc) of
// one image of gi and adds its boxes in increasing k (BackwardSplit, tiles.h), calling
// kernel(kN, p, g, am, gH, gW, nc, i0, i1, acc, y0, y1, bH, aW) for box plan p, its bin
// rows [i0, i1) that reach the band (bins_in_band) and its gradient g: bin (i, j),
// channel c at g + i * gH + j * gW + c (am likewise, the saved argmax of a max mode, or
// nullptr). channels_last: grad and argmax are read in place, by all the task's channels
// at once. NCHW: the band is a channels-last tile of a block of channels, and each box's
// block of grad (and argmax) is first transposed to channels-last scratch of type T.
// gi (of scalar type out_t) is fresh or holds the sums of earlier boxes (backward_chunks).
template <typename T, typename scalar_t, typename out_t, typename PlanList, typename Kernel>
void backward_bands(const PlanList& plans, const Tensor& grad, const int32_t* am_p, Tensor& gi, bool fresh,
                    int64_t ph, int64_t pw, const Kernel& kernel) {
  const int64_t N = gi.size(0), C = gi.size(1), H = gi.size(2), W = gi.size(3);
  if (gi.numel() == 0) return;
  const bool channels_last = is_channels_last(gi);
  std::vector<std::pair<int64_t, int64_t>> spans(plans.size());
  for (size_t k = 0; k < plans.size(); ++k) spans[k] = plans[k].row_span();
  const BackwardSplit split(N, C, H, W, sizeof(T), channels_last, batches(plans), spans);
  // grad and argmax share strides: box k, bin (i, j), channel c at k * gK + c * gC + i * gH + j * gW.
  const scalar_t* grad_p = grad.const_data_ptr<scalar_t>();
  const int64_t gK = grad.stride(0), gC = grad.stride(1), gH = grad.stride(2), gW = grad.stride(3);
  Scratch<T> gt;
  Scratch<int32_t> at_buf;
  for_each_band<T, out_t>(split, gi, fresh, [&](const BackwardSplit::Task& task, T* acc, int64_t aW) {
    const int64_t y0 = task.y0, y1 = task.y1, c0 = task.c0, nc = task.nc;
    const std::vector<int64_t>& list = split.bands.boxes[task.band];
    for (size_t q = 0; q < list.size(); ++q) {
      const int64_t k = list[q];
      const auto& p = plans[k];
      const auto [i0, i1] = p.bins_in_band(ph, y0, y1);
      const scalar_t* g = grad_p + k * gK + c0 * gC;
      const int32_t* am = am_p ? am_p + k * gK + c0 * gC : nullptr;
      if (q + 1 < list.size() && nc < C) {
        prefetch_block(grad_p + list[q + 1] * gK + c0 * gC, gC, gH, gW, nc, ph, pw);
        if (am_p) prefetch_block(am_p + list[q + 1] * gK + c0 * gC, gC, gH, gW, nc, ph, pw);
      }
      if (channels_last) {
        kernel(std::integral_constant<int64_t, 0>{}, p, g, am, gH, gW, nc, i0, i1, acc, y0, y1, W * aW, aW);
        continue;
      }
      T* gk = gt.get(ph * pw * nc);
      int32_t* ak = am_p ? at_buf.get(ph * pw * nc) : nullptr;
      with_width(nc, [&](auto kN) {
        bins_to_cl<kN>(g, gC, nc, i0 * pw, i1 * pw, gk);
        if (am_p) bins_to_cl<kN>(am, gC, nc, i0 * pw, i1 * pw, ak);
        kernel(kN, p, static_cast<const T*>(gk), static_cast<const int32_t*>(ak), pw * nc, nc, nc, i0, i1, acc, y0,
               y1, W * aW, aW);
      });
    }
  });
}

// The input gradient over K boxes in chunks [k0, next(k0)), in order: run(out, k0, k1,
// fresh) adds the boxes [k0, k1) into out (backward_bands), the first chunk starting it
// (fresh, also when K = 0), the others carrying on its sums, which are so those of one
// pass. float16/bfloat16 over several chunks carry on in a copy of the opmath type,
// rounded once at the end (out is then that copy).
template <typename scalar_t, typename Next, typename Run>
void backward_chunks(Tensor& gi, int64_t K, const Next& next, const Run& run) {
  using T = opmath_type<scalar_t>;
  auto chunks = [&](auto out_type, Tensor& out) {
    int64_t k0 = 0;
    do {
      const int64_t k1 = k0 < K ? next(k0) : K;
      run(out_type, out, k0, k1, k0 == 0);
      k0 = k1;
    } while (k0 < K);
  };
  if (std::is_same_v<T, scalar_t> || K == 0 || next(0) >= K) {
    chunks(scalar_t{}, gi);
  } else {
    Tensor acc = empty_output(sizes_of(gi), Options{scalar_type_of<T>, is_channels_last(gi)});
    chunks(T{}, acc);
    copy_into(gi, acc);
  }
}

// Channels per block of box_tasks: all of them for channels_last input, else kTileChannels.
inline int64_t box_task_block(const Tensor& input) {
  return is_channels_last(input) ? input.size(1) : std::min(input.size(1), kTileChannels);
}

// A pass that reads the map for each box with a result per box and block of channels
// (box_task_block), none depending on the thread count: box(k, blk, c0, nc, img, vC, vH,
// vW, planes) for every box whose plan is not empty, channel c of cell (y, x) at img +
// c * vC + y * vH + x * vW. channels_last: one task per box, reading its image in place.
// NCHW: (image, channel block) tasks, which copy the block into a channels-last tile that
// all the image's boxes read (vC = 1), or, where a tile does not pay, let them read the
// planes themselves (planes: true).
template <typename T, typename scalar_t, typename PlanList, typename Box>
void box_tasks(const PlanList& plans, const Tensor& input, const Box& box) {
  const int64_t K = static_cast<int64_t>(plans.size()), C = input.size(1), W = input.size(3);
  const int64_t sN = input.stride(0), sC = input.stride(1), sH = input.stride(2), sW = input.stride(3);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  if (K == 0 || C == 0) return;
  if (is_channels_last(input)) {
    parallel_tasks(K, [&](int64_t k) {
      if (!plans[k].empty()) box(k, 0, 0, C, in + plans[k].batch * sN, 1, sH, sW, false);
    });
    return;
  }
  tile_tasks<T, scalar_t>(plans, input, box_task_block(input),
                          [&](int64_t n, int64_t blk, int64_t c0, int64_t nc, const T* buf, const auto& boxes) {
                            for (const int64_t k : boxes) {
                              if (plans[k].empty()) continue;
                              if (buf) {
                                box(k, blk, c0, nc, buf, 1, W * nc, nc, false);
                              } else {
                                box(k, blk, c0, nc, in + n * sN + c0 * sC, sC, sH, sW, true);
                              }
                            }
                          });
}

}  // namespace roiops
