"""``roiops bench``: the CPU benchmark suite, roiops vs torchvision.ops in one process.

Each case times roiops and torchvision interleaved, repeat by repeat, and reports medians
and their ratio, so that load from other processes hits both alike. Writes a table to
stdout, ``results.json`` and ``ratios.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import platform
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import torch

import roiops

from .cli import package_version


@dataclass(frozen=True)
class Workload:
    name: str
    op: str              # "align" | "align_max" | "pool"
    n: int
    channels: int
    height: int
    width: int
    scale: float
    boxes: int
    size: int
    sampling_ratio: int = 2
    aligned: bool = True

    def describe(self) -> str:
        op = {"align": "RoIAlign avg", "align_max": "RoIAlign max", "pool": "RoIPool"}[self.op]
        sampling = "" if self.op == "pool" else (
            ", adaptive sampling" if self.sampling_ratio <= 0 else f", sampling {self.sampling_ratio}")
        return (f"{op} {self.size}x{self.size}{sampling}: {self.boxes} boxes, "
                f"{self.n}x{self.channels}x{self.height}x{self.width} map, scale 1/{1 / self.scale:g}")


# Where these shapes occur: a Mask R-CNN/FPN box head on a stride-4 level of an 800x1344
# image, its adaptive-sampling variant, a max-mode head, the mask head (14x14 on fewer
# boxes), Fast R-CNN RoIPool, and a 4-image batch on a stride-8 map.
WORKLOADS = [
    Workload("box head train", "align", 2, 256, 200, 336, 1 / 4, 1024, 7),
    Workload("box head adaptive", "align", 2, 256, 200, 336, 1 / 4, 1024, 7, sampling_ratio=0),
    Workload("box head max", "align_max", 2, 256, 200, 336, 1 / 4, 1024, 7),
    Workload("mask head", "align", 2, 256, 200, 336, 1 / 4, 256, 14),
    Workload("roi_pool", "pool", 2, 256, 200, 336, 1 / 4, 1024, 7),
    Workload("multi-image", "align", 4, 256, 100, 168, 1 / 8, 2048, 7),
]


def tiny(w: Workload) -> Workload:
    """The same workload at shapes that run in milliseconds: checks the suite, not speed."""
    return replace(w, channels=8, height=20, width=24, boxes=16)


def log_uniform_boxes(count: int, n_images: int, img_w: float, img_h: float,
                      generator: torch.Generator) -> torch.Tensor:
    """[count, 5] float32 boxes: sides log-uniform from 16 to 512 px, centres uniform over
    an img_w x img_h image, image index uniform in [0, n_images). Also the GPU benchmark's
    (benchmarks/bench_triton.py)."""
    log_size = torch.empty(count, 2).uniform_(math.log(16), math.log(512), generator=generator)
    size = torch.exp(log_size)
    centre = torch.rand(count, 2, generator=generator) * torch.tensor([img_w, img_h])
    xy1, xy2 = centre - size / 2, centre + size / 2
    idx = torch.randint(0, n_images, (count, 1), generator=generator).float()
    return torch.cat([idx, xy1, xy2], dim=1)


Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def functions(w: Workload, torchvision: ModuleType) -> tuple[Op, Op]:
    """(roiops, torchvision) callables of (input, boxes). torchvision has no max mode: its
    average RoIAlign stands in as the peer."""
    if w.op == "pool":
        return (lambda x, b: roiops.roi_pool(x, b, w.size, w.scale),
                lambda x, b: torchvision.ops.roi_pool(x, b, w.size, w.scale))
    mode: Literal["avg", "max"] = "max" if w.op == "align_max" else "avg"
    return (lambda x, b: roiops.roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned, mode),
            lambda x, b: torchvision.ops.roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(w: Workload, channels_last: bool, threads: int, repeats: int,
            torchvision: ModuleType) -> list[dict[str, Any]]:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(w.n, w.channels, w.height, w.width, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    boxes = log_uniform_boxes(w.boxes, w.n, w.width / w.scale, w.height / w.scale, g)
    rows = []
    ours, peer = functions(w, torchvision)
    runs = {}
    for name, fn in (("roiops", ours), ("torchvision", peer)):
        xi = x.detach().requires_grad_()
        out = fn(xi, boxes)
        grad = torch.randn(out.shape, generator=g).to(memory_format=torch.channels_last if channels_last
                                                       else torch.contiguous_format)
        runs[name] = (lambda fn=fn: fn(x, boxes),
                      lambda out=out, xi=xi, grad=grad: torch.autograd.grad(out, xi, grad, retain_graph=True))
    for direction, which in (("forward", 0), ("backward", 1)):
        times: dict[str, list[float]] = {"roiops": [], "torchvision": []}
        for name in times:  # warm-up
            runs[name][which]()
        for _ in range(repeats):
            for name in times:
                times[name].append(timed(runs[name][which]))
        t_ours, t_peer = statistics.median(times["roiops"]), statistics.median(times["torchvision"])
        rows.append({"workload": w.name, "layout": "channels_last" if channels_last else "NCHW",
                     "threads": threads, "direction": direction, "roiops_ms": 1e3 * t_ours,
                     "torchvision_ms": 1e3 * t_peer, "ratio": t_peer / t_ours, "shape": asdict(w)})
    return rows


def progress(done: int, total: int, label: str) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<40}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'workload':<18} {'layout':<13} {'thr':>3} {'dir':<8} {'roiops ms':>10} {'torchvision ms':>15} {'ratio':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['workload']:<18} {r['layout']:<13} {r['threads']:>3} {r['direction']:<8} "
                     f"{r['roiops_ms']:>10.2f} {r['torchvision_ms']:>15.2f} {r['ratio']:>6.1f}x")
    return "\n".join(lines)


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    labels = [f"{r['workload']}\n{r['layout']}, {r['threads']}t" for r in rows if r["direction"] == "forward"]
    fwd = [r["ratio"] for r in rows if r["direction"] == "forward"]
    bwd = [r["ratio"] for r in rows if r["direction"] == "backward"]
    fig = Figure(figsize=(max(8, 0.7 * len(labels)), 5))
    ax = fig.add_subplot()
    pos = range(len(labels))
    ax.bar([p - 0.2 for p in pos], fwd, 0.4, label="forward")
    ax.bar([p + 0.2 for p in pos], bwd, 0.4, label="backward")
    ax.set_xticks(list(pos), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("speed-up over torchvision (x)")
    ax.set_yscale("log")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_title("roiops vs torchvision.ops on CPU (same process, median times)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ----------------------------------------------------------------------------- arguments

def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    names = [w.name for w in WORKLOADS]
    p = argparse.ArgumentParser(
        prog="roiops bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Time roiops against torchvision.ops (the same operators) on the CPU, forward and "
            "backward, in NCHW and channels_last, at each --threads count. Prints a table of "
            "median times and their ratio (torchvision time / roiops time) and writes "
            "results.json and ratios.png to --out.", 78),
        epilog="workloads (quote names that contain spaces; maps are N x C x H x W):\n" + "\n".join(
            f"  {w.name}\n    {w.describe()}" for w in WORKLOADS)
        + "\n\ntorchvision has no max mode: its average RoIAlign is the peer of the max workloads.")
    p.add_argument("--workload", action="append", choices=names, metavar="NAME",
                   help="run only this workload; repeat the option for several (default: all of "
                        "them, listed below)")
    p.add_argument("--threads", type=_at_least_one, nargs="+", default=[1, 2], metavar="T",
                   help="torch CPU thread counts to run each case with (default: 1 2)")
    p.add_argument("--repeats", type=_at_least_one, default=5, metavar="R",
                   help="timed runs per case after one warm-up; the median is reported (default 5)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 repeat at the largest --threads count only")
    p.add_argument("--tiny", action="store_true",
                   help="every workload at tiny shapes (8 channels, a 20x24 map, 16 boxes): checks "
                        "that the suite runs, does not measure speed")
    p.add_argument("--out", type=Path, default=Path("bench_results"), metavar="DIR",
                   help="folder for results.json and ratios.png, created if missing "
                        "(default: bench_results)")
    return p


def _import_torchvision() -> ModuleType | str:
    """torchvision, the peer every case is timed against, or why it cannot be used."""
    try:
        torchvision = importlib.import_module("torchvision")  # torchvision ships no types
    except (ImportError, RuntimeError) as e:  # RuntimeError: a release built for another torch
        problem = "is not installed" if isinstance(e, ImportError) else f"failed to load ({e})"
        return (f"roiops bench times roiops against torchvision.ops, and torchvision {problem}: "
                f"install the torchvision release built for your torch {torch.__version__} "
                "(pip install torchvision)")
    return torchvision


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        if args.out.exists() and not args.out.is_dir():
            parser.error(f"--out must be a folder, but {str(args.out)!r} is a file")
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), message already printed
        return e.code if isinstance(e.code, int) else 2
    torchvision = _import_torchvision()
    if isinstance(torchvision, str):
        print(f"{parser.prog}: error: {torchvision}", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401  (checked now: the chart is drawn after the timings)
    except ImportError:
        print(f"{parser.prog}: error: ratios.png is drawn with matplotlib, which is not installed: "
              "install it (pip install matplotlib)", file=sys.stderr)
        return 2
    workloads = [w for w in WORKLOADS if not args.workload or w.name in args.workload]
    if args.tiny:
        workloads = [tiny(w) for w in workloads]
    repeats, threads = (1, [max(args.threads)]) if args.quick else (args.repeats, args.threads)
    cases = [(w, cl, t) for w in workloads for cl in (False, True) for t in threads]
    prev_threads = torch.get_num_threads()
    rows: list[dict[str, Any]] = []
    try:
        for i, (w, cl, t) in enumerate(cases):
            progress(i, len(cases), f"{w.name}, {'channels_last' if cl else 'NCHW'}, {t} thread(s)")
            rows += measure(w, cl, t, repeats, torchvision)
        progress(len(cases), len(cases), "done")
    finally:
        torch.set_num_threads(prev_threads)
    print(table(rows))
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "roiops": package_version(), "cpu": cpu_model(),
            "repeats": repeats, "statistic": "median seconds, roiops and torchvision interleaved"}
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        chart(rows, args.out / "ratios.png")
    except OSError as e:
        print(f"{parser.prog}: error: cannot write the results to {args.out}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out / 'results.json'} and {args.out / 'ratios.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
