"""Builds roiops and its C++ CPU kernels (roiops._C) with torch.utils.cpp_extension.

The kernels use LibTorch's stable ABI only, targeting the oldest torch that
pyproject.toml admits, and Python's limited API: one build (one abi3 wheel per
platform) runs under every torch release from that one on and every Python >= 3.10.
"""

import re
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

csrc = Path("roiops") / "csrc"

# The oldest torch (pyproject.toml's requirement) as the stable ABI's target version:
# the headers then hide every API newer than it, and any header outside the stable ABI
# refuses to compile.
_major, _minor = re.search(r'"torch>=(\d+)\.(\d+)"', Path("pyproject.toml").read_text()).groups()
TORCH_TARGET_VERSION = f"0x{int(_major):02x}{int(_minor):02x}000000000000"

# The extension must use the process's one shared libstdc++ (the one torch loads): a
# private static copy keeps its own exception and locale state, and the first C++
# exception (every TORCH_CHECK message) crosses from one copy into the other and
# crashes. Toolchains that add these flags (LDFLAGS, conda compilers) are overridden.
STATIC_RUNTIME_FLAGS = {"-static-libstdc++", "-static-libgcc", "-static"}

# Defined only by libstdc++/libsupc++ itself: present in the extension means a static copy.
RUNTIME_SYMBOLS = ("__cxa_throw", "__cxa_allocate_exception", "__gxx_personality_v0", "_ZSt9terminatev")


def libstdcxx_problems(path: str) -> list:
    """Why the shared object at `path` does not link libstdc++ dynamically ([] if it does,
    or if binutils are missing to tell)."""
    if not (shutil.which("readelf") and shutil.which("nm")):
        return []
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    problems = [] if "libstdc++.so" in dynamic else ["libstdc++.so is not a NEEDED dynamic dependency"]
    for table in (["nm", "-D", "--defined-only"], ["nm", "--defined-only"]):
        out = subprocess.run([*table, path], capture_output=True, text=True).stdout
        names = {line.split()[-1] for line in out.splitlines() if line.strip()}
        problems += [f"defines {s} (static libstdc++)" for s in RUNTIME_SYMBOLS if s in names]
    return sorted(set(problems))


class BuildExt(BuildExtension):
    def build_extensions(self):
        for attr in ("compiler_so", "compiler_cxx", "linker_so", "linker_so_cxx", "linker_exe"):
            cmd = getattr(self.compiler, attr, None)
            if isinstance(cmd, list):
                setattr(self.compiler, attr, [a for a in cmd if a not in STATIC_RUNTIME_FLAGS])
        for ext in self.extensions:
            ext.extra_link_args = [a for a in ext.extra_link_args if a not in STATIC_RUNTIME_FLAGS]
        super().build_extensions()
        for ext in self.extensions:
            problems = libstdcxx_problems(self.get_ext_fullpath(ext.name))
            if problems:
                raise RuntimeError(f"{ext.name} must link libstdc++ dynamically (as torch does): "
                                   + "; ".join(problems))


setup(
    ext_modules=[
        CppExtension(
            "roiops._C",
            sorted(str(p) for p in csrc.glob("*.cpp")),
            # -ffp-contract=off: no fused multiply-adds, so float32 results match
            # torchvision's arithmetic bit for bit where the formulas agree. Threads come
            # from torch's own pool (torch_api.h), so no OpenMP runtime; -fopenmp-simd
            # still honours the kernels' `#pragma omp simd` (without it GCC unrolls those
            # loops into scalar code).
            # Hidden visibility: the library exports its module init only (the stable
            # headers' types are hidden too).
            extra_compile_args=["-O3", "-ffp-contract=off", "-fopenmp-simd", "-fvisibility=hidden",
                                f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"],
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
