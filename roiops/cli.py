"""The ``roiops`` command: ``demo`` (the main job), ``explain`` and ``bench``."""

from __future__ import annotations

import argparse
import sys


def package_version() -> str:
    """The installed distribution's version; ``roiops.__version__`` when run from a tree
    that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("roiops")
    except PackageNotFoundError:
        import roiops

        return roiops.__version__


def operators() -> str:
    """Every operator's title, from the specs: "A, B and C"."""
    from .ops import SPECS, multi_scale

    titles = [spec.title for spec in SPECS] + [multi_scale.TITLE]
    return ", ".join(titles[:-1]) + " and " + titles[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="roiops",
        description=f"Region-of-interest operators for PyTorch: {operators()}.",
        epilog="Run 'roiops COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"roiops {package_version()}")
    parser.add_argument("command", choices=["demo", "explain", "bench"],
                        help="demo: show what RoIPool quantises and RoIAlign keeps (writes a PNG); "
                             "explain: the same for a box you give (--box); "
                             "bench: roiops vs torchvision speed on the CPU or (--device cuda) a GPU")
    # everything after the command is the command's to parse, --help included
    parser.add_argument("options", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    if args.command in ("demo", "explain"):
        from . import demo
        return demo.main(args.options, command=args.command)
    from . import bench
    return bench.main(args.options)
