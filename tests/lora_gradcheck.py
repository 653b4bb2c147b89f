"""The LoRA gradient through ComfyUI's denoiser path against finite differences (shared by the architecture and
family tests): analytic ∇L·d vs the central difference of L along a random direction d, in float64 of the loss."""
from __future__ import annotations

import torch


def lora_gradient_and_difference(pol, shape: tuple, guidance: float, rows: int = 3, seed: int = 1,
                                 richardson: bool = False, along_gradient: bool = False) -> tuple[float, float]:
    """(analytic, numeric) directional derivatives of ``L = Σ denoise(x, σ)·w`` over ``rows`` random rows at
    spread-out sigmas, for a ComfyPolicy ``pol`` with latent ``shape``. ``richardson``: the eps² term of the
    central difference cancelled ((4·D(eps/2) − D(eps))/3), for models whose curvature shows at eps = 1e-2.
    ``along_gradient``: the direction is the computed gradient itself (normalised), so the derivative is as large
    as it can be and no cancellation between modules hides float32 round-off; a wrong gradient g' still fails
    (the difference gives g·g'/|g'|, not |g'|)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((rows, *shape), generator=g)
    sigma = pol.sigmas(10)[torch.linspace(2, 6, rows).round().long()]
    w = torch.randn((rows, *shape), generator=g)
    cond = pol.encode_prompts(["p"] * rows)
    params = list(pol.lora.parameters())
    direction = [torch.randn(p.shape, generator=g) for p in params]

    def loss():
        return (pol.denoise(x, sigma, cond, guidance).double() * w).sum()

    def grad_dot():
        with torch.enable_grad():
            for p in params:
                p.grad = None
            loss().backward()
        # a LoRA on a layer whose output the model never uses has no gradient (Qwen-Image's last text stream)
        return sum((p.grad.double() * d).sum() for p, d in zip(params, direction) if p.grad is not None).item()

    def shifted(eps):
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(eps * d)
            v = loss().item()
            for p, d in zip(params, direction):
                p.sub_(eps * d)
        return v

    def central(eps):
        return (shifted(eps) - shifted(-eps)) / (2 * eps)

    analytic = pol.run(grad_dot)
    if along_gradient:
        grads = [p.grad.double() if p.grad is not None else torch.zeros(p.shape, dtype=torch.float64) for p in params]
        norm = torch.sqrt(sum((gr ** 2).sum() for gr in grads)).item()
        direction[:] = [(gr / norm).float() for gr in grads]
        analytic = pol.run(grad_dot)
    numeric = pol.run(lambda: (4 * central(5e-3) - central(1e-2)) / 3 if richardson else central(1e-2))
    return analytic, numeric
