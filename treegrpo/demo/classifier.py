"""A small CNN that names the colour and the shape of a 3×16×16 demo image (the demo's training reward).

Trained by ``treegrpo.demo.pretrain`` on generator images with noise / blur / colour augmentation so
that it also judges imperfect model samples sensibly. Input: images in [0, 1].
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from .model import ASSETS, REGENERATE_HINT, check_state_dict, read_safetensors, save_weights
from .shapes import COLOURS, RESOLUTION, SHAPES

DEFAULT_CLASSIFIER_PATH = ASSETS / "demo_classifier.safetensors"
FORMAT = "treegrpo-demo-classifier"


@dataclass
class ClassifierConfig:
    resolution: int = RESOLUTION
    width: int = 32
    num_colours: int = len(COLOURS)
    num_shapes: int = len(SHAPES)


class DemoClassifier(nn.Module):
    """``forward(images (B,3,16,16) in [0,1]) -> (colour_logits (B,C), shape_logits (B,S))``."""

    def __init__(self, config: ClassifierConfig | None = None):
        super().__init__()
        self.config = cfg = config or ClassifierConfig()
        w = cfg.width

        def conv(cin, cout, stride=1):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.BatchNorm2d(cout), nn.ReLU())

        self.features = nn.Sequential(
            conv(3, w), conv(w, w), conv(w, 2 * w, 2), conv(2 * w, 2 * w), conv(2 * w, 4 * w, 2)
        )  # 16 → 8 → 4
        self.colour_head = nn.Linear(8 * w, cfg.num_colours)
        self.shape_head = nn.Linear(8 * w, cfg.num_shapes)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 8·width) the pooled features the heads read (mean and max over positions: position-invariant)."""
        f = self.features(images * 2 - 1)
        return torch.cat([f.mean(dim=(2, 3)), f.amax(dim=(2, 3))], dim=1)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.embed(images)
        return self.colour_head(pooled), self.shape_head(pooled)

    @torch.no_grad()
    def probabilities(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        colour, shape = self(images)
        return colour.float().softmax(-1), shape.float().softmax(-1)


def save_labelled(model: nn.Module, path: str | os.PathLike, fmt: str, extra_metadata: dict[str, str] | None = None):
    """Write a colour + shape classifier (this one or the judge) as float32 safetensors with its format, config and
    vocabularies in the metadata (atomic)."""
    meta = {"format": fmt, "config": json.dumps(asdict(model.config), sort_keys=True),
            "colours": json.dumps(list(COLOURS)), "shapes": json.dumps(list(SHAPES))}
    save_weights(model, path, {**meta, **(extra_metadata or {})})


def load_labelled(path: Path, fmt: str, config_cls, model_cls, what: str, device) -> nn.Module:
    """Read a file :func:`save_labelled` wrote: check its format, config fields and vocabularies against this code,
    build ``model_cls(config_cls(...))`` and load it, in eval mode without gradients."""
    state, meta = read_safetensors(path, what)
    if meta.get("format") != fmt or "config" not in meta:
        raise ValueError(f"{str(path)!r} is not a {what} file (metadata format={meta.get('format')!r}, expected "
                         f"{fmt!r} with a 'config' entry); {REGENERATE_HINT}")
    data = json.loads(meta["config"])
    known = {f.name for f in fields(config_cls)}
    if set(data) - known:
        raise ValueError(f"{what} at {str(path)!r}: unknown config fields {sorted(set(data) - known)}")
    for key, vocab in (("colours", COLOURS), ("shapes", SHAPES)):
        if key in meta and json.loads(meta[key]) != list(vocab):
            raise ValueError(f"{what} at {str(path)!r} was trained on {key} {json.loads(meta[key])}, but this code "
                             f"has {list(vocab)}; {REGENERATE_HINT}")
    model = model_cls(config_cls(**data))
    check_state_dict(model, state, what, path)
    model.load_state_dict(state)
    return model.to(device).eval().requires_grad_(False)


def save_classifier(model: DemoClassifier, path: str | os.PathLike, extra_metadata: dict[str, str] | None = None) -> None:
    """Write float32 safetensors with the config in the metadata (atomic)."""
    save_labelled(model, path, FORMAT, extra_metadata)


def load_classifier(path: str | os.PathLike | None = None, device: str | torch.device = "cpu") -> DemoClassifier:
    """Load the demo classifier (default: the shipped ``assets/demo_classifier.safetensors``), in eval mode."""
    path = Path(path) if path is not None else DEFAULT_CLASSIFIER_PATH
    return load_labelled(path, FORMAT, ClassifierConfig, DemoClassifier, "demo classifier", device)
