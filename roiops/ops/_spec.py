"""An operator's declaration, the single source everything else derives from: its registered
ops (:class:`Kernels`), its public function and Module, the options the generic tests run
it with, its benchmark workloads and its ONNX translation or refusal (:class:`OpSpec`).

Each ``roiops/ops/<op>.py`` declares one ``SPEC``; ``roiops.ops.SPECS`` collects them.
Registration (``_declare.register``), the package exports, the test tables, ``roiops
bench`` and ``roiops.onnx`` read the specs; none keeps its own list of operators.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, Literal

from torch import Tensor


@dataclass(frozen=True)
class Kernels:
    """One registered op pair: ``roiops::<name>`` and ``roiops::_<name>_backward``.

    ``args``: the forward's arguments after its tensors, as ``(type, name)`` in schema
    types. ``tensors``: tensor inputs after ``input`` and ``rois``, as ``(name,
    differentiable)``; schema type ``Tensor?`` (a caller may pass None). ``saved``: names of
    the forward's outputs after the first, which the backward receives (not
    differentiable). ``backward``: the backward's arguments after grad, the saved outputs,
    rois and the extra tensors, in the kernels' order: forward argument names, or the
    input's ``batch_size, channels, height, width, channels_last``. The backward returns
    the gradient of ``input``; a differentiable extra tensor ``t`` gets its own from
    ``<name>_<t>_backward``, which reads the input (as ``rois_grad``'s). ``title``:
    how errors name the op. ``out_channels``: the output's channels from the input's and
    the pooled size (position-sensitive ops read ``ph * pw`` input channels per output
    channel), the input's by default. ``rois_grad``: the output is differentiable with
    respect to the box coordinates (the kernels provide ``<name>_rois_backward``).
    ``variants``: argument sets the contract tests run each registered op with, keyed by
    role (``"forward"``, ``"backward"``, ``"rois_backward"``, ``"<t>_backward"``): a dict of argument values over the
    tests' defaults. ``onnx``: None when ``roiops.onnx`` translates the forward, else what
    ONNX lacks, for the error that refuses the export (``"Precise RoI Pooling"``).
    ``plane_argmax``: the saved argmax is the int32 index ``h * W + w`` of a map cell, so
    the kernels refuse a map with ``H * W >= 2^31``. ``bin_channels``: extra tensors that
    hold values per box and bin, shaped ``[K, n, pooled_height, pooled_width]`` with ``n``
    given here by name (a deformable offset: 2); the public function takes each, after
    the boxes, as a positional argument of its name, and its dtype follows the rule of
    the boxes'. ``channel_groups``: an int argument that must lie in [1, 2^16] and divide
    the map's channels (the orientations of a rotation-invariant op's channel fields).
    ``output_shape``: the output's shape from the input's shape, the boxes' shape and the
    forward's arguments by name, for an op whose output is not ``[K, C_out,
    pooled_height, pooled_width]`` (the fake kernel and the kernel checks use it)."""

    name: str
    args: tuple[tuple[str, str], ...]
    backward: tuple[str, ...]
    saved: tuple[str, ...] = ()
    title: str = ""
    out_channels: Callable[[Any, int, int], Any] | None = None
    rois_grad: bool = False
    tensors: tuple[tuple[str, bool], ...] = ()
    variants: Mapping[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    onnx: str | None = None
    plane_argmax: bool = False
    bin_channels: Mapping[str, int] = field(default_factory=dict)
    channel_groups: str = ""
    output_shape: Callable[[Any, Any, Mapping[str, Any]], tuple[Any, ...]] | None = None

    def ops(self) -> dict[str, str]:
        """The registered ops' names, by role: ``forward``, ``backward`` and, with a box
        gradient, ``rois_backward``, and ``<t>_backward`` for each differentiable extra
        tensor ``t``."""
        names = {"forward": self.name, "backward": f"_{self.name}_backward"}
        reading = ["rois"] * self.rois_grad + [n for n, differentiable in self.tensors if differentiable]
        return names | {f"{n}_backward": f"_{self.name}_{n}_backward" for n in reading}


@dataclass(frozen=True)
class Workload:
    """One benchmark shape: ``n x channels x height x width`` map at ``scale``, ``boxes``
    boxes pooled to ``size x size``. ``op``: the :class:`Bench` it times (set by the
    benchmark from the spec that declares it)."""

    name: str
    n: int
    channels: int
    height: int
    width: int
    scale: float
    boxes: int
    size: int
    sampling_ratio: int = 2
    aligned: bool = True
    devices: tuple[str, ...] = ("cpu", "cuda")   # the --device values it runs on
    op: str = ""

    def shape(self) -> dict[str, Any]:
        """What results.json records of the workload (its name names its op)."""
        return {k: v for k, v in asdict(self).items() if k not in ("devices", "op")}


@dataclass(frozen=True)
class Peer:
    """What roiops is timed against: a module (imported once; its name labels the results)
    and the call of the same operator in it, ``call(module, workload, map, boxes)``."""

    module: str
    call: Callable[[ModuleType, Workload, Tensor, Tensor], Tensor]
    same_result: bool = True   # False for a stand-in that computes something else: no max|diff|
    note: str = ""             # shown in --help
    boxes_in_input_dtype: bool = False  # given the boxes cast to the map's dtype (before timing)


def torchvision(call: Callable[[ModuleType, Workload, Tensor, Tensor], Tensor], **options: Any) -> Peer:
    """torchvision.ops as the peer: it wants boxes of the map's dtype."""
    return Peer("torchvision", call, boxes_in_input_dtype=True, **options)


@dataclass(frozen=True)
class Bench:
    """How ``roiops bench`` times an operator: ``call(workload, map, boxes)`` and its peer's,
    on each of ``workloads``. ``key`` names it in results (the op's name, then a variant)."""

    key: str
    title: str
    call: Callable[[Workload, Tensor, Tensor], Tensor]
    peer: Peer | None          # None: roiops is timed alone (no ratio)
    workloads: tuple[Workload, ...] = ()
    argmax: bool = False       # keeps an int32 index per output value for its backward (bytes model)
    sampled: bool = True       # the workload's sampling_ratio applies
    boxes: Literal["axis-aligned", "rotated", "bezier", "per-image"] = "axis-aligned"
    # the map's channels must be a multiple of this (position-sensitive ops: size x size)
    channel_multiple: Callable[[Workload], int] = lambda w: 1


@dataclass(frozen=True)
class OpSpec:
    """A public operator. ``function(input, boxes, output_size, spatial_scale, **options)``
    and its ``module``; ``kernels``: the op pairs it calls. ``boxes``: its box rows,
    ``"axis-aligned"`` ``(batch_index, x1, y1, x2, y2)``, ``"rotated"`` ``(batch_index,
    cx, cy, w, h, angle)``, ``"bezier"`` ``(batch_index, x0, y0, ..., x7, y7)``, or
    ``"per-image"``: ``[N, K, 4]`` rows ``(x1, y1, x2, y2)``, box k of image n at ``[n,
    k]``, no batch index (the output is then not pooled per box: the RoI-shaped generic
    tests leave such an op out). ``options``: the option sets the generic tests run it
    with (each a full set of keyword options besides ``output_size`` and
    ``spatial_scale``);
    ``box_grad``: options under which the boxes receive a gradient (None: never).
    ``position_sensitive``: the input has ``C_out * ph * pw`` channels. ``bench``: its
    benchmark entries. ``reference_bin_error``: the reference's results lose up to
    ``eps / (a bin's side in cells)`` of relative precision (it integrates over a bin as a
    difference of antiderivatives), so the tests that compare with it widen their
    tolerance by that for tiny bins."""

    function: Callable[..., Tensor]
    module: type
    kernels: tuple[Kernels, ...]
    options: tuple[dict[str, Any], ...] = ({},)
    boxes: Literal["axis-aligned", "rotated", "bezier", "per-image"] = "axis-aligned"
    box_grad: dict[str, Any] | None = None
    position_sensitive: bool = False
    bench: tuple[Bench, ...] = ()
    reference_bin_error: bool = False

    @property
    def name(self) -> str:
        return self.function.__name__
