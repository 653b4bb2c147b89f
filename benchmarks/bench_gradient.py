"""What one iteration teaches: the noise of each method's policy gradient, measured at the same policy (issue 35).

The time ratio of bench_budget.py has two factors: the cost of an iteration and what the iteration teaches. This
measures the second directly. For each method, at the base model (the LoRA at its initialisation, so every method
starts from the same policy), ``--draws`` independent iterations are sampled (iterations 0, 1, ... of the method's
own seed schedule: new prompts, noises and SDE noise each time), scored, backed up, and the gradient of the GRPO loss
with respect to the LoRA's parameters is taken *without* an optimiser step. Over the draws g_1..g_R:

  SNR      ||E g||² / E||g - E g||², both estimated without bias (||ḡ||² less the mean's own noise): how much of
           one iteration's gradient is the direction all iterations agree on (scale-free, so it compares methods
           whose loss is normalised differently; Adam's step follows the direction, not the scale)
  cos      the mean cosine between one draw and the mean of the others (leave-one-out, no self-similarity)
  time     seconds per iteration on this machine (sampling + the backward pass, one thread), and the SNR per second

plus the spread of the edge advantages the update weighs. Methods are bench_methods.py's names (the same configs,
192 leaves per iteration), and tree shapes at the same leaves per iteration can be given as NAME=JSON overrides.

    python benchmarks/bench_gradient.py [--draws 24] [--methods tree,traj_window,traj_window_mirrored,tree_k8_w1]
    python benchmarks/bench_gradient.py --per-step --methods tree,traj_window     # each window step's share
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import bench_methods as bm  # noqa: E402
from treegrpo.run import build_rewards  # noqa: E402

DEFAULT_METHODS = "tree,traj_window,traj_window_mirrored,tree_k8_w1"
#: where and how to branch, at the same 192 leaves per iteration (8 per prompt unless stated): the window's first step
#: (the default starts at step 1 of 10), and the children per node at each window step (a binary tree has 7 mirrored
#: pairs, [4, 2] 6, [8] 4)
SHAPES = {"tree_start0": {"tree": {"window_start": 0}}, "tree_start3": {"tree": {"window_start": 3}},
          "tree_42_start0": {"tree": {"window_start": 0, "window_width": 2, "branch_schedule": [4, 2]}},
          "tree_k8_w1_start0": {"tree": {"window_start": 0, "window_width": 1, "branch": 8}},
          # the lowest cost per clean probe of the small shapes (10 probes and 5 parents per 16 leaves): 16 leaves
          # per prompt, so 12 prompts keep the 192 leaves per iteration
          "tree_44_start0": {"tree": {"window_start": 0, "window_width": 2, "branch_schedule": [4, 4]},
                             "prompts_per_iter": 12}}


#: a method name's optional suffixes, in this order: ``_p<N>`` (N prompts per iteration) and ``_lr<X>`` (AdamW lr X)
VARIANT = re.compile(r"(?P<base>.+?)(?:_p(?P<prompts>[1-9][0-9]*))?(?:_lr(?P<lr>[0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?))?")


def split_variant(name: str) -> tuple[str, dict]:
    """``"tree_p12_lr3e-3"`` -> ``("tree", {"prompts_per_iter": 12, "optim": {"lr": 0.003}})``: a name may end in
    ``_p<N>`` (that method with N prompts per iteration, the batch) and then ``_lr<X>`` (learning rate X); any
    other name -> ``(name, {})``. The base name is not checked here (:func:`method_overrides` does)."""
    m = VARIANT.fullmatch(name)
    if m is None:
        return name, {}
    change: dict = {}
    if m.group("prompts"):
        change["prompts_per_iter"] = int(m.group("prompts"))
    if m.group("lr"):
        lr = float(m.group("lr"))
        if not lr > 0:
            return name, {}
        change["optim"] = {"lr": lr}
    return m.group("base"), change


def method_overrides(name: str) -> dict:
    """bench_methods.py's configuration of ``name`` (a method, an ablation, or a tree shape of SHAPES), with
    ``prompts_per_iter`` and the lr set where the name ends in ``_p<N>`` / ``_lr<X>`` (:func:`split_variant`:
    ``tree_p12`` trains 12 prompts' trees per iteration instead of the demo's 24, ``tree_p12_lr3e-3`` does so at
    lr 3e-3)."""
    base, change = split_variant(name)
    return bm.merge(_plain_overrides(base), change) if change else _plain_overrides(base)


def _plain_overrides(name: str) -> dict:
    if name in bm.METHODS:
        return bm.METHODS[name]
    if name in bm.ABLATIONS:
        return bm.merge(bm.METHODS["tree"], bm.ABLATIONS[name])
    if name in SHAPES:
        return bm.merge(bm.METHODS["tree"], SHAPES[name])
    raise SystemExit(f"unknown method {name!r}: one of {sorted({*bm.METHODS, *bm.ABLATIONS, *SHAPES})} (each may end "
                     "in _p<N>: N prompts per iteration, then _lr<X>: learning rate X) or NAME=JSON")


def edge_levels(batch, skip_zero_adv: bool):
    """(E,) window step (0..w-1) of each edge of ``collect_edges(batch, skip_zero_adv)``, in its order."""
    import torch

    trainable = batch.trainable if batch.trainable is not None else torch.ones(batch.n_trees, dtype=torch.bool)
    out = []
    for j in range(batch.width):
        keep = trainable.to(batch.parents[j].device)[batch.tree_of(j + 1)]
        if skip_zero_adv:
            keep &= batch.advantages[j] != 0
        out.append(torch.full((int(keep.sum()),), j, dtype=torch.long))
    return torch.cat(out)


def gradient_draws(overrides: dict, draws: int, seed: int = 0, per_step: bool = False) -> dict:
    """The flattened LoRA gradient of ``draws`` independent iterations at the base model, with timings and the
    edge advantages' spread. ``per_step``: also each window step's share of it, (draws, w, P) under "steps"
    (the gradient is linear in the edge weights, so the shares add up to the gradient)."""
    import torch

    from treegrpo import cli
    from treegrpo.backends import load_policy
    from treegrpo.config import TrainConfig
    from treegrpo.trainer import Trainer
    from treegrpo.update import backward_edges, collect_edges

    d = bm.merge(cli.demo_config_dict(), bm.merge(bm.BASE, overrides))
    d.update(seed=seed, iterations=draws, eval_every=0, checkpoint_every=0, output_dir=tempfile.mkdtemp(),
             run_name="bench_gradient")
    cfg = TrainConfig.from_dict(d)
    if cfg.optim.loss != "grpo":
        raise SystemExit("bench_gradient measures the GRPO gradient; the flow-matching peers have another objective")
    policy, _ = load_policy(cfg)
    tr = Trainer(cfg, policy, build_rewards(cfg, policy.device), progress=False)
    grads, secs, adv_sd, edges_n, shares = [], [], [], [], []
    for it in range(draws):
        tr.iteration = it
        t0 = time.perf_counter()
        batch = tr.sample()
        raw = tr.score(batch).raw
        tr.backup(batch, raw)
        edges = collect_edges(batch, skip_zero_adv=cfg.optim.kl_beta == 0, step_weight=cfg.optim.step_weight)
        for p in tr.params:
            p.grad = None
        policy.model.train()
        backward_edges(policy, batch, edges, cfg.optim, guidance=cfg.guidance_scale)
        policy.model.eval()
        secs.append(time.perf_counter() - t0)
        grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().double()
                                for p in tr.params]))
        adv_sd.append(float(edges.adv.double().std()) if edges.n_edges > 1 else 0.0)
        edges_n.append(edges.n_edges)
        if per_step:
            levels = edge_levels(batch, cfg.optim.kl_beta == 0)
            weight, parts = edges.weight.clone(), []
            for j in range(batch.width):
                for p in tr.params:
                    p.grad = None
                edges.weight = torch.where(levels.to(weight.device) == j, weight, torch.zeros_like(weight))
                policy.model.train()
                backward_edges(policy, batch, edges, cfg.optim, guidance=cfg.guidance_scale)
                policy.model.eval()
                parts.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().double()
                                        for p in tr.params]))
            edges.weight = weight
            shares.append(torch.stack(parts))
    return {"grads": torch.stack(grads), "seconds": secs, "adv_sd": adv_sd, "edges": edges_n,
            "per_step": torch.stack(shares) if per_step else None}


def step_mix(shares) -> dict:
    """What each window step's share of the gradient carries, and the step weights that maximise the SNR.

    ``shares`` (R, w, P): draws × window steps. With μ_j the mean share of step j and C the (w, w) matrix of
    E[(g_j − μ_j)·(g_l − μ_l)], a reweighted gradient Σ_j a_j g_j has SNR (aᵀ M a) / (aᵀ C a), M_jl = μ_j·μ_l
    (estimated without bias: the cross-products of the means less C / R). The best a is the top generalized
    eigenvector of (M, C); it is returned scaled so that its weights sum to w (a = 1 everywhere is "steps")."""
    import torch

    r, w, _ = shares.shape
    mu = shares.mean(0)                                            # (w, P)
    dev = shares - mu
    cov = torch.einsum("rjp,rlp->jl", dev, dev) / (r - 1)          # (w, w)
    m = mu @ mu.T - cov / r
    lc = torch.linalg.cholesky(cov)
    li = torch.linalg.inv(lc)
    vals, vecs = torch.linalg.eigh(li @ m @ li.T)
    a = li.T @ vecs[:, -1]
    a = a * (w / a.sum())
    one = torch.ones(w, dtype=shares.dtype)
    snr = lambda v: float(v @ m @ v / (v @ cov @ v))               # noqa: E731
    return {"snr_each_step": [float(m[j, j] / cov[j, j]) for j in range(w)], "snr_steps": snr(one),
            "best_weights": [float(x) for x in a], "snr_best": float(vals[-1]),
            "noise_corr": (cov / torch.sqrt(torch.outer(cov.diag(), cov.diag()))).tolist()}


def split_methods(spec: str) -> list[str]:
    """``--methods`` items: commas separate them except inside a NAME=JSON override's braces."""
    items, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch in "{[") - (ch in "}]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [m for m in items + [cur] if m]


def noise_stats(g) -> dict:
    """SNR ||E g||² / E||g − E g||² and the leave-one-out cosine of ``g`` (R, P) draws; the unbiased estimate of
    ||E g||² subtracts the mean's own noise (tr Σ̂ / R)."""
    import torch

    r = g.shape[0]
    mean = g.mean(0)
    var = float(((g - mean) ** 2).sum(1).mean()) * r / (r - 1)      # E||g − E g||², unbiased
    signal = max(0.0, float(mean.pow(2).sum()) - var / r)           # ||E g||², unbiased
    loo = (g.sum(0, keepdim=True) - g) / (r - 1)
    cos = torch.nn.functional.cosine_similarity(g, loo, dim=1)
    return {"snr": signal / var if var > 0 else math.nan, "signal": signal, "noise": var,
            "cos_loo": float(cos.mean()), "cos_loo_sd": float(cos.std())}


def main(argv: list[str] | None = None) -> dict:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=24, help="independent iterations per method")
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-step", action="store_true",
                    help="also each window step's share of the gradient and the step weights that maximise its SNR")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "gradient.json"))
    ns = ap.parse_args(argv)
    if ns.draws < 3:
        raise SystemExit(f"--draws {ns.draws}: at least 3 (a variance and a leave-one-out mean need them)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one core per draw, as bench_methods' runs; restored: tests call main in-process
    try:
        rows = {}
        for item in split_methods(ns.methods):
            name, _, js = item.partition("=")
            ov = json.loads(js) if js else method_overrides(name)
            d = gradient_draws(ov, ns.draws, ns.seed, per_step=ns.per_step)
            st = noise_stats(d["grads"])
            s_it = sum(d["seconds"]) / len(d["seconds"])
            rows[name] = {**st, "s_per_iter": s_it, "snr_per_s": st["snr"] / s_it,
                          "adv_sd": sum(d["adv_sd"]) / len(d["adv_sd"]), "edges": sum(d["edges"]) / len(d["edges"]),
                          "overrides": ov}
            print(f"{name:<22} SNR {st['snr']:.3f}  cos(loo) {st['cos_loo']:+.3f} ± {st['cos_loo_sd']:.3f}  "
                  f"{s_it:.2f} s/it  SNR/s {rows[name]['snr_per_s']:.3f}  edges {rows[name]['edges']:.0f}  "
                  f"adv sd {rows[name]['adv_sd']:.2f}", flush=True)
            if ns.per_step:
                rows[name]["steps"] = step_mix(d["per_step"])
                print(f"{'':<22} per step SNR {[round(x, 3) for x in rows[name]['steps']['snr_each_step']]}, "
                      f"best weights {[round(x, 2) for x in rows[name]['steps']['best_weights']]} -> SNR "
                      f"{rows[name]['steps']['snr_best']:.3f}", flush=True)
    finally:
        torch.set_num_threads(threads)
    base = rows.get("traj_window")
    if base:
        for name, r in rows.items():
            r["snr_vs_window"] = r["snr"] / base["snr"] if base["snr"] > 0 else math.nan
            r["snr_per_s_vs_window"] = r["snr_per_s"] / base["snr_per_s"] if base["snr_per_s"] > 0 else math.nan
    from treegrpo.io import atomic_write_json

    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    out = {"draws": ns.draws, "seed": ns.seed, "methods": rows}
    atomic_write_json(ns.out, out)
    return out


if __name__ == "__main__":
    main()
