"""Triton kernels of roiops: the six functions of the kernel contract (docs/architecture.md).

They run on CUDA tensors, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this package is first imported).

Launchers look only at shapes, strides, dtypes and devices, never at values: no host
synchronisation, no grid or compile-time constant taken from the data. A box row with a
batch index outside [0, N), a non-integer batch index, or a non-finite coordinate (or one
beyond 2^24 feature-map cells) cannot be reported without a sync, so it is masked: zeros
and argmax -1 in forward, nothing scattered in backward.

Backward has a fast path (atomic adds) and a deterministic one (bit-identical from run to
run; see the docstrings of roi_align.py and roi_pool.py for its cost), chosen per call by
``deterministic=``, else by ``roiops.config.deterministic_backward``, else by
``torch.are_deterministic_algorithms_enabled()``.
"""

from .roi_align import roi_align_backward, roi_align_forward, roi_align_max_backward, roi_align_max_forward
from .roi_pool import roi_pool_backward, roi_pool_forward

__all__ = [
    "roi_align_forward",
    "roi_align_backward",
    "roi_align_max_forward",
    "roi_align_max_backward",
    "roi_pool_forward",
    "roi_pool_backward",
]
