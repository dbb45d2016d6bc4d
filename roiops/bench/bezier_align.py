"""Bezier alignment's workload: MMOCR's and AdelaiDet's ABCNet, a few hundred text-line
beziers on the stride-4 level, one sample per bin. 16 x 16 bins: as many as ABCNet's 8 x 32
(256 a box; the workloads' output is square), each one sample. Timed against roiops'
RoIAlign of each box's bounding box with the same bins and samples: the same output
elements and samples per element."""

from .._boxes import BEZIER
from ..ops.bezier_align import bezier_align
from ._case import Bench, Peer, Target, Workload

BENCH = (Bench("bezier_align", "Bezier alignment",
               lambda w, x, b: bezier_align(x, b, w.size, w.scale, w.sampling_ratio),
               Peer("roiops",
                    lambda r, w, x, b: r.roi_align(x, BEZIER.extent(b), w.size, w.scale, w.sampling_ratio,
                                                   aligned=True),
                    same_result=False, note="its own roi_align(aligned=True) on each box's bounding box"),
               (Workload("abcnet text head", 2, 256, 200, 336, 1 / 4, 300, 16, sampling_ratio=1),),
               boxes=BEZIER, target=Target(1 / 1.5, 1 / 1.5)),)
