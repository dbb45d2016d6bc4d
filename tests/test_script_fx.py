"""The drop-ins under the tools that peers' users run on them: TorchScript (torchvision's
functions and modules, and a scripted Mask R-CNN with roiops' poolers), torch.fx (every
public RoI function is one call node, a leaf, as torchvision's are), the peers' exception
types for malformed boxes, and the refusal of quantized tensors. Checked against
torchvision itself."""

from __future__ import annotations

import inspect
import warnings
from collections import OrderedDict
from types import FunctionType

import pytest
import torch
import torch.fx
import torchvision
from torch import nn

import roiops
from cases import OPTIONS, ROI_SPECS, per_bin_tensors, per_bin_values
from roiops import bench
from roiops._boxes import AXIS_ALIGNED, BEZIER, ROTATED
from roiops.compat import detectron2 as d2
from roiops.compat import faster_rcnn_pytorch as frp
from roiops.compat import maskrcnn_benchmark as mrb
from roiops.compat import mmcv, mmdet
from roiops.compat import simple_faster_rcnn as sfr
from roiops.compat import torchvision as tv
from roiops.ops import SPECS

# torch.jit.script is deprecated (a FutureWarning on each call) but still what scripted
# deployments of torchvision's detection models use.
# Quantized tensors are deprecated too (a UserWarning on creation).
pytestmark = pytest.mark.filterwarnings("ignore:.*TorchScript.*:FutureWarning", "ignore:.*torch.jit.*:FutureWarning",
                                        "ignore::DeprecationWarning", "ignore:.*quantized tensor.*:UserWarning",
                                        "ignore:RCNN always returns:UserWarning")


def _maps(c: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, c, 16, 20, generator=torch.Generator().manual_seed(seed))


def _rois(seed: int = 1) -> torch.Tensor:
    """Rows in image order, as a per-image list gives them."""
    rois = AXIS_ALIGNED.random(2, 6, 40, 32, torch.Generator().manual_seed(seed))
    return rois[rois[:, 0].argsort(stable=True)]


def _per_image(rois: torch.Tensor) -> list[torch.Tensor]:
    return [rois[rois[:, 0] == i, 1:] for i in range(2)]


def _script(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(fn)


# ---- the operators and the drop-ins, from their declarations -----------------------------

OPS = {spec.name: spec for spec in ROI_SPECS}
COMPAT = (d2, frp, mrb, mmcv, mmdet, sfr, tv)
# Whether torchvision computes what roiops computes, by operator (its bench peer's claim):
# PSRoIPool's torchvision forward leaves out a bin's last row (docs/semantics.md).
SAME_AS_TORCHVISION = {b.key: b.peer.same_result for b in bench.OPS.values()
                       if b.peer is not None and b.peer.module == "torchvision"}
# A drop-in's arguments after the map and the boxes, by parameter name.
FILL = {"output_size": 2, "out_size": 2, "aligned_height": 2, "aligned_width": 2, "pooled_height": 2,
        "pooled_width": 2, "outh": 2, "outw": 2, "spatial_scale": 0.5, "sampling_ratio": 2, "offset": None,
        "output_channels": 8, "pool_size": 2}


# Mask R-CNN's mask steps take masks, the point-cloud ops points, not a feature map:
# tests/test_masks.py and tests/test_points3d.py test them.
MASK_STEPS = {tv.paste_masks_in_image, tv.project_masks_on_boxes, d2.paste_masks_in_image, d2.bitmasks_crop_and_resize,
              d2.polygons_crop_and_resize, mmcv.RoIAwarePool3d, mmcv.RoIPointPool3d, mmcv.points_in_boxes_part,
              mmcv.points_in_boxes_all, mmcv.points_in_boxes_cpu}


def _public(module, kind):
    """A drop-in module's public RoI functions (``kind`` function) or classes (``kind``
    type)."""
    return [obj for name in module.__all__ for obj in [getattr(module, name)]
            if isinstance(obj, kind) and obj not in MASK_STEPS]


def _fill(fn) -> dict:
    return {name: FILL[name] for name in inspect.signature(fn).parameters if name in FILL}


def _rotated_drop_in(fn) -> bool:
    """A drop-in for an operator on rotated boxes: named after one (any case)."""
    return fn.__name__.lower() in {n.lower() for spec in ROI_SPECS if spec.boxes is ROTATED
                                   for n in (spec.name, spec.module.__name__)}


def _boxes_per_image(fn) -> bool:
    """A drop-in for an operator with boxes per image (border_align: its own tests)."""
    return fn.__name__.lower() in {n.lower() for spec in SPECS if spec.boxes.per_image
                                   for n in (spec.name, spec.module.__name__)}


def _bezier_drop_in(fn) -> bool:
    """A drop-in for an operator on bezier boxes: named after one (any case)."""
    return fn.__name__.lower() in {n.lower() for spec in SPECS if spec.boxes is BEZIER
                                   for n in (spec.name, spec.module.__name__)}


def _drop_in_boxes(fn) -> str:
    """The box form a drop-in takes: "rotated", "bezier" or "rois"."""
    return "rotated" if _rotated_drop_in(fn) else "bezier" if _bezier_drop_in(fn) else "rois"


def _spec_boxes(spec) -> str:
    """The box form an operator takes, as _inputs names it."""
    return "rois" if spec.boxes is AXIS_ALIGNED else spec.boxes.name


def _takes_lists(fn) -> bool:
    """The function takes a per-image list of boxes too (torchvision's signature)."""
    boxes = list(inspect.signature(fn).parameters.values())[1]
    return "list" in str(boxes.annotation)


# ---- TorchScript -------------------------------------------------------------------------

# Every torchvision function with each output size form: (output_size, spatial_scale,
# sampling_ratio, aligned), as far as the function takes them.
SCRIPTED = [(fn.__name__, args[:len(inspect.signature(fn).parameters) - 2]) for fn in _public(tv, FunctionType)
            for args in ((3, 0.5, 2, True), ((2, 3), 0.5, -1, False), ([3, 2], 0.5, 0, True))]


@pytest.mark.parametrize("name, args", SCRIPTED)
def test_torchvision_functions_script_and_equal_torchvision(name, args):
    ours, theirs = getattr(tv, name), getattr(torchvision.ops, name)
    scripted = _script(ours)
    size = args[0] if isinstance(args[0], (tuple, list)) else (args[0], args[0])
    # a position-sensitive op reads size[0] x size[1] channels per output channel
    x, rois = _maps(2 * size[0] * size[1] if OPS[name].position_sensitive else 8), _rois()
    expected = ours(x, rois, *args)
    if SAME_AS_TORCHVISION[name]:
        assert torch.equal(theirs(x, rois, *args), expected)
    for boxes in (rois, _per_image(rois)):
        assert torch.equal(scripted(x, boxes, *args), expected)


def test_scripted_gradient_equals_eager_and_the_boxes_get_none():
    grads = []
    for fn in (tv.roi_align, _script(tv.roi_align), torchvision.ops.roi_align):
        x, rois = _maps().double().requires_grad_(), _rois().double().requires_grad_()
        fn(x, rois, [3, 3], 0.5, -1, True).square().sum().backward()
        assert rois.grad is None  # as torchvision: RoIAlign's boxes get no gradient
        grads.append(x.grad)
    assert grads[0].abs().sum() > 0
    assert torch.equal(grads[0], grads[1])
    torch.testing.assert_close(grads[0], grads[2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("module", [
    tv.RoIAlign(3, 0.5, 2), tv.RoIAlign((3, 4), 0.5, -1, True), tv.RoIAlign([2, 3], 0.5, 0),
    tv.RoIPool(3, 0.5), tv.PSRoIAlign((2, 2), 0.5, 2), tv.PSRoIPool(2, 0.5)], ids=repr)
def test_torchvision_modules_script(module):
    scripted = _script(module)
    x, rois = _maps(), _rois()
    peer = getattr(torchvision.ops, type(module).__name__)(
        *[getattr(module, a) for a in inspect.signature(type(module)).parameters])
    assert torch.equal(scripted(x, _per_image(rois)), module(x, rois))
    (spec,) = (s for s in ROI_SPECS if s.module.__name__ == type(module).__name__)
    if SAME_AS_TORCHVISION[spec.name]:  # not PSRoIPool: torchvision's forward leaves out a bin's last row
        assert torch.equal(scripted(x, rois), peer(x, rois))


@pytest.mark.parametrize("names", [["0"], ["0", "1", "2", "3"]])
def test_multi_scale_roi_align_scripts(names):
    g = torch.Generator().manual_seed(3)
    features = OrderedDict((str(i), torch.randn(2, 4, 64 // 2**i, 80 // 2**i, generator=g)) for i in range(4))
    boxes = [torch.tensor([[1.0, 1, 90, 90], [10, 20, 250, 200], [3, 3, 4, 2]]), torch.tensor([[5.0, 5, 30, 40]])]
    shapes = [(256, 320), (250, 300)]
    scripted = _script(tv.MultiScaleRoIAlign(names, (7, 5), 2))
    expected = torchvision.ops.MultiScaleRoIAlign(names, (7, 5), 2)(features, boxes, shapes)
    assert torch.equal(scripted(features, boxes, shapes), expected)
    assert scripted.scales == [0.25, 0.125, 0.0625, 0.03125][:len(names)]
    assert torch.equal(scripted(features, boxes, shapes), expected)  # the scales kept from the first call
    with pytest.raises(torch.jit.Error, match="none of featmap_names"):
        _script(tv.MultiScaleRoIAlign(["5"], 7, 2))(features, boxes, shapes)


def _levels() -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((str(i), torch.randn(2, 4, 32 // 2**i, 40 // 2**i)) for i in range(3))


def test_multi_scale_roi_align_asserts_the_box_shape():
    bad = [torch.rand(2, 3), torch.rand(1, 3)]
    for names in (["0"], ["0", "1", "2"]):
        with pytest.raises(AssertionError, match="must have shape") as error:
            tv.MultiScaleRoIAlign(names, 7, 2)(_levels(), bad, [(128, 160)] * 2)
        assert isinstance(error.value, ValueError)


def test_multi_scale_op_checks_the_levels_its_triton_kernel_reads_together():
    from roiops._requirements import triton_too_old

    if triton_too_old():
        pytest.skip(triton_too_old())
    maps, rois, levels = list(_levels().values()), _rois(), torch.zeros(6, dtype=torch.int64)
    with roiops.use_backend("triton"):
        with pytest.raises(ValueError, match="features\\[1\\]"):
            torch.ops.roiops.multi_scale_roi_align([maps[0], maps[1][:, :2]], rois, levels, [0.25, 0.125], 2, 2, 2,
                                                   False)
        with pytest.raises(ValueError, match="1 to 5 levels"):
            torch.ops.roiops.multi_scale_roi_align(maps, rois, levels, [0.25], 2, 2, 2, False)


def test_drop_ins_compile_without_graph_breaks():
    """torch.compile(fullgraph=True) traces the drop-ins' fx check, also on a list of boxes."""
    x, rois = _maps(), _rois()
    for fn, boxes in ((tv.roi_align, _per_image(rois)), (tv.roi_pool, rois), (mmcv.roi_align, rois),
                      (roiops.roi_align, _per_image(rois))):
        compiled = torch.compile(fn, backend="eager", fullgraph=True)
        assert torch.equal(compiled(x, boxes, 3, 0.5), fn(x, boxes, 3, 0.5))


def test_scripted_calls_refuse_bad_inputs_with_clear_errors():
    scripted = _script(tv.roi_align)
    x = _maps()
    cases = [((x, torch.tensor([[0.0, 1, 1, 9]]), [2, 2]), "boxes must have shape \\[K, 5\\]"),
             ((x, [torch.tensor([[1.0, 1, 9]])], [2, 2]), "must have shape \\[K, 4\\]"),
             ((x, torch.tensor([[2.0, 1, 1, 9, 9]]), [2, 2]), "batch index 2"),
             ((x, torch.tensor([[0.0, float("nan"), 1, 9, 9]]), [2, 2]), "finite"),
             ((x[0], torch.tensor([[0.0, 1, 1, 9, 9]]), [2, 2]), "4-D"),
             ((x, torch.tensor([[0.0, 1, 1, 9, 9]]), [0, 2]), "output size"),
             ((torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), torch.tensor([[0.0, 1, 1, 9, 9]]), [2, 2]),
              "quantized"),
             ((x, torch.tensor([[0, 1, 1, 9, 9]]), [2, 2]), "floating point")]
    for args, message in cases:
        # TorchScript raises its own Error; the kernels' checks arrive as a RuntimeError.
        with pytest.raises((torch.jit.Error, RuntimeError), match=message):
            scripted(*args)


def test_scripted_mask_rcnn_with_roiops_poolers_equals_eager():
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    torch.manual_seed(0)
    model = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3, min_size=128, max_size=160,
                                  box_score_thresh=0.0, box_detections_per_img=20).eval()
    for name in ("box_roi_pool", "mask_roi_pool"):
        theirs = getattr(model.roi_heads, name)
        setattr(model.roi_heads, name, tv.MultiScaleRoIAlign(theirs.featmap_names, theirs.output_size,
                                                             theirs.sampling_ratio))
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, 120, 150, generator=g), torch.rand(3, 96, 140, generator=g)]
    with torch.no_grad():
        eager = model(images)
        _, scripted = _script(model)(images)
    assert sum(len(d["boxes"]) for d in eager) > 0
    for e, s in zip(eager, scripted):
        assert e.keys() == s.keys()
        for key in e:
            assert torch.equal(e[key], s[key]), key


# ---- torch.fx ------------------------------------------------------------------------------

def _rotated(rois: torch.Tensor) -> torch.Tensor:
    cx, cy = (rois[:, 1] + rois[:, 3]) / 2, (rois[:, 2] + rois[:, 4]) / 2
    return torch.stack([rois[:, 0], cx, cy, rois[:, 3] - rois[:, 1], rois[:, 4] - rois[:, 2],
                        torch.linspace(-1, 1, len(rois))], 1)


def _forms(boxes: str, lists: bool) -> tuple[str, ...]:
    return (boxes, f"{boxes} list") if lists else (boxes,)


def _leaf(spec, options: dict) -> tuple[tuple, dict]:
    """The operator's arguments after the map and the boxes (its per-bin tensors for
    _rois()' boxes, output size 2, scale 0.5) and its keyword options."""
    tensors = per_bin_tensors(spec)
    extra = [None if n in options else per_bin_values(_rois(), 2, c, _maps()) for n, c in tensors.items()]
    return (*extra, 2, 0.5), {k: v for k, v in options.items() if k not in tensors}


# (function, its arguments after the map and the boxes, its keyword arguments, box form):
# every operator with each of its option sets (a position-sensitive one reads the 8
# channels as 2 x 2 x 2), FPN RoIAlign, and every function of the drop-ins.
LEAVES = [pytest.param(spec.function, *_leaf(spec, options), form, id=f"roiops.{spec.name}-{i}-{form}")
          for spec in ROI_SPECS for i, options in enumerate(OPTIONS[spec.name])
          for form in _forms(_spec_boxes(spec), True)]
LEAVES.append(pytest.param(roiops.multi_scale_roi_align, (3, [0.5, 0.25], 2), {}, "levels", id="multi_scale_roi_align"))
LEAVES += [pytest.param(fn, (), _fill(fn), form, id=f"{fn.__module__}.{fn.__name__}-{form}")
           for fn in dict.fromkeys(fn for module in COMPAT for fn in _public(module, FunctionType))
           if not _boxes_per_image(fn)
           for form in _forms(_drop_in_boxes(fn), _takes_lists(fn))]


class _Call(nn.Module):
    def __init__(self, fn, args, kwargs=None):
        super().__init__()
        self.fn, self.args, self.kwargs = fn, args, kwargs or {}

    def forward(self, x, boxes):
        return self.fn(x, boxes, *self.args, **self.kwargs)


def _inputs(form: str):
    x, rois = _maps(), _rois()
    if form == "levels":
        return [x, _maps(seed=5)[..., :8, :10]], rois
    boxes = (_rotated(rois) if form.startswith("rotated") else
             BEZIER.from_axis_aligned(rois) if form.startswith("bezier") else rois)
    return x, _per_image(boxes) if form.endswith("list") else boxes


@pytest.mark.parametrize("fn, args, kwargs, form", LEAVES)
def test_every_public_function_is_one_fx_node(fn, args, kwargs, form):
    module = _Call(fn, args, kwargs)
    traced = torch.fx.symbolic_trace(module)
    calls = [n for n in traced.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    assert [(n.op, n.target) for n in calls] == [("call_function", fn)]
    x, boxes = _inputs(form)
    assert torch.equal(traced(x, boxes), module(x, boxes))


# The drop-ins' layers that take a map and boxes (not torchvision's MultiScaleRoIAlign,
# which takes the levels and image sizes, nor LevelMapper); faster-rcnn.pytorch's
# RoIAlignAvg and RoIAlignMax pool the aligned output once more, as that project's do.
LAYERS = [cls for cls in dict.fromkeys(cls for module in COMPAT for cls in _public(module, type))
          if issubclass(cls, nn.Module) and len(inspect.signature(cls.forward).parameters) == 3
          and not _boxes_per_image(cls)
          and not list(cls(**_fill(cls)).parameters())]  # a layer with weights (a Pack) is more than its op
POOLED_AFTER = (frp.RoIAlignAvg, frp.RoIAlignMax)


@pytest.mark.parametrize("layer", [
    tv.RoIAlign(5, 1.0, -1), tv.PSRoIAlign(2, 1.0, 2),
    *(spec.module(2, 0.5, **_leaf(spec, options)[1]) for spec in ROI_SPECS for options in OPTIONS[spec.name]),
    *(cls(**_fill(cls)) for cls in LAYERS)], ids=lambda m: f"{type(m).__module__}.{type(m).__name__}")
def test_layers_trace_to_one_node_per_op(layer):
    """torchvision's own op tester: a module holding the layer traces to its inputs and
    one node per op (get_graph_node_names); the GraphModule computes the same. Every
    operator's Module with each of its option sets, and every drop-in layer."""
    from torchvision.models.feature_extraction import get_graph_node_names

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, a, b):
            return self.layer(a, b)

    train_nodes, eval_nodes = get_graph_node_names(Wrapper())
    assert len(train_nodes) == len(eval_nodes) == 3 + isinstance(layer, POOLED_AFTER)
    x, rois = _inputs(_drop_in_boxes(type(layer)))
    assert torch.equal(torch.fx.symbolic_trace(Wrapper())(x, rois), layer(x, rois))


def test_create_feature_extractor_on_a_model_with_roi_align():
    from torchvision.models.feature_extraction import create_feature_extractor

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 9, 4)

        def forward(self, image, boxes):
            return self.fc(roiops.roi_align(self.conv(image), boxes, 3, 0.5, 2, True).flatten(1))

    torch.manual_seed(0)
    head = Head().eval()
    extractor = create_feature_extractor(head, {"roi_align": "pooled", "fc": "out"})
    image, rois = torch.randn(2, 3, 32, 40), _rois()
    features = extractor(image, rois)
    with torch.no_grad():
        assert torch.equal(features["pooled"], roiops.roi_align(head.conv(image), rois, 3, 0.5, 2, True))
        assert torch.equal(features["out"], head(image, rois))


# ---- exception types -----------------------------------------------------------------------

def test_malformed_boxes_raise_what_torchvision_raises():
    """Every torchvision function, given boxes of 4 columns and a list of 3-column boxes."""
    x = torch.linspace(1, 256, 256).reshape(1, 4, 8, 8)  # 4 channels: 1 x 2 x 2 bins for a position-sensitive op
    calls = [(fn.__name__, (x, boxes, (2, 2))) for fn in _public(tv, FunctionType)
             for boxes in (torch.tensor([[0.0, 0, 3, 3]]), [torch.tensor([[0.0, 0, 3]])])]
    for name, args in calls:
        with pytest.raises(AssertionError):
            getattr(torchvision.ops, name)(*args)
        with pytest.raises(AssertionError, match="must have shape") as error:
            getattr(tv, name)(*args)
        assert isinstance(error.value, ValueError)
        with pytest.raises(ValueError, match="must have shape") as native:
            getattr(roiops, name)(*args)
        assert not isinstance(native.value, AssertionError)


def test_position_sensitive_ops_check_the_boxes_before_the_channels():
    x = torch.rand(1, 3, 8, 8)  # 3 channels: not a multiple of 2 * 2
    functions = [spec.function for spec in ROI_SPECS if spec.position_sensitive]
    assert functions
    for fn in functions:
        with pytest.raises(ValueError, match="boxes must have shape"):
            fn(x, torch.tensor([[0.0, 0, 3, 3]]), 2)
        with pytest.raises(ValueError, match="not a multiple"):
            fn(x, torch.tensor([[0.0, 0, 0, 3, 3]]), 2)


# The drop-ins of detectron2 and mmcv whose peer asserts the boxes' shape.
ASSERTING = (d2.ROIAlign, d2.ROIAlignRotated, d2.roi_align, mmcv.roi_align, mmcv.RoIAlign, mmcv.roi_pool, mmcv.RoIPool,
             mmcv.deform_roi_pool, mmcv.DeformRoIPool, mmcv.DeformRoIPoolPack, mmcv.ModulatedDeformRoIPoolPack,
             mmcv.bezier_align, mmcv.BezierAlign, mmcv.border_align, mmcv.BorderAlign)


def test_detectron2_and_mmcv_drop_ins_assert_the_box_shape_as_their_peers():
    """Every function and layer of the two: an AssertionError (and roiops' ValueError) where
    the peer asserts the shape; the others (mmcv's rotated and Precise RoI Pooling) assert
    nothing: roiops' ValueError alone."""
    x, bad = _maps(), torch.rand(3, 4)
    drop_ins = list(dict.fromkeys(obj for module in (d2, mmcv)
                                  for obj in (*_public(module, FunctionType), *_public(module, type))))
    assert set(ASSERTING) < set(drop_ins)
    for obj in drop_ins:
        call = obj(**_fill(obj)) if isinstance(obj, type) else lambda a, b, fn=obj: fn(a, b, **_fill(fn))
        if obj in ASSERTING:
            with pytest.raises(AssertionError) as error:
                call(x, bad)
            assert isinstance(error.value, ValueError)
        else:
            with pytest.raises(ValueError) as error:
                call(x, bad)
            assert not isinstance(error.value, AssertionError), obj


# ---- quantized tensors ---------------------------------------------------------------------

def _quantized_cases(boxes: str = "rois"):
    x, rois = _maps(4), _inputs(boxes)[1]
    qx = torch.quantize_per_tensor(x, 0.05, 0, torch.quint8)
    qrois = torch.quantize_per_tensor(rois, 0.125, 0, torch.qint32)
    name = "beziers" if boxes == "bezier" else "boxes"
    return [(qx, rois, "input"), (x, qrois, name), (x, _per_image(qrois), f"{name}\\[0\\]")]


@pytest.mark.parametrize("spec", ROI_SPECS, ids=lambda spec: spec.name)
def test_quantized_tensors_are_refused_clearly(spec):
    for x, boxes, name in _quantized_cases(_spec_boxes(spec)):
        with pytest.raises(ValueError, match=f"{name} is a quantized tensor .*PyTorch deprecates.*dequantize"):
            spec.function(x, boxes, *[None] * len(per_bin_tensors(spec)), 2, 0.5)
    qx = torch.quantize_per_tensor(_maps(), 0.05, 0, torch.qint8)
    rois = _inputs(_spec_boxes(spec))[1]
    with pytest.raises(NotImplementedError, match="quantized") as error:
        spec.function(qx, rois, *[None] * len(per_bin_tensors(spec)), 2)
    assert isinstance(error.value, ValueError)
    for layer in (d2.ROIAlign(2, 0.5, 2), tv.RoIAlign(2, 0.5, 2), mmcv.RoIAlign(2, 0.5)):
        with pytest.raises(ValueError, match="input is a quantized tensor"):
            layer(qx, _rois())
        with pytest.raises(ValueError, match="boxes is a quantized tensor"):
            layer(_maps(), torch.quantize_per_tensor(_rois(), 0.125, 0, torch.qint32))
    with pytest.raises(ValueError, match="quantized"):
        roiops.multi_scale_roi_align([qx], _rois(), 2, [0.5])


def test_torchvision_drop_in_refuses_quantized_input_with_the_type_torchvision_raises():
    x, rois = _maps(4), _rois()
    qx = torch.quantize_per_tensor(x, 0.05, 0, torch.quint8)
    # torchvision refuses a quantized map with float boxes with a ValueError from its Python
    # check (older releases, 0.21 among them, failed in their kernel instead), and the ops
    # it has no quantized kernel for with a NotImplementedError: roiops' error is both.
    with pytest.raises((ValueError, RuntimeError)) as peer:
        torchvision.ops.roi_align(qx[:1], rois[rois[:, 0] == 0], 2)
    if "must also be quantized" in str(peer.value):
        assert peer.type is ValueError
    with pytest.raises(NotImplementedError):
        torchvision.ops.roi_pool(qx, rois, 2)
    for fn in _public(tv, FunctionType):
        with pytest.raises(ValueError, match="quantized") as error:
            fn(qx, rois, 2)
        assert isinstance(error.value, NotImplementedError)
