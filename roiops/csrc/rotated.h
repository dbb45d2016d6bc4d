// Rotated RoIAlign's CPU entry points (roi_align_rotated.cpp), for the ops built on its
// sampling (rotation-invariant RoIAlign).
#pragma once

#include "torch_api.h"

namespace roiops {

Tensor roi_align_rotated_forward(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                                 int64_t sampling_ratio, bool aligned);

Tensor roi_align_rotated_backward(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                                  int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio, bool aligned,
                                  bool channels_last);

}  // namespace roiops
