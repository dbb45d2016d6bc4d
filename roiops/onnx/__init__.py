"""ONNX export of the roiops ops with torch.onnx's dynamo exporter (ONNX opset >= 16).

Once ``roiops`` is imported, a plain ``torch.onnx.export(model, args, dynamo=True)``
translates the roiops ops: roiops adds the default translations below to the exporter's
own when torch loads its exporter (checked with torch 2.11, 2.12 and 2.14); ``import
roiops`` itself loads no ONNX code. Importing this module needs ``onnxscript`` (and
``onnx``). To choose other translations, or if a newer torch warns that roiops could not
add them, either export with [`roiops.onnx.export`][]:

    program = roiops.onnx.export(model, (images, boxes), dynamic_shapes=...)
    program.save("model.onnx")

or pass [`roiops.onnx.translation_table`][] to torch.onnx yourself (yours for the same
ops take precedence over ours):

    torch.onnx.export(model, args, dynamo=True,
                      custom_translation_table=roiops.onnx.translation_table())

What each op becomes (docs/ecosystem.md has the table and the reasons):

- ``roi_align`` mode ``"avg"``: the ONNX ``RoiAlign`` operator (``mode="avg"``;
  ``aligned`` -> ``coordinate_transformation_mode`` ``"half_pixel"`` /
  ``"output_half_pixel"``, ``sampling_ratio <= 0`` -> 0, the ``[K, 5]`` boxes split into
  int64 ``batch_indices`` and ``rois[K, 4]``). With ``aligned=True`` and adaptive
  sampling, boxes whose sample grid is empty (zero or negative size) are replaced by an
  empty box and their output set to 0: roiops defines them as 0, and onnxruntime's
  ``RoiAlign`` fails on them ("Integer overflow") when only the height is negative.
  onnxruntime's ``RoiAlign`` also computes samples outside the map as
  ``0 * x[b, c, 0, 0]``, so a NaN or inf in a map's top-left element spreads to them
  (roiops gives them 0); finite maps agree bit for bit.
  ``translation_table(align_avg="decompose")`` exports a decomposition instead (the
  samples of mode ``"max"``, summed in the kernels' order), exact in every case.
- ``roi_align`` mode ``"max"``: a decomposition into standard ops (Gather, ArgMax).
  ONNX ``RoiAlign``'s max mode is a different formula (the maximum of the four weighted
  corners of each sample), so it is never used.
- ``roi_pool`` (both conventions): a decomposition (Gather, ArgMax, GatherElements).
  ``MaxRoiPool`` (Caffe convention only) is not used: onnxruntime's kernel starts its
  running maximum at -FLT_MAX (older releases at +FLT_MIN, the smallest positive float,
  so all-negative bins came out positive), turning an all ``-inf`` bin into -FLT_MAX, and
  it propagates NaN only when the NaN is the last element of the bin.
- ``ps_roi_align``, ``ps_roi_pool``, ``roi_align_rotated``, ``riroi_align_rotated``,
  ``deform_roi_pool``, ``bezier_align``, ``border_align``, ``prroi_pool``: decompositions
  that compute each bin's samples (or cells) as the kernels do and sum them in the
  kernels' order (CumSum: a running sum), so that they agree bit for bit.
- The RoI pooling decompositions above (not ``border_align``) run over blocks of boxes of
  similar size, an ONNX ``Loop`` whose blocks' results are collected in a sequence
  (``block_values``), so that their memory does not grow with the box count; every box is
  computed as without blocks. ``block_values=None`` computes every box at once.
- ``multi_scale_roi_align``: one graph; each level's boxes are gathered (``NonZero``),
  pooled by ``roi_align``'s translation and scattered back (``ScatterND``).
- ``paste_masks``, ``paste_masks_torchvision``: each plane computed in a crop of the pixels
  its box reaches (as large as the largest box's) with the kernels' arithmetic, their fused
  multiply-adds built from standard ops and rounded once (an error-free sum, corrected at
  ties), the crops scattered into the planes (``ScatterElements``). Exact.
- ``mask_targets``: ``roi_align``'s translation (scale 1) of the masks read as float32
  (float64 for float64 masks), thresholded in that type.
- ``points_in_boxes``, ``roipoint_pool3d``, ``roiaware_pool3d``: decompositions that test
  every (box, point) pair at once in the kernels' arithmetic; the orders the kernels follow
  (a box's first points, a voxel's first ``max_points``) come from running counts (CumSum)
  and a sort on unique keys (TopK). Exact in float32 and half types; with float64
  coordinates a point within about 1e-15 (relative) of a face or a voxel boundary can fall
  the other way (onnxruntime's float64 Cos and Sin are not libm's).
- ``polygon_targets`` (mask targets from packed polygons): each edge's crossings of the
  pixel columns as the kernel traces them, and the even-odd parity of their running count.

Every translation uses standard ONNX operators only, with the box count dynamic.
``align_avg="decompose"`` leaves ``RoiAlign`` out altogether, for runtimes that lack it.
Every decomposition reproduces the kernels' arithmetic (same float type, same operation
order) and matches roiops bit for bit, NaN and infinities included, up to the sign of a
zero maximum; with float64 rotated boxes and float64 point clouds, to about 1e-15, as
onnxruntime's float64 ``Cos`` and ``Sin`` are not libm's. Each op's second
output (the argmax used by its backward) is exported faithfully too. float16/bfloat16
inputs are computed in float32 and cast back, which is what roiops' kernels do.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Literal

import torch

from . import _masks, _points3d, _polygons, _pooling
from ._blocks import BLOCK_VALUES

__all__ = ["BLOCK_VALUES", "MIN_OPSET", "export", "translation_table"]

MIN_OPSET = 16
"""The lowest ONNX opset roiops exports to: ``RoiAlign``'s ``coordinate_transformation_mode``
(needed for ``aligned``) came in opset 16."""


def translation_table(
    *, align_avg: Literal["RoiAlign", "decompose"] = "RoiAlign", block_values: int | None = BLOCK_VALUES
) -> dict[Callable[..., Any], Callable[..., Any]]:
    """Translations of ``torch.ops.roiops.*`` for ``torch.onnx.export(custom_translation_table=...)``.

    Every registered forward op is translated (``multi_scale_roi_align`` included) into
    standard ONNX operators.

    Args:
        align_avg: ``"RoiAlign"`` (default) exports ``roi_align`` mode ``"avg"`` as the ONNX
            ``RoiAlign`` operator; ``"decompose"`` as standard ops computing the same
            samples: a larger graph and more memory, exact on non-finite maps too, for
            runtimes whose ``RoiAlign`` differs.
        block_values: the RoI pooling decompositions run over blocks of boxes of similar
            size (an ONNX ``Loop``), each block's largest intermediate holding at most this
            many values (or one box): the graph's memory then grows with the output and a
            block, not with the box count. Larger blocks take fewer iterations and more
            memory. None: no blocks, every box at once (memory grows with the box count),
            for runtimes without ``Loop`` or sequence types (``SequenceInsert``,
            ``ConcatFromSequence``).

    Returns:
        A dict from each registered op overload (``torch.ops.roiops.<op>.default``) to its
        translation.

    Raises:
        ValueError: ``align_avg`` is neither ``"RoiAlign"`` nor ``"decompose"``, or
            ``block_values`` is neither None nor a positive int.

    Examples:
        >>> import roiops.onnx
        >>> table = roiops.onnx.translation_table(align_avg="decompose")
        >>> torch.ops.roiops.roi_align.default in table
        True
    """
    if align_avg not in ("RoiAlign", "decompose"):
        raise ValueError(f"align_avg must be 'RoiAlign' or 'decompose', got {align_avg!r}")
    if block_values is not None and (isinstance(block_values, bool) or not isinstance(block_values, int)
                                     or block_values < 1):
        raise ValueError(f"block_values must be None or a positive int, got {block_values!r}")
    pooling = _pooling.translations(align_avg, block_values)
    translations = {**pooling, **_masks.translations(pooling["roi_align"]), **_polygons.TRANSLATIONS,
                    **_points3d.TRANSLATIONS}
    return {getattr(torch.ops.roiops, name).default: translation for name, translation in translations.items()}


def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...] = (),
    f: str | os.PathLike[str] | None = None,
    *,
    opset_version: int | None = None,
    custom_translation_table: Mapping[Callable[..., Any], Callable[..., Any]] | None = None,
    align_avg: Literal["RoiAlign", "decompose"] = "RoiAlign",
    block_values: int | None = BLOCK_VALUES,
    **kwargs: Any,
) -> torch.onnx.ONNXProgram:
    """``torch.onnx.export(..., dynamo=True)`` with the roiops translations added.

    A model's roiops ops are exported as [`translation_table`][roiops.onnx.translation_table]
    says; the export needs onnxscript (and onnx). docs/ecosystem.md, "ONNX", has a whole
    export and what each op becomes.

    Args:
        model: the module (or exported program) to export.
        args: its example inputs.
        f: where to save the ONNX file; None keeps it in the returned program only.
        opset_version: the ONNX opset, at least [`MIN_OPSET`][roiops.onnx.MIN_OPSET]; None
            is torch.onnx's default.
        custom_translation_table: translations of your own, added to roiops' (yours win
            for the same op).
        align_avg: how ``roi_align`` mode ``"avg"`` is exported: ``"RoiAlign"`` or
            ``"decompose"`` (see [`translation_table`][roiops.onnx.translation_table]).
        block_values: the size of the decompositions' blocks of boxes (see
            [`translation_table`][roiops.onnx.translation_table]).
        **kwargs: any other keyword of ``torch.onnx.export`` (``dynamic_shapes``,
            ``input_names``, ``optimize``...).

    Returns:
        The ``torch.onnx.ONNXProgram``; ``program.save(path)`` writes it.

    Raises:
        ValueError: ``opset_version`` below ``MIN_OPSET``, ``dynamo=False``, or a bad
            ``align_avg`` or ``block_values``.

    Examples:
        >>> import roiops.onnx
        >>> roiops.onnx.export(torch.nn.Identity(), (torch.zeros(1),), opset_version=15)
        Traceback (most recent call last):
            ...
        ValueError: roiops exports need ONNX opset >= 16 (...), got opset_version=15
    """
    if opset_version is not None and opset_version < MIN_OPSET:
        raise ValueError(f"roiops exports need ONNX opset >= {MIN_OPSET} (RoiAlign's "
                         f"coordinate_transformation_mode), got opset_version={opset_version}")
    if kwargs.pop("dynamo", True) is not True:
        raise ValueError("roiops ops export only with the dynamo exporter (dynamo=True)")
    # torch types the values variously
    table: dict[Callable[..., Any], Any] = translation_table(align_avg=align_avg, block_values=block_values)
    table.update(custom_translation_table or {})
    program = torch.onnx.export(model, args, f, dynamo=True, opset_version=opset_version,
                                custom_translation_table=table, **kwargs)
    assert program is not None  # always returned by the dynamo exporter
    return program


_NOT_AUTOMATIC = (
    f"roiops could not add its ONNX translations to torch.onnx.export's defaults (torch {torch.__version__}): "
    "to export a model using roiops ops, call roiops.onnx.export(...) or pass "
    "custom_translation_table=roiops.onnx.translation_table() to torch.onnx.export")


def _extend_default_registry(registration: ModuleType) -> None:
    """Makes every ``torch.onnx.export(..., dynamo=True)`` translate the roiops ops.

    Called with ``torch.onnx._internal.exporter._registration`` once torch has loaded it
    (roiops/_onnx_hook.py waits for that, so ``import roiops`` imports no ONNX code).
    torch.onnx has no public way to extend its default translations. Each export builds its
    registry with the private ``ONNXRegistry.from_torchlib`` (torch 2.11 to 2.14), then adds
    the ``custom_translation_table`` entries with ``register_op``, each ahead of those
    before it; wrapping the former to add ours with the latter keeps a user's own
    translation of a roiops op first. If torch moves either, exports go on without ours and
    a warning names the explicit routes.
    """
    try:
        registry_cls = registration.ONNXRegistry
        build = vars(registry_cls)["from_torchlib"].__func__
    except (AttributeError, KeyError):
        warnings.warn(_NOT_AUTOMATIC, stacklevel=2)
        return

    def from_torchlib(cls: type, *args: Any, **kwargs: Any) -> Any:
        registry = build(cls, *args, **kwargs)
        try:
            for target, translation in translation_table().items():
                registry.register_op(target, translation)
        except Exception:  # a change in torch's registry must not break exports of other models
            warnings.warn(_NOT_AUTOMATIC, stacklevel=2)
        return registry

    registry_cls.from_torchlib = classmethod(from_torchlib)
