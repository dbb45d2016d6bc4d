"""Tables the tests share: tolerances, the public operators, and the registered ops with
their kernel-contract functions and argument variants."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

import roiops

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64

# rtol = atol, per dtype, by what is compared.
TOL = {
    # A result against an oracle computed from the same input values: roiops.reference,
    # torchvision, another backend, or float32 math on the half-type input (autocast).
    # Both sides accumulate in the opmath type and differ only in the order of their
    # sums, forward and backward alike, so one kind serves all (measured: under 4e-15 in
    # float64 and 3e-6 in float32, fuzzed cases included). Half types round that once:
    # results differ by at most one unit in the last place, 2^-10 < 1e-3 (float16) and
    # 2^-7 < 1e-2 (bfloat16).
    "same input": {F64: 1e-12, F32: 1e-5, F16: 1e-3, BF16: 1e-2},
    # A half-type result against float64 math on the input before it was rounded to the
    # half type: the input's rounding error adds, in proportion to the input's magnitude.
    "rounded input": {F16: 1e-2},
}


def device_for(backend: str | None) -> str:
    """Where a test runs a backend's kernels: Triton's on the GPU when there is one (else on
    CPU tensors, through the interpreter that tests/conftest.py turns on), the others on
    the CPU."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def backward_paths(backend: str | None) -> tuple[tuple[bool | None, float], ...]:
    """(roiops.config.deterministic_backward, gradcheck's nondet_tol) for each backward path
    a gradcheck of `backend` should cover. On a GPU the Triton kernels have two: the
    deterministic one must repeat exactly, and the atomic adds' order varies the last bits
    of float64 sums from run to run. Elsewhere every path is deterministic."""
    if device_for(backend) == "cuda":
        return (True, 0.0), (False, 1e-12)
    return ((None, 0.0),)


def tol(dtype: torch.dtype, kind: str = "same input") -> dict[str, float]:
    """assert_close's rtol and atol for a comparison of this kind in this dtype."""
    t = TOL[kind][dtype]
    return dict(rtol=t, atol=t)


@contextlib.contextmanager
def config_set(**options: Any) -> Iterator[None]:
    """roiops.config's switches set to ``options`` inside the block, restored after it."""
    before = {name: getattr(roiops.config, name) for name in options}
    for name, value in options.items():
        setattr(roiops.config, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(roiops.config, name, value)


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to n inside the block, restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def odd_unit_strides(x: torch.Tensor, dims: list[int] | None = None) -> torch.Tensor:
    """Dense x's values with a stride of 1000 on its size-1 dimensions ``dims`` (default:
    all of them): still contiguous in x's format, but not that format's usual strides. A
    size-1 dimension's stride moves no element, so x's copy serves as the storage."""
    dims = [d for d, n in enumerate(x.shape) if n == 1] if dims is None else dims
    assert all(x.shape[d] == 1 for d in dims)
    strides = [1000 if d in dims else stride for d, stride in enumerate(x.stride())]
    return x.clone().as_strided(x.shape, strides)


# The public operators, called alike: (input, boxes, output_size, spatial_scale,
# sampling_ratio, aligned). RoIPool and PrRoIPool take no sampling_ratio nor aligned.
API = {
    "avg": lambda x, b, size, scale, sr, al: roiops.roi_align(x, b, size, scale, sr, al),
    "max": lambda x, b, size, scale, sr, al: roiops.roi_align(x, b, size, scale, sr, al, mode="max"),
    "caffe": lambda x, b, size, scale, sr, al: roiops.roi_pool(x, b, size, scale),
    "mmdet": lambda x, b, size, scale, sr, al: roiops.roi_pool(x, b, size, scale, convention="mmdet"),
    "prroi": lambda x, b, size, scale, sr, al: roiops.prroi_pool(x, b, size, scale),
}
ALIGN = ("avg", "max")
POOL = ("caffe", "mmdet")

# Registered ops a kernel set may leave out: roiops/ops/multi_scale.py runs its single-level
# functions once per level instead. Every other registered op is in the kernel contract.
OPTIONAL_OPS = ("multi_scale_roi_align", "_multi_scale_roi_align_backward")


def registered_ops() -> list[str]:
    """The ops registered under torch.ops.roiops, from the dispatcher."""
    return sorted(name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("roiops::"))


def contract_ops() -> list[str]:
    """The registered ops whose kernel function every kernel set must define."""
    return [op for op in registered_ops() if op not in OPTIONAL_OPS]


def schema(op: str) -> torch._C.FunctionSchema:
    return getattr(torch.ops.roiops, op).default._schema


def kernel_name(op: str) -> str:
    """The kernel-contract function an op calls: roiops::<name> calls <name>_forward,
    roiops::_<name>_backward calls <name>_backward."""
    if op.startswith("_") and op.endswith("_backward"):
        return op[1:]
    return f"{op}_forward"


def contract_args(op: str, **values: Any) -> dict[str, Any]:
    """The op's arguments, in its schema's (= its kernel function's) order, picked by name
    from ``values``."""
    return {a.name: values[a.name] for a in schema(op).arguments}


# Argument variants each contract op runs with in the generic tests (test_ops.py's
# opcheck), over the defaults of the test's call.
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "roi_align": [dict(sampling_ratio=2, aligned=True)],
    "roi_align_max": [dict(sampling_ratio=-1, aligned=False)],
    "roi_pool": [dict(continuous=False), dict(continuous=True)],
    "_roi_align_backward": [dict(sampling_ratio=2, aligned=True, channels_last=False)],
    "_roi_align_max_backward": [dict(sampling_ratio=2, aligned=True, channels_last=True)],
    "_roi_pool_backward": [dict(channels_last=False)],
    "_roi_align_rois_backward": [dict(sampling_ratio=2, aligned=False), dict(sampling_ratio=0, aligned=True)],
    "_roi_align_max_rois_backward": [dict(sampling_ratio=2, aligned=True)],
}
# Position-sensitive ops read pooled_height * pooled_width (2 * 3) input channels per output channel.
VARIANTS |= {
    "ps_roi_align": [dict(sampling_ratio=-1, channels=12, out_channels=2)],
    "ps_roi_pool": [dict(channels=12, out_channels=2)],
    "_ps_roi_align_backward": [dict(sampling_ratio=2, channels=12, out_channels=2, channels_last=True)],
    "_ps_roi_pool_backward": [dict(channels=12, out_channels=2, channels_last=False)],
}

# Rotated RoIAlign: registered ops whose rois are [K, 6] (batch_index, cx, cy, w, h, theta
# in radians); the generic tests give them rotated boxes.
ROTATED_OPS = ("roi_align_rotated", "_roi_align_rotated_backward")
VARIANTS |= {
    "roi_align_rotated": [dict(sampling_ratio=2, aligned=True), dict(sampling_ratio=0, aligned=False)],
    "_roi_align_rotated_backward": [dict(sampling_ratio=2, aligned=True, channels_last=False),
                                    dict(sampling_ratio=-1, aligned=False, channels_last=True)],
}

# Precise RoIPool: its box gradient op too; "rois_grad": the forward's rois require grad.
VARIANTS |= {
    "prroi_pool": [dict(), dict(rois_grad=True)],
    "_prroi_pool_backward": [dict(channels_last=True)],
    "_prroi_pool_rois_backward": [dict()],
}


class RecordOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Passes every op through and records its name: under it a roiops call must reach the
    registered op (the eager path that skips the dispatcher is for calls without modes)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
