"""TreeGRPO vs trajectory GRPO, side by side (issue: reproduce and beat the paper's efficiency claim).

Trains, from the same base model, prompts, reward, seed schedule and optimiser:
  tree          TreeGRPO, k=2, w=3 (8 leaves per prompt), mirrored siblings (noise ε, −ε), edge advantages
                relative to their siblings' mean, every window step the same weight in the loss
  traj_window   trajectory GRPO, 8 trajectories per prompt, SDE on the same 3-step window (MixGRPO-style)
  traj_window_mirrored  the same with mirrored pairs at its branching step (the tree's noise, offered to it)
  traj_all      trajectory GRPO, 8 trajectories per prompt, SDE on every step (DanceGRPO/Flow-GRPO-style)
  nft, awm      DiffusionNFT- and AWM-style flow matching on 8 independent DPM++(2M) samples per prompt
  tree_nft, tree_awm   the same objectives on the tree's 8 leaves (tree sampling for any objective)
the GRPO methods with the same learning rate (tuned on traj_window: ``--lr-sweep``) and the same tail solver after the
window; the matching peers with their own (``--lr-sweep ... --lr-sweep-method nft``). The paper's edge advantages (no sibling baseline) are an ablation: on mirrored k=2 siblings they
give the same gradient as the tree's default. Each (method, seed) run is a separate process (peak RSS per
run) on one thread; the runs are interleaved seed by seed so machine noise hits all methods alike,
``--jobs`` of them at a time (one per core); every run trains for the same wall-clock budget. Evaluation
on fixed (prompt, noise) pairs, every budget/32 seconds of training (``--evals``), is not counted as training time;
the ratios are read off each run's curve averaged over 3 consecutive evaluations (``--smooth``; the raw reading is
reported beside it as ``main_raw``).

    python benchmarks/bench_methods.py [--seeds 4] [--budget 60] [--ablations] [--out benchmarks/results]
    python benchmarks/bench_methods.py --lr-sweep 1.5e-3,3e-3,6e-3,1.2e-2 --seeds 2   # tune lr on traj_window
    python benchmarks/bench_methods.py --window-width 4 --lr 6e-3   # k=2, w=4: 16 leaves, 12 prompts/iteration
    python benchmarks/bench_methods.py --steps 40 --only tree --only traj_window   # T = 40 (bench_steps.py)
    python benchmarks/bench_methods.py --first-seed 4 --out more      # seeds 4-7, then pool both runs:
    python benchmarks/bench_methods.py --merge first/methods.json more/methods.json --out pooled
    python benchmarks/bench_methods.py --base-config sd35.json --budget 120 --seeds 2   # a diffusers model on a GPU

Writes methods.json, reward_vs_time.png, reward_vs_nfe.png and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from treegrpo.run import run_training

HERE = os.path.dirname(os.path.abspath(__file__))
THREADS = 1  # torch threads per run: one core, so a second process on a 2-core machine does not skew it
EVALS = 32   # evaluations per run, one every budget/EVALS seconds of training (1.9 s of a 60 s run: the tree
#              makes 2-3 iterations in between, the window baseline 1-2)
SMOOTH = 3   # the ratios are read off each run's curve averaged over this many consecutive evaluations (one
#              noisy evaluation then neither sets a baseline's final reward nor crosses it; 1 = the raw curve)

# each GRPO method's own sweep under the KL default (optim.kl_beta 0.1), 3e-3 / 6e-3 / 1.2e-2, 2 seeds, 60 s
# (docs/experiments/2026-12-05-benchmark-protocols-before-budgets.md): 6e-3 is the best of both the tree
# (0.751 / 0.788 / 0.747) and the window baseline (0.657 / 0.685 / 0.665). Without KL, 6e-3 destabilised both over 100 s, and 3e-3 was used (README)
LR = 6e-3
# the tail after the window: 2 DPM++(2M) steps for every method (3 gave the same rewards, slower; 1 let the
# tree's policy exploit the blurry one-step leaves and collapse)
BASE = {"tree": {"steps": 10, "window_start": 1, "window_width": 3, "branch": 2, "tail_solver": "dpmpp_2m",
                 "tail_steps": 2}, "optim": {"lr": LR}}
METHODS = {
    "tree": {"advantage": {"edge_baseline": "siblings"}, "tree": {"antithetic": True}},
    "traj_window": {"tree": {"method": "trajectory", "group_size": 8}},
    # the baseline offered the tree's mirrored noise (pairs at its one branching step); reported, not tuned on
    "traj_window_mirrored": {"tree": {"method": "trajectory", "group_size": 8, "antithetic": True}},
    "traj_all": {"tree": {"method": "trajectory", "group_size": 8, "window_start": 0, "window_width": 10,
                          "tail_steps": 0}},
    # the flow-matching peers (treegrpo/matching.py): 8 ODE samples per prompt from independent noises (DiffusionNFT
    # and AWM sample with any ODE solver), and the same objectives on a tree's 8 correlated leaves; each with its
    # own lr (PEER_LR, from --lr-sweep-method)
    "nft": {"tree": {"method": "ode", "group_size": 8}, "optim": {"loss": "nft"}},
    "awm": {"tree": {"method": "ode", "group_size": 8}, "optim": {"loss": "awm"}},
    "tree_nft": {"advantage": {"edge_baseline": "siblings"}, "tree": {"antithetic": True}, "optim": {"loss": "nft"}},
    "tree_awm": {"advantage": {"edge_baseline": "siblings"}, "tree": {"antithetic": True}, "optim": {"loss": "awm"}},
}
#: each peer's learning rate: nft's and awm's own sweeps (3e-3 … 4.8e-2, 2 seeds, 40 s: 1.2e-2 best for both,
#: 2.4e-2 worse, 4.8e-2 diverged; benchmarks/README.md); the tree variants train the same objective on as many
#: leaves per iteration and take the same lr
PEER_LR = {"nft": 1.2e-2, "awm": 1.2e-2, "tree_nft": 1.2e-2, "tree_awm": 1.2e-2}
PEER_ODE_STEPS = 6   # DPM++(2M) calls per independent sample: as many as a tree leaf's path (1 + 3 + 2)
ABLATIONS = {  # each is "tree" with these changes, reported against it
    "tree_k8_w1": {"tree": {"branch": 8, "window_width": 1, "window_start": 1}},
    "tree_mean_backup": {"advantage": {"backup": "mean"}},
    "tree_sum_logprob": {"tree": {"logprob_reduction": "sum"}},
    "tree_sliding": {"tree": {"window_schedule": "sliding", "window_max_start": 3, "window_every": 2}},
    "tree_no_flat_skip": {"advantage": {"flat_floor": 0.0}},
    "tree_euler_tail": {"tree": {"tail_solver": "euler", "tail_steps": 0}},
    # one DPM++(2M) tail step instead of two: a third less sampling per tree (16 of 24 rows per prompt); the
    # evaluation samples the full ODE either way. Without KL it collapsed on blurry one-step leaves (README)
    "tree_tail1": {"tree": {"tail_steps": 1}},
    # the one-step tail while the policy is far from the reward, the two-step tail from iteration 60 on: at 12 prompts
    # a tree iteration costs ~0.2 of the baseline's, so iteration 60 is ~12 baseline iterations in, by when the
    # one-step tail had reached the N = 20 and N = 40 targets (issue 35), and before the N = 80 target, where it
    # fell behind the two-step tail (0.43 vs 0.38) and ended lower (0.813 vs 0.875)
    "tree_tail1to2": {"tree": {"tail_steps": 1, "tail_steps_schedule": [[0, 1], [60, 2]]}},
    # and half the lr from iteration 60, 100 or 150 (~12, ~23 or ~35 baseline iterations in at 12 prompts): a constant
    # lr's noise sets a plateau (lr 4e-3 ended highest, 9e-3 lowest; past reward 0.72 every 12-prompt variant fell behind)
    **{f"tree_tail1to2_lrhalf{it}": {"tree": {"tail_steps": 1, "tail_steps_schedule": [[0, 1], [60, 2]]},
                                     "optim": {"lr_factor_schedule": [[0, 1], [it, 0.5]]}} for it in (60, 100, 150)},
    "tree_independent": {"tree": {"antithetic": False}},
    "tree_edge_mean": {"optim": {"step_weight": "edges"}},  # the plain mean over edges (last step 4x the first)
    "tree_paper_adv": {"advantage": {"edge_baseline": "none"}},  # the paper's edge advantages
}


def all_step_width(steps: int, family: str) -> int:
    """SDE window of the all-step baseline: every step, except on DDIM families (sd, sdxl), whose last step
    has no noise (ᾱ' = 1)."""
    return steps - (family in ("sd", "sdxl"))


def peer_overrides() -> None:
    """The peers' own learning rates and their ODE sampler: DPM++(2M) over the whole schedule in PEER_ODE_STEPS
    steps, the calls along one tree leaf's path (1 prefix + 3 window + 2 tail)."""
    for name, lr in PEER_LR.items():
        METHODS[name].setdefault("optim", {})["lr"] = lr
    for name in ("nft", "awm"):
        METHODS[name]["tree"].update(tail_solver="dpmpp_2m", tail_steps=PEER_ODE_STEPS)


peer_overrides()


def merge(a: dict, b: dict) -> dict:
    out = json.loads(json.dumps(a))
    for k, v in b.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


BASE_CONFIG: dict | None = None  # --base-config: a TrainConfig dict (e.g. a diffusers model on a GPU)
LEAVES_PER_ITER = 192  # demo: 24 prompts × 8 leaves at w = 3; kept when --window-width changes the tree


def set_group_size(leaves: int) -> None:
    """Every trajectory baseline samples as many trajectories per prompt as the tree has leaves."""
    for ov in METHODS.values():
        if ov.get("tree", {}).get("method") in ("trajectory", "ode"):
            ov["tree"]["group_size"] = leaves


def set_window_width(width: int) -> None:
    """Demo settings for a k=2 tree of window ``width``: 2**width leaves (and trajectories) per prompt,
    ``LEAVES_PER_ITER / 2**width`` prompts per iteration, so every width trains on the same number of leaves
    per iteration."""
    leaves = 2 ** width
    if leaves > LEAVES_PER_ITER or BASE["tree"]["window_start"] + width > BASE["tree"]["steps"]:
        raise SystemExit(f"--window-width {width}: 2**{width} leaves per tree do not fit the demo "
                         f"({LEAVES_PER_ITER} leaves per iteration, {BASE['tree']['steps']} steps)")
    BASE["tree"]["window_width"] = width
    BASE["prompts_per_iter"] = LEAVES_PER_ITER // leaves
    set_group_size(leaves)
    ABLATIONS.pop("tree_k8_w1")  # branch factor vs width at equal leaves: all of them at the first step
    ABLATIONS[f"tree_k{leaves}_w1"] = {"tree": {"branch": leaves, "window_width": 1, "window_start": 1}}


#: --tail: what follows the window at any step count T
TAILS = {"fixed": "2 DPM++(2M) steps, as at T = 10 (the protocol's tail)",
         "schedule": "the schedule's own remaining T - s - w steps, DPM++(2M) (what a real model's sampler runs)"}


def window_start_for(steps: int) -> int:
    """The window starts at the same noise level at every T: σ = 1 - s/T = 0.9, as s = 1 at T = 10."""
    return max(1, round(steps / 10))


def set_steps(steps: int, tail: str = "fixed") -> None:
    """Demo settings at ``steps`` denoising steps: the window at the same noise level (:func:`window_start_for`)
    with the same width (w = 3: the same 8 leaves and 8 trajectories per prompt, so every T trains on the same
    groups); the tail as ``TAILS[tail]``; the all-step baseline SDE on all T steps; the ODE peers' samples as many
    DPM++(2M) steps as a tree leaf's path (s + w + tail)."""
    if tail not in TAILS:
        raise SystemExit(f"--tail {tail!r}: one of {sorted(TAILS)}")
    s, w = window_start_for(steps), BASE["tree"]["window_width"]
    if s + w > steps:
        raise SystemExit(f"--steps {steps}: the window (start {s}, width {w}) does not fit")
    tail_steps = BASE["tree"]["tail_steps"] if tail == "fixed" else 0
    BASE["tree"].update(steps=steps, window_start=s, tail_steps=tail_steps)
    METHODS["traj_all"]["tree"].update(window_width=steps)
    path = s + w + (tail_steps or steps - s - w)
    for name in ("nft", "awm"):
        METHODS[name]["tree"].update(tail_steps=path)
    ABLATIONS["tree_k8_w1"]["tree"]["window_start"] = s
    ABLATIONS["tree_sliding"]["tree"]["window_max_start"] = s + 2


def run_child(argv: list[str]) -> tuple[str, int, "os.struct_rusage"]:
    """Run ``argv`` to the end: its whole stdout, its wait status and its own resource usage (peak RSS). The output
    is read to its end before the wait: a record longer than the pipe's buffer (64 KiB: a run of ~270 iterations)
    would otherwise block the child in its last write while the parent waits for it to exit."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = status   # reaped here: Popen must not wait for it again
    return out, status, usage


def run_one(name: str, overrides: dict, seed: int, budget: float | None, out_dir: str, **extra) -> dict:
    """One training run in a child process; returns its record (with the child's own peak RSS). ``extra`` goes into
    the child's spec (``iterations``, ``eval_every``, ``eval_every_s``: see :func:`child`)."""
    spec = json.dumps({"overrides": overrides if BASE_CONFIG else merge(BASE, overrides), "seed": seed,
                       "budget": budget, "out": out_dir, "threads": THREADS, "base": BASE_CONFIG,
                       "evals": EVALS, **extra})
    out, status, usage = run_child([sys.executable, __file__, "--child", spec])
    if status != 0:
        raise RuntimeError(f"run {name} seed {seed} failed (status {status})")
    rec = json.loads(out.strip().splitlines()[-1])
    rec.update(method=name, seed=seed, peak_rss_mb=usage.ru_maxrss / 1024)
    return rec


def run_all(jobs: list[tuple[str, dict, int]], budget: float, out_dir: str, n_par: int, t0: float,
            prefix: str = "") -> list[dict]:
    """Run (name, overrides, seed) jobs, ``n_par`` at a time, in the given (interleaved) order; records in order."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        name, ov, seed = job
        rec = run_one(name, ov, seed, budget, os.path.join(out_dir, "runs", f"{prefix}{name}_{seed}"))
        print(f"[{time.time() - t0:6.0f}s] {name} seed {seed}: final {rec['evals'][-1]['eval_reward']:.3f} "
              f"after {rec['iterations']} it ({rec['split']['t_iter']:.2f} s/it)", flush=True)
        return rec

    with ThreadPoolExecutor(max_workers=n_par) as ex:
        return list(ex.map(one, jobs))


def child(spec: dict) -> None:
    import torch

    from treegrpo import cli
    from treegrpo.config import TrainConfig

    torch.set_num_threads(spec.get("threads", 1))
    base = spec.get("base")
    d = merge(base, spec["overrides"]) if base else merge(cli.demo_config_dict(), spec["overrides"])
    # a time budget (``budget`` s, evaluated every budget/evals s), or a work budget (``iterations``, evaluated every
    # ``eval_every`` iterations; bench_budget.py's baseline); ``eval_every_s`` overrides the time cadence
    budget = spec.get("budget")
    d.update(seed=spec["seed"], iterations=spec.get("iterations") or 100000, time_budget_s=budget or 0.0,
             eval_every=spec.get("eval_every", 0),
             eval_every_s=spec.get("eval_every_s") or (budget / spec.get("evals", 8) if budget else 0.0), eval_seeds=4,
             checkpoint_every=0, output_dir=spec["out"], run_name="bench")
    d["signals"] = {**d.get("signals", {}), "kl_estimate": False}   # the tables do not use it; 20 % of an evaluation
    cfg = TrainConfig.from_dict(d)
    tr, summary = run_training(cfg, progress=False, write_lora=False)
    hist = tr.history
    split = {k: sum(h[k] for h in hist) / len(hist) for k in ("t_sample", "t_decode", "t_reward", "t_update", "t_iter")}
    print(json.dumps({"evals": tr.evals, "iterations": tr.iteration, "train_time": tr.train_time,
                      "leaves_per_iter": cfg.prompts_per_iter * cfg.trees_per_prompt * cfg.tree.leaves,
                      "total_nfe": tr.total_nfe, "split": split, "nfe_per_iter": hist[0]["nfe"],
                      "flat_trees": sum(h["flat_trees"] for h in hist)}))


def time_to_reach(evals: list[dict], target: float, key: str = "train_time") -> float:
    """First training time (or NFE) at which the eval reward reaches ``target`` (linear interpolation)."""
    prev = None
    for e in evals:
        if e["eval_reward"] >= target:
            if prev is None:
                return e[key]
            f = (target - prev["eval_reward"]) / max(1e-12, e["eval_reward"] - prev["eval_reward"])
            return prev[key] + f * (e[key] - prev[key])
        prev = e
    return math.nan


def smooth_evals(evals: list[dict], width: int) -> list[dict]:
    """The evaluation curve as a moving average over ``width`` consecutive evaluations: every numeric field is
    averaged, the training time and NFE included, so each point sits at the mean time of the evaluations behind it.
    The first evaluation (the base model, the same for every method) stays as the curve's start. ``width`` 1, or a
    curve shorter than ``width``, is returned as it is."""
    if width <= 1 or len(evals) <= width:
        return evals
    keys = [k for k, v in evals[0].items() if isinstance(v, (int, float)) and all(k in e for e in evals)]
    return [evals[0]] + [{k: sum(e[k] for e in evals[i:i + width]) / width for k in keys}
                         for i in range(len(evals) - width + 1)]


def diversity_at_reward(evals: list[dict], target: float) -> float:
    """Eval diversity where the reward first reaches ``target`` (interpolated); diversity at equal reward
    is the fair comparison (it falls as any method's reward rises)."""
    t = time_to_reach(evals, target)
    if math.isnan(t):
        return math.nan
    pts = [(e["train_time"], e["eval_diversity"]) for e in evals]
    for (t0, d0), (t1, d1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return d0 + (d1 - d0) * (t - t0) / max(1e-12, t1 - t0)
    return pts[0][1]


def reward_at(evals: list[dict], t: float) -> float:
    pts = [(e["train_time"], e["eval_reward"]) for e in evals]
    for (t0, r0), (t1, r1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return r0 + (r1 - r0) * (t - t0) / max(1e-12, t1 - t0)
    return pts[-1][1]


def mean_std(xs):
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan, 0
    m = sum(xs) / len(xs)
    return m, (sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1)) ** 0.5, len(xs)


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


def _paired(runs: list[dict], base_runs: list[dict], target, base_time) -> dict:
    """{seed: the time a run needs to reach ``target(baseline evals)`` over ``base_time(baseline evals)``} for the
    seeds the baseline has; NaN where the run never gets there or the baseline's time is 0."""
    base = {r["seed"]: r["evals"] for r in base_runs}
    out = {}
    for r in runs:
        if r["seed"] in base:
            b = base[r["seed"]]
            t_b = base_time(b)
            out[r["seed"]] = time_to_reach(r["evals"], target(b)) / t_b if t_b > 0 else math.nan
    return out


def _final(evals: list[dict]) -> float:
    return evals[-1]["eval_reward"]


def _best(evals: list[dict]) -> float:
    return max(e["eval_reward"] for e in evals)


def paired_time_ratios(runs: list[dict], base_runs: list[dict]) -> dict:
    """Per seed: the time a run needs to reach the final reward of the baseline's run with the same seed, over that
    baseline run's training time ({seed: ratio}, NaN where it never gets there; seeds the baseline lacks are left
    out)."""
    return _paired(runs, base_runs, _final, lambda b: b[-1]["train_time"])


def paired_best_ratios(runs: list[dict], base_runs: list[dict]) -> dict:
    """Per seed: the time a run needs to reach the *best* reward of the baseline's run with the same seed (the maximum
    of its curve), over the time that baseline run first got there (NaN where the baseline never rose above its
    start). Stricter than :func:`paired_time_ratios` when the baseline peaks and falls back before its budget ends."""
    return _paired(runs, base_runs, _best, lambda b: time_to_reach(b, _best(b)))


def paired_first_passage_ratios(runs: list[dict], base_runs: list[dict]) -> dict:
    """Per seed: the time a run needs to reach the final reward of the baseline's run with the same seed, over the time
    that baseline run *first* got there. Symmetric: both sides are first passages, so a baseline that reached its
    final reward early and stayed on a plateau is credited with the early time."""
    return _paired(runs, base_runs, _final, lambda b: time_to_reach(b, _final(b)))


def report(records: list[dict], baseline: str = "traj_window", smooth: int = 1) -> dict:
    """The table against ``baseline``; with ``smooth`` > 1 every run's curve is first a moving average over that many
    evaluations (:func:`smooth_evals`), so one noisy evaluation neither sets a target nor crosses it."""
    out = {}
    records = [dict(r, evals=smooth_evals(r["evals"], smooth)) for r in records]
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
        fin = mean_std([r["evals"][-1]["eval_reward"] for r in runs])
        div = mean_std([r["evals"][-1]["eval_diversity"] for r in runs])
        t_base = mean_std([time_to_reach(r["evals"], target) / base_t for r in runs])
        paired = paired_time_ratios(runs, base_runs)
        best = paired_best_ratios(runs, base_runs)
        first = paired_first_passage_ratios(runs, base_runs)
        t50 = mean_std([time_to_reach(r["evals"], base0 + 0.5 * (target - base0)) for r in runs])
        t90 = mean_std([time_to_reach(r["evals"], base0 + 0.9 * (target - base0)) for r in runs])
        n_base = mean_std([time_to_reach(r["evals"], target, "total_nfe") / base_n for r in runs])
        # learning per iteration: iterations to 50 % / 90 % of the baseline's gain (a saturating curve's total
        # gain over its iteration count would hide a slower climb)
        i50, i90 = (mean_std([time_to_reach(r["evals"], base0 + f * (target - base0), "iteration") for r in runs])
                    for f in (0.5, 0.9))
        r_eq = mean_std([reward_at(r["evals"], base_t) for r in runs])
        div_eq = mean_std([diversity_at_reward(r["evals"], target) for r in runs])
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
                     "time_to_baseline_paired": mean_std(list(paired.values())),
                     "reached_baseline_paired": f"{sum(not math.isnan(v) for v in paired.values())}/{len(paired)}",
                     "time_to_baseline_paired_by_seed": paired,
                     "time_to_baseline_best_paired": mean_std(list(best.values())),
                     "reached_baseline_best_paired": f"{sum(not math.isnan(v) for v in best.values())}/{len(best)}",
                     "time_to_baseline_best_paired_by_seed": best,
                     "time_to_baseline_first_passage_paired": mean_std(list(first.values())),
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
    global THREADS, BASE_CONFIG, EVALS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed+seeds-1 (to "
                    "add seeds to an earlier run: --first-seed 4, then --merge both methods.json)")
    ap.add_argument("--budget", type=float, default=60.0, help="training seconds per run")
    ap.add_argument("--ablation-budget", type=float, default=40.0, help="training seconds per ablation run (the "
                    "reference tree runs again beside them at this budget)")
    ap.add_argument("--ablations", action="store_true", help="also run the ablations (--ablation-seeds each)")
    ap.add_argument("--ablation-seeds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (1 keeps runs comparable on a "
                    "shared machine)")
    ap.add_argument("--evals", type=int, default=EVALS, help="evaluations per run (one every budget/EVALS s of "
                    "training, not counted as training time)")
    ap.add_argument("--smooth", type=int, help=f"read the ratios off each run's curve averaged over this many "
                    f"consecutive evaluations (default {SMOOTH}; with --merge, the pooled runs' own; 1: the raw curve, "
                    "also reported as main_raw)")
    ap.add_argument("--base-config", help="JSON TrainConfig to start every method from instead of the demo "
                    "(e.g. backend diffusers, a local model folder, device cuda); its tree sets the window")
    ap.add_argument("--only", action="append", default=[], metavar="NAME[=JSON]",
                    help="run just these methods (names from the tables above, or a new name with a JSON dict of "
                    "TrainConfig overrides), seed by seed, and report them against the first one")
    ap.add_argument("--merge", nargs="+", metavar="METHODS_JSON", help="pool the runs of earlier methods.json files "
                    "(e.g. seeds 0-3 and 4-7) into one report, PNGs and methods.json in --out; runs nothing")
    ap.add_argument("--lr-sweep", metavar="LR,LR,...", help="run traj_window at these learning rates instead "
                    "(the baseline the shared lr is tuned on); writes lr_sweep.json")
    ap.add_argument("--lr-sweep-method", default="traj_window", help="the method --lr-sweep tunes (the peers: "
                    "nft, awm, tree_nft, tree_awm; writes lr_sweep_<method>.json)")
    ap.add_argument("--lr", type=float, default=LR, help="the shared learning rate (tune it on the window "
                    "baseline with --lr-sweep)")
    ap.add_argument("--window-width", type=int, default=BASE["tree"]["window_width"], help="demo: the tree's window w (k=2, 2**w leaves and "
                    "trajectories per prompt, the same leaves per iteration for every w)")
    ap.add_argument("--steps", type=int, default=BASE["tree"]["steps"], help="demo: denoising steps T; the window "
                    "starts at the same noise level with the same width (bench_steps.py runs T = 10, 20, 40)")
    ap.add_argument("--tail", default="fixed", choices=sorted(TAILS), help="demo, with --steps: the ODE tail after "
                    "the window: " + "; ".join(f"{k}: {v}" for k, v in TAILS.items()))
    ap.add_argument("--jobs", type=int, default=0, help="runs at a time (default: 2 on a CPU with 2+ cores, 1 with "
                    "--base-config); each run uses --threads threads")
    ns = ap.parse_args()
    THREADS, EVALS = ns.threads, ns.evals
    if ns.smooth is None and not ns.merge:   # --merge keeps the pooled runs' own reading (below)
        ns.smooth = SMOOTH
    BASE["optim"]["lr"] = ns.lr
    if ns.window_width != BASE["tree"]["window_width"] and not ns.child:
        if ns.base_config:
            raise SystemExit("--window-width applies to the demo; with --base-config set tree.window_width there")
        set_window_width(ns.window_width)
    if (ns.steps != BASE["tree"]["steps"] or ns.tail != "fixed") and not ns.child:
        if ns.base_config:
            raise SystemExit("--steps/--tail apply to the demo; with --base-config set tree.steps there")
        set_steps(ns.steps, ns.tail)
    if ns.base_config:
        BASE_CONFIG = json.load(open(ns.base_config, encoding="utf-8"))
        from treegrpo.config import TreeConfig
        t = TreeConfig(**BASE_CONFIG.get("tree", {}))
        set_group_size(t.leaves)  # same leaves per prompt as the tree; all-step SDE = every step
        family = BASE_CONFIG.get("pipeline", {}).get("family", "auto")
        if family == "auto" and BASE_CONFIG.get("backend") == "diffusers" and BASE_CONFIG.get("model"):
            from treegrpo.backends.diffusers import detect_family
            family = detect_family(BASE_CONFIG["model"], BASE_CONFIG.get("pipeline", {}).get("config"))
        METHODS["traj_all"]["tree"].update(window_width=all_step_width(t.steps, family))
    if ns.child:
        child(json.loads(ns.child))
        return
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

    if ns.only or ns.lr_sweep:
        chosen = {}
        for item in ns.only:
            name, _, js = item.partition("=")
            chosen[name] = json.loads(js) if js else {**METHODS, **{k: merge(METHODS["tree"], v)
                                                                    for k, v in ABLATIONS.items()}}[name]
        sweep = ns.lr_sweep_method
        for lr in (ns.lr_sweep.split(",") if ns.lr_sweep else []):
            chosen[f"{sweep}_lr{lr}"] = merge(METHODS[sweep], {"optim": {"lr": float(lr)}})
        recs = run_all(interleaved(chosen, ns.seeds), ns.budget, ns.out, n_par, t0)
        res = report(recs, baseline=next(iter(chosen)), smooth=ns.smooth)
        name = ("lr_sweep.json" if sweep == "traj_window" else f"lr_sweep_{sweep}.json") if ns.lr_sweep else \
            "explore.json"
        atomic_write_json(os.path.join(ns.out, name), {"result": res, "records": recs, "budget_s": ns.budget,
                                                       "steps": ns.steps, "tail": ns.tail, "evals": ns.evals,
                                                       "smooth": ns.smooth})
        return
    if ns.merge:
        parts = [json.load(open(p, encoding="utf-8")) for p in ns.merge]
        records = [r for d in parts for r in d["records"]]
        abl = [r for d in parts for r in d.get("ablation_records", [])]
        ns.budget, ns.lr, n_par, ns.window_width = (parts[0][k] for k in ("budget_s", "lr", "parallel_runs", "window_width"))
        cadence = {p.get("evals", 8) for p in parts}
        if len(cadence) > 1:
            raise SystemExit(f"--merge: the runs were evaluated at different cadences ({sorted(cadence)} evaluations "
                             "per run); pool runs of one protocol")
        ns.evals = cadence.pop()
        if ns.smooth is None:
            ns.smooth = parts[0].get("smooth", 1)   # runs from before the smoothing keep their raw reading
    else:
        records = run_all(interleaved(METHODS, ns.seeds), ns.budget, ns.out, n_par, t0)
    sm = ns.smooth
    result = {"main": report(records, smooth=sm), "main_raw": report(records),
              "vs_all_step": report(records, baseline="traj_all", smooth=sm),
              "vs_window_mirrored": report(records, baseline="traj_window_mirrored", smooth=sm), "records": records,
              "evals": ns.evals, "smooth": sm,
              "budget_s": ns.budget, "lr": ns.lr if not BASE_CONFIG else None, "parallel_runs": n_par,
              "window_width": ns.window_width if not BASE_CONFIG else None,
              "steps": ns.steps if not BASE_CONFIG else None, "tail": ns.tail}
    for peer in ("awm", "nft"):   # the flow-matching peers' final rewards as targets too (best non-tree method)
        if any(r["method"] == peer for r in records):
            result[f"vs_{peer}"] = report(records, baseline=peer, smooth=sm)
    plot(records, "train_time", os.path.join(ns.out, "reward_vs_time.png"), "training wall-clock (s)")
    plot(records, "total_nfe", os.path.join(ns.out, "reward_vs_nfe.png"), "denoiser evaluations (NFE)")
    if ns.merge and abl:
        result.update(ablations=report(abl, baseline="tree", smooth=sm), ablation_records=abl,
                      ablation_budget_s=parts[0]["ablation_budget_s"])
    elif ns.ablations:
        # the reference runs again beside its variants, so that all of them share the same machine conditions
        variants = {"tree": METHODS["tree"], **{k: merge(METHODS["tree"], v) for k, v in ABLATIONS.items()}}
        abl = run_all(interleaved(variants, ns.ablation_seeds), ns.ablation_budget, ns.out, n_par, t0,
                      prefix="ablation_")
        result["ablations"] = report(abl, baseline="tree", smooth=sm)
        result["ablation_records"] = abl
        result["ablation_budget_s"] = ns.ablation_budget
    atomic_write_json(os.path.join(ns.out, "methods.json"), result)
    print(f"total {time.time() - t0:.0f} s; wrote {ns.out}/methods.json and the PNGs")


if __name__ == "__main__":
    main()
