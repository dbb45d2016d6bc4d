"""The ``roiops`` command: ``demo`` (the main job), ``explain`` and ``bench``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="roiops", description="RoIAlign and RoIPool for PyTorch.",
        epilog="Run 'roiops COMMAND --help' for a command's options.")
    parser.add_argument("command", choices=["demo", "explain", "bench"],
                        help="demo: show what RoIPool quantises and RoIAlign keeps (writes a PNG); "
                             "explain: the same picture for your own box; bench: roiops vs torchvision speed")
    args = parser.parse_args(argv[:1])
    rest = argv[1:]
    if args.command in ("demo", "explain"):
        from . import demo
        return demo.main(rest, prog=f"roiops {args.command}")
    from . import bench
    return bench.main(rest)
