"""The one validation and box-format layer between the public API and the ops.

Everything a user can pass wrong is checked here, with a message that names the
argument (and for box values, the first offending row).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard, Union

import torch
from torch import Tensor

from . import _library, config
from ._boxes import AXIS_ALIGNED, BEZIER, FORMATS, LIDAR, PER_IMAGE, ROTATED, BoxFormat
from ._geometry import (MAX_ARGMAX_GRID, MAX_COORDINATE, MAX_LEVELS, MAX_MAP_SIDE, MAX_ORIENTATIONS, MAX_OUTPUT_SIZE,
                        MAX_POINTS, MAX_POOL_SIZE, MAX_SAMPLING_RATIO, MAX_SCALE, MAX_VOXEL_SIDE, MIN_SCALE,
                        align_axis, dense)

BoxesType = Union[Tensor, Sequence[Tensor]]
"""The boxes of an op: one ``Tensor[K, R]`` whose rows start with the batch index (``R = 5``:
``(batch_index, x1, y1, x2, y2)``; 6 for rotated boxes, 17 for Bezier curves), or one
``Tensor[L_i, R - 1]`` per image, without the index."""

OutputSize = Union[int, tuple[int, int], list[int]]
"""An op's output size: an int ``s``, meaning ``(s, s)``, or ``(h, w)``."""

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class BoxFormatError(ValueError):
    """Boxes of the wrong shape (the drop-ins of peers that assert the shape also make it
    an AssertionError)."""


class QuantizedTensorError(ValueError, NotImplementedError):
    """A quantized map or boxes: roiops does not implement them (PyTorch deprecates
    quantized tensors). A ValueError, and a NotImplementedError as torchvision's kernels
    raise for quantized tensors they lack."""


def _quantized(name: str, t: Tensor) -> QuantizedTensorError:
    return QuantizedTensorError(f"{name} is a quantized tensor ({t.dtype}): roiops does not support quantized tensors, "
                                f"which PyTorch deprecates; dequantize it first ({name}.dequantize())")


def _floating(name: str, t: Tensor) -> None:
    """A dense tensor of a dtype the kernels have."""
    if t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dtype not in DTYPES:
        if t.is_quantized:
            raise _quantized(name, t)
        raise ValueError(f"{name} must be floating point (float16, bfloat16, float32 or float64), got {t.dtype}")


def output_size(value: object) -> tuple[int, int]:
    """``int`` or ``(h, w)`` of positive ints -> ``(h, w)``."""
    one = _as_int(value)
    pair = (one, one) if one is not None else value
    if isinstance(pair, (tuple, list)) and len(pair) == 2:
        h, w = _as_int(pair[0]), _as_int(pair[1])
        if h is not None and w is not None and 0 < h <= MAX_OUTPUT_SIZE and 0 < w <= MAX_OUTPUT_SIZE:
            return h, w
    raise ValueError(f"output_size must be an int or a pair (h, w) of ints in [1, {MAX_OUTPUT_SIZE}], got {value!r}")


def spatial_scale(value: object) -> float:
    scale = _as_float(value)
    if scale is None or not (MIN_SCALE <= scale <= MAX_SCALE):
        raise ValueError(f"spatial_scale must be a number in [2^-64, 2^64] (used as a float32), got {value!r}")
    return scale


def sampling_ratio(value: object) -> int:
    ratio = _as_int(value)
    if ratio is None or ratio > MAX_SAMPLING_RATIO:
        raise ValueError(f"sampling_ratio must be an int <= {MAX_SAMPLING_RATIO} (<= 0 for adaptive), got {value!r}")
    return ratio


def finite(name: str, value: object) -> float:
    number = _as_float(value)
    if number is None or not -math.inf < number < math.inf:  # comparisons: a traced float may be symbolic
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def per_bin(name: str, value: object, input: Tensor, rois: Tensor, h: int, w: int, channels: int) -> Tensor | None:
    """None, or ``Tensor[K, channels, h, w]`` of values per box and bin (a deformable offset)
    on the input's device -> contiguous in the kernels' coordinate type (differentiably)."""
    if value is None:
        return None
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor or None, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
    if not value.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {value.dtype}")
    if value.device != input.device:
        raise ValueError(f"{name} is on {value.device} but input is on {input.device}")
    shape = (rois.shape[0], channels, h, w)
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} must be [K, {channels}, h, w] = {list(shape)} (K boxes, output_size (h, w)), "
                         f"got {list(value.shape)}")
    return dense(value, _coord_type(input))


def orientations(value: object) -> int:
    return _int_in("num_orientations", value, MAX_ORIENTATIONS)


def orientation_fields(input: Tensor, count: int) -> None:
    """Rotation-invariant pooling reads fields of ``count`` orientation channels."""
    c = input.shape[1]
    if c % count != 0:
        raise ValueError(f"input has {c} channels, not a multiple of num_orientations = {count}: the channels must "
                         f"be fields of num_orientations orientations each (channel c' * num_orientations + o)")


def choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if _is_numpy(value, "bool_") or (isinstance(value, Tensor) and value.dim() == 0 and value.dtype == torch.bool):
        return bool(value)
    raise ValueError(f"{name} must be a bool, got {value!r}")


def feature_map(input: object) -> Tensor:
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a Tensor, got {type(input).__name__}")
    if input.layout != torch.strided:
        raise ValueError(f"input must be a dense (strided) tensor, got layout {input.layout}")
    if input.dim() != 4:
        raise ValueError(f"input must be 4-D [N, C, H, W], got shape {tuple(input.shape)}")
    if input.dtype not in DTYPES:
        if input.is_quantized:
            raise _quantized("input", input)
        raise ValueError(f"input must be floating point (float16, bfloat16, float32 or float64), got {input.dtype}")
    if not (0 < input.shape[2] <= MAX_MAP_SIDE and 0 < input.shape[3] <= MAX_MAP_SIDE):
        raise ValueError(f"input height and width must be in [1, 2^24], got shape {tuple(input.shape)}")
    return input


def feature_maps(features: object) -> list[Tensor]:
    """1 to MAX_LEVELS feature maps agreeing in N, C, dtype and device."""
    if isinstance(features, Tensor) or not isinstance(features, Sequence) or not 1 <= len(features) <= MAX_LEVELS:
        count = f" of {len(features)}" if isinstance(features, Sequence) and not isinstance(features, Tensor) else ""
        raise ValueError(f"features must be a list of 1 to {MAX_LEVELS} feature maps, got "
                         f"{type(features).__name__}{count}")
    maps = [feature_map(f) for f in features]
    first = maps[0]
    for i, f in enumerate(maps[1:], 1):
        if f.shape[:2] != first.shape[:2] or f.dtype != first.dtype or f.device != first.device:
            raise ValueError(f"features[{i}] is {tuple(f.shape)} {f.dtype} on {f.device} but features[0] is "
                             f"{tuple(first.shape)} {first.dtype} on {first.device}: N, C, dtype and device must agree")
    return maps


def spatial_scales(values: object, count: int, pyramid: bool = False) -> list[float]:
    """One scale per feature map; with `pyramid`, consecutive powers of two, finest first
    (what the FPN level rules assume)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != count:
        raise ValueError(f"spatial_scales must list one scale per feature map ({count}), got {values!r}")
    scales = [spatial_scale(s) for s in values]
    if pyramid and (not math.log2(scales[0]).is_integer() or any(s != scales[0] / 2**i for i, s in enumerate(scales))):
        raise ValueError(f"spatial_scales must be consecutive powers of two, finest first (e.g. [1/4, 1/8, 1/16]), "
                         f"got {list(values)}")
    return scales


def rois(input: Tensor, boxes: BoxesType, scale: float,
         max_grid: tuple[int, int, int, bool] | None = None) -> Tensor:
    """Boxes as ``Tensor[K, 5]`` or a list of N ``Tensor[L_i, 4]`` -> contiguous ``[K, 5]``
    in the kernels' coordinate type (float64 for float64 input, float32 otherwise).

    ``max_grid = (h, w, sampling_ratio, aligned)`` for RoIAlign mode "max": also check that
    each box's sampling grid fits its int32 argmax."""
    out = _box_rows(input, boxes, AXIS_ALIGNED, _coord_type(input))
    if _checking_values(out):
        _check_values(out, input.shape[0], scale)
        if max_grid is not None and max_grid[2] <= 0:
            _check_max_grid(out, scale, *max_grid)
    return out


def _coord_type(input: Tensor) -> torch.dtype:
    """The kernels' coordinate type: float64 for float64 input, float32 otherwise."""
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def _box_rows(input: Tensor, boxes: BoxesType, form: BoxFormat, dtype: torch.dtype) -> Tensor:
    """Boxes of ``form`` as ``Tensor[K, width]`` rows led by the batch index, or a list of N
    ``Tensor[L_i, width - 1]`` (image i's rows, without it) -> contiguous ``[K, width]`` in
    ``dtype``."""
    name, width = form.argument, form.width
    if isinstance(boxes, Tensor):
        _box_tensor(boxes, input, width, name, form.hint())
        return dense(boxes, dtype)
    if isinstance(boxes, (list, tuple)):
        if len(boxes) != input.shape[0]:
            raise ValueError(f"{name} is a list of {len(boxes)} tensors but the input has batch size {input.shape[0]}")
        for i, b in enumerate(boxes):
            _box_tensor(b, input, width - 1, f"{name}[{i}]", form.hint(batch_index=False))
        if not boxes:
            return input.new_zeros((0, width), dtype=dtype)
        # narrow, not b[:, :1]: torch 2.6's export would guard the box count against 2^63 - 1
        return torch.cat([torch.cat([torch.full_like(b.narrow(1, 0, 1), i, dtype=dtype), b.to(dtype)], dim=1)
                          for i, b in enumerate(boxes)], dim=0)
    raise TypeError(f"{name} must be a Tensor[K, {width}] or a list of Tensor[L, {width - 1}], "
                    f"got {type(boxes).__name__}")


def _checking_values(rois: Tensor) -> bool:
    """Whether box values are checked now: by default on CPU tensors only (on GPU ones the
    check syncs the device; see config.check_box_values), never while compiling."""
    check = config.check_box_values
    return not torch.compiler.is_compiling() and (rois.is_cpu if check is None else check)


def _box_tensor(b: object, input: Tensor, width: int, name: str, hint: str) -> None:
    if not isinstance(b, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(b).__name__}")
    if b.dim() != 2 or b.shape[1] != width:
        raise BoxFormatError(f"{name} must have shape [K, {width}]{hint}, got {tuple(b.shape)}")
    if b.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {b.layout}")
    if not b.is_floating_point():
        if b.is_quantized:
            raise _quantized(name, b)
        raise ValueError(f"{name} must be floating point, got {b.dtype}")
    if b.device != input.device:
        raise ValueError(f"{name} is on {b.device} but the input is on {input.device}")


def _check_values(rois: Tensor, batch_size: int, scale: float, form: BoxFormat = AXIS_ALIGNED) -> None:
    """Rows of ``form``: the batch index an integer in ``[0, batch_size)``, coordinates
    finite and within 2^24 cells after ``scale``, the other columns (an angle) finite."""
    if rois.shape[0] == 0 or rois.is_meta:  # meta tensors hold no values
        return
    k, column = _scan(rois, batch_size, scale)
    if k < 0:
        return
    try:
        row = rois[k].tolist()
        where, index = f"{form.argument} row {k} {row}", f" {row[0]}"
    except RuntimeError:  # no readable storage (torch.func before torch 2.7)
        where, index = f"{form.argument} row {k}", ""
    if column == 0:
        raise ValueError(f"{where}: batch index{index} is not an integer in [0, {batch_size})")
    if column > form.coordinates:
        raise ValueError(f"{where}: the {form.columns[column - 1]} must be finite")
    raise ValueError(f"{where}: coordinates must be finite and within 2^24 feature-map cells after spatial_scale")


def _scan(rois: Tensor, batch_size: int, scale: float) -> tuple[int, int]:
    """The first invalid ``(row, column)``, ``(-1, -1)`` if none: for CPU boxes the C++
    kernels' own check (one pass over the rows, where _first_invalid runs a dozen tensor
    ops), unless their storage cannot be read (functorch transforms, fake tensors)."""
    scan = _row_scan() if rois.is_cpu else None
    if scan is not None:
        try:
            return scan(rois, batch_size, scale)
        except RuntimeError:  # no readable storage
            pass
    return _first_invalid(rois, batch_size, scale)


@functools.cache
def _row_scan() -> Callable[[Tensor, int, float], tuple[int, int]] | None:
    """The C++ row check, if the kernels load."""
    return None if _library.error() else _library.first_invalid


# The formats whose rows the kernels take with a batch index, by the rows' width.
_ROWS_OF_WIDTH = {f.width: f for f in FORMATS if not f.per_image}


def _first_invalid(rois: Tensor, batch_size: int, scale: float) -> tuple[int, int]:
    """``(row, column)`` of the first invalid value, ``(-1, -1)`` if none, of rows of the box
    format of their width; in tensor ops, for any device (the C++ first_invalid is the same
    rule)."""
    last = 1 + _ROWS_OF_WIDTH[rois.shape[1]].coordinates
    index, coords = rois[:, 0], rois[:, 1:last]
    # NaN and infinities fail these comparisons, which need no test of their own.
    # Coordinates in the kernels' arithmetic (x * scale in their type).
    ok_index = (index == index.floor()) & (index >= 0) & (index < batch_size)
    ok_coords = (coords * scale).abs() <= MAX_COORDINATE
    ok = ok_index & ok_coords.all(dim=1)
    if rois.shape[1] > last:
        ok &= torch.isfinite(rois[:, last:]).all(dim=1)
    if bool(ok.all()):  # a device sync on GPU tensors: see config.check_box_values
        return -1, -1
    k = int((~ok).nonzero()[0, 0])
    if not bool(ok_index[k]):
        return k, 0
    bad = (~ok_coords[k]).nonzero()
    if bad.numel():
        return k, 1 + int(bad[0, 0])
    return k, last + int((~torch.isfinite(rois[k, last:])).nonzero()[0, 0])


def _check_max_grid(rois: Tensor, scale: float, h: int, w: int, ratio: int, aligned: bool) -> None:
    """Adaptive grids of mode "max", computed as the kernels do (docs/semantics.md)."""
    if rois.shape[0] == 0 or rois.is_meta:
        return
    pooled = torch.tensor([w, h], dtype=rois.dtype, device=rois.device)
    grid = align_axis(rois[:, 1:3], rois[:, 3:5], scale, pooled, ratio, aligned)[3]  # (gw, gh)
    assert isinstance(grid, Tensor)  # adaptive: rois() checks no fixed ratio
    grid = grid.double()
    bad = (grid > 0).all(dim=1) & (grid[:, 0] * grid[:, 1] > MAX_ARGMAX_GRID)
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        gw, gh = (int(g) for g in grid[k].tolist())
        raise ValueError(f"boxes row {k} {rois[k].tolist()}: mode 'max' with adaptive sampling_ratio gives bins of "
                         f"{gh} x {gw} samples, more than its int32 argmax holds (2^31 - 1); use a larger "
                         f"output_size or a positive sampling_ratio")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_numpy(v: object, name: str) -> bool:
    np = sys.modules.get("numpy")  # only values of an already imported numpy can be numpy's
    return np is not None and isinstance(v, getattr(np, name))


def _int_in(name: str, value: object, high: int) -> int:
    """An int argument in [1, high]."""
    n = _as_int(value)
    if n is None or not 1 <= n <= high:
        raise ValueError(f"{name} must be an int in [1, {high}], got {value!r}")
    return n


def _as_int(v: object) -> int | None:
    """Python, numpy and 0-d tensor integers (as torchvision takes them), not bools."""
    if type(v) is int:
        return v
    if _is_int(v) or _is_numpy(v, "integer"):
        return int(v)  # type: ignore[call-overload]
    if isinstance(v, Tensor) and v.dim() == 0 and not v.is_floating_point() and not v.is_complex() \
            and v.dtype != torch.bool:
        return int(v)
    return None


def _as_float(v: object) -> float | None:
    """Python, numpy and 0-d tensor reals, not bools."""
    if type(v) is float:
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool) or _is_numpy(v, "integer") or _is_numpy(v, "floating"):
        return float(v)  # type: ignore[arg-type]
    if isinstance(v, Tensor) and v.dim() == 0 and not v.is_complex() and v.dtype != torch.bool:
        return float(v)
    return None


def position_sensitive(input: Tensor, h: int, w: int) -> None:
    """Position-sensitive pooling reads ``h * w`` input channels per output channel."""
    c = input.shape[1]
    if c % (h * w) != 0:
        raise ValueError(f"input has {c} channels, not a multiple of output_size's h * w = {h} * {w} = {h * w}: "
                         f"position-sensitive pooling reads h * w input channels per output channel")


def rotated_rois(input: Tensor, boxes: BoxesType, scale: float, degrees: bool, clockwise: bool) -> Tensor:
    """Rotated boxes as ``Tensor[K, 6]`` rows ``(batch_index, cx, cy, w, h, angle)`` or a list
    of N ``Tensor[L_i, 5]`` rows ``(cx, cy, w, h, angle)`` -> contiguous ``[K, 6]`` in the
    kernels' coordinate type with the angle in counter-clockwise radians. ``degrees``: the
    angle is converted as ``angle * pi / 180`` in float64 (detectron2's arithmetic) and
    rounded once; ``clockwise``: it is negated."""
    rows = _box_rows(input, boxes, ROTATED, torch.float64)
    if degrees or clockwise:
        # Out of place: torch 2.6's ONNX export cannot decompose an in-place op on a view.
        turn = rows.narrow(1, 5, 1)
        # pi as a float64 tensor: an exported graph would store a Python number as float32.
        turn = turn * turn.new_tensor(math.pi) / 180.0 if degrees else turn
        rows = torch.cat([rows.narrow(1, 0, 5), -turn if clockwise else turn], dim=1)
    out = dense(rows, _coord_type(input))
    if _checking_values(out):
        _check_values(out, input.shape[0], scale, ROTATED)
    return out


def bezier_rois(input: Tensor, beziers: BoxesType, scale: float) -> Tensor:
    """Bezier boxes as ``Tensor[K, 17]`` rows ``(batch_index, x0, y0, ..., x7, y7)`` or a list
    of N ``Tensor[L_i, 16]`` -> contiguous ``[K, 17]`` in the kernels' coordinate type; every
    coordinate finite and within 2^24 cells after ``scale``."""
    out = _box_rows(input, beziers, BEZIER, _coord_type(input))
    if _checking_values(out):
        _check_values(out, input.shape[0], scale, BEZIER)
    return out


# ---- boxes per image (border align) and pool_size


def pool_size(value: object) -> int:
    return _int_in("pool_size", value, MAX_POOL_SIZE)


def border_boxes(input: Tensor, boxes: object) -> Tensor:
    """Boxes ``Tensor[N, K, 4]`` (rows ``(x1, y1, x2, y2)`` of image n's box k, in
    feature-map cells) -> contiguous, in the kernels' coordinate type; each coordinate
    finite and within 2^24 cells (checked as for the other ops' boxes)."""
    name, width, hint = PER_IMAGE.argument, PER_IMAGE.width, PER_IMAGE.hint(batch_index=False)
    if not isinstance(boxes, Tensor):
        raise TypeError(f"{name} must be a Tensor[N, K, {width}], got {type(boxes).__name__}")
    if boxes.dim() != 3 or boxes.shape[2] != width:
        raise BoxFormatError(f"{name} must have shape [N, K, {width}]{hint}, got {tuple(boxes.shape)}")
    if boxes.shape[0] != input.shape[0]:
        raise ValueError(f"{name} holds boxes for {boxes.shape[0]} images but the input has batch size "
                         f"{input.shape[0]}")
    _box_tensor(boxes.flatten(0, 1), input, width, name, hint)
    out = dense(boxes, _coord_type(input))
    if _checking_values(out) and out.numel() and not out.is_meta:
        ok = (out.abs() <= MAX_COORDINATE).all(dim=2)  # NaN fails too
        if not bool(ok.all()):
            n, k = (int(i) for i in (~ok).nonzero()[0])
            raise ValueError(f"{name}[{n}, {k}] {out[n, k].tolist()}: coordinates must be finite and within 2^24 "
                             "feature-map cells")
    return out


# ---- masks (paste_masks, mask_targets) ------------------------------------------------

def paste_masks_stack(masks: object) -> Tensor:
    """Masks to paste: floating ``[K, Mh, Mw]``, or ``[K, 1, Mh, Mw]`` (a mask head's output for
    one class), as ``[K, Mh, Mw]``."""
    if not isinstance(masks, Tensor):
        raise TypeError(f"masks must be a Tensor, got {type(masks).__name__}")
    if masks.dim() == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if masks.dim() != 3:
        raise ValueError(f"masks must be 3-D [K, M, M] or [K, 1, M, M], got shape {tuple(masks.shape)}")
    _floating("masks", masks)
    if not (0 < masks.shape[1] <= MAX_MAP_SIDE and 0 < masks.shape[2] <= MAX_MAP_SIDE):
        raise ValueError(f"masks must have sides in [1, 2^24], got shape {tuple(masks.shape)}")
    return masks


def image_size(value: object) -> tuple[int, int]:
    """``(height, width)`` of an image: two ints in [0, 2^24]."""
    if isinstance(value, (tuple, list, torch.Size)) and len(value) == 2:
        h, w = _as_int(value[0]), _as_int(value[1])
        if h is not None and w is not None and 0 <= h <= MAX_MAP_SIDE and 0 <= w <= MAX_MAP_SIDE:
            return h, w
    raise ValueError(f"image_size must be (height, width), two ints in [0, 2^24], got {value!r}")


def threshold(value: object) -> float | None:
    """None (no threshold) or a finite real."""
    return None if value is None else finite("threshold", value)


def paste_boxes(boxes: object, masks: Tensor) -> Tensor:
    """One box per mask: ``Tensor[K, 4]`` of rows ``(x1, y1, x2, y2)`` in image pixels, finite
    and within 2^24 -> contiguous, in the masks' coordinate type."""
    if not isinstance(boxes, Tensor):
        raise TypeError(f"boxes must be a Tensor, got {type(boxes).__name__}")
    if boxes.dim() != 2 or boxes.shape[1] != 4 or boxes.shape[0] != masks.shape[0]:
        raise BoxFormatError(f"boxes must be [K, 4] (rows (x1, y1, x2, y2)) with K = {masks.shape[0]} masks, "
                             f"got shape {tuple(boxes.shape)}")
    if not boxes.is_floating_point():
        raise ValueError(f"boxes must be floating point, got {boxes.dtype}")
    if boxes.device != masks.device:
        raise ValueError(f"boxes is on {boxes.device} but masks is on {masks.device}")
    out = dense(boxes, _coord_type(masks))
    if _checking_values(out) and out.numel() and not out.is_meta:
        bad = ~(out.abs() <= MAX_COORDINATE)
        if bool(bad.any()):
            k = int(bad.any(dim=1).nonzero()[0, 0])
            raise ValueError(f"boxes row {k} {boxes[k].tolist()}: coordinates must be finite and within 2^24 pixels")
    return out


def target_masks(masks: object) -> Tensor:
    """Ground-truth bit masks ``[G, H, W]``: bool, uint8 or floating, read as they are."""
    if not isinstance(masks, Tensor):
        raise TypeError(f"masks must be a Tensor or a list of polygons, got {type(masks).__name__}")
    if masks.dim() != 3:
        raise ValueError(f"masks must be 3-D [G, H, W], got shape {tuple(masks.shape)}")
    if masks.layout != torch.strided:
        raise ValueError(f"masks must be a dense (strided) tensor, got layout {masks.layout}")
    if masks.dtype not in (torch.bool, torch.uint8, *DTYPES):
        raise ValueError(f"masks must be bool, uint8 or floating point, got {masks.dtype}")
    if not (masks.shape[0] <= MAX_MAP_SIDE and masks.shape[1] <= MAX_MAP_SIDE and masks.shape[2] <= MAX_MAP_SIDE):
        raise ValueError(f"masks must have at most 2^24 masks and sides of at most 2^24, got {tuple(masks.shape)}")
    return masks


def target_rois(masks: Tensor, boxes: object, indices: object) -> Tensor:
    """Proposal ``p``'s row ``(indices[p], x1, y1, x2, y2)`` -> contiguous ``[P, 5]`` in the
    masks' coordinate type; indices integers in ``[0, G)``."""
    if not isinstance(boxes, Tensor):
        raise TypeError(f"boxes must be a Tensor, got {type(boxes).__name__}")
    if not isinstance(indices, Tensor):
        raise TypeError(f"indices must be a Tensor, got {type(indices).__name__}")
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise BoxFormatError(f"boxes must be [P, 4] (rows (x1, y1, x2, y2)), got shape {tuple(boxes.shape)}")
    if not boxes.is_floating_point():
        raise ValueError(f"boxes must be floating point, got {boxes.dtype}")
    if indices.dim() != 1 or indices.shape[0] != boxes.shape[0]:
        raise ValueError(f"indices must be [P] with P = {boxes.shape[0]} boxes, got shape {tuple(indices.shape)}")
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise ValueError(f"indices must be integers, got {indices.dtype}")
    for name, t in (("boxes", boxes), ("indices", indices)):
        if t.device != masks.device:
            raise ValueError(f"{name} is on {t.device} but masks is on {masks.device}")
    dtype = _coord_type(masks)
    rois = torch.cat([indices.to(dtype)[:, None], boxes.to(dtype)], dim=1)
    if _checking_values(rois) and rois.shape[0] and not rois.is_meta:
        g = masks.shape[0]
        bad = (indices < 0) | (indices >= g)
        if bool(bad.any()):
            p = int(bad.nonzero()[0, 0])
            raise ValueError(f"indices[{p}] = {int(indices[p])} is not a mask index in [0, {g})")
        k, _ = _scan(rois, g, 1.0)
        if k >= 0:
            raise ValueError(f"boxes row {k} {boxes[k].tolist()}: coordinates must be finite and within 2^24 pixels")
    return rois


def packed_polygons(polygons: list[Any]) -> tuple[Tensor, Tensor, Tensor]:
    """Polygons, G instances of polygons ``[x0, y0, x1, y1, ...]`` (lists, numpy arrays or
    tensors) -> CPU ``(coords float64 [2V], vertex_offsets int64 [n + 1], polygon_offsets
    int64 [G + 1])``, through NumPy: a data loader's float64 arrays are taken as they are
    (roiops needs NumPy for polygons alone)."""
    import numpy as np

    flat: list[Any] = []
    per_instance = np.zeros(len(polygons) + 1, dtype=np.int64)
    for g, instance in enumerate(polygons):
        if not isinstance(instance, (list, tuple)):
            raise TypeError(f"masks[{g}] must be a list of polygons, got {type(instance).__name__}")
        for i, polygon in enumerate(instance):
            if isinstance(polygon, Tensor):
                polygon = polygon.detach().cpu().numpy()
            try:
                a = np.asarray(polygon, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError) as e:
                raise TypeError(f"masks[{g}][{i}] must be a flat sequence of coordinates: {e}") from None
            if a.size % 2:
                raise ValueError(f"masks[{g}][{i}] must hold (x, y) pairs, got {a.size} values")
            flat.append(a)
        per_instance[g + 1] = len(instance)
    vertex_offsets = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum([a.size // 2 for a in flat], out=vertex_offsets[1:])
    coords = np.concatenate(flat) if flat else np.zeros(0, dtype=np.float64)
    return torch.from_numpy(coords), torch.from_numpy(vertex_offsets), torch.from_numpy(np.cumsum(per_instance))


def polygon_rows(polygons: list[Any], boxes: object, indices: object) -> None:
    """Boxes ``[P, 4]`` (floating, finite) and indices ``[P]`` (integers in ``[0, G)``) of
    polygon targets."""
    if not isinstance(boxes, Tensor) or boxes.dim() != 2 or boxes.shape[1] != 4 or not boxes.is_floating_point():
        raise BoxFormatError(f"boxes must be a floating-point Tensor[P, 4], got {getattr(boxes, 'shape', boxes)!r}")
    if not isinstance(indices, Tensor) or indices.dim() != 1 or indices.shape[0] != boxes.shape[0] or \
            indices.is_floating_point() or indices.dtype == torch.bool:
        raise ValueError(f"indices must be an integer Tensor[P] with P = {boxes.shape[0]} boxes")
    if boxes.numel() and not bool(boxes.isfinite().all()):
        k = int((~boxes.isfinite()).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"boxes row {k} {boxes[k].tolist()}: coordinates must be finite")
    bad = ((indices < 0) | (indices >= len(polygons))).nonzero()
    if bad.numel():
        p = int(bad[0, 0])
        raise ValueError(f"indices[{p}] = {int(indices[p])} is not an instance in [0, {len(polygons)})")


# ---- point clouds


def lidar_points(points: object, batched: bool) -> Tensor:
    """Points ``[N, 3]`` (``[B, N, 3]`` when ``batched``) of rows ``(x, y, z)``, floating."""
    shape = "[B, N, 3]" if batched else "[N, 3]"
    if not isinstance(points, Tensor):
        raise TypeError(f"points must be a Tensor{shape}, got {type(points).__name__}")
    if points.dim() != 2 + batched or points.shape[-1] != 3:
        raise ValueError(f"points must have shape {shape} (rows (x, y, z)), got {tuple(points.shape)}")
    _floating("points", points)
    if points.shape[-2] > MAX_POINTS:
        raise ValueError(f"points: at most 2^31 - 1 points, got {points.shape[-2]}")
    return points


def point_features(features: object, points: Tensor) -> Tensor:
    """Features ``[..., N, C]`` of ``points`` ``[..., N, 3]``, floating, on their device."""
    lead = "[B, N, C]" if points.dim() == 3 else "[N, C]"
    if not isinstance(features, Tensor):
        raise TypeError(f"features must be a Tensor{lead}, got {type(features).__name__}")
    if features.dim() != points.dim() or features.shape[:-1] != points.shape[:-1]:
        raise ValueError(f"features must have shape {lead} with the points' {lead[1:-4]} = "
                         f"{tuple(points.shape[:-1])}, got {tuple(features.shape)}")
    _floating("features", features)
    if features.device != points.device:
        raise ValueError(f"features is on {features.device} but points is on {points.device}")
    return features


def lidar_boxes(boxes: object, points: Tensor) -> Tensor:
    """LiDAR boxes ``[M, 7]`` (``[B, M, 7]`` for batched points), rows ``(x, y, z, dx, dy,
    dz, yaw)``, converted to the points' dtype. Their values, and the points', are checked
    where box values are (config.check_box_values): finite, sizes >= 0."""
    batched = points.dim() == 3
    shape = "[B, M, 7]" if batched else "[M, 7]"
    if not isinstance(boxes, Tensor):
        raise TypeError(f"boxes must be a Tensor{shape}, got {type(boxes).__name__}")
    if boxes.dim() != 2 + batched or boxes.shape[-1] != 7:
        raise BoxFormatError(f"boxes must have shape {shape} (rows {LIDAR.rows()}), got {tuple(boxes.shape)}")
    if batched and boxes.shape[0] != points.shape[0]:
        raise ValueError(f"boxes has batch size {boxes.shape[0]} but points has {points.shape[0]}")
    _floating("boxes", boxes)
    if boxes.device != points.device:
        raise ValueError(f"boxes is on {boxes.device} but points is on {points.device}")
    boxes = boxes.to(points.dtype)
    if _checking_values(boxes) and not boxes.is_meta:
        _lidar_values(points, boxes)
    return boxes


def _lidar_values(points: Tensor, boxes: Tensor) -> None:
    flat = boxes.detach().reshape(-1, 7)
    bad = ~torch.isfinite(flat).all(1) | (flat[:, 3:6] < 0).any(1)
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        where = f"boxes row {k} {flat[k].tolist()}" if boxes.dim() == 2 else \
            f"boxes[{k // boxes.shape[1]}] row {k % boxes.shape[1]} {flat[k].tolist()}"
        raise ValueError(f"{where}: values must be finite and the sizes (dx, dy, dz) >= 0")
    finite = torch.isfinite(points.detach()).all(-1).reshape(-1)
    if not bool(finite.all()):
        p = int((~finite).nonzero()[0, 0])
        where = f"points row {p}" if points.dim() == 2 else f"points[{p // points.shape[1]}] row {p % points.shape[1]}"
        raise ValueError(f"{where} {points.detach().reshape(-1, 3)[p].tolist()}: coordinates must be finite")


def voxel_grid(value: object) -> tuple[int, int, int]:
    """RoIAwarePool3d's output size: an int ``s`` for ``(s, s, s)`` or ``(x, y, z)``, each in
    [1, MAX_VOXEL_SIDE]."""
    n = _as_int(value)
    sides = (n, n, n) if n is not None else tuple(_as_int(v) for v in value) \
        if isinstance(value, (tuple, list)) and len(value) == 3 else None
    if sides is None or any(s is None or not 1 <= s <= MAX_VOXEL_SIDE for s in sides):
        raise ValueError(f"out_size must be an int or a triple of ints in [1, {MAX_VOXEL_SIDE}], got {value!r}")
    return sides  # type: ignore[return-value]


def count(name: str, value: object) -> int:
    """A count of points (per voxel, per box) in [1, 2^31 - 1]."""
    return _int_in(name, value, MAX_POINTS)
