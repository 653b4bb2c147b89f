"""GRPO edge loss and the KL term (docs/design.md §1). Pure functions, per edge / per parent."""
from __future__ import annotations

import torch


def clip_advantages(adv: torch.Tensor, adv_clip: float) -> torch.Tensor:
    """Clamp ``adv`` (E,) to [−adv_clip, adv_clip]; ``adv_clip = 0`` leaves them alone."""
    return adv.clamp(-adv_clip, adv_clip) if adv_clip > 0 else adv


def grpo_edge_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, clip_range: float):
    """Per-edge clipped surrogate ``max(−A·ratio, −A·clip(ratio, 1−ε, 1+ε))`` and the ratio, both (E,)."""
    ratio = torch.exp(logp_new - logp_old)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(unclipped, clipped), ratio


def kl_to_reference(mean: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor, reduction: str = "mean"):
    """KL between two Gaussians with equal ``std``: ``‖μ_θ − μ_ref‖²/(2·std²)`` in nats, reduced over
    dimensions like the log-probs (mean or sum). ``mean``, ``mean_ref`` (B, ...); ``std`` broadcastable to them
    (B, 1, ..., 1); returns (B,) float32."""
    d = ((mean.float() - mean_ref.float()) ** 2 / (2 * std.float() ** 2)).flatten(1)
    if reduction == "mean":
        return d.mean(1)
    if reduction == "sum":
        return d.sum(1)
    raise ValueError(f"logprob_reduction must be 'mean' or 'sum', got {reduction!r}")
