"""The policy protocol: the one interface between the backend-free core and a model (docs/design.md §2).

The tree sampler, the update and the trainer talk to a model only through :class:`Policy`. A backend subclasses
it (``treegrpo.backends.demo``, ``treegrpo.backends.diffusers``, ``treegrpo.comfyui.policy``) and implements the
abstract members; the members with a body are defaults a backend may override.

Conventions (the k-diffusion / ComfyUI ones):
- ``flow``: ``x_σ = (1 − σ)·x0 + σ·ε``, σ ∈ [0, 1].
- ``epsilon``: ``x_σ = x0 + σ·ε`` (sigma space; the backend scales the model input itself).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Literal, Optional, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

Prediction = Literal["flow", "epsilon"]
T = TypeVar("T")


@runtime_checkable
class Policy(Protocol):
    """A denoiser with a LoRA that the tree sampler and the trainer drive."""

    prediction: Prediction
    model: nn.Module          # the module that holds the trainable LoRA parameters
    device: torch.device
    #: the backend's own LoRA adapter (``parameters()``, ``named_lora_parameters()``, ``weights()``, ``load(w)``),
    #: or None: the trainer then injects PEFT LoRA layers into ``model`` (:class:`treegrpo.lora.PeftLoRA`)
    lora: Any = None
    #: latents per VAE decode call (0: all at once), for the memory plan
    decode_batch: int = 0

    def sigmas(self, steps: int) -> torch.Tensor:
        """(steps + 1,) float32 decreasing schedule ending in 0, with the model's shift."""
        ...

    def latent_shape(self) -> tuple[int, ...]:
        """(C, H, W) of one latent; (C, T, H, W) for a video model (T latent frames)."""
        ...

    def encode_prompts(self, prompts: list[str], negative: str = "") -> Any:
        """Conditioning for ``prompts``: a pytree (tensor / dict / tuple / list) whose tensors have the prompt
        index as leading dim. Holds the negative/uncond too when needed."""
        ...

    def denoise(self, x: torch.Tensor, sigma: torch.Tensor, cond: Any, cfg: float) -> torch.Tensor:
        """x̂0 for latents ``x`` (B, *latent_shape()) — (B, C, H, W), or (B, C, T, H, W) for video — at noise levels
        ``sigma`` (B,), with CFG inside (cond and uncond evaluated in one batched call when ``cfg != 1``)."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W), float32 in [0, 1]; for video latents the frames the rewards score, (B, F, 3, H, W)
        (``treegrpo.video``)."""
        ...

    def lora_disabled(self) -> contextlib.AbstractContextManager:
        """Context in which ``denoise`` runs the reference (LoRA-free) model."""
        ...

    # ---- defaults a backend may override
    def noise_scaling(self, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The initial latent at ``sigma`` (the schedule's first level) for pure ``noise``: ``σ·noise``."""
        return noise * sigma

    def run(self, fn: Callable[[], T], max_batch: int = 1) -> T:
        """Call ``fn()`` inside the backend's model context (ComfyUI: models loaded, conds processed once per
        phase); ``max_batch`` is the largest batch ``fn`` will denoise. Default: just call it."""
        return fn()

    def set_gradient_checkpointing(self, on: bool) -> bool:
        """Recompute the denoiser's activations in backward from now on (``on``); returns whether this backend
        can. Default: it cannot (nothing changes)."""
        return False

    def set_tiled_decode(self, on: bool) -> bool:
        """Decode the leaves in tiles from now on (``on``; bounded memory, slower); returns whether this backend
        can. Default: it cannot."""
        return False

    def prepare_memory_probe(self) -> None:
        """Put every model the probes use on its device (the probes run on fake tensors: moving a model then
        would replace its weights with fake ones). Default: nothing to do."""

    def probe_decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode as :meth:`decode` does, without loading or moving models (for the memory probe)."""
        return self.decode(latents)

    def memory_weights(self) -> dict[str, int]:
        """Bytes each component keeps on the accelerator while it runs (``denoiser``, ``vae``, ...), for the
        memory plan (``treegrpo.memory``). Default: the parameters and buffers of ``model``."""
        from .memory import module_bytes
        return {"denoiser": module_bytes(self.model)}

    def memory_signature(self) -> dict:
        """What tells this backend's models apart for the memory probe kept between runs (treegrpo/memory_cache.py):
        shapes and dtypes, never weights' values. Default: ``model``'s parameters and buffers."""
        from .memory_cache import module_signature
        return {"model": module_signature(self.model)}

    def denoiser_parameters(self) -> int:
        """Parameters of the denoiser (the memory plan's fp8 advice). Default: those of ``model``."""
        return sum(p.numel() for p in self.model.parameters())

    def comfy_lora_state_dict(self, w) -> dict:
        """LoRA weights (:class:`treegrpo.lora.LoraWeights`) under ComfyUI's key names."""
        from .lora import to_comfy
        return to_comfy(w)

    def save_diffusers_lora(self, w, path: str, metadata: Optional[dict] = None) -> Optional[str]:
        """Write ``w`` in diffusers' own key format; returns the path, or None when the backend has none."""
        return None


def select_cond(cond: Any, index: torch.Tensor) -> Any:
    """Gather rows ``index`` of every tensor in a conditioning pytree (leading dim = prompt)."""
    if isinstance(cond, torch.Tensor):
        return cond.index_select(0, index.to(cond.device))
    if isinstance(cond, dict):
        return {k: select_cond(v, index) for k, v in cond.items()}
    if isinstance(cond, (list, tuple)):
        return type(cond)(select_cond(v, index) for v in cond)
    return cond
