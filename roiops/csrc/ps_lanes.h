// The position-sensitive ops' data as vector lanes, for position_sensitive.h's tasks.
// Bin (i, j) of output channel c reads input channel (c * ph + i) * pw + j. For a fixed
// bin, consecutive output channels are ph * pw input channels apart, so the kernels keep
// one accumulator per output channel of a block and run their innermost loops along the
// block: each lane is one channel, summed in torchvision's order, so vectorising changes
// no bit. Where the boxes read each cell about once or more, the kernels first rearrange
// the map so that those lanes are contiguous (PsTile per task for NCHW, PsBand per band of
// rows for channels_last) and then load, sum and scatter whole vectors. Outputs are
// written (PsOutput) and the grad read (PsGradRows) with a bin's channels contiguous too.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "memory.h"
#include "simd.h"
#include "torch_api.h"

namespace roiops {

// Where a task's lanes lie: the L lanes (channels c0 ... of its block, contiguous) of cell
// (y, x) at data + y * sH + x * sW - org.
template <typename T>
struct PsLanes {
  T* data;
  int64_t org, sH, sW, L;

  PsLanes<const std::remove_const_t<T>> as_const() const { return {data, org, sH, sW, L}; }
};

// The first n lanes of v (all 8 if n > 8) to r, converted to scalar_t. Always inlined, so
// that it is compiled for the instruction set of the ROIOPS_SIMD caller.
template <typename T, typename scalar_t>
__attribute__((always_inline)) inline void ps_store_lanes(lanes8<T> v, int64_t n, scalar_t* r) {
  if constexpr (std::is_same_v<T, scalar_t>) {
    if (n >= 8) return store8(r, v);
  }
  // Unrolled with a test per lane: a plain copy loop would become a call to memcpy.
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    if (l < n) r[l] = static_cast<scalar_t>(v[l]);
  }
}

// f(V, c) for lanes [c, c + 8 * V) of nc lanes, V (a std::integral_constant) whole
// vectors of up to 4, covering the nc lanes: a lane sum walks a bin once per 4 vectors, with
// V independent add chains, instead of once per vector. Always inlined, so that it is
// compiled for the instruction set of the ROIOPS_SIMD caller.
template <typename F>
__attribute__((always_inline)) inline void ps_lane_blocks(int64_t nc, const F& f) {
  int64_t c = 0;
  for (; nc - c > 24; c += 32) f(std::integral_constant<int, 4>{}, c);
  switch ((nc - c + 7) / 8) {
    case 3: return f(std::integral_constant<int, 3>{}, c);
    case 2: return f(std::integral_constant<int, 2>{}, c);
    case 1: return f(std::integral_constant<int, 1>{}, c);
    default: return;
  }
}

// A task's cells as a tile: the nc channels of cell (y, x) of rows [y0, y1) (all W
// columns) at ((y - y0) * W + x) * lanes, lanes = nc rounded up to whole vectors (padding
// lanes hold 0). Along a bin's output channels an NCHW map is strided (ph * pw planes
// apart); in the tile each tap of a sample is one contiguous run, so sums and scatters run
// on whole vectors, each lane one channel in the order it had. A task copies its rows in
// (forward) or out (backward) once, which pays when its boxes read each cell about once
// or more (ps_use_tile).
struct PsTile {
  int64_t y0, y1, W, lanes;

  PsTile(int64_t nc, int64_t W_) : y0(INT64_MAX), y1(INT64_MIN), W(W_), lanes((nc + 7) / 8 * 8) {}
  // Grows to cover rows [ya, yb).
  void cover(int64_t ya, int64_t yb) { y0 = std::min(y0, ya), y1 = std::max(y1, yb); }
  int64_t cells() const { return y1 > y0 ? (y1 - y0) * W : 0; }
  int64_t row_stride() const { return W * lanes; }
  int64_t origin() const { return y0 * W * lanes; }
  int64_t size() const { return cells() * lanes; }
  template <typename T>
  PsLanes<T> view(T* tile) const {
    return {tile, origin(), row_stride(), lanes, lanes};
  }
};

// Tile t of the nc channel planes at base + c * cs (contiguous H x W planes), each pass
// prefetching the next (transpose_block's kPrefetch).
template <typename scalar_t, typename T>
ROIOPS_SIMD void ps_load_tile(const scalar_t* base, int64_t cs, int64_t nc, const PsTile& t, T* __restrict__ tile) {
  transpose_block</*kPadRows=*/true, /*kReadPastCols=*/false, /*kColsOuter=*/false, /*kPrefetch=*/true>(
      base + t.y0 * t.W, cs, nc, t.cells(), tile, t.lanes);
}

// Tile t back to the nc channel planes at base + c * cs (contiguous H x W planes; PsBackward::store).
template <typename T>
ROIOPS_SIMD void ps_store_tile(const T* __restrict__ tile, const PsTile& t, int64_t nc, T* base, int64_t cs) {
  transpose_block</*kPadRows=*/false, /*kReadPastCols=*/true, /*kColsOuter=*/true>(tile, t.lanes, t.cells(), nc,
                                                                                   base + t.y0 * t.W, cs);
}

// A forward task's lanes: tile t of its nc planes at base + c * cs, loaded into scratch.
template <typename scalar_t, typename T>
PsLanes<const T> ps_forward_tile(const PsTile& t, const scalar_t* base, int64_t cs, int64_t nc, Scratch<T>& scratch) {
  T* tile = scratch.get(t.size());
  ps_load_tile(base, cs, nc, t, tile);
  return t.view<const T>(tile);
}

// A band task (ps_forward_bands, ps_backward_bands): image n, rows [r0, r1), output
// channels [c0, c0 + nc) in `lanes` lanes (whole vectors). Its buffer holds, for each cell
// (y, x) of its rows, bins x lanes values: bin b's lane c (input channel
// (c0 + c) * bins + b) at ((y - r0) * W + x) * cell + b * lanes + c, cell = bins * lanes.
struct PsBand {
  int64_t n, r0, r1, c0, nc, lanes, W, bins;
  int64_t cell() const { return bins * lanes; }
  int64_t size() const { return (r1 - r0) * W * cell(); }
  // Where bin b's lanes of cell (y, x) lie in buf (y within the band).
  template <typename T>
  T* at(T* buf, int64_t y, int64_t x, int64_t b) const {
    return buf + ((y - r0) * W + x) * cell() + b * lanes;
  }
  // Bin b's lanes in buf, as a task's lanes (y within the band).
  template <typename T>
  PsLanes<T> view(T* buf, int64_t b) const {
    return {buf + b * lanes, r0 * W * cell(), W * cell(), cell(), lanes};
  }
};

// Band b's buffer into the channels-last gradient gn (image n, channel c0 * bins): each
// cell's bins x nc values transposed in registers into its nc * bins contiguous channels,
// after each row's channels were zeroed by memset (PsBackward::zero_rows says why).
template <typename T>
ROIOPS_SIMD void ps_store_band(const T* buf, const PsBand& b, T* gn, int64_t sH, int64_t sW) {
  const int64_t run = b.nc * b.bins;
  for (int64_t y = b.r0; y < b.r1; ++y) {
    if (sW == run) {  // the block is all channels: the row is one run
      std::memset(gn + y * sH, 0, static_cast<size_t>(b.W * run) * sizeof(T));
    } else {
      for (int64_t x = 0; x < b.W; ++x) std::memset(gn + y * sH + x * sW, 0, static_cast<size_t>(run) * sizeof(T));
    }
    for (int64_t x = 0; x < b.W; ++x) {
      transpose_block</*kPadRows=*/false, /*kReadPastCols=*/true>(b.at(buf, y, x, 0), b.lanes, b.bins, b.nc,
                                                                  gn + y * sH + x * sW, b.bins);
    }
  }
}

// Band b's rows of the channels-last map xn (image n, channel c0 * bins) into its buffer:
// each cell's nc * bins channels transposed in registers into bins x lanes values, one
// group of 8 channels at a time, and before each group a share of the next cell's run is
// prefetched, so that its lines arrive while this cell is transposed: a cell's run is a few
// KiB, read from memory when the map is not in cache. The prefetches are spread over the
// groups, not issued at once, so that they do not wait for each other's fill buffers.
template <typename scalar_t, typename T>
ROIOPS_SIMD void ps_load_band(const scalar_t* xn, int64_t sH, int64_t sW, const PsBand& b, T* buf) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(scalar_t));
  const int64_t run = b.nc * b.bins, groups = (b.nc + 7) / 8;
  const int64_t share = (run + groups * kLine - 1) / (groups * kLine) * kLine;  // a group's prefetches, whole lines
  for (int64_t y = b.r0; y < b.r1; ++y) {
    for (int64_t x = 0; x < b.W; ++x) {
      const scalar_t* cell = xn + y * sH + x * sW;
      // The band's next cell: the next in the row, or the next row's first.
      const scalar_t* next = x + 1 < b.W ? cell + sW : y + 1 < b.r1 ? xn + (y + 1) * sH : nullptr;
      for (int64_t g = 0; g < groups; ++g) {
        if (next) {
          for (int64_t q = g * share; q < std::min(run, (g + 1) * share); q += kLine) __builtin_prefetch(next + q);
        }
        transpose_block</*kPadRows=*/true, /*kReadPastCols=*/false>(cell + g * 8 * b.bins, b.bins,
                                                                   std::min<int64_t>(8, b.nc - g * 8), b.bins,
                                                                   b.at(buf, y, x, 0) + g * 8, b.lanes);
      }
    }
  }
}

// Strides of an [N, C, H, W] tensor (or of [K, C_out, ph, pw]).
struct Strides {
  int64_t n, c, h, w;
  Strides(int64_t n_, int64_t c_, int64_t h_, int64_t w_) : n(n_), c(c_), h(h_), w(w_) {}
  explicit Strides(const Tensor& t) : Strides(t.stride(0), t.stride(1), t.stride(2), t.stride(3)) {}
};

// Where forward tasks write: the output itself when a bin's output channels are
// contiguous there (channels_last, or one output channel), else a bin-major buffer that
// finish() copies into it. Values of box k, bin b, output channels from c0 on: row(b, k) + c0.
template <typename scalar_t>
class PsOutput {
 public:
  explicit PsOutput(Tensor& out) : out_(out) {
    const int64_t K = out.size(0), C_out = out.size(1);
    if (out.size(1) == 1 || out.stride(1) == 1) {  // bin b at b * stride(3) (outputs are dense)
      base_ = out.mutable_data_ptr<scalar_t>(), sK_ = out.stride(0), sB_ = out.stride(3);
    } else {
      // 7 elements of padding: finish() reads whole vectors past a box's C_out values.
      buffer_ = empty_output({out.size(2) * out.size(3) * K * C_out + 7}, Options{out.scalar_type()});
      base_ = buffer_.mutable_data_ptr<scalar_t>(), sK_ = C_out, sB_ = K * C_out;
    }
  }
  scalar_t* row(int64_t bin, int64_t k) const { return base_ + k * sK_ + bin * sB_; }
  void finish() {
    if (!buffer_.defined()) return;
    const scalar_t* src = buffer_.const_data_ptr<scalar_t>();
    scalar_t* dst = out_.mutable_data_ptr<scalar_t>();
    parallel_for(0, out_.size(0), 16, [&](int64_t k0, int64_t k1) { boxes_out(src, dst, k0, k1); });
  }

 private:
  // Boxes [k0, k1): each a bins x C_out block of the buffer (rows K * C_out apart) to its
  // C_out x bins block of the NCHW output, in 8 x 8 register transposes.
  ROIOPS_SIMD void boxes_out(const scalar_t* src, scalar_t* dst, int64_t k0, int64_t k1) const {
    const int64_t K = out_.size(0), C_out = out_.size(1), bins = out_.size(2) * out_.size(3);
    for (int64_t k = k0; k < k1; ++k) {
      transpose_block<false, true>(src + k * C_out, K * C_out, bins, C_out, dst + k * C_out * bins, bins);
    }
  }

  Tensor& out_;
  Tensor buffer_;
  scalar_t* base_;
  int64_t sK_, sB_;
};

// The grad ([K, C_out, ph, pw]) as backward tasks read it: box k's value of output channel
// c in bin (i, j) at data + k * s.n + c * s.c + i * s.h + j * s.w. A channels-last grad is
// read where it lies; an NCHW one, whose channels of a bin are ph * pw apart (a cache line
// each, read by every task of that bin), is first copied bin-major, [ph, pw, K, C_out rounded
// up to whole vectors], so that a task reads each box's channels as one contiguous run.
template <typename scalar_t>
class PsGradRows {
 public:
  explicit PsGradRows(const Tensor& grad) : data(grad.const_data_ptr<scalar_t>()), s(grad) {
    const int64_t K = grad.size(0), C_out = grad.size(1), pw = grad.size(3), bins = grad.size(2) * pw;
    if (s.c == 1 || C_out == 1 || grad.numel() == 0 || !grad.is_contiguous()) return;
    const int64_t row = (C_out + 7) / 8 * 8;
    buffer_ = empty_output({bins * K * row}, Options{grad.scalar_type()});
    const scalar_t* src = data;
    scalar_t* dst = buffer_.mutable_data_ptr<scalar_t>();
    parallel_for(0, K, 16, [&](int64_t k0, int64_t k1) { boxes_in(src, dst, K, C_out, bins, row, k0, k1); });
    data = dst, s = Strides(row, 1, pw * K * row, K * row);
  }

  const scalar_t* data;
  Strides s;

 private:
  // Boxes [k0, k1): each a C_out x bins block of the contiguous grad to its bins x C_out
  // block of the buffer (rows K * row apart), in 8 x 8 register transposes; the rows'
  // padding gets zeros.
  ROIOPS_SIMD static void boxes_in(const scalar_t* src, scalar_t* dst, int64_t K, int64_t C_out, int64_t bins,
                                   int64_t row, int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      transpose_block</*kPadRows=*/true, /*kReadPastCols=*/false>(src + k * C_out * bins, bins, C_out, bins,
                                                                  dst + k * row, K * row);
    }
  }

  Tensor buffer_;
};

}  // namespace roiops
