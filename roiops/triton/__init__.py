"""Triton kernels of roiops, one module per op, each listing its kernel-contract functions
(docs/architecture.md) in ``__all__``; this package collects them.

They run on CUDA tensors, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this package is first imported).

Launchers look only at shapes, strides, dtypes and devices, never at values: no host
synchronisation, no grid or compile-time constant taken from the data. A box row with a
batch index outside [0, N), a non-integer batch index, or a non-finite coordinate (or one
beyond 2^24 feature-map cells) cannot be reported without a sync, so it is masked: zeros
and argmax -1 in forward, nothing scattered in backward. What shapes, dtypes and devices
show is refused as every backend refuses it, with the same errors (a direct
``torch.ops.roiops`` call skips the public API's validation): a rois tensor not [K, 5], a
grad or argmax whose shape does not match, integer data, tensors on different devices
(the kernel contract's check, ``roiops._kernel_checks``).

Backward has a fast path (atomic adds) and a deterministic one (bit-identical from run to
run; see the docstrings of _align_gather.py and roi_pool.py for its cost), chosen per call
by ``deterministic=``, else by ``roiops.config.deterministic_backward``, else by
``torch.are_deterministic_algorithms_enabled()``.
"""

from .._requirements import triton_too_old

if triton_too_old():
    raise ImportError(triton_too_old())

from .._registry import collect_kernels  # noqa: E402

__all__ = collect_kernels(__name__, __path__, globals())
