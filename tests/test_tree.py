"""Tree sampler structure, NFE against the formula, batching per level, leaf cap, window schedules."""
import math
import random

import pytest
import torch

from treegrpo.config import ConfigError, TreeConfig
from treegrpo.tree import expected_nfe, level_sizes, sample_trees, tail_sigmas, window_start_at

from analytic import AnalyticPolicy


@pytest.mark.parametrize("T,s,w,k", [(10, 2, 3, 2), (6, 0, 1, 4), (8, 5, 3, 3), (12, 3, 2, 2), (5, 4, 1, 3)])
@pytest.mark.parametrize("guidance", [1.0, 3.5])
def test_nfe_equals_formula(T, s, w, k, guidance):
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    cfg = TreeConfig(steps=T, window_start=s, window_width=w, branch=k)
    n_trees = 3
    tb = sample_trees(pol, ["p0", "p1", "p0"], cfg, guidance=guidance, generator=torch.Generator().manual_seed(0))
    formula = s + sum(k**j for j in range(w)) + k**w * (T - s - w)
    mult = 2 if guidance != 1.0 else 1
    assert tb.nfe == n_trees * formula * mult == n_trees * expected_nfe(cfg, guidance=guidance)
    assert sum(pol.rows) == tb.nfe                      # what the model really evaluated
    assert tb.calls == len(pol.rows) == T               # one batched call per level of all trees
    assert tb.leaves.shape == (n_trees * k**w, 2, 1, 1)
    assert [x.shape[0] for x in tb.latents] == [n_trees * k**j for j in range(w + 1)]


def test_tree_structure_and_shared_prefix():
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    cfg = TreeConfig(steps=6, window_start=2, window_width=2, branch=3)
    tb = sample_trees(pol, ["p0", "p1"], cfg, generator=torch.Generator().manual_seed(0))
    # parents are tree-major: children of node i are i*k .. i*k+k-1
    assert tb.parents[0].tolist() == [0, 0, 0, 1, 1, 1]
    assert tb.parents[1].tolist() == [i // 3 for i in range(18)]
    assert tb.tree_of(2).tolist() == [0] * 9 + [1] * 9
    # siblings differ (independent noise), leaves of one tree share the window root
    assert not torch.allclose(tb.latents[1][0], tb.latents[1][1])
    assert len(tb.leaf_prompts) == 18 and tb.leaf_prompts[9] == "p1"


def test_leaf_cap_keeps_first_leaves_and_their_ancestors():
    assert level_sizes([2, 2, 2], 5) == [1, 2, 3, 5]
    assert level_sizes([2, 2, 2], 0) == [1, 2, 4, 8]
    assert level_sizes([4, 1], 3) == [1, 3, 3]
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    cfg = TreeConfig(steps=7, window_start=1, window_width=3, branch=2, leaf_cap=5)
    tb = sample_trees(pol, ["p0", "p1"], cfg, generator=torch.Generator().manual_seed(0))
    assert tb.parents[2].tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4, 5]
    assert tb.nfe == 2 * (1 + (1 + 2 + 3) + 5 * 3) == 2 * expected_nfe(cfg)


def test_trajectory_method_is_a_tree_with_one_branching_step():
    cfg = TreeConfig(steps=8, window_start=2, window_width=3, branch=2, method="trajectory")
    assert cfg.branching == [8, 1, 1] and cfg.leaves == 8
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    tb = sample_trees(pol, ["p0"], cfg, generator=torch.Generator().manual_seed(0))
    assert tb.nfe == 2 + 1 + 8 + 8 + 8 * 3 == expected_nfe(cfg)
    assert tb.parents[1].tolist() == list(range(8))


def test_dpmpp_2m_tail_costs_one_nfe_per_step():
    pol = AnalyticPolicy("epsilon", shape=(2, 1, 1))
    cfg = TreeConfig(steps=10, window_start=2, window_width=2, branch=2, tail_solver="dpmpp_2m", tail_steps=3)
    tb = sample_trees(pol, ["p0"], cfg, generator=torch.Generator().manual_seed(0))
    assert tb.nfe == 2 + 1 + 2 + 4 * 3 == expected_nfe(cfg)
    assert torch.isfinite(tb.leaves).all()


def test_heun_tail_and_respaced_tail():
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    cfg = TreeConfig(steps=10, window_start=2, window_width=2, branch=2, tail_solver="heun", tail_steps=3)
    tb = sample_trees(pol, ["p0"], cfg, generator=torch.Generator().manual_seed(0))
    assert tb.nfe == 2 + 1 + 2 + 4 * (2 * 3 - 1) == expected_nfe(cfg)
    sig = torch.linspace(1, 0, 11)
    t = tail_sigmas(sig, 4, 3)
    assert t[0] == sig[4] and t[-1] == 0 and t.numel() == 4
    assert torch.equal(tail_sigmas(sig, 4, 0), sig[4:])


def test_higher_order_tails_are_more_accurate_than_euler():
    """On the exact Gaussian denoiser, against a 200-step Euler solution: DPM-Solver++(2M) beats Euler at
    equal NFE, Heun beats Euler at equal steps."""
    pol = AnalyticPolicy("flow", var=0.25, means=(0.5,), shape=(64, 1, 1))
    noise = torch.randn(4, 64, 1, 1, generator=torch.Generator().manual_seed(0))

    def leaves(**kw):
        cfg = TreeConfig(steps=10, window_start=0, window_width=1, branch=2, noise_level=1e-3, **kw)
        return sample_trees(pol, ["p0"] * 4, cfg, noise=noise, generator=torch.Generator().manual_seed(1)).leaves

    ref = leaves(tail_steps=200)
    err = {name: (leaves(tail_solver=name.split("@")[0], tail_steps=int(name.split("@")[1])) - ref).abs().mean()
           for name in ("euler@3", "heun@3", "euler@5", "dpmpp_2m@5")}
    assert err["heun@3"] < 0.6 * err["euler@3"]
    assert err["dpmpp_2m@5"] < 0.6 * err["euler@5"]


def test_window_schedules():
    fixed = TreeConfig(steps=10, window_start=1, window_width=3)
    assert {window_start_at(fixed, i) for i in range(20)} == {1}
    sl = TreeConfig(steps=10, window_start=1, window_width=3, window_schedule="sliding", window_every=2,
                    window_max_start=4)
    assert [window_start_at(sl, i) for i in range(10)] == [1, 1, 2, 2, 3, 3, 4, 4, 1, 1]
    rnd = TreeConfig(steps=10, window_start=2, window_width=3, window_schedule="random")
    seen = {window_start_at(rnd, i, random.Random(i)) for i in range(200)}
    assert seen == set(range(2, 8))


@pytest.mark.parametrize("kw,field", [
    (dict(branch=0), "branch"), (dict(window_width=0), "window_width"),
    (dict(steps=5, window_start=3, window_width=3), "window_start"), (dict(window_start=-1), "window_start"),
    (dict(method="beam"), "method"), (dict(logprob_reduction="max"), "logprob_reduction"),
    (dict(branch=1, window_width=3), "branch"), (dict(noise_level=0), "noise_level"), (dict(eta=0), "eta"),
    (dict(group_size=4), "group_size"), (dict(window_schedule="sliding", window_max_start=9), "window_max_start"),
])
def test_tree_config_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=rf"TreeConfig\.{field}:"):
        TreeConfig(**kw)
