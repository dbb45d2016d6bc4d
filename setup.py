"""Builds roiops and its C++ CPU kernels (roiops._C) with torch.utils.cpp_extension.

Install with `pip install --no-build-isolation .` after torch: the extension must be
compiled against the torch it will run with.
"""

from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

csrc = Path("roiops") / "csrc"

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
    cmdclass={"build_ext": BuildExtension},
)
