import os

import pytest
import torch

# Without a GPU, the Triton kernels are tested through Triton's interpreter on CPU tensors.
# It must be chosen before roiops.triton (and so triton.jit) is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """Cases run on the Triton backend skip, with roiops' reason, where Triton is older than
    roiops supports (torch < 2.11): the other backends are still tested there. Only the
    version decides: any other failure to import roiops.triton must fail the tests."""
    from roiops._requirements import triton_too_old

    if triton_too_old():
        skip = pytest.mark.skip(reason=triton_too_old())
        for item in items:
            callspec = getattr(item, "callspec", None)
            if callspec is not None and any(isinstance(v, str) and v == "triton" for v in callspec.params.values()):
                item.add_marker(skip)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches emptied before and after the test: its compile counts are its own."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
