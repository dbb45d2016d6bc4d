// The layouts the kernels read and write tensors in: a map in its memory format
// (is_channels_last, in_layout), with the strides that format gives every dimension, and
// rois contiguous in the kernels' coordinate type (opmath_rois).
#pragma once

#include <array>
#include <cstdint>

#include "torch_api.h"

namespace roiops {

// The kernels' layout rule: channels_last strides, unless they are also NCHW-contiguous
// (C == 1, or a 1 x 1 map), which counts as NCHW. Outputs take the input's format.
inline bool is_channels_last(const Tensor& t) {
  return is_channels_last_contiguous(t) && !t.is_contiguous();
}

// A 4-D tensor in the kernels' layout, with the strides that layout gives every dimension.
// A contiguous tensor may carry any stride on a dimension of size 1 (a transposed
// [N, C, 1, W] map is a contiguous [N, C, W, 1] with stride(3) = W), and in_format()
// leaves it so; kernels that choose a path by a stride would misread it. The same
// elements at the same addresses: only the size-1 dimensions' strides change.
inline Tensor in_layout(const Tensor& t, bool channels_last) {
  Tensor c = in_format(t, channels_last);
  const std::array<int64_t, 4> sizes{c.size(0), c.size(1), c.size(2), c.size(3)};
  const std::array<int64_t, 4> dense = dense_strides(sizes[1], sizes[2], sizes[3], channels_last);
  for (int64_t d = 0; d < 4; ++d)
    if (c.stride(d) != dense[d]) return as_strided(c, sizes, dense);
  return c;
}

// rois contiguous in the kernels' coordinate type: float64 for a float64 map, float32
// otherwise (the checks allow any floating dtype for a map that is not float64).
inline Tensor opmath_rois(const Tensor& rois, ScalarType map_type) {
  const ScalarType t = map_type == kDouble ? kDouble : kFloat;
  return in_format(rois.scalar_type() == t ? rois : to_dtype(rois, t));
}

}  // namespace roiops
