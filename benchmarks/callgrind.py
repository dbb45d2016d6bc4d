"""Instructions executed by each entry point of the C++ kernels (roiops._C), counted by
valgrind's callgrind on fixed inputs and one thread, so that a change to the kernels can
show what it costs independently of the machine's caches, clock and load.

    python benchmarks/callgrind.py                       # a table: case, instructions
    python benchmarks/callgrind.py --save before.json    # also keep the counts
    python benchmarks/callgrind.py --compare before.json # and the ratio to earlier counts
    python benchmarks/callgrind.py --keep dumps/         # and callgrind's dumps, one per call,
                                                         # for callgrind_annotate

The cases come from the operators' specs (roiops.ops.SPECS): every registered op pair's
entry points, ``<name>_forward``, ``<name>_backward`` and, with a box gradient,
``<name>_rois_backward`` (``Kernels.ops()``), on an NCHW and a channels_last input, with
the arguments of the op's first forward variant (``Kernels.variants``) and 7 x 7 bins.
A position-sensitive op runs on an R-FCN head's map, every other op on a box head's
(``INPUTS``), with its spec's box format. A case is labelled ``<name> <layout> <entry>``,
e.g. ``roi_align_max channels_last backward``.

Each case calls one entry point twice on the same arguments; the count is the second
call's (the first may set up what a process does once). Only the entry point and what it
calls is counted, not Python or the making of the inputs. A count repeats from run to
run within about 0.05% (the allocator's work inside an entry point varies a little). Needs
valgrind on PATH and roiops._C built (`python setup.py build_ext --inplace`); run it from
the checkout.

Counts saved before the cases came from the specs labelled RoIAlign's cases ``roi_align
avg ...`` and the position-sensitive ones ``... 21 ...``; ``--compare`` reads those under
the labels above. Their inputs and arguments are the same, except max-mode RoIAlign's,
which ran with sampling_ratio 2 (``roi_align max ...``) and now runs with its variant's
adaptive sampling, so it has no earlier count to compare with.
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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

LAYOUTS = {"NCHW": False, "channels_last": True}


@dataclass(frozen=True)
class Input:
    """A fixed input: an ``n x channels x height x width`` map at ``scale`` of the image,
    ``boxes`` boxes over the image, and a gradient of ``out_channels`` channels."""

    what: str
    n: int
    channels: int
    height: int
    width: int
    scale: float
    boxes: int
    out_channels: int


# Drawn from one generator in this order; the cases of an op whose spec is position-sensitive
# run on the second, the others on the first.
INPUTS = (
    Input("a box head at 1/8 of an 800 x 1344 image", 2, 64, 100, 168, 1 / 8, 256, 64),
    Input("R-FCN, 21 classes, at 1/16 of a 600 x 800 image", 1, 21 * 49, 38, 50, 1 / 16, 300, 21),
)
POOLED = 7


def specs() -> tuple[Any, ...]:
    from roiops.ops import SPECS

    return SPECS


def entries() -> list[str]:
    """The entry points (roiops::NAME, the C++ functions registered as the ops' CPU kernels) the cases call."""
    return [f"{k.name}_{role}" for spec in specs() for k in spec.kernels for role in k.ops()]


def cases() -> list[tuple[str, str, Callable[[], object]]]:
    """(case, entry point, call) in the order they run: float32, deterministic inputs."""
    import torch

    from roiops import cpu
    from roiops._boxes import AXIS_ALIGNED, BEZIER, PER_IMAGE, ROTATED

    g = torch.Generator().manual_seed(0)

    def boxes(n_images: int, count: int, width: float, height: float) -> torch.Tensor:
        idx = torch.randint(0, n_images, (count, 1), generator=g).float()
        xy = torch.rand(count, 4, generator=g)
        x = torch.sort(xy[:, [0, 2]] * width, dim=1).values
        y = torch.sort(xy[:, [1, 3]] * height, dim=1).values
        return torch.cat([idx, x[:, :1], y[:, :1], x[:, 1:], y[:, 1:]], 1)

    def layout(t: torch.Tensor, cl: bool) -> torch.Tensor:
        return t.contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)

    data = []
    for i in INPUTS:
        x = torch.randn(i.n, i.channels, i.height, i.width, generator=g)
        r = boxes(i.n, i.boxes, i.width / i.scale, i.height / i.scale)
        rois = {AXIS_ALIGNED: r}
        if i is INPUTS[0]:  # the same boxes turned about their centres, as bands, and per image in map cells
            angles = torch.rand(i.boxes, 1, generator=g) * 360 - 180
            rois[ROTATED] = torch.cat([r[:, :1], (r[:, 1:3] + r[:, 3:5]) / 2, r[:, 3:5] - r[:, 1:3], angles], 1)
            rois[BEZIER] = BEZIER.from_axis_aligned(r)
            rois[PER_IMAGE] = (r[:, 1:] * i.scale).reshape(i.n, -1, 4).contiguous()
        grad = torch.randn(i.boxes, i.out_channels, POOLED, POOLED, generator=g)
        data.append((i, x, rois, grad))

    out: list[tuple[str, str, Callable[[], object]]] = []
    for i, x, all_rois, grad in data:
        for spec in specs():
            if spec.position_sensitive != (i is INPUTS[1]):
                continue
            rois = all_rois[spec.boxes]
            for k in spec.kernels:
                # The forward's arguments: the first forward variant's, the input's scale and the bins.
                values = {"spatial_scale": i.scale, "pooled_height": POOLED, "pooled_width": POOLED}
                values |= k.variants.get("forward", ({},))[0]
                missing = [n for _, n in k.args if n not in values]
                if missing:
                    sys.exit(f"callgrind: no value for {k.name}'s arguments {missing}")
                args = [values[n] for _, n in k.args]
                op_grad = grad
                if k.output_shape is not None:  # not [K, C_out, ph, pw]: its own upstream gradient
                    shape = k.output_shape(x.shape, rois.shape, values)
                    op_grad = torch.randn(shape, generator=torch.Generator().manual_seed(1))
                elif (k.out_channels(i.channels, POOLED, POOLED) if k.out_channels else i.channels) != i.out_channels:
                    sys.exit(f"callgrind: {k.name}'s output on {i.what} has not {i.out_channels} channels")
                extra = [None] * len(k.tensors)  # the optional extra tensor inputs, left out
                for tag, cl in LAYOUTS.items():
                    xi, gi = layout(x, cl), layout(op_grad, cl)
                    from_input = {"batch_size": i.n, "channels": i.channels, "height": i.height, "width": i.width,
                                  "channels_last": cl}
                    backward = [values[n] if n in values and n not in from_input else from_input[n]
                                for n in k.backward]
                    # The forward's extra outputs (an argmax), which the backward takes: kept from
                    # the forward case's call, the output itself dropped as a caller would.
                    saved: dict[str, Any] = {}

                    def forward(f: Any = getattr(cpu, f"{k.name}_forward"), xi: torch.Tensor = xi,
                                rois: torch.Tensor = rois, saved: dict[str, Any] = saved, keep: bool = bool(k.saved),
                                args: list[Any] = args, extra: list[Any] = extra) -> None:
                        result = f(xi, rois, *extra, *args)
                        if keep:
                            saved["outputs"] = result[1:]

                    def backward_call(f: Any = getattr(cpu, f"{k.name}_backward"), gi: torch.Tensor = gi,
                                      rois: torch.Tensor = rois, saved: dict[str, Any] = saved,
                                      rest: list[Any] = [*extra, *backward]) -> object:
                        return f(gi, *saved.get("outputs", ()), rois, *rest)

                    out += [(f"{k.name} {tag} forward", f"{k.name}_forward", forward),
                            (f"{k.name} {tag} backward", f"{k.name}_backward", backward_call)]
                    if k.rois_grad:
                        rois_backward = getattr(cpu, f"{k.name}_rois_backward")
                        out.append((f"{k.name} {tag} rois_backward", f"{k.name}_rois_backward",
                                    partial(rois_backward, gi, xi, rois, *extra, *args)))
    return out


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
        cmd += [f"--toggle-collect=roiops::{name}(*)" for name in entries()]
        cmd += [f"--dump-after=*roiops::{name}(*)" for name in entries()]
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
    argument); the calls' counts are the sums up to each entry point's own dump. A case's
    calls are the first two of its entry point after the previous case's."""
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


def _label(saved: str) -> str:
    """A saved case's label as the cases are labelled now: counts saved before the cases came
    from the specs called RoIAlign's "roi_align avg ..." and the R-FCN ones "... 21 ..."."""
    return re.sub(r" (avg|21)(?= )", "", saved)


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
    before = {_label(name): n for name, n in json.loads(Path(args.compare).read_text()).items()} \
        if args.compare else {}
    width = max(map(len, counts))
    for name, n in counts.items():
        ratio = f"  {n / before[name]:.4f}" if name in before else ""
        print(f"{name:{width}} {n:>14,}{ratio}")
    if args.save:
        Path(args.save).write_text(json.dumps(counts, indent=1) + "\n")


if __name__ == "__main__":
    main()
