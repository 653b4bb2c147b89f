"""Frozen image features for the taste model (treegrpo/artist/taste.py): ``encoder(images (B, 3, H, W) in [0, 1]) ->
(B, D) float32``, named so that a saved taste model finds its encoder again.

* ``demo``: the embedded demo's classifier trunk (256 pooled features; no files);
* ``reward:<name>``: the image tower of a reward model (the CLIP-based hpsv2, pickscore, clipscore,
  laion_aesthetic; the Qwen2-VL vision tower of vlm_judge and hpsv3), from the same files that reward loads;
* ``clip_vision``: in ComfyUI, a CLIP Vision model of ``CLIPVisionLoader`` (its ``image_embeds``;
  treegrpo/comfyui/artist/taste.py).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

TOWER_REWARDS = ("hpsv2", "pickscore", "clipscore", "laion_aesthetic", "vlm_judge", "hpsv3")


class DemoEncoder:
    """The embedded demo's built-in encoder (179,) in three groups: the demo classifier's trunk channels averaged over
    positions (128, what it sees: shape, how much of it), a 4×4 colour thumbnail (48, where things are) and the mean
    colour of the picture's colourful pixels, each weighted by its chroma² (3, RGB in [0, 1]: the colour of what is
    drawn, which the thumbnail dilutes with the background). The taste model gives each group the same share of its
    prior (:func:`treegrpo.artist.taste.group_weights`), so 3 colour numbers are not drowned by 128 shape numbers.

    ``colour=False``: the encoder before the colour group (176,), which taste models saved before it was added were
    learnt on (:func:`feature_encoder` picks it by their feature count)."""

    name = "demo"

    def __init__(self, device="cpu", colour: bool = True):
        from ..demo.classifier import load_classifier

        self.model = load_classifier(device=device).eval()
        self.device = torch.device(device)
        self.colour = colour
        self.groups = (128, 48, 3) if colour else ()
        self.dim = 179 if colour else 176

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"demo features: images must be (B, 3, H, W), got {tuple(images.shape)}")
        x = images.to(self.device, torch.float32).clamp(0, 1)
        res = self.model.config.resolution
        if x.shape[-2:] != (res, res):
            x = torch.nn.functional.interpolate(x, size=(res, res), mode="bilinear", antialias=True, align_corners=False)
        trunk = self.model.features(x * 2 - 1).mean(dim=(2, 3))
        thumb = torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1)
        parts = [trunk, thumb] + ([drawn_colour(x)] if self.colour else [])
        return torch.cat(parts, 1).float().cpu()


def drawn_colour(images: torch.Tensor) -> torch.Tensor:
    """(B, 3) the mean colour of ``images`` (B, 3, H, W) in [0, 1], each pixel weighted by its chroma squared
    (largest minus smallest channel): the colour of what is drawn on a grey background (grey pixels weigh 0; an
    all-grey picture gives 0)."""
    c = (images.amax(1, keepdim=True) - images.amin(1, keepdim=True)) ** 2
    return (images * c).sum((2, 3)) / c.sum((2, 3)).clamp_min(1e-8)


class RewardTower:
    """The normalised image embedding of a CLIP-based reward model."""

    def __init__(self, reward):
        if not hasattr(reward, "image_features"):
            raise ValueError(f"reward {getattr(reward, 'name', reward)!r} has no image tower to learn a taste on; "
                             f"use one of {', '.join(TOWER_REWARDS)} or the demo features")
        self.reward = reward
        self.name = f"reward:{reward.name}"
        self.path = getattr(reward, "source_path", None)                  # recorded with a saved taste model
        self.options = {k: v for k, v in (getattr(reward, "source_options", None) or {}).items()
                        if isinstance(v, (str, int, float, bool)) or v is None}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return self.reward.image_features(images)


def feature_encoder(name: str, path: Optional[str] = None, device="cpu", reward=None,
                    options: Optional[dict] = None, dim: Optional[int] = None) -> Callable:
    """The encoder called ``name`` (``demo`` or ``reward:<name>``, loaded from ``path`` with ``options``;
    ``reward``: an already loaded reward model to reuse, e.g. the Reward Model Loader's; ``dim``: the feature
    count of a saved taste model, which picks the demo encoder it was learnt on)."""
    if name == "demo":
        return DemoEncoder(device, colour=dim != 176)
    if name.startswith("reward:"):
        rname = name.split(":", 1)[1]
        if rname not in TOWER_REWARDS:
            raise ValueError(f"taste features {name!r}: reward {rname!r} has no image tower; use one of "
                             f"{', '.join('reward:' + r for r in TOWER_REWARDS)} or demo")
        if reward is None:
            from ..rewards.base import load_reward
            reward = load_reward(rname, path=path, device=device, **(options or {}))
        return RewardTower(reward)
    if name == "clip_vision":
        raise ValueError("taste features 'clip_vision' come from ComfyUI's CLIPVisionLoader: score this taste model "
                         "in ComfyUI (Reward Model Loader with a CLIP Vision input)")
    raise ValueError(f"unknown taste features {name!r}: use demo, clip_vision (ComfyUI) or "
                     f"{', '.join('reward:' + r for r in TOWER_REWARDS)}")
