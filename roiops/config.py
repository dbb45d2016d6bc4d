"""Process-wide switches. Plain attributes: set them directly, e.g.
``roiops.config.check_box_values = False``."""

#: Check box values (batch index an integer in [0, N), finite coordinates, |x * scale|
#: <= 2^24) before every op, raising ValueError naming the first bad row. On CUDA
#: tensors this costs one device-to-host sync per call; turn it off only if the boxes are
#: validated upstream. Kernels never read out of bounds either way: the CPU kernels raise,
#: the Triton kernels give zeros for an invalid row. Skipped while torch.compile traces.
check_box_values: bool = True

#: GPU backward: None follows torch.are_deterministic_algorithms_enabled(); True forces
#: the deterministic (atomic-free) path, False the faster path with atomic adds. The CPU
#: backward is always deterministic.
deterministic_backward: bool | None = None
