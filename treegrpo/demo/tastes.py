"""Hidden tastes of a simulated artist on the demo's pictures (benchmarks/bench_artist.py, the tests' scripted
artists). Each taste maps images (B, 3, H, W) in [0, 1] to (B,) values in [0, 1], higher = liked, and each guards
against the degenerate picture: a picture with almost no shape drawn (under ``MIN_AREA`` of its pixels) is worth 0
to every taste, and a shape that fades into the background is worth less — every value is multiplied by the
shape's clarity, ``min(1, c / CLEAR)`` with c the mean over its pixels of their largest channel distance from the
background (the demo draws its colours at 0.55–0.75). So no taste can be satisfied by drawing nothing, or by
drawing less and less of something (the way a generator most easily makes a shape "smaller").

* ``big``: the fraction of the picture the shape covers (:func:`treegrpo.demo.shapes.shape_area`);
* ``small``: ``(1 − area / 0.5) · min(1, area / 0.06)``: a small shape, but one that can be seen (liked most at 6 %
  of the picture, less below: a taste whose best is next to the empty picture would be one no training can follow);
* ``left`` / ``right`` / ``up``: the shape's centre of mass towards that side: ``1 − x̄`` for ``left`` with x̄ the
  centroid's horizontal position in [0, 1] (0 = the left edge), ``x̄`` for ``right``, ``1 − ȳ`` for ``up``;
* ``warm``: the shape's mean colour has a hue near ``WARM_HUE`` (20°, an orange-leaning red): ``1 − |hue − 20°| /
  40°`` clipped at 0 — a hue inside the red the prompt asks for, not another colour;
* ``cool``: the same with ``COOL_HUE`` (−20°, a crimson red leaning towards magenta).

The taste model's demo encoder (``treegrpo.artist.features.DemoEncoder``) was chosen on ``big`` before the others
existed; its colour group was added when it could not learn ``warm`` (2026-12-06), and ``cool`` was written after
that, to measure it on a colour taste that chose nothing.
"""
from __future__ import annotations

from typing import Callable

import torch

from .shapes import BACKGROUND_RGB

MIN_AREA = 0.02          # below this the picture counts as empty (about 5 of 256 pixels)
THRESHOLD = 0.15         # a pixel belongs to the shape when a channel is this far from the background grey
WARM_HUE = 20.0          # degrees
COOL_HUE = -20.0         # degrees
HUE_WIDTH = 40.0         # degrees from WARM_HUE at which ``warm`` reaches 0
SMALL_BEST = 0.06        # the area ``small`` likes most
CLEAR = 0.5              # a shape this far from the background (largest channel) is fully clear


def _mask(images: torch.Tensor) -> torch.Tensor:
    """(B, H, W) float: 1 where a pixel is part of the shape."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    away = (images.float() - BACKGROUND_RGB.to(images.device).view(1, 3, 1, 1)).abs().amax(1)
    return (away > THRESHOLD).float()


def _present(mask: torch.Tensor) -> torch.Tensor:
    return mask.mean((1, 2)) >= MIN_AREA


def clarity(images: torch.Tensor) -> torch.Tensor:
    """(B,) in [0, 1]: ``min(1, c / CLEAR)``, c the mean over the shape's pixels of their largest channel distance
    from the background (0 without shape pixels)."""
    away = (images.float() - BACKGROUND_RGB.to(images.device).view(1, 3, 1, 1)).abs().amax(1)
    m = (away > THRESHOLD).float()
    c = (away * m).sum((1, 2)) / m.sum((1, 2)).clamp_min(1)
    return (c / CLEAR).clamp(0, 1)


def big(images: torch.Tensor) -> torch.Tensor:
    m = _mask(images)
    area = m.mean((1, 2))
    return torch.where(_present(m), area, torch.zeros_like(area))


def small(images: torch.Tensor) -> torch.Tensor:
    m = _mask(images)
    area = m.mean((1, 2))
    v = (1 - area / 0.5).clamp(0, 1) * (area / SMALL_BEST).clamp(max=1)
    return torch.where(_present(m), v, torch.zeros_like(area))


def _centroid(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x̄, ȳ) in [0, 1] of each mask's pixels (pixel centres; 0.5 for an empty mask)."""
    _, h, w = m.shape
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) / w
    ys = (torch.arange(h, dtype=torch.float32) + 0.5) / h
    mass = m.sum((1, 2)).clamp_min(1e-6)
    x = (m * xs.view(1, 1, w)).sum((1, 2)) / mass
    y = (m * ys.view(1, h, 1)).sum((1, 2)) / mass
    return x, y


def _side(images: torch.Tensor, pick: Callable) -> torch.Tensor:
    m = _mask(images)
    v = pick(*_centroid(m))
    return torch.where(_present(m), v, torch.zeros_like(v))


def left(images: torch.Tensor) -> torch.Tensor:
    return _side(images, lambda x, y: 1 - x)


def right(images: torch.Tensor) -> torch.Tensor:
    return _side(images, lambda x, y: x)


def up(images: torch.Tensor) -> torch.Tensor:
    return _side(images, lambda x, y: 1 - y)


def hue_degrees(rgb: torch.Tensor) -> torch.Tensor:
    """(B,) the HSV hue in degrees, in (−180, 180], of colours ``rgb`` (B, 3) in [0, 1] (0 for a grey)."""
    r, g, b = rgb.unbind(-1)
    mx, _ = rgb.max(-1)
    mn, _ = rgb.min(-1)
    c = (mx - mn).clamp_min(1e-6)
    h = torch.where(mx == r, ((g - b) / c) % 6, torch.where(mx == g, (b - r) / c + 2, (r - g) / c + 4)) * 60.0
    h = torch.where(h > 180, h - 360, h)
    return torch.where(mx - mn < 1e-6, torch.zeros_like(h), h)


def _hue_near(images: torch.Tensor, hue: float) -> torch.Tensor:
    m = _mask(images)
    mass = m.sum((1, 2)).clamp_min(1e-6)
    mean_rgb = (images.float() * m.unsqueeze(1)).sum((2, 3)) / mass.unsqueeze(1)
    v = (1 - (hue_degrees(mean_rgb) - hue).abs() / HUE_WIDTH).clamp(0, 1)
    return torch.where(_present(m), v, torch.zeros_like(v))


def warm(images: torch.Tensor) -> torch.Tensor:
    return _hue_near(images, WARM_HUE)


def cool(images: torch.Tensor) -> torch.Tensor:
    return _hue_near(images, COOL_HUE)


def _clear(value: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def taste_value(images: torch.Tensor) -> torch.Tensor:
        return value(images) * clarity(images)
    taste_value.__name__ = value.__name__
    return taste_value


#: the tastes as the simulated artist sees them: each function's value times the shape's clarity
TASTES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    name: _clear(f) for name, f in {"big": big, "small": small, "left": left, "right": right, "up": up,
                                    "warm": warm, "cool": cool}.items()}


def taste(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The taste called ``name`` (one of :data:`TASTES`)."""
    if name not in TASTES:
        raise ValueError(f"unknown taste {name!r}: use one of {', '.join(TASTES)}")
    return TASTES[name]
