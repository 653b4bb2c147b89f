"""Tree sampler structure, NFE against the formula, batching per level, leaf cap, window schedules."""
import math
import random

import pytest
import torch

from treegrpo.policy import select_cond
from treegrpo.config import ConfigError, TreeConfig
from treegrpo.sde import sde_mean_std
from treegrpo.tree import at_iteration, expected_nfe, level_sizes, mirror_siblings, sample_trees, tail_sigmas, window_start_at

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


def test_tail_steps_schedule_sets_each_iterations_tail():
    """``tail_steps_schedule`` [[0, 1], [3, 2], [5, 0]]: one tail step at iterations 0-2, two at 3-4, the schedule's
    remaining steps from 5 on; each iteration's tree costs what the closed form says for its tail
    (s + 1 + k + k² + k³·tail with DPM++(2M), 1 NFE per step; 0 = T - s - w = 6 steps)."""
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    cfg = TreeConfig(steps=10, window_start=1, window_width=3, branch=2, tail_solver="dpmpp_2m", tail_steps=3,
                     tail_steps_schedule=[[0, 1], [3, 2], [5, 0]])
    for it, tail in [(0, 1), (2, 1), (3, 2), (4, 2), (5, 6), (99, 6)]:
        tree = at_iteration(cfg, it)
        assert tree.tail_steps_schedule == [] and tree.branching == cfg.branching
        tb = sample_trees(pol, ["p0", "p1"], tree, generator=torch.Generator().manual_seed(it))
        assert tb.nfe == 2 * (1 + 1 + 2 + 4 + 8 * tail) == 2 * expected_nfe(tree)
        assert sum(pol.rows) == tb.nfe
        pol.rows.clear()
    plain = TreeConfig(steps=10, window_start=1, window_width=3, branch=2, tail_steps=3)
    assert at_iteration(plain, 7) is plain


@pytest.mark.parametrize("schedule,msg", [
    ([[1, 1], [5, 2]], "must start at iteration 0"),
    ([[0, 1], [5, 2], [5, 3]], "iterations must increase"),
    ([[0, 1], [4]], "[iteration, tail_steps] pairs"),
    ([[0, -1]], "whole numbers >= 0"),
    ([[0, 1.5]], "whole numbers >= 0"),
    ([1, 2], "pairs"),
    ("0:1,60:2", "must be a list"),
])
def test_tail_steps_schedule_bad_values_are_named(schedule, msg):
    with pytest.raises(ConfigError, match=r"TreeConfig\.tail_steps_schedule") as e:
        TreeConfig(steps=10, window_start=1, window_width=3, tail_steps_schedule=schedule)
    assert msg in str(e.value)


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


def test_mirror_siblings_pairs_within_each_parent():
    eps = torch.arange(1.0, 13.0)[:, None]               # 2 trees x 6 children, branch 3 (2 parents per tree)
    out = mirror_siblings(eps, 3, 6).flatten().tolist()
    assert out == [1, -1, 3, 4, -4, 6, 7, -7, 9, 10, -10, 12]
    assert mirror_siblings(eps, 1, 6) is eps             # only children (trajectory chains) are untouched
    # a leaf cap can cut a parent's children short: ranks still count within the parent
    assert mirror_siblings(torch.arange(1.0, 6.0)[:, None], 2, 5).flatten().tolist() == [1, -1, 3, -3, 5]


@pytest.mark.parametrize("k,method", [(2, "tree"), (3, "tree"), (2, "trajectory")])
def test_antithetic_children_mirror_their_siblings(k, method):
    pol = AnalyticPolicy("flow", shape=(4, 1, 1))
    cfg = TreeConfig(steps=6, window_start=1, window_width=3, branch=k, method=method, antithetic=True)
    gens = lambda: [torch.Generator().manual_seed(10 + t) for t in range(2)]
    tb = sample_trees(pol, ["p0", "p1"], cfg, generator=gens())
    ref = sample_trees(pol, ["p0", "p1"], TreeConfig(**{**cfg.__dict__, "antithetic": False}), generator=gens())
    assert tb.nfe == ref.nfe == 2 * expected_nfe(cfg)
    for j, b in enumerate(cfg.branching):
        x, par, lp = tb.latents[j + 1], tb.parents[j], tb.logp_old[j]
        rank = torch.arange(x.shape[0]) % b
        if b == 1:   # trajectory chains after the first step: independent noise, as without the option
            continue
        # children 2i and 2i+1 of a parent sit symmetrically about the SDE mean: their sum is twice the
        # mean, and the Gaussian density gives them the same behaviour log-prob
        first, second = (rank % 2 == 0) & (rank + 1 < b), rank % 2 == 1
        mid = (x[first] + x[second]) / 2
        assert torch.equal(par[first], par[second])
        assert not torch.allclose(x[first], x[second])
        assert torch.allclose(lp[first], lp[second], atol=1e-6)
        # the pair's midpoint is the SDE mean of their parent, recomputed here from the parent's latent
        xp, sig, sig_n = tb.latents[j], tb.sigmas[1 + j], tb.sigmas[2 + j]
        n = xp.shape[0]
        x0 = pol.denoise(xp, sig.expand(n), select_cond(tb.cond, tb.tree_of(j)), 1.0)
        mean, _ = sde_mean_std("flow", xp, x0, sig.expand(n), sig_n.expand(n), noise_level=cfg.noise_level,
                               eta=cfg.eta, sigma_1_next=tb.sigmas[1])
        assert torch.allclose(mid, mean[par[first]], atol=1e-5)
        if b == 3:   # the odd child keeps its own draw: it is not the mirror of anything
            odd = x[rank == 2]
            assert not torch.allclose(odd, 2 * mid - odd)
    # an even-ranked child gets exactly the draw it would get without the option (same generator stream)
    keep = torch.arange(tb.latents[1].shape[0]) % cfg.branching[0] % 2 == 0
    assert torch.equal(tb.latents[1][keep], ref.latents[1][keep])


def test_mirrored_siblings_by_default_for_trees_only():
    assert TreeConfig().mirrored and not TreeConfig(method="trajectory").mirrored
    assert not TreeConfig(antithetic=False).mirrored and TreeConfig(method="trajectory", antithetic=True).mirrored
    pol = AnalyticPolicy("flow", shape=(4, 1, 1))
    tb = sample_trees(pol, ["p0"], TreeConfig(steps=4, window_start=1, window_width=2), generator=torch.Generator())
    assert torch.allclose(tb.logp_old[1][0::2], tb.logp_old[1][1::2], atol=1e-6)   # mirrored pairs: equal density


@pytest.mark.parametrize("schedule", [[4, 2], [2, 4], [8], [3, 1, 2]])
def test_branch_schedule_shapes_each_window_step(schedule):
    """``branch_schedule`` gives each window step its own k_j: level sizes are the running products, the NFE is
    the formula's with Σ_j Π_{i<j} k_i window rows, parents are tree-major, and mirrored pairs sit inside each
    parent's k_j children (an odd last child keeps its own draw)."""
    w = len(schedule)
    cfg = TreeConfig(steps=6, window_start=1, window_width=w, branch_schedule=schedule)
    sizes = [math.prod(schedule[:j]) for j in range(w + 1)]
    assert cfg.branching == schedule and cfg.leaves == cfg.leaves_full == sizes[-1]
    pol = AnalyticPolicy("flow", shape=(4, 1, 1))
    tb = sample_trees(pol, ["p0", "p1"], cfg, generator=torch.Generator().manual_seed(0))
    assert tb.nfe == 2 * (1 + sum(sizes[:-1]) + sizes[-1] * (6 - 1 - w)) == 2 * expected_nfe(cfg)
    assert [x.shape[0] for x in tb.latents] == [2 * n for n in sizes]
    for j, b in enumerate(schedule):
        par, x, lp = tb.parents[j], tb.latents[j + 1], tb.logp_old[j]
        assert par.tolist() == [i // b for i in range(2 * sizes[j + 1])]
        if b == 1:   # an only child: nothing to mirror
            continue
        rank = torch.arange(x.shape[0]) % b
        first, second = (rank % 2 == 0) & (rank + 1 < b), rank % 2 == 1
        assert torch.equal(par[first], par[second]) and not torch.allclose(x[first], x[second])
        assert torch.allclose(lp[first], lp[second], atol=1e-6)   # ε and −ε: the same density


@pytest.mark.parametrize("kw,msg", [
    (dict(window_width=3, branch_schedule=[4, 2]), "one entry per window step (3)"),
    (dict(window_width=2, branch_schedule=[4, 0]), "whole numbers >= 1"),
    (dict(window_width=2, branch_schedule=[4, 2.5]), "branch_schedule"),
    (dict(window_width=2, branch_schedule=[4, 2], method="trajectory"), "only shapes trees"),
    (dict(window_width=2, branch_schedule=[64, 8]), "512 leaves per tree exceed max_leaves=256"),
])
def test_branch_schedule_bad_values_are_named(kw, msg):
    with pytest.raises(ConfigError, match="branch_schedule" if "max_leaves" not in msg else "branch") as e:
        TreeConfig(steps=6, window_start=0, **kw)
    assert msg in str(e.value)


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
    (dict(antithetic="yes"), "antithetic"),
])
def test_tree_config_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=rf"TreeConfig\.{field}:"):
        TreeConfig(**kw)
