"""Precise RoI Pooling's workload: IoU-Net's box refinement on the stride-8 map of an
800x1344 image, against roiops' own RoIAlign on the same boxes."""

from ..ops.prroi_pool import prroi_pool
from ._case import Bench, Peer, Target, Workload

BENCH = (Bench("prroi_pool", "PrRoIPool", lambda w, x, b: prroi_pool(x, b, w.size, w.scale),
               Peer("roiops", lambda r, w, x, b: r.roi_align(x, b, w.size, w.scale, 2, False), same_result=False,
                    note="its own roi_align (sampling_ratio=2, no offset, as PrRoIPool) on the same boxes"),
               (Workload("prroi box head", 2, 256, 100, 168, 1 / 8, 512, 7),), sampled=False,
               target=Target(1 / 3, 1 / 3)),)
