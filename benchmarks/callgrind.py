"""Instructions executed by each entry point of the C++ kernels (roiops._C), counted by
valgrind's callgrind on fixed inputs and one thread, so that a change to the kernels can
show what it costs independently of the machine's caches, clock and load.

    python benchmarks/callgrind.py                       # a table: case, instructions
    python benchmarks/callgrind.py --save before.json    # also keep the counts
    python benchmarks/callgrind.py --compare before.json # and the ratio to earlier counts
    python benchmarks/callgrind.py --keep dumps/         # and callgrind's dumps, one per call,
                                                         # for callgrind_annotate

Each case calls one entry point twice on the same arguments; the count is the second
call's (the first may set up what a process does once). Only the entry point and what it
calls is counted, not Python or the making of the inputs. Needs valgrind on PATH and
roiops._C built (`python setup.py build_ext --inplace`); run it from the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

# The entry points (roiops::NAME, the C++ functions the bindings call) the cases call.
ENTRIES = ("roi_align_forward", "roi_align_backward", "roi_align_max_forward", "roi_align_max_backward",
           "roi_pool_forward", "roi_pool_backward", "ps_roi_align_forward", "ps_roi_align_backward",
           "ps_roi_pool_forward", "ps_roi_pool_backward", "roi_align_rotated_forward", "roi_align_rotated_backward",
           "prroi_pool_forward", "prroi_pool_backward")


def cases() -> list[tuple[str, str, Callable[[], object]]]:
    """(case, entry point, call) in the order they run: float32, deterministic inputs."""
    import torch

    from roiops import _C

    g = torch.Generator().manual_seed(0)

    def boxes(n_images: int, count: int, width: float, height: float) -> torch.Tensor:
        idx = torch.randint(0, n_images, (count, 1), generator=g).float()
        xy = torch.rand(count, 4, generator=g)
        x = torch.sort(xy[:, [0, 2]] * width, dim=1).values
        y = torch.sort(xy[:, [1, 3]] * height, dim=1).values
        return torch.cat([idx, x[:, :1], y[:, :1], x[:, 1:], y[:, 1:]], 1)

    def layout(t: torch.Tensor, cl: bool) -> torch.Tensor:
        return t.contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)

    def box_head() -> list[tuple[str, str, Callable[[], object]]]:
        out: list[tuple[str, str, Callable[[], object]]] = []
        # A box head: 2 x 64 x 100 x 168 map at 1/8 of an 800 x 1344 image, 256 boxes, 7 x 7 bins.
        N, C, H, W, scale = 2, 64, 100, 168, 1 / 8
        x = torch.randn(N, C, H, W, generator=g)
        rois = boxes(N, 256, W / scale, H / scale)
        centres = (rois[:, 1:3] + rois[:, 3:5]) / 2
        sizes = rois[:, 3:5] - rois[:, 1:3]
        angles = torch.rand(rois.size(0), 1, generator=g) * 360 - 180
        rotated = torch.cat([rois[:, :1], centres, sizes, angles], 1)
        grad = torch.randn(rois.size(0), C, 7, 7, generator=g)
        for cl in (False, True):
            xi, gi, tag = layout(x, cl), layout(grad, cl), "channels_last" if cl else "NCHW"
            out += [
                (f"roi_align avg {tag} forward", "roi_align_forward",
                 partial(_C.roi_align_forward, xi, rois, scale, 7, 7, 2, True)),
                (f"roi_align avg {tag} backward", "roi_align_backward",
                 partial(_C.roi_align_backward, gi, rois, scale, 7, 7, N, C, H, W, 2, True, cl)),
            ]
        argmax = _C.roi_align_max_forward(x, rois, scale, 7, 7, 2, False)[1]
        pool_argmax = _C.roi_pool_forward(x, rois, scale, 7, 7, False)[1]
        out += [
            ("roi_align max NCHW forward", "roi_align_max_forward",
             partial(_C.roi_align_max_forward, x, rois, scale, 7, 7, 2, False)),
            ("roi_align max NCHW backward", "roi_align_max_backward",
             partial(_C.roi_align_max_backward, grad, argmax, rois, scale, 7, 7, N, C, H, W, 2, False, False)),
            ("roi_pool NCHW forward", "roi_pool_forward", partial(_C.roi_pool_forward, x, rois, scale, 7, 7, False)),
            ("roi_pool NCHW backward", "roi_pool_backward",
             partial(_C.roi_pool_backward, grad, pool_argmax, rois, N, C, H, W, False)),
            ("roi_align_rotated NCHW forward", "roi_align_rotated_forward",
             partial(_C.roi_align_rotated_forward, x, rotated, scale, 7, 7, 2, True)),
            ("roi_align_rotated NCHW backward", "roi_align_rotated_backward",
             partial(_C.roi_align_rotated_backward, grad, rotated, scale, 7, 7, N, C, H, W, 2, True, False)),
            ("prroi_pool NCHW forward", "prroi_pool_forward", partial(_C.prroi_pool_forward, x, rois, scale, 7, 7)),
            ("prroi_pool NCHW backward", "prroi_pool_backward",
             partial(_C.prroi_pool_backward, grad, rois, scale, 7, 7, N, C, H, W, False)),
        ]
        return out

    def rfcn() -> list[tuple[str, str, Callable[[], object]]]:
        out: list[tuple[str, str, Callable[[], object]]] = []
        # R-FCN, 21 classes: 1 x 1029 x 38 x 50 map at 1/16 of a 600 x 800 image, 300 boxes.
        N, C, H, W, scale = 1, 21 * 49, 38, 50, 1 / 16
        x = torch.randn(N, C, H, W, generator=g)
        rois = boxes(N, 300, W / scale, H / scale)
        grad = torch.randn(rois.size(0), 21, 7, 7, generator=g)
        for cl in (False, True):
            xi, gi, tag = layout(x, cl), layout(grad, cl), "channels_last" if cl else "NCHW"
            out += [
                (f"ps_roi_align 21 {tag} forward", "ps_roi_align_forward",
                 partial(_C.ps_roi_align_forward, xi, rois, scale, 7, 7, 0)),
                (f"ps_roi_align 21 {tag} backward", "ps_roi_align_backward",
                 partial(_C.ps_roi_align_backward, gi, rois, scale, 7, 7, N, C, H, W, 0, cl)),
                (f"ps_roi_pool 21 {tag} forward", "ps_roi_pool_forward",
                 partial(_C.ps_roi_pool_forward, xi, rois, scale, 7, 7)),
                (f"ps_roi_pool 21 {tag} backward", "ps_roi_pool_backward",
                 partial(_C.ps_roi_pool_backward, gi, rois, scale, 7, 7, N, C, H, W, cl)),
            ]
        return out

    return box_head() + rfcn()


def inner() -> None:
    """Runs the cases (under callgrind, which dumps a count after each entry point's call)."""
    import torch

    torch.set_num_threads(1)
    for _, _, call in cases():
        call()
        call()


def measure(keep: str | None) -> dict[str, int]:
    """The second call's instructions, per case."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = keep or tmp
        Path(tmp).mkdir(parents=True, exist_ok=True)
        stem = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={stem}"]
        # Patterns end in ")": the lambdas inside an entry point (named after it, ending in
        # "const") must not toggle collection off. callgrind matches --dump-after only with
        # a pattern that starts with a wildcard.
        cmd += [f"--toggle-collect=roiops::{name}(*)" for name in ENTRIES]
        cmd += [f"--dump-after=*roiops::{name}(*)" for name in ENTRIES]
        cmd += [sys.executable, __file__, "--inner"]
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        run = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            sys.exit(run.stderr[-4000:])
        dumps = sorted(Path(tmp).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        return match(cases(), [parse(d.read_text()) for d in dumps])


def parse(dump: str) -> tuple[str, int]:
    """The function a dump followed and the instructions it counted."""
    trigger = re.search(r"^desc: Trigger: --dump-after=(.*)$", dump, re.M)
    summary = re.search(r"^summary: (\d+)", dump, re.M)
    assert summary, "a callgrind dump without a summary"
    return trigger.group(1) if trigger else "", int(summary.group(1))


def match(calls: list[tuple[str, str, Callable[[], object]]], dumps: list[tuple[str, int]]) -> dict[str, int]:
    """Each case's second call among the dumps, which come in call order. A dump follows an
    entry point, or a function inside one whose name holds the entry point's (a template
    argument); the calls' counts are the sums up to each entry point's own dump, and making
    the inputs calls some entry points too."""
    entries, total = [], 0
    for trigger, count in dumps:
        total += count
        called = re.match(r"roiops::(\w+)\(", trigger)
        if called:
            entries.append((called.group(1), total))
            total = 0
    counts, at = {}, 0
    for name, entry, _ in calls:
        found = [i for i in range(at, len(entries)) if entries[i][0] == entry][:2]
        if len(found) < 2:
            sys.exit(f"no two calls of {entry} for {name!r} among {entries[at:]}")
        counts[name], at = entries[found[1]][1], found[1] + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save", metavar="JSON", help="write the counts to this file")
    parser.add_argument("--compare", metavar="JSON", help="also print the ratio to counts saved earlier")
    parser.add_argument("--keep", metavar="DIR", help="keep callgrind's dumps in this folder")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        return inner()
    counts = measure(args.keep)
    before = json.loads(Path(args.compare).read_text()) if args.compare else {}
    for name, n in counts.items():
        ratio = f"  {n / before[name]:.4f}" if name in before else ""
        print(f"{name:36} {n:>14,}{ratio}")
    if args.save:
        Path(args.save).write_text(json.dumps(counts, indent=1) + "\n")


if __name__ == "__main__":
    main()
