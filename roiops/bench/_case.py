"""What ``roiops bench`` times: a :class:`Bench` per timed operator (roiops' call, its
peer's, its workloads and its speed target), declared by the suite's per-operator modules
beside this one; an operator that takes something other than a feature map and boxes
(mask pasting, mask targets) also declares its :class:`Inputs`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from .._boxes import AXIS_ALIGNED, BoxFormat


@dataclass(frozen=True)
class Workload:
    """One benchmark shape: ``n x channels x height x width`` map at ``scale``, ``boxes``
    boxes pooled to ``size x size``. ``op``: the :class:`Bench` it times (set by the
    suite from the Bench that lists it)."""

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
    and the call of the same operator in it, ``call(module, workload, map, boxes)``, or
    ``call(module, workload, *inputs)`` for an entry with :class:`Inputs`."""

    module: str
    call: Callable[..., Tensor]
    same_result: bool = True   # False for a stand-in that computes something else: no max|diff|
    note: str = ""             # shown in --help
    boxes_in_input_dtype: bool = False  # given the boxes cast to the map's dtype (before timing)


def torchvision(call: Callable[[ModuleType, Workload, Tensor, Tensor], Tensor], **options: Any) -> Peer:
    """torchvision.ops as the peer: it wants boxes of the map's dtype."""
    return Peer("torchvision", call, boxes_in_input_dtype=True, **options)


@dataclass(frozen=True)
class Target:
    """The ratio (peer ms / roiops ms) each judged row of a direction must reach: one
    number, or one per layout; ``one_thread``: the forward's at 1 thread on the CPU (else
    1-thread rows are not judged); ``devices``: where the target applies. "Within 1.5x of
    the peer's time" is 1 / 1.5. ``backward`` None: an operator without a gradient."""

    forward: float | dict[str, float]
    backward: float | dict[str, float] | None
    one_thread: float | None = None
    devices: tuple[str, ...] = ("cpu",)


@dataclass(frozen=True)
class Inputs:
    """What an entry takes instead of a feature map and boxes: ``draw(workload, generator,
    dtype)`` its tensors, drawn on the CPU (``dtype``: the case's, for the floating inputs
    it applies to), which roiops' call and the peer's both take after the workload;
    ``nbytes(workload, inputs, out)`` the bytes its forward must move at the least (the
    inputs as drawn, roiops' output); ``text(workload)`` what ``--help`` says of the
    workload. Such an entry is timed forward only, in one layout (NCHW: it has no map to
    lay out); its workload's fields name its shapes as its ``text`` says."""

    draw: Callable[[Workload, torch.Generator, torch.dtype], tuple[Tensor, ...]]
    nbytes: Callable[[Workload, tuple[Tensor, ...], Tensor], int]
    text: Callable[[Workload], str]


def read_and_written(w: Workload, inputs: tuple[Tensor, ...], out: Tensor) -> int:
    """An :class:`Inputs`' ``nbytes`` for an entry that reads each input once and writes its
    whole output once."""
    return sum(t.numel() * t.element_size() for t in (*inputs, out))


@dataclass(frozen=True)
class Bench:
    """How ``roiops bench`` times an operator: ``call(workload, map, boxes)`` and its peer's,
    on each of ``workloads``, boxes drawn in ``boxes`` (its operator's format), or with
    ``inputs``, ``call(workload, *tensors)`` on the tensors they draw. ``key`` names it in
    results (the op's name, then a variant); ``target``: the speed it must reach
    (BENCHMARKS.md's summary judges it)."""

    key: str
    title: str
    call: Callable[..., Tensor]
    peer: Peer | None          # None: roiops is timed alone (no ratio)
    workloads: tuple[Workload, ...] = ()
    argmax: bool = False       # keeps an int32 index per output value for its backward (bytes model)
    sampled: bool = True       # the workload's sampling_ratio applies
    boxes: BoxFormat = AXIS_ALIGNED
    # the map's channels must be a multiple of this (position-sensitive ops: size x size)
    channel_multiple: Callable[[Workload], int] = lambda w: 1
    target: Target | None = None
    inputs: Inputs | None = None   # None: a feature map and boxes
