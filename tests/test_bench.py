"""``roiops bench``: the CPU suite runs end to end (tiny shapes: this checks the plumbing, not
speed), from an installed package as well as from the checkout, and rejects bad options
cleanly; the GPU suite's parts that need no GPU (case selection, bytes model, %peak, rows,
the deterministic backward row) are checked on CPU tensors; --device cuda without a GPU
says so."""

import datetime
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import roiops
from roiops import bench, cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]


def _workload(name: str) -> bench.Workload:
    (found,) = (w for w in bench.WORKLOADS if w.name == name)
    return found


def _bench(row: dict) -> bench.Bench:
    """The benchmark entry of a results row, through the workload it names."""
    return bench.OPS[_workload(row["workload"]).op]


def _check_results(out: Path, workloads: set[str], chart: bool = True) -> dict:
    data = json.loads((out / "results.json").read_text())
    rows = data["rows"]
    assert {r["workload"] for r in rows} == workloads
    assert {r["direction"] for r in rows} == {"forward", "backward"}
    assert all(r["device"] == "cpu" and r["dtype"] == "float32" and r["peer"] == _bench(r).peer.module
               for r in rows)
    assert all(r["roiops_ms"] > 0 and r["peer_ms"] > 0 and r["gbps"] > 0 for r in rows)
    assert all(r["ratio"] == pytest.approx(r["peer_ms"] / r["roiops_ms"]) for r in rows)
    # average RoIAlign and RoIPool match torchvision bit for bit, forward and backward; the
    # max workloads' peer is torchvision's average and the rotated ones' roiops' unrotated
    # RoIAlign, so there is nothing to compare (nor for PSRoIPool, whose torchvision forward
    # leaves out the map's last row and column)
    assert all(r["max_diff"] == (0.0 if _bench(r).peer.same_result else None) for r in rows)
    meta = data["meta"]
    assert meta["complete"] is True
    assert meta["device"] == "cpu" and meta["cpu"] and meta["gpu"] is None
    assert meta["date"] == datetime.date.today().isoformat()
    assert meta["versions"]["torch"] == torch.__version__ and meta["versions"]["roiops"]
    assert meta["versions"]["torchvision"]
    assert meta["threads"] == sorted({r["threads"] for r in rows})
    assert meta["order"] in bench.ORDERS
    assert meta["host"]["logical_cpus"] == os.cpu_count() and meta["host"]["os"]
    assert (out / "ratios.png").exists() == chart
    if chart:
        assert (out / "ratios.png").read_bytes()[:8] == PNG_MAGIC
    return data


def test_bench_tiny(tmp_path, capsys):
    assert cli.main(["bench", "--tiny", "--quick", "--out", str(tmp_path)]) == 0
    data = _check_results(tmp_path, {w.name for w in bench.WORKLOADS})
    assert data["meta"]["commit"] == bench.source_commit()
    assert {r["layout"] for r in data["rows"]} == {"NCHW", "channels_last"}
    assert {r["threads"] for r in data["rows"]} == {2}  # --quick: the largest default count
    assert all(r["pct_peak"] is None for r in data["rows"])
    out = capsys.readouterr().out
    assert "ratio" in out and "%peak" not in out and f"wrote {tmp_path / 'results.json'}" in out


def test_a_run_stopped_part_way_keeps_its_rows(tmp_path, monkeypatch):
    """results.json is written after every case, marked incomplete until the end."""
    measure = bench.measure
    done = []

    def measure_then_stop(case, *args):
        if done:
            raise KeyboardInterrupt
        done.append(case.workload.name)
        return measure(case, *args)

    monkeypatch.setattr(bench, "measure", measure_then_stop)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["bench", "--tiny", "--quick", "--no-chart", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["complete"] is False
    assert {r["workload"] for r in data["rows"]} == set(done) and len(data["rows"]) == 2  # forward, backward


def test_bench_from_an_installed_package(tmp_path):
    """Only the package, as a wheel installs it, on the path, run from an unrelated folder."""
    site = tmp_path / "site"
    shutil.copytree(Path(roiops.__file__).parent, site / "roiops",
                    ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)

    where = run("-c", "import importlib.util; print(importlib.util.find_spec('roiops').origin)")
    assert Path(where.stdout.strip()) == site / "roiops" / "__init__.py", where.stderr
    result = run("-m", "roiops", "bench", "--tiny", "--quick", "--workload", "roi_pool", "--layouts", "nchw",
                 "--peak-gbps", "10", "--no-chart", "--out", "results")
    assert result.returncode == 0, result.stderr
    assert "roi_pool" in result.stdout and "%peak" in result.stdout
    data = _check_results(work / "results", {"roi_pool"}, chart=False)
    assert {r["layout"] for r in data["rows"]} == {"NCHW"}
    assert data["meta"]["peak_gbps"] == 10 and data["meta"]["peak_source"] == "--peak-gbps"
    assert data["meta"]["commit"] is None  # no checkout around an installed package
    assert all(r["pct_peak"] == pytest.approx(10 * r["gbps"]) for r in data["rows"])


def test_recorded_shapes_are_the_ones_the_cpu_suite_runs():
    """BENCHMARKS.md's CPU figures are compared across time: its shapes table must describe
    the CPU workloads exactly."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    rows = re.findall(r"^\| ([A-Za-z0-9_ -]+) \| (\d+) \| (\d+) \| (\d+)x(\d+) \| 1/(\d+) \| (\d+) \| (\d+)x\d+ \| "
                      r"([^|]+) \| ([^|]+) \|$", text, re.MULTILINE)
    # The mode column starts with the last word of the operator's title ("RoIAlign avg": avg).
    modes = {spec.title.split()[-1]: key for key, spec in bench.OPS.items()}
    assert len(modes) == len(bench.OPS)
    recorded = {(name, modes[mode.split()[0]], int(n), int(c), int(h), int(w), 1 / int(s), int(k), int(p),
                 None if sampling == "-" else int(sampling.split()[0]))
                for name, n, c, h, w, s, k, p, sampling, mode in rows}
    declared = {(w.name, w.op, w.n, w.channels, w.height, w.width, w.scale, w.boxes, w.size,
                 w.sampling_ratio if bench.OPS[w.op].sampled else None)
                for w in bench.WORKLOADS if "cpu" in w.devices}
    assert len(rows) == len(declared) and recorded == declared


def test_help_explains_every_option_and_lists_the_workloads(capsys):
    assert bench.main(["--help"]) == 0
    out = capsys.readouterr().out
    for action in bench.build_parser()._actions:
        assert action.help, action.option_strings
        assert all(option in out for option in action.option_strings)
    for w in bench.WORKLOADS:
        assert f"  {w.name}\n    {bench.describe(w)}" in out
    for name, spec in bench.OPS.items():
        assert f"  {name}: {spec.title}; peer: " in out
    assert "its average RoIAlign: torchvision has no max mode" in out


@pytest.mark.parametrize("argv, message", [
    (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["--threads", "2", "-3"], "argument --threads: must be at least 1, got -3"),
    (["--threads", "two"], "argument --threads: expected a whole number, got 'two'"),
    (["--repeats", "-1"], "argument --repeats: must be at least 1, got -1"),
    (["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["--workload", "box head"], "argument --workload: invalid choice: 'box head'"),
    (["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    (["--layouts", "nhwc"], "argument --layouts: invalid choice: 'nhwc'"),
    (["--dtypes", "float64"], "argument --dtypes: invalid choice: 'float64'"),
    (["--peak-gbps", "0"], "argument --peak-gbps: must be a positive number, got 0"),
    (["--peak-gbps", "fast"], "argument --peak-gbps: expected a number, got 'fast'"),
    (["--device", "cuda", "--threads", "2"], "--threads sets CPU thread counts: it applies to --device cpu only"),
    (["--speed"], "unrecognized arguments: --speed"),
])
def test_bad_options_exit_2_with_one_line(argv, message, tmp_path, capsys):
    assert cli.main(["bench", *argv, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    error = captured.err.strip().splitlines()[-1]
    assert error.startswith("roiops bench: error: ") and message in error
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "out").exists()


def test_out_must_be_a_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert bench.main(["--tiny", "--quick", "--out", str(tmp_path / "file")]) == 2
    assert "--out must be a folder" in capsys.readouterr().err


def _fails_with_one_line(argv, tmp_path, capsys) -> str:
    assert bench.main([*argv, "--tiny", "--quick", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("roiops bench: error: ") and len(captured.err.strip().splitlines()) == 1
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "out").exists()
    return captured.err


def test_without_torchvision(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    err = _fails_with_one_line([], tmp_path, capsys)
    assert "install the torchvision release built for your torch" in err


def test_without_matplotlib(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "--no-chart" in _fails_with_one_line([], tmp_path, capsys)


def test_cuda_without_a_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = _fails_with_one_line(["--device", "cuda"], tmp_path, capsys)
    assert err.startswith("roiops bench: error: --device cuda: torch sees no CUDA device")


def test_a_workload_the_device_does_not_run(monkeypatch, tmp_path, capsys):
    cpu_only = replace(bench.WORKLOADS[0], devices=("cpu",))
    monkeypatch.setattr(bench, "WORKLOADS", [cpu_only])
    assert bench.describe(cpu_only).endswith(" (cpu only)")
    assert bench.main(["--device", "cuda", "--out", str(tmp_path / "out")]) == 2
    assert "none of the chosen workloads runs on --device cuda" in capsys.readouterr().err


# ----------------------------------------------------------------------------- case selection


def _plan(*argv):
    return bench.plan(bench.build_parser().parse_args(list(argv)))


def _layouts(w: bench.Workload) -> int:
    """How many layouts a workload runs in by default: an entry with its own inputs, nchw only."""
    return 1 if bench.OPS[w.op].inputs else 2


def test_cpu_cases_by_default():
    device, cases, repeats = _plan()
    assert device is bench.CPU and repeats == 5
    assert len(cases) == sum(_layouts(w) for w in bench.WORKLOADS) * 2
    first = bench.WORKLOADS[0].name
    assert [(c.workload.name, c.layout, c.dtype, c.threads) for c in cases[:4]] == [
        (first, "NCHW", "float32", 1), (first, "NCHW", "float32", 2),
        (first, "channels_last", "float32", 1), (first, "channels_last", "float32", 2)]
    assert all(c.workload in bench.WORKLOADS for c in cases)  # the declared shapes, unchanged
    _, quick, repeats = _plan("--quick", "--threads", "1", "3")
    assert repeats == 1 and {c.threads for c in quick} == {3}


def test_gpu_cases():
    device, cases, repeats = _plan("--device", "cuda")
    assert device is bench.CUDA and repeats == 50
    assert device.directions == ("forward", "backward", "backward det")
    assert {c.dtype for c in cases} == {"float32", "bfloat16"}
    assert {c.layout for c in cases} == {"NCHW", "channels_last"}
    assert {c.threads for c in cases} == {torch.get_num_threads()}
    assert len(cases) == 2 * sum(_layouts(w) for w in bench.WORKLOADS if "cuda" in w.devices)
    _, cases, repeats = _plan("--device", "cuda", "--dtypes", "float16", "--layouts", "channels_last",
                              "--workload", "mask head", "--repeats", "7", "--tiny")
    assert repeats == 7
    assert [(c.workload, c.layout, c.dtype) for c in cases] == [
        (bench.tiny(_workload("mask head")), "channels_last", "float16")]


def test_select_cases_keeps_each_workload_to_its_devices():
    gpu_only = replace(bench.WORKLOADS[0], name="gpu only", devices=("cuda",))
    both = bench.WORKLOADS[1]
    assert [c.workload for c in bench.select_cases([gpu_only, both], "cpu", ["nchw"], ["float32"], [1])] == [both]
    assert [c.workload for c in bench.select_cases([gpu_only, both], "cuda", ["nchw"], ["float32"], [1])] == [
        gpu_only, both]


# ----------------------------------------------------------------------------- bytes, %peak, rows


def test_covered_cells_counts_each_cell_once_with_a_margin_and_clipped():
    w = bench.Workload("t", 2, 3, 10, 12, 1 / 2, 4, 2)
    boxes = torch.tensor([[0, 4, 4, 8, 8],       # cells 1..5 x 1..5: 25
                          [0, 6, 6, 10, 10],     # 2..6 x 2..6: 25, 16 of them shared with the first
                          [1, -10, 0, 3, 1],     # columns 0..3 (clipped at 0), rows 0..2: 12
                          [1, 20, 16, 30, 30]])  # columns 9..11, rows 7..9 (clipped at the far edge): 9
    assert bench.covered_cells(boxes, w) == 25 + 25 - 16 + 12 + 9


def test_bytes_moved():
    w = bench.Workload("t", 2, 3, 10, 12, 1 / 2, 3, 2)
    # 55 cells x 3 channels x 4 bytes + 36 outputs x 4 bytes + 80 bytes of boxes; the whole
    # 2x3x10x12 gradient is written back
    out = (3, 3, 2, 2)
    assert bench.bytes_moved(w, False, 55, out, 4, 80) == {
        "forward": 660 + 144 + 80, "backward": 144 + 2880, "backward det": 144 + 2880}
    assert bench.bytes_moved(w, True, 55, out, 4, 80) == {  # + an int32 argmax per output
        "forward": 660 + 288 + 80, "backward": 288 + 2880, "backward det": 288 + 2880}
    assert bench.bytes_moved(w, True, 55, out, 2, 80)["backward"] == 36 * 6 + 1440  # bfloat16
    # position-sensitive, 4 channels for a 2x2 output: each bin reads its own channel, so
    # the covered cells are read once per output channel (here 1)
    ps = replace(w, channels=4)
    assert bench.bytes_moved(ps, False, 55, (3, 1, 2, 2), 4, 80) == {
        "forward": 55 * 4 + 12 * 4 + 80, "backward": 12 * 4 + 3840, "backward det": 12 * 4 + 3840}


def test_tiny_keeps_the_channels_a_position_sensitive_op_needs(monkeypatch):
    first = bench.OPS[bench.WORKLOADS[0].op]
    monkeypatch.setitem(bench.OPS, "ps", replace(first, channel_multiple=lambda w: w.size ** 2))
    assert bench.tiny(bench.Workload("ps", 2, 490, 200, 336, 1 / 4, 1024, 7, op="ps")).channels == 8 * 49
    assert bench.tiny(bench.WORKLOADS[0]).channels == 8


def test_result_row_ratio_bandwidth_and_peak():
    case = bench.Case(_workload("box head train"), "NCHW", "bfloat16", 1)
    row = bench.result_row(case, "cuda", "forward", 1e-3, "torchvision", 3e-3, 2_000_000, 4.0, 0.5, None)
    assert row == {**row, "roiops_ms": 1.0, "peer_ms": 3.0, "ratio": 3.0, "gbps": 2.0, "pct_peak": 50.0,
                   "bytes": 2_000_000, "max_diff": 0.5, "device": "cuda", "dtype": "bfloat16",
                   "workload": "box head train", "layout": "NCHW", "direction": "forward"}
    assert row["shape"] == {k: v for k, v in vars(case.workload).items() if k not in ("devices", "op")}
    alone = bench.result_row(case, "cuda", "backward det", 2e-3, "torchvision", None, 2_000_000, None, None,
                             "no bfloat16")
    assert (alone["peer_ms"], alone["ratio"], alone["pct_peak"], alone["gbps"]) == (None, None, None, 1.0)
    assert alone["peer_error"] == "no bfloat16"


def test_peak_bandwidth_of_a_gpu():
    gbps, source = bench.peak_from_properties("NVIDIA H100 80GB HBM3", 2_619_000, 5120)
    assert gbps == pytest.approx(3352.32) and source == "memory clock x bus width"
    assert bench.peak_from_properties("NVIDIA H100 PCIe", 0, 0) == (2000.0, "table (H100 PCIe)")
    assert bench.peak_from_properties("NVIDIA L4", 0, 0) == (300.0, "table (L4)")
    assert bench.peak_from_properties("NVIDIA L40S", 0, 0) == (864.0, "table (L40S)")
    assert bench.peak_from_properties("Some GPU", 0, 0) is None


# ----------------------------------------------------------------------------- the GPU flow on CPU


class _Probe(torch.autograd.Function):
    """2 * the map's top-left 2x2 cells; its backward records roiops' deterministic switch."""
    switch: list = []

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return 2 * x[:, :, :2, :2]

    @staticmethod
    def backward(ctx, grad):
        _Probe.switch.append(roiops.config.deterministic_backward)
        g = grad.new_zeros(ctx.shape)
        g[:, :, :2, :2] = 2 * grad
        return g


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x[:, :, :2, :2]

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("no backward for bfloat16\nmore detail")


def _no_forward(module, w, x, b):
    raise RuntimeError("no forward for bfloat16\nmore detail")


@pytest.mark.parametrize("peer_call, failing", [
    (lambda m, w, x, b: 2 * x[:, :, :2, :2], ()),
    (lambda m, w, x, b: _NoBackward.apply(x), ("backward",)),
    (_no_forward, ("forward", "backward")),
])
def test_gpu_suite_flow_on_cpu_tensors(monkeypatch, peer_call, failing):
    """The GPU suite's directions and timing loop, on the CPU with the wall clock and a
    probe op: roiops and the peer alternate after their warm-up calls, 'backward det' times
    roiops' backward alone with the deterministic switch on (and restores it), a peer that
    fails leaves its columns empty with the reason, and every row gets the bytes model."""
    calls = []

    def ours(w, x, b):
        calls.append("roiops")
        return _Probe.apply(x)

    def peer(m, w, x, b):
        calls.append("peer")
        return peer_call(m, w, x, b)

    monkeypatch.setitem(bench.OPS, "probe", bench.Bench("probe", "probe", ours, bench.Peer("math", peer)))
    monkeypatch.setattr(roiops.config, "deterministic_backward", False)
    _Probe.switch.clear()
    device = replace(bench.CUDA, name="cpu", timer=bench.wall_clock, warmup=2)
    w = bench.Workload("probe", 2, 3, 8, 8, 1 / 4, 4, 2, devices=("cuda",), op="probe")
    rows = bench.measure(bench.Case(w, "channels_last", "float32", 1), device, 3, {"math": math}, 0.5, "alternate")

    assert [r["direction"] for r in rows] == ["forward", "backward", "backward det"]
    if not failing:  # setup, 2 warm-ups each, then alternating
        assert calls == ["roiops", "peer"] + ["roiops"] * 2 + ["peer"] * 2 + ["roiops", "peer"] * 3
    assert _Probe.switch == [False] * 5 + [True] * 5  # backward: warm-ups and repeats; then backward det
    assert roiops.config.deterministic_backward is False
    cells = bench.covered_cells(bench.draw_boxes(w, _seeded_after_map(w)), w)
    nbytes = bench.bytes_moved(w, False, cells, (2, 3, 2, 2), 4, 4 * 5 * 4)
    for r in rows:
        assert r["roiops_ms"] > 0 and r["bytes"] == nbytes[r["direction"]]
        assert r["pct_peak"] == pytest.approx(100 * r["gbps"] / 0.5)
        assert r["gbps"] == pytest.approx(r["bytes"] / (r["roiops_ms"] / 1e3) / 1e9)
        has_peer = r["direction"] != "backward det"
        timed_peer = has_peer and r["direction"] not in failing
        assert (r["peer_ms"] is not None) == timed_peer and (r["ratio"] is not None) == timed_peer
        assert r["max_diff"] == (0.0 if timed_peer else None)
        assert r["peer"] == ("math" if has_peer else None)
        assert r["peer_error"] == (f"no {failing[0]} for bfloat16" if has_peer and not timed_peer else None)
    text = bench.table(rows, threads=False)
    assert "backward det" in text and "%peak" in text and " thr " not in text
    assert " thr " in bench.table(rows, threads=True)


def _seeded_after_map(w):
    """The generator as measure leaves it after drawing the map: the boxes come next."""
    g = torch.Generator().manual_seed(0)
    torch.randn(w.n, w.channels, w.height, w.width, generator=g)
    return g


def test_gpu_suite_end_to_end_on_cpu_tensors(monkeypatch, tmp_path, capsys):
    """`--device cuda` as far as it goes without a GPU: the CUDA checks and device queries
    answered by stand-ins, the cases run on CPU tensors with the wall clock."""
    from roiops._requirements import triton_too_old

    if triton_too_old():
        pytest.skip(triton_too_old())
    stand_in = replace(bench.CUDA, name="cpu", timer=bench.wall_clock, warmup=1)
    monkeypatch.setattr(bench, "CUDA", stand_in)
    monkeypatch.setitem(bench.DEVICES, "cuda", stand_in)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(
        name="NVIDIA H100 PCIe", memory_clock_rate=0, memory_bus_width=0))
    assert bench.main(["--device", "cuda", "--tiny", "--quick", "--workload", "box head max",
                       "--layouts", "nchw", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["gpu"] == "NVIDIA H100 PCIe" and meta["peak_gbps"] == 2000.0
    assert meta["peak_source"] == "table (H100 PCIe)" and meta["warmup"] == 1
    assert meta["versions"]["triton"] and meta["versions"]["cuda"] == torch.version.cuda
    assert [(r["dtype"], r["direction"]) for r in rows] == [
        (dtype, direction) for dtype in ("float32", "bfloat16") for direction in bench.CUDA.directions]
    assert bench.CUDA.directions == ("forward", "backward", "backward det")
    assert all(r["pct_peak"] == pytest.approx(r["gbps"] / 20) for r in rows)
    assert all((r["peer"] is None) == (r["direction"] == "backward det") for r in rows)
    assert all(r["peer_ms"] is None and r["ratio"] is None for r in rows if r["direction"] == "backward det")
    assert all(r["max_diff"] is None for r in rows)  # the max workload's peer computes the average
    assert (tmp_path / "ratios.png").read_bytes()[:8] == PNG_MAGIC
    out = capsys.readouterr().out
    assert out.startswith("device: NVIDIA H100 PCIe, peak 2000 GB/s (table (H100 PCIe))\n")
    assert "%peak" in out and " thr " not in out


def test_a_peer_can_take_the_boxes_in_the_maps_dtype(monkeypatch):
    """torchvision wants boxes of the map's dtype; roiops takes float32 boxes for a half map."""
    seen = {}

    def op(who):
        def call(*args):
            x, b = args[-2:]
            seen[who] = b.dtype
            return 2 * x[:, :, :2, :2]
        return call

    monkeypatch.setitem(bench.OPS, "probe", bench.Bench(
        "probe", "probe", op("roiops"), bench.Peer("math", op("peer"), boxes_in_input_dtype=True)))
    w = bench.Workload("probe", 1, 2, 4, 4, 1 / 4, 2, 2, op="probe")
    bench.measure(bench.Case(w, "NCHW", "bfloat16", 1), bench.CPU, 1, {"math": math}, None, "alternate")
    assert seen == {"roiops": torch.float32, "peer": torch.bfloat16}


def test_an_entry_with_its_own_inputs(monkeypatch, tmp_path, capsys):
    """An entry that takes no map (the mask operators): its Inputs draw the tensors both
    calls take, in the case's dtype; it is timed forward only (no backward, no 'backward
    det'), as nchw only; its bytes and its --help text are its Inputs'."""
    seen = {}

    def draw(w, g, dtype):
        return torch.rand(w.boxes, w.size, generator=g).to(dtype), torch.arange(w.boxes)

    def op(who):
        def call(*args):
            seen[who] = args[-2:]
            return 2 * args[-2]
        return call

    inputs = bench.Inputs(draw, lambda w, drawn, out: 1000 + out.numel(), lambda w: f"{w.boxes} rows of {w.size}")
    monkeypatch.setitem(bench.OPS, "probe", bench.Bench("probe", "Probe", op("roiops"), bench.Peer("math", op("peer")),
                                                        sampled=False, inputs=inputs))
    w = bench.Workload("probe", 1, 1, 4, 4, 1.0, 3, 5, op="probe")
    assert bench.describe(w) == "Probe: 3 rows of 5"
    both = ["nchw", "channels_last"]
    assert [(c.layout, c.dtype) for c in bench.select_cases([w], "cuda", both, ["float32", "bfloat16"], [1])] == [
        ("NCHW", "float32"), ("NCHW", "bfloat16")]
    assert bench.select_cases([w], "cpu", ["channels_last"], ["float32"], [1]) == []
    device = replace(bench.CUDA, name="cpu", timer=bench.wall_clock, warmup=1)
    rows = bench.measure(bench.Case(w, "NCHW", "bfloat16", 1), device, 2, {"math": math}, None, "alternate")
    assert [r["direction"] for r in rows] == ["forward"]
    assert seen["roiops"][0].dtype == torch.bfloat16 and seen["roiops"][1].dtype == torch.int64
    assert all(a is b for a, b in zip(seen["roiops"], seen["peer"]))  # the same tensors
    (row,) = rows
    assert row["bytes"] == 1015 and row["max_diff"] == 0.0 and row["ratio"] is not None and row["peer"] == "math"
    # the mask operators' entries, given only channels_last, say why nothing runs
    assert bench.main(["--workload", "mask targets", "--layouts", "channels_last", "--out", str(tmp_path)]) == 2
    assert "the mask operators run as nchw only" in capsys.readouterr().err


def test_timing_order():
    """--order alternate interleaves the libraries call by call; back-to-back runs each
    library's calls in a row."""
    assert bench.timing_order(["roiops", "peer"], 3, "alternate") == ["roiops", "peer"] * 3
    assert bench.timing_order(["roiops", "peer"], 3, "back-to-back") == ["roiops"] * 3 + ["peer"] * 3
    assert bench.timing_order(["roiops"], 2, "back-to-back") == ["roiops"] * 2
    assert bench.timing_order(["roiops", "peer"], 3, "alternate-awake") == ["roiops", "peer"] * 3


def test_alternate_awake_wakes_the_threads_before_each_timed_call(tmp_path, monkeypatch):
    """--order alternate-awake: a parallel op on every CPU thread right before each timed
    call, none before untimed ones."""
    events = []
    timer = bench.CPU.timer
    monkeypatch.setattr(bench, "CPU", replace(bench.CPU, timer=lambda fn: events.append("timed") or timer(fn)))
    monkeypatch.setitem(bench.DEVICES, "cpu", bench.CPU)
    monkeypatch.setattr(bench, "wake_threads", lambda: events.append("wake"))
    assert bench.main(["--tiny", "--workload", "roi_pool", "--layouts", "nchw", "--threads", "1", "--repeats", "3",
                       "--order", "alternate-awake", "--no-chart", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["order"] == "alternate-awake"
    assert len(events) == 2 * 2 * 2 * 3 and events == ["wake", "timed"] * (len(events) // 2)


def test_bench_back_to_back(tmp_path, monkeypatch):
    """The calls a case times run in the order --order names, and results.json says which."""
    calls = []
    timer = bench.CPU.timer

    def record(fn):
        calls.append(fn)
        return timer(fn)

    monkeypatch.setattr(bench, "CPU", replace(bench.CPU, timer=record))
    monkeypatch.setitem(bench.DEVICES, "cpu", bench.CPU)
    assert bench.main(["--tiny", "--workload", "roi_pool", "--layouts", "nchw", "--threads", "1", "--repeats", "3",
                       "--order", "back-to-back", "--no-chart", "--out", str(tmp_path)]) == 0
    data = _check_results(tmp_path, {"roi_pool"}, chart=False)
    assert data["meta"]["order"] == "back-to-back"
    forward = calls[:6]  # the forward direction's timed calls: roiops' three, then the peer's three
    assert forward[0] is forward[1] is forward[2] and forward[3] is forward[4] is forward[5]
    assert forward[0] is not forward[3]


def test_cpu_model_names_family_model_and_caches(tmp_path):
    """The CPU line of the bench: the first CPU's model name, family and model numbers, and
    its L2 and L3 sizes (no instruction cache); the model name alone where Linux gives
    nothing more."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n\n"
        "processor\t: 1\ncpu family\t: 99\nmodel\t\t: 1\nmodel name\t: Other\n")
    caches = tmp_path / "sys/devices/system/cpu/cpu0/cache"
    for index, (level, kind, size) in enumerate([("1", "Data", "32K"), ("1", "Instruction", "32K"),
                                                  ("2", "Unified", "1024K"), ("3", "Unified", "32768K")]):
        (caches / f"index{index}").mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (caches / f"index{index}" / name).write_text(value + "\n")
    assert bench.cpu_model(tmp_path) == "AMD EPYC (family 25, model 17; L2 1024K, L3 32768K)"
    (tmp_path / "proc/cpuinfo").write_text("model name\t: Plain CPU\n")
    shutil.rmtree(tmp_path / "sys")
    assert bench.cpu_model(tmp_path) == "Plain CPU"


def test_source_commit(tmp_path):
    """The commit of the timed tree, marked dirty when a tracked file differs from it; None
    outside a git checkout."""
    assert bench.source_commit(tmp_path) is None

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.py").write_text("1\n")
    git("add", "a.py")
    git("commit", "-q", "-m", "a")
    head = git("rev-parse", "--short=12", "HEAD")
    assert bench.source_commit(tmp_path) == head and len(head) == 12
    (tmp_path / "new.py").write_text("")  # untracked: not what was timed
    assert bench.source_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("2\n")
    assert bench.source_commit(tmp_path) == head + "-dirty"


# ----------------------------------------------------------------------------- the report


def _report():
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(workload, layout, threads, direction, roiops_ms, peer_ms, peer="torchvision", **extra):
    return {"workload": workload, "layout": layout, "dtype": "float32", "threads": threads, "direction": direction,
            "roiops_ms": roiops_ms, "peer": peer, "peer_ms": peer_ms,
            "ratio": None if peer_ms is None else peer_ms / roiops_ms, **extra}


def test_report_tables_a_result_file(tmp_path):
    """A CPU results.json becomes its setup line and a table of roiops ms (ratio) per
    workload, a column per layout, thread count and direction, '-' where no row is."""
    meta = {"date": "2026-01-02", "device": "cpu", "cpu": "AMD EPYC (family 25, model 17; L2 1024K, L3 32768K)",
            "gpu": None, "host": {"os": "Linux-6.1", "logical_cpus": 2, "load_average_1min": 1.25},
            "commit": "0123456789ab", "versions": {"python": "3.11.7", "torch": "2.14.1", "torchvision": "0.29.1"},
            "threads": [1, 2], "repeats": 5, "warmup": 1, "timer": "time.perf_counter around each call",
            "order": "alternate-awake"}
    rows = [_row("box head train", "NCHW", 1, "forward", 54.53, 491.2),
            _row("box head train", "NCHW", 1, "backward", 73.8, 1043.5),
            _row("box head train", "NCHW", 2, "forward", 0.5, 2.0),
            _row("box head train", "NCHW", 2, "backward", 1000.0, 500.0),
            _row("rotated box head", "channels_last", 2, "backward", 44.0, 31.9, peer="roiops")]
    (tmp_path / "small.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    text = "# Title\n\n<!-- table: small.json -->\nstale\n<!-- end table -->\n\nAfter.\n"
    assert _report().update(text, tmp_path) == (
        "# Title\n\n<!-- table: small.json -->\n"
        "**Setup:** 2026-01-02, commit 0123456789ab, AMD EPYC (family 25, model 17; L2 1024K, L3 32768K); "
        "Linux-6.1, 2 logical CPUs, load average 1.2 at the start. python 3.11.7, torch 2.14.1, torchvision 0.29.1. "
        "`--order alternate-awake`; median of 5 timed calls after 1 warm-up; time.perf_counter around each call.\n"
        "\n"
        "| workload | peer | NCHW 1 thr forward | NCHW 1 thr backward | NCHW 2 thr forward | NCHW 2 thr backward "
        "| channels_last 2 thr backward |\n"
        "|---|---|---:|---:|---:|---:|---:|\n"
        "| box head train | torchvision | 54.53 (9.01x) | 73.8 (14.1x) | 0.5 (4.0x) | 1000 (0.5x) | - |\n"
        "| rotated box head | roiops | - | - | - | - | 44.0 (0.725x) |\n"
        "<!-- end table -->\n\nAfter.\n")


def test_report_tables_a_transcribed_file(tmp_path):
    """A file transcribed from earlier runs: columns a run did not print are left out, each
    cell names its run, the setup line names each run's date and commit once (what the run
    was stays in the file), and the notes follow the table."""
    meta = {"date": "2026-01-03", "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "commit": None,
            "versions": {"torch": "2.11.0", "triton": "3.6.0"}, "timer": "a pair of CUDA events around each call",
            "order": "alternate", "transcribed": "from three runs",
            "sources": {"a": {"date": "2026-01-01", "what": "run a", "statistic": "median of 20"},
                        "b": {"date": "2026-01-03", "commit": "0123abc", "what": "run b", "statistic": "median of 10"},
                        "c": {"date": "2026-01-01", "what": "run c", "statistic": "median of 20"}}}
    rows = [{"workload": "mask head", "layout": "NCHW", "dtype": "float32", "direction": "forward", "roiops_ms": 0.593,
             "peer": "torchvision", "peer_ms": 0.451, "ratio": 0.76, "source": "b"},
            {"workload": "mask head", "layout": "NCHW", "dtype": "float32", "direction": "backward det",
             "roiops_ms": 8.9, "source": "c", "note": "a note"},
            {"workload": "mask head", "layout": "NCHW", "dtype": "float32", "direction": "backward",
             "roiops_ms": 1.56, "peer": "torchvision", "ratio": 0.8, "source": "a"}]
    (tmp_path / "gpu.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    assert _report().render(*_report().load(tmp_path / "gpu.json"), "gpu.json") == (
        "**Setup:** 2026-01-03, NVIDIA H100 80GB HBM3. torch 2.11.0, triton 3.6.0. `--order alternate`; "
        "a pair of CUDA events around each call. Transcribed from three runs. Runs in brackets: [a] [c] 2026-01-01; "
        "[b] 2026-01-03, commit 0123abc (what each timed: `sources` in benchmarks/results/gpu.json).\n"
        "\n"
        "| workload | forward | backward | backward det |\n"
        "|---|---:|---:|---:|\n"
        "| mask head | 0.593 (0.76x) [b] | 1.56 (0.8x) [a] | 8.9 [c] |\n"
        "\n"
        "- mask head, NCHW, backward det: a note.\n")


def test_report_summary_judges_each_operator_on_each_device(tmp_path):
    """The summary: a row per operator and device, its forward and backward ratio ranges at
    the judged setting (float32; 2 threads on the CPU) and its target met or missed, both
    computed from the rows: per layout for roi_align, at 1 thread where a target says so,
    '-' where the operator has no target on the device."""
    def meta(device, gpu=None):
        return {"date": "2026-01-02", "device": device, "gpu": gpu, "commit": "0123456789ab",
                "versions": {"torch": "2.14.1"}, "timer": "a timer", "order": "alternate-awake"}

    cpu = [  # roi_pool: >= 10x forward, >= 5x backward
        _row("roi_pool", "NCHW", 2, "forward", 1.0, 12.0), _row("roi_pool", "channels_last", 2, "forward", 1.0, 20.0),
        _row("roi_pool", "NCHW", 2, "backward", 1.0, 4.0), _row("roi_pool", "channels_last", 2, "backward", 1.0, 6.0),
        _row("roi_pool", "NCHW", 1, "forward", 1.0, 2.0),  # 1 thread: neither in the range nor judged
        _row("roi_pool", "NCHW", 2, "forward", 1.0, 1.0, dtype="bfloat16"),  # not the judged dtype
        # roi_align: >= 5x NCHW, >= 10x channels_last, >= 4x at 1 thread forward; >= 15x backward
        _row("box head train", "NCHW", 2, "forward", 1.0, 6.0),
        _row("box head train", "channels_last", 2, "forward", 1.0, 11.0),
        _row("box head train", "NCHW", 1, "forward", 1.0, 3.0),
        _row("box head train", "NCHW", 2, "backward", 1.0, 16.0),
        _row("box head max", "NCHW", 2, "forward", 1.0, 6.0), _row("box head max", "NCHW", 1, "forward", 1.0, 4.5),
        _row("box head max", "channels_last", 2, "backward", 1.0, 15.0),  # at the target: met
        _row("rotated box head", "NCHW", 2, "forward", 1.0, 0.7, peer="roiops"),  # >= 1 / 1.5 both ways
        _row("rotated box head", "NCHW", 2, "backward", 1.0, 0.66, peer="roiops")]
    gpu = [_row("rotated box head", "NCHW", None, "forward", 1.0, 0.9, peer="roiops"),
           _row("rotated box head", "NCHW", None, "backward", 1.0, 0.8, peer="roiops"),
           _row("rotated box head", "NCHW", None, "backward det", 3.0, None, peer=None),
           _row("roi_pool", "NCHW", None, "forward", 1.0, 1.2), _row("roi_pool", "NCHW", None, "backward", 1.0, 0.5)]
    (tmp_path / "cpu.json").write_text(json.dumps({"meta": meta("cpu"), "rows": cpu}))
    (tmp_path / "gpu.json").write_text(json.dumps({"meta": meta("cuda", "Some GPU"), "rows": gpu}))
    text = ("<!-- summary -->\nstale\n<!-- end summary -->\n"
            "<!-- table: cpu.json -->\n<!-- end table -->\n<!-- table: gpu.json -->\n<!-- end table -->\n")
    summary = re.search(r"<!-- summary -->\n(.*)<!-- end summary -->", _report().update(text, tmp_path), re.DOTALL)[1]
    table = summary[summary.index("| operator"):].splitlines()
    assert table[0] == "| operator | device | forward | backward | target: forward / backward | met |"
    assert sorted(table[2:]) == sorted([
        "| roi_pool | CPU | 12.0-20.0x | 4.0-6.0x | >= 10x / >= 5x | missed: backward |",
        "| roi_pool | Some GPU | 1.2x | 0.5x | - | - |",
        "| roi_align | CPU | 6.0-11.0x | 16.0x | >= 10x channels_last, >= 5x NCHW, >= 4x at 1 thread / >= 15x "
        "| missed: forward |",
        "| roi_align max | CPU | 6.0x | 15.0x | >= 10x channels_last, >= 5x NCHW, >= 4x at 1 thread / >= 15x | met |",
        "| roi_align_rotated | CPU | 0.7x | 0.66x | >= 0.67x / >= 0.67x | missed: backward |",
        "| roi_align_rotated | Some GPU | 0.9x | 0.8x | >= 0.67x / >= 0.67x | met |"])
    # an operator's rows stand together, its devices in the order of the tables
    operators = [line.split(" | ")[0] for line in table[2:]]
    assert operators == sorted(operators, key=operators.index)
    assert table.index("| roi_pool | Some GPU | 1.2x | 0.5x | - | - |") == 1 + table.index(
        "| roi_pool | CPU | 12.0-20.0x | 4.0-6.0x | >= 10x / >= 5x | missed: backward |")


def test_report_wants_the_files_benchmarks_md_names(tmp_path):
    with pytest.raises(SystemExit, match="asks for gone.json"):
        _report().update("<!-- table: gone.json -->\n<!-- end table -->\n", tmp_path)



def test_benchmarks_md_tables_are_those_of_the_result_files(capsys):
    """BENCHMARKS.md's summary and tables are regenerated from benchmarks/results/, not
    edited by hand, and it stays a short report: its table rows are one per declared workload
    and result (the checks here and above), its other lines few."""
    assert _report().main(["--check"]) == 0, capsys.readouterr().err
    text = (ROOT / "BENCHMARKS.md").read_text()
    prose = [line for line in text.splitlines() if not line.startswith("|")]
    assert text.count("<!-- summary -->") == 1 and len(prose) <= 90
    assert {name for name in re.findall(r"<!-- table: (\S+) -->", text)} == {
        p.name for p in (ROOT / "benchmarks" / "results").glob("*.json")}


def test_result_files_name_declared_workloads():
    """Every row of benchmarks/results/ names a declared workload (which names its operator)
    with the workload's recorded shape."""
    declared = {w.name: w.shape() for w in bench.WORKLOADS}
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        rows = json.loads(path.read_text())["rows"]
        assert rows, path.name
        for r in rows:
            assert r["workload"] in declared and "op" not in r, (path.name, r["workload"])
            assert "shape" not in r or r["shape"] == declared[r["workload"]], (path.name, r["workload"])