"""The drop-ins under the tools that peers' users run on them: TorchScript (torchvision's
functions and modules, and a scripted Mask R-CNN with roiops' poolers), torch.fx (every
public RoI function is one call node, a leaf, as torchvision's are), the peers' exception
types for malformed boxes, and the refusal of quantized tensors. Checked against
torchvision itself."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch
import torch.fx
import torchvision
from torch import nn

import roiops
from boxes import random_boxes
from roiops.compat import detectron2 as d2
from roiops.compat import faster_rcnn_pytorch as frp
from roiops.compat import maskrcnn_benchmark as mrb
from roiops.compat import mmcv, mmdet
from roiops.compat import simple_faster_rcnn as sfr
from roiops.compat import torchvision as tv

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
    rois = random_boxes(2, 6, 40, 32, torch.Generator().manual_seed(seed))
    return rois[rois[:, 0].argsort(stable=True)]


def _per_image(rois: torch.Tensor) -> list[torch.Tensor]:
    return [rois[rois[:, 0] == i, 1:] for i in range(2)]


def _script(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(fn)


# ---- TorchScript -------------------------------------------------------------------------

SCRIPTED = [("roi_align", (3, 0.5, 2, True)), ("roi_align", ((2, 3), 0.5, -1, False)), ("roi_pool", ([3, 2], 0.5)),
            ("ps_roi_align", (2, 0.5, 2)), ("ps_roi_pool", (2, 0.5))]


@pytest.mark.parametrize("name, args", SCRIPTED)
def test_torchvision_functions_script_and_equal_torchvision(name, args):
    ours, theirs = getattr(tv, name), getattr(torchvision.ops, name)
    scripted = _script(ours)
    x, rois = _maps(), _rois()
    expected = ours(x, rois, *args)
    if name != "ps_roi_pool":  # torchvision's forward leaves out a bin's last row (docs/semantics.md)
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
    peer = getattr(torchvision.ops, type(module).__name__)(*[getattr(module, a) for a in (
        ("output_size", "spatial_scale", "sampling_ratio", "aligned") if isinstance(module, tv.RoIAlign) else
        ("output_size", "spatial_scale", "sampling_ratio") if isinstance(module, tv.PSRoIAlign) else
        ("output_size", "spatial_scale"))])
    assert torch.equal(scripted(x, _per_image(rois)), module(x, rois))
    if not isinstance(module, tv.PSRoIPool):  # torchvision's forward leaves out a bin's last row
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
    from roiops._backend import triton_too_old

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


# (function, its arguments after the map and the boxes, box form)
LEAVES = [
    (roiops.roi_align, (3, 0.5, 2, True, "max"), "rois"),
    (roiops.roi_pool, (3, 0.5), "list"),
    (roiops.roi_align_rotated, (3, 0.5, 2), "rotated"),
    (roiops.ps_roi_align, (2, 0.5, 2), "rois"),
    (roiops.ps_roi_pool, (2, 0.5), "rois"),
    (roiops.prroi_pool, (3, 0.5), "rois"),
    (roiops.multi_scale_roi_align, (3, [0.5, 0.25], 2), "levels"),
    (tv.roi_align, (3, 0.5, 2), "list"),
    (tv.roi_pool, (3, 0.5), "rois"),
    (tv.ps_roi_align, (2, 0.5, 2), "rois"),
    (tv.ps_roi_pool, (2, 0.5), "list"),
    (mmcv.roi_align, (3, 0.5), "rois"),
    (mmcv.roi_pool, (3, 0.5), "rois"),
    (mmcv.roi_align_rotated, (3, 0.5), "rotated"),
    (mmcv.prroi_pool, (3, 0.5), "rois"),
    (mrb.roi_align, (3, 0.5, 2), "rois"),
    (mrb.roi_pool, (3, 0.5), "rois"),
    (mmdet.roi_pool, (3, 0.5), "rois"),
    (frp.roi_align_corners, (3, 3, 0.5), "rois"),
]


class _Call(nn.Module):
    def __init__(self, fn, args):
        super().__init__()
        self.fn, self.args = fn, args

    def forward(self, x, boxes):
        return self.fn(x, boxes, *self.args)


def _inputs(form: str):
    x, rois = _maps(), _rois()
    if form == "rotated":
        return x, _rotated(rois)
    if form == "list":
        return x, _per_image(rois)
    if form == "levels":
        return [x, _maps(seed=5)[..., :8, :10]], rois
    return x, rois


@pytest.mark.parametrize("fn, args, form", LEAVES, ids=lambda p: f"{p.__module__}.{p.__name__}" if callable(p) else "")
def test_every_public_function_is_one_fx_node(fn, args, form):
    module = _Call(fn, args)
    traced = torch.fx.symbolic_trace(module)
    calls = [n for n in traced.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    assert [(n.op, n.target) for n in calls] == [("call_function", fn)]
    x, boxes = _inputs(form)
    assert torch.equal(traced(x, boxes), module(x, boxes))


@pytest.mark.parametrize("layer", [
    tv.RoIAlign(5, 1.0, -1), tv.RoIPool(3, 1.0), tv.PSRoIAlign(2, 1.0, 2), tv.PSRoIPool(2, 1.0),
    roiops.RoIAlign(3, 0.5), roiops.PSRoIPool(2, 0.5), roiops.PrRoIPool(3, 0.5), mmcv.RoIAlign(3), mmcv.RoIPool(3),
    mmcv.PrRoIPool(3), d2.ROIAlign(3, 0.5, 2), mrb.ROIAlign(3, 0.5, 2), mrb.ROIPool(3, 0.5), mmdet.RoIPool(3, 0.5),
    frp.RoIAlign(3, 3, 0.5), frp.RoIPool(3, 3, 0.5), sfr.RoIPooling2D(3, 3, 0.5)], ids=lambda m: type(m).__module__)
def test_layers_trace_to_one_node_per_op(layer):
    """torchvision's own op tester: a module holding the layer traces to its inputs and
    one node (get_graph_node_names); the GraphModule computes the same."""
    from torchvision.models.feature_extraction import get_graph_node_names

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, a, b):
            return self.layer(a, b)

    train_nodes, eval_nodes = get_graph_node_names(Wrapper())
    assert len(train_nodes) == len(eval_nodes) == 3
    x, rois = _maps(), _rois()
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
    x = torch.linspace(1, 64, 64).reshape(1, 1, 8, 8)
    calls = [(f, (x, torch.tensor([[0.0, 0, 3, 3]]), (2, 2))) for f in ("roi_align", "roi_pool")]
    calls += [(f, (x, [torch.tensor([[0.0, 0, 3]])], (2, 2))) for f in ("roi_align", "roi_pool")]
    calls += [(f, (torch.rand(1, 4, 8, 8), torch.tensor([[0.0, 0, 3, 3]]), (2, 2)))
              for f in ("ps_roi_align", "ps_roi_pool")]
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
    for fn in (roiops.ps_roi_align, roiops.ps_roi_pool):
        with pytest.raises(ValueError, match="boxes must have shape"):
            fn(x, torch.tensor([[0.0, 0, 3, 3]]), 2)
        with pytest.raises(ValueError, match="not a multiple"):
            fn(x, torch.tensor([[0.0, 0, 0, 3, 3]]), 2)


def test_detectron2_and_mmcv_drop_ins_assert_the_box_shape_as_their_peers():
    x, bad = _maps(), torch.rand(3, 4)
    for call in (lambda: d2.ROIAlign(3, 0.5, 2)(x, bad), lambda: d2.ROIAlignRotated(3, 0.5, 2)(x, bad),
                 lambda: mmcv.roi_align(x, bad, 3), lambda: mmcv.RoIAlign(3)(x, bad), lambda: mmcv.roi_pool(x, bad, 3),
                 lambda: mmcv.RoIPool(3)(x, bad)):
        with pytest.raises(AssertionError) as error:
            call()
        assert isinstance(error.value, ValueError)
    # mmcv's rotated and Precise RoI Pooling layers assert nothing: roiops' ValueError alone.
    for call in (lambda: mmcv.roi_align_rotated(x, bad, 3), lambda: mmcv.prroi_pool(x, bad, 3)):
        with pytest.raises(ValueError) as error:
            call()
        assert not isinstance(error.value, AssertionError)


# ---- quantized tensors ---------------------------------------------------------------------

def _quantized_cases():
    x, rois = _maps(4), _rois()
    qx = torch.quantize_per_tensor(x, 0.05, 0, torch.quint8)
    qrois = torch.quantize_per_tensor(rois, 0.125, 0, torch.qint32)
    return [(qx, rois, "input"), (x, qrois, "boxes"), (x, _per_image(qrois), "boxes\\[0\\]")]


OPS = [(roiops.roi_align, (2, 0.5)), (roiops.roi_pool, (2, 0.5)), (roiops.ps_roi_align, (2, 0.5)),
       (roiops.ps_roi_pool, (2, 0.5)), (roiops.prroi_pool, (2, 0.5))]


@pytest.mark.parametrize("fn, args", OPS, ids=lambda p: getattr(p, "__name__", ""))
def test_quantized_tensors_are_refused_clearly(fn, args):
    for x, boxes, name in _quantized_cases():
        with pytest.raises(ValueError, match=f"{name} is a quantized tensor .*PyTorch deprecates.*dequantize"):
            fn(x, boxes, *args)
    qx = torch.quantize_per_tensor(_maps(), 0.05, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match="quantized"):  # also a ValueError
        roiops.roi_align_rotated(qx, _rotated(_rois()), 2)
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
    for name in ("roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool"):
        with pytest.raises(ValueError, match="quantized") as error:
            getattr(tv, name)(qx, rois, 2)
        assert isinstance(error.value, NotImplementedError)
