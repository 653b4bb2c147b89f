"""Flow-matching objectives on re-noised samples: DiffusionNFT-style and AWM-style losses (pure functions).

Both train on the forward process instead of the sampler's likelihoods. A generated clean sample ``x0`` (a leaf) is
re-noised at a noise level σ drawn from the sampling schedule, ``x_σ = (1−σ)·x0 + σ·ε`` (flow) or ``x0 + σ·ε``
(σ-space models), and the model's x̂0 there is compared with ``x0``. In velocity terms (flow:
``v = (x_σ − x̂0)/σ``; σ-space: the noise ``ε̂ = (x_σ − x̂0)/σ``) the error is ``(x0 − x̂0)/σ`` for both, so one
function serves flow and σ-space models: the pretraining loss ``‖v̂ − v‖² = ‖x̂0 − x0‖²/σ²``.

- **AWM** (advantage-weighted matching, Xue et al. 2025): each sample's matching loss weighted by its advantage
  ``A``: ``L = mean_i A_i·‖v_θ,i − v_i‖²`` (samples better than their group are fitted, worse ones pushed away).
- **NFT** (DiffusionNFT, Zheng et al. 2025): from the old policy's ``v_old`` and ``v_θ``, an implicit positive
  policy ``v⁺ = (1−β)·v_old + β·v_θ`` and a negative one ``v⁻ = (1+β)·v_old − β·v_θ``; with each sample's
  optimality ``r ∈ [0, 1]``: ``L = mean_i r_i·‖v⁺_i − v_i‖² + (1−r_i)·‖v⁻_i − v_i‖²``. Velocities are affine in x̂0
  at fixed (x_σ, σ), so the same combinations are formed on x̂0.

Shapes: latents (B, ...); ``sigma``, weights (B,); losses (B,) (mean over the latent's dimensions).
"""
from __future__ import annotations

import torch


def _b(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return s.reshape(-1, *([1] * (x.ndim - 1))).to(x.dtype)


def renoise(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor, prediction: str) -> torch.Tensor:
    """The forward process at σ: ``(1−σ)·x0 + σ·ε`` (flow) or ``x0 + σ·ε`` (epsilon / σ-space)."""
    s = _b(sigma, x0)
    if prediction == "flow":
        return (1 - s) * x0 + s * noise
    if prediction == "epsilon":
        return x0 + s * noise
    raise ValueError(f"unknown prediction type {prediction!r}")


def matching_error(x0_pred: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Per-sample ``mean‖x̂0 − x0‖²/σ²`` = the velocity (flow) or noise (σ-space) matching loss, (B,)."""
    return ((x0_pred.float() - x0.float()) ** 2).flatten(1).mean(1) / sigma.float() ** 2


def optimality(adv: torch.Tensor, scale: float) -> torch.Tensor:
    """NFT's optimality ``r = ½ + ½·clip(A/scale, −1, 1)`` of group-normalised advantages ``A`` (B,)."""
    return 0.5 + 0.5 * (adv.float() / scale).clamp(-1.0, 1.0)


def nft_loss(x0_theta: torch.Tensor, x0_old: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor, r: torch.Tensor,
             beta: float) -> torch.Tensor:
    """DiffusionNFT per sample: ``r·‖v⁺ − v‖² + (1−r)·‖v⁻ − v‖²`` with ``v⁺ = (1−β)v_old + βv_θ`` and
    ``v⁻ = (1+β)v_old − βv_θ`` (on x̂0; ``x0_old`` carries no gradient), (B,)."""
    old = x0_old.detach()
    pos = (1 - beta) * old + beta * x0_theta
    neg = (1 + beta) * old - beta * x0_theta
    return r * matching_error(pos, x0, sigma) + (1 - r) * matching_error(neg, x0, sigma)


def awm_loss(x0_theta: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """AWM per sample: ``A·‖v_θ − v‖²``, (B,)."""
    return adv.float() * matching_error(x0_theta, x0, sigma)
