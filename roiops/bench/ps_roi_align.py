"""Position-sensitive RoIAlign's workloads: R-FCN heads on the stride-16 map of a 600x800
image, 7x7 bins of 21 classes (PASCAL VOC) and of 256 channels, 300 and 1000 proposals;
against torchvision's."""

from ..ops.ps_roi_align import ps_roi_align
from ._case import Bench, Target, Workload, torchvision

BENCH = (Bench("ps_roi_align", "PSRoIAlign", lambda w, x, b: ps_roi_align(x, b, w.size, w.scale, w.sampling_ratio),
               torchvision(lambda tv, w, x, b: tv.ops.ps_roi_align(x, b, w.size, w.scale, w.sampling_ratio)),
               (Workload("R-FCN classes", 1, 21 * 49, 38, 50, 1 / 16, 300, 7, sampling_ratio=0),
                Workload("R-FCN 256", 1, 256 * 49, 38, 50, 1 / 16, 1000, 7)),
               channel_multiple=lambda w: w.size * w.size, target=Target(10, 5)),)
