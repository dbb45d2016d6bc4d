"""``roiops demo`` / ``roiops explain``: what RoIPool quantises and RoIAlign keeps.

On a real photograph turned into a stride-S feature map (each cell the average colour of
an S x S block, so the true value of any box is known exactly), one proposal is pooled
with ``roiops.roi_pool`` and ``roiops.roi_align``. The numbers that tell the story are
printed, and a PNG shows the grid, the proposal, RoIPool's snapped bins, RoIAlign's bins
with their sample points, and the outputs beside the exact bin averages: RoIPool's, its
snapped windows averaged (snapping without the max) and RoIAlign's.

The default example is the classic one: an 800 x 800 image, a stride-32 backbone (a
25 x 25 map), a 665 x 665 proposal, 7 x 7 output, 2 x 2 samples per bin.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

import roiops
from roiops._geometry import align_axis, round_half_away, sample_position

if TYPE_CHECKING:  # matplotlib is optional: imported only to draw
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.gridspec import SubplotSpec

IMAGE_SIZE = 800
DEFAULT_BOX = (70.0, 40.0, 735.0, 705.0)
MAX_OUTPUT_SIZE = 32  # beyond this the bins cannot be drawn legibly
MAX_DRAWN_POINTS = 20000


# ----------------------------------------------------------------------------- arguments

def build_parser(command: str = "demo") -> argparse.ArgumentParser:
    """``demo``: the classic example, any option may change it; ``explain``: the box is
    required, and the picture goes to its own file so that the demo's is kept."""
    explain = command == "explain"
    p = argparse.ArgumentParser(
        prog=f"roiops {command}",
        description=f"Show, in numbers and a picture, how RoIPool and RoIAlign pool "
                    f"{'the box you give' if explain else 'one box'} of an {IMAGE_SIZE}x{IMAGE_SIZE}-px "
                    "image into a fixed grid of bins.")
    box_help = f"proposal in image pixels, 0 <= x1 < x2 <= {IMAGE_SIZE}, same for y"
    if explain:
        p.add_argument("--box", nargs=4, type=float, metavar=("X1", "Y1", "X2", "Y2"), required=True,
                       help=f"{box_help} (required)")
    else:
        p.add_argument("--box", nargs=4, type=float, metavar=("X1", "Y1", "X2", "Y2"),
                       default=DEFAULT_BOX,
                       help=f"{box_help} (default: {' '.join(f'{v:g}' for v in DEFAULT_BOX)}, "
                            "665 x 665 px)")
    p.add_argument("--stride", type=int, default=32, metavar="S",
                   help="backbone stride: image pixels per feature-map cell (default 32: a 25x25 map)")
    p.add_argument("--output-size", type=int, default=7, metavar="P",
                   help=f"bins per side, 1..{MAX_OUTPUT_SIZE} (default 7)")
    p.add_argument("--sampling-ratio", type=int, default=2, metavar="R",
                   help="RoIAlign sample points per bin and axis; <= 0 means adaptive, "
                        "ceil(bin size in cells) (default 2, as Mask R-CNN)")
    p.add_argument("--aligned", action="store_true",
                   help="RoIAlign with aligned=True (detectron2): shift by half a cell so that a "
                        "cell's value sits at the cell's centre")
    p.add_argument("--out", default=f"roiops_{command}.png", metavar="FILE.png",
                   help=f"where to write the picture (default roiops_{command}.png)")
    p.add_argument("--no-png", action="store_true", help="print the numbers only")
    return p


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    x1, y1, x2, y2 = args.box
    if not all(math.isfinite(v) for v in args.box):
        parser.error(f"--box values must be finite numbers, got {args.box}")
    if not (0 <= x1 < x2 <= IMAGE_SIZE and 0 <= y1 < y2 <= IMAGE_SIZE):
        parser.error(f"--box must lie in the {IMAGE_SIZE}x{IMAGE_SIZE} image with x1 < x2 and "
                     f"y1 < y2, i.e. 0 <= x1 < x2 <= {IMAGE_SIZE} and 0 <= y1 < y2 <= {IMAGE_SIZE}; "
                     f"got x1={x1:g} y1={y1:g} x2={x2:g} y2={y2:g}")
    if not 1 <= args.stride <= IMAGE_SIZE // 2:
        parser.error(f"--stride must be between 1 and {IMAGE_SIZE // 2} (at least a 2x2 feature "
                     f"map), got {args.stride}")
    if not 1 <= args.output_size <= MAX_OUTPUT_SIZE:
        parser.error(f"--output-size must be between 1 and {MAX_OUTPUT_SIZE}, got {args.output_size}")
    if args.sampling_ratio > 64:
        parser.error(f"--sampling-ratio must be at most 64 (<= 0 for adaptive), got {args.sampling_ratio}")
    if not args.no_png and not args.out.lower().endswith(".png"):
        parser.error(f"--out must name a .png file, got {args.out!r}")


# ----------------------------------------------------------------------------- the scene

def load_image() -> tuple[Tensor, str]:
    """The photograph as ``[3, 800, 800]`` float64 in [0, 1], and where it came from."""
    try:
        from matplotlib import cbook
        from PIL import Image

        path = cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
        with Image.open(path) as photo:
            side = min(photo.size)
            square = photo.convert("RGB").crop((0, 0, side, side))  # top: cap, face, collar
            square = square.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)
            data = torch.frombuffer(bytearray(square.tobytes()), dtype=torch.uint8)
        image = data.view(IMAGE_SIZE, IMAGE_SIZE, 3).permute(2, 0, 1).double() / 255
        return image, "matplotlib's sample photograph of Grace Hopper"
    except (ImportError, OSError, ValueError):
        # without matplotlib's sample data: smooth colour waves, still far from constant
        t = torch.linspace(0, 1, IMAGE_SIZE, dtype=torch.float64)
        yy, xx = torch.meshgrid(t, t, indexing="ij")
        image = torch.stack([0.5 + 0.5 * torch.sin(9 * xx + 4 * yy),
                             0.5 + 0.5 * torch.cos(7 * yy - 3 * xx * yy),
                             0.5 + 0.5 * torch.sin(5 * (xx - 0.5) ** 2 + 11 * yy ** 2)])
        return image, "a synthetic image (matplotlib's sample photograph was not found)"


def _bin_overlaps(start: float, end: float, bins: int, size: int) -> Tensor:
    """``[bins, size]``: the fraction of each bin of ``[start, end)`` that pixel p covers."""
    edges = start + (end - start) * torch.arange(bins + 1, dtype=torch.float64) / bins
    p = torch.arange(size, dtype=torch.float64)
    lo = torch.maximum(edges[:-1, None], p[None, :])
    hi = torch.minimum(edges[1:, None], p[None, :] + 1)
    return (hi - lo).clamp(min=0) / (edges[1:] - edges[:-1])[:, None]


def exact_bin_means(image: Tensor, box: tuple[float, float, float, float], bins: int) -> Tensor:
    """``[C, bins, bins]``: the mean of the image over each bin, pixels being unit squares."""
    x1, y1, x2, y2 = box
    ay = _bin_overlaps(y1, y2, bins, image.shape[1])
    ax = _bin_overlaps(x1, x2, bins, image.shape[2])
    return torch.einsum("ip,cpq,jq->cij", ay, image, ax)


@dataclass
class Axis:
    """One axis (x or y) of the box, in every unit the story needs."""

    lo: float  # box edges in image pixels
    hi: float
    stride: int
    bins: int
    aligned: bool
    sampling_ratio: int
    map_size: int  # feature-map cells along this axis

    @property
    def cells(self) -> float:
        return (self.hi - self.lo) / self.stride

    @property
    def bin_px(self) -> float:
        return (self.hi - self.lo) / self.bins

    @property
    def rounded(self) -> tuple[int, int]:
        lo, hi = round_half_away(torch.tensor([self.lo / self.stride, self.hi / self.stride], dtype=torch.float64))
        return int(lo), int(hi)

    @property
    def pool_cells(self) -> int:
        a, b = self.rounded
        return max(b - a + 1, 1)

    @property
    def pool_windows(self) -> list[tuple[int, int]]:
        """RoIPool's window of each bin, in cells ``[start, end)``, clipped to the map."""
        first, bin_size = self.rounded[0], self.pool_cells / self.bins

        def clip(v: int) -> int:
            return min(max(v, 0), self.map_size)

        return [(clip(math.floor(j * bin_size) + first), clip(math.ceil((j + 1) * bin_size) + first))
                for j in range(self.bins)]

    @functools.cached_property
    def _align(self) -> tuple[Tensor, Tensor, Tensor, int, bool]:
        """RoIAlign's start, size and bin in cells, its grid and whether it stretched the
        side: the kernels' rule, in float64 like this demo's roi_align call."""
        lo, hi = torch.tensor([self.lo, self.hi], dtype=torch.float64)
        start, size, bin_size, grid, stretched = align_axis(lo, hi, 1.0 / self.stride, self.bins,
                                                            self.sampling_ratio, self.aligned)
        return start, size, bin_size, int(grid), bool(stretched)

    @property
    def align_cells(self) -> float:
        return float(self._align[1])

    @property
    def stretched(self) -> bool:
        """aligned=False (the legacy RoIAlign) widens a box side under 1 cell to 1 cell."""
        return self._align[4]

    @property
    def grid(self) -> int:
        return self._align[3]

    def exact_edges(self) -> list[tuple[float, float]]:
        return [(self.lo + j * self.bin_px, self.lo + (j + 1) * self.bin_px) for j in range(self.bins)]

    @property
    def align_bin_px(self) -> float:
        return float(self._align[2]) * self.stride

    def align_edges(self) -> list[tuple[float, float]]:
        """RoIAlign's bins in image pixels: the exact ones unless the box side was stretched."""
        step = self.align_bin_px
        return [(self.lo + j * step, self.lo + (j + 1) * step) for j in range(self.bins)]

    def pool_edge_errors(self) -> list[float]:
        """Image-pixel distance of each RoIPool window edge from the exact bin edge."""
        out = []
        for (a, b), (s, e) in zip(self.exact_edges(), self.pool_windows):
            out += [s * self.stride - a, e * self.stride - b]
        return out

    def sample_px(self) -> list[float]:
        """Where RoIAlign means to sample, in image pixels (bin by bin)."""
        start, _, bin_size, grid, _ = self._align
        o = 0.5 if self.aligned else 0.0
        bins, samples = torch.arange(self.bins)[:, None], torch.arange(grid)[None, :]
        return ((sample_position(start, bin_size, grid, bins, samples) + o) * self.stride).flatten().tolist()


@dataclass
class Result:
    image: Tensor
    image_source: str
    features: Tensor
    box: tuple[float, float, float, float]
    x: Axis
    y: Axis
    pool: Tensor  # [C, P, P]
    align: Tensor
    align_other: Tensor  # the same with the other ``aligned`` setting
    window_mean: Tensor  # RoIPool's windows, averaged instead of maxed
    exact: Tensor


def compute(box: tuple[float, float, float, float], stride: int, bins: int, sampling_ratio: int,
            aligned: bool) -> Result:
    image, source = load_image()
    features = F.avg_pool2d(image[None], stride, stride)  # [1, 3, H, W]
    h, w = features.shape[-2:]
    scale = 1.0 / stride
    rois = torch.tensor([[0.0, *box]], dtype=torch.float64)
    x = Axis(box[0], box[2], stride, bins, aligned, sampling_ratio, w)
    y = Axis(box[1], box[3], stride, bins, aligned, sampling_ratio, h)

    def align(a: bool) -> Tensor:
        return roiops.roi_align(features, rois, bins, scale, sampling_ratio, aligned=a)[0]

    window_mean = features.new_zeros(features.shape[1], bins, bins)
    for i, (h0, h1) in enumerate(y.pool_windows):
        for j, (w0, w1) in enumerate(x.pool_windows):
            if h1 > h0 and w1 > w0:
                window_mean[:, i, j] = features[0, :, h0:h1, w0:w1].mean((1, 2))
    return Result(image, source, features[0], box, x, y,
                  roiops.roi_pool(features, rois, bins, scale)[0], align(aligned),
                  align(not aligned), window_mean, exact_bin_means(image, box, bins))


# ----------------------------------------------------------------------------- the story

def _err(out: Tensor, exact: Tensor) -> tuple[float, float]:
    d = (out - exact).abs()
    return d.mean().item(), d.max().item()


def _windows(axis: Axis) -> str:
    return " ".join(f"[{a},{b})" for a, b in axis.pool_windows)


def story(r: Result) -> str:
    x, y, s = r.x, r.y, r.x.stride
    p = x.bins
    hf, wf = r.features.shape[-2:]
    x1, y1, x2, y2 = r.box
    xr, yr = x.rounded, y.rounded
    pool_err = _pool_misses(r)
    aligned = x.aligned
    lines = [
        "RoIPool vs RoIAlign, step by step",
        "",
        f"Image: {IMAGE_SIZE} x {IMAGE_SIZE} px, {r.image_source}.",
        f"Backbone stride {s} -> feature map of {wf} x {hf} cells.",
        f"Here a cell is the average colour of a {s} x {s}-px block: cell k covers pixels {s}k to "
        f"{s}k+{s}.",
        f"Proposal (x1, y1, x2, y2) = ({x1:g}, {y1:g}, {x2:g}, {y2:g}): {x2 - x1:g} x {y2 - y1:g} px, "
        f"pooled into {p} x {p} bins.",
        "",
        f"On the feature map the proposal runs from x = {x1 / s:.2f} to {x2 / s:.2f} "
        f"({x1:g}/{s} to {x2:g}/{s}) and y = {y1 / s:.2f} to {y2 / s:.2f}:",
        f"  it covers {x2 - x1:g}/{s} = {_fmt_cells(x.cells)} cells across and "
        f"{_fmt_cells(y.cells)} cells down;",
        f"  an exact bin is {_fmt_cells(x.cells)}/{p} = {_fmt_cells(x.cells / p)} cells = "
        f"{x.bin_px:.1f} px across (and {_fmt_cells(y.cells / p)} cells = {y.bin_px:.1f} px down).",
        "",
        "RoIPool (Fast R-CNN, torchvision.ops.roi_pool) works in whole cells:",
        f"  it rounds the corners to the nearest cell: x {x1 / s:.2f} -> {xr[0]}, {x2 / s:.2f} -> {xr[1]}; "
        f"y {y1 / s:.2f} -> {yr[0]}, {y2 / s:.2f} -> {yr[1]};",
        f"  and counts both end cells: {xr[1]} - {xr[0]} + 1 = {_cells(x.pool_cells)} across, "
        f"{yr[1]} - {yr[0]} + 1 = {_cells(y.pool_cells)} down",
        f"  (often quoted instead: floor({_fmt_cells(x.cells)}) = {math.floor(x.cells)} cells, bins of "
        f"floor({math.floor(x.cells)}/{p}) = {math.floor(x.cells) // p}; not what the code does);",
        f"  bins of {x.pool_cells}/{p} = {x.pool_cells / p:.2f} x {y.pool_cells}/{p} = "
        f"{y.pool_cells / p:.2f} cells, widened to whole cells (floor of start, ceil of end):",
        f"    columns {_windows(x)}",
        f"    rows    {_windows(y)}",
        f"  so each bin reads {_sizes(x)} x {_sizes(y)} cells; bin edges miss the exact ones by up to "
        f"{max(pool_err):.1f} px (mean {sum(pool_err) / len(pool_err):.1f} px).",
        "",
        f"RoIAlign (Mask R-CNN, aligned={aligned}, sampling_ratio={x.sampling_ratio}"
        f"{'' if x.sampling_ratio > 0 else ': adaptive, ceil(bin size)'}) never rounds:",
    ]
    far_edges = [edge for edge, a in (("right", x), ("bottom", y)) if a.stretched]
    if far_edges:
        lines.append(
            f"  it keeps a box's size only from 1 cell up: aligned=False stretches "
            f"{_fmt_cells(x.cells)} x {_fmt_cells(y.cells)} cells to {_fmt_cells(x.align_cells)} x "
            f"{_fmt_cells(y.align_cells)} cells, so its bins are {_fmt_cells(x.align_cells / p)} x "
            f"{_fmt_cells(y.align_cells / p)} cells ({x.align_bin_px:.1f} x {y.align_bin_px:.1f} px "
            f"instead of {x.bin_px:.1f} x {y.bin_px:.1f} px) and reach past the box's "
            f"{' and '.join(far_edges)} edge{'s' * (len(far_edges) > 1)};")
    else:
        lines.append(f"  it keeps {_fmt_cells(x.align_cells)} x {_fmt_cells(y.align_cells)} cells and "
                     f"bins of {_fmt_cells(x.align_cells / p)} x {_fmt_cells(y.align_cells / p)} cells;")
    lines.append(f"  it samples {x.grid} x {y.grid} points per bin ({p * p * x.grid * y.grid} in all), "
                 "each interpolated from the 4 nearest cells;")
    shift = (f"aligned=False places the value of cell k at pixel {s}k while the cell describes pixels "
             f"{s}k to {s}k+{s} (centre {s}k+{s / 2:g}): every sample reads {s / 2:g} px right of and "
             "below its spot.")
    if aligned:
        lines.append("  with aligned=True it shifts the box by half a cell, so a cell's value sits at "
                     f"the cell's centre ({s}k+{s / 2:g}): its bins miss the exact ones by 0 px.")
    elif far_edges:
        lines.append(f"  and {shift} --aligned removes both the stretch and this half-cell shift.")
    else:
        lines.append(f"  its bins are exact, but {shift} --aligned removes this half-cell shift.")
    pool_e, align_e = _err(r.pool, r.exact), _err(r.align, r.exact)
    lines += [
        "",
        "Outputs vs. the exact bin values (the mean of the image inside each bin, edge pixels "
        "counted by the fraction inside; colours on a 0-1 scale):",
        f"  RoIPool   mean |error| {pool_e[0]:.3f} (max {pool_e[1]:.3f}): the maximum over a "
        "misplaced window;",
        f"            averaging the same windows instead: {_err(r.window_mean, r.exact)[0]:.3f} "
        "(the misplacement alone)",
        f"  RoIAlign  mean |error| {align_e[0]:.3f} (max {align_e[1]:.3f}); "
        f"with aligned={not aligned}: {_err(r.align_other, r.exact)[0]:.3f}",
    ]
    return "\n".join(_wrap(line) for line in lines)


def _wrap(line: str, width: int = 100) -> str:
    body = line.lstrip(" ")
    indent = line[:len(line) - len(body)]
    return textwrap.fill(body, width, initial_indent=indent, subsequent_indent=indent + "    ",
                         break_long_words=False, break_on_hyphens=False) or line


def _fmt_cells(cells: float) -> str:
    """A length in cells: 2 decimals, or 2 significant digits under 0.1 so that the bins of a
    tiny box do not read as 0 cells."""
    return f"{cells:.2f}" if cells == 0 or cells >= 0.1 else f"{cells:.2g}"


def _fmt_px(px: float) -> str:
    """A length in pixels for the picture: whole pixels, or 2 significant digits under 10."""
    return f"{px:.0f}" if px >= 9.5 else f"{px:.2g}"


def _pool_misses(r: Result) -> list[float]:
    return [abs(e) for e in r.x.pool_edge_errors() + r.y.pool_edge_errors()]


def _overlapping(axis: Axis) -> bool:
    w = axis.pool_windows
    return any(b[0] < a[1] for a, b in zip(w, w[1:]))


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _sizes(axis: Axis) -> str:
    sizes = sorted({e - s for s, e in axis.pool_windows})
    return "/".join(map(str, sizes))


# ----------------------------------------------------------------------------- the picture

def _view(axis: Axis) -> tuple[float, float]:
    """The part of the image to show along one axis: the box, RoIPool's windows and
    RoIAlign's bins, with a margin, or the whole image when that is most of it."""
    lo = min(axis.lo, axis.pool_windows[0][0] * axis.stride)
    hi = max(axis.hi, axis.pool_windows[-1][1] * axis.stride, axis.align_edges()[-1][1])
    pad = max(0.2 * (hi - lo), 2 * axis.stride)
    lo, hi = max(lo - pad, 0.0), min(hi + pad, float(IMAGE_SIZE))
    return (0.0, float(IMAGE_SIZE)) if hi - lo > 0.6 * IMAGE_SIZE else (lo, hi)


def figure(r: Result) -> Figure:
    from matplotlib import patheffects
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    x, y, s, p = r.x, r.y, r.x.stride, r.x.bins
    x1, y1, x2, y2 = r.box
    hf, wf = r.features.shape[-2:]
    outline = [patheffects.withStroke(linewidth=3.5, foreground="black")]
    photo = r.image.permute(1, 2, 0).numpy()
    mid_i, mid_j = p // 2, p // 2  # the bin highlighted in both panels
    teal = (0, 1, 1, 0.35)

    fig = Figure(figsize=(15, 17), dpi=100)
    grid = fig.add_gridspec(4, 6, height_ratios=[10, 3.1, 1.7, 4.3], hspace=0.1, wspace=0.3,
                            left=0.04, right=0.98, top=0.9, bottom=0.08)
    fig.suptitle(f"RoIPool vs RoIAlign: pooling a {x2 - x1:g} x {y2 - y1:g}-px proposal into "
                 f"{p} x {p} bins of a stride-{s} feature map", fontsize=17, weight="bold", y=0.985)
    fig.text(0.5, 0.943, textwrap.fill(
        f"{IMAGE_SIZE} x {IMAGE_SIZE}-px image, {wf} x {hf}-cell feature map (grey grid: one cell = "
        f"{s} x {s} px). A detector's head needs the same number of features from every box, so "
        "each box is cut into bins and each bin is pooled to one value.", 150),
        ha="center", va="center", fontsize=11.5)

    (vx0, vx1), (vy0, vy1) = _view(x), _view(y)

    def scene(slot: SubplotSpec, title: str) -> Axes:
        ax = fig.add_subplot(slot)
        ax.imshow(photo, extent=(0, IMAGE_SIZE, IMAGE_SIZE, 0), interpolation="bilinear")
        ax.add_patch(Rectangle((0, 0), IMAGE_SIZE, IMAGE_SIZE, color="black", alpha=0.25))
        if max(vx1 - vx0, vy1 - vy0) / s <= 120:  # denser grids are a grey blur
            for k in range(wf + 1):
                ax.axvline(k * s, color="0.85", lw=0.6, alpha=0.7)
            for k in range(hf + 1):
                ax.axhline(k * s, color="0.85", lw=0.6, alpha=0.7)
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, ec="lime", lw=3.2,
                               path_effects=outline, zorder=5))
        ax.set_xlim(vx0, vx1)
        ax.set_ylim(vy1, vy0)
        ax.set_title(title, fontsize=14, weight="bold", loc="left")
        ax.tick_params(labelsize=8)
        return ax

    def explain(slot: SubplotSpec, handles: list[Artist], caption: str) -> None:
        ax = fig.add_subplot(slot)
        ax.axis("off")
        ax.text(0, 1, textwrap.fill(caption, 88), transform=ax.transAxes, fontsize=11, va="top")
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, 0.6), fontsize=10.5,
                  frameon=False, borderaxespad=0)

    # RoIPool: the snapped windows
    ax = scene(grid[0, 0:3], "RoIPool: snaps the box and its bins to whole cells")
    for i, (r0, r1) in enumerate(y.pool_windows):
        for j, (c0, c1) in enumerate(x.pool_windows):
            ax.add_patch(Rectangle((c0 * s, r0 * s), (c1 - c0) * s, (r1 - r0) * s, zorder=4,
                                   fill=False, ec="orangered", lw=1.1, alpha=0.9))
    (c0, c1), (r0, r1) = x.pool_windows[mid_j], y.pool_windows[mid_i]
    ax.add_patch(Rectangle((c0 * s, r0 * s), (c1 - c0) * s, (r1 - r0) * s, zorder=5,
                           fc=(1, 0, 1, 0.3), ec="magenta", lw=2.5))
    bx0, bx1 = x.exact_edges()[mid_j]
    by0, by1 = y.exact_edges()[mid_i]
    ax.add_patch(Rectangle((bx0, by0), bx1 - bx0, by1 - by0, fill=False, ec="cyan", lw=2.2,
                           ls="--", zorder=6))
    overlap = "so neighbouring bins overlap and " if _overlapping(x) or _overlapping(y) else "and "
    explain(grid[1, 0:3], [
        Line2D([], [], color="lime", lw=3, label=f"proposal: {x2 - x1:g} x {y2 - y1:g} px = "
               f"{_fmt_cells(x.cells)} x {_fmt_cells(y.cells)} cells"),
        Line2D([], [], color="orangered", lw=1.5, label="RoIPool bins: windows of whole cells"),
        Patch(fc=(1, 0, 1, 0.3), ec="magenta", lw=2, label=f"one RoIPool bin: {c1 - c0} x {r1 - r0} cells"),
        Line2D([], [], color="cyan", lw=2, ls="--", label=f"where that bin should be: "
               f"{_fmt_px(x.bin_px)} x {_fmt_px(y.bin_px)} px"),
    ], f"The corners are rounded to cells ({x1 / s:.2f} -> {x.rounded[0]}, {x2 / s:.2f} -> "
       f"{x.rounded[1]}) and both end cells count: {x.pool_cells} cells instead of "
       f"{_fmt_cells(x.cells)}. "
       f"Each bin ({x.pool_cells / p:.2f} cells) is widened to whole cells, {overlap}"
       f"bin edges miss by up to {max(_pool_misses(r)):.0f} px.")

    # RoIAlign: its bins (the exact ones unless the box was stretched) and sample points
    stretched = x.stretched or y.stretched
    ax = scene(grid[0, 3:6], "RoIAlign: stretches the box to 1 cell, samples points"
               if stretched else "RoIAlign: keeps exact bins, samples points inside them")
    ax0, ax1 = x.align_edges()[0][0], x.align_edges()[-1][1]
    ay0, ay1 = y.align_edges()[0][0], y.align_edges()[-1][1]
    for a in [e for e, _ in x.align_edges()] + [ax1]:
        ax.plot([a, a], [ay0, ay1], color="cyan", lw=1.2, zorder=4)
    for a in [e for e, _ in y.align_edges()] + [ay1]:
        ax.plot([ax0, ax1], [a, a], color="cyan", lw=1.2, zorder=4)
    (tx0, tx1), (ty0, ty1) = x.align_edges()[mid_j], y.align_edges()[mid_i]
    ax.add_patch(Rectangle((tx0, ty0), tx1 - tx0, ty1 - ty0, fc=teal, ec="none", zorder=4))
    px, py = x.sample_px(), y.sample_px()
    handles: list[Artist] = [
        Line2D([], [], color="lime", lw=3, label="proposal"),
        Line2D([], [], color="cyan", lw=1.5, label=f"RoIAlign bins: {_fmt_cells(x.align_cells / p)} "
               f"x {_fmt_cells(y.align_cells / p)} cells, not rounded"),
        Patch(fc=teal, ec="none", label=f"the bin highlighted on the left: {_fmt_px(tx1 - tx0)} x "
              f"{_fmt_px(ty1 - ty0)} px" + (f", not {_fmt_px(x.bin_px)} x {_fmt_px(y.bin_px)}"
                                           if stretched else ", where it should be")),
    ]
    if len(px) * len(py) <= MAX_DRAWN_POINTS:
        ax.scatter([a for _ in py for a in px], [b for b in py for _ in px],
                   s=max(4.0, 40.0 / max(x.grid, y.grid)), c="yellow", edgecolors="black",
                   linewidths=0.5, zorder=7)
        handles.append(Line2D([], [], ls="none", marker="o", mfc="yellow", mec="black",
                              label=f"sample points: {x.grid} x {y.grid} per bin, each interpolated "
                                    "from the 4 nearest cells"))
    if x.aligned:
        shift = "With aligned=True a cell's value sits at the cell's centre, so nothing is shifted."
    else:
        shift = (f"Caveat of aligned=False (shown): every sample reads {s / 2:g} px right of and "
                 "below its spot, because a cell's value describes the cell's centre; --aligned "
                 f"fixes that{' and the stretch' if stretched else ''}.")
    size = (f"aligned=False stretches the box to at least 1 cell: {_fmt_cells(x.align_cells)} x "
            f"{_fmt_cells(y.align_cells)} cells" if stretched else f"{_fmt_cells(x.align_cells)} cells")
    explain(grid[1, 3:6], handles,
            f"No rounding: {size}, bins of {_fmt_cells(x.align_cells / p)} cells. "
            f"Each bin is the mean of its {x.grid * y.grid} points. {shift}")

    # the outputs, RoIPool's two effects apart: snapping (its windows averaged) and the max
    pool_e, snap_e = _err(r.pool, r.exact)[0], _err(r.window_mean, r.exact)[0]
    align_e, other_e = _err(r.align, r.exact)[0], _err(r.align_other, r.exact)[0]
    head = fig.add_subplot(grid[2, :])
    head.axis("off")
    head.text(0.5, 1, "The outputs vs. the exact bin values (mean |error|, colours on a 0-1 scale)",
              ha="center", va="top", fontsize=14, weight="bold", transform=head.transAxes)
    head.text(0.5, 0.75, f"RoIPool's error has two causes: snapping the bins to whole cells "
              f"({snap_e:.3f} with its windows averaged)\nand taking the maximum instead of the mean "
              f"({snap_e:.3f} -> {pool_e:.3f}). RoIAlign: {align_e:.3f} (aligned={not x.aligned}: "
              f"{other_e:.3f}).",
              ha="center", va="top", fontsize=12, transform=head.transAxes)
    panels = [
        (r.exact, "Exact bin values\n(the target)",
         "the mean of the image inside each bin, edge pixels counted by the fraction inside"),
        (r.window_mean, f"RoIPool's windows, averaged\nmean |error| {snap_e:.3f}",
         "the mean over RoIPool's snapped windows: what snapping alone costs"),
        (r.pool, f"RoIPool output: their max\nmean |error| {pool_e:.3f}",
         "snapping, then the max, taken channel by channel (here R, G and B; in a network, each "
         "feature): a bin can take its red from one cell and its blue from another, a colour "
         "found nowhere in its window"),
        (r.align, f"RoIAlign output (aligned={x.aligned})\nmean |error| {align_e:.3f}",
         f"the mean of each bin's sample points; with aligned={not x.aligned}: {other_e:.3f}"),
    ]
    row = grid[3, :].subgridspec(1, len(panels), wspace=0.35)
    for n, (values, title, caption) in enumerate(panels):
        ax = fig.add_subplot(row[0, n])
        ax.imshow(values.clamp(0, 1).permute(1, 2, 0).numpy(), interpolation="nearest")
        ax.set_title(title, fontsize=12)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, -0.04, textwrap.fill(caption, 40), transform=ax.transAxes, ha="center",
                va="top", fontsize=10)
    return fig


def draw(r: Result, path: str) -> None:
    figure(r).savefig(path)


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None, command: str = "demo") -> int:
    parser = build_parser(command)
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        _check(args, parser)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), message already printed
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    result = compute(tuple(args.box), args.stride, args.output_size, args.sampling_ratio,
                     args.aligned)
    print(story(result))
    if not args.no_png:
        try:
            draw(result, args.out)
        except ImportError:
            print("error: drawing the picture needs matplotlib (pip install 'roiops[demo]'); "
                  "use --no-png for the numbers only", file=sys.stderr)
            return 1
        except OSError as e:
            print(f"error: cannot write {args.out}: {e}", file=sys.stderr)
            return 1
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
