"""Process-wide switches: plain module attributes, set directly.

| switch | default | what it controls |
|---|---|---|
| ``check_box_values`` | ``None`` | box value checks: on CPU tensors (``None``), everywhere (``True``), never (``False``) |
| ``deterministic_backward`` | ``None`` | GPU backward: torch's flag (``None``), atomic-free (``True``), atomic (``False``) |

Examples:
    >>> boxes = torch.tensor([[3, 0.0, 0.0, 4.0, 4.0]])  # batch index 3, but one image
    >>> roiops.config.check_box_values = True            # check on GPU tensors too
    >>> roiops.roi_align(torch.randn(1, 1, 8, 8), boxes, 2)
    Traceback (most recent call last):
        ...
    ValueError: boxes row 0 [3.0, 0.0, 0.0, 4.0, 4.0]: batch index 3.0 is not an integer in [0, 1)
    >>> roiops.config.check_box_values = None            # the default
"""

check_box_values: bool | None = None
"""Check box values before every op: the batch index an integer in ``[0, N)``, finite
coordinates, ``abs(x * spatial_scale) <= 2^24``; a bad row raises ``ValueError`` naming
it.

``None`` (default): on CPU tensors, where the check is free. On GPU tensors it is
skipped, because reading the verdict would make every call wait for the GPU (and break
CUDA graph capture): there the Triton kernels give zeros and no gradient for an invalid
row. ``True``: on every device, at one device-to-host synchronisation per call on a GPU;
turn it on to find where invalid boxes come from. ``False``: never (the CPU kernels still
raise). Skipped while ``torch.compile`` traces.
"""

deterministic_backward: bool | None = None
"""How the GPU backward accumulates: ``None`` (default) follows
``torch.are_deterministic_algorithms_enabled()``; ``True`` forces the deterministic
(atomic-free) path, ``False`` the faster path with atomic adds. The CPU backward is always
deterministic.
"""
