"""Procedural coloured shapes: the data of the embedded demo (docs/design.md §5).

Every image is one anti-aliased shape of a fixed colour on a plain dark-grey background, at a
random position and size. Its prompt names the colour and the shape: ``"a red circle"``.

>>> g = torch.Generator().manual_seed(0)
>>> render(COLOURS.index("red"), SHAPES.index("circle"), g).shape
torch.Size([1, 3, 16, 16])
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

RESOLUTION = 16
SUPERSAMPLE = 4  # sub-pixels per pixel side for anti-aliasing

COLOURS: tuple[str, ...] = ("red", "green", "blue", "yellow", "magenta", "cyan")
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")

# Fixed RGB values in [0, 1], one row per entry of COLOURS.
COLOUR_RGB = torch.tensor(
    [
        [0.90, 0.10, 0.10],  # red
        [0.10, 0.75, 0.20],  # green
        [0.15, 0.30, 0.95],  # blue
        [0.95, 0.85, 0.10],  # yellow
        [0.90, 0.15, 0.85],  # magenta
        [0.10, 0.85, 0.90],  # cyan
    ],
    dtype=torch.float32,
)
BACKGROUND_RGB = torch.tensor([0.2, 0.2, 0.2], dtype=torch.float32)

# Shape size: the "radius" r in pixels (circle radius; other shapes scaled to similar area).
MIN_RADIUS = 3.5
MAX_RADIUS = 6.0


def prompt_for(colour_idx: int, shape_idx: int) -> str:
    return f"a {COLOURS[colour_idx]} {SHAPES[shape_idx]}"


def all_prompts() -> list[str]:
    """The ``len(COLOURS) * len(SHAPES)`` prompts, colour-major: ``"a red circle", "a red square", …``."""
    return [prompt_for(c, s) for c in range(len(COLOURS)) for s in range(len(SHAPES))]


def _short(text: str, limit: int = 80) -> str:
    from ..config import shorten
    return shorten(text, limit)


def parse_prompt(text: str) -> tuple[int, int]:
    """``"a red circle"`` → ``(colour_idx, shape_idx)``.

    Case-insensitive; the article and a trailing full stop are optional (``"Red circle."`` works).
    Raises ``ValueError`` naming the unknown word and listing the vocabulary.
    """
    words = text.strip().lower().rstrip(".").split()
    if words and words[0] in ("a", "an"):
        words = words[1:]
    vocab = f"colours: {', '.join(COLOURS)}; shapes: {', '.join(SHAPES)}"
    if len(words) != 2:
        raise ValueError(
            f"demo prompt {_short(text)!r} must have the form 'a <colour> <shape>' (e.g. 'a red circle'); {vocab}"
        )
    colour, shape = words
    if colour not in COLOURS:
        raise ValueError(f"demo prompt {_short(text)!r}: unknown colour {_short(colour)!r}; {vocab}")
    if shape not in SHAPES:
        raise ValueError(f"demo prompt {_short(text)!r}: unknown shape {_short(shape)!r}; {vocab}")
    return COLOURS.index(colour), SHAPES.index(shape)


def _as_index(idx, n: int, what: str) -> torch.Tensor:
    t = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
    if t.numel() and (t.min() < 0 or t.max() >= n):
        raise ValueError(f"{what} index out of range [0, {n}): {t.tolist()}")
    return t


def _coverage(shape_idx: torch.Tensor, cx, cy, r, res: int, ss: int) -> torch.Tensor:
    """(B, res, res) fraction of each pixel covered by the shape (supersampled box filter)."""
    n = res * ss
    coords = (torch.arange(n, dtype=torch.float32) + 0.5) / ss  # sub-pixel centres, pixel units
    x = coords.view(1, 1, n)
    y = coords.view(1, n, 1)
    cx, cy, r = cx.view(-1, 1, 1), cy.view(-1, 1, 1), r.view(-1, 1, 1)
    dx, dy = x - cx, y - cy
    adx, ady = dx.abs(), dy.abs()
    circle = dx * dx + dy * dy <= r * r
    half = 0.85 * r
    square = (adx <= half) & (ady <= half)
    top, base = -1.05 * r, 0.8 * r  # upward triangle, base width 2.1 r
    triangle = (dy <= base) & (adx <= (dy - top) / (base - top) * 1.05 * r)
    arm = 0.32 * r
    cross = ((adx <= arm) & (ady <= r)) | ((ady <= arm) & (adx <= r))
    masks = torch.stack([circle, square, triangle, cross], dim=1).float()  # (B, 4, n, n)
    sel = masks.gather(1, shape_idx.view(-1, 1, 1, 1).expand(-1, 1, n, n))
    return F.avg_pool2d(sel, ss).squeeze(1)


def render(
    colour_idx: int | Sequence[int] | torch.Tensor,
    shape_idx: int | Sequence[int] | torch.Tensor,
    generator: torch.Generator | None = None,
    resolution: int = RESOLUTION,
) -> torch.Tensor:
    """Images (B, 3, H, W) float32 in [0, 1] of the given colours and shapes.

    ``colour_idx`` and ``shape_idx`` are ints or 1-D index sequences/tensors, broadcast together to
    length B. Position and size are drawn from ``generator`` (same generator state → same images).
    """
    c = _as_index(colour_idx, len(COLOURS), "colour")
    s = _as_index(shape_idx, len(SHAPES), "shape")
    c, s = torch.broadcast_tensors(c, s)
    b = c.shape[0]
    scale = resolution / RESOLUTION
    u = torch.rand(b, 3, generator=generator)
    r = (MIN_RADIUS + (MAX_RADIUS - MIN_RADIUS) * u[:, 0]) * scale
    margin = r + 0.5 * scale
    cx = margin + (resolution - 2 * margin) * u[:, 1]
    cy = margin + (resolution - 2 * margin) * u[:, 2]
    alpha = _coverage(s, cx, cy, r, resolution, SUPERSAMPLE).unsqueeze(1)  # (B, 1, H, W)
    fg = COLOUR_RGB[c].view(b, 3, 1, 1)
    bg = BACKGROUND_RGB.view(1, 3, 1, 1)
    return bg * (1 - alpha) + fg * alpha


def shape_area(images: torch.Tensor, threshold: float = 0.15) -> torch.Tensor:
    """(B,) fraction of each image's pixels that are not background: a channel more than ``threshold`` away from
    the grey background (values in [0, 1]; images (B, 3, H, W)). How big the shape is drawn, 0..1 -- the taste of
    the scripted artist in the tests and benchmarks ("bigger shapes")."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    away = (images.float() - BACKGROUND_RGB.view(1, 3, 1, 1)).abs().amax(1)
    return (away > threshold).float().mean((1, 2))


def sample_batch(
    n: int, generator: torch.Generator | None = None, resolution: int = RESOLUTION
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` random images with uniformly drawn labels: ``(images, colour_idx, shape_idx)``."""
    c = torch.randint(len(COLOURS), (n,), generator=generator)
    s = torch.randint(len(SHAPES), (n,), generator=generator)
    return render(c, s, generator, resolution), c, s
