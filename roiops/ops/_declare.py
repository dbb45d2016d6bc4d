"""Builds an op from its declaration: the registered ``torch.ops.roiops`` pair (forward and
backward) with their fake kernels, autograd and the refusal of double backward; and the
``nn.Module`` base that validates an op's arguments by name.

The kernel contract (docs/architecture.md): op ``roiops::<name>`` calls
``<kernels>.<name>_forward(input, rois, *tensors, *args)``; op ``roiops::_<name>_backward``
calls ``<kernels>.<name>_backward(grad, *saved, rois, *tensors, *backward)``, where
``tensors`` are the op's extra tensor inputs (``Kernels.tensors``), ``saved`` the forward's
extra outputs (an argmax) and ``backward`` names forward arguments or the input's
``batch_size, channels, height, width, channels_last``; it returns the input's gradient.
An op declared with ``rois_grad`` also has ``roiops::_<name>_rois_backward``, which calls
``<kernels>.<name>_rois_backward(grad, input, rois, *tensors, *args)`` (the forward's
arguments) and returns the gradient with respect to ``rois`` (zero in the batch-index
column); autograd uses it when ``rois`` requires grad. Likewise each differentiable extra
tensor ``t`` has ``roiops::_<name>_<t>_backward`` and ``<kernels>.<name>_<t>_backward``,
with the same arguments, returning ``t``'s gradient (``t``'s shape and dtype; an empty
``[0]`` tensor when ``t`` is None). These read the input, which autograd saves only when
one of them runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar, get_args, get_origin, get_type_hints

import torch
from torch import Tensor, nn
from torch.fx import Proxy

from .. import _backend, _library, _registry
from .. import _validation as v
from .._geometry import is_channels_last, memory_format
from .._spec import Kernels


# RoIAlign's arguments (Kernels.args) and its backward's (Kernels.backward); rotated
# RoIAlign's kernels take the same, in the same order.
ALIGN_ARGS = (("float", "spatial_scale"), ("int", "pooled_height"), ("int", "pooled_width"),
              ("int", "sampling_ratio"), ("bool", "aligned"))
ALIGN_BACKWARD = ("spatial_scale", "pooled_height", "pooled_width", "batch_size", "channels", "height", "width",
                  "sampling_ratio", "aligned", "channels_last")


def empty_output(input: Tensor, rois: Tensor, ph: int, pw: int, dtype: torch.dtype | None = None,
                 channels: Any = None) -> Tensor:
    """An op's output (or int32 extra output) for ``rois``: ``[K, channels, ph, pw]`` (by
    default the input's C) in the input's layout."""
    c = input.shape[1] if channels is None else channels
    return torch.empty((rois.shape[0], c, ph, pw), dtype=dtype or input.dtype, device=input.device,
                       memory_format=memory_format(is_channels_last(input)))


def empty_grad(grad: Tensor, n: int, c: int, h: int, w: int, channels_last: bool) -> Tensor:
    """A backward's gradient of an ``[n, c, h, w]`` input."""
    return torch.empty((n, c, h, w), dtype=grad.dtype, device=grad.device, memory_format=memory_format(channels_last))


# Every roiops op is defined in this fragment of the "roiops" namespace (the module keeps
# it alive), unless the C++ kernels' library has defined it: it loads first.
_LIB = torch.library.Library("roiops", "FRAGMENT")
_library.error()


def define(name: str, schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """Defines op ``roiops::<name>`` with ``schema`` (``"(args) -> returns"``): ``kernel``
    runs it on every device that has no kernel of its own (the C++ library registers the
    CPU one; ``kernel`` picks the kernel set itself), ``fake`` gives its outputs' metadata
    (FakeTensor, meta, torch.compile and torch.export). Returns the op overload.

    The C++ library defines every declared op (so that C++ programs and AOTInductor reach
    it without Python) from a file setup.py generates from the declarations; a library
    built from other sources, whose schema differs, is refused here.

    Not ``torch.library.custom_op``, which registers the same but runs each call through
    its own kernel table and an output aliasing check: host work on every call that these
    ops, whose outputs never alias their inputs, do not need. The kernel is kept from
    Dynamo, as custom_op keeps it, so that code around a graph break never traces it."""
    qualified = f"{_LIB.ns}::{name}"
    declared = str(torch._C.parse_schema(qualified + schema))
    try:
        built = str(torch._C._get_schema(qualified, ""))
    except RuntimeError:  # not defined by the library
        _LIB.define(name + schema)
    else:
        if built != declared:
            raise ImportError(f"roiops: its C++ kernels define {built}, but the op is declared as {declared}: "
                              "rebuild them from these sources")
    _LIB.impl(name, torch._disable_dynamo(kernel), "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_LIB.ns}::{name}", fake, lib=_LIB)
    return getattr(getattr(torch.ops, _LIB.ns), name).default


def register_autograd(op: Any, backward: Callable[..., Any], setup_context: Callable[..., Any] | None = None) -> None:
    """``torch.library.register_autograd`` for an op of :func:`define`."""
    torch.library.register_autograd(op, backward, setup_context=setup_context, lib=_LIB)


def direct(*tensors: Tensor) -> bool:
    """Whether an eager call may run its Python kernel itself instead of through the
    dispatcher: plain CPU or CUDA tensors, and nothing that must see the registered op
    (torch.compile and export, FakeTensor and other tensor subclasses or modes, vmap and
    grad transforms, TorchScript tracing, the profiler's op records). The dispatcher and
    torch.library's autograd layer add host work to every call; this path skips it."""
    return (not torch.compiler.is_compiling()
            and all(type(t) is Tensor and (t.is_cpu or t.is_cuda) for t in tensors)
            and not torch._C._is_torch_function_mode_enabled()
            and torch._C._len_torch_dispatch_stack() == 0
            and torch._C._functorch.peek_interpreter_stack() is None
            and torch._C._get_tracing_state() is None
            and not torch._C._autograd._profiler_enabled())


def fx_node(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    """While torch.fx traces a call of the public RoI ``function`` (an argument is a
    ``Proxy``, or the item of a list argument), the call as one ``call_function`` node of
    ``function``: a leaf, as torchvision's RoI functions are, so that fx-based tools
    (feature extraction, graph-mode quantization) see the op and its checks never run on
    proxies. None for any other call."""
    # A proxy is never a Tensor: the common eager call, with tensors for the map and the
    # boxes in front, costs two type tests (its other arguments are constants then).
    if len(args) >= 2 and isinstance(args[0], Tensor) and isinstance(args[1], Tensor):
        return None
    for a in (*args, *kwargs.values()) if kwargs else args:
        items = a if isinstance(a, (list, tuple)) else (a,)
        for item in items:
            if isinstance(item, Proxy):
                return item.tracer.create_proxy("call_function", function, args, kwargs or {})
    return None


_P = ParamSpec("_P")
_T = TypeVar("_T")


def fx_leaf(function: Callable[_P, _T]) -> Callable[_P, _T]:
    """A public RoI function that torch.fx records whole (:func:`fx_node`)."""
    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        node = fx_node(call, args, kwargs)
        if node is not None:
            return node
        return function(*args, **kwargs)

    return call


@dataclass(frozen=True)
class PlainBackward:
    """The backward of an op without an OpSpec: op ``roiops::_<name>_backward`` with
    ``schema``, its ``kernel`` and ``fake``; ``save(ctx, inputs, outputs)`` keeps what it
    needs on the autograd context; ``gradients(ctx, backward, *grads)`` returns a gradient
    (or None) per forward input, calling ``backward`` (the backward op's call) for them.
    The forward's non-floating outputs are not differentiable."""

    schema: str
    kernel: Callable[..., Any]
    fake: Callable[..., Any]
    save: Callable[..., None]
    gradients: Callable[..., tuple[Tensor | None, ...]]
    title: str


def define_plain(name: str, schema: str, kernel: Callable[..., Any], fake: Callable[..., Any],
                 backward: PlainBackward | None = None) -> Callable[..., Any]:
    """Defines op ``roiops::<name>`` without an OpSpec (:func:`define`: the mask and
    point-cloud ops, which are not RoI-shaped), with ``backward``'s op and autograd formula
    when it has one, and records it in the registry, whose kernel sets then provide
    ``<name>_forward`` (and ``<name>_backward``). Returns the call its public function
    makes: ``kernel`` itself (in an autograd Function when a gradient is needed) where
    :func:`direct` allows, else the registered op."""
    op = define(name, schema, kernel, fake)
    _registry.add_plain(name, backward is not None)
    if backward is None:
        def call(*args: Any) -> Any:
            return kernel(*args) if direct(*[a for a in args if isinstance(a, Tensor)]) else op(*args)

        return call

    bwd = define(f"_{name}_backward", backward.schema, backward.kernel, backward.fake)
    refuse_double_backward(bwd, backward.title)
    backward_op = backward_call(bwd, backward.kernel)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.set_materialize_grads(False)  # no zero gradients for the integer outputs
        backward.save(ctx, inputs, output)
        ctx.backend = _backend.current()

    def gradient(ctx: Any, *grads: Any) -> tuple[Tensor | None, ...]:
        if grads[0] is None:  # the output took no part in the loss
            return (None,) * len(ctx.needs_input_grad)
        if ctx.backend:  # the backend the forward was forced to
            with _backend.use_backend(ctx.backend):
                return backward.gradients(ctx, backward_op, *grads)
        return backward.gradients(ctx, backward_op, *grads)

    register_autograd(op, gradient, setup_context)

    class Direct(torch.autograd.Function):
        """The op's autograd formula around its kernel, for calls :func:`direct` allows."""

        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            output = kernel(*args)
            setup_context(ctx, args, output)
            ctx.mark_non_differentiable(*[t for t in output if not t.is_floating_point()])
            return output

        backward = staticmethod(gradient)

    def call_with_grad(*args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, Tensor)]
        if not direct(*tensors):
            return op(*args)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return Direct.apply(*args)
        return kernel(*args)

    return call_with_grad


def register(spec: Kernels) -> Callable[..., Any]:
    """Defines ``roiops::<name>`` and ``roiops::_<name>_backward`` (and with ``rois_grad``
    ``roiops::_<name>_rois_backward``) from ``spec``. Returns the call the public function
    makes, ``call(input, rois, *tensors, *args)``: the registered op, or where
    :func:`direct` allows, its kernel with the same autograd formula."""
    arg_names = [n for _, n in spec.args]
    n_tensors = len(spec.tensors)
    n_inputs = 2 + n_tensors + len(spec.args)
    forward_kernel, backward_kernel = f"{spec.name}_forward", f"{spec.name}_backward"

    def forward(input: Tensor, rois: Tensor, *args: Any) -> Any:
        return getattr(_backend.kernels_of(input), forward_kernel)(input, rois, *args)

    def backward(grad: Tensor, *args: Any) -> Any:
        return getattr(_backend.kernels_of(grad), backward_kernel)(grad, *args)

    def forward_fake(input: Tensor, rois: Tensor, *args: Any) -> Any:
        named = dict(zip(arg_names, args[n_tensors:]))
        if spec.output_shape is not None:
            shape = spec.output_shape(input.shape, rois.shape, named)
            fmt = memory_format(is_channels_last(input))
            out, *saved = [torch.empty(shape, dtype=d, device=input.device, memory_format=fmt)
                           for d in (input.dtype, *[torch.int32] * len(spec.saved))]
            return (out, *saved) if saved else out
        ph, pw = named["pooled_height"], named["pooled_width"]
        c = spec.out_channels(input.shape[1], ph, pw) if spec.out_channels else None
        out = empty_output(input, rois, ph, pw, channels=c)
        saved = [empty_output(input, rois, ph, pw, torch.int32, c) for _ in spec.saved]
        return (out, *saved) if saved else out

    first_arg = len(spec.saved) + 1 + n_tensors  # after the saved outputs, rois and the extra tensors

    def backward_fake(grad: Tensor, *args: Any) -> Any:
        named = dict(zip(spec.backward, args[first_arg:]))
        return empty_grad(grad, named["batch_size"], named["channels"], named["height"], named["width"],
                          named["channels_last"])

    fwd = define(spec.name, spec.schema("forward"), forward, forward_fake)
    bwd = define(f"_{spec.name}_backward", spec.schema("backward"), backward, backward_fake)
    # The gradients that read the input, by position among the forward's inputs: the boxes'
    # and each differentiable extra tensor's.
    reading = {2 + i: _register_reading_backward(spec, name, i)
               for i, (name, differentiable) in enumerate(spec.tensors) if differentiable}
    if spec.rois_grad:
        reading[1] = _register_reading_backward(spec, "rois")

    input_grad = backward_call(bwd, backward)

    # Where each backward argument comes from: a forward argument (its position), or the input.
    sources = [2 + n_tensors + arg_names.index(n) if n in arg_names else n for n in spec.backward]

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        input, rois = inputs[:2]
        n, c, h, w = input.shape
        from_input = {"batch_size": n, "channels": c, "height": h, "width": w,
                      "channels_last": is_channels_last(input)}
        # Otherwise autograd hands backward zero tensors the size of the int outputs (an
        # argmax as large as the output), allocated and filled for nothing.
        ctx.set_materialize_grads(False)
        # The input is kept only for the gradients that read it.
        ctx.reading = [i for i in reading if ctx.needs_input_grad[i] and inputs[i] is not None]
        ctx.save_for_backward(rois, input if ctx.reading else None, *inputs[2:2 + n_tensors],
                              *(output[1:] if spec.saved else ()))
        ctx.args = tuple(inputs[i] if isinstance(i, int) else from_input[i] for i in sources)
        ctx.forward_args = inputs[2 + n_tensors:] if ctx.reading else ()
        ctx.backend = _backend.current()

    def gradient(ctx: Any, grad: Tensor | None, *_int_outputs: Any) -> tuple[Tensor | None, ...]:
        if grad is None:  # the output took no part in the loss
            return (None,) * n_inputs
        if ctx.backend:  # the backend the forward was forced to
            with _backend.use_backend(ctx.backend):
                return gradients(ctx, grad)
        # No nullcontext in its place: it adds three Python calls to every backward
        # (see direct).
        return gradients(ctx, grad)

    def gradients(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        rois, input, *rest = ctx.saved_tensors
        extra, saved = rest[:n_tensors], rest[n_tensors:]
        grads: list[Tensor | None] = [None] * n_inputs
        if ctx.needs_input_grad[0]:
            grads[0] = input_grad(grad, *saved, rois, *extra, *ctx.args)
        for i in ctx.reading:
            grads[i] = reading[i](grad, input, rois, *extra, *ctx.forward_args)
        return tuple(grads)

    register_autograd(fwd, gradient, setup_context)
    refuse_double_backward(bwd, spec.title or spec.name)

    class Direct(torch.autograd.Function):
        """The op's autograd formula around its kernel, for calls :func:`direct` allows."""

        # Not a setup_context staticmethod: apply would bind its arguments to the
        # signature with inspect on every call.
        @staticmethod
        def forward(ctx: Any, input: Tensor, rois: Tensor, *args: Any) -> Any:
            output = forward(input, rois, *args)
            setup_context(ctx, (input, rois, *args), output)
            if spec.saved:
                ctx.mark_non_differentiable(*output[1:])
            return output

        backward = staticmethod(gradient)

    if not n_tensors:
        def call(input: Tensor, rois: Tensor, *args: Any) -> Any:
            if not direct(input, rois):
                return fwd(input, rois, *args)
            if torch.is_grad_enabled() and (input.requires_grad or rois.requires_grad):
                return Direct.apply(input, rois, *args)
            return forward(input, rois, *args)

        return call

    def call_with_tensors(input: Tensor, rois: Tensor, *args: Any) -> Any:
        given = [t for t in args[:n_tensors] if t is not None]
        if not direct(input, rois, *given):
            return fwd(input, rois, *args)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (input, rois, *given)):
            return Direct.apply(input, rois, *args)
        return forward(input, rois, *args)

    return call_with_tensors


def _register_reading_backward(spec: Kernels, of: str, at: int | None = None) -> Callable[..., Tensor]:
    """Defines ``roiops::_<name>_<of>_backward(grad, input, rois, *tensors, *args)``, the
    gradient of ``rois`` or of extra tensor ``of`` (the ``at``-th); returns its call
    (:func:`backward_call`)."""
    kernel = f"{spec.name}_{of}_backward"

    def of_backward(grad: Tensor, input: Tensor, rois: Tensor, *args: Any) -> Tensor:
        return getattr(_backend.kernels_of(grad), kernel)(grad, input, rois, *args)

    def fake(grad: Tensor, input: Tensor, rois: Tensor, *args: Any) -> Tensor:
        like = rois if at is None else args[at]
        return grad.new_empty(0) if like is None else torch.empty_like(like, memory_format=torch.contiguous_format)

    op = define(f"_{spec.name}_{of}_backward", spec.schema(f"{of}_backward"), of_backward, fake)
    refuse_double_backward(op, spec.title or spec.name)
    return backward_call(op, of_backward)


_R = TypeVar("_R")


def backward_call(op: Any, kernel: Callable[..., _R]) -> Callable[..., _R]:
    """A backward's call from an autograd formula: ``kernel`` itself where :func:`direct`
    allows, else ``op``, also under ``create_graph``, where the op records its refusal of
    double backward."""
    def call(grad: Tensor, *args: Any) -> _R:
        # A list, not a generator: no frame per argument.
        if not torch.is_grad_enabled() and direct(grad, *[a for a in args if isinstance(a, Tensor)]):
            return kernel(grad, *args)
        return op(grad, *args)

    return call


def refuse_double_backward(backward_op: Any, title: str) -> None:
    """A clear error for a gradient of the gradient, instead of autograd's "no autograd
    formula was registered"."""
    def no_double_backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(f"roiops: {title} has no double backward (gradient of its gradient); torchvision's RoI "
                           "ops have none either")

    register_autograd(backward_op, no_double_backward)


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "output_size": v.output_size, "spatial_scale": v.spatial_scale, "sampling_ratio": v.sampling_ratio,
    "num_orientations": v.orientations, "pool_size": v.pool_size}


def _normalizer(name: str, annotation: Any) -> Callable[[Any], Any]:
    """The check of an option: by its name, or by its type (a Literal's choices, a flag, a
    finite number)."""
    if name in _CHECKS:
        return _CHECKS[name]
    if get_origin(annotation) is Literal:
        return lambda value: v.choice(name, value, get_args(annotation))
    if annotation is bool:
        return lambda value: v.flag(name, value)
    if annotation is float:
        return lambda value: v.finite(name, value)
    raise TypeError(f"no check for option {name!r}: {annotation!r}")


class RoIModule(nn.Module):
    """``nn.Module`` form of a public op function ``function(input, boxes, **options)``: the
    options are checked at construction with the same checks as the function's, stored as
    attributes and shown in the repr."""

    function: Callable[..., Tensor]

    def __init__(self, **options: Any) -> None:
        super().__init__()
        hints = get_type_hints(type(self).__init__, include_extras=True)
        for name, value in options.items():
            setattr(self, name, _normalizer(name, hints[name])(value))
        self._options = tuple(options)

    def forward(self, input: Tensor, boxes: v.BoxesType) -> Tensor:
        return type(self).function(input, boxes, **{n: getattr(self, n) for n in self._options})

    def extra_repr(self) -> str:
        return ", ".join(f"{n}={getattr(self, n)!r}" for n in self._options)

