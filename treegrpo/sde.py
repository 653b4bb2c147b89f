"""ODE/SDE sampler steps and their Gaussian log-probabilities (docs/design.md §1). Pure functions.

Conventions (k-diffusion / ComfyUI): ``x`` (B, C, H, W); ``sigma``, ``sigma_next`` are (B,) or
scalars; ``x0`` is the denoiser's prediction x̂0.
- flow (rectified flow):   x_σ = (1 − σ)·x0 + σ·ε,  σ ∈ [0, 1]
- epsilon (sigma space):   x_σ = x0 + σ·ε,  equivalent to the VP form by x_vp = sqrt(ᾱ)·x_σ,
  ᾱ = 1 / (1 + σ²).
Every SDE step is ``x' = mean + std·ε`` with ``std`` not depending on the model, so the
policy's log-prob of a recorded child is a function of ``mean`` alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _bcast(s: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    s = torch.as_tensor(s, dtype=torch.float32, device=x.device)
    return s.reshape(-1, *([1] * (x.ndim - 1))) if s.ndim else s.reshape(*([1] * x.ndim))


def ode_step(x: torch.Tensor, x0: torch.Tensor, sigma, sigma_next) -> torch.Tensor:
    """Euler step of the probability-flow ODE, ``x' = x + (σ' − σ)·(x − x̂0)/σ``; shaped like ``x``.

    For flow models this is Euler on the velocity ``v = (x − x̂0)/σ``; for epsilon models in
    sigma space it is exactly DDIM with η = 0 (``x' = x̂0 + σ'·ε̂``)."""
    s, sn = _bcast(sigma, x), _bcast(sigma_next, x)
    return x + (sn - s) * (x - x0) / s


def flow_sde_mean_std(x, x0, sigma, sigma_next, noise_level: float, sigma_1_next=None):
    """Flow-GRPO SDE step (``dt = σ' − σ < 0``), returns (mean, std) in float32: ``mean`` shaped like ``x``, ``std``
    (B, 1, ..., 1) for a (B,) ``sigma`` (all ones for a scalar one).

    ``s_t = a·sqrt(σ/(1−σ))`` (where σ = 1 the denominator uses ``sigma_1_next``, default σ'),
    ``mean = x·(1 + s_t²·dt/(2σ)) + v·(1 + s_t²·(1−σ)/(2σ))·dt``, ``std = s_t·sqrt(−dt)``."""
    x, x0 = x.float(), x0.float()
    s, sn = _bcast(sigma, x), _bcast(sigma_next, x)
    denom_sigma = torch.where(s >= 1.0, _bcast(sigma_1_next if sigma_1_next is not None else sigma_next, x), s)
    s_t = noise_level * torch.sqrt(s / (1.0 - denom_sigma))
    dt = sn - s
    v = (x - x0) / s
    mean = x * (1 + s_t**2 * dt / (2 * s)) + v * (1 + s_t**2 * (1 - s) / (2 * s)) * dt
    std = s_t * torch.sqrt(-dt)
    return mean, std


def eps_sde_mean_std(x, x0, sigma, sigma_next, eta: float):
    """DDIM(η) step of an epsilon model written in sigma space (ComfyUI's ``x = x0 + σ·n``); (mean, std) in float32,
    shaped as :func:`flow_sde_mean_std`'s.

    With ᾱ = 1/(1+σ²): ``σ_η = η·sqrt((1−ᾱ')/(1−ᾱ))·sqrt(1−ᾱ/ᾱ')``, and since x_σ = x_vp/sqrt(ᾱ),
    ``std = σ_η/sqrt(ᾱ')``, ``mean = x̂0 + sqrt(σ'² − std²)·ε̂`` with ``ε̂ = (x − x̂0)/σ``."""
    x, x0 = x.float(), x0.float()
    s, sn = _bcast(sigma, x), _bcast(sigma_next, x)
    a, an = 1.0 / (1.0 + s**2), 1.0 / (1.0 + sn**2)
    sig_eta = eta * torch.sqrt((1 - an) / (1 - a)) * torch.sqrt((1 - a / an).clamp_min(0))
    std = sig_eta / torch.sqrt(an)
    eps_hat = (x - x0) / s
    mean = x0 + torch.sqrt((sn**2 - std**2).clamp_min(0)) * eps_hat
    return mean, std


def eps_sde_mean_std_alphabar(x_vp, x0, alpha_bar, alpha_bar_next, eta: float):
    """The same DDIM(η) step in the usual ᾱ (VP) form, for checking the sigma-space one:
    ``mean = sqrt(ᾱ')·x̂0 + sqrt(1−ᾱ'−σ_η²)·ε̂``, ``std = σ_η``."""
    a, an = _bcast(alpha_bar, x_vp), _bcast(alpha_bar_next, x_vp)
    sig_eta = eta * torch.sqrt((1 - an) / (1 - a)) * torch.sqrt((1 - a / an).clamp_min(0))
    eps_hat = (x_vp - torch.sqrt(a) * x0) / torch.sqrt(1 - a)
    mean = torch.sqrt(an) * x0 + torch.sqrt((1 - an - sig_eta**2).clamp_min(0)) * eps_hat
    return mean, sig_eta


def sde_mean_std(prediction: str, x, x0, sigma, sigma_next, *, noise_level: float = 0.7, eta: float = 1.0,
                 sigma_1_next=None):
    """Dispatch to the flow or epsilon SDE step; returns (mean, std), float32."""
    if prediction == "flow":
        return flow_sde_mean_std(x, x0, sigma, sigma_next, noise_level, sigma_1_next)
    if prediction == "epsilon":
        return eps_sde_mean_std(x, x0, sigma, sigma_next, eta)
    raise ValueError(f"unsupported prediction type {prediction!r}: expected 'flow' or 'epsilon'")


@dataclass(frozen=True)
class SDEKernel:
    """The SDE transition a batch of trees was sampled with, and that the update must score its edges with:
    the model's prediction type, the flow noise level ``a`` / DDIM ``η``, the log-prob reduction over dimensions,
    and the schedule's ``σ_1`` (the flow step out of σ = 1 uses it in ``s_t``)."""

    prediction: str = "flow"
    noise_level: float = 0.7
    eta: float = 1.0
    reduction: str = "mean"
    sigma_1_next: Optional[float] = None

    def __post_init__(self) -> None:
        if self.prediction not in ("flow", "epsilon"):
            raise ValueError(f"unsupported prediction type {self.prediction!r}: expected 'flow' or 'epsilon'")
        if self.reduction not in ("mean", "sum"):
            raise ValueError(f"logprob_reduction must be 'mean' or 'sum', got {self.reduction!r}")

    def mean_std(self, x, x0, sigma, sigma_next):
        """(mean, std) of the step from ``x`` at ``sigma`` to ``sigma_next`` given x̂0, float32."""
        return sde_mean_std(self.prediction, x, x0, sigma, sigma_next, noise_level=self.noise_level, eta=self.eta,
                            sigma_1_next=self.sigma_1_next)

    def logprob(self, x_next, mean, std):
        """(B,) log-density of ``x_next`` under N(mean, std²), reduced over dimensions as sampled."""
        return gaussian_logprob(x_next, mean, std, self.reduction)


def gaussian_logprob(x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduction: str = "mean"):
    """log N(x_next; mean, std²) in nats, per sample (B,), float32, averaged (per dimension) or summed over
    dimensions: ``x_next``, ``mean`` (B, ...), ``std`` broadcastable to them (B, 1, ..., 1)."""
    x_next, mean, std = x_next.float(), mean.float(), std.float()
    lp = -((x_next - mean) ** 2) / (2 * std**2) - torch.log(std) - LOG_SQRT_2PI
    lp = lp.flatten(1)
    if reduction == "mean":
        return lp.mean(1)
    if reduction == "sum":
        return lp.sum(1)
    raise ValueError(f"logprob_reduction must be 'mean' or 'sum', got {reduction!r}")
