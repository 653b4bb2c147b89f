"""The policy protocol every backend implements (DESIGN §2).

Everything above this module (tree sampler, trainer) is backend-free: it talks to a
``Policy`` only through the members below.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Literal, Protocol, runtime_checkable

import torch
from torch import nn

Prediction = Literal["flow", "epsilon"]


@runtime_checkable
class Policy(Protocol):
    """A denoiser with LoRA that the tree sampler and trainer drive.

    Conventions (the k-diffusion / ComfyUI ones):
    - ``flow``: ``x_σ = (1 − σ)·x0 + σ·ε``, σ ∈ [0, 1].
    - ``epsilon``: ``x_σ = x0 + σ·ε`` (sigma space; the backend scales the input itself).
    """

    prediction: Prediction
    model: nn.Module          # the module LoRA is injected into (trainable parameters live here)
    device: torch.device

    def sigmas(self, steps: int) -> torch.Tensor:
        """(steps + 1,) float32 decreasing schedule ending in 0, with the model's shift."""

    def latent_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one latent."""

    def encode_prompts(self, prompts: list[str], negative: str = "") -> Any:
        """Conditioning for ``prompts``: a pytree (tensor / dict / tuple / list) whose tensors
        have the prompt index as leading dim. Holds the negative/uncond too when needed."""

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, cond: Any, cfg: float) -> torch.Tensor:
        """x̂0 for latents ``x`` (B, C, H, W) at noise levels ``sigma`` (B,), with CFG inside
        (cond and uncond evaluated in one batched call when ``cfg != 1``)."""

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W), float32 in [0, 1]."""

    def lora_disabled(self) -> contextlib.AbstractContextManager:
        """Context in which ``denoise`` runs the reference (LoRA-free) model."""


def select_cond(cond: Any, index: torch.Tensor) -> Any:
    """Gather rows ``index`` of every tensor in a conditioning pytree (leading dim = prompt)."""
    if isinstance(cond, torch.Tensor):
        return cond.index_select(0, index.to(cond.device))
    if isinstance(cond, dict):
        return {k: select_cond(v, index) for k, v in cond.items()}
    if isinstance(cond, (list, tuple)):
        return type(cond)(select_cond(v, index) for v in cond)
    return cond


@contextlib.contextmanager
def peft_adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Disable every PEFT LoRA layer inside ``model`` (for the KL reference), then restore."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [not m.disable_adapters for m in layers]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m, on in zip(layers, before):
            m.enable_adapters(on)
