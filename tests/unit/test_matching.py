"""The flow-matching objectives (treegrpo/matching.py: DiffusionNFT- and AWM-style) against hand-written references,
the independent-ODE groups they sample from (tree.method ode), and short seeded runs that raise the demo reward."""
import pytest
import torch

from treegrpo.config import ConfigError, TrainConfig
from treegrpo.matching import awm_loss, matching_error, nft_loss, optimality, renoise
from treegrpo.run import run_training


def _tensors(seed=0, b=4, shape=(3, 4, 4)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((b, *shape), generator=g) for _ in range(4)] + [torch.rand(b, generator=g) * 0.9 + 0.05]


def test_renoise_is_the_forward_process_of_each_prediction_type():
    x0, eps, _, _, sigma = _tensors()
    s = sigma[:, None, None, None]
    assert torch.allclose(renoise(x0, eps, sigma, "flow"), (1 - s) * x0 + s * eps)
    assert torch.allclose(renoise(x0, eps, sigma, "epsilon"), x0 + s * eps)
    with pytest.raises(ValueError, match="prediction type"):
        renoise(x0, eps, sigma, "v")


def test_matching_error_is_the_velocity_loss_for_flow_and_the_noise_loss_for_sigma_space():
    x0, eps, x0_hat, _, sigma = _tensors()
    s = sigma[:, None, None, None]
    # flow: v = eps - x0 is the target, the model's velocity v̂ = (x_t − x̂0)/σ
    x_t = (1 - s) * x0 + s * eps
    v_hat, v = (x_t - x0_hat) / s, eps - x0
    assert torch.allclose(matching_error(x0_hat, x0, sigma), ((v_hat - v) ** 2).flatten(1).mean(1), rtol=1e-5)
    # σ-space: x_t = x0 + σ·ε, ε̂ = (x_t − x̂0)/σ against ε
    x_t = x0 + s * eps
    eps_hat = (x_t - x0_hat) / s
    assert torch.allclose(matching_error(x0_hat, x0, sigma), ((eps_hat - eps) ** 2).flatten(1).mean(1), rtol=1e-5)


def test_nft_with_every_sample_optimal_is_the_matching_loss_of_the_implicit_positive_policy():
    x0, eps, x0_theta, x0_old, sigma = _tensors(1)
    s = sigma[:, None, None, None]
    x_t = (1 - s) * x0 + s * eps
    beta = 0.7
    ones = torch.ones(4)
    # by hand, in velocities: v+ = (1−β)·v_old + β·v_θ against v = ε − x0, mean over dims
    v_theta, v_old, v = (x_t - x0_theta) / s, (x_t - x0_old) / s, eps - x0
    v_pos = (1 - beta) * v_old + beta * v_theta
    want = ((v_pos - v) ** 2).flatten(1).mean(1)
    assert torch.allclose(nft_loss(x0_theta, x0_old, x0, sigma, ones, beta), want, rtol=1e-5)
    # r = 0: the implicit negative policy (1+β)·v_old − β·v_θ
    v_neg = (1 + beta) * v_old - beta * v_theta
    assert torch.allclose(nft_loss(x0_theta, x0_old, x0, sigma, 0 * ones, beta),
                          ((v_neg - v) ** 2).flatten(1).mean(1), rtol=1e-5)
    # a mixed r is the r-weighted sum of the two
    r = torch.tensor([0.0, 0.25, 0.5, 1.0])
    assert torch.allclose(nft_loss(x0_theta, x0_old, x0, sigma, r, beta),
                          r * want + (1 - r) * ((v_neg - v) ** 2).flatten(1).mean(1), rtol=1e-5)


def test_nft_and_awm_gradients_at_the_sampling_policy():
    """At θ = θ_old NFT's gradient is β·(2r − 1)·∇‖v_θ − v‖², an advantage-weighted matching gradient; AWM's is
    A·∇‖v_θ − v‖² (both by hand on a leaf tensor)."""
    x0, _, x0_theta, _, sigma = _tensors(2)
    adv = torch.tensor([1.5, -0.4, 0.0, -3.0])
    r = optimality(adv, 2.0)
    assert torch.allclose(r, torch.tensor([0.875, 0.4, 0.5, 0.0]))
    beta = 1.3
    p = x0_theta.clone().requires_grad_(True)
    nft_loss(p, p.detach(), x0, sigma, r, beta).sum().backward()
    q = x0_theta.clone().requires_grad_(True)
    (beta * (2 * r - 1) * matching_error(q, x0, sigma)).sum().backward()
    assert torch.allclose(p.grad, q.grad, atol=1e-6)
    a = x0_theta.clone().requires_grad_(True)
    awm_loss(a, x0, sigma, adv).sum().backward()
    want = adv[:, None, None, None] * 2 * (x0_theta - x0) / (x0[0].numel() * sigma[:, None, None, None] ** 2)
    assert torch.allclose(a.grad, want, atol=1e-6)


def test_loss_and_method_must_fit_together():
    with pytest.raises(ConfigError, match="method 'ode' samples no SDE edges"):
        TrainConfig(prompts=["a"], tree={"method": "ode", "group_size": 4})
    with pytest.raises(ConfigError, match="trains on leaves"):
        TrainConfig(prompts=["a"], tree={"method": "trajectory"}, optim={"loss": "awm"})
    with pytest.raises(ConfigError, match="OptimConfig.loss"):
        TrainConfig(prompts=["a"], optim={"loss": "ppo"})
    TrainConfig(prompts=["a"], tree={"method": "ode", "group_size": 4}, optim={"loss": "nft"})
    TrainConfig(prompts=["a"], tree={"method": "tree"}, optim={"loss": "awm"})


@pytest.mark.parametrize("field, value, fix", [("window_schedule", "sliding", "set it to fixed"),
                                               ("leaf_cap", 4, "set it to 0"),
                                               ("antithetic", True, "set it to null")])
def test_ode_refuses_the_tree_settings_it_would_ignore(field, value, fix):
    """Independent whole samples have no window to move, no tree to cap and no siblings to mirror: a config asking
    for one is told so instead of running without it (null / false / 0 / fixed are what it does)."""
    from treegrpo.config import TreeConfig

    with pytest.raises(ConfigError, match=f"TreeConfig.{field}.*method 'ode'.*{fix}"):
        TreeConfig(method="ode", group_size=4, **{field: value})
    TreeConfig(method="ode", group_size=4, antithetic=False)
    TreeConfig(method="trajectory", group_size=4, **{field: value})     # the trajectory baseline takes them


def test_ode_groups_are_independent_deterministic_samples_with_the_nfe_formula():
    from treegrpo.backends.demo import DemoPolicy
    from treegrpo.config import TreeConfig
    from treegrpo.tree import expected_nfe, sample_ode, sample_trees

    pol = DemoPolicy.load()
    cfg = TreeConfig(steps=6, method="ode", group_size=3)
    noise = torch.randn((2, *pol.latent_shape()), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        batch = sample_trees(pol, ["a red circle", "a blue square"], cfg, noise=noise,
                             generator=torch.Generator().manual_seed(1))
        first = sample_ode(pol, ["a red circle", "a blue square"], noise, 6)
    assert batch.leaves.shape == (6, *pol.latent_shape()) and batch.width == 0
    assert batch.nfe == 2 * expected_nfe(cfg) == 2 * 3 * 6
    assert torch.allclose(batch.leaves[[0, 3]], first, atol=1e-5)        # each group's first from the given noise
    assert (batch.leaves[0] - batch.leaves[1]).abs().max() > 1e-3        # the others from their own noises
    assert batch.leaf_prompts == ["a red circle"] * 3 + ["a blue square"] * 3


@pytest.mark.parametrize("loss,method", [("nft", "ode"), ("awm", "ode"), ("nft", "tree"), ("awm", "tree")])
def test_a_short_seeded_run_raises_the_demo_reward(tmp_path, loss, method):

    tree = {"steps": 10, "window_start": 1, "window_width": 3, "branch": 2, "method": method,
            "tail_solver": "dpmpp_2m", "tail_steps": 3}
    if method == "ode":
        tree.update(group_size=8)
    cfg = TrainConfig.from_dict({
        "backend": "demo", "prompts": ["a red circle", "a blue square", "a green triangle", "a yellow cross"],
        "tree": tree, "optim": {"lr": 3e-3, "loss": loss, "kl_beta": 0.0}, "lora": {"rank": 8, "alpha": 16.0},
        "iterations": 12, "prompts_per_iter": 4, "eval_every": 12, "eval_seeds": 4, "checkpoint_every": 0,
        "output_dir": str(tmp_path), "run_name": f"{loss}_{method}", "signals": {"kl_estimate": False}})
    trainer, _ = run_training(cfg, progress=False, write_lora=False)
    first, last = trainer.evals[0]["eval_reward"], trainer.evals[-1]["eval_reward"]
    assert last > first + 0.02, (first, last)
    assert trainer.history[-1]["forwards"] == trainer.history[-1]["edges"] > 0
    assert trainer.metadata()["treegrpo.loss"] == loss      # its LoRA says how it was trained
