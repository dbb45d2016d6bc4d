import os

import pytest
import torch

# Without a GPU, the Triton kernels are tested through Triton's interpreter on CPU tensors.
# It must be chosen before roiops.triton (and so triton.jit) is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_language_once_per_launch():
    """Triton's interpreter patches triton.language (inspecting every member of its modules)
    at a kernel's launch, and again at every call of a jit helper inside the kernel, though
    the launch's patch is still in place: about half the interpreter's time in roiops'
    kernels. A helper whose language modules the running launch patched skips that."""
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "GridExecutor")):
        return  # another Triton's interpreter: left as it is
    patch_lang, run_grid = interpreter._patch_lang, interpreter.GridExecutor.__call__
    launches = []  # per running launch: [its language modules, whether they are patched yet]

    def languages(fn):
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_unless_patched(fn):
        if launches and launches[-1][1] and languages(fn) <= launches[-1][0]:
            return interpreter._LangPatchScope()  # nothing to restore
        scope = patch_lang(fn)
        if launches:
            launches[-1][1] = True
        return scope

    def launch(self, *args, **kwargs):
        launches.append([languages(self.fn), False])
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            launches.pop()

    interpreter._patch_lang, interpreter.GridExecutor.__call__ = patch_unless_patched, launch


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_language_once_per_launch()


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
