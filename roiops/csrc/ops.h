// The CPU kernels' entry points; the argument orders are the kernel contract of
// docs/architecture.md.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace roiops {

at::Tensor roi_align_forward(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                             int64_t pooled_height, int64_t pooled_width, int64_t sampling_ratio, bool aligned);
at::Tensor roi_align_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                              int64_t pooled_height, int64_t pooled_width, int64_t batch_size, int64_t channels,
                              int64_t height, int64_t width, int64_t sampling_ratio, bool aligned,
                              bool channels_last);
std::tuple<at::Tensor, at::Tensor> roi_align_max_forward(const at::Tensor& input, const at::Tensor& rois,
                                                         double spatial_scale, int64_t pooled_height,
                                                         int64_t pooled_width, int64_t sampling_ratio, bool aligned);
at::Tensor roi_align_max_backward(const at::Tensor& grad, const at::Tensor& argmax, const at::Tensor& rois,
                                  double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                                  int64_t batch_size, int64_t channels, int64_t height, int64_t width,
                                  int64_t sampling_ratio, bool aligned, bool channels_last);
std::tuple<at::Tensor, at::Tensor> roi_pool_forward(const at::Tensor& input, const at::Tensor& rois,
                                                    double spatial_scale, int64_t pooled_height, int64_t pooled_width,
                                                    bool continuous);
at::Tensor roi_pool_backward(const at::Tensor& grad, const at::Tensor& argmax, const at::Tensor& rois,
                             int64_t batch_size, int64_t channels, int64_t height, int64_t width,
                             bool channels_last);

}  // namespace roiops
