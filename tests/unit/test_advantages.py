"""Reward aggregation, leaf z-scores and the backup on hand-computed trees."""
import math
import statistics as st

import pytest
import torch

from treegrpo.advantages import (RewardError, aggregate_rewards, backup_advantages, backup, batch_scaled_advantages,
                                 leaf_advantages,
                                 sibling_baseline)
from treegrpo.config import AdvantageConfig, TreeConfig
from treegrpo.tree import sample_trees

from analytic import AnalyticPolicy

EPS = 1e-6


def z(xs):
    m, s = st.fmean(xs), st.pstdev(xs)
    return [(x - m) / (s + EPS) for x in xs]


def test_k2_w2_hand_computed_mean_and_softmax():
    rewards = [1.0, 2.0, 3.0, 6.0]                      # one tree, leaves in order
    a = z(rewards)                                       # [-2,-1,0,3]/sqrt(3.5)
    assert a[0] == pytest.approx(-2 / math.sqrt(3.5), rel=1e-5)
    parents = [torch.tensor([0, 0]), torch.tensor([0, 0, 1, 1])]
    logp = [torch.tensor([0.3, -0.2]), torch.tensor([0.0, math.log(3.0), 0.0, 0.0])]
    leaf = leaf_advantages(torch.tensor(rewards), torch.zeros(4, dtype=torch.long), 1, EPS)
    assert leaf.tolist() == pytest.approx(a, rel=1e-5)

    mean = backup(parents, logp, leaf, "mean")
    assert mean[1].tolist() == pytest.approx(a, rel=1e-5)
    assert mean[0].tolist() == pytest.approx([(a[0] + a[1]) / 2, (a[2] + a[3]) / 2], rel=1e-5)

    soft = backup(parents, logp, leaf, "softmax", 1.0)
    # children of u0 have log-probs 0 and log 3 -> weights 1/4, 3/4; u1's children are equal
    assert soft[0].tolist() == pytest.approx([0.25 * a[0] + 0.75 * a[1], 0.5 * a[2] + 0.5 * a[3]], rel=1e-5)
    soft_t2 = backup(parents, logp, leaf, "softmax", 2.0)
    w1 = math.sqrt(3) / (1 + math.sqrt(3))
    assert soft_t2[0][0].item() == pytest.approx((1 - w1) * a[0] + w1 * a[1], rel=1e-5)


def test_sibling_baseline_hand_computed():
    a = [-1.0, 2.0, 0.5, -1.5]                           # leaf advantages of a k=2, w=2 tree
    parents = [torch.tensor([0, 0]), torch.tensor([0, 0, 1, 1])]
    logp = [torch.tensor([0.0, 0.0]), torch.tensor([0.0, math.log(3.0), 0.0, 0.0])]
    edge = backup(parents, logp, torch.tensor(a), "softmax")  # u0: 1/4·(-1) + 3/4·2 = 1.25; u1: -0.5
    assert edge[0].tolist() == pytest.approx([1.25, -0.5])
    out = sibling_baseline(parents, edge)
    assert out[1].tolist() == pytest.approx([-1.5, 1.5, 1.0, -1.0])  # minus the siblings' means 0.5, -0.5
    assert out[0].tolist() == pytest.approx([0.875, -0.875])         # minus (1.25 - 0.5)/2
    # a trajectory group: 3 edges out of the root, then chains; unchanged (z-scored root edges, only children)
    tp = [torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2])]
    tadv = [torch.tensor([1.0, -2.0, 1.0]), torch.tensor([1.0, -2.0, 1.0])]
    tout = sibling_baseline(tp, tadv)
    assert tout[0].tolist() == pytest.approx([1.0, -2.0, 1.0]) and tout[1].tolist() == pytest.approx([1.0, -2.0, 1.0])


def test_sibling_baseline_in_backup_advantages():
    tb, tb2 = _batch(), _batch()
    r = torch.rand(24, generator=torch.Generator().manual_seed(3))
    backup_advantages(tb, {"x": r}, {"x": 1.0}, AdvantageConfig(backup="mean", adv_clip=0, flat_floor=0,
                                                                edge_baseline="none"))
    backup_advantages(tb2, {"x": r}, {"x": 1.0}, AdvantageConfig(backup="mean", adv_clip=0, flat_floor=0))
    for j in range(1, 3):   # siblings' advantages sum to zero; under the mean backup: minus the parent's value
        s = torch.zeros(tb2.advantages[j - 1].numel()).index_add_(0, tb2.parents[j], tb2.advantages[j])
        assert s.abs().max().item() < 1e-5
        assert torch.allclose(tb2.advantages[j], tb.advantages[j] - tb.advantages[j - 1][tb.parents[j]], atol=1e-6)


def test_k3_w1_hand_computed():
    rewards = [0.0, 1.0, 5.0]
    leaf = leaf_advantages(torch.tensor(rewards), torch.zeros(3, dtype=torch.long), 1, EPS)
    out = backup([torch.tensor([0, 0, 0])], [torch.tensor([0.1, 0.2, 0.3])], leaf, "softmax")
    assert len(out) == 1 and out[0].tolist() == pytest.approx(z(rewards), rel=1e-5)
    assert sum(out[0].tolist()) == pytest.approx(0, abs=1e-5)


def test_two_rewards_weighted_and_two_trees():
    r1 = torch.tensor([1.0, 2.0, 3.0, 6.0, 10.0, 10.0, 0.0, 4.0])
    r2 = torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 0.0, 2.0, 0.0])
    tree = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    agg = aggregate_rewards({"a": r1, "b": r2}, {"a": 1.0, "b": 0.5}, tree, 2, EPS)
    exp0 = [x + 0.5 * y for x, y in zip(z([1, 2, 3, 6]), z([0, 0, 1, 1]))]
    exp1 = [x + 0.5 * y for x, y in zip(z([10, 10, 0, 4]), z([2, 0, 2, 0]))]
    assert agg.tolist() == pytest.approx(exp0 + exp1, rel=1e-5)
    leaf = leaf_advantages(agg, tree, 2, EPS)
    assert leaf.tolist() == pytest.approx(z(exp0) + z(exp1), rel=1e-5)


def test_constant_rewards_give_zero_advantages_and_nan_raises():
    leaf = leaf_advantages(torch.full((4,), 0.7), torch.zeros(4, dtype=torch.long), 1, EPS)
    assert torch.equal(leaf, torch.zeros(4))
    agg = aggregate_rewards({"a": torch.full((4,), 3.0)}, {"a": 1.0}, torch.zeros(4, dtype=torch.long), 1, EPS)
    assert torch.equal(agg, torch.zeros(4)) and not torch.isnan(agg).any()
    with pytest.raises(RewardError, match=r"reward 'aesthetic' returned non-finite values .* leaves \[2\]"):
        aggregate_rewards({"aesthetic": torch.tensor([1.0, 2.0, float("nan"), 0.0])}, {"aesthetic": 1.0},
                          torch.zeros(4, dtype=torch.long), 1, EPS)
    with pytest.raises(RewardError, match="expected \\(4,\\)"):
        aggregate_rewards({"a": torch.ones(3)}, {"a": 1.0}, torch.zeros(4, dtype=torch.long), 1, EPS)


def _batch():
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    cfg = TreeConfig(steps=6, window_start=1, window_width=3, branch=2)
    return sample_trees(pol, ["p0", "p1", "p0"], cfg, generator=torch.Generator().manual_seed(0))


def test_backup_advantages_on_sampled_trees_flat_tree_and_invariants():
    tb = _batch()
    g = torch.Generator().manual_seed(1)
    r = torch.rand(24, generator=g)
    r[8:16] = 0.5                                        # tree 1 is flat
    stats = backup_advantages(tb, {"demo": r}, {"demo": 1.0}, AdvantageConfig(backup="mean", adv_clip=0,
                                                                                     edge_baseline="none"))
    assert stats["flat_trees"] == 1 and tb.trainable.tolist() == [True, False, True]
    leaf = tb.advantages[-1]
    assert torch.equal(leaf[8:16], torch.zeros(8))
    for t in (0, 2):
        assert leaf[8 * t:8 * t + 8].mean().item() == pytest.approx(0, abs=1e-6)
        assert leaf[8 * t:8 * t + 8].std(correction=0).item() == pytest.approx(1, abs=1e-4)
    # mean backup: a node's advantage is the average of its children's edges, at every level
    for j in range(1, 3):
        child, par = tb.advantages[j], tb.parents[j]
        for u in range(tb.advantages[j - 1].numel()):
            assert tb.advantages[j - 1][u].item() == pytest.approx(child[par == u].mean().item(), abs=1e-6)


def test_adv_clip_and_prompt_level_stats():
    tb = _batch()
    r = torch.zeros(24)
    r[0] = 100.0                                          # one outlier leaf -> z = sqrt(7) ≈ 2.65
    backup_advantages(tb, {"x": r}, {"x": 1.0}, AdvantageConfig(adv_clip=2.0, flat_floor=0, edge_baseline="none"))
    assert tb.advantages[-1].max().item() == pytest.approx(2.0)
    tb2 = _batch()
    tb2.prompt_ids = torch.tensor([0, 1, 0])
    r2 = torch.arange(24, dtype=torch.float32)
    backup_advantages(tb2, {"x": r2}, {"x": 1.0}, AdvantageConfig(reward_stats="prompt", flat_floor=0,
                                                                            edge_baseline="none"))
    assert tb2.advantages[-1][:8].mean().item() == pytest.approx(0, abs=1e-5)


def test_batch_std_scope_keeps_each_trees_spread_relative_to_the_batch():
    """Two trees of 2 leaves: centred rewards ±1 and ±0.1. GRPO's per-tree std makes both ±1; the batch
    scope divides by the batch RMS (√0.505), so the near-flat tree keeps a tenth of the other's advantage."""
    tree = torch.tensor([0, 0, 1, 1])
    raw = {"x": torch.tensor([0.0, 2.0, 0.0, 0.2])}
    a = batch_scaled_advantages(raw, {"x": 1.0}, tree, 2, tree, 2, 1e-6)
    assert a.tolist() == pytest.approx([-1 / 0.505 ** 0.5, 1 / 0.505 ** 0.5, -0.1 / 0.505 ** 0.5, 0.1 / 0.505 ** 0.5],
                                       rel=1e-5)
    assert float((a ** 2).mean()) == pytest.approx(1.0, rel=1e-5)
    z = leaf_advantages(aggregate_rewards(raw, {"x": 1.0}, tree, 2, 1e-6), tree, 2, 1e-6)
    assert z.tolist() == pytest.approx([-1, 1, -1, 1], rel=1e-4)
    # a pool (data parallel: another rank holding a copy of this batch) leaves the RMS, and so the result, alone
    twice = batch_scaled_advantages(raw, {"x": 1.0}, tree, 2, tree, 2, 1e-6, pool=lambda s: 2 * s)
    assert torch.allclose(twice, a)
    # a flat tree gets zeros, and the other keeps unit RMS over the batch
    flat = batch_scaled_advantages({"x": torch.tensor([0.0, 2.0, 0.5, 0.5])}, {"x": 1.0}, tree, 2, tree, 2, 1e-6)
    assert flat[2:].abs().max() == 0 and flat[:2].tolist() == pytest.approx([-2 ** 0.5, 2 ** 0.5], rel=1e-5)


def test_std_scope_batch_in_backup_advantages():
    base = torch.rand(8, generator=torch.Generator().manual_seed(4))
    r = torch.cat([base, 0.1 * base, base])               # tree 1: the same pattern at a tenth of the spread
    tb, ref = _batch(), _batch()
    kw = dict(backup="mean", adv_clip=0, flat_floor=0)
    st = backup_advantages(tb, {"x": r}, {"x": 1.0}, AdvantageConfig(std_scope="batch", **kw))
    backup_advantages(ref, {"x": r}, {"x": 1.0}, AdvantageConfig(**kw))
    for adv, ref_adv in zip(tb.advantages, ref.advantages):   # every level scales with its tree's spread
        n = adv.numel() // 3
        assert torch.allclose(adv[n:2 * n], 0.1 * adv[:n], atol=1e-5) and torch.allclose(adv[2 * n:], adv[:n])
        assert torch.allclose(ref_adv[n:2 * n], ref_adv[:n], atol=1e-4)   # GRPO's per-tree std: all alike
    assert st["reward"] == pytest.approx(float(r.mean()))


def test_excluded_trees_are_not_trained_on():
    """An artist's tree without preference (``exclude_trees``) is untrainable: no edge of it reaches the update,
    whatever its rewards; the other trees keep the advantages they have without it."""
    from treegrpo.update import collect_edges

    g = torch.Generator().manual_seed(1)
    r = torch.rand(24, generator=g)
    cfg = AdvantageConfig(backup="mean", adv_clip=0, edge_baseline="none", flat_floor=0)
    ref, tb = _batch(), _batch()
    backup_advantages(ref, {"x": r}, {"x": 1.0}, cfg)
    st = backup_advantages(tb, {"x": r}, {"x": 1.0}, cfg, exclude_trees=torch.tensor([False, True, False]))
    assert tb.trainable.tolist() == [True, False, True]
    # the reward shown is that of the trees scored (an unanswered tree's leaves hold a placeholder)
    scored = tb.leaf_tree != 1
    assert st["scored_trees"] == 2 and st["reward"] == pytest.approx(float(r[scored].mean()))
    none = backup_advantages(_batch(), {"x": r}, {"x": 1.0}, cfg, exclude_trees=torch.ones(3, dtype=torch.bool))
    assert none["scored_trees"] == 0
    from treegrpo.progress import iteration_line
    assert "no tree scored" in iteration_line({**none, "iteration": 0}, None)
    assert "reward 0." in iteration_line({**st, "iteration": 0}, None)
    assert torch.equal(tb.advantages[-1][:8], ref.advantages[-1][:8])
    kept = collect_edges(tb, skip_zero_adv=False)
    assert kept.n_edges < collect_edges(ref, skip_zero_adv=False).n_edges and 1 not in set(kept.parent_tree.tolist())


def _probe_rank(schedule, antithetic=True):
    """Rank of the linear map from one tree's leaf advantages to the policy-gradient directions at its parents,
    ``Σ_children A_c·(x_c − μ_p)`` stacked over parents (A from the mean backup and the sibling baseline; μ_p the
    mean of p's mirrored children, which is the SDE mean exactly): how many independent probes of the reward the
    tree's leaves give the update. 16-dim latents, so no tree here is short of directions."""
    pol = AnalyticPolicy("flow", shape=(16, 1, 1))
    cfg = TreeConfig(steps=6, window_start=1, window_width=len(schedule), branch=2, branch_schedule=list(schedule),
                     antithetic=antithetic)
    tb = sample_trees(pol, ["p0"], cfg, generator=torch.Generator().manual_seed(0))
    n_leaves = tb.leaves.shape[0]
    cols = []
    for i in range(n_leaves):
        adv = sibling_baseline(tb.parents, backup(tb.parents, tb.logp_old, torch.eye(n_leaves)[i], "mean"))
        dirs = []
        for j, (par, a) in enumerate(zip(tb.parents, adv)):
            x = tb.latents[j + 1].flatten(1).double()
            n_p = tb.latents[j].shape[0]
            count = torch.bincount(par, minlength=n_p)[:, None]
            mu = torch.zeros(n_p, x.shape[1], dtype=x.dtype).index_add_(0, par, x) / count
            dirs.append(torch.zeros_like(mu).index_add_(0, par, a.double()[:, None] * (x - mu[par])).flatten())
        cols.append(torch.cat(dirs))
    # a genuine probe's singular value is O(1); a cancelled pair leaves the float32 latents' rounding (~1e-7)
    return n_leaves, int(torch.linalg.matrix_rank(torch.stack(cols, 1), rtol=1e-4))


def test_a_mirrored_tree_gives_one_clean_probe_per_pair_and_the_binary_tree_all_l_minus_1():
    """L leaf rewards less their mean span L − 1 contrasts, the most any group of L samples can teach from a scalar
    reward (docs/design.md §1). The binary mirrored tree uses all of them (a Haar transform of its rewards: 7 for
    8 leaves); wider nodes lose the contrasts between their pairs, whose ±ε cancel in the gradient: [4, 2] keeps 6,
    [2, 4] 5, [8] 4 — the order of their measured gradient SNR — and [4, 4] 10 of 15. Independent siblings keep
    all 7, each noisier."""
    assert _probe_rank([2, 2, 2]) == (8, 7)
    assert _probe_rank([4, 2]) == (8, 6)
    assert _probe_rank([2, 4]) == (8, 5)
    assert _probe_rank([8]) == (8, 4)
    assert _probe_rank([4, 4]) == (16, 10)      # 2 at the root, 2 under each of its 4 children
    assert _probe_rank([8], antithetic=False) == (8, 7)
