"""The amortized GRPO update equals the naive per-edge loss; microbatching is exact."""
import pytest
import torch

from treegrpo.advantages import backup_advantages
from treegrpo.policy import select_cond
from treegrpo.config import AdvantageConfig, OptimConfig, TreeConfig
from treegrpo.loss import grpo_edge_loss, kl_to_reference
from treegrpo.sde import gaussian_logprob, sde_mean_std
from treegrpo.tree import sample_trees
from treegrpo.update import backward_edges, collect_edges, grpo_update, step_weights

from analytic import AnalyticPolicy


def _setup(pred, method="tree", reduction="mean"):
    torch.manual_seed(0)
    pol = AnalyticPolicy(pred, shape=(3, 1, 1), learnable=True)
    with torch.no_grad():
        pol.model.to_q.weight.normal_(0, 0.05)
    cfg = TreeConfig(steps=6, window_start=1, window_width=3, branch=2, method=method, logprob_reduction=reduction)
    tb = sample_trees(pol, ["p0", "p1"], cfg, generator=torch.Generator().manual_seed(0))
    r = torch.rand(tb.leaves.shape[0], generator=torch.Generator().manual_seed(1))
    backup_advantages(tb, {"r": r}, {"r": 1.0}, AdvantageConfig(flat_floor=0))
    return pol, cfg, tb


def _naive_grad(pol, tb, cfg, ocfg, per_step=None):
    """Every edge on its own: a forward at its parent, its own log-prob, loss / E (times its step's weight)."""
    pol.model.zero_grad()
    E = sum(a.numel() for a in tb.advantages)
    s = tb.window_start
    for j in range(tb.width):
        for e in range(tb.parents[j].numel()):
            p = int(tb.parents[j][e])
            x = tb.latents[j][p:p + 1]
            sig, sn = tb.sigmas[s + j].reshape(1), tb.sigmas[s + j + 1].reshape(1)
            tree = tb.tree_of(j)[p:p + 1]
            x0 = pol.denoise(x, sig, select_cond(tb.cond, tree), 1.0)
            mean, std = sde_mean_std(tb.prediction, x, x0, sig, sn, noise_level=cfg.noise_level, eta=cfg.eta,
                                     sigma_1_next=tb.sigmas[1])
            lp = gaussian_logprob(tb.latents[j + 1][e:e + 1], mean, std, tb.reduction)
            loss, _ = grpo_edge_loss(lp, tb.logp_old[j][e:e + 1], tb.advantages[j][e:e + 1], ocfg.clip_range)
            loss = loss.sum() / E
            wj = 1.0 if per_step is None else per_step[j]
            loss = wj * loss
            if ocfg.kl_beta:
                with torch.no_grad(), pol.lora_disabled():
                    x0r = pol.denoise(x, sig, select_cond(tb.cond, tree), 1.0)
                    mref, _ = sde_mean_std(tb.prediction, x, x0r, sig, sn, noise_level=cfg.noise_level,
                                           eta=cfg.eta, sigma_1_next=tb.sigmas[1])
                loss = loss + wj * ocfg.kl_beta * kl_to_reference(mean, mref, std, tb.reduction).sum() / E
            loss.backward()
    return pol.model.to_q.weight.grad.clone()


@pytest.mark.parametrize("pred", ["flow", "epsilon"])
@pytest.mark.parametrize("kl_beta", [0.0, 0.3])
def test_amortized_gradient_equals_naive_per_edge(pred, kl_beta):
    pol, cfg, tb = _setup(pred)
    ocfg = OptimConfig(microbatch=3, kl_beta=kl_beta, step_weight="edges")
    naive = _naive_grad(pol, tb, cfg, ocfg)
    pol.model.zero_grad()
    pol.rows.clear()
    edges = collect_edges(tb, skip_zero_adv=False, step_weight="edges")
    stats = backward_edges(pol, tb, edges, ocfg)
    assert edges.n_parents == 2 * (1 + 2 + 4) and edges.n_edges == 2 * (2 + 4 + 8)
    assert stats["forwards"] == edges.n_parents              # one forward per parent, not per edge
    assert torch.allclose(pol.model.to_q.weight.grad, naive, rtol=1e-4, atol=1e-7)
    assert naive.abs().sum() > 0
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_step_weights_by_hand():
    assert step_weights([2, 4, 8], "edges") == [1.0, 1.0, 1.0]
    w = step_weights([2, 4, 8], "steps")  # N = 14, w = 3: 14/6, 14/12, 14/24
    assert w == pytest.approx([7 / 3, 7 / 6, 7 / 12])
    assert [wi * n for wi, n in zip(w, [2, 4, 8])] == pytest.approx([14 / 3] * 3)  # equal total per step
    assert sum(wi * n for wi, n in zip(w, [2, 4, 8])) == pytest.approx(14)      # edges still average 1
    assert step_weights([8, 8, 8], "steps") == [1.0, 1.0, 1.0]                    # trajectory GRPO: unchanged
    with pytest.raises(ValueError, match="edges or steps"):
        step_weights([2, 4], "level")
    with pytest.raises(ValueError, match="step_weight"):
        OptimConfig(step_weight="level")


@pytest.mark.parametrize("kl_beta", [0.0, 0.3])
def test_step_weighted_gradient_equals_naive_per_edge(kl_beta):
    pol, cfg, tb = _setup("flow")
    ocfg = OptimConfig(microbatch=5, kl_beta=kl_beta, step_weight="steps")
    per_step = step_weights([2 * 2, 2 * 4, 2 * 8], "steps")  # two trees of k=2, w=3
    naive = _naive_grad(pol, tb, cfg, ocfg, per_step)
    plain = _naive_grad(pol, tb, cfg, ocfg)
    pol.model.zero_grad()
    pol.rows.clear()
    edges = collect_edges(tb, skip_zero_adv=False, step_weight="steps")
    assert edges.weight.tolist() == pytest.approx([per_step[0]] * 4 + [per_step[1]] * 8 + [per_step[2]] * 16)
    backward_edges(pol, tb, edges, ocfg)
    assert torch.allclose(pol.model.to_q.weight.grad, naive, rtol=1e-4, atol=1e-7)
    # the weighting turns the gradient, it does not just rescale it
    assert float(torch.nn.functional.cosine_similarity(naive.flatten(), plain.flatten(), dim=0)) < 0.999
    # trajectory GRPO has as many edges at every step: the weighting leaves it alone
    _, _, tj = _setup("flow", method="trajectory")
    assert bool((collect_edges(tj, skip_zero_adv=False, step_weight="steps").weight == 1).all())


def test_microbatch_size_does_not_change_gradient():
    pol, cfg, tb = _setup("flow", reduction="sum")
    edges = collect_edges(tb)
    grads = []
    for mb in (1, 4, 64):
        pol.model.zero_grad()
        backward_edges(pol, tb, edges, OptimConfig(microbatch=mb))
        grads.append(pol.model.to_q.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7) and torch.allclose(grads[0], grads[2], rtol=1e-4, atol=1e-7)


def test_trajectory_baseline_trains_every_window_step_with_trajectory_advantage():
    pol, cfg, tb = _setup("flow", method="trajectory")
    # each trajectory's edges all carry its leaf advantage
    for j in range(tb.width):
        assert torch.allclose(tb.advantages[j], tb.advantages[-1])
    edges = collect_edges(tb, skip_zero_adv=False)
    assert edges.n_parents == 2 * (1 + 8 + 8) and edges.n_edges == 2 * 24


def test_grpo_update_moves_parameters_and_flat_trees_are_skipped():
    pol, cfg, tb = _setup("flow")
    tb.trainable = torch.tensor([True, False])
    edges = collect_edges(tb)
    assert edges.n_parents == 7 and bool((edges.parent_tree == 0).all())
    w0 = pol.model.to_q.weight.detach().clone()
    opt = torch.optim.AdamW(pol.model.parameters(), lr=1e-2)
    stats = grpo_update(pol, tb, opt, OptimConfig())
    assert stats["edges"] == 14 and stats["grad_norm"] > 0
    assert not torch.allclose(pol.model.to_q.weight, w0)


def test_lr_factor_schedules():
    from treegrpo.update import lr_factor
    assert [lr_factor(i, 4, 0, "constant") for i in range(4)] == [1.0] * 4
    assert [lr_factor(i, 5, 1, "linear") for i in range(5)] == [0.5, 1.0, 0.75, 0.5, 0.25]
    assert lr_factor(1, 5, 1, "cosine") == 1.0 and abs(lr_factor(3, 5, 1, "cosine") - 0.5) < 1e-12
    assert lr_factor(9, 5, 0, "cosine") == 0.0  # past the end: clamped, never negative
    # a time budget further along than the iterations sets the progress; warm-up still comes first
    assert lr_factor(1, 100, 0, "linear", time_fraction=0.75) == 0.25
    assert lr_factor(50, 100, 0, "linear", time_fraction=0.1) == 0.5
    assert lr_factor(0, 100, 2, "cosine", time_fraction=0.9) == pytest.approx(1 / 3)
    assert lr_factor(3, 100, 0, "constant", time_fraction=0.99) == 1.0


def test_schedule_at_is_the_last_listed_at_or_before_the_iteration():
    from treegrpo.config import schedule_at
    sched = [[0, 1], [3, 0.5], [5, 0.25]]
    assert [schedule_at(sched, i, 1.0) for i in range(7)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    assert schedule_at([], 1000, 1.0) == 1.0


@pytest.mark.parametrize("schedule,msg", [
    ([[1, 1.0], [5, 0.5]], "must start at iteration 0"),
    ([[0, 1.0], [5, 0.5], [5, 0.2]], "iterations must increase"),
    ([[0, 1.0], [4]], "[iteration, factor] pairs"),
    ([[0, 0.0]], "a factor > 0"),
    ([[0, -0.5]], "a factor > 0"),
    ([[0, float("nan")]], "a factor > 0"),
    ([[0.5, 1.0]], "a whole iteration >= 0"),
    ([[0, True]], "pairs"),
    ("0:1,100:0.5", "must be a list"),
])
def test_lr_factor_schedule_bad_values_are_named(schedule, msg):
    from treegrpo.config import ConfigError, OptimConfig
    with pytest.raises(ConfigError, match=r"OptimConfig\.lr_factor_schedule") as e:
        OptimConfig(lr_factor_schedule=schedule)
    assert msg in str(e.value)
