// The limits of docs/semantics.md ("Limits") on coordinates, sizes and arguments. The
// Python layer checks the same ones first, with friendlier messages, but a direct op call
// reaches the kernels unchecked: checks.h refuses what lies beyond them.
// (Not limits.h: that name is the C library's header wherever this folder is on the
// include path.)
#pragma once

#include <cstdint>

namespace roiops {

// float32 holds every integer up to 2^24 and none finer beyond: the bound of coordinates,
// map sides and of positions that a kernel counts in float32.
constexpr int64_t kFloatExact = int64_t(1) << 24;

// Coordinates beyond this many feature-map cells are refused: float32 cannot place a
// sample there, and sampling loops sized from them would not end.
constexpr double kMaxCoordinate = static_cast<double>(kFloatExact);
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

}  // namespace roiops
