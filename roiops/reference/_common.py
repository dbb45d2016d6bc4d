"""What the reference kernels share: the opmath type, the layout of results, and the checks
and scans every op makes the same way (docs/architecture.md, "Kernel contract")."""

from __future__ import annotations

import torch
from torch import Tensor

from .._geometry import MAX_OUTPUT_SIZE, MAX_SAMPLING_RATIO, memory_format


def opmath_type(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"roiops: unsupported dtype {dtype}; expected a floating dtype")


def layout(t: Tensor, channels_last: bool) -> Tensor:
    return t.contiguous(memory_format=memory_format(channels_last))


def check_pooled(pooled_height: int, pooled_width: int) -> None:
    if not (0 < int(pooled_height) <= MAX_OUTPUT_SIZE and 0 < int(pooled_width) <= MAX_OUTPUT_SIZE):
        raise ValueError(
            f"roiops: output size must be in [1, {MAX_OUTPUT_SIZE}], got ({pooled_height}, {pooled_width})"
        )


def check_sampling_ratio(sampling_ratio: int) -> None:
    if int(sampling_ratio) > MAX_SAMPLING_RATIO:
        raise ValueError(f"roiops: sampling_ratio must be at most {MAX_SAMPLING_RATIO} (<= 0 for adaptive), "
                         f"got {sampling_ratio}")


def prepare_rois(rois: Tensor, batch_size: int, opmath: torch.dtype, device,
                 rotated: bool = False) -> tuple[Tensor, list[int]]:
    """Validate ``rois`` (semantics.md "Inputs") and return them in opmath with the batch indices;
    ``rotated``: rows ``(batch_index, cx, cy, w, h, theta)``, theta finite too.

    Runs before any indexing, so a bad row can never cause an out-of-bounds access.
    """
    width = 6 if rotated else 5
    if rois.dim() != 2 or rois.size(1) != width:
        raise ValueError(f"roiops: rois must have shape [K, {width}], got {tuple(rois.shape)}")
    if not rois.is_floating_point():
        raise ValueError(f"roiops: rois must be floating point, got {rois.dtype}")
    rois = rois.detach().to(device=device, dtype=opmath)
    if rois.size(0) == 0:
        return rois, []
    idx = rois[:, 0]
    idx_ok = torch.isfinite(idx) & (idx == torch.floor(idx)) & (idx >= 0) & (idx < batch_size)
    coords_ok = torch.isfinite(rois[:, 1:]).all(dim=1)
    bad = ~(idx_ok & coords_ok)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        values = rois[row].tolist()
        if not bool(idx_ok[row]):
            raise ValueError(
                f"roiops: rois row {row}: batch index {values[0]!r} is not an integer "
                f"in [0, {batch_size}) (row = {values})"
            )
        raise ValueError(f"roiops: rois row {row}: coordinates must be finite (row = {values})")
    return rois, [int(b) for b in idx.tolist()]


def check_grad(grad: Tensor, k: int, channels: int, ph: int | None = None, pw: int | None = None) -> None:
    ok = grad.dim() == 4 and grad.size(0) == k and grad.size(1) == channels
    if ok and ph is not None:
        ok = grad.size(2) == ph and grad.size(3) == pw
    if not ok:
        raise ValueError(
            f"roiops: grad must have shape [K={k}, C={channels}, {ph or 'ph'}, {pw or 'pw'}], "
            f"got {tuple(grad.shape)}"
        )


def require_finite(rois: Tensor, quantities: list[Tensor], spatial_scale: float) -> None:
    # Finite coordinates can still overflow once scaled (float32 x * s); refuse those rows
    # too rather than let an infinity reach a grid size or an index.
    ok = torch.isfinite(torch.stack(quantities, dim=1)).all(dim=1)
    if not bool(ok.all()):
        row = int((~ok).nonzero()[0, 0])
        raise ValueError(
            f"roiops: rois row {row}: coordinates are not finite after spatial_scale "
            f"{spatial_scale} (row = {rois[row].tolist()})"
        )


def attach(out: Tensor, input: Tensor) -> Tensor:
    # When no box samples anything, ``out`` is built from fresh zeros and is cut off from
    # ``input``; hook it back on (adding an exact 0) so autograd yields a zero gradient
    # instead of complaining that the output does not require grad.
    if torch.is_grad_enabled() and input.requires_grad and not out.requires_grad:
        out = out + input.reshape(-1)[:0].sum().to(out.dtype)
    return out


def first_max(values: Tensor, member: Tensor) -> Tensor:
    """Index along the last dim of the first maximal member (row-major), or M if none.

    Same result as the scan of the kernel contract: start at the first member, move to a
    later one only if it is strictly greater, or if it is NaN while the running max is
    not.  So: any NaN member -> the first NaN; otherwise the first member equal to the
    max (ties keep the earliest).  ``member`` is a bool tensor broadcastable to ``values``.
    """
    m = values.size(-1)
    running = torch.where(member, values, float("-inf")).amax(dim=-1, keepdim=True)
    best = member & ((values == running) | (torch.isnan(values) & torch.isnan(running)))
    position = torch.arange(m, device=values.device)
    return torch.where(best, position, m).amin(dim=-1)
