"""Reward model interface and registry.

A reward model maps decoded images and their prompts to one float per image:
``reward(images (B, 3, H, W) float32 in [0, 1], prompts: list[str]) -> (B,) float32``.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch


class RewardModel(Protocol):
    name: str

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


_REGISTRY: dict[str, Callable[..., RewardModel]] = {}


def register(name: str):
    """Class/function decorator: ``@register("jpeg")`` makes ``load_reward("jpeg", ...)`` build it."""

    def deco(factory):
        _REGISTRY[name] = factory
        return factory

    return deco


def available() -> list[str]:
    _import_builtin()
    return sorted(_REGISTRY)


def load_reward(name: str, path: str | None = None, device: str | torch.device = "cpu", **kwargs) -> RewardModel:
    """Build reward ``name`` (see ``available()``); ``path`` points at its local weight files."""
    _import_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward model {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name](path=path, device=device, **kwargs)


def check_batch(images: torch.Tensor, prompts: list[str], who: str) -> None:
    """Clear errors for the inputs every reward model shares."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"{who}: images must be (B, 3, H, W), got {tuple(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError(f"{who}: empty image batch")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{who}: {images.shape[0]} images but {len(prompts)} prompts; pass one prompt per image")


def _import_builtin() -> None:
    from . import jpeg  # noqa: F401
    # torch reward models: their heavy libraries (open_clip, transformers, image-reward) load when one is built
    from . import aesthetic, clipscore, hps, imagereward, pickscore  # noqa: F401
    try:
        from . import demo_adherence  # noqa: F401
    except ImportError:  # pragma: no cover - demo package missing
        pass
