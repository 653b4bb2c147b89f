"""Scoring a batch of images with one reward model for the ComfyUI Reward Scorer node (chained scorers merge)."""
from __future__ import annotations

from typing import Optional

import torch

from ..advantages import check_rewards
from ..video import score_over_frames


def expand_prompts(prompt: str | list[str], n: int) -> list[str]:
    """One prompt for all ``n`` images, or exactly one line per image."""
    lines = [prompt] if isinstance(prompt, str) else list(prompt)
    if isinstance(prompt, str):
        lines = [ln.strip() for ln in prompt.splitlines() if ln.strip()] or [""]
    if len(lines) == 1:
        return lines * n
    if len(lines) != n:
        raise ValueError(f"{len(lines)} prompt lines for {n} images: give one prompt, or one line per image")
    return lines


def score_images(model, name: str, images: torch.Tensor, prompt: str | list[str], weight: float,
                 previous: Optional[dict] = None) -> dict:
    """``{"rewards": {name: (n,)}, "weights": {name: w}}`` for images (n, 3, H, W) in [0, 1], or videos
    (n, F, 3, H, W) (each scored by the mean over its frames), merged with ``previous`` (the same batch scored by
    other models)."""
    n = images.shape[0]
    values = score_over_frames(model, images.float(), expand_prompts(prompt, n))
    check_rewards({name: values}, n)
    out = {"rewards": {}, "weights": {}}
    if previous:
        for k, v in previous["rewards"].items():
            if v.numel() != n:
                raise ValueError(f"cannot combine reward {k!r} over {v.numel()} images with {name!r} over {n}")
        out["rewards"].update(previous["rewards"])
        out["weights"].update(previous["weights"])
    key = name
    i = 2
    while key in out["rewards"]:
        key, i = f"{name}#{i}", i + 1
    out["rewards"][key] = values
    out["weights"][key] = float(weight)
    return out
