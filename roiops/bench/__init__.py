"""``roiops bench``: roiops against a peer (torchvision.ops) in one process, on the CPU or
a CUDA GPU.

Each case times roiops and its peer interleaved, repeat by repeat (``--order back-to-back``:
each library's calls in a row; ``alternate-awake``: interleaved, each CPU call right after a
small parallel op that wakes the worker threads), and reports medians and their ratio, so
that load from other processes hits both alike: on the CPU with the wall clock around each
call, on a GPU between a pair of CUDA events. Every row also gives the effective bandwidth
(the bytes the op must move at the least over roiops' time) and, where the memory bandwidth
is known, its share of it. Writes a table to stdout, ``results.json`` and ``ratios.png`` to ``--out``.

An operator joins the suite through a module beside this one, ``roiops/bench/<op>.py``,
whose ``BENCH`` lists its ``Bench`` entries (how to call roiops and its peer on a workload's
map and boxes, the speed target) with one ``Workload`` per shape; the timing code does not
change. An operator that takes other inputs (masks to paste, ground-truth masks) declares
how to draw them and the bytes its forward moves (``Inputs``), and is timed forward only.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import pkgutil
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import roiops

from .. import _requirements
from ._case import Bench, Inputs, Peer, Workload

# ----------------------------------------------------------------------------- declarations


def describe(w: Workload) -> str:
    spec = OPS[w.op]
    sampling = "" if not spec.sampled else (
        ", adaptive sampling" if w.sampling_ratio <= 0 else f", sampling {w.sampling_ratio}")
    where = "" if set(DEVICES) <= set(w.devices) else f" ({', '.join(w.devices)} only)"
    if spec.inputs is not None:
        return f"{spec.title}{sampling}: {spec.inputs.text(w)}{where}"
    return (f"{spec.title} {w.size}x{w.size}{sampling}: {w.boxes} boxes, "
            f"{w.n}x{w.channels}x{w.height}x{w.width} map, scale 1/{1 / w.scale:g}{where}")


def _collect() -> dict[str, Bench]:
    found: dict[str, Bench] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            found |= {b.key: b for b in importlib.import_module(f"{__name__}.{info.name}").BENCH}
    return found


# Every operator's benchmark entries and workloads, from the modules beside this one.
OPS: dict[str, Bench] = _collect()
WORKLOADS = [replace(w, op=b.key) for b in OPS.values() for w in b.workloads]


def draw_boxes(w: Workload, generator: torch.Generator) -> torch.Tensor:
    """The workload's boxes, drawn as its op's box format draws a benchmark's, in pixels of
    the image its map covers."""
    return OPS[w.op].boxes.sample(w.n, w.boxes, w.width / w.scale, w.height / w.scale, generator)


def tiny(w: Workload) -> Workload:
    """The same workload at shapes that run in milliseconds: checks the suite, not speed."""
    return replace(w, channels=8 * OPS[w.op].channel_multiple(w), height=20, width=24, boxes=16)


# ----------------------------------------------------------------------------- devices


def wall_clock(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cuda_events(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


@dataclass(frozen=True)
class Device:
    name: str                                       # the torch device type
    timer: Callable[[Callable[[], object]], float]  # seconds of one call
    timer_text: str
    warmup: int                                     # untimed calls of each function first
    repeats: int                                    # default --repeats
    dtypes: tuple[str, ...]                         # default --dtypes
    directions: tuple[str, ...]


CPU = Device("cpu", wall_clock, "time.perf_counter around each call", 1, 5, ("float32",),
             ("forward", "backward"))
# "backward det": roiops' deterministic (atomic-free) GPU backward; the CPU one always is.
CUDA = Device("cuda", cuda_events, "a pair of CUDA events around each call", 5, 50, ("float32", "bfloat16"),
              ("forward", "backward", "backward det"))
DEVICES = {"cpu": CPU, "cuda": CUDA}
PEER_DIRECTIONS = ("forward", "backward")
LAYOUTS = {"nchw": "NCHW", "channels_last": "channels_last"}
DTYPES = ("float32", "bfloat16", "float16")

# DRAM bandwidth in GB/s of common data-centre GPUs, used when the driver reports nothing.
KNOWN_PEAK_GBPS = {
    "H200": 4800, "H100 SXM": 3350, "H100 80GB HBM3": 3350, "H100 NVL": 3900, "H100 PCIe": 2000,
    "H100": 3350, "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864,
    "L4": 300, "A10G": 600, "V100": 900, "RTX 4090": 1008,
}


def peak_from_properties(name: str, memory_clock_khz: int, bus_bits: int) -> tuple[float, str] | None:
    """A GPU's DRAM bandwidth in GB/s and where it came from: double data rate at the
    memory clock over the bus width, else the table by name; None when neither knows."""
    if memory_clock_khz and bus_bits:
        return 2 * memory_clock_khz * 1e3 * bus_bits / 8 / 1e9, "memory clock x bus width"
    for key, gbps in KNOWN_PEAK_GBPS.items():
        if key in name:
            return float(gbps), f"table ({key})"
    return None


def cuda_peak() -> tuple[float, str]:
    props = torch.cuda.get_device_properties(0)
    found = peak_from_properties(props.name, getattr(props, "memory_clock_rate", 0) or 0,
                                 getattr(props, "memory_bus_width", 0) or 0)
    if found is not None:
        return found
    x = torch.empty(256 * 2 ** 20, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    seconds = statistics.median(cuda_events(lambda: y.copy_(x)) for _ in range(20))
    return 2 * x.numel() * x.element_size() / seconds / 1e9, "measured copy"


def cuda_problem() -> str:
    """Why --device cuda cannot run here; "" when it can."""
    if not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (f"--device cuda: torch sees no CUDA device (torch {torch.__version__}, {build}); the GPU "
                "suite times roiops' Triton kernels on an NVIDIA GPU")
    if not _requirements.triton_available():
        return "--device cuda times roiops' Triton kernels, and Triton is not installed"
    return _requirements.triton_too_old()


# ----------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Case:
    workload: Workload
    layout: str          # "NCHW" | "channels_last"
    dtype: str
    threads: int


def select_cases(workloads: list[Workload], device: str, layouts: list[str], dtypes: list[str],
                 threads: list[int]) -> list[Case]:
    """Each workload that runs on the device in each dtype, layout and thread count; an entry
    with its own inputs has no map to lay out, and runs as nchw only."""
    return [Case(w, LAYOUTS[layout], dtype, t) for w in workloads if device in w.devices
            for dtype in dtypes for layout in layouts if OPS[w.op].inputs is None or layout == "nchw"
            for t in threads]


def covered_cells(extent: torch.Tensor, w: Workload) -> int:
    """Feature-map cells (over all images) inside some box, with a one-cell margin for the
    bilinear neighbours: the part of the map an op must read at least once."""
    mask = torch.zeros(w.n, w.height, w.width, dtype=torch.bool)
    for b, x1, y1, x2, y2 in extent.tolist():
        c0, c1 = max(math.floor(x1 * w.scale) - 1, 0), min(math.ceil(x2 * w.scale) + 1, w.width - 1)
        r0, r1 = max(math.floor(y1 * w.scale) - 1, 0), min(math.ceil(y2 * w.scale) + 1, w.height - 1)
        mask[int(b), r0:r1 + 1, c0:c1 + 1] = True
    return int(mask.sum())


def bytes_moved(w: Workload, argmax: bool, cells: int, out_shape: tuple[int, ...], elt: int,
                rois_bytes: int) -> dict[str, int]:
    """The least each direction must move: forward reads every covered cell once per output
    channel (all of the map's channels, or for a position-sensitive op the group its bin
    reads) and the boxes, writes the output (and argmax); backward reads grad (and argmax)
    and writes the whole grad_input."""
    out = math.prod(out_shape) * (elt + (4 if argmax else 0))
    backward = out + w.n * w.channels * w.height * w.width * elt
    return {"forward": cells * out_shape[1] * elt + out + rois_bytes, "backward": backward, "backward det": backward}


def result_row(case: Case, device: str, direction: str, roiops_s: float, peer: str | None,
               peer_s: float | None, nbytes: int, peak_gbps: float | None, diff: float | None,
               peer_error: str | None) -> dict[str, Any]:
    gbps = nbytes / roiops_s / 1e9
    return {"workload": case.workload.name, "device": device, "layout": case.layout,
            "dtype": case.dtype, "threads": case.threads, "direction": direction, "roiops_ms": 1e3 * roiops_s,
            "peer": peer, "peer_ms": None if peer_s is None else 1e3 * peer_s,
            "ratio": None if peer_s is None else peer_s / roiops_s, "max_diff": diff,
            "bytes": nbytes, "gbps": gbps, "pct_peak": None if not peak_gbps else 100 * gbps / peak_gbps,
            "peer_error": peer_error, "shape": case.workload.shape()}


def deterministic(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """fn with roiops' deterministic GPU backward switched on for the call."""
    def run() -> torch.Tensor:
        saved = roiops.config.deterministic_backward
        roiops.config.deterministic_backward = True
        try:
            return fn()
        finally:
            roiops.config.deterministic_backward = saved
    return run


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


ORDERS = ("alternate", "alternate-awake", "back-to-back")


def timing_order(timed: list[str], repeats: int, order: str) -> list[str]:
    """Whose call each timed run of one case and direction is, in the order they run."""
    if order in ("alternate", "alternate-awake"):
        return [who for _ in range(repeats) for who in timed]
    return [who for who in timed for _ in range(repeats)]


def wake_threads() -> None:
    """An untimed parallel add of one 128 KiB chunk per thread (ATen's grain size): every
    CPU worker thread runs it, so the call after it finds them awake, as it would after a
    model's other layers, while little of the caches is displaced."""
    torch.ones(torch.get_num_threads() * 32768).add_(1.0)


Runs = dict[str, dict[str, Callable[[], torch.Tensor]]]  # who -> direction -> one call


def map_runs(case: Case, device: Device, peers: dict[str, ModuleType]) -> tuple[Runs, dict[str, int], str | None]:
    """roiops' and the peer's calls of each direction on a feature map and boxes, the bytes
    each direction moves, and why the peer could not run (None if it could)."""
    w = case.workload
    spec = OPS[w.op]
    fmt = torch.channels_last if case.layout == "channels_last" else torch.contiguous_format
    # Drawn on the CPU from one seed, in this order, so that every device gets the same data.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(w.n, w.channels, w.height, w.width, generator=g).contiguous(memory_format=fmt)
    rois = draw_boxes(w, g)
    cells = covered_cells(OPS[w.op].boxes.extent(rois), w)
    x, boxes = x.to(device.name, getattr(torch, case.dtype)), rois.to(device.name)

    calls: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], torch.Tensor]] = {
        "roiops": (lambda x, b: spec.call(w, x, b), boxes)}
    peer = spec.peer
    if peer is not None:
        call, module = peer.call, peers[peer.module]
        calls["peer"] = (lambda x, b: call(module, w, x, b),
                         boxes.to(x.dtype) if peer.boxes_in_input_dtype else boxes)
    runs: Runs = {}
    setup_error = None
    grad: torch.Tensor | None = None
    for who, (fn, who_boxes) in calls.items():
        xi = x.detach().requires_grad_()
        try:
            out = fn(xi, who_boxes)
        except (RuntimeError, NotImplementedError) as e:  # e.g. a dtype the peer lacks
            if who == "roiops":
                raise
            setup_error = _first_line(e)
            continue
        if who == "roiops":
            nbytes = bytes_moved(w, spec.argmax, cells, tuple(out.shape), x.element_size(),
                                 boxes.numel() * boxes.element_size())
        if grad is None or grad.shape != out.shape:  # the peer gets roiops' grad: comparable results
            grad = torch.randn(out.shape, generator=g).to(device.name, out.dtype, memory_format=fmt)

        def backward(out: torch.Tensor = out, xi: torch.Tensor = xi, grad: torch.Tensor = grad) -> torch.Tensor:
            return torch.autograd.grad(out, xi, grad, retain_graph=True)[0]

        runs[who] = {"forward": partial(fn, x, who_boxes), "backward": backward}
    runs["roiops"]["backward det"] = deterministic(runs["roiops"]["backward"])
    return runs, nbytes, setup_error


def input_runs(case: Case, device: Device, peers: dict[str, ModuleType]) -> tuple[Runs, dict[str, int], None]:
    """roiops' and the peer's forward on the tensors an entry's ``Inputs`` draw, and the
    bytes it moves; a peer that fails says so in its warm-up."""
    w = case.workload
    spec = OPS[w.op]
    assert spec.inputs is not None
    # Drawn on the CPU from one seed, so that every device gets the same data.
    drawn = spec.inputs.draw(w, torch.Generator().manual_seed(0), getattr(torch, case.dtype))
    inputs = tuple(t.to(device.name) for t in drawn)
    runs: Runs = {"roiops": {"forward": partial(spec.call, w, *inputs)}}
    if spec.peer is not None:
        runs["peer"] = {"forward": partial(spec.peer.call, peers[spec.peer.module], w, *inputs)}
    return runs, {"forward": spec.inputs.nbytes(w, drawn, runs["roiops"]["forward"]())}, None


def measure(case: Case, device: Device, repeats: int, peers: dict[str, ModuleType],
            peak_gbps: float | None, order: str) -> list[dict[str, Any]]:
    spec = OPS[case.workload.op]
    torch.set_num_threads(case.threads)
    runs, nbytes, setup_error = (map_runs if spec.inputs is None else input_runs)(case, device, peers)
    peer = spec.peer
    rows = []
    for direction in device.directions:
        if direction not in runs["roiops"]:
            continue  # an entry with its own inputs: forward only
        against = peer if direction in PEER_DIRECTIONS else None
        peer_error = setup_error if against else None
        timed = ["roiops"] + (["peer"] if against and "peer" in runs else [])
        results = {}
        for who in list(timed):
            try:
                for _ in range(device.warmup):
                    results[who] = runs[who][direction]()
            except (RuntimeError, NotImplementedError) as e:
                if who == "roiops":
                    raise
                peer_error = _first_line(e)
                timed.remove(who)
                results.pop(who, None)
        diff = (max_diff(results["roiops"], results["peer"])
                if "peer" in results and against and against.same_result else None)
        del results
        times: dict[str, list[float]] = {who: [] for who in timed}
        awake = order == "alternate-awake" and device.name == "cpu"
        for who in timing_order(timed, repeats, order):
            if awake:
                wake_threads()
            times[who].append(device.timer(runs[who][direction]))
        peer_s = statistics.median(times["peer"]) if "peer" in times else None
        rows.append(result_row(case, device.name, direction, statistics.median(times["roiops"]),
                               None if against is None else against.module, peer_s, nbytes[direction], peak_gbps,
                               diff, peer_error))
    return rows


# ----------------------------------------------------------------------------- reporting


def progress(done: int, total: int, label: str) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<50}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def cpu_model(root: Path = Path("/")) -> str:
    """The CPU's model name, with its family and model numbers and its L2 and L3 sizes where
    Linux gives them: hosts of one name ("AMD EPYC" under a hypervisor) differ in those, and
    the CPU ratios with them."""
    info: dict[str, str] = {}
    try:
        for line in (root / "proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first CPU's block
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or "unknown"
    ident = f"family {info['cpu family']}, model {info['model']}" if "cpu family" in info and "model" in info else ""
    caches = []
    for index in sorted((root / "sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if level in ("2", "3") and kind != "Instruction":
            caches.append(f"L{level} {size}")
    details = "; ".join(part for part in (ident, ", ".join(caches)) if part)
    return f"{name} ({details})" if details else name


def source_commit(root: Path = Path(__file__).resolve().parents[1]) -> str | None:
    """The git commit of the roiops tree being timed, "-dirty" appended when its tracked
    files differ from it; None for a package outside a checkout (an installed wheel)."""
    if not (root / ".git").exists():
        return None

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0:
            return None
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def host() -> dict[str, Any]:
    """What results.json records of the machine besides its CPU or GPU: a shared host's
    load shows in its times, and ratios differ between hosts of one CPU model."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"os": platform.platform(), "logical_cpus": os.cpu_count(), "load_average_1min": load}


def _peer_label(rows: list[dict[str, Any]]) -> str:
    names = sorted({r["peer"] for r in rows if r["peer"]})
    return names[0] if len(names) == 1 else "peer"


def _opt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]], threads: bool) -> str:
    peer = f"{_peer_label(rows)} ms"
    peak = any(r["pct_peak"] is not None for r in rows)
    columns: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
        ("workload", -18, lambda r: r["workload"]), ("layout", -13, lambda r: r["layout"]),
        ("dtype", -8, lambda r: r["dtype"])]
    if threads:
        columns.append(("thr", 3, lambda r: str(r["threads"])))
    columns += [("dir", -12, lambda r: r["direction"]), ("roiops ms", 10, lambda r: f"{r['roiops_ms']:.3f}"),
                (peer, max(len(peer), 10), lambda r: _opt(r["peer_ms"], ".3f")),
                ("ratio", 7, lambda r: _opt(r["ratio"], ".1f") + ("x" if r["ratio"] is not None else "")),
                ("GB/s", 7, lambda r: f"{r['gbps']:.1f}")]
    if peak:
        columns.append(("%peak", 6, lambda r: _opt(r["pct_peak"], ".1f")))
    columns.append(("max|diff|", 9, lambda r: _opt(r["max_diff"], ".2e")))

    def line(cells: list[str]) -> str:
        return " ".join(c.ljust(-width) if width < 0 else c.rjust(width)
                        for c, (_, width, _) in zip(cells, columns))

    head = line([name for name, _, _ in columns])
    return "\n".join([head, "-" * len(head)] + [line([cell(r) for _, _, cell in columns]) for r in rows])


def chart(rows: list[dict[str, Any]], path: Path, where: str) -> None:
    from matplotlib.figure import Figure

    def key(r: dict[str, Any]) -> tuple[str, str, str, int]:
        return r["workload"], r["layout"], r["dtype"], r["threads"]

    ratios: dict[tuple[str, str, str, int], dict[str, float]] = {}
    for r in rows:
        if r["ratio"] is not None:
            ratios.setdefault(key(r), {})[r["direction"]] = r["ratio"]
    dtypes = {r["dtype"] for r in rows}
    labels = [f"{name}\n{layout}" + (f", {dtype}" if len(dtypes) > 1 else "")
              + (f", {threads}t" if where == "CPU" else "") for name, layout, dtype, threads in ratios]
    fig = Figure(figsize=(max(8, 0.7 * len(labels)), 5))
    ax = fig.add_subplot()
    pos = range(len(labels))
    for shift, direction in ((-0.2, "forward"), (0.2, "backward")):
        ax.bar([p + shift for p in pos], [r.get(direction, math.nan) for r in ratios.values()], 0.4, label=direction)
    ax.set_xticks(list(pos), labels, rotation=60, ha="right", fontsize=7)
    peer = _peer_label(rows)
    ax.set_ylabel(f"speed-up over {peer} (x)")
    ax.set_yscale("log")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_title(f"roiops vs {peer} on {where} (same process, median times)")
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


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _peers_help() -> str:
    lines = []
    for name, spec in OPS.items():
        peer = "none (roiops alone)" if spec.peer is None else f"{spec.peer.module}" + (
            f", {spec.peer.note}" if spec.peer.note else "")
        lines.append(f"  {name}: {spec.title}; peer: {peer}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    names = [w.name for w in WORKLOADS]
    p = argparse.ArgumentParser(
        prog="roiops bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Time roiops against a peer computing the same operator (torchvision.ops) in one "
            "process, forward and backward, on the CPU (--device cpu, the default: C++ kernels) "
            "or a CUDA GPU (--device cuda: Triton kernels; adds 'backward det', roiops' "
            "deterministic backward, which has no peer). Each case runs both once or more "
            "untimed, then times each --repeats times, alternating call by call (--order "
            "alternate, the default) or all of roiops' calls then all of the peer's (--order "
            "back-to-back); it prints a table of median times, "
            "their ratio (peer time / roiops time), the effective bandwidth (GB/s: the bytes the "
            "op must move at the least - the covered map cells once per channel, the output "
            "and argmax forward; grad, argmax and the whole input gradient backward - over "
            "roiops' time), its percentage of --peak-gbps and the largest difference from the "
            "peer's result, and writes results.json and ratios.png to --out. The mask operators "
            "(pasting, targets) take masks instead of a feature map: they are timed forward only, "
            "as nchw, their bytes the masks they must read and the output.", 78),
        epilog="workloads (quote names that contain spaces; maps are N x C x H x W):\n" + "\n".join(
            f"  {w.name}\n    {describe(w)}" for w in WORKLOADS)
        + "\n\noperators and their peers:\n" + _peers_help())
    p.add_argument("--device", choices=list(DEVICES), default="cpu",
                   help="cpu (default): times with the wall clock, 1 warm-up call; cuda: the first "
                        "GPU, timed with CUDA events after 5 warm-up calls")
    p.add_argument("--workload", action="append", choices=names, metavar="NAME",
                   help="run only this workload; repeat the option for several (default: all of "
                        "them that run on --device, listed below)")
    p.add_argument("--threads", type=_at_least_one, nargs="+", metavar="T",
                   help="torch CPU thread counts to run each case with (default: 1 2); --device "
                        "cpu only")
    p.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), metavar="LAYOUT",
                   help="memory layouts of the feature map: nchw, channels_last (default: both); "
                        "the mask operators, which take no map, run as nchw only")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, metavar="DTYPE",
                   help=f"feature map dtypes, of {', '.join(DTYPES)} (default: float32 on the CPU, "
                        "float32 bfloat16 on cuda); a dtype the peer lacks is timed for roiops alone")
    p.add_argument("--repeats", type=_at_least_one, metavar="R",
                   help="timed runs per case after the warm-up; the median is reported (default: 5 "
                        "on the CPU, 50 on cuda)")
    p.add_argument("--peak-gbps", type=_positive, metavar="GBPS",
                   help="memory bandwidth that %%peak relates GB/s to (default: on cuda, the GPU's "
                        "memory clock x bus width, else a table of known GPUs, else a measured copy; "
                        "on the CPU, no %%peak column)")
    p.add_argument("--order", choices=ORDERS, default="alternate",
                   help="alternate (default): roiops' and the peer's calls alternate, so that each "
                        "starts from the caches, and on the CPU the sleeping worker threads, that "
                        "the other left; alternate-awake: the same, with a small untimed parallel op "
                        "just before each timed call on the CPU, so that the worker threads are awake, "
                        "as after a model's other layers; back-to-back: each library's calls in a row, "
                        "each after its own previous call")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 repeat, at the largest --threads count only")
    p.add_argument("--tiny", action="store_true",
                   help="every workload at tiny shapes (8 channels, a 20x24 map, 16 boxes): checks "
                        "that the suite runs, does not measure speed")
    p.add_argument("--out", type=Path, default=Path("bench_results"), metavar="DIR",
                   help="folder for results.json and ratios.png, created if missing "
                        "(default: bench_results)")
    p.add_argument("--no-chart", action="store_true",
                   help="write results.json only, without ratios.png (matplotlib not needed)")
    return p


def plan(args: argparse.Namespace) -> tuple[Device, list[Case], int]:
    """The device, cases and repeat count that parsed options ask for."""
    device = DEVICES[args.device]
    workloads = [w for w in WORKLOADS if not args.workload or w.name in args.workload]
    if args.tiny:
        workloads = [tiny(w) for w in workloads]
    threads = args.threads or ([1, 2] if device is CPU else [torch.get_num_threads()])
    repeats = 1 if args.quick else args.repeats or device.repeats
    if args.quick:
        threads = [max(threads)]
    layouts = list(dict.fromkeys(args.layouts or LAYOUTS))
    dtypes = list(dict.fromkeys(args.dtypes or device.dtypes))
    return device, select_cases(workloads, device.name, layouts, dtypes, threads), repeats


def _import_peer(module: str) -> ModuleType | str:
    """A peer's module, or why it cannot be used."""
    try:
        return importlib.import_module(module)
    except (ImportError, RuntimeError) as e:  # RuntimeError: a release built for another torch
        problem = "is not installed" if isinstance(e, ImportError) else f"failed to load ({e})"
        return (f"roiops bench times roiops against {module}, and {module} {problem}: install the "
                f"{module} release built for your torch {torch.__version__} (pip install {module})")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        if args.device != "cpu" and args.threads:
            parser.error("--threads sets CPU thread counts: it applies to --device cpu only")
        if args.out.exists() and not args.out.is_dir():
            parser.error(f"--out must be a folder, but {str(args.out)!r} is a file")
        device, cases, repeats = plan(args)
        if not cases:
            parser.error(f"none of the chosen workloads runs on --device {device.name}"
                         + (" (the mask operators run as nchw only)" if "nchw" not in (args.layouts or ["nchw"])
                            else ""))
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), message already printed
        return e.code if isinstance(e.code, int) else 2

    def fail(message: str) -> int:
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2

    peers: dict[str, ModuleType] = {}
    for name in dict.fromkeys(p.module for c in cases if (p := OPS[c.workload.op].peer) is not None):
        module = _import_peer(name)
        if isinstance(module, str):
            return fail(module)
        peers[name] = module
    if not args.no_chart:
        try:
            import matplotlib  # noqa: F401  (checked now: the chart is drawn after the timings)
        except ImportError:
            return fail("ratios.png is drawn with matplotlib, which is not installed: install it "
                        "(pip install matplotlib), or pass --no-chart")
    peak: float | None
    peak_source: str | None
    if device is CUDA:
        problem = cuda_problem()
        if problem:
            return fail(problem)
        peak, peak_source = (args.peak_gbps, "--peak-gbps") if args.peak_gbps else cuda_peak()
        gpu: str | None = torch.cuda.get_device_name(0)
    else:
        peak, peak_source = (args.peak_gbps, "--peak-gbps") if args.peak_gbps else (None, None)
        gpu = None
    print(f"device: {gpu or cpu_model()}" + (f", peak {peak:.0f} GB/s ({peak_source})" if peak else ""))

    # roiops: the version of the code timed, which need not be the installed distribution's
    versions = {"python": platform.python_version(), "torch": torch.__version__, "roiops": roiops.__version__,
                **{name: getattr(module, "__version__", "unknown") for name, module in peers.items()}}
    if device is CUDA:
        import triton

        versions |= {"triton": triton.__version__, "cuda": torch.version.cuda or "unknown"}
    meta = {"date": datetime.date.today().isoformat(), "device": device.name, "cpu": cpu_model(), "gpu": gpu,
            "host": host(), "commit": source_commit(), "versions": versions,
            "threads": sorted({c.threads for c in cases}), "repeats": repeats,
            "warmup": device.warmup, "timer": device.timer_text,
            "order": args.order, "statistic": "median seconds", "peak_gbps": peak,
            "peak_source": peak_source}
    written = [args.out / "results.json"] + ([] if args.no_chart else [args.out / "ratios.png"])
    rows: list[dict[str, Any]] = []

    def save(complete: bool) -> None:
        # After every case: a run stopped part-way (a time limit, a crash) keeps its rows.
        args.out.mkdir(parents=True, exist_ok=True)
        written[0].write_text(json.dumps({"meta": {**meta, "complete": complete}, "rows": rows}, indent=1))

    try:
        save(False)
    except OSError as e:
        print(f"{parser.prog}: error: cannot write the results to {args.out}: {e}", file=sys.stderr)
        return 1
    prev_threads = torch.get_num_threads()
    try:
        for i, case in enumerate(cases):
            label = f"{case.workload.name}, {case.layout}, {case.dtype}"
            progress(i, len(cases), label + (f", {case.threads} thread(s)" if device is CPU else ""))
            rows += measure(case, device, repeats, peers, peak, args.order)
            save(False)
        progress(len(cases), len(cases), "done")
    finally:
        torch.set_num_threads(prev_threads)
    print(table(rows, threads=device is CPU))
    for error in dict.fromkeys(f"{r['peer']} could not run {r['workload']} ({r['dtype']}, {r['layout']}): "
                               f"{r['peer_error']}" for r in rows if r["peer_error"]):
        print(error)
    try:
        save(True)
        if not args.no_chart:
            chart(rows, written[1], "CPU" if device is CPU else gpu or "cuda")
    except OSError as e:
        print(f"{parser.prog}: error: cannot write the results to {args.out}: {e}", file=sys.stderr)
        return 1
    print("wrote " + " and ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
