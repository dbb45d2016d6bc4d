"""Pure-PyTorch reference kernels: the definitions of docs/semantics.md written as plain
tensor code, for any device. They are the ``"reference"`` backend
(``roiops.use_backend("reference")``) and the tests' oracle; import the package
explicitly (``import roiops.reference``) to call them directly.

Its functions are the kernel contract of every registered op (docs/architecture.md,
"Kernel contract"): ``<op>_forward``, ``<op>_backward`` and, for the gradients that read
the input, ``<op>_rois_backward`` or ``<op>_<tensor>_backward``, e.g.
``roi_align_forward``, ``roi_align_backward``, ``roi_align_rois_backward``. Their
arguments are those of the registered ops (``torch.ops.roiops.*``), already normalised:
``rois`` a ``[K, 5]`` tensor (``[K, 6]`` rotated, ``[K, 17]`` Bezier), the output size as
``pooled_height, pooled_width``. Speed is not a goal: boxes are processed one at a time in
Python, and everything inside a box (channels, bins, sample points) is a handful of tensor
ops. Each step in the op modules names the formula it implements, so the code can be
checked line by line against the definitions.

Conventions shared by every kernel:

* ``rois`` is ``[K, 5]`` with rows ``(batch_index, x1, y1, x2, y2)``; it is converted to
  the opmath type (float32 for half/bfloat16/float32 inputs, float64 for float64), in
  which all coordinate arithmetic and all accumulation happen.
* Results have the input's (or grad's) dtype and are channels_last when the input is
  (for backward: when ``channels_last`` is true), contiguous otherwise.
* ``argmax`` is int32 with the shape of ``out``; -1 marks a bin with nothing to pool.
* Arguments are checked first by the kernel contract's check (``roiops._kernel_checks``),
  which the Triton kernels run too and the C++ kernels mirror: the same errors on every
  backend. RoIAlign's and RoIPool's kernels also take an empty map (height or width 0),
  and RoIPool's backward an int64 argmax.
* A batch index that is not an integer in ``[0, N)``, or a non-finite coordinate, raises
  ``ValueError`` naming the row, before any indexing happens.
* The forward functions are differentiable by autograd with respect to ``input``, and
  autograd gives exactly the gradient the explicit backward functions compute (the
  tests check one against the other); boxes get no gradient from autograd: RoIAlign's
  gradient with respect to them is its ``*_rois_backward`` kernels'.

Examples:
    >>> import roiops.reference
    >>> x = torch.randn(1, 4, 16, 16)
    >>> rois = torch.tensor([[0, 1.0, 1.0, 12.0, 9.0]])
    >>> out = roiops.reference.roi_align_forward(x, rois, 1.0, 3, 3, 2, True)
    >>> torch.allclose(out, roiops.roi_align(x, rois, 3, 1.0, 2, True), atol=1e-6)
    True
"""

from .._registry import collect_kernels

__all__ = collect_kernels(__name__, __path__, globals())
