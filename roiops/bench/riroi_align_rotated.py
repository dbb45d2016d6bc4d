"""Rotation-invariant RoIAlign's workload: MMRotate's ReDet head, 256 channels (32 fields x 8
orientations) on the stride-4 map, 7 x 7 bins, 2 x 2 samples, clockwise angles. Timed
against roiops' rotated RoIAlign (aligned=False, the same samples) on the same boxes: what
the orientation blend costs."""

from .._boxes import ROTATED
from ..ops.riroi_align_rotated import riroi_align_rotated
from ._case import Bench, Peer, Target, Workload

BENCH = (Bench("riroi_align_rotated", "rotation-invariant RiRoIAlign",
               lambda w, x, b: riroi_align_rotated(x, b, w.size, w.scale, w.sampling_ratio, 8, True),
               Peer("roiops",
                    lambda r, w, x, b: r.roi_align_rotated(x, b, w.size, w.scale, w.sampling_ratio, False, True,
                                                           "radians"),
                    same_result=False, note="its own roi_align_rotated(aligned=False) on the same boxes"),
               (Workload("redet head", 2, 256, 200, 336, 1 / 4, 1000, 7),),
               boxes=ROTATED, channel_multiple=lambda w: 8, target=Target(1 / 1.3, 1 / 1.3)),)
