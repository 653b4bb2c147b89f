"""SDE/ODE steps: log-probs against an independent density, the epsilon step's two forms, and the
samplers' marginals on Gaussian data with an exact denoiser."""
import math

import pytest
import torch

from treegrpo.config import TreeConfig
from treegrpo.sde import (SDEKernel, eps_sde_mean_std, eps_sde_mean_std_alphabar, flow_sde_mean_std,
                          gaussian_logprob, ode_step)
from treegrpo.tree import Denoiser, NFECounter, euler_solve, sample_trees

from analytic import AnalyticPolicy


def test_logprob_matches_torch_normal():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 3, 4, 4, generator=g)
    std = torch.rand(5, 1, 1, 1, generator=g) + 0.1
    x = mean + std * torch.randn(5, 3, 4, 4, generator=g)
    ref = torch.distributions.Normal(mean.double(), std.double().expand_as(mean)).log_prob(x.double())
    assert torch.allclose(gaussian_logprob(x, mean, std, "sum").double(), ref.flatten(1).sum(1), atol=1e-4)
    assert torch.allclose(gaussian_logprob(x, mean, std, "mean").double(), ref.flatten(1).mean(1), atol=1e-6)
    with pytest.raises(ValueError, match="logprob_reduction"):
        gaussian_logprob(x, mean, std, "max")


def test_flow_sde_formula_by_hand():
    x, x0 = torch.full((1, 1, 1, 1), 0.3), torch.full((1, 1, 1, 1), -0.2)
    sigma, sn, a = 0.6, 0.4, 0.7
    st = a * math.sqrt(sigma / (1 - sigma))
    dt = sn - sigma
    v = (0.3 + 0.2) / sigma
    mean_ref = 0.3 * (1 + st**2 * dt / (2 * sigma)) + v * (1 + st**2 * (1 - sigma) / (2 * sigma)) * dt
    mean, std = flow_sde_mean_std(x, x0, torch.tensor([sigma]), torch.tensor([sn]), a)
    assert mean.item() == pytest.approx(mean_ref, rel=1e-5)
    assert std.item() == pytest.approx(st * math.sqrt(-dt), rel=1e-5)
    # at sigma = 1 the denominator uses the next sigma instead of dividing by zero
    mean1, std1 = flow_sde_mean_std(x, x0, torch.tensor([1.0]), torch.tensor([0.9]), a)
    assert std1.item() == pytest.approx(a * math.sqrt(1 / 0.1) * math.sqrt(0.1), rel=1e-5)
    assert torch.isfinite(mean1).all()


def test_sde_step_logprob_is_density_of_transition():
    g = torch.Generator().manual_seed(1)
    x, x0 = torch.randn(3, 2, 2, 2, generator=g), torch.randn(3, 2, 2, 2, generator=g)
    noise = torch.randn(3, 2, 2, 2, generator=g)
    for pred, s, sn in (("flow", 0.7, 0.5), ("epsilon", 3.0, 1.5)):
        kernel = SDEKernel(pred, noise_level=0.7, eta=1.0)
        mean, std = kernel.mean_std(x, x0, torch.full((3,), s), torch.full((3,), sn))
        x_next = mean + std * noise
        # independent: density of N(mean, std^2) evaluated with scipy-free closed form per element
        z = noise.double()
        ref = (-0.5 * z**2 - torch.log(std.double()) - 0.5 * math.log(2 * math.pi)).flatten(1).mean(1)
        assert torch.allclose(kernel.logprob(x_next, mean, std).double(), ref, atol=1e-5)


def test_eps_sigma_space_equals_alphabar_form():
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(4, 3, 2, 2, generator=g)
    sigma = torch.tensor([5.0, 2.0, 1.0, 0.3])
    sn = torch.tensor([3.0, 1.2, 0.4, 0.1])
    x_sig = x0 + sigma.reshape(-1, 1, 1, 1) * torch.randn(4, 3, 2, 2, generator=g)
    x0_hat = x0 + 0.1 * torch.randn(4, 3, 2, 2, generator=g)
    ab, abn = 1 / (1 + sigma**2), 1 / (1 + sn**2)
    for eta in (0.3, 1.0):
        m_sig, s_sig = eps_sde_mean_std(x_sig, x0_hat, sigma, sn, eta)
        x_vp = ab.sqrt().reshape(-1, 1, 1, 1) * x_sig
        m_vp, s_vp = eps_sde_mean_std_alphabar(x_vp, x0_hat, ab, abn, eta)
        scale = abn.sqrt().reshape(-1, 1, 1, 1)
        assert torch.allclose(m_sig * scale, m_vp, atol=1e-5)
        assert torch.allclose(s_sig * scale, s_vp, atol=1e-6)
        # log-probs differ by the Jacobian constant only: ratios are identical
        eps = torch.randn(4, 3, 2, 2, generator=g)
        lp_sig = gaussian_logprob(m_sig + s_sig * eps, m_sig, s_sig, "sum")
        lp_vp = gaussian_logprob(m_vp + s_vp * eps, m_vp, s_vp, "sum")
        jac = 12 * torch.log(scale.flatten())
        assert torch.allclose(lp_sig - jac, lp_vp, atol=1e-3)
    # eta = 0 limit is the ODE step (DDIM)
    m0, s0 = eps_sde_mean_std(x_sig, x0_hat, sigma, sn, 1e-12)
    assert torch.allclose(m0, ode_step(x_sig, x0_hat, sigma, sn), atol=1e-5)


def _marginal(pred, method, steps, n_trees=1250, mean_idx=0):
    """Leaves (n_trees·2·8 numbers) of the ODE sampler or of the all-step SDE sampler."""
    pol = AnalyticPolicy(pred, var=0.25, means=(0.5, -1.0), shape=(8, 1, 1))
    prompts = [f"p{mean_idx}"] * n_trees
    gen = torch.Generator().manual_seed(3)
    sig = pol.sigmas(steps)
    m, s0 = pol.means[mean_idx], sig[0]

    def start(n):  # initial noise with x_T = noise·σ_0 distributed exactly as the data's marginal at σ_0
        z = torch.randn(n, 8, 1, 1, generator=gen)
        if pred == "flow":
            return z  # σ_0 = 1: pure noise
        return (m + (pol.var + s0**2).sqrt() * z) / s0

    if method == "ode":
        den = Denoiser(pol, pol.encode_prompts(prompts * 2), 1.0, NFECounter())
        return euler_solve(den, start(2 * n_trees) * s0, sig, torch.arange(2 * n_trees)).flatten()
    # SDE on every step with a non-zero std (epsilon: the last step to sigma = 0 is deterministic)
    width = steps - (1 if pred == "epsilon" else 0)
    cfg = TreeConfig(steps=steps, window_start=0, window_width=width, method="trajectory", group_size=2)
    return sample_trees(pol, prompts, cfg, generator=gen, noise=start(n_trees)).leaves.flatten()


@pytest.mark.parametrize("pred", ["flow", "epsilon"])
@pytest.mark.parametrize("method", ["ode", "sde"])
def test_sampler_reproduces_gaussian_data(pred, method):
    # DDPM-style steps (eta = 1) use the posterior variance for a known x0, which under-disperses at
    # coarse steps (var 0.218 at T = 100, 0.246 at T = 400, see the exact-chain test below)
    steps, n = (400, 600) if (pred, method) == ("epsilon", "sde") else (100, 1250)
    x = _marginal(pred, method, steps=steps, n_trees=n, mean_idx=1)
    assert x.numel() >= 9600
    assert x.mean().item() == pytest.approx(-1.0, abs=0.03)
    assert x.var().item() == pytest.approx(0.25, rel=0.06)


def test_all_sde_chain_matches_exact_marginals_at_every_level():
    """Flow SDE keeps the marginal x_σ ~ N((1−σ)m, (1−σ)²v + σ²) along the chain (T = 100)."""
    pol = AnalyticPolicy("flow", var=0.25, means=(0.5,), shape=(8, 1, 1))
    cfg = TreeConfig(steps=100, window_start=0, window_width=60, method="trajectory", group_size=2)
    tb = sample_trees(pol, ["p0"] * 1500, cfg, generator=torch.Generator().manual_seed(4))
    for j in (10, 30, 60):
        s = tb.sigmas[j].item()
        x = tb.latents[j].flatten()
        assert x.mean().item() == pytest.approx((1 - s) * 0.5, abs=0.03)
        assert x.var().item() == pytest.approx((1 - s) ** 2 * 0.25 + s**2, rel=0.06)


def test_antithetic_tree_keeps_the_exact_marginals():
    """Mirrored siblings change the joint law of a node's children, not their marginals: every level of a
    k=2 tree branching at 6 steps (σ[20..26] of T = 100), and its leaves after the ODE tail, match the flow
    chain's closed form N((1−σ)m, (1−σ)²v + σ²) and the data N(m, v)."""
    pol = AnalyticPolicy("flow", var=0.25, means=(0.5,), shape=(8, 1, 1))
    cfg = TreeConfig(steps=100, window_start=20, window_width=6, branch=2, antithetic=True)
    tb = sample_trees(pol, ["p0"] * 500, cfg, generator=torch.Generator().manual_seed(6))
    for j in (2, 4, 6):
        s = tb.sigmas[20 + j].item()
        x = tb.latents[j].flatten()
        assert x.mean().item() == pytest.approx((1 - s) * 0.5, abs=0.03)
        assert x.var().item() == pytest.approx((1 - s) ** 2 * 0.25 + s**2, rel=0.06)
    assert tb.leaves.mean().item() == pytest.approx(0.5, abs=0.03)
    assert tb.leaves.var().item() == pytest.approx(0.25, rel=0.06)


def test_epsilon_sde_chain_matches_exact_discrete_variance():
    """The discretised DDIM(eta=1) chain on Gaussian data has a closed-form variance at every step:
    with a = v/(v+σ²), c = sqrt(σ'² − std²): Var' = (a + c(1−a)/σ)²·Var + std²."""
    steps, v = 20, 0.25
    pol = AnalyticPolicy("epsilon", var=v, means=(0.5,), shape=(8, 1, 1))
    sig = pol.sigmas(steps).double()
    var = v + sig[0] ** 2
    expected = [var]
    for i in range(steps - 1):
        s, sn = sig[i], sig[i + 1]
        _, std = eps_sde_mean_std(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), s.float(), sn.float(), 1.0)
        std = std.double().flatten()[0]
        a = v / (v + s**2)
        c = (sn**2 - std**2).clamp_min(0).sqrt()
        var = (a + c * (1 - a) / s) ** 2 * var + std**2
        expected.append(var)
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(2000, 8, 1, 1, generator=gen)
    noise = (0.5 + (v + sig[0] ** 2).sqrt().float() * z) / sig[0].float()
    cfg = TreeConfig(steps=steps, window_start=0, window_width=steps - 1, method="trajectory", group_size=2)
    tb = sample_trees(pol, ["p0"] * 2000, cfg, generator=gen, noise=noise)
    for j in (5, 12, steps - 1):
        assert tb.latents[j].var().item() == pytest.approx(expected[j].item(), rel=0.05)
        assert tb.latents[j].mean().item() == pytest.approx(0.5, abs=0.05 * expected[j].sqrt().item())


def test_a_kernel_or_kl_of_an_unknown_kind_is_refused_not_computed_as_another():
    """An unknown prediction type or reduction was taken for the flow / summed one by the KL (silently)."""
    from treegrpo.loss import kl_to_reference
    with pytest.raises(ValueError, match="prediction type 'v'"):
        SDEKernel("v")
    with pytest.raises(ValueError, match="'mean' or 'sum', got 'max'"):
        SDEKernel("flow", reduction="max")
    m = torch.zeros(2, 3, 4, 4)
    with pytest.raises(ValueError, match="'mean' or 'sum', got 'max'"):
        kl_to_reference(m, m + 1, torch.ones(2, 1, 1, 1), "max")
    assert torch.allclose(kl_to_reference(m, m + 1, torch.ones(2, 1, 1, 1), "sum"), torch.full((2,), 24.0))
