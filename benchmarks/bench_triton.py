"""GPU benchmark: roiops.triton kernels against torchvision.ops on CUDA, same process.

    python benchmarks/bench_triton.py [--reps 50] [--dtypes float32,bfloat16]
                                      [--layouts nchw,cl] [--peak-gbps 3350] [--json out.json]

Workload (a Mask R-CNN-like FPN level): N=2 images, C=256 channels, a 200x336 feature map
at spatial_scale 1/4 (800x1344-pixel images), boxes with log-uniform sides in 16..512
pixels. Cases: RoIAlign 7x7 with sampling 2 and adaptive sampling (0) on 1024 boxes,
RoIAlign 14x14 (sampling 2) on 256 boxes, RoIAlign max 7x7 (roiops only), RoIPool 7x7 on
1024 boxes; NCHW and channels_last; float32 and bfloat16; forward, backward (atomic) and
backward (deterministic, roiops only: torchvision has none).

Times are medians of CUDA-event measurements. "GB/s" is the effective bandwidth: the
bytes the op must move at the least (forward: every feature-map cell some box covers,
once per channel, plus the output and argmax; backward: grad and argmax read, the whole
grad_input written) divided by the time; "%peak" relates it to the GPU's DRAM bandwidth
(--peak-gbps, else derived from the device's memory clock and bus width, else a measured
device-to-device copy).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass

import torch

from roiops.bench import log_uniform_boxes

N, C, H, W = 2, 256, 200, 336
SCALE = 0.25
IMG_H, IMG_W = H / SCALE, W / SCALE

# DRAM bandwidth in GB/s of common data-centre GPUs, used when the driver reports nothing.
KNOWN_PEAK_GBPS = {
    "H200": 4800, "H100 SXM": 3350, "H100 80GB HBM3": 3350, "H100 NVL": 3900, "H100 PCIe": 2000,
    "H100": 3350, "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "L40S": 864,
    "L4": 300, "A10G": 600, "V100": 900, "RTX 4090": 1008,
}


def make_boxes(count: int, seed: int, device) -> torch.Tensor:
    """[count, 5] float32 boxes from the CPU suite's generator (sides log-uniform in
    16..512 px, centres uniform in the image), clipped to the image."""
    b, x1, y1, x2, y2 = log_uniform_boxes(count, N, IMG_W, IMG_H, torch.Generator().manual_seed(seed)).unbind(1)
    return torch.stack([b, x1.clamp(0, IMG_W - 1), y1.clamp(0, IMG_H - 1), x2.clamp(1, IMG_W), y2.clamp(1, IMG_H)],
                       1).to(device)


def covered_cells(rois: torch.Tensor) -> int:
    """Feature-map cells (over all images) inside some box, with a one-cell margin for the
    bilinear neighbours: the part of the map an op must read at least once."""
    mask = torch.zeros(N, H, W, dtype=torch.bool)
    for b, x1, y1, x2, y2 in rois.cpu().tolist():
        c0, c1 = max(int(math.floor(x1 * SCALE)) - 1, 0), min(int(math.ceil(x2 * SCALE)) + 1, W - 1)
        r0, r1 = max(int(math.floor(y1 * SCALE)) - 1, 0), min(int(math.ceil(y2 * SCALE)) + 1, H - 1)
        mask[int(b), r0:r1 + 1, c0:c1 + 1] = True
    return int(mask.sum())


def bench(fn, reps: int, warmup: int = 5) -> float:
    """Median milliseconds of fn() over reps, each between its own pair of CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_gbps(override: float | None) -> tuple[float, str]:
    if override:
        return override, "--peak-gbps"
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, "memory clock x bus width"
    for name, gbps in KNOWN_PEAK_GBPS.items():
        if name in props.name:
            return float(gbps), f"table ({name})"
    x = torch.empty(256 * 2 ** 20, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), 20)
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e9, "measured copy"


@dataclass
class Row:
    case: str
    layout: str
    dtype: str
    pass_: str
    tv_ms: float | None
    ro_ms: float
    bytes_: int
    max_diff: float | None

    def gbps(self) -> float:
        return self.bytes_ / (self.ro_ms * 1e-3) / 1e9


def run_case(rows, name, op, K, P, sr, layout, dtype, reps, rt, tvops, seed):
    ph = pw = P
    x = torch.randn(N, C, H, W, device="cuda", dtype=dtype)
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    rois = make_boxes(K, seed, "cuda")
    cl = layout == "cl"
    elt = x.element_size()
    cells = covered_cells(rois)
    out_elems = K * C * ph * pw
    map_bytes = N * C * H * W * elt
    aligned = True
    dname = str(dtype).replace("torch.", "")

    def tv_try(fn):
        try:
            r = fn()
            torch.cuda.synchronize()
            return r
        except (RuntimeError, NotImplementedError):  # e.g. a dtype torchvision lacks
            return None

    if op == "align":
        ro_f = lambda: rt.roi_align_forward(x, rois, SCALE, ph, pw, sr, aligned)  # noqa: E731
        tv_f = lambda: tvops.roi_align(x, rois, (ph, pw), SCALE, sr, aligned)  # noqa: E731
        out = ro_f()
        g = torch.randn_like(out)
        ro_b = lambda det: rt.roi_align_backward(g, rois, SCALE, ph, pw, N, C, H, W, sr, aligned, cl,  # noqa: E731
                                                 deterministic=det)
        tv_b = lambda: torch.ops.torchvision._roi_align_backward(  # noqa: E731
            g, rois, SCALE, ph, pw, N, C, H, W, sr, aligned)
        fwd_bytes = cells * C * elt + out_elems * elt + rois.numel() * 4
        bwd_bytes = out_elems * elt + map_bytes
    elif op == "align_max":
        ro_f = lambda: rt.roi_align_max_forward(x, rois, SCALE, ph, pw, sr, aligned)  # noqa: E731
        tv_f = None
        out, am = ro_f()
        g = torch.randn_like(out)
        ro_b = lambda det: rt.roi_align_max_backward(  # noqa: E731
            g, am, rois, SCALE, ph, pw, N, C, H, W, sr, aligned, cl, deterministic=det)
        tv_b = None
        fwd_bytes = cells * C * elt + out_elems * (elt + 4) + rois.numel() * 4
        bwd_bytes = out_elems * (elt + 4) + map_bytes
    else:
        ro_f = lambda: rt.roi_pool_forward(x, rois, SCALE, ph, pw, False)  # noqa: E731
        tv_f = lambda: torch.ops.torchvision.roi_pool(x, rois, SCALE, ph, pw)  # noqa: E731
        out, am = ro_f()
        g = torch.randn_like(out)
        ro_b = lambda det: rt.roi_pool_backward(g, am, rois, N, C, H, W, cl, deterministic=det)  # noqa: E731
        tv_am = tv_try(tv_f)

        tv_b = None if tv_am is None else (  # noqa: E731
            lambda: torch.ops.torchvision._roi_pool_backward(g, rois, tv_am[1], SCALE, ph, pw, N, C, H, W))
        fwd_bytes = cells * C * elt + out_elems * (elt + 4) + rois.numel() * 4
        bwd_bytes = out_elems * (elt + 4) + map_bytes

    # Forward, with a sanity comparison against torchvision.
    diff = None
    if tv_f is not None:
        ref = tv_try(tv_f)
        if ref is not None:
            ref = ref[0] if isinstance(ref, tuple) else ref
            mine = ro_f()
            mine = mine[0] if isinstance(mine, tuple) else mine
            diff = (mine.float() - ref.float()).abs().max().item()
        tv_ms = bench(tv_f, reps) if ref is not None else None
    else:
        tv_ms = None
    rows.append(Row(name, layout, dname, "forward", tv_ms, bench(ro_f, reps), fwd_bytes, diff))

    tv_ms = None
    diff = None
    if tv_b is not None and tv_try(tv_b) is not None:
        tv_ms = bench(tv_b, reps)
        diff = (ro_b(False).float() - tv_b().float()).abs().max().item()
    rows.append(Row(name, layout, dname, "backward", tv_ms, bench(lambda: ro_b(False), reps), bwd_bytes, diff))
    rows.append(Row(name, layout, dname, "backward det", None, bench(lambda: ro_b(True), reps), bwd_bytes, None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--layouts", default="nchw,cl")
    ap.add_argument("--peak-gbps", type=float, default=None)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("bench_triton.py: no CUDA device is available. This benchmark times the Triton "
                 "kernels on a GPU (under TRITON_INTERPRET=1 they would only be interpreted on "
                 "the CPU); run it on a machine with an NVIDIA GPU.")

    import torchvision  # noqa: F401  (registers torch.ops.torchvision)
    from torchvision import ops as tvops

    import roiops.triton as rt

    peak, peak_src = peak_gbps(args.peak_gbps)
    print(f"device: {torch.cuda.get_device_name(0)}, peak {peak:.0f} GB/s ({peak_src}); "
          f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    print(f"map N={N} C={C} {H}x{W}, scale {SCALE}, boxes log-uniform 16..512 px; median of {args.reps}\n")

    cases = [
        ("align 7x7 s2 K1024", "align", 1024, 7, 2),
        ("align 7x7 s0 K1024", "align", 1024, 7, 0),
        ("align 14x14 s2 K256", "align", 256, 14, 2),
        ("align-max 7x7 s2 K1024", "align_max", 1024, 7, 2),
        ("pool 7x7 K1024", "pool", 1024, 7, 0),
    ]
    rows: list[Row] = []
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for layout in args.layouts.split(","):
            for i, (name, op, K, P, sr) in enumerate(cases):
                run_case(rows, name, op, K, P, sr, layout, dtype, args.reps, rt, tvops, seed=i)

    hdr = f"{'case':24s} {'layout':6s} {'dtype':8s} {'pass':12s} {'tv ms':>8s} {'roiops ms':>9s} " \
          f"{'speedup':>7s} {'GB/s':>7s} {'%peak':>6s} {'max|diff|':>9s}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        tv = f"{r.tv_ms:8.3f}" if r.tv_ms is not None else f"{'-':>8s}"
        sp = f"{r.tv_ms / r.ro_ms:7.2f}" if r.tv_ms is not None else f"{'-':>7s}"
        df = f"{r.max_diff:9.2e}" if r.max_diff is not None else f"{'-':>9s}"
        print(f"{r.case:24s} {r.layout:6s} {r.dtype:8s} {r.pass_:12s} {tv} {r.ro_ms:9.3f} {sp} "
              f"{r.gbps():7.0f} {100 * r.gbps() / peak:5.1f}% {df}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "peak_gbps": peak,
                       "rows": [dict(r.__dict__, gbps=r.gbps()) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
