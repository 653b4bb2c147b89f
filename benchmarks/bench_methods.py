"""TreeGRPO against trajectory GRPO and the flow-matching peers under time budgets (the peers' protocol, the lr
sweeps, and the step counts of bench_steps.py; budgets in work are bench_budget.py's).

Every method trains, from the same base model, prompts, reward, seed schedule and optimiser, for the same training
time (``--budget`` s), evaluated every budget/``--evals`` s (not counted as training time). The methods are
harness.py's registry: tree (TreeGRPO, k = 2, w = 3, mirrored siblings), traj_window (trajectory GRPO on the same
3-step window, the baseline), traj_window_mirrored, traj_all (SDE on every step), nft and awm (DiffusionNFT- and
AWM-style flow matching on independent ODE samples), tree_nft and tree_awm (those objectives on a tree's leaves).
Each (method, seed) run is a child process on one thread; the runs are interleaved seed by seed so machine noise
hits all methods alike, ``--jobs`` at a time. Ratios are read off each run's curve averaged over ``--smooth``
consecutive evaluations (the raw reading is reported beside it as ``main_raw``).

    python benchmarks/bench_methods.py [--seeds 4] [--budget 60] [--out benchmarks/results/peers]
    python benchmarks/bench_methods.py --lr-sweep 3e-3,6e-3,1.2e-2 --lr-sweep-method nft --seeds 2   # a peer's lr
    python benchmarks/bench_methods.py --steps 40 --only tree --only traj_window   # T = 40 (bench_steps.py)
    python benchmarks/bench_methods.py --only tree --only 'mine={"tree": {"branch": 3}}'   # a new configuration
    python benchmarks/bench_methods.py --first-seed 4 --out more      # seeds 4-7, then pool both runs:
    python benchmarks/bench_methods.py --merge first/methods.json more/methods.json --out pooled
    python benchmarks/bench_methods.py --base-config sd35.json --budget 120 --seeds 2   # a diffusers model on a GPU

Writes methods.json (or explore.json / lr_sweep*.json), reward_vs_time.png, reward_vs_nfe.png and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))


def run_all(proto: h.Protocol, jobs: list[tuple[str, dict, int]], budget: float, out_dir: str, n_par: int,
            t0: float, threads: int = h.THREADS, evals: int = h.EVALS) -> list[dict]:
    """Run (name, overrides, seed) jobs, ``n_par`` at a time, in the given (interleaved) order; records in order."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        name, ov, seed = job
        rec = h.run_one(proto, name, ov, seed, budget, os.path.join(out_dir, "runs", f"{name}_{seed}"),
                        threads=threads, evals=evals)
        print(f"[{time.time() - t0:6.0f}s] {name} seed {seed}: final {rec['evals'][-1]['eval_reward']:.3f} "
              f"after {rec['iterations']} it ({rec['split']['t_iter']:.2f} s/it)", flush=True)
        return rec

    with ThreadPoolExecutor(max_workers=n_par) as ex:
        return list(ex.map(one, jobs))


def plot(records: list[dict], key: str, path: str, xlabel: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in dict.fromkeys(r["method"] for r in records):
        runs = [r for r in records if r["method"] == name]
        hi = min(max(e[key] for e in r["evals"]) for r in runs)
        grid = np.linspace(0, hi, 30)
        ys = np.array([np.interp(grid, [e[key] for e in r["evals"]], [e["eval_reward"] for e in r["evals"]]) for r in runs])
        m, s = ys.mean(0), ys.std(0)
        ax.plot(grid, m, label=f"{name} (n={len(runs)})")
        ax.fill_between(grid, m - s, m + s, alpha=0.2)
    ax.set_xlabel(xlabel), ax.set_ylabel("eval reward (prompt adherence)"), ax.grid(alpha=0.3), ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def paired_time_ratios(runs: list[dict], base_runs: list[dict]) -> dict:
    """Per seed: the time a run needs to reach the final reward of the baseline's run with the same seed, over that
    baseline run's training time ({seed: ratio}, NaN where it never gets there; seeds the baseline lacks are left
    out)."""
    return h.paired(runs, base_runs, h.final_reward, lambda b: b[-1]["train_time"])


def paired_best_ratios(runs: list[dict], base_runs: list[dict]) -> dict:
    """Per seed: the time a run needs to reach the *best* reward of the baseline's run with the same seed (the maximum
    of its curve), over the time that baseline run first got there (NaN where the baseline never rose above its
    start). Stricter than :func:`paired_time_ratios` when the baseline peaks and falls back before its budget ends."""
    return h.paired(runs, base_runs, h.best_reward, lambda b: h.time_to_reach(b, h.best_reward(b)))


def paired_first_passage_ratios(runs: list[dict], base_runs: list[dict]) -> dict:
    """Per seed: the time a run needs to reach the final reward of the baseline's run with the same seed, over the time
    that baseline run *first* got there. Symmetric: both sides are first passages, so a baseline that reached its
    final reward early and stayed on a plateau is credited with the early time."""
    return h.paired(runs, base_runs, h.final_reward, lambda b: h.time_to_reach(b, h.final_reward(b)))


def report(records: list[dict], baseline: str = "traj_window", smooth: int = 1) -> dict:
    """The table against ``baseline``; with ``smooth`` > 1 every run's curve is first a moving average over that many
    evaluations (:func:`smooth_evals`), so one noisy evaluation neither sets a target nor crosses it."""
    out = {}
    records = [dict(r, evals=h.smooth_evals(r["evals"], smooth)) for r in records]
    methods = list(dict.fromkeys(r["method"] for r in records))
    base_runs = [r for r in records if r["method"] == baseline]
    base0 = base_runs[0]["evals"][0]["eval_reward"]
    target = sum(r["evals"][-1]["eval_reward"] for r in base_runs) / len(base_runs)
    base_t = sum(r["evals"][-1]["train_time"] for r in base_runs) / len(base_runs)
    base_n = sum(r["evals"][-1]["total_nfe"] for r in base_runs) / len(base_runs)
    print(f"\nbaseline {baseline}: final eval reward {target:.3f} (from {base0:.3f}) after {base_t:.1f} s, "
          f"{base_n:.0f} NFE" + (f" (each curve averaged over {smooth} evaluations)" if smooth > 1 else ""))
    print(f"{'method':<18}{'final':>7}{'div':>6}{'it':>5}{'s/it':>6}{'ratio':>6}{'sample':>7}{'update':>7}{'RSS MB':>7}"
          f"{'t→base':>8}{'t→50%':>7}{'t→90%':>7}{'i→50%':>7}{'i→90%':>7}{'NFE→base':>10}{'r@t_base':>9}"
          f"{'div@base':>9}")
    for name in methods:
        runs = [r for r in records if r["method"] == name]
        fin = h.mean_std([r["evals"][-1]["eval_reward"] for r in runs])
        div = h.mean_std([r["evals"][-1]["eval_diversity"] for r in runs])
        t_base = h.mean_std([h.time_to_reach(r["evals"], target) / base_t for r in runs])
        paired = paired_time_ratios(runs, base_runs)
        best = paired_best_ratios(runs, base_runs)
        first = paired_first_passage_ratios(runs, base_runs)
        t50 = h.mean_std([h.time_to_reach(r["evals"], base0 + 0.5 * (target - base0)) for r in runs])
        t90 = h.mean_std([h.time_to_reach(r["evals"], base0 + 0.9 * (target - base0)) for r in runs])
        n_base = h.mean_std([h.time_to_reach(r["evals"], target, "total_nfe") / base_n for r in runs])
        # learning per iteration: iterations to 50 % / 90 % of the baseline's gain (a saturating curve's total
        # gain over its iteration count would hide a slower climb)
        i50, i90 = (h.mean_std([h.time_to_reach(r["evals"], base0 + f * (target - base0), "iteration") for r in runs])
                    for f in (0.5, 0.9))
        r_eq = h.mean_std([h.reward_at(r["evals"], base_t) for r in runs])
        div_eq = h.mean_std([h.diversity_at_reward(r["evals"], target) for r in runs])
        split = {k: sum(r["split"][k] for r in runs) / len(runs) for k in runs[0]["split"]}
        rss = max(r["peak_rss_mb"] for r in runs)
        its = sum(r["iterations"] for r in runs) / len(runs)
        s_it = split["t_iter"] / (sum(r["split"]["t_iter"] for r in base_runs) / len(base_runs))
        out[name] = {"iteration_time_ratio": s_it, "final_reward": fin, "diversity": div,
                     "diversity_at_baseline_reward": div_eq, "time_to_baseline_ratio": t_base, "t50_s": t50,
                     "t90_s": t90, "it50": i50, "it90": i90, "nfe_to_baseline_ratio": n_base,
                     "reward_at_baseline_time": r_eq,
                     "split_s": split, "peak_rss_mb": rss, "iterations": its,
                     "reached_baseline": f"{t_base[2]}/{len(runs)}",
                     "time_to_baseline_paired": h.mean_std(list(paired.values())),
                     "reached_baseline_paired": f"{sum(not math.isnan(v) for v in paired.values())}/{len(paired)}",
                     "time_to_baseline_paired_by_seed": paired,
                     "time_to_baseline_best_paired": h.mean_std(list(best.values())),
                     "reached_baseline_best_paired": f"{sum(not math.isnan(v) for v in best.values())}/{len(best)}",
                     "time_to_baseline_best_paired_by_seed": best,
                     "time_to_baseline_first_passage_paired": h.mean_std(list(first.values())),
                     "time_to_baseline_first_passage_paired_by_seed": first}
        print(f"{name:<18}{fin[0]:>7.3f}{div[0]:>6.3f}{its:>5.0f}{split['t_iter']:>6.2f}{s_it:>6.2f}{split['t_sample']:>7.2f}"
              f"{split['t_update']:>7.2f}{rss:>7.0f}{t_base[0]:>8.2f}{t50[0]:>7.1f}{t90[0]:>7.1f}{i50[0]:>7.1f}"
              f"{i90[0]:>7.1f}{n_base[0]:>10.2f}{r_eq[0]:>9.3f}{div_eq[0]:>9.3f}  (t→base ±{t_base[1]:.2f}, reached {t_base[2]}/{len(runs)}; "
              f"paired per seed {out[name]['time_to_baseline_paired'][0]:.2f} ± {out[name]['time_to_baseline_paired'][1]:.2f}, "
              f"reached {out[name]['reached_baseline_paired']}; to its best reward "
              f"{out[name]['time_to_baseline_best_paired'][0]:.2f} ± {out[name]['time_to_baseline_best_paired'][1]:.2f}, "
              f"reached {out[name]['reached_baseline_best_paired']})")
    return {"target_reward": target, "baseline": baseline, "smooth": smooth, "methods": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed+seeds-1 (to "
                    "add seeds to an earlier run: --first-seed 4, then --merge both methods.json)")
    ap.add_argument("--budget", type=float, default=60.0, help="training seconds per run")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--threads", type=int, default=h.THREADS, help="torch threads per run (1 keeps runs comparable "
                    "on a shared machine)")
    ap.add_argument("--evals", type=int, default=h.EVALS, help="evaluations per run (one every budget/EVALS s of "
                    "training, not counted as training time)")
    ap.add_argument("--smooth", type=int, help=f"read the ratios off each run's curve averaged over this many "
                    f"consecutive evaluations (default {h.SMOOTH}; with --merge, the pooled runs' own; 1: the raw "
                    "curve, also reported as main_raw)")
    ap.add_argument("--base-config", help="JSON TrainConfig to start every method from instead of the demo "
                    "(e.g. backend diffusers, a local model folder, device cuda); its tree sets the window")
    ap.add_argument("--only", action="append", default=[], metavar="NAME[=JSON]",
                    help="run just these (harness.py's registered names, or a new name with a JSON dict of "
                    "TrainConfig changes), seed by seed, and report them against the first one")
    ap.add_argument("--merge", nargs="+", metavar="METHODS_JSON", help="pool the runs of earlier methods.json files "
                    "(e.g. seeds 0-3 and 4-7) into one report, PNGs and methods.json in --out; runs nothing")
    ap.add_argument("--lr-sweep", metavar="LR,LR,...", help="run --lr-sweep-method at these learning rates instead; "
                    "writes lr_sweep.json (lr_sweep_<method>.json for another method)")
    ap.add_argument("--lr-sweep-method", default="traj_window", help="the method --lr-sweep tunes (traj_window: the "
                    "shared GRPO lr; the peers: nft, awm, tree_nft, tree_awm)")
    ap.add_argument("--lr", type=float, default=h.LR, help="the GRPO methods' shared learning rate")
    ap.add_argument("--peer-lr", type=float, help="NFT's and AWM's learning rate (default: the demo's measured best, "
                    "or with --base-config that config's optim.lr)")
    ap.add_argument("--steps", type=int, default=10, help="demo: denoising steps T; the window starts at the same "
                    "noise level with the same width (bench_steps.py runs T = 10, 20, 40)")
    ap.add_argument("--tail", default="fixed", choices=sorted(h.TAILS), help="demo, with --steps: the ODE tail after "
                    "the window: " + "; ".join(f"{k}: {v}" for k, v in h.TAILS.items()))
    ap.add_argument("--jobs", type=int, default=0, help="runs at a time (default: 2 on a CPU with 2+ cores, 1 with "
                    "--base-config); each run uses --threads threads")
    ns = ap.parse_args()
    if ns.smooth is None and not ns.merge:   # --merge keeps the pooled runs' own reading (below)
        ns.smooth = h.SMOOTH
    if ns.base_config:
        if (ns.steps, ns.tail) != (10, "fixed"):
            raise SystemExit("--steps/--tail apply to the demo; with --base-config set tree.steps there")
        proto = h.protocol(base_config=json.load(open(ns.base_config, encoding="utf-8")), peer_lr=ns.peer_lr)
        print(f"NFT / AWM at lr {proto.overrides('nft')['optim']['lr']:g} (--peer-lr to set; the demo's "
              f"{h.PEER_LR:g} was tuned on its 330K-parameter model)")
    else:
        proto = h.protocol(lr=ns.lr, steps=ns.steps, tail=ns.tail, peer_lr=ns.peer_lr)
    os.makedirs(ns.out, exist_ok=True)
    n_par = ns.jobs or (1 if ns.base_config else min(2, os.cpu_count() or 1))
    t0 = time.time()
    from treegrpo.io import atomic_write_json

    def interleaved(methods: dict, seeds: int) -> list:
        """Every method once per seed, the order rotated by one per seed (so runs that share the machine
        pair up differently)."""
        items = list(methods.items())
        return [(name, ov, seed) for seed in range(ns.first_seed, ns.first_seed + seeds)
                for name, ov in items[seed % len(items):] + items[:seed % len(items)]]

    def run(methods: dict) -> list[dict]:
        return run_all(proto, interleaved(methods, ns.seeds), ns.budget, ns.out, n_par, t0, ns.threads, ns.evals)

    if ns.only or ns.lr_sweep:
        chosen = dict(proto.resolve(item) for item in ns.only)
        sweep = ns.lr_sweep_method
        for lr in (ns.lr_sweep.split(",") if ns.lr_sweep else []):
            chosen[f"{sweep}_lr{lr}"] = h.merge(proto.overrides(sweep), {"optim": {"lr": float(lr)}})
        recs = run(chosen)
        res = report(recs, baseline=next(iter(chosen)), smooth=ns.smooth)
        name = ("lr_sweep.json" if sweep == "traj_window" else f"lr_sweep_{sweep}.json") if ns.lr_sweep else \
            "explore.json"
        atomic_write_json(os.path.join(ns.out, name), h.json_ready({"result": res, "records": recs, "budget_s": ns.budget,
                                                       "steps": ns.steps, "tail": ns.tail, "evals": ns.evals,
                                                       "smooth": ns.smooth, "provenance": h.provenance(
                                                           {"base": proto.base, **chosen})}))
        return
    if ns.merge:
        parts = [json.load(open(p, encoding="utf-8")) for p in ns.merge]
        records = [r for d in parts for r in d["records"]]
        ns.budget, ns.lr, n_par = (parts[0][k] for k in ("budget_s", "lr", "parallel_runs"))
        cadence = {p.get("evals", 8) for p in parts}
        if len(cadence) > 1:
            raise SystemExit(f"--merge: the runs were evaluated at different cadences ({sorted(cadence)} evaluations "
                             "per run); pool runs of one protocol")
        ns.evals = cadence.pop()
        if ns.smooth is None:
            ns.smooth = parts[0].get("smooth", 1)   # runs from before the smoothing keep their raw reading
    else:
        records = run({name: proto.overrides(name) for name in proto.methods})
    sm = ns.smooth
    result = {"main": report(records, smooth=sm), "main_raw": report(records),
              "vs_all_step": report(records, baseline="traj_all", smooth=sm),
              "vs_window_mirrored": report(records, baseline="traj_window_mirrored", smooth=sm), "records": records,
              "evals": ns.evals, "smooth": sm,
              "budget_s": ns.budget, "lr": ns.lr if not ns.base_config else None, "parallel_runs": n_par,
              "steps": ns.steps if not ns.base_config else None, "tail": ns.tail,
              "provenance": h.provenance({"base": proto.base, **{n: proto.overrides(n) for n in proto.methods}})}
    for peer in ("awm", "nft"):   # the flow-matching peers' final rewards as targets too (best non-tree method)
        if any(r["method"] == peer for r in records):
            result[f"vs_{peer}"] = report(records, baseline=peer, smooth=sm)
    plot(records, "train_time", os.path.join(ns.out, "reward_vs_time.png"), "training wall-clock (s)")
    plot(records, "total_nfe", os.path.join(ns.out, "reward_vs_nfe.png"), "denoiser evaluations (NFE)")
    atomic_write_json(os.path.join(ns.out, "methods.json"), h.json_ready(result))
    print(f"total {time.time() - t0:.0f} s; wrote {ns.out}/methods.json and the PNGs")


if __name__ == "__main__":
    main()
