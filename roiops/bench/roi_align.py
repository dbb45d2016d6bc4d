"""RoIAlign's workloads: a Mask R-CNN/FPN box head on a stride-4 level of an 800x1344 image,
its adaptive-sampling variant, the mask head (14x14 on fewer boxes), a 4-image batch on a
stride-8 map, and a max-mode head; against torchvision's RoIAlign."""

from ..ops.roi_align import roi_align
from ._case import Bench, Target, Workload, torchvision

_TARGET = Target({"channels_last": 10, "NCHW": 5}, 15, one_thread=4)

BENCH = (
    Bench("roi_align", "RoIAlign avg",
          lambda w, x, b: roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned, "avg"),
          torchvision(lambda tv, w, x, b: tv.ops.roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned)),
          (Workload("box head train", 2, 256, 200, 336, 1 / 4, 1024, 7),
           Workload("box head adaptive", 2, 256, 200, 336, 1 / 4, 1024, 7, sampling_ratio=0),
           Workload("mask head", 2, 256, 200, 336, 1 / 4, 256, 14),
           Workload("multi-image", 4, 256, 100, 168, 1 / 8, 2048, 7)), target=_TARGET),
    Bench("roi_align max", "RoIAlign max",
          lambda w, x, b: roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned, "max"),
          torchvision(lambda tv, w, x, b: tv.ops.roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned),
                      same_result=False, note="its average RoIAlign: torchvision has no max mode"),
          (Workload("box head max", 2, 256, 200, 336, 1 / 4, 1024, 7),), argmax=True, target=_TARGET))
