"""Declaring an op: register() with an extra differentiable tensor input (as deformable
RoI pooling's offsets), on a toy op in a namespace of its own, so that the contract tests'
view of ``torch.ops.roiops`` does not change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from roiops import _backend
from roiops.ops import _declare
from roiops._spec import Kernels

# out[k, c, i, j] = x[b_k, c, i, j] + scale * offset[k, 0, i, j], offset optional: the input,
# then the offset, are differentiable.
TOY = Kernels("toy_shifted", (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width")),
              ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width",
               "channels_last"), tensors=(("offset", True),))


def toy_shifted_forward(input, rois, offset, spatial_scale, pooled_height, pooled_width):
    out = input[rois[:, 0].long(), :, :pooled_height, :pooled_width]
    return out if offset is None else out + spatial_scale * offset[:, :1].to(input.dtype)


def toy_shifted_backward(grad, rois, offset, spatial_scale, pooled_height, pooled_width, batch_size, channels, height,
                         width, channels_last):
    grad_input = grad.new_zeros(batch_size, channels, height, width)
    grad_input[:, :, :pooled_height, :pooled_width].index_add_(0, rois[:, 0].long(), grad)
    return grad_input


def toy_shifted_offset_backward(grad, input, rois, offset, spatial_scale, pooled_height, pooled_width):
    grad_offset = torch.zeros_like(offset)
    grad_offset[:, :1] = spatial_scale * grad.sum(1, keepdim=True)
    return grad_offset


@pytest.fixture(scope="module")
def toy():
    library = torch.library.Library("roiops_declare_test", "FRAGMENT")
    saved = _declare._LIB
    _declare._LIB = library
    try:
        call = _declare.register(TOY)
    finally:
        _declare._LIB = saved
    kernels = SimpleNamespace(toy_shifted_forward=toy_shifted_forward, toy_shifted_backward=toy_shifted_backward,
                              toy_shifted_offset_backward=toy_shifted_offset_backward)
    patch = pytest.MonkeyPatch()
    patch.setattr(_backend, "kernels_of", lambda t: kernels)
    yield call, torch.ops.roiops_declare_test
    patch.undo()
    library._destroy()


def _inputs():
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[1, 0, 0, 3, 3], [0, 1, 1, 4, 4.0]], dtype=torch.float64)
    offset = torch.randn(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    return x, rois, offset


def test_schema_has_the_extra_tensor_in_forward_and_backwards(toy):
    """The offset's gradient is an op of its own, which reads the input (as a box gradient)."""
    _, ops = toy
    assert str(ops.toy_shifted.default._schema) == (
        "roiops_declare_test::toy_shifted(Tensor input, Tensor rois, Tensor? offset, float spatial_scale, "
        "int pooled_height, int pooled_width) -> Tensor")
    assert str(ops._toy_shifted_backward.default._schema) == (
        "roiops_declare_test::_toy_shifted_backward(Tensor grad, Tensor rois, Tensor? offset, float spatial_scale, "
        "int pooled_height, int pooled_width, int batch_size, int channels, int height, int width, "
        "bool channels_last) -> Tensor")
    assert str(ops._toy_shifted_offset_backward.default._schema) == (
        "roiops_declare_test::_toy_shifted_offset_backward(Tensor grad, Tensor input, Tensor rois, Tensor? offset, "
        "float spatial_scale, int pooled_height, int pooled_width) -> Tensor")


@pytest.mark.parametrize("path", ["direct", "dispatcher"])
def test_gradcheck_of_input_and_extra_tensor(toy, path):
    call, ops = toy
    x, rois, offset = _inputs()
    fn = call if path == "direct" else ops.toy_shifted
    out = fn(x, rois, offset, 0.5, 3, 4)
    expected = toy_shifted_forward(x.detach(), rois, offset.detach(), 0.5, 3, 4)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda a, o: fn(a, rois, o, 0.5, 3, 4), (x, offset))


def test_extra_tensor_may_be_none(toy):
    call, ops = toy
    x, rois, _ = _inputs()
    for fn in (call, ops.toy_shifted):
        out = fn(x, rois, None, 0.5, 3, 4)
        torch.testing.assert_close(out, x.detach()[rois[:, 0].long(), :, :3, :4], rtol=0, atol=0)
        assert torch.autograd.gradcheck(lambda a: fn(a, rois, None, 0.5, 3, 4), (x,))


def test_opcheck_and_fake(toy):
    _, ops = toy
    x, rois, offset = _inputs()
    torch.library.opcheck(ops.toy_shifted.default, (x, rois, offset, 0.5, 3, 4))
    grad = torch.randn(2, 3, 3, 4, dtype=torch.float64)
    torch.library.opcheck(ops._toy_shifted_backward.default, (grad, rois, offset.detach(), 0.5, 3, 4, 2, 3, 5, 6, False),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(ops._toy_shifted_offset_backward.default, (grad, x.detach(), rois, offset.detach(), 0.5, 3, 4),
                          test_utils=("test_schema", "test_faketensor"))
