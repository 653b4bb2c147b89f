"""The demo's held-out judge: a second colour + shape classifier, independent of the training reward's.

The training reward (:mod:`treegrpo.demo.classifier`, a 16 px CNN with batch norm) can be fooled by a texture;
a judge that is never trained on should not be fooled the same way. This one differs in everything but the task:
its input is low-passed (a fixed 2×2 average, so it sees 8×8 and no pixel-level texture), it is a bias-free-norm
MLP-mixer-like stack of 1×1 and depthwise convolutions with GELU, a different seed and a different augmentation
draw. Trained by ``treegrpo.demo.pretrain`` (``--only judge``); ``demo_judge`` is its reward.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .classifier import load_labelled, save_labelled
from .model import ASSETS
from .shapes import COLOURS, RESOLUTION, SHAPES

DEFAULT_JUDGE_PATH = ASSETS / "demo_judge.safetensors"
FORMAT = "treegrpo-demo-judge"


@dataclass
class JudgeConfig:
    resolution: int = RESOLUTION
    width: int = 48
    depth: int = 3
    num_colours: int = len(COLOURS)
    num_shapes: int = len(SHAPES)


class _Block(nn.Module):
    """Depthwise 3×3 (space) then a 1×1 MLP (channels), each with a residual and GroupNorm."""

    def __init__(self, w: int):
        super().__init__()
        self.norm1, self.space = nn.GroupNorm(1, w), nn.Conv2d(w, w, 3, padding=1, groups=w)
        self.norm2 = nn.GroupNorm(1, w)
        self.mlp = nn.Sequential(nn.Conv2d(w, 2 * w, 1), nn.GELU(), nn.Conv2d(2 * w, w, 1))

    def forward(self, x):
        x = x + self.space(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DemoJudge(nn.Module):
    """``forward(images (B,3,16,16) in [0,1]) -> (colour_logits (B,C), shape_logits (B,S))``."""

    def __init__(self, config: JudgeConfig | None = None):
        super().__init__()
        self.config = cfg = config or JudgeConfig()
        self.stem = nn.Conv2d(3, cfg.width, 1)
        self.blocks = nn.Sequential(*[_Block(cfg.width) for _ in range(cfg.depth)])
        self.norm = nn.GroupNorm(1, cfg.width)
        self.colour_head = nn.Linear(2 * cfg.width, cfg.num_colours)
        self.shape_head = nn.Linear(2 * cfg.width, cfg.num_shapes)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.avg_pool2d(images * 2 - 1, 2)                                # the low-pass: 16 px -> 8 px
        f = self.norm(self.blocks(self.stem(x)))
        pooled = torch.cat([f.mean(dim=(2, 3)), f.amax(dim=(2, 3))], dim=1)
        return self.colour_head(pooled), self.shape_head(pooled)

    @torch.no_grad()
    def probabilities(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        colour, shape = self(images)
        return colour.float().softmax(-1), shape.float().softmax(-1)


def save_judge(model: DemoJudge, path: str | os.PathLike, extra_metadata: dict[str, str] | None = None) -> None:
    """Write float32 safetensors with the config in the metadata (atomic)."""
    save_labelled(model, path, FORMAT, extra_metadata)


def load_judge(path: str | os.PathLike | None = None, device: str | torch.device = "cpu") -> DemoJudge:
    """Load the judge (default: the shipped ``assets/demo_judge.safetensors``), in eval mode."""
    path = Path(path) if path is not None else DEFAULT_JUDGE_PATH
    return load_labelled(path, FORMAT, JudgeConfig, DemoJudge, "demo judge", device)
