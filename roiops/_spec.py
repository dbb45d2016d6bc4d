"""An operator's declaration, the single source everything else derives from: its registered
ops and their schemas (:class:`Kernels`), its public function, Module, title and box
format, and its ONNX translation or refusal (:class:`OpSpec`).

Each ``roiops/ops/<op>.py`` declares one ``SPEC``; ``roiops.ops.SPECS`` collects them.
Registration (``_declare.register``), the C++ library's schemas (setup.py), the package
exports, the test tables and ``roiops.onnx`` read the specs; none keeps its own list of
operators. What is timed and tested is beside the bench and the tests: each operator's
workloads in ``roiops/bench/<op>.py``, its option sets in ``tests/test_<op>.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ._boxes import AXIS_ALIGNED, BoxFormat

# Backward arguments that describe the input rather than repeat a forward argument.
FROM_INPUT = {"batch_size": "int", "channels": "int", "height": "int", "width": "int", "channels_last": "bool"}


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
    tests' defaults. ``plane_argmax``: the saved argmax is the int32 index ``h * W + w`` of a map cell, so
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

    def parameters(self, role: str) -> list[tuple[str, str]]:
        """``(name, schema type)`` of the op of ``role`` (a key of :meth:`ops`), in the kernel
        contract's order: the registered op's and its kernel functions' parameters."""
        tensors = [(n, "Tensor?") for n, _ in self.tensors]
        args = [(n, t) for t, n in self.args]
        if role == "forward":
            return [("input", "Tensor"), ("rois", "Tensor"), *tensors, *args]
        if role == "backward":
            types = dict((n, t) for t, n in self.args) | FROM_INPUT
            return [("grad", "Tensor"), *((s, "Tensor") for s in self.saved), ("rois", "Tensor"), *tensors,
                    *((n, types[n]) for n in self.backward)]
        if role in self.ops():  # a gradient that reads the input
            return [("grad", "Tensor"), ("input", "Tensor"), ("rois", "Tensor"), *tensors, *args]
        raise ValueError(f"roiops: op {self.name} has no kernel role {role!r}")

    def schema(self, role: str) -> str:
        """The schema of the op of ``role`` without its name: ``"(Tensor input, ...) -> Tensor"``."""
        outputs = 1 + len(self.saved) if role == "forward" else 1
        returns = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
        return "(" + ", ".join(f"{t} {n}" for n, t in self.parameters(role)) + ") -> " + returns


@dataclass(frozen=True)
class OpSpec:
    """A public operator. ``function(input, boxes, output_size, spatial_scale, **options)``
    and its ``module``; ``kernels``: the op pairs it calls; ``title``: what users call it
    (the command line's list of operators). ``boxes``: its box format (``roiops._boxes``);
    with one per image (``per_image``), the output is not pooled per box, and the
    RoI-shaped generic tests leave the op out. ``box_grad``: options under which the boxes
    receive a gradient (None: never). ``position_sensitive``: the input has ``C_out * ph *
    pw`` channels. ``reference_bin_error``: the reference's results lose up to ``eps / (a
    bin's side in cells)`` of relative precision (it integrates over a bin as a difference
    of antiderivatives), so the tests that compare with it widen their tolerance by that
    for tiny bins."""

    function: Callable[..., Tensor]
    module: type
    kernels: tuple[Kernels, ...]
    title: str
    boxes: BoxFormat = AXIS_ALIGNED
    box_grad: dict[str, Any] | None = None
    position_sensitive: bool = False
    reference_bin_error: bool = False

    @property
    def name(self) -> str:
        return self.function.__name__
