"""The argument check of the kernel contract (docs/architecture.md): one check per kernel
function, built from its op's declaration, which the Triton launchers and the reference
kernels run first. The C++ kernels (csrc/checks.h) refuse the same arguments in the same
order with the same exception types and messages, so that a direct
``torch.ops.roiops`` call, which skips the public API's validation, fails alike on every
backend.

A separate module from ``_validation``, which normalises what users pass to the public
functions (box lists, numpy scalars, output_size pairs) and reads box values: this one
checks the registered ops' own arguments by their schema names, reads only shapes, dtypes,
devices and Python scalars (no host sync on a GPU), and sits below the ops, beside the
kernels that run it.

What a check knows of its op comes from its declaration (``roiops._registry``) when it is
built: the function's parameters and their schema types (``Kernels.args``, ``backward``,
``saved``, ``tensors``), the box format (``OpSpec.boxes``) and whether
the op is position-sensitive. The checks, in this order (the map tensor is ``input``, or ``grad``
in a backward):

1. argument types, by schema type (Python only: the op schema refuses them before any
   kernel, and the dispatcher before a C++ one): TypeError;
2. the map tensor: 4-D; floating point; one of the kernels' dtypes (all ValueError from
   here on: the only Python exception a C++ kernel can raise for a refused argument);
3. rois: ``[K, width]`` of the op's box format (``roiops._boxes``); floating point, float64 for a float64 map
   (other floating dtypes are converted to the opmath type); on the map's device;
   extra tensor inputs on the map's device; per-bin tensors (``Kernels.bin_channels``)
   floating point with the dtype rule of rois;
4. a backward's ``batch_size`` and ``channels`` >= 0; the map's height and width in
   [1, 2^24];
5. the pooled size in [1, 65536] (roi_pool's backward: grad's last two sizes);
   ``spatial_scale`` in [2^-64, 2^64]; ``sampling_ratio`` <= 1024;
6. position-sensitive ops: channels a multiple of ``pooled_height * pooled_width``;
   per-bin tensors ``[K, n, pooled_height, pooled_width]``;
   an op with ``channel_groups``: that argument in [1, 2^16], dividing the channels;
7. ``grad`` of the forward output's shape ``[K, C_out, pooled_height, pooled_width]``
   (a box gradient's: floating point, the input's dtype, on its device);
8. a saved ``argmax``: grad's shape, int32, on grad's device.

An op with boxes per image (``BoxFormat.per_image``: border align) has its own
check, in the same order: rois ``[N, K, 4]`` with N the map's batch size, its
``pool_size`` in [1, MAX_POOL_SIZE], the map's channels a multiple of 4 (one group per
border), grad of the forward output's shape (``Kernels.output_shape``).

Box rows and argmax *values* are not looked at: the C++ and reference kernels check them
on the data (a ValueError naming the row), the Triton kernels mask them (no host sync).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._geometry import (MAX_MAP_SIDE, MAX_ORIENTATIONS, MAX_OUTPUT_SIZE, MAX_POOL_SIZE, MAX_SAMPLING_RATIO, MAX_SCALE,
                        MAX_VOXEL_SIDE, MIN_SCALE)
from ._boxes import BoxFormat
from ._registry import declaration


_KERNEL_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_INT32_MAX = 2**31 - 1
_PYTHON_TYPES = {"Tensor": Tensor, "int": int, "float": float, "bool": bool}


def parameters(name: str, role: str) -> list[tuple[str, str]]:
    """``(name, schema type)`` of kernel function ``<name>_<role>``'s parameters, in the
    kernel contract's order (the registered op's)."""
    return declaration(name)[1].parameters(role)


def kernel_check(name: str, role: str = "forward", *, empty_map: bool = False,
                 int64_argmax: bool = False) -> Callable[..., None]:
    """The check of kernel function ``<name>_<role>`` (role ``"forward"``, ``"backward"``, or
    a gradient that reads the input: ``"rois_backward"``, ``"<t>_backward"`` for an extra
    tensor t): ``check(*args)`` with the function's arguments in its order
    raises for what the kernel must refuse (the module docstring), else returns None.
    Built once, when a kernel module is imported: a call reads no declaration.

    A forward whose declaration has ``plane_argmax`` (roi_pool) refuses ``H * W >= 2^31``.
    ``empty_map`` and ``int64_argmax``: what
    the reference kernels of RoIAlign and RoIPool also take (tests/test_reference.py),
    a map of height or width 0 and an int64 argmax; no other kernel does."""
    spec, k = declaration(name)
    params = k.parameters(role)
    if spec.boxes.per_image:
        return _per_image_check(name, role, k, params, spec.boxes)
    names = [n for n, _ in params]
    pos = {n: i for i, n in enumerate(names)}
    main_name = "grad" if role == "backward" else "input"
    main, at_rois = pos[main_name], pos["rois"]
    width = spec.boxes.width
    rois_shape = f"roiops: rois must be [K, {width}] (rows {spec.boxes.rows(kernel=True)})"
    layout = "[K, C, pooled_height, pooled_width]" if main_name == "grad" else "[N, C, H, W]"
    # Argument types: the call's types, in one comparison, where every argument has its
    # schema type exactly (a plain Tensor, a Python int, float, bool); otherwise each is
    # checked (subclasses, numpy scalars, an int for a float, None for a Tensor?).
    expected = tuple(_PYTHON_TYPES[t.rstrip("?")] for _, t in params)
    kinds = tuple((i, n, t) for i, (n, t) in enumerate(params))
    at_pooled = (pos["pooled_height"], pos["pooled_width"]) if "pooled_height" in pos else None
    at_scale, at_ratio = pos.get("spatial_scale"), pos.get("sampling_ratio")
    at_argmax = pos.get("argmax")
    at_grad = pos["grad"] if "input" in pos and role != "forward" else None
    sizes = operator.itemgetter(*(pos[n] for n in ("batch_size", "channels", "height", "width"))) \
        if role == "backward" else None
    extra = tuple((pos[n], n) for n, _ in k.tensors)
    per_bin = tuple((pos[n], n, c) for n, c in k.bin_channels.items())
    out_channels = k.out_channels
    position_sensitive = spec.position_sensitive
    at_groups = pos[k.channel_groups] if k.channel_groups else None
    plane_argmax = k.plane_argmax and role == "forward"
    min_side = 0 if empty_map else 1
    argmax_dtypes = (torch.int32, torch.int64) if int64_argmax else (torch.int32,)

    def check(*args: Any) -> None:
        if tuple(map(type, args)) != expected:
            _check_types(kinds, args)
        x, rois = args[main], args[at_rois]
        # 2. the map tensor
        dtype = _map_tensor(x, main_name, layout)
        # 3. rois and the other tensors' devices
        if rois.dim() != 2 or rois.shape[1] != width:
            raise ValueError(f"{rois_shape}, got {list(rois.shape)}")
        device = x.device
        _rois_placement(rois, main_name, dtype, device)
        for i, n in extra:
            t = args[i]
            if t is not None and t.device != device:
                raise ValueError(f"roiops: {n} is on {t.device} but {main_name} is on {device}")
        for i, n, _ in per_bin:
            t = args[i]
            if t is not None and t.dtype != dtype and (t.dtype != torch.float32 or dtype == torch.float64):
                _coordinate_dtype(n, t.dtype, main_name, dtype)
        # 4. sizes
        _, C, H, W = _map_sizes(x, sizes, args, min_side)
        # 5. scalars
        if at_pooled is None:  # roi_pool's backward: the pooled size is grad's
            ph, pw, source = x.shape[2], x.shape[3], " (grad's last two sizes)"
        else:
            ph, pw, source = args[at_pooled[0]], args[at_pooled[1]], ""
        if not (0 < ph <= MAX_OUTPUT_SIZE and 0 < pw <= MAX_OUTPUT_SIZE):
            raise ValueError(f"roiops: output size must be in [1, {MAX_OUTPUT_SIZE}], got pooled_height={ph}, "
                             f"pooled_width={pw}{source}")
        if at_scale is not None and not MIN_SCALE <= args[at_scale] <= MAX_SCALE:
            raise ValueError(f"roiops: spatial_scale must be in [2^-64, 2^64], got {float(args[at_scale]):g}")
        if at_ratio is not None and args[at_ratio] > MAX_SAMPLING_RATIO:
            raise ValueError(f"roiops: sampling_ratio must be at most {MAX_SAMPLING_RATIO} (<= 0 for adaptive), "
                             f"got {args[at_ratio]}")
        # 6. channels
        if position_sensitive and C % (ph * pw):
            raise ValueError(f"roiops: input channels ({C}) must be a multiple of pooled_height * pooled_width "
                             f"({ph} * {pw})")
        for i, n, c in per_bin:
            t = args[i]
            if t is not None and t.shape != (rois.shape[0], c, ph, pw):
                raise ValueError(f"roiops: {n} must be [K, {c}, pooled_height, pooled_width] = "
                                 f"{[rois.shape[0], c, ph, pw]}, got {list(t.shape)}")
        if at_groups is not None:
            _check_groups(k.channel_groups, args[at_groups], C)
        if plane_argmax and H * W > _INT32_MAX:
            raise ValueError(f"roiops: roi_pool needs H * W < 2^31 (its argmax is the int32 h * W + w), got input "
                             f"height {H} and width {W}")
        if role == "forward":
            return
        # 7. grad
        grad = x if at_grad is None else args[at_grad]
        c_out = C if out_channels is None else out_channels(C, ph, pw)
        if grad.shape != (rois.shape[0], c_out, ph, pw):
            raise ValueError(f"roiops: grad must be [K, C_out, pooled_height, pooled_width] = "
                             f"{[rois.shape[0], c_out, ph, pw]} (the forward output's shape), got {list(grad.shape)}")
        if at_grad is not None:
            if grad.dtype != dtype:
                _grad_dtype(grad.dtype, dtype)
            if grad.device != device:
                raise ValueError(f"roiops: grad is on {grad.device} but input is on {device}")
        # 8. argmax
        if at_argmax is not None:
            argmax = args[at_argmax]
            if argmax.shape != grad.shape:
                raise ValueError(f"roiops: argmax must have the shape of grad {list(grad.shape)}, got "
                                 f"{list(argmax.shape)}")
            if argmax.dtype not in argmax_dtypes:
                raise ValueError(f"roiops: argmax must be int32, got {argmax.dtype}")
            if argmax.device != device:
                raise ValueError(f"roiops: argmax is on {argmax.device} but grad is on {device}")

    check.__qualname__ = check.__name__ = f"check_{name}_{role}"
    return check


def _per_image_check(name: str, role: str, k: Any, params: list[tuple[str, str]],
                     form: BoxFormat) -> Callable[..., None]:
    """kernel_check for an op with boxes ``[N, K, 4]`` per image and a ``pool_size``."""
    pos = {n: i for i, (n, _) in enumerate(params)}
    main_name = "grad" if role == "backward" else "input"
    main, at_rois, at_pool = pos[main_name], pos["rois"], pos["pool_size"]
    layout = "[N, C, K, 4]" if main_name == "grad" else "[N, 4C, H, W]"
    expected = tuple(_PYTHON_TYPES[t.rstrip("?")] for _, t in params)
    kinds = tuple((i, n, t) for i, (n, t) in enumerate(params))
    sizes = operator.itemgetter(*(pos[n] for n in ("batch_size", "channels", "height", "width"))) \
        if role == "backward" else None
    at_argmax = pos.get("argmax", 0)
    width = form.width
    rois_shape = f"roiops: rois must be [N, K, {width}] (rows {form.rows(batch_index=False)})"

    def check(*args: Any) -> None:
        if tuple(map(type, args)) != expected:
            _check_types(kinds, args)
        x, rois = args[main], args[at_rois]
        dtype = _map_tensor(x, main_name, layout)
        if rois.dim() != 3 or rois.shape[2] != width:
            raise ValueError(f"{rois_shape}, got {list(rois.shape)}")
        device = x.device
        _rois_placement(rois, main_name, dtype, device)
        N, C, H, W = _map_sizes(x, sizes, args, 1)
        if rois.shape[0] != N:
            raise ValueError(f"roiops: rois must hold boxes for each of the {N} images ([N, K, 4]), got "
                             f"{list(rois.shape)}")
        pool_size = args[at_pool]
        if not 1 <= pool_size <= MAX_POOL_SIZE:
            raise ValueError(f"roiops: pool_size must be in [1, {MAX_POOL_SIZE}], got {pool_size}")
        if C % 4:
            raise ValueError(f"roiops: input channels ({C}) must be a multiple of 4 (top, left, bottom, right)")
        if role == "forward":
            return
        out = k.output_shape((N, C, H, W), rois.shape, {"pool_size": pool_size})
        if x.shape != out:
            raise ValueError(f"roiops: grad must be [N, C / 4, K, 4] = {list(out)} (the forward output's shape), "
                             f"got {list(x.shape)}")
        argmax = args[at_argmax]
        if argmax.shape != x.shape:
            raise ValueError(f"roiops: argmax must have the shape of grad {list(x.shape)}, got {list(argmax.shape)}")
        if argmax.dtype != torch.int32:
            raise ValueError(f"roiops: argmax must be int32, got {argmax.dtype}")
        if argmax.device != device:
            raise ValueError(f"roiops: argmax is on {argmax.device} but grad is on {device}")

    check.__qualname__ = check.__name__ = f"check_{name}_{role}"
    return check


def _map_tensor(x: Tensor, name: str, layout: str) -> torch.dtype:
    """The map tensor's check: 4-D, of a kernel dtype; returns its dtype."""
    if x.dim() != 4:
        raise ValueError(f"roiops: {name} must be 4-D {layout}, got {x.dim()}-D")
    dtype = x.dtype
    if dtype not in _KERNEL_DTYPES:
        _unsupported(name, dtype)
    return dtype


def _rois_placement(rois: Tensor, main_name: str, dtype: torch.dtype, device: torch.device) -> None:
    """The boxes' dtype (the coordinate type's rule) and device."""
    if rois.dtype != dtype and (rois.dtype != torch.float32 or dtype == torch.float64):
        _coordinate_dtype("rois", rois.dtype, main_name, dtype)
    if rois.device != device:
        raise ValueError(f"roiops: rois is on {rois.device} but {main_name} is on {device}")


def _map_sizes(x: Tensor, sizes: Callable[..., Any] | None, args: tuple[Any, ...],
               min_side: int) -> tuple[int, int, int, int]:
    """N, C, H, W: the map's shape, or a backward's batch_size, channels, height and width
    arguments (``sizes`` picks them; N and C non-negative); H and W in [min_side, 2^24]."""
    if sizes is None:
        N, C, H, W = x.shape
    else:
        N, C, H, W = sizes(args)
        if N < 0 or C < 0:
            raise ValueError(f"roiops: batch size and channels must be non-negative, got batch_size={N}, "
                             f"channels={C}")
    if not (min_side <= H <= MAX_MAP_SIDE and min_side <= W <= MAX_MAP_SIDE):
        _map_size(H, W)
    return N, C, H, W


# ---- the messages of the checks' less common failures (kept out of check's body)


def _check_types(kinds: tuple[tuple[int, str, str], ...], args: tuple[Any, ...]) -> None:
    """TypeError for the first argument that is not of its schema type: a Tensor (None too
    for a ``Tensor?``), an integer, a real number (for a float), a bool; bool is no number
    here, and a Tensor is none either (reading it would sync a GPU)."""
    if len(args) != len(kinds):
        raise TypeError(f"roiops: the kernel takes {len(kinds)} arguments "
                        f"({', '.join(n for _, n, _ in kinds)}), got {len(args)}")
    for i, name, kind in kinds:
        v = args[i]
        if kind == "Tensor?" and v is None:
            continue
        if kind in ("Tensor", "Tensor?"):
            ok, what = isinstance(v, Tensor), "a Tensor"
        elif kind == "int":
            ok, what = isinstance(v, numbers.Integral) and not isinstance(v, bool), "an int"
        elif kind == "float":
            ok, what = isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"
        else:
            ok, what = isinstance(v, bool), "a bool"
        if not ok:
            raise TypeError(f"roiops: {name} must be {what}, got {type(v).__name__}")


def _unsupported(name: str, dtype: torch.dtype) -> None:
    if not dtype.is_floating_point:
        raise ValueError(f"roiops: {name} must be floating point, got {dtype}")
    # float8 types: floating point, but no kernel.
    raise ValueError(f"roiops: {name} dtype {dtype} is not implemented; expected float16, bfloat16, float32 or "
                     "float64")


def _coordinate_dtype(name: str, got: torch.dtype, main_name: str, dtype: torch.dtype) -> None:
    """The dtype rule of rois and per-bin tensors, which the kernels use in the coordinate type."""
    if not got.is_floating_point:
        raise ValueError(f"roiops: {name} must be floating point, got {got}")
    if dtype == torch.float64:
        raise ValueError(f"roiops: {name} must be float64 for a float64 {main_name}, got {got}")
    # Any other floating dtype is converted to float32 by the kernels.


def _check_groups(name: str, groups: int, channels: int) -> None:
    if not 1 <= groups <= MAX_ORIENTATIONS:
        raise ValueError(f"roiops: {name} must be in [1, {MAX_ORIENTATIONS}], got {groups}")
    if channels % groups:
        raise ValueError(f"roiops: channels ({channels}) must be a multiple of {name} ({groups})")


def _map_size(height: int, width: int) -> None:
    if height <= 0 or width <= 0:
        raise ValueError(f"roiops: input height and width must be positive, got height={height}, width={width}")
    raise ValueError(f"roiops: input height and width must be at most 2^24, got {height} x {width}")


def _grad_dtype(got: torch.dtype, want: torch.dtype) -> None:
    if not got.is_floating_point:
        raise ValueError(f"roiops: grad must be floating point, got {got}")
    raise ValueError(f"roiops: grad must have the input's dtype {want}, got {got}")



# ---- masks: the checks of csrc/paste_masks.cpp and csrc/mask_targets.cpp ---------------

def paste_masks(masks: Tensor, boxes: Tensor, height: int, width: int, integer_boxes: bool) -> None:
    """The kernel checks of ``paste_masks`` (``integer_boxes`` False) and
    ``paste_masks_torchvision`` (True), before their scalar arguments'."""
    if masks.dim() != 3:
        raise ValueError(f"roiops: masks must be 3-D [K, M, M], got {masks.dim()}-D")
    if not masks.is_floating_point():
        raise ValueError(f"roiops: masks must be floating point, got {masks.dtype}")
    if masks.dtype not in _KERNEL_DTYPES:
        _unsupported("masks", masks.dtype)
    if boxes.dim() != 2 or boxes.shape[1] != 4 or boxes.shape[0] != masks.shape[0]:
        raise ValueError(f"roiops: boxes must be [K, 4] with K = masks.shape[0] = {masks.shape[0]}, got "
                         f"{list(boxes.shape)}")
    if integer_boxes:
        if boxes.dtype != torch.int64:
            raise ValueError(f"roiops: boxes must be int64, got {boxes.dtype}")
    else:
        want = torch.float64 if masks.dtype == torch.float64 else torch.float32
        if boxes.dtype != want:
            raise ValueError(f"roiops: boxes must be {str(want)[6:]} for {masks.dtype} masks, got {boxes.dtype}")
    if boxes.device != masks.device:
        raise ValueError(f"roiops: boxes is on {boxes.device} but masks is on {masks.device}")
    if not (0 <= height <= MAX_MAP_SIDE and 0 <= width <= MAX_MAP_SIDE):
        raise ValueError(f"roiops: image height and width must be in [0, 2^24], got {height} x {width}")
    if not (0 < masks.shape[1] <= MAX_MAP_SIDE and 0 < masks.shape[2] <= MAX_MAP_SIDE):
        raise ValueError(f"roiops: masks must have sides in [1, 2^24], got {masks.shape[1]} x {masks.shape[2]}")


def mask_targets(masks: Tensor, rois: Tensor, pooled_height: int, pooled_width: int, sampling_ratio: int,
                 threshold: float, binary: bool) -> None:
    """The kernel checks of ``mask_targets``."""
    if masks.dim() != 3:
        raise ValueError(f"roiops: masks must be 3-D [G, H, W], got {masks.dim()}-D")
    if masks.dtype not in (torch.bool, torch.uint8, *_KERNEL_DTYPES):
        raise ValueError(f"roiops: masks must be bool, uint8, float16, bfloat16, float32 or float64, got {masks.dtype}")
    if rois.dim() != 2 or rois.shape[1] != 5:
        raise ValueError(f"roiops: rois must be [K, 5] (rows (batch_index, x1, y1, x2, y2)), got {list(rois.shape)}")
    if not rois.is_floating_point():
        raise ValueError(f"roiops: rois must be floating point, got {rois.dtype}")
    if masks.dtype == torch.float64 and rois.dtype != torch.float64:
        raise ValueError(f"roiops: rois must be float64 for a float64 masks, got {rois.dtype}")
    if rois.device != masks.device:
        raise ValueError(f"roiops: rois is on {rois.device} but masks is on {masks.device}")
    if not (masks.shape[1] <= MAX_MAP_SIDE and masks.shape[2] <= MAX_MAP_SIDE):
        raise ValueError(f"roiops: masks height and width must be at most 2^24, got {masks.shape[1]} x "
                         f"{masks.shape[2]}")
    if not (0 < pooled_height <= MAX_OUTPUT_SIZE and 0 < pooled_width <= MAX_OUTPUT_SIZE):
        raise ValueError(f"roiops: output size must be in [1, {MAX_OUTPUT_SIZE}], got pooled_height={pooled_height}, "
                         f"pooled_width={pooled_width}")
    if sampling_ratio > MAX_SAMPLING_RATIO:
        raise ValueError(f"roiops: sampling_ratio must be at most {MAX_SAMPLING_RATIO} (<= 0 for adaptive), got "
                         f"{sampling_ratio}")
    finite_threshold(threshold, binary)


def finite_threshold(threshold: float, binary: bool) -> None:
    """The threshold of a mask op's bool result (``binary``) is finite."""
    if binary and not math.isfinite(threshold):
        raise ValueError(f"roiops: threshold must be finite, got {threshold:g}")


def paste_padding(padding: int) -> None:
    if not 0 <= padding <= MAX_MAP_SIDE:
        raise ValueError(f"roiops: padding must be in [0, 2^24], got {padding}")


def polygon_targets(coords: Tensor, vertex_offsets: Tensor, polygon_offsets: Tensor, boxes: Tensor, indices: Tensor,
                    size: int) -> None:
    """The kernel checks of ``polygon_targets`` (csrc/polygon_targets.cpp's)."""
    if coords.dim() != 1 or coords.shape[0] % 2 or coords.dtype != torch.float64 or not coords.is_cpu:
        raise ValueError(f"roiops: coords must be a 1-D float64 CPU tensor of (x, y) pairs, got {list(coords.shape)} "
                         f"{coords.dtype}")
    for t, name, last, of in ((vertex_offsets, "vertex_offsets", coords.shape[0] // 2, "the vertices"),
                              (polygon_offsets, "polygon_offsets", vertex_offsets.shape[0] - 1, "the polygons")):
        if t.dim() != 1 or t.shape[0] < 1 or t.dtype != torch.int64 or not t.is_cpu:
            raise ValueError(f"roiops: {name} must be a 1-D int64 CPU tensor, got {list(t.shape)} {t.dtype}")
        if int(t[0]) != 0 or int(t[-1]) != last or bool((t[1:] < t[:-1]).any()):
            raise ValueError(f"roiops: {name} must rise from 0 to {last} ({of})")
    if boxes.dim() != 2 or boxes.shape[1] != 4 or boxes.dtype != torch.float32 or not boxes.is_cpu:
        raise ValueError(f"roiops: boxes must be a float32 CPU tensor [P, 4], got {list(boxes.shape)} {boxes.dtype}")
    if indices.dim() != 1 or indices.shape[0] != boxes.shape[0] or indices.dtype != torch.int64 or not indices.is_cpu:
        raise ValueError(f"roiops: indices must be an int64 CPU tensor [P] with P = {boxes.shape[0]}, got "
                         f"{list(indices.shape)} {indices.dtype}")
    if not 1 <= size <= MAX_OUTPUT_SIZE:
        raise ValueError(f"roiops: output size must be in [1, {MAX_OUTPUT_SIZE}], got {size}")
    g = polygon_offsets.shape[0] - 1
    bad = ((indices < 0) | (indices >= g)).nonzero()
    if bad.numel():
        p = int(bad[0, 0])
        raise ValueError(f"roiops: indices[{p}] = {int(indices[p])} is not an instance in [0, {g})")


# ---- point-cloud ops: points [B, N, 3] (RoIAwarePool3d: [N, 3]), boxes [B, M, 7] ([K, 7])


def _lidar(name: str, t: Tensor, shape: str, dims: int, last: int | None, like: Tensor | None = None) -> None:
    if t.dim() != dims or (last is not None and t.shape[-1] != last):
        raise ValueError(f"roiops: {name} must be {shape}, got {list(t.shape)}")
    if t.dtype not in _KERNEL_DTYPES:
        raise ValueError(f"roiops: {name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if like is not None and t.device != like.device:
        raise ValueError(f"roiops: {name} is on {t.device} but points is on {like.device}")


def _scene(points: Tensor, boxes: Tensor, batched: bool) -> None:
    _lidar("points", points, "[B, N, 3]" if batched else "[N, 3]", 2 + batched, 3)
    _lidar("boxes", boxes, "[B, M, 7]" if batched else "[K, 7]", 2 + batched, 7, points)
    if boxes.dtype != points.dtype:
        raise ValueError(f"roiops: boxes must have the points' dtype {points.dtype}, got {boxes.dtype}")
    if batched and boxes.shape[0] != points.shape[0]:
        raise ValueError(f"roiops: boxes has batch size {boxes.shape[0]} but points has {points.shape[0]}")
    if points.shape[-2] > _INT32_MAX:
        raise ValueError(f"roiops: at most 2^31 - 1 points, got {points.shape[-2]}")


def _features(features: Tensor, points: Tensor, same_dtype: bool) -> None:
    shape = "[B, N, C]" if points.dim() == 3 else "[N, C]"
    _lidar("features", features, shape, points.dim(), None, points)
    if features.shape[:-1] != points.shape[:-1]:
        raise ValueError(f"roiops: features must be {shape} with the points' leading sizes {list(points.shape[:-1])}, "
                         f"got {list(features.shape)}")
    if same_dtype and features.dtype != points.dtype:
        raise ValueError(f"roiops: features must have the points' dtype {points.dtype}, got {features.dtype}")


def _positive(name: str, value: int, high: int = _INT32_MAX) -> None:
    if not 1 <= value <= high:
        raise ValueError(f"roiops: {name} must be in [1, {high}], got {value}")


def points_in_boxes(points: Tensor, boxes: Tensor, all_boxes: bool) -> None:
    """The kernel check of ``points_in_boxes``."""
    _scene(points, boxes, True)


def roiaware_pool3d(points: Tensor, features: Tensor, boxes: Tensor, out_x: int, out_y: int, out_z: int,
                    max_points: int, max_mode: bool) -> None:
    """The kernel check of ``roiaware_pool3d``."""
    _scene(points, boxes, False)
    _features(features, points, False)
    for name, side in (("out_x", out_x), ("out_y", out_y), ("out_z", out_z)):
        _positive(name, side, MAX_VOXEL_SIDE)
    _positive("max_points", max_points)


def roiaware_pool3d_backward(grad: Tensor, saved: Tensor, points: Tensor, boxes: Tensor, num_points: int,
                             max_mode: bool) -> None:
    """The kernel check of ``roiaware_pool3d``'s backward: grad ``[K, X, Y, Z, C]``, saved
    int32 ``[K, X, Y, Z, C]`` (max) or ``[K, X, Y, Z, 2]`` (avg)."""
    _scene(points, boxes, False)
    _lidar("grad", grad, "[K, out_x, out_y, out_z, C]", 5, None, points)
    if grad.shape[0] != boxes.shape[0]:
        raise ValueError(f"roiops: grad must have one row per box ({boxes.shape[0]}), got {list(grad.shape)}")
    want = list(grad.shape) if max_mode else [*grad.shape[:4], 2]
    if list(saved.shape) != want or saved.dtype != torch.int32 or saved.device != grad.device:
        raise ValueError(f"roiops: saved must be int32 {want} on {grad.device}, got {saved.dtype} "
                         f"{list(saved.shape)} on {saved.device}")
    if num_points != points.shape[0]:
        raise ValueError(f"roiops: num_points must be the points' count {points.shape[0]}, got {num_points}")


def roipoint_pool3d(points: Tensor, features: Tensor, boxes: Tensor, num_samples: int) -> None:
    """The kernel check of ``roipoint_pool3d``."""
    _scene(points, boxes, True)
    _features(features, points, True)
    _positive("num_samples", num_samples)


def roipoint_pool3d_backward(grad: Tensor, index: Tensor, num_points: int) -> None:
    """The kernel check of ``roipoint_pool3d``'s backward: grad ``[B, M, S, 3 + C]``, index
    int32 ``[B, M, S]``."""
    _lidar("grad", grad, "[B, M, S, 3 + C]", 4, None)
    if grad.shape[-1] < 3:
        raise ValueError(f"roiops: grad must be [B, M, S, 3 + C], got {list(grad.shape)}")
    if list(index.shape) != list(grad.shape[:3]) or index.dtype != torch.int32 or index.device != grad.device:
        raise ValueError(f"roiops: index must be int32 {list(grad.shape[:3])} on {grad.device}, got {index.dtype} "
                         f"{list(index.shape)} on {index.device}")
    if not 0 <= num_points <= _INT32_MAX:
        raise ValueError(f"roiops: num_points must be in [0, 2^31 - 1], got {num_points}")
