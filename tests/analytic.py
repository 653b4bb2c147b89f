"""Policies with closed-form denoisers for the maths tests (not mocks of a backend: real Policies).

Data: every latent dimension is independent N(m_p, v) where the mean m_p depends on the prompt.
Exact x̂0 = E[x0 | x_σ]:
- flow    (x = (1−σ)x0 + σε): x̂0 = m + (1−σ)v·(x − (1−σ)m) / ((1−σ)²v + σ²)
- epsilon (x = x0 + σε):      x̂0 = m + v·(x − m) / (v + σ²)
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from treegrpo.policy import Policy


def vp_sigmas(steps: int, n_train: int = 1000) -> torch.Tensor:
    """Sigmas of the SD linear-beta VP schedule, ``steps`` evenly spaced train timesteps, then 0."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, n_train, dtype=torch.float64) ** 2
    ab = torch.cumprod(1 - betas, 0)
    sig = ((1 - ab) / ab).sqrt()
    idx = torch.linspace(n_train - 1, 0, steps).round().long()
    return torch.cat([sig[idx], torch.zeros(1, dtype=torch.float64)]).float()


class AnalyticPolicy(Policy):
    """Exact Gaussian denoiser, optionally with a learnable correction (``model``) for gradient tests."""

    def __init__(self, prediction="flow", var=0.25, means=(0.5, -1.0), shape=(4, 1, 1), learnable=False):
        self.prediction, self.var, self.shape = prediction, var, shape
        self.means = torch.tensor(means, dtype=torch.float32)
        self.device = torch.device("cpu")
        self.model = nn.Module()
        d = shape[0] * shape[1] * shape[2]
        self.model.to_q = nn.Linear(d, d)
        nn.init.zeros_(self.model.to_q.weight)
        nn.init.zeros_(self.model.to_q.bias)
        self.learnable = learnable
        if not learnable:
            self.model.requires_grad_(False)
        self.rows = []           # rows of every model evaluation (the real forward count)
        self._disabled = False

    def sigmas(self, steps):
        if self.prediction == "flow":
            return torch.linspace(1, 0, steps + 1)
        return vp_sigmas(steps)

    def latent_shape(self):
        return self.shape

    def encode_prompts(self, prompts, negative=""):
        idx = torch.tensor([int(p.split("p")[-1]) for p in prompts])
        return {"mean": self.means[idx]}

    def _x0(self, x, sigma, m):
        s = sigma.reshape(-1, 1, 1, 1)
        m = m.reshape(-1, 1, 1, 1)
        if self.prediction == "flow":
            x0 = m + (1 - s) * self.var * (x - (1 - s) * m) / ((1 - s) ** 2 * self.var + s**2)
        else:
            x0 = m + self.var * (x - m) / (self.var + s**2)
        if self.learnable and not self._disabled:
            x0 = x0 + self.model.to_q(torch.cat([x.flatten(1)], 1)).reshape(x.shape) * s
        return x0

    def denoise(self, x, sigma, cond, cfg):
        m = cond["mean"]
        if cfg != 1.0:
            xx, ss, mm = torch.cat([x, x]), torch.cat([sigma, sigma]), torch.cat([m, torch.zeros_like(m)])
            self.rows.append(xx.shape[0])
            c, u = self._x0(xx, ss, mm).chunk(2)
            return u + cfg * (c - u)
        self.rows.append(x.shape[0])
        return self._x0(x, sigma, m)

    def decode(self, latents):
        return latents

    @contextlib.contextmanager
    def lora_disabled(self):
        self._disabled = True
        try:
            yield
        finally:
            self._disabled = False
