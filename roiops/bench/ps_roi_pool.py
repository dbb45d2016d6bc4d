"""Position-sensitive RoIPool's workloads: the R-FCN heads of PSRoIAlign's, against
torchvision's."""

from ..ops.ps_roi_pool import ps_roi_pool
from ._case import Bench, Target, Workload, torchvision

BENCH = (Bench("ps_roi_pool", "PSRoIPool", lambda w, x, b: ps_roi_pool(x, b, w.size, w.scale),
               torchvision(lambda tv, w, x, b: tv.ops.ps_roi_pool(x, b, w.size, w.scale), same_result=False,
                           note="its forward leaves out bins' cells on the map's last row and column "
                                "(docs/semantics.md)"),
               (Workload("R-FCN pool classes", 1, 21 * 49, 38, 50, 1 / 16, 300, 7),
                Workload("R-FCN pool 256", 1, 256 * 49, 38, 50, 1 / 16, 1000, 7)),
               sampled=False, channel_multiple=lambda w: w.size * w.size, target=Target(10, 5)),)
