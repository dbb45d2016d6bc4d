"""CPU benchmark suite: roiops vs torchvision.ops, side by side in one process.

Run with ``roiops bench`` (or ``python benchmarks/cpu.py``). Each case times roiops and
torchvision interleaved, repeat by repeat, and reports medians and their ratio, so that
load from other processes hits both alike. Writes a table to stdout, ``results.json`` and
``ratios.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torchvision

import roiops


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


# Where these shapes occur: a Mask R-CNN/FPN box head on a stride-4 level of an 800x1344
# image (the reference case), its adaptive-sampling variant, a max-mode head, the
# mask head (14x14 on fewer boxes), Fast R-CNN RoIPool, and a 4-image batch on a stride-8 map.
WORKLOADS = [
    Workload("box head train", "align", 2, 256, 200, 336, 1 / 4, 1024, 7),
    Workload("box head adaptive", "align", 2, 256, 200, 336, 1 / 4, 1024, 7, sampling_ratio=0),
    Workload("box head max", "align_max", 2, 256, 200, 336, 1 / 4, 1024, 7),
    Workload("mask head", "align", 2, 256, 200, 336, 1 / 4, 256, 14),
    Workload("roi_pool", "pool", 2, 256, 200, 336, 1 / 4, 1024, 7),
    Workload("multi-image", "align", 4, 256, 100, 168, 1 / 8, 2048, 7),
]
TINY = [Workload("tiny", "align", 2, 8, 20, 24, 1 / 4, 16, 7), Workload("tiny pool", "pool", 2, 8, 20, 24, 1 / 4, 16, 7)]


def make_boxes(w: Workload, generator: torch.Generator) -> torch.Tensor:
    """Log-uniform box sizes from 16 to 512 px, centres uniform over the image."""
    img_w, img_h = w.width / w.scale, w.height / w.scale
    log_size = torch.empty(w.boxes, 2).uniform_(math.log(16), math.log(512), generator=generator)
    size = torch.exp(log_size)
    centre = torch.rand(w.boxes, 2, generator=generator) * torch.tensor([img_w, img_h])
    xy1, xy2 = centre - size / 2, centre + size / 2
    idx = torch.randint(0, w.n, (w.boxes, 1), generator=generator).float()
    return torch.cat([idx, xy1, xy2], dim=1)


def functions(w: Workload):
    """(roiops, torchvision) callables of (input, boxes). torchvision has no max mode: its
    average RoIAlign stands in as the peer."""
    if w.op == "pool":
        return (lambda x, b: roiops.roi_pool(x, b, w.size, w.scale),
                lambda x, b: torchvision.ops.roi_pool(x, b, w.size, w.scale))
    mode = "max" if w.op == "align_max" else "avg"
    return (lambda x, b: roiops.roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned, mode),
            lambda x, b: torchvision.ops.roi_align(x, b, w.size, w.scale, w.sampling_ratio, w.aligned))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(w: Workload, channels_last: bool, threads: int, repeats: int) -> list[dict]:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(w.n, w.channels, w.height, w.width, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    boxes = make_boxes(w, g)
    rows = []
    ours, peer = functions(w)
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


def table(rows: list[dict]) -> str:
    head = f"{'workload':<18} {'layout':<13} {'thr':>3} {'dir':<8} {'roiops ms':>10} {'torchvision ms':>15} {'ratio':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['workload']:<18} {r['layout']:<13} {r['threads']:>3} {r['direction']:<8} "
                     f"{r['roiops_ms']:>10.2f} {r['torchvision_ms']:>15.2f} {r['ratio']:>6.1f}x")
    return "\n".join(lines)


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['workload']}\n{r['layout']}, {r['threads']}t" for r in rows if r["direction"] == "forward"]
    fwd = [r["ratio"] for r in rows if r["direction"] == "forward"]
    bwd = [r["ratio"] for r in rows if r["direction"] == "backward"]
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(labels)), 5))
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
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="roiops bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat, 2 threads only: a smoke run")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (for tests)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workload", action="append", help="only these workloads (by name)")
    parser.add_argument("--out", type=Path, default=Path("bench_results"))
    args = parser.parse_args(argv)
    workloads = TINY if args.tiny else WORKLOADS
    if args.workload:
        workloads = [w for w in workloads if w.name in args.workload]
        if not workloads:
            parser.error(f"no workload named {args.workload}; known: {[w.name for w in WORKLOADS]}")
    repeats, threads = (1, [max(args.threads)]) if args.quick else (args.repeats, args.threads)
    cases = [(w, cl, t) for w in workloads for cl in (False, True) for t in threads]
    prev_threads = torch.get_num_threads()
    rows: list[dict] = []
    try:
        for i, (w, cl, t) in enumerate(cases):
            progress(i, len(cases), f"{w.name}, {'channels_last' if cl else 'NCHW'}, {t} thread(s)")
            rows += measure(w, cl, t, repeats)
        progress(len(cases), len(cases), "done")
    finally:
        torch.set_num_threads(prev_threads)
    print(table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "roiops": roiops.__version__, "cpu": cpu_model(),
            "repeats": repeats, "statistic": "median seconds, roiops and torchvision interleaved"}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    chart(rows, args.out / "ratios.png")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'ratios.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
