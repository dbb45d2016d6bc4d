"""onnxruntime's CPU time for each operator exported to ONNX, on the CPU workloads of
`roiops bench`, against roiops' C++ kernels and a peer (torchvision's eager op where
torchvision has the operator; for the mask and point-cloud operators the bench's own
peer), in one process per workload; and the exported graph's size.

    PYTHONPATH=. .venv/bin/python benchmarks/onnx_cpu.py [--threads 2] [--repeats 5]

Writes benchmarks/onnx_cpu.json (with `--ops`, replaces those operators' rows in it) and
prints the table docs/ecosystem.md shows.
float32 NCHW, forward only, the median of `repeats` timed calls after one warm-up, each
engine with the same number of threads; the peak memory of the process (export, the
eager ops and onnxruntime). A workload whose graph needs more memory than `--memory-gb`
is recorded as such.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "onnx_cpu.json"
TORCHVISION = {"roi_align": "roi_align", "roi_align max": None, "roi_pool": "roi_pool",
               "ps_roi_align": "ps_roi_align", "ps_roi_pool": "ps_roi_pool"}


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def run_one(op: str, name: str, threads: int, repeats: int, align_avg: str) -> dict:
    """Exports and times one workload (in this process)."""
    import onnxruntime as ort
    import torch

    import roiops.onnx
    from roiops.bench import OPS, WORKLOADS, draw_boxes

    torch.set_num_threads(threads)
    (w,) = [w for w in WORKLOADS if w.op == op and w.name == name]
    bench = OPS[op]
    g = torch.Generator().manual_seed(0)
    call = bench.call
    peer: tuple[str, Callable[..., Any]] | None = None
    if bench.inputs is not None:  # the mask and point-cloud operators: the bench's own inputs and peer
        inputs = tuple(bench.inputs.draw(w, g, torch.float32))
        if bench.peer is not None:
            module = importlib.import_module(bench.peer.module)
            peer = (bench.peer.module, partial(bench.peer.call, module, w))
    else:
        x = torch.randn(w.n, w.channels, w.height, w.width, generator=g)
        boxes = draw_boxes(w, g)
        inputs = (x, boxes)
        if TORCHVISION.get(op):
            import torchvision.ops

            tv = getattr(torchvision.ops, TORCHVISION[op])
            args = dict(spatial_scale=w.scale)
            if op != "roi_pool" and op != "ps_roi_pool":
                args["sampling_ratio"] = w.sampling_ratio
            if op == "roi_align":
                args["aligned"] = w.aligned
            peer = ("torchvision", lambda x, boxes: tv(x, boxes, w.size, **args))
    if op == "mask_targets polygons":  # the op on the packed polygons, which the bench's call unpacks to lists
        def call(w, coords, vertex_offsets, polygon_offsets, boxes, indices):  # noqa: F811
            return torch.ops.roiops.polygon_targets(coords, vertex_offsets, polygon_offsets, boxes, indices, w.size)

    if op == "deform_roi_pool":  # the offsets an input of the graph (the bench makes them inside its call)
        from roiops.bench.deform_roi_pool import _offsets

        inputs = (x, boxes, _offsets(boxes, w.size).detach())

        def call(w, x, boxes, offset):  # noqa: F811 - the same call, its offsets given
            return roiops.deform_roi_pool(x, boxes, offset, w.size, w.scale, w.sampling_ratio)

    class Op(torch.nn.Module):
        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return call(w, *args)

    row = {"op": op, "workload": name, "align_avg": align_avg, "threads": threads}
    with torch.no_grad():
        row["roiops_ms"] = _median_ms(lambda: call(w, *inputs), repeats)
        if peer is not None:
            row["peer"] = peer[0]
            row["peer_ms"] = _median_ms(lambda: peer[1](*inputs[:2] if bench.inputs is None else inputs), repeats)
        program = roiops.onnx.export(Op().eval(), inputs, align_avg=align_avg)
    model = program.model_proto
    row["nodes"] = _nodes(model.graph)
    row["model_kb"] = round(len(model.SerializeToString()) / 1024, 1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(session.get_inputs(), inputs)}
    row["onnxruntime_ms"] = _median_ms(lambda: session.run(None, feed), repeats)
    with torch.no_grad():
        expected = call(w, *inputs)
    got = torch.from_numpy(session.run(None, feed)[0]).double()
    expected = expected.double()
    row["max_abs_diff"] = float((got - expected).abs().max()) if expected.numel() else 0.0
    row["peak_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # the whole process's
    return row


def _nodes(graph: Any) -> int:
    """The graph's nodes, those of its loops' bodies included."""
    return sum(1 + sum(_nodes(a.g) for a in node.attribute if a.HasField("g")) for node in graph.node)


def table(rows: list[dict]) -> str:
    lines = ["| operator | workload | exported as | nodes | graph KB | onnxruntime ms | roiops C++ ms | "
             "peer | peer ms | onnxruntime / roiops | peak GB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        # align_avg only matters to the ops built on roi_align's avg translation
        r = {**r, "align_avg": r["align_avg"] if r["op"] in ("roi_align", "mask_targets") else "decomposition"}
        if "error" in r:
            lines.append(f"| {r['op']} | {r['workload']} | {r['align_avg']} | | | {r['error']} | | | | | |")
            continue
        peer = f"{r['peer']} | {r['peer_ms']:.1f}" if "peer_ms" in r else " | "
        lines.append(f"| {r['op']} | {r['workload']} | {r['align_avg']} | {r['nodes']} | {r['model_kb']} | "
                     f"{r['onnxruntime_ms']:.1f} | {r['roiops_ms']:.1f} | {peer} | "
                     f"{r['onnxruntime_ms'] / r['roiops_ms']:.1f}x | {r.get('peak_gb', '')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-gb", type=float, default=16.0)
    parser.add_argument("--ops", nargs="*", help="only these operators (bench keys)")
    parser.add_argument("--one", nargs=3, metavar=("OP", "WORKLOAD", "ALIGN_AVG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # the child process: one workload, its row as JSON on stdout
        limit = int(args.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        print(json.dumps(run_one(*args.one[:2], args.threads, args.repeats, args.one[2])))
        return

    sys.path.insert(0, str(ROOT))
    from roiops.bench import WORKLOADS

    rows = []
    todo = [(w.op, w.name, "RoiAlign") for w in WORKLOADS if "cpu" in w.devices]
    todo += [(w.op, w.name, "decompose") for w in WORKLOADS if "cpu" in w.devices and w.op == "roi_align"]
    todo = [row for row in todo if not args.ops or row[0] in args.ops]
    for op, name, align_avg in todo:
        child = subprocess.run([sys.executable, __file__, "--one", op, name, align_avg, "--threads", str(args.threads),
                                "--repeats", str(args.repeats), "--memory-gb", str(args.memory_gb)],
                               capture_output=True, text=True, cwd=ROOT)
        lines = child.stdout.strip().splitlines()
        if child.returncode == 0 and lines:
            row = json.loads(lines[-1])
        else:
            oom = "MemoryError" in child.stderr or "bad_alloc" in child.stderr or "Failed to allocate" in child.stderr
            why = f"needs more than {args.memory_gb:g} GB" if oom else child.stderr.strip().splitlines()[-1][:120]
            row = {"op": op, "workload": name, "align_avg": align_avg, "error": why}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.ops and RESULTS.exists():  # the other rows stay where they are; new workloads go last
        new = {(r["op"], r["workload"], r["align_avg"]): r for r in rows}
        kept = [new.pop((r["op"], r["workload"], r["align_avg"]), r) for r in json.loads(RESULTS.read_text())]
        rows = kept + list(new.values())
    RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
