// Tiles and bands of the CPU kernels: a task's slice of the map (or of the gradient),
// copied into a compact channels-last tile in the opmath type, stays in cache while all
// the image's boxes use it; a backward band of map rows belongs to one task, which adds
// the boxes touching it in increasing k.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "layout.h"
#include "memory.h"
#include "parallel.h"
#include "simd.h"

namespace roiops {

// Work is split into (image, block of channels) tasks, and for backward also bands of map
// rows: a task's slice of the map, copied into a compact channels-last tile, stays in
// cache while all the image's boxes use it. kTileChannels per block (a float tile of a
// 200 x 336 map is then 4 MiB, about what stays in cache), fewer when the tasks would not
// keep the threads busy.
constexpr int64_t kTileChannels = 16;

// Calls f(std::integral_constant<int64_t, kN>) with kN = n for the tile width, so that
// the kernels' channel loops are unrolled, else kN = 0 (any n).
template <typename F>
void with_width(int64_t n, const F& f) {
  if (n == kTileChannels) {
    f(std::integral_constant<int64_t, kTileChannels>{});
  } else {
    f(std::integral_constant<int64_t, 0>{});
  }
}

// Is a tile around rect = {y0, y1, x0, x1} worth filling, for boxes whose own reads
// cover `area` cells (with overlaps)? It must not be much larger than that, and fit a
// sane amount of memory.
inline bool tile_pays(const std::array<int64_t, 4>& rect, double area, int64_t H, int64_t W, int64_t cb,
                      size_t elem) {
  const double cells = static_cast<double>(rect[1] - rect[0]) * static_cast<double>(rect[3] - rect[2]);
  return cells <= 2 * area && static_cast<double>(H) * static_cast<double>(W) * cb * elem <= double(256 << 20);
}

// Bytes of gradient accumulator per backward task (a tile that stays in a core's L2).
constexpr int64_t kBandBytes = int64_t(1) << 20;

// Backward tasks: image n, band b of `rows` map rows, channel block. The band's gradient
// for those channels (about `bytes`) belongs to one task, which adds the boxes touching
// the band in increasing k: no races, and sums that do not depend on the thread count.
struct Bands {
  int64_t rows = 1, per_image = 1;
  std::vector<std::vector<int64_t>> boxes;  // [n * per_image + b]: boxes touching band b of image n

  // spans[k] = {first row, last row} that box k writes to (first > last: none).
  Bands(int64_t n_images, int64_t height, int64_t row_bytes, int64_t bytes, const std::vector<int64_t>& batch,
        const std::vector<std::pair<int64_t, int64_t>>& spans) {
    rows = std::max<int64_t>(1, std::min<int64_t>(height, bytes / std::max<int64_t>(row_bytes, 1)));
    per_image = (height + rows - 1) / rows;
    boxes.resize(static_cast<size_t>(n_images * per_image));
    for (size_t k = 0; k < spans.size(); ++k) {
      if (spans[k].first > spans[k].second) continue;
      for (int64_t b = spans[k].first / rows; b <= spans[k].second / rows; ++b) {
        boxes[static_cast<size_t>(batch[k] * per_image + b)].push_back(static_cast<int64_t>(k));
      }
    }
  }
};

// Tiles: a task copies its channel block [c0, c0 + cb) of one image (rows [y0, y1),
// columns [x0, x1)) into a compact channels-last tile in the opmath type, cell (y, x) at
// tile + (y * W + x) * cb, so that the boxes then read it from cache. Also the reverse,
// for backward, where the tile holds a band of rows [y0, y1): cell (y, x) at
// tile + ((y - y0) * W + x) * cb. Transposes go through blocks of kTileX columns so that
// the tile side stays in L1.
constexpr int64_t kTileX = 16;

// From an NCHW image (img points at channel c0).
template <typename scalar_t, typename T>
ROIOPS_SIMD void planes_to_tile(const scalar_t* img, int64_t sC, int64_t W, int64_t cb, int64_t y0, int64_t y1,
                                int64_t x0, int64_t x1, T* __restrict__ tile) {
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t xb = x0; xb < x1; xb += kTileX) {
      const int64_t xe = std::min(x1, xb + kTileX);
      T* __restrict__ dst = tile + y * W * cb;
      for (int64_t c = 0; c < cb; ++c) {
        const scalar_t* __restrict__ src = img + c * sC + y * W;
        for (int64_t x = xb; x < xe; ++x) dst[x * cb + c] = static_cast<T>(src[x]);
      }
    }
  }
}

// From a channels-last image (img points at channel c0; cell (y, x) at y * sH + x * sW).
template <typename scalar_t, typename T>
ROIOPS_SIMD void cells_to_tile(const scalar_t* img, int64_t sH, int64_t sW, int64_t W, int64_t cb, int64_t y0,
                               int64_t y1, int64_t x0, int64_t x1, T* __restrict__ tile) {
  for (int64_t y = y0; y < y1; ++y) {
    for (int64_t x = x0; x < x1; ++x) {
      const scalar_t* __restrict__ src = img + y * sH + x * sW;
      T* __restrict__ dst = tile + (y * W + x) * cb;
      for (int64_t c = 0; c < cb; ++c) dst[c] = static_cast<T>(src[c]);
    }
  }
}

// A band tile -> channel block of an NCHW image (img points at channel c0).
template <typename scalar_t, typename T>
ROIOPS_SIMD void tile_to_planes(const T* __restrict__ tile, int64_t cb, int64_t y0, int64_t y1, int64_t W,
                                scalar_t* img, int64_t sC) {
  for (int64_t y = y0; y < y1; ++y) {
    const T* __restrict__ row = tile + (y - y0) * W * cb;
    for (int64_t xb = 0; xb < W; xb += kTileX) {
      const int64_t xe = std::min(W, xb + kTileX);
      for (int64_t c = 0; c < cb; ++c) {
        scalar_t* __restrict__ dst = img + c * sC + y * W;
        for (int64_t x = xb; x < xe; ++x) dst[x] = static_cast<scalar_t>(row[x * cb + c]);
      }
    }
  }
}

// A band tile of `cells` cells -> channel block of a channels-last image (cell stride sW).
template <typename scalar_t, typename T>
ROIOPS_SIMD void tile_to_cells(const T* __restrict__ tile, int64_t cb, int64_t cells, scalar_t* dst, int64_t sW) {
  for (int64_t e = 0; e < cells; ++e) {
    for (int64_t c = 0; c < cb; ++c) dst[e * sW + c] = static_cast<scalar_t>(tile[e * cb + c]);
  }
}

// Channels-last backward bands hold all channels of their rows, so that grad and argmax
// are read as they lie; larger bands, so that fewer boxes straddle two of them and are
// read twice.
constexpr int64_t kClBandBytes = int64_t(4) << 20;

// The tasks of a backward: image n, band of rows [y0, y1), channels [c0, c0 + nc).
// channels_last: bands of all channels, split into channel blocks only when too few;
// NCHW: bands of a channels-last tile of a block of channels (kBandBytes).
struct BackwardSplit {
  struct Task {
    int64_t n, band, y0, y1, c0, nc;
    int64_t cells(int64_t W) const { return (y1 - y0) * W; }
  };
  Bands bands;
  int64_t cb, blocks;

  BackwardSplit(int64_t N, int64_t C, int64_t H, int64_t W, size_t elem, bool channels_last,
                const std::vector<int64_t>& batch, const std::vector<std::pair<int64_t, int64_t>>& spans)
      : bands(N, H, W * (channels_last ? C : channel_block(N, C, kTileChannels)) * static_cast<int64_t>(elem),
              channels_last ? kClBandBytes : kBandBytes, batch, spans),
        cb(channels_last ? cl_channel_block(N * bands.per_image, C) : channel_block(N, C, kTileChannels)),
        blocks((C + cb - 1) / cb),
        C_(C),
        H_(H) {}

  int64_t tasks() const { return static_cast<int64_t>(bands.boxes.size()) * blocks; }

  Task task(int64_t t) const {
    const int64_t nb = t / blocks, y0 = (nb % bands.per_image) * bands.rows, c0 = (t % blocks) * cb;
    return {nb / bands.per_image, nb, y0, std::min(H_, y0 + bands.rows), c0, std::min(cb, C_ - c0)};
  }

 private:
  int64_t C_, H_;
};

// Runs body(task, acc, aW) for every task of `split` on all threads, with the task's
// accumulator: cell (y, x) of its band, channel c0 + c, at acc + ((y - y0) * W + x) * aW + c.
// fresh: grad_input (gi, N x C x H x W) holds nothing yet and every task starts from zero;
// otherwise gi holds the sums of earlier boxes, which tasks with boxes carry on from.
// A channels-last float/double gradient accumulates in place; otherwise in a tile of the
// opmath type T, written to gi afterwards.
template <typename T, typename scalar_t, typename F>
void for_each_band(const BackwardSplit& split, Tensor& gi, bool fresh, const F& body) {
  const bool channels_last = is_channels_last(gi);
  const int64_t W = gi.size(3), sN = gi.stride(0), sC = gi.stride(1), sH = gi.stride(2), sW = gi.stride(3);
  scalar_t* out = gi.mutable_data_ptr<scalar_t>();
  Scratch<T> tile;
  parallel_tasks(split.tasks(), [&](int64_t t) {
    const BackwardSplit::Task task = split.task(t);
    if (!fresh && split.bands.boxes[task.band].empty()) return;
    const int64_t cells = task.cells(W), nc = task.nc, rows = task.y1 - task.y0;
    scalar_t* img = out + task.n * sN + task.c0 * sC;
    if constexpr (std::is_same_v<scalar_t, T>) {
      if (channels_last) {
        T* acc = img + task.y0 * sH;
        if (fresh && nc == sW) {
          std::fill_n(acc, cells * nc, T(0));
        } else if (fresh) {
          for (int64_t e = 0; e < cells; ++e) std::fill_n(acc + e * sW, nc, T(0));
        }
        body(task, acc, sW);
        return;
      }
    }
    T* acc = tile.get(cells * nc);
    if (fresh) {
      std::fill_n(acc, cells * nc, T(0));
    } else if (channels_last) {
      cells_to_tile(img + task.y0 * sH, sH, sW, W, nc, 0, rows, 0, W, acc);
    } else {
      planes_to_tile(img + task.y0 * W, sC, W, nc, 0, rows, 0, W, acc);
    }
    body(task, acc, nc);
    if (channels_last) {
      tile_to_cells(acc, nc, cells, img + task.y0 * sH, sW);
    } else {
      tile_to_planes(acc, nc, task.y0, task.y1, W, img, sC);
    }
  });
}

}  // namespace roiops
