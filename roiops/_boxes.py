"""The box formats, each declared once: the rows an operator takes (width, column names,
the text errors show), how many leading columns are coordinates, each box's axis-aligned
bounding box, and the boxes that `roiops bench` and the tests draw in it. Validation, the
kernel checks, the bench and the tests read these declarations; a new format is one
more :class:`BoxFormat` here.

Generators take an image of ``width x height`` pixels and return float rows led by the
batch index (a format without one, ``PER_IMAGE``, is drawn as such rows too: the caller
groups them per image).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

F64 = torch.float64


@dataclass(frozen=True, eq=False)
class BoxFormat:
    """``columns``: a row's columns after the batch index (``per_image``: the whole row,
    the boxes given ``[N, K, len(columns)]`` without an index), the first ``coordinates``
    of them coordinates (checked within 2^24 cells after the spatial scale), the rest
    checked finite; ``kernel_columns``: the registered ops' names for them where those
    differ (an angle the public functions normalise to radians); ``argument``: the
    public functions' argument; ``note``: what errors add to the row text.

    ``extent(rows)``: each box's axis-aligned bounding box ``(batch_index, x1, y1, x2,
    y2)``. ``from_axis_aligned(rows)``: a box of this format in each axis-aligned row,
    differentiably (a test turns any box test into one of this format). ``sample(n,
    count, width, height, generator)``: realistic boxes for a benchmark. ``random(n,
    count, width, height, generator, dtype)`` and ``nasty(n, width, height, dtype)``: the
    tests' ordinary boxes and the cases every kernel must survive."""

    name: str
    columns: tuple[str, ...]
    coordinates: int
    extent: Callable[[Tensor], Tensor]
    from_axis_aligned: Callable[[Tensor], Tensor]
    sample: Callable[[int, int, float, float, torch.Generator], Tensor]
    random: Callable[[int, int, float, float, torch.Generator, torch.dtype], Tensor]
    nasty: Callable[[int, float, float, torch.dtype], Tensor]
    argument: str = "boxes"
    kernel_columns: tuple[str, ...] = ()
    note: str = ""
    per_image: bool = False

    @property
    def width(self) -> int:
        """The width of a row as the kernels take it: with the batch index unless per image."""
        return len(self.columns) + (not self.per_image)

    def rows(self, batch_index: bool = True, kernel: bool = False) -> str:
        """``"(batch_index, x1, y1, x2, y2)"``; long rows abbreviated, ``(x0, y0, ..., x7, y7)``."""
        names = list(self.kernel_columns if kernel and self.kernel_columns else self.columns)
        if len(names) > 8:
            names = names[:2] + ["..."] + names[-2:]
        return "(" + ", ".join(["batch_index"] * batch_index + names) + ")"

    def hint(self, batch_index: bool = True) -> str:
        """What a shape error adds after ``[K, width]``."""
        return f" (rows {self.rows(batch_index)}{self.note})"

    def __repr__(self) -> str:
        return f"BoxFormat({self.name!r})"


# ---- axis-aligned boxes


def _same(rows: Tensor) -> Tensor:
    return rows


def _log_uniform(n: int, count: int, width: float, height: float, g: torch.Generator) -> Tensor:
    """float32 boxes: sides log-uniform from 16 to 512 px, centres uniform over the image,
    image index uniform in [0, n)."""
    size = torch.exp(torch.empty(count, 2).uniform_(math.log(16), math.log(512), generator=g))
    centre = torch.rand(count, 2, generator=g) * torch.tensor([width, height])
    xy1, xy2 = centre - size / 2, centre + size / 2
    idx = torch.randint(0, n, (count, 1), generator=g).float()
    return torch.cat([idx, xy1, xy2], dim=1)


def _random_boxes(n: int, count: int, width: float, height: float, g: torch.Generator,
                  dtype: torch.dtype = torch.float32) -> Tensor:
    """Boxes with x1 <= x2, y1 <= y2, inside the image."""
    idx = torch.randint(0, n, (count, 1), generator=g).to(dtype)
    xy = torch.rand(count, 4, generator=g, dtype=F64)
    x = torch.sort(xy[:, [0, 2]] * width, dim=1).values
    y = torch.sort(xy[:, [1, 3]] * height, dim=1).values
    return torch.cat([idx, torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1).to(dtype)], 1)


def _indexed(rows: list[list[float]], n: int, dtype: torch.dtype) -> Tensor:
    out = torch.tensor(rows, dtype=dtype)
    out[:, 0] = torch.arange(len(rows)) % n
    return out


def _nasty_boxes(n: int, width: float, height: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """Outside the map, negative, zero and sub-pixel size, larger than the map, inverted,
    exactly on the border."""
    w, h = width, height
    return _indexed([
        [0, -3.0, -2.0, 4.5, 3.5],            # straddles the top-left corner
        [0, w + 2, h + 3, w + 9, h + 7],      # entirely outside (bottom-right)
        [0, -20.0, -20.0, -5.0, -8.0],        # entirely outside (negative)
        [0, -0.6, -0.9, w - 0.5, h - 0.1],    # just inside the border rule's -1 limit
        [0, 2.0, 3.0, 2.0, 3.0],              # zero size
        [0, 1.2, 1.4, 1.5, 1.6],              # sub-pixel
        [0, -w, -h, 2 * w, 2 * h],            # larger than the map
        [0, 5.0, 6.0, 1.0, 2.0],              # inverted
        [0, 0.0, 0.0, w - 1, h - 1],          # exactly the map
        [0, w - 1.5, h - 1.5, w + 0.5, h + 0.5],  # over the last row and column
    ], n, dtype)


AXIS_ALIGNED = BoxFormat("axis-aligned", ("x1", "y1", "x2", "y2"), 4, _same, _same,
                         lambda n, count, width, height, g: _log_uniform(n, count, width, height, g),
                         _random_boxes, _nasty_boxes)


# ---- rotated boxes


def _rotated_extent(rows: Tensor) -> Tensor:
    """The axis-aligned bounding box of each rotated box (angle in degrees)."""
    t = torch.deg2rad(rows[:, 5])
    half_w = (rows[:, 3] * t.cos().abs() + rows[:, 4] * t.sin().abs()) / 2
    half_h = (rows[:, 3] * t.sin().abs() + rows[:, 4] * t.cos().abs()) / 2
    cx, cy = rows[:, 1], rows[:, 2]
    return torch.stack([rows[:, 0], cx - half_w, cy - half_h, cx + half_w, cy + half_h], dim=1)


def _turned(rows: Tensor) -> Tensor:
    """Each box's centre and sides, turned by an angle (degrees) that differs from row to row."""
    i, x1, y1, x2, y2 = rows.unbind(1)
    angle = torch.arange(len(rows), dtype=rows.dtype, device=rows.device) * 37.0 - 60.0
    return torch.stack([i, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, angle], 1)


def _sample_rotated(n: int, count: int, width: float, height: float, g: torch.Generator) -> Tensor:
    """The log-uniform boxes turned by angles uniform in [-180, 180)."""
    b = _log_uniform(n, count, width, height, g)
    angle = torch.rand(count, 1, generator=g) * 360 - 180
    return torch.cat([b[:, :1], (b[:, 1:3] + b[:, 3:5]) / 2, b[:, 3:5] - b[:, 1:3], angle], dim=1)


def _random_rotated(n: int, count: int, width: float, height: float, g: torch.Generator,
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """Centres inside the image, sides up to half the image's, any angle in (-180, 180)."""
    idx = torch.randint(0, n, (count, 1), generator=g).to(F64)
    u = torch.rand(count, 5, generator=g, dtype=F64)
    centre = u[:, :2] * torch.tensor([width, height], dtype=F64)
    size = (0.05 + u[:, 2:4]) * torch.tensor([width, height], dtype=F64) / 2
    angle = u[:, 4:] * 360 - 180
    return torch.cat([idx, centre, size, angle], 1).to(dtype)


def _nasty_rotated(n: int, width: float, height: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """Off the map, across its corners and border, of zero, negative and sub-pixel size,
    larger than the map, at multiples of 90 degrees."""
    w, h = width, height
    return _indexed([
        [0, 0.0, 0.0, 6.0, 4.0, 30.0],               # centred on the top-left corner
        [0, w + 8, h + 8, 6.0, 6.0, 45.0],           # entirely outside
        [0, w / 2, h / 2, 2 * w, 2 * h, 10.0],       # larger than the map
        [0, w / 2, h / 2, 0.0, 0.0, 0.0],            # zero size
        [0, 3.0, 4.0, -4.0, 3.0, 60.0],              # negative width
        [0, 2.5, 2.5, 0.4, 0.3, -75.0],              # sub-pixel
        [0, w - 1, h - 1, 5.0, 3.0, 90.0],           # over the last row and column
        [0, w / 2, h / 3, w, 4.0, 180.0],            # half a turn
        [0, w / 3, h / 2, 4.0, 4.0, -270.0],         # a quarter turn the other way
        [0, w / 2, h / 2, w * 3, 2.0, 135.0],        # a long thin diagonal, beyond the map
    ], n, dtype)


ROTATED = BoxFormat("rotated", ("cx", "cy", "w", "h", "angle"), 4, _rotated_extent, _turned, _sample_rotated,
                    _random_rotated, _nasty_rotated, kernel_columns=("cx", "cy", "w", "h", "theta"))


# ---- Bezier boxes: two cubic curves, the top one left to right, the bottom one right to left


def _bezier_extent(rows: Tensor) -> Tensor:
    """The axis-aligned bounding box of each box's control points (which holds its curves)."""
    xs, ys = rows[:, 1::2], rows[:, 2::2]
    return torch.stack([rows[:, 0], xs.amin(1), ys.amin(1), xs.amax(1), ys.amax(1)], dim=1)


def _slanted_band(rows: Tensor) -> Tensor:
    """A slanted band across each box, each curve's end points half its height apart, so
    that bins have a height; control points at dyadic fractions of the box, so that rows
    exact in float16 stay so."""
    i, x1, y1, x2, y2 = rows.unbind(1)
    dx, dy = x2 - x1, y2 - y1
    at = (0.0, 0.25, 0.75, 1.0)
    top = [(x1 + dx * f, y1 + dy * (f / 2)) for f in at]
    bottom = [(x1 + dx * f, y2 - dy * ((1 - f) / 2)) for f in at]
    return torch.stack([i] + [c for p in top + bottom[::-1] for c in p], 1)


def _text_lines(n: int, count: int, width: float, height: float, g: torch.Generator) -> Tensor:
    """Text lines: lengths log-uniform from 64 to 640 px, heights from 16 to 64 px (at most
    half the length), slanted up to 0.3 radians, the inner control points bent by up to
    half the height; centres uniform over the image."""
    u = torch.rand(count, 6, generator=g)
    length = torch.exp(math.log(64) + u[:, 0] * math.log(10))
    thick = torch.minimum(torch.exp(math.log(16) + u[:, 1] * math.log(4)), length / 2)
    angle, bend = (u[:, 2] - 0.5) * 0.6, (u[:, 3] - 0.5) * thick
    cx, cy = u[:, 4] * width, u[:, 5] * height
    t = torch.tensor([-0.5, -1 / 6, 1 / 6, 0.5])
    along = torch.stack([angle.cos(), angle.sin()], 1)  # [K, 2]
    across = torch.stack([-angle.sin(), angle.cos()], 1)
    lift = torch.tensor([0.0, 1.0, 1.0, 0.0])[None] * bend[:, None]  # [K, 4]
    centre = torch.stack([cx, cy], 1)[:, None]
    line = centre + (length[:, None] * t)[..., None] * along[:, None] + lift[..., None] * across[:, None]
    top = line - (thick[:, None, None] / 2) * across[:, None]
    bottom = line + (thick[:, None, None] / 2) * across[:, None]
    idx = torch.randint(0, n, (count, 1), generator=g).float()
    return torch.cat([idx, top.reshape(count, 8), bottom.flip(1).reshape(count, 8)], dim=1)


def _random_bezier(n: int, count: int, width: float, height: float, g: torch.Generator,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """Curved text lines inside the image, of any slant, their control points jittered."""
    idx = torch.randint(0, n, (count, 1), generator=g).to(F64)
    u = torch.rand(count, 5, generator=g, dtype=F64)
    x0, y0 = u[:, 0] * width * 0.7, u[:, 1] * height * 0.8
    length, thick = (0.1 + 0.3 * u[:, 2]) * width, (0.03 + 0.15 * u[:, 3]) * height
    slant = (u[:, 4] - 0.5) * 0.6 * height
    t = torch.tensor([0.0, 1 / 3, 2 / 3, 1.0], dtype=F64)
    jitter = (torch.rand(count, 2, 4, 2, generator=g, dtype=F64) - 0.5) * thick[:, None, None, None]
    top_x = x0[:, None] + length[:, None] * t
    top_y = y0[:, None] + slant[:, None] * t
    top = torch.stack([top_x, top_y], -1) + jitter[:, 0]
    bottom = torch.stack([top_x, top_y + thick[:, None]], -1) + jitter[:, 1]
    rows = torch.cat([top.reshape(count, 8), bottom.flip(1).reshape(count, 8)], 1)
    return torch.cat([idx, rows], 1).to(dtype)


def _nasty_bezier(n: int, width: float, height: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """Horizontal (bins of height 0), vertical (width 0), a single point, off the map,
    across its border and corners, larger than it, reversed (top curve right to left),
    crossing curves."""
    w, h = width, height

    def box(top: list[tuple[float, float]], bottom: list[tuple[float, float]]) -> list[float]:
        """Top curve left to right, bottom curve given left to right (stored reversed)."""
        return [0.0] + [c for p in top for c in p] + [c for p in bottom[::-1] for c in p]

    def line(x1: float, y1: float, x2: float, y2: float) -> list[tuple[float, float]]:
        return [(x1 + (x2 - x1) * s / 3, y1 + (y2 - y1) * s / 3) for s in range(4)]

    return _indexed([
        box(line(1, 2, w - 2, 2), line(1, 6, w - 2, 6)),                      # horizontal: bins of height 0
        box(line(3, 1, 3, h - 1), line(7, 1, 7, h - 1)),                      # vertical: bins of width 0
        box(line(4, 4, 4, 4), line(4, 4, 4, 4)),                              # a single point
        box(line(w + 5, h + 5, w + 20, h + 9), line(w + 5, h + 9, w + 20, h + 13)),  # off the map
        box(line(-6, -3, 5, 2), line(-6, 1, 5, 6)),                            # across the top-left corner
        box(line(-w, -h, 2 * w, 2 * h), line(-w, 2 * h, 2 * w, 3 * h)),       # larger than the map
        box(line(w - 2, 3, 2, 5), line(w - 2, 7, 2, 9)),                      # reversed: right to left
        box([(1, 1), (w / 2, h + 4), (w / 2, -4), (w - 1, h - 1)], line(1, h - 1, w - 1, 1)),  # crossing curves
        box(line(w - 3, h - 3, w + 0.5, h - 0.5), line(w - 3, h - 1, w + 0.5, h + 0.5)),  # over the last cells
        box(line(2.2, 3.1, 2.4, 3.3), line(2.2, 3.2, 2.4, 3.4)),              # sub-pixel
    ], n, dtype)


BEZIER = BoxFormat("bezier", tuple(f"{a}{i}" for i in range(8) for a in "xy"), 16, _bezier_extent, _slanted_band,
                   _text_lines, _random_bezier, _nasty_bezier, argument="beziers",
                   note=": the top curve's control points left to right, the bottom curve's right to left")


# ---- boxes per image, [N, K, 4] without a batch index


def _dense_head(n: int, count: int, width: float, height: float, g: torch.Generator) -> Tensor:
    """A dense head's boxes, image by image: one around each of the first ``count``
    locations (row-major) of a ``width x height`` grid, sides log-uniform from 2 to 32,
    clamped to the grid as BorderDet clamps its predicted boxes."""
    k = torch.arange(count)
    centre = torch.stack([k % width, k // width % height], dim=1).float().repeat(n, 1)
    half = torch.exp(torch.empty(n * count, 2).uniform_(math.log(2), math.log(32), generator=g)) / 2
    top = torch.tensor([width - 1.0, height - 1.0])
    xy1 = torch.minimum((centre - half).clamp(min=0), top)
    xy2 = torch.minimum((centre + half).clamp(min=0), top)
    idx = torch.arange(n).repeat_interleave(count)[:, None].float()
    return torch.cat([idx, xy1, xy2], dim=1)


PER_IMAGE = BoxFormat("per-image", ("x1", "y1", "x2", "y2"), 4, _same, _same, _dense_head, _random_boxes,
                      _nasty_boxes, per_image=True)

FORMATS = (AXIS_ALIGNED, ROTATED, BEZIER, PER_IMAGE)


# ---- LiDAR boxes: 3-D boxes of point clouds


@dataclass(frozen=True, eq=False)
class LidarFormat:
    """3-D boxes of point-cloud detectors (mmdetection3d's LiDAR boxes): rows ``columns``,
    ``(x, y, z)`` the centre of the box's bottom face, ``(dx, dy, dz)`` its sizes along its
    own axes, ``yaw`` its counter-clockwise rotation about +z in radians. ``scene(batch,
    points, boxes, generator)``: a street scene as a LiDAR sees it, for `roiops bench` and
    the tests: points ``[B, N, 3]`` (half on objects, half on the ground) and boxes ``[B, M,
    7]``, proposals around the objects as a detector's first stage gives them."""

    name: str
    columns: tuple[str, ...]
    scene: Callable[[int, int, int, torch.Generator], tuple[Tensor, Tensor]]
    argument: str = "boxes"

    def rows(self) -> str:
        return "(" + ", ".join(self.columns) + ")"


def _street(batch: int, points: int, boxes: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """float32: 20 car-sized objects per scene in a 70 x 80 m field of view (KITTI's), points
    uniform in the objects and on a ground plane with 20 cm of relief, proposals jittered
    from the objects by up to 0.5 m, 10% in size and 0.2 rad in yaw."""
    def u(*shape: int, lo: float = 0.0, hi: float = 1.0) -> Tensor:
        return torch.rand(*shape, generator=g) * (hi - lo) + lo

    objects = 20
    centre = torch.stack([u(batch, objects, lo=2, hi=70), u(batch, objects, lo=-40, hi=40),
                          u(batch, objects, lo=-1.8, hi=-1.5)], -1)
    size = torch.stack([u(batch, objects, lo=3.2, hi=4.7), u(batch, objects, lo=1.4, hi=1.9),
                        u(batch, objects, lo=1.3, hi=1.8)], -1)
    yaw = u(batch, objects, 1, lo=-math.pi, hi=math.pi)
    truth = torch.cat([centre, size, yaw], -1)
    on = points // 2
    which = torch.randint(0, objects, (batch, on), generator=g)
    obj = torch.gather(truth, 1, which[..., None].expand(-1, -1, 7))
    local = (u(batch, on, 3) - torch.tensor([0.5, 0.5, 0.0])) * obj[..., 3:6]
    c, s = torch.cos(obj[..., 6]), torch.sin(obj[..., 6])
    on_objects = torch.stack([obj[..., 0] + local[..., 0] * c - local[..., 1] * s,
                              obj[..., 1] + local[..., 0] * s + local[..., 1] * c, obj[..., 2] + local[..., 2]], -1)
    rest = points - on
    ground = torch.stack([u(batch, rest, lo=0, hi=70), u(batch, rest, lo=-40, hi=40),
                          u(batch, rest, lo=-1.8, hi=-1.6)], -1)
    pts = torch.cat([on_objects, ground], 1)
    pts = torch.gather(pts, 1, torch.argsort(u(batch, points), dim=1)[..., None].expand(-1, -1, 3))
    which = torch.randint(0, objects, (batch, boxes), generator=g)
    props = torch.gather(truth, 1, which[..., None].expand(-1, -1, 7)).clone()
    props[..., :3] += u(batch, boxes, 3, lo=-0.5, hi=0.5)
    props[..., 3:6] *= u(batch, boxes, 3, lo=0.9, hi=1.1)
    props[..., 6] += u(batch, boxes, lo=-0.2, hi=0.2)
    return pts.contiguous(), props.contiguous()


LIDAR = LidarFormat("lidar", ("x", "y", "z", "dx", "dy", "dz", "yaw"), _street)
