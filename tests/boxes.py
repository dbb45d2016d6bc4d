"""Coordinates the geometry primitives must treat exactly. The box sets (ordinary and nasty
boxes of each format) are their formats' own: roiops/_boxes.py."""

from __future__ import annotations

import torch


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
