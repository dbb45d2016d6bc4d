"""Process-wide switches. Plain attributes: set them directly, e.g.
``roiops.config.check_box_values = False``."""

#: Check box values (batch index an integer in [0, N), finite coordinates, |x * scale|
#: <= 2^24) before every op, raising ValueError naming the first bad row.
#: None (default): on CPU tensors, where the check is free. On GPU tensors it is skipped,
#: because reading the verdict would make every call wait for the GPU (and break CUDA
#: graph capture): there the Triton kernels give zeros and no gradient for an invalid row.
#: True: on every device, at one device-to-host sync per call on a GPU; turn it on to
#: find where invalid boxes come from. False: never (the CPU kernels still raise).
#: Skipped while torch.compile traces.
check_box_values: bool | None = None

#: GPU backward: None follows torch.are_deterministic_algorithms_enabled(); True forces
#: the deterministic (atomic-free) path, False the faster path with atomic adds. The CPU
#: backward is always deterministic.
deterministic_backward: bool | None = None
