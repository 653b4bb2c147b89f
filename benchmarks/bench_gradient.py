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

plus the spread of the edge advantages the update weighs. Methods are harness.py's registered names (the same configs,
192 leaves per iteration; the tree shapes among them), or NAME=JSON changes over the demo protocol.

    python benchmarks/bench_gradient.py [--draws 24] [--methods tree,traj_window,traj_window_mirrored,tree_k8_w1]
    python benchmarks/bench_gradient.py --per-step --methods tree,traj_window     # each window step's share
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

import harness as h
from treegrpo.run import build_rewards

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_METHODS = "tree,traj_window,traj_window_mirrored,tree_k8_w1"


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

    from treegrpo.backends import load_policy
    from treegrpo.config import TrainConfig
    from treegrpo.trainer import Trainer
    from treegrpo.update import backward_edges, collect_edges

    d = h.DEMO.config_dict(overrides)
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
        for item in h.split_items(ns.methods):
            name, ov = h.DEMO.resolve(item)
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
