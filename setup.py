"""Builds roiops and its C++ CPU kernels (roiops._C) with torch.utils.cpp_extension.

Install with `pip install --no-build-isolation .` after torch: the extension must be
compiled against the torch it will run with.
"""

import shutil
import subprocess
from pathlib import Path

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

csrc = Path("roiops") / "csrc"

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

    def run(self):
        super().run()
        # Beside the extension, where it ended up (the wheel's tree, or the sources for an
        # editable install): roiops compares it with the running torch before loading _C.
        info = Path(self.get_ext_fullpath("roiops._C")).parent / "_build_info.py"
        info.write_text('"""Written by setup.py: what the C++ kernels were built against."""\n'
                        f"TORCH_VERSION = {torch.__version__!r}\n"
                        f"SOURCE = {str(Path.cwd().resolve())!r}\n"
                        f"EDITABLE = {bool(self.inplace)!r}\n")


setup(
    ext_modules=[
        CppExtension(
            "roiops._C",
            sorted(str(p) for p in csrc.glob("*.cpp")),
            # -fopenmp: at::parallel_for expands to OpenMP pragmas in our code.
            # -ffp-contract=off: no fused multiply-adds, so float32 results match
            # torchvision's arithmetic bit for bit where the formulas agree.
            extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
