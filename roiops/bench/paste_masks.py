"""Mask pasting's workloads: Mask R-CNN's inference step on one 800x1333 image, 100
detections' 28x28 mask probabilities pasted into image-sized planes. roiops.paste_masks
(bool) against torchvision's paste_masks_in_image and against detectron2's CPU paste
(written out here: detectron2 is not a dependency); torchvision's drop-in (float [K, 1, H,
W]) against allocating and filling that output once, and against torchvision's own."""

from __future__ import annotations

import math
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat.torchvision import paste_masks_in_image
from ..ops.paste_masks import paste_masks
from ._case import Bench, Inputs, Peer, Target, Workload, read_and_written

SIDES = (10.0, 310.0)  # the detections' box sides in pixels


def _draw(w: Workload, g: torch.Generator, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """``w.boxes`` masks ``[K, 1, M, M]`` (the mask head's probabilities for the predicted
    class, as torchvision's model passes them) and their boxes ``[K, 4]`` (float32): sides
    log-uniform in SIDES, at most the image's, and wholly inside the image, as the models
    clip detections before pasting."""
    masks = torch.rand(w.boxes, 1, w.size, w.size, generator=g).to(dtype)
    high = min(SIDES[1], w.height, w.width)
    low = min(SIDES[0], high)
    size = torch.exp(torch.empty(w.boxes, 2).uniform_(math.log(low), math.log(high), generator=g))
    corner = torch.rand(w.boxes, 2, generator=g) * (torch.tensor([float(w.width), float(w.height)]) - size)
    return masks, torch.cat([corner, corner + size], dim=1)


def _inputs(output: str) -> Inputs:
    # Bytes: every mask and box read once, the whole output written once (it is dense: the
    # zeros around each box are part of the result).
    return Inputs(_draw, read_and_written, lambda w: (
        f"{w.boxes} {w.size}x{w.size} masks pasted into {w.height}x{w.width} image planes ({output}), box sides "
        f"log-uniform in {SIDES[0]:g}-{SIDES[1]:g} px, inside the image"))


# detectron2's chunking on a GPU (detectron2.layers.mask_ops): as many masks a chunk as keep
# its float32 planes within 1 GiB
_BYTES_PER_FLOAT, _GPU_MEM_LIMIT = 4, 1024 ** 3


def _sample(masks: Tensor, boxes: Tensor, height: int, width: int,
            window: bool) -> tuple[Tensor, tuple[slice, ...]]:
    """A chunk's masks ``[n, 1, M, M]`` sampled by grid_sample at pixel centres mapped to
    [-1, 1] over each box, and where in the image the planes go: the whole image, or the
    pixels [floor(x1) - 1, ceil(x2) + 1) x [floor(y1) - 1, ceil(y2) + 1) around the chunk's
    boxes, clipped to it (detectron2 on the CPU)."""
    if window:
        left, top = torch.clamp(boxes.min(dim=0).values.floor()[:2] - 1, min=0).to(torch.int32).tolist()
        right = int(torch.clamp(boxes[:, 2].max().ceil() + 1, max=width))
        bottom = int(torch.clamp(boxes[:, 3].max().ceil() + 1, max=height))
    else:
        left, top, right, bottom = 0, 0, width, height
    x1, y1, x2, y2 = boxes.split(1, dim=1)
    cols = torch.arange(left, right, dtype=torch.float32, device=boxes.device) + 0.5
    rows = torch.arange(top, bottom, dtype=torch.float32, device=boxes.device) + 0.5
    gx = ((cols - x1) / (x2 - x1) * 2 - 1)[:, None, :].expand(len(masks), len(rows), len(cols))
    gy = ((rows - y1) / (y2 - y1) * 2 - 1)[:, :, None].expand(len(masks), len(rows), len(cols))
    planes = F.grid_sample(masks, torch.stack([gx, gy], dim=3).to(masks.dtype), align_corners=False)[:, 0]
    return planes, ((slice(top, bottom), slice(left, right)) if window else ())


def detectron2_paste(masks: Tensor, boxes: Tensor, image_size: tuple[int, int]) -> Tensor:
    """detectron2's ``paste_masks_in_image(masks[:, 0], boxes, image_size)`` (threshold
    0.5) by its definition: on the CPU one mask a chunk, each sampled over its box's window;
    on a GPU as few chunks as keep each within 1 GiB of float planes, each over the whole
    image; the planes ``>= 0.5`` written into a zero bool ``[K, H, W]``."""
    height, width = image_size
    count, cpu = len(masks), boxes.device.type == "cpu"
    chunks = count if cpu else math.ceil(count * height * width * _BYTES_PER_FLOAT / _GPU_MEM_LIMIT)
    out = torch.zeros(count, height, width, dtype=torch.bool, device=boxes.device)
    for index in torch.chunk(torch.arange(count, device=boxes.device), chunks):
        planes, where = _sample(masks[index], boxes[index], height, width, window=cpu)
        out[(index,) + where] = planes >= 0.5
    return out


def _torchvision_paste(tv: ModuleType, w: Workload, masks: Tensor, boxes: Tensor) -> Tensor:
    return tv.models.detection.roi_heads.paste_masks_in_image(masks, boxes, (w.height, w.width))


def _image(name: str) -> Workload:
    """One 800x1333 image, 100 masks of 28x28 (n, channels and scale: one plain image)."""
    return Workload(name, 1, 1, 800, 1333, 1.0, 100, 28)


_BOOL = _inputs("bool [K, H, W]")
_FLOAT = _inputs("float [K, 1, H, W]")

BENCH = (
    Bench("paste_masks", "Mask paste", lambda w, m, b: paste_masks(m, b, (w.height, w.width)),
          Peer("torchvision", _torchvision_paste, same_result=False,
               note="its paste_masks_in_image (torchvision.models.detection.roi_heads): float [K, 1, H, W] by "
                    "its own rule, the padded mask resized to the widened box truncated to pixels"),
          (_image("mask paste"),), sampled=False, target=Target(5, None), inputs=_BOOL),
    Bench("paste_masks detectron2", "Mask paste vs detectron2",
          lambda w, m, b: paste_masks(m, b, (w.height, w.width)),
          Peer("torch", lambda t, w, m, b: detectron2_paste(m, b, (w.height, w.width)),
               note="detectron2's paste_masks_in_image (not a dependency) written out in torch: grid_sample "
                    "one mask at a time over its box's window on the CPU, in 1 GiB chunks over the whole image "
                    "on a GPU"),
          (_image("mask paste detectron2"),), sampled=False, target=Target(5, None), inputs=_BOOL),
    # The drop-in must return a dense float [K, 1, H, W]: allocating it and writing each
    # value once is the least any paste does. torch.zeros is exactly that (an allocation
    # and one fill pass, on the CPU as on a GPU), as torch.empty(...).fill_(0) would be.
    Bench("paste_masks drop-in", "Mask paste drop-in vs allocation",
          lambda w, m, b: paste_masks_in_image(m, b, (w.height, w.width)),
          Peer("torch", lambda t, w, m, b: t.zeros(len(m), 1, w.height, w.width, dtype=m.dtype, device=m.device),
               same_result=False, note="torch.zeros of the drop-in's output, float [K, 1, H, W]: allocating it "
                                       "and writing it once"),
          (_image("mask paste drop-in"),), sampled=False, target=Target(1 / 1.5, None),
          inputs=_FLOAT),
    Bench("paste_masks drop-in torchvision", "Mask paste drop-in vs torchvision",
          lambda w, m, b: paste_masks_in_image(m, b, (w.height, w.width)),
          Peer("torchvision", _torchvision_paste,
               note="its paste_masks_in_image, which the drop-in (roiops.compat.torchvision) equals"),
          (_image("mask paste drop-in torchvision"),), sampled=False, inputs=_FLOAT),
)
