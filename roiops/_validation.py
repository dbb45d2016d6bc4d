"""The one validation and box-format layer between the public API and the ops.

Everything a user can pass wrong is checked here, with a message that names the
argument (and for box values, the first offending row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard, Union

import torch
from torch import Tensor

from . import config

BoxesType = Union[Tensor, Sequence[Tensor]]
MAX_COORDINATE = 2.0**24  # in feature-map cells; the C++ kernels refuse beyond it too


def output_size(value: object) -> tuple[int, int]:
    """``int`` or ``(h, w)`` of positive ints -> ``(h, w)``."""
    pair = (value, value) if _is_int(value) else value
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(_is_int(v) for v in pair)
            or not all(int(v) > 0 for v in pair)):
        raise ValueError(f"output_size must be a positive int or a pair (h, w) of positive ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def spatial_scale(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < float("inf")):
        raise ValueError(f"spatial_scale must be a positive finite number, got {value!r}")
    return float(value)


def sampling_ratio(value: object) -> int:
    if not _is_int(value):
        raise ValueError(f"sampling_ratio must be an int (<= 0 for adaptive), got {value!r}")
    return int(value)


def choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def feature_map(input: object) -> Tensor:
    if not isinstance(input, Tensor):
        raise TypeError(f"input must be a Tensor, got {type(input).__name__}")
    if input.dim() != 4:
        raise ValueError(f"input must be 4-D [N, C, H, W], got shape {tuple(input.shape)}")
    if not input.is_floating_point():
        raise ValueError(f"input must be floating point, got {input.dtype}")
    if input.shape[2] == 0 or input.shape[3] == 0:
        raise ValueError(f"input height and width must be positive, got shape {tuple(input.shape)}")
    return input


def rois(input: Tensor, boxes: BoxesType, scale: float) -> Tensor:
    """Boxes as ``Tensor[K, 5]`` or a list of N ``Tensor[L_i, 4]`` -> contiguous ``[K, 5]``
    in the kernels' coordinate type (float64 for float64 input, float32 otherwise)."""
    coord_type = torch.float64 if input.dtype == torch.float64 else torch.float32
    if isinstance(boxes, Tensor):
        _box_tensor(boxes, input, 5, "boxes")
        out = boxes.to(coord_type).contiguous()
    elif isinstance(boxes, (list, tuple)):
        if len(boxes) != input.shape[0]:
            raise ValueError(f"boxes is a list of {len(boxes)} tensors but the input has batch size {input.shape[0]}")
        for i, b in enumerate(boxes):
            _box_tensor(b, input, 4, f"boxes[{i}]")
        if boxes:
            parts = [torch.cat([torch.full_like(b[:, :1], i, dtype=coord_type), b.to(coord_type)], dim=1)
                     for i, b in enumerate(boxes)]
            out = torch.cat(parts, dim=0)
        else:
            out = input.new_zeros((0, 5), dtype=coord_type)
    else:
        raise TypeError(f"boxes must be a Tensor[K, 5] or a list of Tensor[L, 4], got {type(boxes).__name__}")
    if config.check_box_values and not torch.compiler.is_compiling():
        _check_values(out, input.shape[0], scale)
    return out


def _box_tensor(b: object, input: Tensor, width: int, name: str) -> None:
    if not isinstance(b, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(b).__name__}")
    if b.dim() != 2 or b.shape[1] != width:
        hint = " (rows (batch_index, x1, y1, x2, y2))" if width == 5 else " (rows (x1, y1, x2, y2))"
        raise ValueError(f"{name} must have shape [K, {width}]{hint}, got {tuple(b.shape)}")
    if not b.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {b.dtype}")
    if b.device != input.device:
        raise ValueError(f"{name} is on {b.device} but the input is on {input.device}")


def _check_values(rois: Tensor, batch_size: int, scale: float) -> None:
    if rois.shape[0] == 0 or rois.device.type == "meta":  # meta tensors hold no values
        return
    index, coords = rois[:, 0], rois[:, 1:]
    bad_index = ~torch.isfinite(index) | (index != index.floor()) | (index < 0) | (index >= batch_size)
    bad_coord = ~torch.isfinite(coords).all(dim=1) | ((coords * scale).abs() > MAX_COORDINATE).any(dim=1)
    bad = bad_index | bad_coord
    if bool(bad.any()):  # one device sync on GPU tensors; see config.check_box_values
        k = int(bad.nonzero()[0, 0])
        row = rois[k].tolist()
        if bool(bad_index[k]):
            raise ValueError(f"boxes row {k} {row}: batch index {row[0]} is not an integer in [0, {batch_size})")
        raise ValueError(f"boxes row {k} {row}: coordinates must be finite and within 2^24 feature-map cells "
                         f"after spatial_scale")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)
