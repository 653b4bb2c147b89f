"""The amortized GRPO update over the edges of a batch of trees (docs/design.md §1).

All children of a parent share ``μ_θ(x_parent)``: one forward at the parent gives the log-probs of
all its child edges, so a pass costs one forward+backward per internal window node, microbatched
over parents with gradient accumulation. The loss is ``mean over trained edges`` of the clipped
surrogate plus ``β·KL`` to the LoRA-disabled reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .config import OptimConfig
from .loss import grpo_edge_loss, kl_to_reference
from .policy import Policy, select_cond
from .tree import TreeBatch


@dataclass
class EdgeSet:
    """The trained edges of a TreeBatch flattened over levels. P parents, E edges (sorted by parent)."""

    x_parent: torch.Tensor    # (P, C, H, W)
    sigma: torch.Tensor       # (P,)
    sigma_next: torch.Tensor  # (P,)
    parent_tree: torch.Tensor  # (P,) tree index (for the conditioning)
    edge_parent: torch.Tensor  # (E,) index into the P parents, non-decreasing
    x_child: torch.Tensor     # (E, C, H, W)
    logp_old: torch.Tensor    # (E,)
    adv: torch.Tensor         # (E,)
    weight: torch.Tensor      # (E,) loss weight of each edge (its window step's share; 1 = plain mean)

    @property
    def n_parents(self) -> int:
        return self.sigma.numel()

    @property
    def n_edges(self) -> int:
        return self.adv.numel()


def step_weights(edges_per_step: list[int], step_weight: str) -> list[float]:
    """Loss weight of one edge at each window step, from the edge counts ``n_j`` of the steps.

    ``edges``: 1 everywhere (the plain mean over edges). ``steps``: ``N / (w·n_j)`` with ``N = Σ n_j``, so
    every step carries the same total weight ``N/w`` and a full tree's weights still average 1. Equal counts
    (trajectory GRPO) give 1 either way."""
    if step_weight == "edges":
        return [1.0] * len(edges_per_step)
    if step_weight != "steps":
        raise ValueError(f"unknown step_weight {step_weight!r}; use edges or steps")
    total, w = sum(edges_per_step), len(edges_per_step)
    return [total / (w * n) if n else 0.0 for n in edges_per_step]


def collect_edges(batch: TreeBatch, skip_zero_adv: bool = True, step_weight: str = "steps") -> EdgeSet:
    """Flatten the window edges of trainable trees; drop parents none of whose edges can move the loss.

    ``step_weight`` sets each edge's loss weight from its window step (see ``step_weights``); the counts are
    those of the whole sampled batch, before flat trees and zero advantages are dropped."""
    if batch.advantages is None:
        raise ValueError("the tree batch has no advantages yet: run the advantage backup first")
    s = batch.window_start
    trainable = batch.trainable if batch.trainable is not None else torch.ones(batch.n_trees, dtype=torch.bool)
    xs, sig, sig_n, ptree, eparent, xc, lo, ad, wt = [], [], [], [], [], [], [], [], []
    per_step = step_weights([batch.latents[j + 1].shape[0] for j in range(batch.width)], step_weight)
    offset = 0
    for j in range(batch.width):
        par = batch.parents[j]
        keep_e = trainable.to(par.device)[batch.tree_of(j + 1)]
        if skip_zero_adv:
            keep_e &= batch.advantages[j] != 0
        n_j = batch.latents[j].shape[0]
        used = torch.zeros(n_j, dtype=torch.bool, device=par.device)
        used[par[keep_e]] = True
        remap = torch.cumsum(used.long(), 0) - 1 + offset
        xs.append(batch.latents[j][used])
        n_used = int(used.sum())
        sig.append(batch.sigmas[s + j].expand(n_used))
        sig_n.append(batch.sigmas[s + j + 1].expand(n_used))
        ptree.append(batch.tree_of(j)[used])
        eparent.append(remap[par[keep_e]])
        xc.append(batch.latents[j + 1][keep_e])
        lo.append(batch.logp_old[j][keep_e])
        ad.append(batch.advantages[j][keep_e])
        wt.append(torch.full((int(keep_e.sum()),), per_step[j], dtype=batch.advantages[j].dtype, device=par.device))
        offset += n_used
    cat = torch.cat
    return EdgeSet(cat(xs), cat(sig), cat(sig_n), cat(ptree), cat(eparent), cat(xc), cat(lo), cat(ad), cat(wt))


def policy_mean(policy: Policy, batch: TreeBatch, x, sigma, sigma_next, tree_idx, guidance):
    """μ_θ and std of the SDE step out of parents ``x`` (P, ...), with the kernel the batch was sampled with."""
    x0 = policy.denoise(x, sigma, select_cond(batch.cond, tree_idx), guidance)
    return batch.kernel.mean_std(x, x0, sigma, sigma_next)


def backward_edges(policy: Policy, batch: TreeBatch, edges: EdgeSet, cfg: OptimConfig, *, guidance: float = 1.0,
                   callback: Optional[Callable[[], None]] = None) -> dict:
    """Accumulate ∇(loss) into the parameters' ``.grad``: one forward per parent, microbatched.

    The loss is ``Σ_edges weight_e·[surrogate_e + β·KL_e] / E``, so microbatches add up to the full-batch
    gradient."""
    out = {"loss": 0.0, "kl": 0.0, "ratio_mean": 1.0, "clip_frac": 0.0, "forwards": 0, "ref_forwards": 0}
    if edges.n_edges == 0:
        return out
    bounds = torch.searchsorted(edges.edge_parent, torch.arange(edges.n_parents + 1, device=edges.edge_parent.device))
    tot_loss = tot_kl = tot_ratio = tot_clip = 0.0
    for p0 in range(0, edges.n_parents, cfg.microbatch):
        p1 = min(p0 + cfg.microbatch, edges.n_parents)
        e0, e1 = int(bounds[p0]), int(bounds[p1])
        sl = slice(p0, p1)
        args = (edges.x_parent[sl], edges.sigma[sl], edges.sigma_next[sl], edges.parent_tree[sl], guidance)
        mean, std = policy_mean(policy, batch, *args)
        out["forwards"] += p1 - p0
        local = edges.edge_parent[e0:e1] - p0
        logp = batch.kernel.logprob(edges.x_child[e0:e1], mean[local], std[local])
        per_edge, ratio = grpo_edge_loss(logp, edges.logp_old[e0:e1], edges.adv[e0:e1], cfg.clip_range)
        wt = edges.weight[e0:e1]
        loss = (wt * per_edge).sum() / edges.n_edges
        if cfg.kl_beta > 0:
            with torch.no_grad(), policy.lora_disabled():
                mean_ref, _ = policy_mean(policy, batch, *args)
            out["ref_forwards"] += p1 - p0
            kl = kl_to_reference(mean, mean_ref, std, batch.reduction)[local]
            loss = loss + cfg.kl_beta * (wt * kl).sum() / edges.n_edges
            tot_kl += float(kl.detach().sum())
        tot_loss += backward_finite(loss, "GRPO", f" on parents {p0}..{p1 - 1}")
        tot_ratio += float(ratio.detach().sum())
        tot_clip += float(((ratio.detach() - 1).abs() > cfg.clip_range).float().sum())
        # free this microbatch's graph before the next forward: nodes the backward did not reach (e.g. std's)
        # would otherwise keep their saved activations alive through it
        del mean, std, logp, per_edge, ratio, loss
        if callback:
            callback()
    out.update(loss=tot_loss, kl=tot_kl / edges.n_edges, ratio_mean=tot_ratio / edges.n_edges,
               clip_frac=tot_clip / edges.n_edges)
    return out


def lr_factor(iteration: int, total: int, warmup: int = 0, schedule: str = "constant",
              time_fraction: float = 0.0) -> float:
    """Learning-rate multiplier of ``iteration`` (0-based) of ``total``: linear warm-up over ``warmup``
    iterations ((i+1)/(warmup+1)), then ``constant``, ``linear`` to 0 or ``cosine`` to 0.

    The decay follows the run's progress: the iterations done after the warm-up, or ``time_fraction``
    (training seconds so far / the time budget) when that is further along, so a run stopped by its time
    budget ends its schedule there too."""
    if iteration < warmup:
        return (iteration + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    p = min(max((iteration - warmup) / max(1, total - warmup), time_fraction, 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - p
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown lr schedule {schedule!r}; use constant, linear or cosine")



def backward_finite(loss: torch.Tensor, what: str, where: str = "") -> float:
    """Backpropagate a microbatch's scalar ``loss`` and return its value; a non-finite loss raises first (naming the
    ``what`` objective and ``where``), before any gradient is accumulated."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(f"non-finite {what} loss ({value}){where}; lower the learning rate or check the "
                                 "rewards")
    loss.backward()
    return value


def optimizer_step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], max_grad_norm: float,
                   what: str) -> float:
    """Clip the accumulated gradient to ``max_grad_norm`` (0 = off) and step; returns its norm before clipping.
    A non-finite norm raises (naming the ``what`` update) before any parameter changes."""
    grads = [p.grad for p in params if p.grad is not None]
    gn = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])) if grads \
        else torch.zeros(())
    if not torch.isfinite(gn):
        raise FloatingPointError(f"non-finite gradient norm ({float(gn)}) in the {what} update; "
                                 "lower the learning rate or check the rewards")
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return float(gn)


def grpo_update(policy: Policy, batch: TreeBatch, optimizer: torch.optim.Optimizer, cfg: OptimConfig, *,
                guidance: float = 1.0,
                params: Optional[list[torch.nn.Parameter]] = None,
                callback: Optional[Callable[[], None]] = None, all_reduce: Optional[Callable] = None,
                edges: Optional[EdgeSet] = None) -> dict:
    """Run ``cfg.updates_per_batch`` optimiser steps on the batch's edges; returns statistics.

    ``all_reduce(params, n_edges) -> total edges`` (optional, data parallel) turns each process's gradient of its
    mean edge loss into the gradient of the mean over all processes' edges (see ``treegrpo.distributed``); no
    process steps when the total is 0."""
    edges = edges if edges is not None else collect_edges(batch, skip_zero_adv=cfg.kl_beta == 0,
                                                          step_weight=cfg.step_weight)
    params = params if params is not None else [p for p in policy.model.parameters() if p.requires_grad]
    stats = {"edges": edges.n_edges, "parents": edges.n_parents, "grad_norm": 0.0}
    for _ in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=False)
        stats.update(backward_edges(policy, batch, edges, cfg, guidance=guidance, callback=callback))
        # weighted by edge counts: the same gradient as one process over all trees, and the same step: none on any
        # process when no process has an edge (a step of zero gradients would still move Adam's moments)
        if (all_reduce(params, edges.n_edges) if all_reduce is not None else edges.n_edges) == 0:
            break
        stats["grad_norm"] = optimizer_step(optimizer, params, cfg.max_grad_norm, "GRPO")
    optimizer.zero_grad(set_to_none=True)
    return stats


def matching_update(policy: Policy, batch: TreeBatch, optimizer: torch.optim.Optimizer, cfg: OptimConfig, *,
                    guidance: float = 1.0, params: Optional[list[torch.nn.Parameter]] = None,
                    callback: Optional[Callable[[], None]] = None, all_reduce: Optional[Callable] = None,
                    generator: Optional[torch.Generator] = None) -> dict:
    """``cfg.updates_per_batch`` optimiser steps of the NFT or AWM loss (``cfg.loss``, :mod:`treegrpo.matching`) on
    the batch's leaves: every leaf re-noised at ``cfg.matching_timesteps`` noise levels drawn uniformly from the
    sampling schedule (σ_0 … σ_{T−1}), one forward per (leaf, level) row, microbatched; the loss is the mean over
    rows, plus ``kl_beta`` × the velocity matching error to the reference (LoRA off). NFT's old policy is the one
    that sampled the batch: its x̂0 are taken (without gradient) before the first step. Statistics as GRPO's,
    with ``edges`` = rows."""
    from .matching import awm_loss, matching_error, nft_loss, optimality, renoise

    if batch.leaf_advantages is None:
        raise ValueError("the leaves have no advantages yet: run the backup (Trainer.backup, the Advantage Backup node) first")
    params = params if params is not None else [p for p in policy.model.parameters() if p.requires_grad]
    leaves, adv = batch.leaves, batch.leaf_advantages.to(batch.leaves.device)
    leaf_tree = batch.leaf_tree
    k = cfg.matching_timesteps
    rows = torch.arange(leaves.shape[0], device=leaves.device).repeat_interleave(k)
    if cfg.kl_beta == 0:   # a zero advantage contributes no gradient to either loss at the sampling policy
        rows = rows[adv[rows] != 0]
    n = rows.numel()
    levels = batch.sigmas[:-1]
    idx = torch.randint(0, levels.numel(), (n,), generator=generator).to(leaves.device)
    sigma = levels[idx].float()
    noise = torch.randn((n, *leaves.shape[1:]), generator=generator).to(leaves.device)
    x0 = leaves[rows].float()
    x_t = renoise(x0, noise, sigma, batch.prediction)
    a = adv[rows].float()
    r = optimality(a, cfg.nft_adv_scale)
    stats = {"edges": n, "parents": n, "grad_norm": 0.0, "loss": 0.0, "kl": 0.0, "ratio_mean": 1.0,
             "clip_frac": 0.0, "forwards": 0, "ref_forwards": 0}
    old: list[torch.Tensor] = []
    for step in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=False)
        tot_loss = tot_kl = 0.0
        for b, r0 in enumerate(range(0, n, cfg.microbatch)):
            sl = slice(r0, min(r0 + cfg.microbatch, n))
            cond = select_cond(batch.cond, leaf_tree[rows[sl]])
            x0_theta = policy.denoise(x_t[sl], sigma[sl], cond, guidance)
            stats["forwards"] += x0_theta.shape[0]
            if step == 0:
                old.append(x0_theta.detach())
            if cfg.loss == "nft":
                per = nft_loss(x0_theta, old[b], x0[sl], sigma[sl], r[sl], cfg.nft_beta)
            else:
                per = awm_loss(x0_theta, x0[sl], sigma[sl], a[sl])
            loss = per.sum() / n
            if cfg.kl_beta > 0:
                with torch.no_grad(), policy.lora_disabled():
                    x0_ref = policy.denoise(x_t[sl], sigma[sl], cond, guidance)
                stats["ref_forwards"] += x0_ref.shape[0]
                kl = matching_error(x0_theta, x0_ref, sigma[sl])
                loss = loss + cfg.kl_beta * kl.sum() / n
                tot_kl += float(kl.detach().sum())
            tot_loss += backward_finite(loss, cfg.loss)
            del x0_theta, per, loss
            if callback:
                callback()
        if (all_reduce(params, n) if all_reduce is not None else n) == 0:     # as grpo_update
            break
        stats.update(grad_norm=optimizer_step(optimizer, params, cfg.max_grad_norm, cfg.loss), loss=tot_loss,
                     kl=tot_kl / max(n, 1))
    optimizer.zero_grad(set_to_none=True)
    return stats
