"""End-to-end CPU inference time of torchvision's Mask R-CNN (maskrcnn_resnet50_fpn) as
shipped, against the same model with roiops plugged in: its two poolers replaced by
roiops.compat.torchvision.MultiScaleRoIAlign and its mask pasting by
roiops.compat.torchvision.paste_masks_in_image (docs/porting.md).

    PYTHONPATH=. .venv/bin/python benchmarks/mask_rcnn_cpu.py [--threads 2] [--repeats 5]

One 800x1333 image (COCO evaluation's size, which the model's transform keeps as it is),
eval mode, float32, torch.no_grad(). The weights are a random initialisation (seeded; no
download): the time does not depend on the values, except through the number of
detections, which the lowered score threshold (0.0) holds at the model's maximum of 100,
each with its mask pasted into the 800x1333 image. The two variants run interleaved
(A, B, B, A, ...) after one warm-up each; printed: the median time of a whole call, of
the pasting step (paste_masks_in_image, timed by wrapping the function) with its share
of the call, and of the two poolers (box and mask RoIAlign, timed by forward hooks). The
two variants' outputs are checked equal.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torchvision.models.detection.roi_heads as tv_roi_heads
import torchvision.models.detection.transform as tv_transform
from torchvision.models.detection import maskrcnn_resnet50_fpn

from roiops.compat import torchvision as tv

STOCK_PASTE = tv_roi_heads.paste_masks_in_image


class Clock:
    """Seconds spent in the timed steps during one call of the model."""

    def __init__(self) -> None:
        self.paste = 0.0
        self.pool = 0.0
        self._pool_start = 0.0

    def timed_paste(self, paste: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = paste(*args, **kwargs)
            self.paste += time.perf_counter() - start
            return out

        return wrapper

    def hook(self, model: torch.nn.Module) -> None:
        for pooler in (model.roi_heads.box_roi_pool, model.roi_heads.mask_roi_pool):
            pooler.register_forward_pre_hook(self._start)
            pooler.register_forward_hook(self._stop)

    def _start(self, *_) -> None:
        self._pool_start = time.perf_counter()

    def _stop(self, *_) -> None:
        self.pool += time.perf_counter() - self._pool_start


@contextmanager
def pasting_with(paste: Callable[..., torch.Tensor]) -> Iterator[None]:
    """torchvision's mask pasting replaced by ``paste`` while the block runs. The model's
    transform calls it by the name transform.py imported from roi_heads: both are set."""
    saved = tv_roi_heads.paste_masks_in_image, tv_transform.paste_masks_in_image
    tv_roi_heads.paste_masks_in_image = tv_transform.paste_masks_in_image = paste
    try:
        yield
    finally:
        tv_roi_heads.paste_masks_in_image, tv_transform.paste_masks_in_image = saved


def with_roiops_poolers(model: torch.nn.Module) -> torch.nn.Module:
    model = copy.deepcopy(model)
    for name in ("box_roi_pool", "mask_roi_pool"):
        theirs = getattr(model.roi_heads, name)
        setattr(model.roi_heads, name, tv.MultiScaleRoIAlign(
            theirs.featmap_names, theirs.output_size, theirs.sampling_ratio,
            canonical_scale=theirs.canonical_scale, canonical_level=theirs.canonical_level))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each variant")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    stock = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None).eval()
    stock.roi_heads.score_thresh = 0.0  # every call returns detections_per_img (100) detections
    ours = with_roiops_poolers(stock)
    image = torch.rand(3, 800, 1333, generator=torch.Generator().manual_seed(1))

    variants = {"torchvision": (stock, STOCK_PASTE), "roiops": (ours, tv.paste_masks_in_image)}
    clocks = {name: Clock() for name in variants}
    for name, (model, _) in variants.items():
        clocks[name].hook(model)
    times: dict[str, dict[str, list[float]]] = {name: {"total": [], "paste": [], "pool": []} for name in variants}
    outputs = {}

    def run(name: str, record: bool) -> None:
        model, paste = variants[name]
        clock = clocks[name]
        clock.paste = clock.pool = 0.0
        with pasting_with(clock.timed_paste(paste)), torch.no_grad():
            start = time.perf_counter()
            outputs[name] = model([image])[0]
            total = time.perf_counter() - start
        if record:
            times[name]["total"].append(total)
            times[name]["paste"].append(clock.paste)
            times[name]["pool"].append(clock.pool)

    for name in variants:  # warm-up
        run(name, record=False)
    order = list(variants)
    for i in range(args.repeats):
        for name in order if i % 2 == 0 else order[::-1]:
            run(name, record=True)

    expected, got = outputs["torchvision"], outputs["roiops"]
    same = all(torch.equal(expected[k], got[k]) for k in ("boxes", "labels", "scores", "masks"))
    print(f"torch {torch.__version__}, {args.threads} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, input 1x3x800x1333, "
          f"{len(expected['boxes'])} detections, masks {tuple(expected['masks'].shape)}, "
          f"outputs equal: {same}, median of {args.repeats}; load average at the end "
          f"{os.getloadavg()[0]:.1f} (other processes on the cores inflate the times)")
    print(f"{'':12} {'call (s)':>9} {'paste (s)':>10} {'paste share':>12} {'poolers (s)':>12}")
    for name, t in times.items():
        total, paste, pool = (statistics.median(t[k]) for k in ("total", "paste", "pool"))
        share = statistics.median(p / c for p, c in zip(t["paste"], t["total"]))
        print(f"{name:12} {total:9.3f} {paste:10.3f} {share:11.1%} {pool:12.3f}")


if __name__ == "__main__":
    main()
