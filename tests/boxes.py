"""Box sets shared by the tests: ordinary ones and the nasty cases every kernel must survive."""

from __future__ import annotations

import torch


def random_boxes(n_images: int, count: int, width: float, height: float, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[count, 5] boxes with x1 <= x2, y1 <= y2, inside an image of width x height pixels."""
    idx = torch.randint(0, n_images, (count, 1), generator=generator).to(dtype)
    xy = torch.rand(count, 4, generator=generator, dtype=torch.float64)
    x = torch.sort(xy[:, [0, 2]] * width, dim=1).values
    y = torch.sort(xy[:, [1, 3]] * height, dim=1).values
    return torch.cat([idx, torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1).to(dtype)], 1)


def nasty_boxes(n_images: int, width: float, height: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Outside the map, negative, zero and sub-pixel size, larger than the map, inverted,
    exactly on the border, in image pixels for a width x height image."""
    w, h = width, height
    rows = [
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
    ]
    out = torch.tensor(rows, dtype=dtype)
    out[:, 0] = torch.arange(len(rows)) % n_images
    return out


def nasty_coordinates(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Single coordinates that the geometry primitives must treat exactly: NaN, +-inf, +-0,
    halves and their neighbours, the largest values with a fraction, integers beyond the
    exact range, subnormals, the border rule's limits, plus a spread of random ones."""
    f = torch.finfo(dtype)
    frac_end = 2.0 ** {torch.float32: 23, torch.float64: 52}[dtype]  # the last halves lie below
    special = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, f.tiny / 4, -f.tiny / 4, f.max, -f.max,
               0.5, -0.5, 1.5, -1.5, 2.5, -2.5, frac_end - 0.5, -(frac_end - 0.5), frac_end + 1, 2 * frac_end + 2,
               1e30, -1e30, -1.0, 1.0, 8.0, 9.0, 10.0]
    values = torch.tensor(special, dtype=dtype)
    below_half = torch.nextafter(torch.tensor(0.5, dtype=dtype), torch.tensor(0.0, dtype=dtype))
    near = torch.stack([below_half, torch.nextafter(torch.tensor(-1.0, dtype=dtype), torch.tensor(-2.0, dtype=dtype)),
                        torch.nextafter(torch.tensor(9.0, dtype=dtype), torch.tensor(10.0, dtype=dtype))])
    g = torch.Generator().manual_seed(0)
    spread = torch.cat([(torch.rand(3000, generator=g, dtype=torch.float64) * 16 - 4),
                        torch.randint(-40, 80, (1000,), generator=g) / 4.0]).to(dtype)
    return torch.cat([values, near, -near, spread])


def rotated_boxes(n_images: int, count: int, width: float, height: float, generator: torch.Generator,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[count, 6] rotated boxes (batch_index, cx, cy, w, h, angle in degrees): centres inside an
    image of width x height pixels, sides up to half the image's, any angle in (-180, 180)."""
    idx = torch.randint(0, n_images, (count, 1), generator=generator).to(torch.float64)
    u = torch.rand(count, 5, generator=generator, dtype=torch.float64)
    centre = u[:, :2] * torch.tensor([width, height], dtype=torch.float64)
    size = (0.05 + u[:, 2:4]) * torch.tensor([width, height], dtype=torch.float64) / 2
    angle = u[:, 4:] * 360 - 180
    return torch.cat([idx, centre, size, angle], 1).to(dtype)


def nasty_rotated_boxes(n_images: int, width: float, height: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rotated boxes (angle in degrees) off the map, across its corners and border, of zero,
    negative and sub-pixel size, larger than the map, at multiples of 90 degrees."""
    w, h = width, height
    rows = [
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
    ]
    out = torch.tensor(rows, dtype=dtype)
    out[:, 0] = torch.arange(len(rows)) % n_images
    return out


def bezier_boxes(n_images: int, count: int, width: float, height: float, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[count, 17] bezier boxes (batch_index, top curve P0..P3 left to right, bottom curve
    right to left): curved text lines inside an image of width x height pixels, of any
    slant, their control points jittered."""
    idx = torch.randint(0, n_images, (count, 1), generator=generator).to(torch.float64)
    u = torch.rand(count, 5, generator=generator, dtype=torch.float64)
    x0, y0 = u[:, 0] * width * 0.7, u[:, 1] * height * 0.8
    length, thick = (0.1 + 0.3 * u[:, 2]) * width, (0.03 + 0.15 * u[:, 3]) * height
    slant = (u[:, 4] - 0.5) * 0.6 * height
    t = torch.tensor([0.0, 1 / 3, 2 / 3, 1.0], dtype=torch.float64)
    jitter = (torch.rand(count, 2, 4, 2, generator=generator, dtype=torch.float64) - 0.5) * thick[:, None, None, None]
    top_x = x0[:, None] + length[:, None] * t
    top_y = y0[:, None] + slant[:, None] * t
    top = torch.stack([top_x, top_y], -1) + jitter[:, 0]
    bottom = torch.stack([top_x, top_y + thick[:, None]], -1) + jitter[:, 1]
    rows = torch.cat([top.reshape(count, 8), bottom.flip(1).reshape(count, 8)], 1)
    return torch.cat([idx, rows], 1).to(dtype)


def nasty_bezier_boxes(n_images: int, width: float, height: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bezier boxes that are horizontal (bins of height 0), vertical (width 0), a single
    point, off the map, across its border and corners, larger than it, reversed (top
    curve right to left), crossing curves, in image pixels for a width x height image."""
    w, h = width, height

    def box(top: list[tuple[float, float]], bottom: list[tuple[float, float]]) -> list[float]:
        """Top curve left to right, bottom curve given left to right (stored reversed)."""
        return [0.0] + [c for p in top for c in p] + [c for p in bottom[::-1] for c in p]

    def line(x1: float, y1: float, x2: float, y2: float) -> list[tuple[float, float]]:
        return [(x1 + (x2 - x1) * s / 3, y1 + (y2 - y1) * s / 3) for s in range(4)]

    rows = [
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
    ]
    out = torch.tensor(rows, dtype=dtype)
    out[:, 0] = torch.arange(len(rows)) % n_images
    return out
