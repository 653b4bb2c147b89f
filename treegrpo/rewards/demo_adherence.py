"""Prompt adherence for the embedded demo: does a small classifier see the prompt's colour and shape?

``reward = p(colour of the prompt) · p(shape of the prompt)`` under the demo classifier
(``treegrpo.demo.classifier``, trained by ``treegrpo.demo.pretrain``): in [0, 1], 1 = the judge is sure
the image shows exactly what the prompt asks for. ``demo_judge`` is the same question put to the held-out judge
(``treegrpo.demo.judge``: another architecture and seed), for scoring evaluations only.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..demo.classifier import load_classifier
from ..demo.judge import load_judge
from ..demo.shapes import parse_prompt
from .base import check_batch, register


@register("demo_adherence")
class DemoAdherence:
    name = "demo_adherence"

    load = staticmethod(load_classifier)

    @staticmethod
    def check_prompts(prompts: list[str], who: str = "demo_adherence") -> None:
        """Every prompt is one the demo's classifier scores, 'a <colour> <shape>' (ValueError naming the first
        that is not), before any model is built."""
        for p in prompts:
            try:
                parse_prompt(p)
            except ValueError as e:
                raise ValueError(f"reward {who!r} is the embedded demo's: it scores only the demo's prompts, "
                                 f"'a <colour> <shape>', and {e}. For your own prompts give another reward "
                                 "(`treegrpo rewards` lists them)") from None

    def __init__(self, path: str | os.PathLike | None = None, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.classifier = self.load(path, device=self.device)
        self.resolution = self.classifier.config.resolution

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        check_batch(images, prompts, self.name)
        labels = [parse_prompt(p) for p in prompts]  # ValueError names an unknown word
        x = images.detach().to(self.device, torch.float32)
        if x.shape[-2:] != (self.resolution, self.resolution):
            x = F.interpolate(x, size=(self.resolution, self.resolution), mode="bilinear", antialias=True, align_corners=False)
        p_colour, p_shape = self.classifier.probabilities(x.clamp(0, 1))
        c = torch.tensor([l[0] for l in labels], device=self.device)
        s = torch.tensor([l[1] for l in labels], device=self.device)
        idx = torch.arange(len(labels), device=self.device)
        return (p_colour[idx, c] * p_shape[idx, s]).float()


@register("demo_judge")
class DemoJudgeAdherence(DemoAdherence):
    """The demo's held-out judge: ``p(colour) · p(shape)`` under :class:`treegrpo.demo.judge.DemoJudge`."""

    name = "demo_judge"
    load = staticmethod(load_judge)

