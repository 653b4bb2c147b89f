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
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import bench_methods as bm  # noqa: E402

DEFAULT_METHODS = "tree,traj_window,traj_window_mirrored,tree_k8_w1"
#: where to branch, at the same 8 leaves per prompt: the window's first step (the default starts at step 1 of 10)
SHAPES = {"tree_start0": {"tree": {"window_start": 0}}, "tree_start3": {"tree": {"window_start": 3}}}


def method_overrides(name: str) -> dict:
    """bench_methods.py's configuration of ``name`` (a method, an ablation, or a tree shape of SHAPES)."""
    if name in bm.METHODS:
        return bm.METHODS[name]
    if name in bm.ABLATIONS:
        return bm.merge(bm.METHODS["tree"], bm.ABLATIONS[name])
    if name in SHAPES:
        return bm.merge(bm.METHODS["tree"], SHAPES[name])
    raise SystemExit(f"unknown method {name!r}: one of {sorted({*bm.METHODS, *bm.ABLATIONS, *SHAPES})} or NAME=JSON")


def gradient_draws(overrides: dict, draws: int, seed: int = 0) -> dict:
    """The flattened LoRA gradient of ``draws`` independent iterations at the base model, with timings and the
    edge advantages' spread."""
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
    tr = Trainer(cfg, policy, cli.build_rewards(cfg, policy.device), progress=False)
    grads, secs, adv_sd, edges_n = [], [], [], []
    for it in range(draws):
        tr.iteration = it
        t0 = time.perf_counter()
        batch = tr.sample()
        raw = tr.score(batch)
        tr.assign(batch, raw)
        edges = collect_edges(batch, skip_zero_adv=cfg.optim.kl_beta == 0, step_weight=cfg.optim.step_weight)
        for p in tr.params:
            p.grad = None
        policy.model.train()
        backward_edges(policy, batch, edges, cfg.optim, guidance=cfg.cfg)
        policy.model.eval()
        secs.append(time.perf_counter() - t0)
        grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().double()
                                for p in tr.params]))
        adv_sd.append(float(edges.adv.double().std()) if edges.n_edges > 1 else 0.0)
        edges_n.append(edges.n_edges)
    return {"grads": torch.stack(grads), "seconds": secs, "adv_sd": adv_sd, "edges": edges_n}


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
    ap.add_argument("--out", default=os.path.join(HERE, "results", "gradient.json"))
    ns = ap.parse_args(argv)
    if ns.draws < 3:
        raise SystemExit(f"--draws {ns.draws}: at least 3 (a variance and a leave-one-out mean need them)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one core per draw, as bench_methods' runs; restored: tests call main in-process
    try:
        rows = {}
        for item in [m for m in ns.methods.split(",") if m]:
            name, _, js = item.partition("=")
            ov = json.loads(js) if js else method_overrides(name)
            d = gradient_draws(ov, ns.draws, ns.seed)
            st = noise_stats(d["grads"])
            s_it = sum(d["seconds"]) / len(d["seconds"])
            rows[name] = {**st, "s_per_iter": s_it, "snr_per_s": st["snr"] / s_it,
                          "adv_sd": sum(d["adv_sd"]) / len(d["adv_sd"]), "edges": sum(d["edges"]) / len(d["edges"]),
                          "overrides": ov}
            print(f"{name:<22} SNR {st['snr']:.3f}  cos(loo) {st['cos_loo']:+.3f} ± {st['cos_loo_sd']:.3f}  "
                  f"{s_it:.2f} s/it  SNR/s {rows[name]['snr_per_s']:.3f}  edges {rows[name]['edges']:.0f}  "
                  f"adv sd {rows[name]['adv_sd']:.2f}", flush=True)
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
