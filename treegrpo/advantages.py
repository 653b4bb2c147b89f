"""Rewards → leaf advantages → backed-up edge advantages (docs/design.md §1). Pure functions, but for
:func:`backup_advantages`, which writes its results into the tree batch it is given.

Groups are given as integer ids per element (``group[i]`` ∈ [0, n_groups)); statistics are
population statistics (``std`` with correction 0) within each group.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch


class RewardError(ValueError):
    """A reward model returned something unusable (non-finite values, wrong shape)."""


def segment_mean(x: torch.Tensor, group: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) means of ``x`` (E,) over ``group`` ids."""
    cnt = torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, group, torch.ones_like(x))
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, group, x) / cnt.clamp_min(1)


def segment_std(x: torch.Tensor, group: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) population standard deviations of ``x`` over ``group`` ids."""
    m = segment_mean(x, group, n)
    return segment_mean((x - m[group]) ** 2, group, n).sqrt()


def zscore(x: torch.Tensor, group: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    """``(x − mean_g)/(std_g + eps)`` within each group: ``x`` (E,), ``group`` (E,) ids in [0, n) → (E,); a
    constant group gives zeros."""
    return (x - segment_mean(x, group, n)[group]) / (segment_std(x, group, n)[group] + eps)


def segment_softmax(logits: torch.Tensor, group: torch.Tensor, n: int) -> torch.Tensor:
    """Softmax of ``logits`` (E,) within each group (numerically stable)."""
    mx = torch.full((n,), float("-inf"), dtype=logits.dtype, device=logits.device)
    mx = mx.scatter_reduce(0, group, logits, reduce="amax", include_self=True)
    e = torch.exp(logits - mx[group])
    return e / torch.zeros(n, dtype=e.dtype, device=e.device).index_add_(0, group, e)[group]


def check_rewards(raw: dict[str, torch.Tensor], n: int, where: str = "", frames_hint: bool = False) -> None:
    """Every reward must be a finite (n,) tensor; the error names the reward, the bad leaves and ``where``
    (e.g. " at iteration 3"). The one sanity check of reward values: trainer, nodes and backup all call it.
    ``frames_hint`` (the step graph's backup, fed by Reward Scorers): a whole multiple of n scores is named as the
    frames of videos, and the Reward Scorer's input that groups them."""
    for name, r in raw.items():
        if r.shape != (n,):
            frames = r.numel() // n if frames_hint and r.ndim == 1 and n and r.numel() > n and r.numel() % n == 0 \
                else None
            hint = (f"; {r.numel()} scores for {n} leaves look like {frames}-frame videos scored frame by frame: set "
                    f"the Reward Scorer's frames_per_video to {frames}" if frames else "")
            raise RewardError(f"reward {name!r} returned shape {tuple(r.shape)}, expected ({n},){where}: one value "
                              f"per image (score the leaf images of this tree){hint}")
        bad = (~torch.isfinite(r)).nonzero().flatten()
        if bad.numel():
            raise RewardError(f"reward {name!r} returned non-finite values {r[bad][:5].tolist()} for leaves "
                              f"{bad[:10].tolist()}{where}; check the reward model and the decoded images")


def aggregate_rewards(raw: dict[str, torch.Tensor], weights: dict[str, float], group: torch.Tensor,
                      n_groups: int, eps: float) -> torch.Tensor:
    """``r_i = Σ_j λ_j·(R_j,i − mean_j)/(std_j + eps)``, statistics within ``group`` (tree or prompt): ``raw``
    reward name → (n,) per leaf, ``group`` (n,) ids in [0, n_groups) → (n,) float32."""
    n = group.numel()
    check_rewards(raw, n)
    r = torch.zeros(n, dtype=torch.float32, device=group.device)
    for name, vals in raw.items():
        r += float(weights[name]) * zscore(vals.float().to(group.device), group, n_groups, eps)
    return r


def weighted_raw(raw: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """``Σ_j λ_j·R_j`` per leaf, unstandardised (what the user reads as "the reward"): (n,) float32 from ``raw``
    reward name → (n,)."""
    return sum(float(weights[k]) * v.float() for k, v in raw.items())


def leaf_advantages(r: torch.Tensor, tree: torch.Tensor, n_trees: int, eps: float) -> torch.Tensor:
    """``A_leaf,i = (r_i − mean r)/(std r + eps)`` within each tree; (n_leaves,)."""
    return zscore(r, tree, n_trees, eps)


def backup(parents: list[torch.Tensor], logp_old: list[torch.Tensor], leaf_adv: torch.Tensor,
           mode: str = "softmax", temperature: float = 1.0) -> list[torch.Tensor]:
    """Back leaf advantages up the window, deepest level first.

    ``parents[j]`` (n_{j+1},) and ``logp_old[j]`` (n_{j+1},) describe the edges from window level j to
    level j+1 (j = 0..w−1); ``leaf_adv`` is (n_w,). Returns the edge advantages per level: ``out[j]`` is
    (n_{j+1},), with ``out[w−1] = leaf_adv`` and for an internal node u at level j+1
    ``A_edge(into u) = A_node(u) = Σ_{children e} π(e)·A_edge(e)``,
    ``π = softmax(logp_old/τ)`` over u's children (``softmax``) or ``1/|children|`` (``mean``)."""
    if mode not in ("softmax", "mean"):
        raise ValueError(f"backup must be 'softmax' or 'mean', got {mode!r}")
    w = len(parents)
    if w == 0:   # no window (independent ODE samples): no edges
        return []
    out: list[torch.Tensor] = [None] * w  # type: ignore[list-item]
    out[w - 1] = leaf_adv
    for j in range(w - 1, 0, -1):
        n_u = parents[j - 1].numel()  # nodes at level j
        if mode == "softmax":
            pi = segment_softmax(logp_old[j].float() / temperature, parents[j], n_u)
        else:
            cnt = torch.zeros(n_u, device=leaf_adv.device).index_add_(0, parents[j], torch.ones_like(out[j]))
            pi = 1.0 / cnt[parents[j]]
        out[j - 1] = torch.zeros(n_u, dtype=out[j].dtype, device=out[j].device).index_add_(0, parents[j], pi * out[j])
    return out


def sibling_baseline(parents: list[torch.Tensor], edge_adv: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-state baseline: each edge's advantage minus the mean over its siblings (the edges out of the
    same parent), wherever a parent has ≥ 2 children; ``edge_adv`` is :func:`backup`'s output per level.

    Siblings leave the same state, so the baseline keeps the expected gradient and removes the part of
    the advantage they share (under the mean backup it is exactly the parent's value). An only child
    (a trajectory's chain) keeps its advantage, and a trajectory group's first step (z-scored, mean 0) is
    unchanged, so trajectory GRPO is the same with or without it."""
    out = []
    for par, adv in zip(parents, edge_adv):
        n_p = int(par.max()) + 1 if par.numel() else 0
        only_child = torch.bincount(par, minlength=n_p)[par] < 2
        out.append(torch.where(only_child, adv, adv - segment_mean(adv, par, n_p)[par]))
    return out


def batch_rms(x: torch.Tensor, pool: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """Root mean square of ``x`` (E,) over the batch; ``pool`` sums a (2,) float64 tensor over data-parallel
    ranks, so that every rank divides by the whole batch's RMS."""
    s = torch.stack([(x.double() ** 2).sum(), torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)])
    if pool is not None:
        s = pool(s).to(x.device)
    return (s[0] / s[1].clamp_min(1)).sqrt().to(x.dtype)


def batch_scaled_advantages(raw: dict[str, torch.Tensor], weights: dict[str, float], group: torch.Tensor,
                            n_groups: int, tree: torch.Tensor, n_trees: int, eps: float,
                            pool: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """Leaf advantages (n_leaves,) for ``std_scope='batch'``: each reward centred in its ``group`` and divided
    by its RMS over the batch, their weighted sum centred in its tree and divided by its batch RMS. A tree
    keeps its mean-zero shape, but one whose leaves barely differ gets small advantages instead of being
    stretched to unit spread, so near-flat trees no longer weigh like informative ones."""
    r = torch.zeros(tree.numel(), dtype=torch.float32, device=tree.device)
    for name, vals in raw.items():
        c = vals.float() - segment_mean(vals.float(), group, n_groups)[group]
        r += float(weights[name]) * c / (batch_rms(c, pool) + eps)
    r = r - segment_mean(r, tree, n_trees)[tree]
    return r / (batch_rms(r, pool) + eps)


def backup_advantages(batch, raw: dict[str, torch.Tensor], weights: dict[str, float], cfg,
                      pool: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                      exclude_trees: Optional[torch.Tensor] = None) -> dict:
    """Fill ``batch.advantages`` / ``batch.trainable`` / ``batch.rewards`` from raw leaf rewards.

    ``batch`` is a :class:`treegrpo.tree.TreeBatch`, ``cfg`` an :class:`AdvantageConfig`. Trees whose
    weighted raw reward has a spread (std) below ``cfg.flat_floor``, and those ``exclude_trees`` (n_trees,) bool
    marks, get zero advantages and are marked untrainable (no edge of theirs is in the update, KL included).
    ``pool`` (data parallel) sums batch statistics over ranks. Returns summary statistics."""
    leaf_tree = batch.leaf_tree
    n_leaves = leaf_tree.numel()
    raw = {k: v.detach().float().reshape(-1).to(leaf_tree.device) for k, v in raw.items()}
    check_rewards(raw, n_leaves, frames_hint=True)     # first seen here: the step graph's Reward Scorers' scores
    if cfg.reward_stats == "prompt":
        group, n_groups = batch.prompt_ids.to(leaf_tree.device)[leaf_tree], int(batch.prompt_ids.max()) + 1
    else:
        group, n_groups = leaf_tree, batch.n_trees
    if cfg.std_scope == "batch":
        a_leaf = batch_scaled_advantages(raw, weights, group, n_groups, leaf_tree, batch.n_trees, cfg.eps, pool)
    else:
        r = aggregate_rewards(raw, weights, group, n_groups, cfg.eps)
        a_leaf = leaf_advantages(r, leaf_tree, batch.n_trees, cfg.eps)
    total = weighted_raw(raw, weights)
    spread = segment_std(total, leaf_tree, batch.n_trees)
    trainable = spread >= cfg.flat_floor if cfg.flat_floor > 0 else torch.ones_like(spread, dtype=torch.bool)
    if exclude_trees is not None:
        trainable = trainable & ~exclude_trees.to(trainable.device, torch.bool).reshape(-1)
    a_leaf = torch.where(trainable[leaf_tree], a_leaf, torch.zeros_like(a_leaf))
    edge_adv = backup(batch.parents, batch.logp_old, a_leaf, cfg.backup, cfg.temperature)
    if cfg.edge_baseline == "siblings":
        edge_adv = sibling_baseline(batch.parents, edge_adv)
    from .loss import clip_advantages
    batch.advantages = [clip_advantages(a, cfg.adv_clip) for a in edge_adv]
    batch.leaf_advantages = clip_advantages(a_leaf, cfg.adv_clip)
    batch.trainable = trainable
    batch.rewards = raw
    scored = torch.ones(batch.n_trees, dtype=torch.bool, device=leaf_tree.device)
    if exclude_trees is not None:     # an artist's skip / no preference: its leaves hold no score
        scored = ~exclude_trees.to(leaf_tree.device, torch.bool).reshape(-1)
    shown = total[scored[leaf_tree]] if bool(scored.any()) else total
    return {"reward": float(shown.mean()), "reward_std": float(shown.std(correction=0)),
            "scored_trees": int(scored.sum()), "flat_trees": int((~trainable).sum()),
            **{f"reward/{k}": float(v.mean()) for k, v in raw.items()}}
