"""The Train node's presets: named tails after the window, with what each costs per tree.

A preset fills the leaves' ODE tail (``tree.tail_solver``, ``tree.tail_steps``); the window (start, width, branch)
stays as set. ``custom`` keeps the tail widgets as they are."""
from __future__ import annotations

import dataclasses

from .config import TreeConfig
from .tree import expected_nfe, level_sizes

#: preset → the tree fields it sets
PRESETS = {
    "fast": {"tail_solver": "dpmpp_2m", "tail_steps": 2},       # a short second-order tail: the cheapest leaves
    "balanced": {"tail_solver": "dpmpp_2m", "tail_steps": 6},
    "paper": {"tail_solver": "euler", "tail_steps": 0},         # every leaf runs the schedule's remaining steps
}
CHOICES = ("custom", *PRESETS)


def apply_preset(cfg: TreeConfig, preset: str) -> TreeConfig:
    """``cfg`` with ``preset``'s tail (``custom``: unchanged). A preset never lengthens the tail: where its steps
    are as many as the schedule leaves after ``cfg``'s window or more (a short schedule: Z-Image's 8 steps leave 4
    after a window at steps 1–3), the tail is the schedule's own remaining steps (``tail_steps`` 0)."""
    if preset in (None, "", "custom"):
        return cfg
    if preset not in PRESETS:
        raise ValueError(f"preset: {preset!r} is not one of {list(CHOICES)}")
    fields = dict(PRESETS[preset])
    left = cfg.steps - cfg.window_start - (0 if cfg.method == "ode" else cfg.window_width)
    if fields["tail_steps"] >= left:
        fields["tail_steps"] = 0
    return dataclasses.replace(cfg, **fields)


def preset_cost(cfg: TreeConfig) -> tuple[int, int]:
    """(denoiser calls of one tree without CFG, parents trained per tree = update rows before the KL's reference
    pass) for ``cfg``."""
    n = level_sizes(cfg.branching, cfg.leaf_cap)
    return expected_nfe(cfg), sum(n[:-1])


def presets_help(base: TreeConfig) -> str:
    """One sentence per preset with its cost on ``base``'s window (the tooltip and the README's table)."""
    parts = []
    for name in PRESETS:
        c = apply_preset(base, name)
        nfe, rows = preset_cost(c)
        tail = f"{c.tail_solver} {c.tail_steps}-step tail" if c.tail_steps else f"{c.tail_solver} full tail"
        parts.append(f"{name}: {tail}, {nfe} denoiser calls and {rows} trained parents per tree")
    return "; ".join(parts)
