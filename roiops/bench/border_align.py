"""Border align's workload: BorderDet's border branch of the box regression (4 x 128
channels) on one FPN level, stride 8 of an 800 x 1333 image, one box per location,
pool_size 10. The peer computes as many maxima of about as many samples on the same map
and boxes: roiops' RoIAlign in max mode, one bin per box and channel of the 4C, a 3 x 3
grid (border align: 11 samples per value)."""

from .._boxes import PER_IMAGE
from ..ops.border_align import border_align
from ._case import Bench, Peer, Target, Workload

BENCH = (Bench("border_align", "Border align", lambda w, x, b: border_align(x, b[:, 1:].view(w.n, -1, 4), w.size),
               Peer("roiops", lambda r, w, x, b: r.roi_align(x, b, 1, 1.0, 3, mode="max"), same_result=False,
                    note="its own roi_align(mode='max'), one 3 x 3-sample bin per box and channel: as many "
                         "values as border align's, 9 samples each against 11"),
               (Workload("borderdet p3", 2, 512, 100, 168, 1.0, 100 * 168, 10),),
               argmax=True, sampled=False, boxes=PER_IMAGE, target=Target(1 / 1.5, 1 / 1.5)),)
