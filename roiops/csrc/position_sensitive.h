// What the position-sensitive ops (R-FCN's PSRoIAlign and PSRoIPool) share on the CPU:
// the channel rule, their checked arguments, their tasks, and the forward and backward
// drivers (ps_forward, ps_backward), which run either op from the parts its .cpp gives for
// one box and bin. The rearranged maps, outputs and gradients that the tasks read and
// write, and the copies that make them, are ps_lanes.h's.
//
// Tasks (ps_tasks) are one bin of a block of output channels of one image; backward ones
// add the image's boxes in increasing k: deterministic, no atomics, any thread count.
// Band tasks own rows of all bins instead: a forward one sums whole bin rows
// (ps_forward_bands), a backward one adds into its rows in increasing k (ps_backward_bands).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "args.h"
#include "checks.h"
#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "ps_lanes.h"
#include "tiles.h"

namespace roiops {

// C_out, the output channels: the input's C must be C_out * ph * pw.
inline int64_t ps_out_channels(int64_t C, int64_t ph, int64_t pw) {
  ROIOPS_CHECK(C % (ph * pw) == 0, "roiops: input channels (", C, ") must be a multiple of pooled_height * ",
                    "pooled_width (", ph, " * ", pw, ")");
  return C / (ph * pw);
}

// Output channels per task: up to 64 (one accumulator array in L1), fewer when the tasks
// would not keep the threads busy; a multiple of 8 unless all of them.
inline int64_t ps_channel_block(int64_t groups, int64_t C_out) {
  const int64_t want = 2 * num_threads();
  int64_t cb = std::min<int64_t>(C_out, 64);
  while (cb > 8 && groups * ((C_out + cb - 1) / cb) < want) cb = (cb + 1) / 2;
  // Whole vectors of lanes per block: only the last block's tiles have padding lanes.
  return cb < C_out ? (cb + 7) / 8 * 8 : std::max<int64_t>(cb, 1);
}

// Batch indices of the (checked) rois.
inline std::vector<int64_t> ps_batch(const Tensor& rois) {
  std::vector<int64_t> batch(static_cast<size_t>(rois.size(0)));
  ROIOPS_DISPATCH_FLOAT(rois.scalar_type(), [&] {
    const scalar_t* r = rois.const_data_ptr<scalar_t>();
    for (size_t k = 0; k < batch.size(); ++k) batch[k] = static_cast<int64_t>(r[5 * k]);
  });
  return batch;
}

// Tasks: image n, bin (i, j) = (bin / pw, bin % pw), output channels [c0, c0 + nc), which
// name the input channels (c * ph + i) * pw + j that the task reads (forward) or writes
// (backward); f(n, bin, c0, nc, boxes of image n) for each, on all threads. Those planes
// stay in cache while every box of the image runs, in increasing k, and no two backward
// tasks write the same element. A task writes its outputs of one box as a contiguous run
// in bin-major order [ph, pw, K, C_out] (PsOutput); backward tasks read grad where it
// lies (channels_last: contiguous too).
template <typename F>
void ps_tasks(const std::vector<int64_t>& batch, int64_t N, int64_t C_out, int64_t bins, const F& f) {
  const std::vector<std::vector<int64_t>> by_image = boxes_by_image(batch, N);
  const int64_t cb = ps_channel_block(N * bins, C_out), blocks = (C_out + cb - 1) / cb;
  parallel_tasks(N * bins * blocks, [&](int64_t t) {
    const int64_t n = t / (bins * blocks), bin = t / blocks % bins, c0 = t % blocks * cb;
    f(n, bin, c0, std::min(cb, C_out - c0), by_image[n]);
  });
}

// A forward's checked arguments (sampling_ratio: the op's, if it has one): input in its
// layout, rois contiguous in the opmath type, C_out, and the output to fill
// ([K, C_out, ph, pw] in the input's layout).
struct PsForward {
  Tensor input, rois, out;
  int64_t C_out;

  PsForward(const Tensor& input_, const Tensor& rois_, double spatial_scale, int64_t ph, int64_t pw,
            std::optional<int64_t> sampling_ratio) {
    check_forward_args(input_, rois_, 5, spatial_scale, ph, pw);
    if (sampling_ratio) check_sampling_ratio(*sampling_ratio);
    C_out = ps_out_channels(input_.size(1), ph, pw);
    const ForwardArgs a(input_, rois_, spatial_scale);
    input = a.input;
    rois = a.rois;
    out = empty_output({rois.size(0), C_out, ph, pw}, a.out_options);
  }
};

// A backward's checked arguments (sampling_ratio: the op's, if it has one): grad in the
// gradient's layout, rois contiguous in the opmath type, and the opmath accumulator of the
// [N, C, H, W] gradient (result() gives it the grad's dtype), not zeroed: channels_last
// kernels that add in place call clear(); NCHW planes are zeroed by the task that owns
// them (storage() or store()).
struct PsBackward {
  Tensor grad, rois, acc;

  PsBackward(const Tensor& grad_, const Tensor& rois_, double spatial_scale, int64_t ph, int64_t pw,
             int64_t N, int64_t C, int64_t H, int64_t W, bool channels_last, std::optional<int64_t> sampling_ratio) {
    check_backward_args(grad_, rois_, 5, N, C, H, W, spatial_scale, ph, pw);
    if (sampling_ratio) check_sampling_ratio(*sampling_ratio);
    const int64_t C_out = ps_out_channels(C, ph, pw);
    check_grad_shape(grad_, rois_.size(0), C_out, ph, pw);
    const BackwardArgs a(grad_, rois_, N, spatial_scale, channels_last);
    grad = a.grad;
    rois = a.rois;
    const ScalarType opmath = grad.scalar_type() == kDouble ? kDouble : kFloat;
    acc = empty_output({N, C, H, W}, a.grad_options.dtype(opmath));
  }

  // Zeroes a channels_last accumulator for kernels that add into it in place.
  void clear() const {
    if (is_channels_last(acc)) fill_zero(acc);
  }

  // Where a backward task accumulates on NCHW planes: when `lanes`, a zeroed tile t of its
  // planes at base + c * cs, which store() writes back, else on its planes in place,
  // zeroed here. Sets v to the tile's lanes; returns scratch for the task's grad values:
  // v.L lanes with the padding zeroed, or `in_place` values in place.
  template <typename T>
  T* storage(bool lanes, const PsTile& t, T* base, int64_t cs, int64_t nc, int64_t in_place, Scratch<T>& scratch,
             PsLanes<T>& v) const {
    if (!lanes) {
      zero_rows(base, cs, nc, 0, acc.size(2));
      return scratch.get(in_place);
    }
    T* tile = scratch.get(t.size() + t.lanes);
    std::fill_n(tile, t.size(), T(0));
    v = t.view(tile);
    T* g = tile + t.size();
    std::fill_n(g + nc, v.L - nc, T(0));
    return g;
  }

  // A tile task's last step: tile t's rows written into its planes and the rows outside
  // the tile zeroed, so that each element is written once.
  template <typename T>
  void store(const T* tile, const PsTile& t, T* base, int64_t cs, int64_t nc) const {
    zero_rows(base, cs, nc, 0, t.y0);
    zero_rows(base, cs, nc, t.y1, acc.size(2));
    ps_store_tile(tile, t, nc, base, cs);
  }

  Tensor result() const { return acc.scalar_type() == grad.scalar_type() ? acc : to_dtype(acc, grad.scalar_type()); }

 private:
  // Zeroes rows [r0, r1) of a task's nc NCHW planes (cs apart) at base: the first step of
  // a task that adds in place (the planes are then in cache), the last of a tile task
  // (store). memset (rep stosb on x86) can claim whole cache lines without reading them
  // from memory; vector stores into lines not in cache read them first.
  template <typename T>
  void zero_rows(T* base, int64_t cs, int64_t nc, int64_t r0, int64_t r1) const {
    if (is_channels_last(acc) || r1 <= r0) return;
    const int64_t W = acc.size(3);
    for (int64_t c = 0; c < nc; ++c) {
      std::memset(base + c * cs + r0 * W, 0, static_cast<size_t>((r1 - r0) * W) * sizeof(T));
    }
  }
};

// A lane copied into a tile (8 x 8 transposes of NCHW planes) costs about a third of a
// lane gathered from the map: the copy reads and writes whole vectors.
constexpr int64_t kPsCopyGain = 3;

// Tiles hold at most this many bytes (they are a task's working set).
constexpr int64_t kPsTileBytes = int64_t(4) << 20;

// Whether a task of nc channels whose boxes read `reads` cells (summed over boxes) of a
// contiguous NCHW map goes through a tile of T: when the copy writes no more than
// kPsCopyGain lanes per lane the reads would gather (padding lanes count: 1 channel fills
// 1 lane of 8).
template <typename T>
bool ps_use_tile(const PsTile& t, int64_t reads, int64_t nc) {
  return t.cells() > 0 && t.size() <= kPsCopyGain * reads * nc &&
         t.size() * static_cast<int64_t>(sizeof(T)) <= kPsTileBytes;
}

// Bytes of a band's buffer, unless one row needs more: small enough to stay in a core's L2
// while the band's boxes read it, large enough that few bin rows cross bands.
constexpr int64_t kPsBandBytes = int64_t(1) << 20;

// Rows per band of an H-row map whose rows take row_bytes of buffer each: the buffer
// within kPsBandBytes (at least one row), and enough tasks for all threads when each
// band makes `per_band` of them.
inline int64_t ps_band_rows(int64_t H, int64_t row_bytes, int64_t per_band) {
  int64_t R = std::clamp<int64_t>(kPsBandBytes / row_bytes, 1, std::max<int64_t>(H, 1));
  while (R > 1 && per_band * ((H + R - 1) / R) < 2 * num_threads()) R = (R + 1) / 2;
  return R;
}

// Whether a channels_last backward goes by bands (ps_backward_bands): the buffers' lanes
// (each about a third of an add in place, like a tile's copy) are no more than kPsCopyGain
// per channel that the boxes' `reads` (cells or taps, over all bins) add in place.
inline bool ps_use_bands(const Tensor& acc, int64_t reads, int64_t C_out, int64_t bins) {
  return acc.stride(1) == 1 &&
         acc.size(0) * acc.size(2) * acc.size(3) * bins * ((C_out + 7) / 8 * 8) <= kPsCopyGain * reads * C_out;
}

// The backward into a channels_last gradient acc ([N, C_out * bins, H, W], every element
// written), by bands of rows: add(band, boxes, buf, g) adds the terms of `boxes` (those of
// the band's image whose rows span[k] meet the band, in increasing k) into the band's
// zeroed buffer (PsBand), g being scratch for lanes values with the padding zeroed; then
// each cell's block is transposed into the gradient. In the gradient itself a cell's
// channels of one bin are bins apart (one scalar add each); in the buffer they are whole
// vectors, and no pass zeroes the gradient. Each element is summed by one task, in
// increasing k: deterministic for any thread count.
template <typename T, typename F>
void ps_backward_bands(const std::vector<int64_t>& batch, const std::vector<std::pair<int64_t, int64_t>>& spans,
                       int64_t C_out, int64_t bins, const Tensor& acc, const F& add) {
  if (acc.numel() == 0) return;
  const int64_t N = acc.size(0), H = acc.size(2), W = acc.size(3);
  const int64_t cb = ps_channel_block(N * H, C_out), blocks = (C_out + cb - 1) / cb;
  const int64_t row_bytes = W * bins * ((cb + 7) / 8 * 8) * static_cast<int64_t>(sizeof(T));
  const int64_t R = ps_band_rows(H, row_bytes, N * blocks);
  const Bands bands(N, H, row_bytes, R * row_bytes, batch, spans);
  const Strides a(acc);
  T* acc_p = acc.mutable_data_ptr<T>();
  Scratch<T> scratch;
  parallel_tasks(static_cast<int64_t>(bands.boxes.size()) * blocks, [&](int64_t t) {
    const int64_t nb = t / blocks;
    PsBand b{nb / bands.per_image, nb % bands.per_image * bands.rows, 0, t % blocks * cb, 0, 0, W, bins};
    b.r1 = std::min(H, b.r0 + bands.rows), b.nc = std::min(cb, C_out - b.c0), b.lanes = (b.nc + 7) / 8 * 8;
    T* buf = scratch.get(b.size() + b.lanes);
    std::fill_n(buf, b.size() + b.lanes, T(0));
    add(b, bands.boxes[nb], buf, buf + b.size());
    ps_store_band(buf, b, acc_p + b.n * a.n + b.c0 * bins * a.c, a.h, a.w);
  });
}

// A forward band pays when it copies no more than this many lanes per lane the boxes would
// gather from a channels_last map, where each lane is a cache line of its own (a copied
// lane is a fraction of that cost, kPsCopyGain).
constexpr int64_t kPsBandGain = 6;

// Output channels per forward band task. A task copies each cell's run of them (their
// channels are contiguous in the map) and sums them per bin in one pass: the more channels
// a task takes, the longer that run and the fewer the passes over each bin's samples, up
// to where a band's buffer of several cells no longer fits in L2. 32 takes all classes of
// a 21-class head (24 lanes) at once.
constexpr int64_t kPsBandChannels = 32;

// The part of a bin row that one band sums (ps_forward_bands): the terms of rows
// [ya, yb). A bin row that spans several bands is summed in each, top to bottom: carry
// holds its running sums (pw bins x the band's lanes) between them; `first`: start from
// zero, not from carry; `last`: finish (divide and write the output), not store into
// carry. A bin row within one band is one part, first and last, with no carry.
template <typename T>
struct PsRowPart {
  int64_t ya, yb;
  T* carry;
  bool first, last;

  // Bin j's running sums in a band of `lanes` lanes, or none.
  T* carry_of(int64_t j, int64_t lanes) const { return carry ? carry + j * lanes : nullptr; }
};

// The forward from a channels_last map by bands of rows. Bin row i of box k reads rows
// rows(k, i) = {first, last} (first > last: none). A task (image n, band, block of up to
// kPsBandChannels output channels) copies the band's rows (and `reach` rows below, for
// terms that also read the next rows: a sample's y_high) into PsBand's layout, each cell's
// nc x bins block transposed in registers, then calls sum(band, buf, k, i, part) for each
// part of a bin row in the band (PsRowPart), in increasing k within the two groups below.
// In the map a bin's output channels are bins apart, a cache line each; in the buffer they
// are whole vectors, and each cell is copied once instead of being gathered by every bin
// that reads it. (Bands that copied every row their bin rows read would copy map rows more
// than once each where bin rows cross bands.) A band's task
// copies its rows and sums the parts that start a bin row, then waits for the band above
// (same image and channels) to finish before it sums the parts that continue one, so each
// sum still adds its terms in order, whatever the thread count, and the bands' copies run
// side by side. Tasks are handed out in increasing order and wait only on earlier ones,
// already taken by a running thread, so none waits for ever. Returns false, running
// nothing, when the copies would cost more than the boxes' `reads` (cells or taps, over all
// bins) gathered in place.
template <typename T, typename scalar_t, typename Rows, typename Sum>
bool ps_forward_bands(const Tensor& input, const std::vector<int64_t>& batch, int64_t C_out, int64_t ph,
                      int64_t pw, int64_t reads, int64_t reach, const Rows& rows, const Sum& sum) {
  const int64_t N = input.size(0), H = input.size(2), W = input.size(3), bins = ph * pw, K = batch.size();
  const int64_t cb = std::min(C_out, kPsBandChannels), blocks = (C_out + cb - 1) / cb, L = (cb + 7) / 8 * 8;
  const int64_t R = ps_band_rows(H, W * bins * L * static_cast<int64_t>(sizeof(T)), N * blocks);
  const int64_t per_image = (H + R - 1) / R;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> parts(static_cast<size_t>(N * per_image));
  std::vector<std::pair<int64_t, int64_t>> span(parts.size(), {H, 0});  // rows [first, end) a band copies
  // Each bin row that crosses bands, its index among them (-1: none).
  std::vector<int64_t> crossing(static_cast<size_t>(K * ph), -1);
  int64_t crossings = 0;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t i = 0; i < ph; ++i) {
      const auto [first, last] = rows(k, i);
      const size_t b0 = static_cast<size_t>(batch[k] * per_image);
      if (first > last) {  // reads nothing: the image's first band writes its zeros
        parts[b0].emplace_back(k, i);
        continue;
      }
      if (first / R != last / R) crossing[static_cast<size_t>(k * ph + i)] = crossings++;
      for (int64_t q = first / R; q <= last / R; ++q) {
        const size_t b = b0 + static_cast<size_t>(q);
        parts[b].emplace_back(k, i);
        span[b] = {std::min(span[b].first, std::max(first, q * R)),
                   std::max(span[b].second, std::min(last + 1, q * R + R + reach))};
      }
    }
  }
  int64_t copied = 0;
  for (const auto& [first, end] : span) copied += std::max<int64_t>(end - first, 0) * W;
  if (copied * bins * blocks * L > kPsBandGain * reads * C_out) return false;
  const Strides s(input);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  const int64_t tasks = static_cast<int64_t>(parts.size()) * blocks;
  // Running sums of the bin rows that cross bands: [block][crossing][pw bins][L lanes], each
  // written by a bin row's first part before any other part reads it.
  std::unique_ptr<T[]> carry(new T[static_cast<size_t>(std::max<int64_t>(blocks * crossings * pw * L, 1))]);
  std::unique_ptr<std::atomic<bool>[]> done(new std::atomic<bool>[static_cast<size_t>(tasks)]);
  for (int64_t t = 0; t < tasks; ++t) done[t].store(false, std::memory_order_relaxed);
  Scratch<T> scratch;
  parallel_tasks(tasks, [&](int64_t t) {
    // Marked done however the task ends, so that no later task waits for ever.
    struct Mark {
      std::atomic<bool>& flag;
      ~Mark() { flag.store(true, std::memory_order_release); }
    } mark{done[t]};
    const size_t nb = static_cast<size_t>(t / blocks);
    if (parts[nb].empty()) return;  // then no bin row crosses this band
    const int64_t c0 = t % blocks * cb;
    PsBand b{static_cast<int64_t>(nb) / per_image, span[nb].first, std::max(span[nb].first, span[nb].second),
             c0, std::min(cb, C_out - c0), L, W, bins};
    T* buf = scratch.get(std::max<int64_t>(b.size(), 1));
    ps_load_band(in + b.n * s.n + c0 * bins * s.c, s.h, s.w, b, buf);
    const int64_t r0 = static_cast<int64_t>(nb) % per_image * R;
    // The parts that start a bin row (continuing = false) or that continue one.
    const auto sum_parts = [&](bool continuing) {
      for (const auto& [k, i] : parts[nb]) {
        const auto [first, last] = rows(k, i);
        PsRowPart<T> part{first, last + 1, nullptr, true, true};
        const int64_t x = crossing[static_cast<size_t>(k * ph + i)];
        if (x >= 0) {
          part.ya = std::max(first, r0), part.yb = std::min(last + 1, r0 + R);
          part.first = part.ya == first, part.last = part.yb == last + 1;
          part.carry = carry.get() + (t % blocks * crossings + x) * pw * L;
        }
        if (part.first != continuing) sum(b, static_cast<const T*>(buf), k, i, part);
      }
    };
    sum_parts(false);
    if (nb % per_image != 0) {
      while (!done[t - blocks].load(std::memory_order_acquire)) std::this_thread::yield();
      sum_parts(true);
    }
  });
  return true;
}

// The two drivers below run an op from its parts, Parts<scalar_t> (T its opmath type),
// built once per call from (rois, spatial_scale, ph, pw, H, W, the op's own arguments):
//   reads(): the taps (or cells) of all boxes over all bins, as a forward reads them;
//   cover(boxes, i, j, t): grows tile t over the cells that bin (i, j) of `boxes` reads
//     (forward) or writes (backward), and returns how many reads that takes (ps_use_tile);
// forward:
//   may_use_bands(), kReach, bin_rows(k, i): whether a channels_last map may go by bands,
//     and ps_forward_bands's reach and rows;
//   sum_row(band, buf, k, i, part, out): ps_forward_bands's sum, written to out (PsOutput);
//   tile_bins(v, boxes, i, j, c0, nc, out): bin (i, j) of `boxes` from a tile's lanes v;
//   bin_means(k, i, j, base, cs, s, nc, acc, r): box k's bin (i, j) of the nc planes at
//     base + c * cs (strides s) into r, with nc values of scratch at acc;
// backward:
//   row_span(k): {first, last} map rows that box k writes to (first > last: none);
//   add_band(band, boxes, grad, buf, g): a band's terms (ps_backward_bands; grad: PsGradRows);
//   scratch(nc): the values of scratch a task that adds in place needs;
//   add_bin(k, i, j, gk, gc, nc, d, v, base, cs, a): box k's bin (i, j) of grad (nc
//     channels gc apart from gk) added to the lanes v of a tile (when v.data) or to the nc
//     planes at base + c * cs (strides a) in place; d is the task's scratch (storage()).

// A forward: a channels_last map by bands where the op allows them and they pay, otherwise
// by ps_tasks, on a tile of each task's planes where that pays.
template <typename scalar_t, typename Parts>
void ps_forward_impl(PsForward& args, int64_t ph, int64_t pw, const Parts& op) {
  using T = opmath_type<scalar_t>;
  const Tensor& input = args.input;
  const int64_t N = input.size(0), W = input.size(3), bins = ph * pw;
  const Strides s(input);
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  PsOutput<scalar_t> out(args.out);
  const std::vector<int64_t> batch = ps_batch(args.rois);
  if (s.w != 1 && op.may_use_bands()) {
    const auto rows = [&](int64_t k, int64_t i) { return op.bin_rows(k, i); };
    const auto sum = [&](const PsBand& band, const T* buf, int64_t k, int64_t i, const PsRowPart<T>& part) {
      op.sum_row(band, buf, k, i, part, out);
    };
    if (ps_forward_bands<T, scalar_t>(input, batch, args.C_out, ph, pw, op.reads(), Parts::kReach, rows, sum)) return;
  }
  Scratch<T> scratch;
  const auto task = [&](int64_t n, int64_t bin, int64_t c0, int64_t nc, const std::vector<int64_t>& boxes) {
    const int64_t i = bin / pw, j = bin % pw, cs = bins * s.c;
    const scalar_t* base = in + n * s.n + (c0 * bins + bin) * s.c;
    PsTile t(nc, W);
    if (s.w == 1 && ps_use_tile<T>(t, op.cover(boxes, i, j, t), nc)) {
      op.tile_bins(ps_forward_tile(t, base, cs, nc, scratch), boxes, i, j, c0, nc, out);
      return;
    }
    T* acc = scratch.get(nc);
    for (const int64_t k : boxes) op.bin_means(k, i, j, base, cs, s, nc, acc, out.row(bin, k) + c0);
  };
  ps_tasks(batch, N, args.C_out, bins, task);
  out.finish();
}

// A backward: a channels_last gradient by bands where they pay (ps_use_bands), otherwise by
// ps_tasks, on a tile of each task's planes where that pays.
template <typename scalar_t, typename Parts>
void ps_backward_impl(const PsBackward& args, int64_t ph, int64_t pw, const Parts& op) {
  using T = opmath_type<scalar_t>;
  const int64_t N = args.acc.size(0), W = args.acc.size(3), C_out = args.grad.size(1), bins = ph * pw;
  const PsGradRows<scalar_t> grad(args.grad);
  const std::vector<int64_t> batch = ps_batch(args.rois);
  if (ps_use_bands(args.acc, op.reads(), C_out, bins)) {
    std::vector<std::pair<int64_t, int64_t>> spans(batch.size());
    for (size_t k = 0; k < spans.size(); ++k) spans[k] = op.row_span(static_cast<int64_t>(k));
    ps_backward_bands<T>(batch, spans, C_out, bins, args.acc,
                         [&](const PsBand& band, const std::vector<int64_t>& boxes, T* buf, T* g) {
                           op.add_band(band, boxes, grad, buf, g);
                         });
    return;
  }
  args.clear();
  const Strides a(args.acc), &gs = grad.s;
  T* acc_p = args.acc.template mutable_data_ptr<T>();
  Scratch<T> scratch;
  const auto task = [&](int64_t n, int64_t bin, int64_t c0, int64_t nc, const std::vector<int64_t>& boxes) {
    const int64_t i = bin / pw, j = bin % pw, cs = bins * a.c;
    T* base = acc_p + n * a.n + (c0 * bins + bin) * a.c;
    PsTile t(nc, W);
    PsLanes<T> v{};
    const bool lanes = a.w == 1 && ps_use_tile<T>(t, op.cover(boxes, i, j, t), nc);
    T* d = args.storage(lanes, t, base, cs, nc, op.scratch(nc), scratch, v);
    for (const int64_t k : boxes) {
      op.add_bin(k, i, j, grad.data + k * gs.n + c0 * gs.c + i * gs.h + j * gs.w, gs.c, nc, d, v, base, cs, a);
    }
    if (lanes) args.store(v.data, t, base, cs, nc);
  };
  ps_tasks(batch, N, C_out, bins, task);
}

// A position-sensitive op's forward entry point: checked arguments (sampling_ratio: the
// op's, if it has one), then its driver in the input's dtype with the op's Parts (extra:
// the op's own arguments).
template <template <typename> class Parts, typename... Extra>
Tensor ps_forward(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                  std::optional<int64_t> sampling_ratio, Extra... extra) {
  PsForward a(input, rois, spatial_scale, ph, pw, sampling_ratio);
  if (a.out.numel() == 0) return a.out;
  ROIOPS_DISPATCH(a.input.scalar_type(), [&] {
    const Parts<scalar_t> parts(a.rois, spatial_scale, ph, pw, a.input.size(2), a.input.size(3), extra...);
    ps_forward_impl<scalar_t>(a, ph, pw, parts);
  });
  return a.out;
}

// The same for a backward: the gradient of the [N, C, H, W] input.
template <template <typename> class Parts, typename... Extra>
Tensor ps_backward(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                   int64_t N, int64_t C, int64_t H, int64_t W, bool channels_last,
                   std::optional<int64_t> sampling_ratio, Extra... extra) {
  PsBackward a(grad, rois, spatial_scale, ph, pw, N, C, H, W, channels_last, sampling_ratio);
  ROIOPS_DISPATCH(a.grad.scalar_type(), [&] {
    const Parts<scalar_t> parts(a.rois, spatial_scale, ph, pw, H, W, extra...);
    ps_backward_impl<scalar_t>(a, ph, pw, parts);
  });
  return a.result();
}

}  // namespace roiops
