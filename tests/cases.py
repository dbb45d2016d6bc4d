"""What the tests share: dtypes and tolerances; the operators' cases, from roiops.ops.SPECS
(no list of operators is kept here); the feature maps, boxes and runs the tests build
their calls from; and the registered ops with their kernel-contract functions and
argument variants."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import roiops
from roiops._boxes import AXIS_ALIGNED, BoxFormat
from roiops._spec import Kernels, OpSpec
from roiops.ops import SPECS

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
DTYPES = (F16, BF16, F32, F64)

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


# ----------------------------------------------------------------------------- operators


def per_bin_tensors(spec: OpSpec) -> dict[str, int]:
    """The op's per-bin tensor arguments (``Kernels.bin_channels``): name -> channels."""
    return {n: c for k in spec.kernels for n, c in k.bin_channels.items()}


def per_bin_values(boxes: Any, output_size: Any, channels: int, like: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A per-bin tensor ``[K, channels, h, w]`` for these boxes: values ~ N(0, 0.5^2) as a
    deformable head predicts them, the same for every dtype and device (drawn in float64 on
    the CPU), in the kernels' coordinate type of ``like``."""
    if isinstance(boxes, torch.Tensor):
        k = boxes.shape[0]
    elif isinstance(boxes, (list, tuple)) and all(isinstance(b, torch.Tensor) for b in boxes):
        k = sum(b.shape[0] for b in boxes)
    else:  # bad boxes, which the call refuses first
        k = 1
    h, w = (output_size, output_size) if isinstance(output_size, int) else output_size
    h, w = (h, w) if all(isinstance(n, int) and n > 0 for n in (h, w)) else (1, 1)  # refused first
    g = torch.Generator().manual_seed(seed)
    values = 0.5 * torch.randn(k, channels, h, w, generator=g, dtype=torch.float64)
    if not isinstance(like, torch.Tensor):  # a bad input, which the call refuses first
        return values.float()
    return values.to(like.device, torch.float64 if like.dtype == torch.float64 else torch.float32)


@dataclass(frozen=True, eq=False)
class Case:
    """One public operator with one set of its options (``OpSpec.options``, or its
    ``box_grad`` options), as the generic tests run it. An op's per-bin tensors (a
    deformable offset) are positional arguments after the boxes: a case passes
    :func:`per_bin_values` for the call's boxes, or None where its options name the tensor
    with the value None."""

    id: str
    spec: OpSpec
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, input: Any, boxes: Any, output_size: Any, spatial_scale: float, **given: Any) -> torch.Tensor:
        """The op on these arguments; ``given`` replace the case's per-bin tensors and options
        by name."""
        tensors = per_bin_tensors(self.spec)
        extra = {k: given[k] for k in tensors if k in given}
        if len(extra) < len(tensors):
            extra = self.tensors(input, boxes, output_size) | extra
        keywords = self.keywords | {k: o for k, o in given.items() if k not in tensors}
        return self.spec.function(input, boxes, *extra.values(), output_size, spatial_scale, **keywords)

    @property
    def keywords(self) -> dict[str, Any]:
        """The options that are keyword arguments (and the Module's)."""
        return {k: v for k, v in self.options.items() if k not in per_bin_tensors(self.spec)}

    def tensors(self, input: Any, boxes: Any, output_size: Any) -> dict[str, torch.Tensor | None]:
        """The per-bin tensor arguments of a call on these boxes, by name: None also for an
        output of more than 2^16 bins (the fuzz tests' extreme sizes), where a tensor per
        bin would take gigabytes."""
        size = output_size if isinstance(output_size, (tuple, list)) else (output_size, output_size)
        huge = len(size) == 2 and all(isinstance(n, int) for n in size) and size[0] * size[1] > 2**16
        return {n: None if n in self.options or huge else per_bin_values(boxes, output_size, c, input)
                for n, c in per_bin_tensors(self.spec).items()}

    def module(self, output_size: Any, spatial_scale: float) -> torch.nn.Module:
        return self.spec.module(output_size, spatial_scale, **self.keywords)

    @property
    def box_grad(self) -> bool:
        """Whether the boxes receive a gradient: the options include the spec's box_grad ones."""
        return self.spec.box_grad is not None and self.spec.box_grad.items() <= self.options.items()

    def channels(self, c: int, output_size: Any) -> int:
        """The input channels that give ``c`` output channels (``C_out * ph * pw`` for a
        position-sensitive op), or ``c`` fields of an op whose channels come in fields."""
        ph, pw = (output_size, output_size) if isinstance(output_size, int) else output_size
        return c * ph * pw if self.spec.position_sensitive else c * self.fields

    def out_channels(self, c: int) -> int:
        """The output channels of the map ``channels(c, ...)`` gives."""
        return c * self.fields

    @property
    def fields(self) -> int:
        """Channels per field (``Kernels.channel_groups``: its option, else the function's
        default), 1 for other ops."""
        groups = self.spec.kernels[0].channel_groups
        if not groups:
            return 1
        return self.options.get(groups, inspect.signature(self.spec.function).parameters[groups].default)

    def boxes(self, **kw: Any) -> torch.Tensor:
        """:func:`boxes_for` in the op's box format."""
        return boxes_for(self.spec.boxes, **kw)


# The operators of RoI shape (rows led by a batch index, output [K, C, ph, pw]), which the
# generic tables hold; an op with boxes per image has its own tests.
ROI_SPECS = tuple(s for s in SPECS if not s.boxes.per_image)


@functools.cache
def _forward_kernels(name: str, options: tuple[tuple[str, Any], ...]) -> Kernels:
    spec = next(s for s in SPECS if s.name == name)
    case = Case(name, spec, dict(options))
    x = feature(channels=case.channels(1, 2))
    recorder = RecordOps()
    with recorder:
        case(x, case.boxes(count=1), 2, SCALE)
    called = [k for k in spec.kernels if f"roiops.{k.name}.default" in recorder.ops]
    assert len(called) == 1, (case.id, recorder.ops)
    return called[0]


def forward_kernels(case: Case) -> Kernels:
    """The op pair a case's call reaches (seen under a dispatch mode)."""
    return _forward_kernels(case.spec.name, tuple(sorted(case.options.items())))


def takes_max(case: Case) -> bool:
    """Whether each output value is one sample's, picked by the maximum (the kernels keep
    an argmax): backends then agree bit for bit, whatever the order of their sums."""
    return bool(forward_kernels(case).saved)


# ----------------------------------------------------------------------------- maps and boxes

# The generic tests' map and boxes: small, for Triton's interpreter.
N, C, H, W = 2, 3, 7, 9
SCALE = 0.5  # boxes are in pixels of an 18 x 14 image


def feature(dtype: torch.dtype = F32, channels_last: bool = False, seed: int = 0, channels: int = C,
            shape: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """A random map ``[N, channels, H, W]`` (or ``shape``), drawn in float64 and rounded to
    ``dtype``, in NCHW or channels_last."""
    shape = shape or (N, channels, H, W)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def boxes_for(form: BoxFormat = AXIS_ALIGNED, dtype: torch.dtype = F32, seed: int = 0, count: int = 6, n: int = N,
              width: float = W / SCALE, height: float = H / SCALE, nasty: bool = True) -> torch.Tensor:
    """``count`` random boxes of ``form`` and (with ``nasty``) its nasty ones, in pixels of a
    ``width x height`` image (``roiops._boxes``)."""
    g = torch.Generator().manual_seed(seed)
    rows = [form.random(n, count, width, height, g, F64)] + ([form.nasty(n, width, height, F64)] if nasty else [])
    return torch.cat(rows).to(dtype)


def per_image(boxes: torch.Tensor, n: int = N) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The boxes as a list of each image's rows (without the batch index), and the tensor
    of rows in the order the list gives."""
    return ([boxes[boxes[:, 0] == i, 1:] for i in range(n)],
            torch.cat([boxes[boxes[:, 0] == i] for i in range(n)]))


def backend_used(backend: str | None) -> contextlib.AbstractContextManager[None]:
    return roiops.use_backend(backend) if backend else contextlib.nullcontext()


def run(fn: Callable[[torch.Tensor, Any], torch.Tensor], x: torch.Tensor, boxes: Any, backend: str | None = None,
        seed: int = 1, grad_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """``fn(x, boxes)``'s output, the gradient of ``x`` and that of ``boxes`` (None where
    they get none) for a fixed random upstream gradient (its values rounded to
    ``grad_dtype``, by default the output's dtype), on ``backend``'s kernels where they run
    (:func:`device_for`): x and a tensor of boxes go there, the results come back."""
    dev = device_for(backend)
    xg = x.detach().to(dev, copy=True).requires_grad_()
    bg = boxes.detach().to(dev, copy=True).requires_grad_() if isinstance(boxes, torch.Tensor) else boxes
    with backend_used(backend):
        out = fn(xg, bg)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
        out.backward(g.to(grad_dtype or out.dtype).to(dev, out.dtype))
    grad_boxes = bg.grad.cpu() if isinstance(bg, torch.Tensor) and bg.grad is not None else None
    return out.detach().cpu(), xg.grad.cpu(), grad_boxes


def sample_taps(y: float, x: float, h: int, w: int) -> list[tuple[int, int, float]]:
    """The bilinear taps ``(row, column, weight)`` of one sample point of an ``h x w`` map by
    the border rule of torchvision, Detectron and mmcv (semantics.md, "roi_align"), in the
    order w1..w4, for the brute-force oracles: none outside ``[-1, h] x [-1, w]``."""
    if y < -1 or y > h or x < -1 or x > w:
        return []
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = math.floor(y), math.floor(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return [(y0, x0, (1 - ly) * (1 - lx)), (y0, x1, (1 - ly) * lx),
            (y1, x0, ly * (1 - lx)), (y1, x1, ly * lx)]


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, **kw: Any) -> None:
    """``actual`` against ``expected`` (compared in float64) to ``dtype``'s tolerance."""
    torch.testing.assert_close(actual.double(), expected.double(), **tol(dtype), **kw)


# Registered ops a kernel set may leave out: roiops/ops/multi_scale.py runs its single-level
# functions once per level instead; polygons are host data, which the C++ kernel rasterises
# whatever the backend (roiops/ops/mask_targets.py). Every other registered op is in the
# kernel contract.
OPTIONAL_OPS = ("multi_scale_roi_align", "_multi_scale_roi_align_backward", "polygon_targets")


# The C++ library's helper ops, outside the kernel contract (roiops.cpu calls them).
LIBRARY_HELPERS = {"_first_invalid", "_output_cache_bytes"}


def registered_ops() -> list[str]:
    """The ops registered under torch.ops.roiops, from the dispatcher, but for the C++
    library's helpers."""
    return sorted(op for name in torch._C._dispatch_get_all_op_names() if name.startswith("roiops::")
                  for op in [name.split("::", 1)[1]] if op not in LIBRARY_HELPERS)


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


def _registered_by(select: Callable[[OpSpec, Kernels], bool]) -> tuple[str, ...]:
    return tuple(op for spec in ROI_SPECS for k in spec.kernels if select(spec, k) for op in k.ops().values())


# Argument variants each contract op runs with in the generic tests (test_generic.py's
# opcheck), over the defaults of the test's call: each Kernels' variants, by role.
VARIANTS: dict[str, list[dict[str, Any]]] = {
    op: list(k.variants[role]) for spec in ROI_SPECS for k in spec.kernels for role, op in k.ops().items()
    if role in k.variants}
# Per-bin tensor arguments of each registered op (Kernels.bin_channels): name -> channels.
PER_BIN: dict[str, dict[str, int]] = {op: dict(k.bin_channels) for spec in ROI_SPECS for k in spec.kernels
                                      for op in k.ops().values() if k.bin_channels}
# Registered ops whose boxes come per image, [N, K, 4] (their own test files).
PER_IMAGE_OPS = tuple(op for spec in SPECS if spec.boxes.per_image for k in spec.kernels
                      for op in k.ops().values())
# The box format of each registered op of RoI shape.
BOX_FORMAT: dict[str, BoxFormat] = {op: spec.boxes for spec in ROI_SPECS for k in spec.kernels
                                    for op in k.ops().values()}
# Registered ops that read pooled_height * pooled_width input channels per output channel.
POSITION_SENSITIVE_OPS = _registered_by(lambda spec, k: spec.position_sensitive)


class RecordOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Passes every op through and records its name: under it a roiops call must reach the
    registered op (the eager path that skips the dispatcher is for calls without modes)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def backward_in_bands(fn: Any, dtype: torch.dtype, channels_last: bool) -> None:
    """A map large enough that the C++ backward of ``fn(x, boxes)`` splits it into several
    bands of rows and blocks of channels (one of 8 channels, not a multiple of 16), with
    tall boxes crossing bands: 2 threads give 1 thread's bits (other splits, the same sums)
    and the reference's gradient."""
    x = feature(dtype, channels_last, seed=3, shape=(2, 40, 180, 160))
    g = torch.Generator().manual_seed(4)
    boxes = torch.cat([AXIS_ALIGNED.random(2, 12, 320, 360, g), AXIS_ALIGNED.nasty(2, 320, 360),
                       torch.tensor([[0, 10.0, 2.0, 300.0, 355.0], [1, 40.0, 100.0, 60.0, 350.0]])])
    with num_threads(1):
        _, grad1, _ = run(fn, x, boxes)
    with num_threads(2):
        _, grad2, _ = run(fn, x, boxes)
    _, ref, _ = run(fn, x, boxes, "reference")
    assert torch.equal(grad1, grad2)
    assert grad2.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    close(grad2, ref, dtype)


def beyond_int32_offsets(fn: Any) -> None:
    """``fn(x, boxes)`` on image 2 of a 3 x 1 x 32768 x 32768 float16 map, which starts at
    element 2^31 (every offset the box reads overflows int32), equals it on that image's
    corner alone. torch.empty: only the corner the box reads is ever touched."""
    x = torch.empty(3, 1, 32768, 32768, dtype=torch.float16)
    corner = torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(0)).half()
    x[2:, :, :16, :16] = corner
    assert torch.equal(fn(x, torch.tensor([[2, 1.5, 2.25, 9.0, 12.0]])),
                       fn(corner, torch.tensor([[0, 1.5, 2.25, 9.0, 12.0]])))


# ----------------------------------------------------------------------------- the cases


def _test_module(name: str) -> Any:
    """The test file of operator ``name``: tests/test_<name>.py, or its family's (the longest
    prefix of the name that has one: tests/test_ps_roi.py)."""
    parts = name.split("_")
    for n in range(len(parts), 0, -1):
        module = "test_" + "_".join(parts[:n])
        if (Path(__file__).parent / f"{module}.py").is_file():
            return importlib.import_module(module)
    raise LookupError(f"operator {name} has no test file (tests/test_{name}.py, whose OPTIONS name its option sets)")


@functools.cache
def _tables() -> dict[str, Any]:
    """``OPTIONS``: the option sets the generic tests run each operator with (each a full set
    of keyword options besides output_size and spatial_scale), its test file's OPTIONS;
    ``CASES``: every operator with each of them, and its spec's box-gradient options where
    none of those has them; ``BOX_GRAD_CASES``: the cases whose boxes receive a gradient.
    Built on first use, not on import: the test files import this module."""
    options = {spec.name: _test_module(spec.name).OPTIONS[spec.name] for spec in SPECS}
    cases = []
    for spec in ROI_SPECS:
        cases += [Case(f"{spec.name}-{i}", spec, o) for i, o in enumerate(options[spec.name])]
        if spec.box_grad is not None and spec.box_grad not in options[spec.name]:
            cases.append(Case(f"{spec.name}-box_grad", spec, spec.box_grad))
    return {"OPTIONS": options, "CASES": cases, "BOX_GRAD_CASES": [c for c in cases if c.box_grad]}


def __getattr__(name: str) -> Any:
    if name in ("OPTIONS", "CASES", "BOX_GRAD_CASES"):
        return _tables()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def params(cases: Sequence[Case]) -> list[Any]:
    """``cases`` as pytest parameters with their ids."""
    return [pytest.param(c, id=c.id) for c in cases]


def spec_params() -> list[Any]:
    """Every spec, as a pytest parameter with its name as id: its first option set."""
    tables = _tables()
    return [pytest.param(c, id=c.spec.name) for c in tables["CASES"]
            if c.options is tables["OPTIONS"][c.spec.name][0]]
