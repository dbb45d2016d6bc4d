"""RoIPool's workload: Fast R-CNN's RoIPool on a stride-4 level of an 800x1344 image, against
torchvision's."""

from ..ops.roi_pool import roi_pool
from ._case import Bench, Target, Workload, torchvision

BENCH = (Bench("roi_pool", "RoIPool", lambda w, x, b: roi_pool(x, b, w.size, w.scale),
               torchvision(lambda tv, w, x, b: tv.ops.roi_pool(x, b, w.size, w.scale)),
               (Workload("roi_pool", 2, 256, 200, 336, 1 / 4, 1024, 7),), argmax=True, sampled=False,
               target=Target(10, 5)),)
