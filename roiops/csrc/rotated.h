// Rotated RoIAlign's CPU entry points (roi_align_rotated.cpp), for the ops built on its
// sampling (rotation-invariant RoIAlign).
#pragma once

#include <vector>

#include "torch_api.h"

namespace roiops {

Tensor roi_align_rotated_forward(const Tensor& input, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                                 int64_t sampling_ratio, bool aligned);

Tensor roi_align_rotated_backward(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph, int64_t pw,
                                  int64_t N, int64_t C, int64_t H, int64_t W, int64_t sampling_ratio, bool aligned,
                                  bool channels_last);

// Rotation-invariant RoIAlign's blend of each box's orientations, which rotated RoIAlign's
// channels_last backward folds into its reading of grad: channel c' O + o of box k reads as
// r[k] * grad[c' O + (o + ind[k]) mod O] + l[k] * grad[c' O + (o + ind[k] - 1) mod O], in
// the opmath type T (r and l rounded to T where used).
struct OrientationBlend {
  int64_t orientations;
  std::vector<int64_t> ind;
  std::vector<double> r, l;
};

// roi_align_rotated_backward of the blended grad, for a channels_last gradient.
Tensor roi_align_rotated_backward_blended(const Tensor& grad, const Tensor& rois, double spatial_scale, int64_t ph,
                                          int64_t pw, int64_t N, int64_t C, int64_t H, int64_t W,
                                          int64_t sampling_ratio, const OrientationBlend& blend);

}  // namespace roiops
