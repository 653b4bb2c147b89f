"""How far a short ODE tail changes which leaf wins: within-tree rank agreement of leaf rewards, short tail vs the
schedule's full tail, on the demo model at its base weights (the Train node's presets, issue 49).

The same trees are sampled twice per tail setting: the same initial noise and the same SDE noise in the window
(both come from the seed and the iteration; the tail after the window is deterministic), so the leaves differ only
by the tail. Per tree: Spearman's rho between the two tails' leaf rewards, whether the best leaf is the same, and
the agreement of the z-scored rewards that become advantages (their correlation).

    python benchmarks/bench_tail_rank.py --trees 192 --out benchmarks/results/tail_rank.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from treegrpo.backends import load_policy
from treegrpo.cli import build_rewards, demo_config_dict
from treegrpo.config import TrainConfig
from treegrpo.trainer import Trainer

#: (label, tail_solver, tail_steps); tail_steps 0 = the schedule's remaining steps (the reference)
TAILS = [("full (euler)", "euler", 0), ("dpmpp_2m 1", "dpmpp_2m", 1), ("dpmpp_2m 2", "dpmpp_2m", 2),
         ("dpmpp_2m 3", "dpmpp_2m", 3), ("dpmpp_2m 6", "dpmpp_2m", 6)]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / den if den else float("nan")


def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    den = float(a.norm() * b.norm())
    return float((a * b).sum()) / den if den else float("nan")


def leaf_rewards(solver: str, steps: int, iterations: int, seed: int) -> torch.Tensor:
    """(trees, leaves) rewards of the demo's trees at iterations 0..iterations-1 with this tail."""
    d = demo_config_dict()
    d["tree"] = dict(d.get("tree", {}), tail_solver=solver, tail_steps=steps, tail_steps_schedule=[])
    d.update(seed=seed, eval_every=0)
    cfg = TrainConfig.from_dict(d)
    policy, _ = load_policy(cfg)
    trainer = Trainer(cfg, policy, build_rewards(cfg, policy.device), progress=False)
    out = []
    for it in range(iterations):
        trainer.iteration = it
        with torch.no_grad():
            batch = trainer.sample()
            raw = trainer.score(batch).raw
        total = sum(raw[n].float() * w for n, w in trainer.weights.items())
        out.append(total.reshape(-1, cfg.tree.leaves))
    return torch.cat(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=8, help="iterations of trees (the demo: 24 trees each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    ref = None
    rows = []
    for label, solver, steps in TAILS:
        r = leaf_rewards(solver, steps, a.iterations, a.seed)
        if ref is None:
            ref = r
            continue
        keep = [i for i in range(len(r)) if float(ref[i].std()) > 1e-6 and float(r[i].std()) > 1e-6]
        rho = [spearman(ref[i], r[i]) for i in keep]
        z = [corr(ref[i], r[i]) for i in keep]
        top = [int(ref[i].argmax()) == int(r[i].argmax()) for i in keep]
        rows.append({"tail": label, "trees": len(keep), "spearman_median": statistics.median(rho),
                     "spearman_mean": statistics.fmean(rho), "advantage_corr_mean": statistics.fmean(z),
                     "same_best_leaf": sum(top) / len(top)})
        print(f"{label:12s}  trees {len(keep):4d}  Spearman median {rows[-1]['spearman_median']:.3f} mean "
              f"{rows[-1]['spearman_mean']:.3f}  advantage corr {rows[-1]['advantage_corr_mean']:.3f}  same best leaf "
              f"{rows[-1]['same_best_leaf']:.2f}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump({"seed": a.seed, "iterations": a.iterations, "reference": TAILS[0][0], "rows": rows}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
