"""Policy adapter for the embedded demo flow model (``treegrpo.demo``): no downloads, CPU-friendly.

Latents are the 3×16×16 images scaled to [-1, 1]; the model predicts the rectified-flow velocity
``v = ε − x0`` and ``denoise`` returns ``x̂0 = x − σ·v``.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from torch import nn

from ..demo.model import NULL_TOKEN, flow_sigmas, load_demo_model, tokenize
from ..lora import peft_adapters_disabled
from ..policy import Policy, Prediction


class DemoPolicy(Policy):
    """The demo model behind the ``Policy`` protocol (``treegrpo.policy``).

    ``DemoPolicy()`` loads the shipped weights; pass ``model`` to wrap an existing ``DemoDiT``.
    ``shift`` maps the schedule ``σ' = shift·σ / (1 + (shift − 1)·σ)`` (1.0: plain linspace).
    """

    prediction: Prediction = "flow"

    def __init__(self, model: nn.Module | None = None, device: str | torch.device = "cpu", shift: float = 1.0):
        if shift <= 0:
            raise ValueError(f"shift must be > 0, got {shift}")
        self.device = torch.device(device)
        self.model: nn.Module = (model if model is not None else load_demo_model()).to(self.device)
        self.shift = float(shift)
        cfg = self.model.config  # DemoConfig (a PEFT wrapper forwards the attribute to the DiT)
        self._latent_shape = (int(cfg.in_channels), int(cfg.resolution), int(cfg.resolution))

    @classmethod
    def load(
        cls, path: str | os.PathLike | None = None, device: str | torch.device = "cpu", shift: float = 1.0
    ) -> "DemoPolicy":
        """Load the weights at ``path`` (default: the shipped ``treegrpo/demo/assets/demo_flow.safetensors``)."""
        return cls(load_demo_model(path), device=device, shift=shift)

    def sigmas(self, steps: int) -> torch.Tensor:
        return flow_sigmas(steps, self.shift)

    def latent_shape(self) -> tuple[int, int, int]:
        return self._latent_shape

    def encode_prompts(self, prompts: list[str], negative: str = "") -> dict[str, torch.Tensor]:
        """``{"tokens": (B, 2), "uncond": (B, 2)}`` long; ``negative`` (a demo prompt or "") is the uncond."""
        if isinstance(prompts, str):
            prompts = [prompts]
        tokens = tokenize(list(prompts)).to(self.device)
        uncond = tokenize([negative]).to(self.device).expand(len(prompts), -1).contiguous()
        return {"tokens": tokens, "uncond": uncond}

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, cond: Any, cfg: float) -> torch.Tensor:
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).reshape(-1).expand(b)
        tokens = cond["tokens"].to(x.device)
        if tokens.shape[0] != b:
            raise ValueError(f"DemoPolicy.denoise: {b} latents but conditioning for {tokens.shape[0]} prompts")
        if cfg == 1.0:
            v = self.model(x, sigma, tokens)
        else:
            uncond = cond.get("uncond")
            uncond = torch.full_like(tokens, NULL_TOKEN) if uncond is None else uncond.to(x.device)
            v_c, v_u = self.model(torch.cat([x, x]), torch.cat([sigma, sigma]), torch.cat([tokens, uncond])).chunk(2)
            v = v_u + cfg * (v_c - v_u)
        return x - sigma.view(b, 1, 1, 1).to(v.dtype) * v

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return ((latents.float() + 1) / 2).clamp(0, 1)

    def set_gradient_checkpointing(self, on: bool) -> bool:
        for m in self.model.modules():
            if hasattr(m, "gradient_checkpointing") and isinstance(m.gradient_checkpointing, bool):
                m.gradient_checkpointing = bool(on)
        return True

    def lora_disabled(self) -> contextlib.AbstractContextManager:
        return peft_adapters_disabled(self.model)
