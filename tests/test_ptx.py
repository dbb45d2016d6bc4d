"""The Triton kernels as the GPU runs them, checked without a GPU.

Every kernel variant the launchers of roiops.triton can produce (each dtype, mode and
flag, and each memory layout in float32) is compiled for sm_90 as a launch would
compile it, through ptxas, and its PTX must hold only instructions whose results equal
those of Triton's interpreter (numpy, what tests/test_triton.py runs without a GPU) and
of the CPU kernels: the bin edges and grid sizes come from floor/ceil of divided
coordinates, so one ulp anywhere can move them. ptxas's register count of each variant
is checked too (MAX_PER_BOX_REGISTERS): too many registers cut how many programs an SM
runs at once. The Makefile runs this file under a second Triton too: the same source
compiles to different PTX from one Triton release to the next.

Compiling needs no GPU. It runs in a subprocess (this file as a script) because
tests/conftest.py switches this process to the interpreter when there is no GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Variants per kernel for the launchers' grid below (4 dtypes in NCHW and float32 in
# channels_last, x the flags a kernel takes). Update it with the launchers: it keeps a
# broken enumeration from passing.
EXPECTED_VARIANTS = {
    "_align_fwd_kernel": 20,                # x aligned x avg/max
    "_align_bwd_atomic_kernel": 20,         # x aligned x avg/max
    "_align_bwd_gather_kernel": 20,         # x aligned x avg/max (CF is fixed; layouts differ in unit strides)
    "_align_rois_bwd_kernel": 20,           # x aligned x avg/max
    "_align_fwd_levels_kernel": 10,         # x aligned
    "_align_bwd_atomic_levels_kernel": 10,  # x aligned
    "_align_bwd_gather_levels_kernel": 10,  # x aligned
    "_pool_fwd_kernel": 10,                 # x caffe/continuous
    "_pool_bwd_atomic_kernel": 5,
    "_pool_bwd_gather_kernel": 5,
    "_align_tiles_kernel": 8,               # only rois: aligned x one/multi-level x float32/float64 rois
    "_pool_footprint_kernel": 3,            # only argmax and rois: float32 rois x layout, float64 rois
    "_rotated_fwd_kernel": 10,              # x aligned
    "_rotated_bwd_atomic_kernel": 10,       # x aligned
    "_rotated_bwd_ordered_kernel": 10,      # x aligned (layouts differ in unit strides)
    "_riroi_blend_kernel": 10,              # x forward/adjoint (RiRoIAlign's sampling is the kernels above)
}
EXPECTED_VARIANTS |= {"_ps_align_fwd_kernel": 5, "_ps_align_bwd_kernel": 5, "_ps_align_bwd_atomic_kernel": 5,
                      "_ps_pool_fwd_kernel": 5, "_ps_pool_bwd_kernel": 5, "_ps_pool_bwd_atomic_kernel": 5}
EXPECTED_VARIANTS |= {"_prroi_fwd_kernel": 5, "_prroi_bwd_atomic_kernel": 5,
                      "_prroi_bwd_gather_kernel": 5,  # CF is fixed; layouts differ in unit strides
                      "_prroi_tiles_kernel": 2,       # only rois: float32/float64
                      "_prroi_rois_bwd_kernel": 5}
EXPECTED_VARIANTS |= {"_deform_fwd_kernel": 10,         # x with/without offset
                      "_deform_bwd_atomic_kernel": 10,  # x with/without offset
                      "_deform_bwd_gather_kernel": 10,  # x with/without offset (CF is fixed)
                      "_deform_tiles_kernel": 4,        # only rois and offset: float32/float64 x with/without
                      "_deform_offset_grad_kernel": 5}
EXPECTED_VARIANTS |= {"_bezier_fwd_kernel": 10,         # x aligned
                      "_bezier_bwd_atomic_kernel": 10,  # x aligned
                      "_bezier_bwd_gather_kernel": 10,  # x aligned (CF is fixed; layouts differ in unit strides)
                      "_bezier_tiles_kernel": 4}        # only rois: float32/float64 x aligned
EXPECTED_VARIANTS |= {"_border_fwd_kernel": 5, "_border_bwd_atomic_kernel": 5,
                      "_border_bwd_ordered_kernel": 5}  # layouts differ in unit strides
EXPECTED_VARIANTS |= {"_paste_kernel": 16,              # masks' dtype x binary x window (no layouts)
                      "_paste_torchvision_kernel": 8,   # masks' dtype x fused
                      "_targets_kernel": 10}            # float masks x aligned, and uint8/bool masks x aligned
# Point clouds: no layouts; the points' dtype, and for RoIAwarePool3d the features' too
# (their own dtype or another: float64 beside half/float32 points, float16 beside float64).
EXPECTED_VARIANTS |= {"_in_boxes_kernel": 8,    # x first/all boxes
                      "_aware_fwd_kernel": 16,  # x other features' dtype x max/avg
                      "_aware_bwd_kernel": 16,  # x other features' dtype x max/avg
                      "_point_fwd_kernel": 4,
                      "_point_bwd_kernel": 4}

# Kernels whose fused multiply-adds are explicit (tl.fma), as the CPU kernels' std::fma: the
# mask pasting reproduces ATen's fused arithmetic. A variant whose label says FUSED=False
# must hold none.
FMA_KERNELS = ("_paste_kernel", "_paste_torchvision_kernel")

# ----------------------------------------------------------------------------- the rules

FLOAT_TYPES = {"f16", "f16x2", "bf16", "bf16x2", "f32", "f64", "tf32", "e4m3", "e5m2", "e4m3x2", "e5m2x2",
               "e2m1x2", "e2m3x2", "e3m2x2", "ue8m0x2"}
INT_TYPES = {f"{s}{n}" for s in "sub" for n in (8, 16, 32, 64)}
ROUNDINGS = {"rn", "rz", "rm", "rp", "rna", "rs", "rni", "rzi", "rmi", "rpi"}
# Float ops that are exact (moves, compares, selects, sign ops) or rounded per IEEE with
# the modifier checked below. Any other float instruction fails until reviewed.
EXACT_FLOAT_OPS = {"mov", "ld", "ldu", "st", "shfl", "setp", "set", "selp", "slct", "testp", "neg", "abs", "copysign"}
ROUNDED_FLOAT_OPS = {"add", "sub", "mul", "div", "rcp", "sqrt"}


def _width(t: str) -> int:
    return 64 if t.endswith("64") else 32 if t.endswith("32") else 16 if ("16" in t) else 8


def instruction_problem(opcode: str) -> str | None:
    """Why a PTX instruction (its dotted opcode) can give other bits than the interpreter
    and the CPU kernels, or None."""
    base, *mods = opcode.split(".")
    if "approx" in mods or "full" in mods:
        # div.full, rcp/sqrt/ex2/lg2/sin/cos .approx: a few ulp off (Triton's float32 `/`).
        return "approximate result (IEEE and numpy round correctly)"
    if "ftz" in mods:
        return "flushes subnormals to zero (numpy and the CPU keep them: ceil(1e-40) is 1, not 0)"
    floats = [m for m in mods if m in FLOAT_TYPES]
    if not floats:
        return None  # integer, bitwise, predicate or untyped
    rounding = [m for m in mods if m in ROUNDINGS]
    if base in ("fma", "mad"):
        return "fused multiply-add: one rounding where the interpreter and the CPU round twice"
    if base in ROUNDED_FLOAT_OPS:
        if rounding != ["rn"]:
            # Without .rn ptxas may contract a mul and an add into an fma
            # (LAUNCH_OPTS' enable_fp_fusion=False is what writes the .rn).
            return "float arithmetic without an explicit .rn (round to nearest even)"
        return None
    if base == "cvt":
        types = [m for m in mods if m in FLOAT_TYPES or m in INT_TYPES]
        if len(types) != 2:
            return "unrecognised conversion"
        dst, src = types
        if {"sat", "satfinite", "relu"} & set(mods):
            return "clamping conversion"
        if src in FLOAT_TYPES and dst in INT_TYPES:
            # .to(int) truncates; in range, numpy's astype does the same. tl.floor/ceil
            # are float-to-float (cvt.rmi.f32.f32), checked below.
            return None if rounding == ["rzi"] else "float-to-int conversion other than truncation (.rzi)"
        if src in INT_TYPES:
            return None if rounding == ["rn"] else "int-to-float conversion not rounded to nearest even"
        if dst == src:
            # floor, ceil, trunc, rint: exact.
            return None if rounding in (["rmi"], ["rpi"], ["rzi"], ["rni"]) else "unexpected float rounding"
        if _width(dst) > _width(src) and not rounding:
            return None  # widening: exact
        return None if rounding == ["rn"] else "narrowing conversion not rounded to nearest even"
    if base in ("min", "max"):
        # PTX min/max return the number when one operand is NaN, as the interpreter's
        # tl.minimum/tl.maximum do (np.fmin/np.fmax for the default PropagateNan.NONE;
        # test_triton.py::test_float_min_max_return_the_number). Only box geometry goes
        # through them, and NaN reaches it only in a masked row (a spatial_scale beyond
        # float32's range makes its origin 0 * inf): the number keeps that row's sampling
        # grid empty and its outputs 0, where the .NaN forms would give NaN outputs.
        return None if set(mods) <= {"f32", "f64", "f16", "bf16"} else "min/max other than the NaN-ignoring form"
    if base in ("atom", "red"):
        # Only the non-deterministic backward scatters with float atomics: its order, and
        # so its last bits, vary by design; it is compared within tolerance.
        return None if "add" in mods else "float atomic other than add"
    if base in EXACT_FLOAT_OPS:
        return None
    return "float instruction not reviewed for exactness"


_GUARD = re.compile(r"^@!?%\w+\s+")


def ptx_problems(ptx: str) -> list[tuple[int, str, str]]:
    """(line number, instruction, why) for every instruction of a PTX module that breaks
    the rules."""
    found = []
    for n, raw in enumerate(ptx.splitlines(), 1):
        line = raw.split("//", 1)[0].strip()
        line = _GUARD.sub("", line.lstrip("{").strip())
        if not line or line[0] in ".}$" or line.endswith(":"):
            continue  # directive, brace, label
        opcode = line.split()[0].rstrip(";")
        why = instruction_problem(opcode)
        if why:
            found.append((n, line, why))
    return found


def test_rules_on_known_instructions():
    """The checker itself, on instructions seen in (or once in) the kernels' PTX."""
    ok = ["div.rn.f32", "div.rn.f64", "add.rn.f32", "mul.rn.f64", "sub.rn.f32", "cvt.rzi.s32.f32",
          "cvt.rzi.s64.f64", "cvt.rmi.f32.f32", "cvt.rpi.f64.f64", "cvt.rn.f32.s32", "cvt.rn.f64.u32",
          "cvt.rn.bf16x2.f32", "cvt.rn.f16.f32", "cvt.rn.f32.f64", "cvt.f32.bf16", "cvt.f64.f32", "min.f32",
          "max.f64", "setp.nan.f32", "selp.f32", "abs.f64", "neg.f32", "atom.global.gpu.relaxed.add.f32",
          "mad.lo.s32", "mad.wide.u32", "mul.lo.s64", "add.s64", "cvt.u64.u32", "ld.global.b32", "ret"]
    bad = ["div.full.f32", "div.approx.f32", "rcp.approx.ftz.f64", "sqrt.approx.f32", "ex2.approx.f32",
           "lg2.approx.f32", "mul.f32", "add.f32", "add.rz.f32", "fma.rn.f32", "mad.rn.f64", "cvt.rmi.ftz.f32.f32",
           "cvt.rni.s32.f32", "cvt.rmi.s32.f32", "cvt.rz.f16.f32", "cvt.f32.s32", "cvt.sat.f32.f32",
           "min.NaN.f32", "max.xorsign.abs.f32", "tanh.approx.f32", "atom.global.max.f32", "fma.rn.f16x2"]
    assert [op for op in ok if instruction_problem(op)] == []
    assert [op for op in bad if not instruction_problem(op)] == []
    ptx = "\t@%p1 div.full.f32 \t%r1, %r2, %r3;\n$L__BB0_1:\n\t.reg .b32 %r<3>;\n\tdiv.rn.f32 %r1, %r2, %r3; // x\n"
    assert [(n, why) for n, _, why in ptx_problems(ptx)] == [(1, instruction_problem("div.full.f32"))]


# ----------------------------------------------------------------------------- the variants

@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Compile every variant in a subprocess; its manifest (variants.json) and PTX files."""
    from roiops._requirements import triton_too_old

    if triton_too_old():  # a Triton roiops refuses: nothing to check
        pytest.skip(triton_too_old())
    out = tmp_path_factory.mktemp("ptx")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(out / "cache")  # compile for real, not from an earlier run
    start = time.time()
    r = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=1800,
                       cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    manifest = json.loads((out / "variants.json").read_text())
    manifest["dir"], manifest["stderr"] = out, r.stderr
    print(f"compiled {len(manifest['variants'])} variants in {time.time() - start:.0f} s "
          f"(triton {manifest['triton']})")
    return manifest


def test_every_variant_compiles(compiled):
    """Every kernel defined in roiops.triton is reached by some launcher, compiles (with
    ptxas) in every variant, and the variants are as many as expected."""
    variants = compiled["variants"]
    counts = dict(Counter(v["kernel"] for v in variants))
    never = sorted(set(compiled["kernels"]) - set(counts))
    assert not never, f"kernels no launcher call in tests/test_ptx.py reached: {never}"
    failed = [f"{v['label']}: {v['error']}" for v in variants if v["error"]]
    # The compiler's diagnostics (each followed by an IR dump) went to stderr.
    errors = list(dict.fromkeys(line for line in compiled["stderr"].splitlines() if "error:" in line))
    if failed:
        pytest.fail(f"{len(failed)} of {len(variants)} variants failed to compile (triton {compiled['triton']}):\n"
                    + "\n".join(failed) + "\ncompiler errors:\n" + "\n".join(errors[:10]), pytrace=False)
    assert counts == EXPECTED_VARIANTS, f"variants per kernel: {counts}"


def test_ptx_is_exact(compiled):
    """No variant's PTX holds an instruction the rules above forbid."""
    # (opcode, why) -> {variant label: first offending line}, and the number of hits
    by_rule: dict[tuple[str, str], dict[str, str]] = {}
    hits: Counter = Counter()
    checked = 0
    for v in compiled["variants"]:
        if v["error"]:
            continue  # reported by test_every_variant_compiles
        checked += 1
        fused = v["kernel"] in FMA_KERNELS and "FUSED=False" not in v["label"]
        for n, line, why in ptx_problems((compiled["dir"] / v["file"]).read_text()):
            if fused and line.split()[0] in ("fma.rn.f32", "fma.rn.f64"):
                continue
            key = (line.split()[0], why)
            hits[key] += 1
            by_rule.setdefault(key, {}).setdefault(v["label"], f"{v['file']}:{n}: {line}")
    assert checked > 0
    report = []
    for (opcode, why), where in sorted(by_rule.items()):
        examples = [f"    {label}\n        {line}" for label, line in list(where.items())[:3]]
        report.append(f"{opcode}: {why}; {hits[opcode, why]} times in {len(where)} of {checked} variants, e.g.\n"
                      + "\n".join(examples))
    if report:
        pytest.fail(f"PTX breaks the exactness rules (triton {compiled['triton']}):\n" + "\n".join(report),
                    pytrace=False)


# A per-box kernel (a tile from tile_blocks: the forwards, the atomic
# backwards, the box gradients) runs 4 warps per program. At most 128 registers a thread
# leaves room for 4 programs on an SM of 64K registers (25% occupancy). With tiles of
# 1024 elements RoIAlign's forward took 190 (2 programs) and ran at 0.4x torchvision's
# speed on an H100; at 256 elements it takes 56-86.
MAX_PER_BOX_REGISTERS = 128


def test_per_box_kernels_fit_registers(compiled):
    """Every variant of a per-box kernel stays within MAX_PER_BOX_REGISTERS (ptxas's count
    for sm_90, as a launch compiles it)."""
    per_box = [v for v in compiled["variants"] if not v["error"] and "BLOCK_P=" in v["label"]]
    assert per_box and all(v["registers"] for v in per_box), "no register counts in ptxas's report"
    over = sorted((v["registers"], v["label"]) for v in per_box if v["registers"] > MAX_PER_BOX_REGISTERS)
    assert not over, (f"{len(over)} of {len(per_box)} per-box variants use more than {MAX_PER_BOX_REGISTERS} "
                      f"registers (triton {compiled['triton']}): smaller tiles (GPU_TILE) or fewer live values\n"
                      + "\n".join(f"  {r}: {label}" for r, label in over[-10:]))


# ----------------------------------------------------------------------------- the subprocess

# One shape per layout: block sizes and strides change addressing, not the float ops.
# So every dtype compiles in NCHW and channels_last (other unit strides and tile shapes)
# in float32 only: its float instructions are NCHW's, and the others' would take 45% more
# compile time.
N, C, H, W, K, P = 2, 64, 20, 30, 16, 7
C_PS = 2 * P * P  # position-sensitive maps: P * P channels per output channel
LEVEL_SIZES = [(40, 60), (20, 30), (10, 15)]
LEVEL_SCALES = [1 / 4, 1 / 8, 1 / 16]


def _calls(launchers: dict, torch) -> list:
    """(description, thunk) for every launcher x dtype x layout x value of its flags (the
    arguments after the first three of its recipe). A launcher without a recipe fails."""
    import functools
    import inspect
    import itertools

    def meta(shape, dtype, cl=False):
        t = torch.empty(shape, dtype=dtype, device="meta")
        return t.contiguous(memory_format=torch.channels_last) if cl else t

    def x(dt, cl):
        return meta((N, C, H, W), dt, cl)

    def g(dt, cl):
        return meta((K, C, P, P), dt, cl)

    def am(cl):
        return meta((K, C, P, P), torch.int32, cl)

    def rois(dt):
        return meta((K, 5), dt)

    def maps(dt, cl):
        return [meta((N, C, h, w), dt, cl) for h, w in LEVEL_SIZES]

    def rotated(dt):
        return meta((K, 6), dt)

    LAYOUTS = {dt: (False,) for dt in (torch.float64, torch.float16, torch.bfloat16)} | {torch.float32: (False, True)}
    levels = meta((K,), torch.int64)
    hs, ws = [h for h, _ in LEVEL_SIZES], [w for _, w in LEVEL_SIZES]
    recipes = {
        "roi_align_forward": lambda f, dt, cl, aligned: f(x(dt, cl), rois(dt), 0.25, P, P, 2, aligned),
        "roi_align_max_forward": lambda f, dt, cl, aligned: f(x(dt, cl), rois(dt), 0.25, P, P, 2, aligned),
        "roi_align_backward": lambda f, dt, cl, aligned, deterministic: f(
            g(dt, cl), rois(dt), 0.25, P, P, N, C, H, W, 2, aligned, cl, deterministic=deterministic),
        "roi_align_max_backward": lambda f, dt, cl, aligned, deterministic: f(
            g(dt, cl), am(cl), rois(dt), 0.25, P, P, N, C, H, W, 2, aligned, cl, deterministic=deterministic),
        "roi_align_rois_backward": lambda f, dt, cl, aligned: f(g(dt, cl), x(dt, cl), rois(dt), 0.25, P, P, 2, aligned),
        "roi_align_max_rois_backward": lambda f, dt, cl, aligned: f(
            g(dt, cl), x(dt, cl), rois(dt), 0.25, P, P, 2, aligned),
        "roi_pool_forward": lambda f, dt, cl, continuous: f(x(dt, cl), rois(dt), 0.25, P, P, continuous),
        "roi_pool_backward": lambda f, dt, cl, deterministic: f(
            g(dt, cl), am(cl), rois(dt), N, C, H, W, cl, deterministic=deterministic),
        "multi_scale_roi_align_forward": lambda f, dt, cl, aligned: f(
            maps(dt, cl), rois(dt), levels, LEVEL_SCALES, P, P, 2, aligned),
        "multi_scale_roi_align_backward": lambda f, dt, cl, aligned, deterministic: f(
            g(dt, cl), rois(dt), levels, LEVEL_SCALES, P, P, N, C, hs, ws, 2, aligned, cl,
            deterministic=deterministic),
        "roi_align_rotated_forward": lambda f, dt, cl, aligned: f(x(dt, cl), rotated(dt), 0.25, P, P, 2, aligned),
        "roi_align_rotated_backward": lambda f, dt, cl, aligned, deterministic: f(
            g(dt, cl), rotated(dt), 0.25, P, P, N, C, H, W, 2, aligned, cl, deterministic=deterministic),
        "riroi_align_rotated_forward": lambda f, dt, cl, clockwise: f(
            x(dt, cl), rotated(dt), 0.25, P, P, 2, 8, clockwise),
        "riroi_align_rotated_backward": lambda f, dt, cl, clockwise, deterministic: f(
            g(dt, cl), rotated(dt), 0.25, P, P, N, C, H, W, 2, 8, clockwise, cl, deterministic=deterministic),
    }
    ps_x, ps_g = (lambda dt, cl: meta((N, C_PS, H, W), dt, cl)), (lambda dt, cl: meta((K, 2, P, P), dt, cl))
    recipes |= {
        "ps_roi_align_forward": lambda f, dt, cl: f(ps_x(dt, cl), rois(dt), 0.25, P, P, 2),
        "ps_roi_align_backward": lambda f, dt, cl, deterministic: f(
            ps_g(dt, cl), rois(dt), 0.25, P, P, N, C_PS, H, W, 2, cl, deterministic=deterministic),
        "ps_roi_pool_forward": lambda f, dt, cl: f(ps_x(dt, cl), rois(dt), 0.25, P, P),
        "ps_roi_pool_backward": lambda f, dt, cl, deterministic: f(
            ps_g(dt, cl), rois(dt), 0.25, P, P, N, C_PS, H, W, cl, deterministic=deterministic),
    }
    recipes |= {
        "prroi_pool_forward": lambda f, dt, cl: f(x(dt, cl), rois(dt), 0.25, P, P),
        "prroi_pool_backward": lambda f, dt, cl, deterministic: f(
            g(dt, cl), rois(dt), 0.25, P, P, N, C, H, W, cl, deterministic=deterministic),
        "prroi_pool_rois_backward": lambda f, dt, cl: f(g(dt, cl), x(dt, cl), rois(dt), 0.25, P, P),
    }

    def offset(dt, given):  # deformable offsets, in the map's dtype (the launchers convert them)
        return meta((K, 2, P, P), dt) if given else None

    recipes |= {
        "deform_roi_pool_forward": lambda f, dt, cl, given: f(x(dt, cl), rois(dt), offset(dt, given), 0.25, P, P, 2,
                                                             0.1),
        "deform_roi_pool_backward": lambda f, dt, cl, given, deterministic: f(
            g(dt, cl), rois(dt), offset(dt, given), 0.25, P, P, N, C, H, W, 2, 0.1, cl, deterministic=deterministic),
        "deform_roi_pool_offset_backward": lambda f, dt, cl: f(
            g(dt, cl), x(dt, cl), rois(dt), offset(dt, True), 0.25, P, P, 2, 0.1),
    }

    def beziers(dt):
        return meta((K, 17), dt)

    recipes |= {
        "bezier_align_forward": lambda f, dt, cl, aligned: f(x(dt, cl), beziers(dt), 0.25, P, P, 1, aligned),
        "bezier_align_backward": lambda f, dt, cl, aligned, deterministic: f(
            g(dt, cl), beziers(dt), 0.25, P, P, N, C, H, W, 1, aligned, cl, deterministic=deterministic),
        # border align: C / 4 channels per border, boxes per image, pool_size 10
        "border_align_forward": lambda f, dt, cl: f(x(dt, cl), meta((N, K, 4), dt), 10),
        "border_align_backward": lambda f, dt, cl, deterministic: f(
            meta((N, C // 4, K, 4), dt, cl), meta((N, C // 4, K, 4), torch.int32, cl), meta((N, K, 4), dt), 10, N, C,
            H, W, cl, deterministic=deterministic),
    }
    def masks(dt, size=14):
        return meta((K, size, size), dt)

    def paste_boxes(dt):
        return meta((K, 4), torch.float64 if dt == torch.float64 else torch.float32)

    recipes |= {
        "paste_masks_forward": lambda f, dt, cl, binary, box_window: f(
            masks(dt), paste_boxes(dt), H, W, 0.5, binary, box_window),
        "paste_masks_torchvision_forward": lambda f, dt, cl, fused: f(
            masks(dt), meta((K, 4), torch.int64), H, W, 1, fused),
        # bool masks go to the kernel as uint8: the same variants as uint8 ones
        "mask_targets_forward": lambda f, dt, cl, aligned, byte_masks: f(
            meta((N, H, W), torch.bool if byte_masks else dt), rois(dt), P, P, 0, aligned, 0.5, False),
    }
    # point clouds: NP points, K boxes (RoIAwarePool3d: a 4 x 4 x 4 grid, 8 points a voxel), C features
    NP, VOX = 100, (4, 4, 4)

    def lidar(dt, *lead):
        return meta((*lead, NP, 3), dt), meta((*lead, K, 7), dt)

    def aware_features(dt, other):
        return (torch.float16 if dt == torch.float64 else torch.float64) if other else dt

    recipes |= {
        "points_in_boxes_forward": lambda f, dt, cl, all_boxes: f(*lidar(dt, N), all_boxes),
        "roiaware_pool3d_forward": lambda f, dt, cl, other, max_mode: f(
            lidar(dt)[0], meta((NP, C), aware_features(dt, other)), lidar(dt)[1], *VOX, 8, max_mode),
        "roiaware_pool3d_backward": lambda f, dt, cl, other, max_mode: f(
            meta((K, *VOX, C), aware_features(dt, other)), meta((K, *VOX, C if max_mode else 2), torch.int32),
            *lidar(dt), NP, max_mode),
        "roipoint_pool3d_forward": lambda f, dt, cl: f(lidar(dt, N)[0], meta((N, NP, C), dt), lidar(dt, N)[1], 16),
        "roipoint_pool3d_backward": lambda f, dt, cl: f(meta((N, K, 16, 3 + C), dt), meta((N, K, 16), torch.int32),
                                                        NP),
    }
    missing = sorted(set(launchers) - set(recipes))
    if missing:
        raise SystemExit(f"tests/test_ptx.py has no recipe for the launchers {missing}: add one to _calls")
    calls = []
    for name, f in launchers.items():
        flags = list(inspect.signature(recipes[name]).parameters)[3:]
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            for cl in LAYOUTS[dt]:
                for values in itertools.product((False, True), repeat=len(flags)):
                    kw = dict(zip(flags, values))
                    desc = f"{name}({str(dt).split('.')[1]}, {'channels_last' if cl else 'NCHW'}" \
                        + "".join(f", {k}={v}" for k, v in kw.items()) + ")"
                    calls.append((desc, functools.partial(recipes[name], f, dt, cl, **kw)))
    return calls


def _public_launchers(pkg) -> dict:
    """roiops.triton's launchers: what its __all__ exports, and the other public functions
    of its public submodules (launchers not exported yet)."""
    import importlib
    import inspect
    import pkgutil

    found = {name: getattr(pkg, name) for name in pkg.__all__}
    for m in pkgutil.iter_modules(pkg.__path__):
        if not m.name.startswith("_"):
            mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
            found.update({name: f for name, f in vars(mod).items()
                          if inspect.isfunction(f) and f.__module__ == mod.__name__ and not name.startswith("_")})
    return found


def _kernels(pkg, JITFunction) -> list[str]:
    """The jit functions of roiops.triton that no other jit function calls: the kernels."""
    import ast
    import importlib
    import pkgutil

    jits = {}
    for m in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{m.name}")
        jits.update({id(f): f for f in vars(mod).values() if isinstance(f, JITFunction)})
    called = set()
    for f in jits.values():
        for node in ast.walk(ast.parse(f.src)):
            ref = None
            if isinstance(node, ast.Name):
                ref = f.fn.__globals__.get(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                ref = getattr(f.fn.__globals__.get(node.value.id), node.attr, None)
            if isinstance(ref, JITFunction) and ref is not f:
                called.add(id(ref))
    return sorted(f.fn.__name__ for i, f in jits.items() if i not in called)


def _compile_all(out: Path) -> None:
    """Call every launcher on meta tensors with JITFunction.run replaced: each launch
    binds and specializes its arguments exactly as a real one, and its variant is
    recorded; then all variants compile for sm_90, in parallel."""
    import multiprocessing

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime import jit as J

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    variants: dict = {}
    current = [""]

    def record(self, *args, grid, warmup, **kwargs):
        kwargs["debug"] = False
        bound, spec, opts = J.create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, opts)
        key = (self.fn.__name__, repr(signature), repr(constexprs), repr(attrs), repr(options.__dict__))
        if key not in variants:
            consts = ", ".join(f"{self.params[p[0]].name}={v}" for p, v in constexprs.items())
            ptrs = ",".join(sorted({t for t in signature.values() if t.startswith("*")}))
            variants[key] = dict(kernel=self.fn.__name__, label=f"{self.fn.__name__}[{consts}]({ptrs}) via {current[0]}",
                                 source=ASTSource(self, signature, constexprs, attrs), options=options.__dict__)

    J.JITFunction.run = record
    import roiops.triton as rt
    from roiops.triton import _common

    _common._Kernel.__getitem__ = J.JITFunction.__getitem__  # each launch through run: recorded

    for desc, thunk in _calls(_public_launchers(rt), torch):
        current[0] = desc
        thunk()
    todo = list(variants.values())
    for i, v in enumerate(todo):
        v["file"] = f"{i:03d}_{v['kernel']}.ptx"

    global _TODO
    _TODO = (todo, target, out)
    workers = max(1, min(os.cpu_count() or 1, 8))
    # fork: the workers inherit the recorded sources (nothing has touched a GPU or
    # started threads that fork would break).
    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v's report: registers and spills
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.map(_compile_one, range(len(todo)), chunksize=1)
    manifest = dict(triton=triton.__version__, kernels=_kernels(rt, J.JITFunction),
                    variants=[dict(kernel=v["kernel"], label=v["label"], file=v["file"], **r)
                              for v, r in zip(todo, results)])
    (out / "variants.json").write_text(json.dumps(manifest, indent=1))


_TODO: tuple = ()


def _compile_one(i: int) -> dict:
    """{error} or {error: None, registers, spill_bytes}: ptxas's report of the launch's
    own ptxas run (Triton prints it with knobs.nvidia.dump_ptxas_log)."""
    import contextlib
    import io

    import triton

    todo, target, out = _TODO
    v = todo[i]
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            k = triton.compile(v["source"], target=target, options=v["options"])
    except Exception as e:  # the compiler's own diagnostics went to stderr
        return dict(error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
    (out / v["file"]).write_text(k.asm["ptx"])
    regs = re.search(r"Used (\d+) registers", log.getvalue())
    spills = re.search(r"(\d+) bytes spill stores", log.getvalue())
    return dict(error=None, registers=int(regs.group(1)) if regs else None,
                spill_bytes=int(spills.group(1)) if spills else None)


if __name__ == "__main__":
    _compile_all(Path(sys.argv[1]))
