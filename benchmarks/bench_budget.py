"""Budgets in work, not seconds: TreeGRPO and its peers against window-SDE GRPO at the same stage of its training,
on any machine (issue 35).

Per seed, window-SDE GRPO (MixGRPO-style, the baseline) trains ``N_max`` iterations and is evaluated after every one;
every other method then trains for the training time that run took, on the same machine, and is evaluated as often
(every ``N_max``-th of that time). Runs go two at a time in an interleaved schedule: the next seed's baseline beside
this seed's other methods, their order rotated every seed. The learning rate is constant, so the first part of a run
*is* a shorter run: one run per (method, seed) gives every budget ``N <= N_max``. The baseline's budget-N run is its
first N iterations, which took ``T_N`` seconds; every other method's budget-N run is its first ``T_N`` seconds.

At budget N, paired per seed, each curve cut at the budget (nothing past it is read) and then averaged over
``--smooth`` consecutive evaluations:

  target  the reference run's reward at the end of its budget (its last averaged point)
  ratio   the method's first passage to that target over the reference's own first passage to it: first passage on
          both sides, so a reference that got there early and stayed on a plateau is credited with the early time

The references are window GRPO (cut at N iterations) and the flow-matching peers AWM and NFT (cut at ``T_N``).
Beside the time ratio: the same ratio in iterations (what one iteration teaches) and in samples (leaves scored: the
two agree where a method samples the baseline's 192 leaves per iteration; a ``_p<N>`` variant trains N prompts per
iteration, so its iterations are smaller). And each method's iteration in the baseline's iterations, phase by
phase (sampling, update, decode + reward), paired per seed: at per-sample parity the time ratio is that cost ratio.
Beside the time ratio, the same protocol on the steady clock (each run's iterations × its median cost of one;
:func:`steady_ratios`), which takes out load that the machine carried while a run was young; never instead of it.
And the ratio at equal reward, which no budget cuts: on the whole runs, each method's first passage to each reward
level (every 0.02 above the base model's) over the baseline's, paired per seed (:func:`level_table`).

    python benchmarks/bench_budget.py [--seeds 8] [--first-seed 0] [--budgets 20,40,80] [--methods tree,awm,nft]
    python benchmarks/bench_budget.py --seeds 4 --methods tree,tree_p12,traj_window_p12   # the batch: 12 prompts
    python benchmarks/bench_budget.py --seeds 4 --methods tree_p12_lr4e-3,tree_p12_lr9e-3   # its lr
    python benchmarks/bench_budget.py --report benchmarks/results/budget/budget.json   # read again, run nothing
    python benchmarks/bench_budget.py --merge a/budget.json b/budget.json --out pooled  # pool seeds

Writes budget.json (the records and the tables) and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
from typing import Callable

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))

BASELINE = "traj_window"
METHODS = ("tree", "awm", "nft")
REFERENCES = (BASELINE, "awm", "nft")
BUDGETS = (20, 40, 80)
SMOOTH = 3   # the old protocol's reading: 3 consecutive evaluations (there ~3.3 baseline iterations, here 3)
GOALS = {BASELINE: 0.33, "awm": 0.5, "nft": 0.5}   # the per-seed goals for the tree


# ------------------------------------------------------------------------------------------------ reading the runs
def cut(evals: list[dict], key: str, limit: float) -> list[dict]:
    """The evaluations with ``key`` (``iteration`` or ``train_time``) at most ``limit``: a run of that budget."""
    return [e for e in evals if e[key] <= limit + 1e-9]


def budget_time(base_evals: list[dict], n: int, key: str = "train_time") -> float:
    """T_N: the baseline's training time at iteration ``n`` (NaN where the run has no evaluation there); ``key``
    ``steady_time`` reads it on the steady clock (:func:`runs_by_method`)."""
    return next((e[key] for e in base_evals if e["iteration"] == n), math.nan)


def steady_seconds_per_iteration(evals: list[dict]) -> float:
    """A run's steady cost of one iteration (s): the median over its evaluation intervals of Δtrain_time ÷
    Δiteration, so load on the machine during less than half of the run does not move it. NaN without an interval
    that holds an iteration."""
    return _median([(b["train_time"] - a["train_time"]) / (b["iteration"] - a["iteration"])
                    for a, b in zip(evals, evals[1:]) if b["iteration"] > a["iteration"]])


def first_passage_ratio(run: list[dict], ref: list[dict], smooth: int, key: str = "train_time") -> float:
    """The run's first passage to the reference's final reward over the reference's own first passage to it, both
    curves (already cut at their budgets) averaged over ``smooth`` evaluations first; ``key`` is the clock
    (``train_time``, or ``iteration`` for what an iteration teaches). NaN where the run never gets there within its
    budget, or where the reference never rose above its start (first passage 0)."""
    r, b = h.smooth_evals(run, smooth), h.smooth_evals(ref, smooth)
    target = b[-1]["eval_reward"]
    t_ref = h.time_to_reach(b, target, key)
    if not t_ref > 0:
        return math.nan
    return h.time_to_reach(r, target, key) / t_ref


def is_tree(method: str) -> bool:
    """TreeGRPO or one of its variants (``tree_*``), whose ratios the issue's goals apply to."""
    return method == "tree" or method.startswith("tree_")


def summary(by_seed: dict[int, float], goal: float | None = None) -> dict:
    """Mean ± std over the seeds that reached the target, how many did, the worst seed, and how many met ``goal``
    (a seed that never reached the target does not meet it)."""
    m, s, n = h.mean_std(list(by_seed.values()))
    vals = [v for v in by_seed.values() if not math.isnan(v)]
    out = {"mean": m, "std": s, "reached": f"{n}/{len(by_seed)}", "max": max(vals) if vals else math.nan,
           "by_seed": by_seed}
    if goal is not None:
        out["goal"] = goal
        out["met_goal"] = f"{sum(v <= goal for v in vals)}/{len(by_seed)}"
    return out


def runs_by_method(records: list[dict]) -> dict[str, dict[int, list[dict]]]:
    """{method: {seed: evaluations}} from the records, each evaluation also on the samples clock (``samples``: leaves
    scored so far; records from before ``leaves_per_iter`` was kept sampled 192 per iteration) and on the steady
    clock (``steady_time``: iterations so far × the run's :func:`steady_seconds_per_iteration`, the training time
    the run would have taken at its steady speed throughout)."""
    runs: dict[str, dict[int, list[dict]]] = {}
    for r in records:
        per = r.get("leaves_per_iter", h.LEAVES_PER_ITER)
        spi = steady_seconds_per_iteration(r["evals"])
        runs.setdefault(r["method"], {})[r["seed"]] = [dict(e, samples=e["iteration"] * per,
                                                            steady_time=e["iteration"] * spi) for e in r["evals"]]
    return runs


def tables(records: list[dict], budgets: tuple[int, ...] = BUDGETS, smooth: int = SMOOTH) -> dict:
    """{N: {reference: {method: {"time": summary, "iterations": summary}}}} plus each budget's T_N per seed, from the
    runs' records (one per method and seed, as :func:`run` leaves them)."""
    runs = runs_by_method(records)
    base = runs[BASELINE]
    out = {}
    for n in budgets:
        t_n = {seed: budget_time(ev, n) for seed, ev in base.items()}
        cut_runs = {m: {seed: (cut(ev, "iteration", n) if m == BASELINE else cut(ev, "train_time", t_n[seed]))
                        for seed, ev in by.items() if not math.isnan(t_n.get(seed, math.nan))}
                    for m, by in runs.items()}
        per_ref = {}
        for ref in REFERENCES:
            if ref not in cut_runs:
                continue
            row = {}
            for m, by in cut_runs.items():
                if m == ref:
                    continue
                seeds = sorted(set(by) & set(cut_runs[ref]))
                row[m] = {clock: summary({s: first_passage_ratio(by[s], cut_runs[ref][s], smooth, key)
                                          for s in seeds}, GOALS.get(ref) if is_tree(m) and clock == "time" else None)
                          for clock, key in (("time", "train_time"), ("iterations", "iteration"), ("samples", "samples"))}
                row[m]["final_reward"] = h.mean_std([h.smooth_evals(by[s], smooth)[-1]["eval_reward"] for s in seeds])
            per_ref[ref] = row
        steady_ratios(runs, n, smooth, per_ref)
        out[str(n)] = {"T_N_s": t_n, "references": per_ref,
                       "final_reward": {m: h.mean_std([h.smooth_evals(ev, smooth)[-1]["eval_reward"]
                                                       for ev in by.values()]) for m, by in cut_runs.items()}}
    return out


def steady_ratios(runs: dict[str, dict[int, list[dict]]], n: int, smooth: int, per_ref: dict) -> None:
    """Add the time ratio on the steady clock (``steady``) to each row of ``per_ref`` (one budget's table): the
    whole protocol again with every run's training time replaced by its iterations × its steady cost of one, the
    budget being the baseline's N iterations at its steady speed (every run cut there). Per seed it is the
    iteration ratio × the steady cost ratio: the wall-clock ratio without the load the machine carried while a run
    was young (a short budget's target is reached then). Reported beside the wall-clock ratio, never instead."""
    t_n = {seed: budget_time(ev, n, "steady_time") for seed, ev in runs[BASELINE].items()}
    cut_runs = {m: {seed: cut(ev, "steady_time", t_n[seed]) for seed, ev in by.items()
                    if not math.isnan(t_n.get(seed, math.nan))} for m, by in runs.items()}
    for ref, row in per_ref.items():
        for m in row:
            seeds = sorted(set(cut_runs[m]) & set(cut_runs[ref]))
            row[m]["steady"] = summary({s: first_passage_ratio(cut_runs[m][s], cut_runs[ref][s], smooth, "steady_time")
                                        for s in seeds}, GOALS.get(ref) if is_tree(m) else None)


#: reward levels of the equal-reward view, 0.02 apart: about 7x the evaluation noise of a 3-point average on the demo
#: (0.003, from the baseline curves' second differences), so consecutive levels are passed at distinct times
LEVEL_STEP = 0.02


def _median(xs: list[float]) -> float:
    """The median, NaN (never reached) counted as +inf; inf where half or more are."""
    xs = sorted(math.inf if math.isnan(x) else x for x in xs)
    if not xs:
        return math.nan
    h = len(xs) // 2
    return xs[h] if len(xs) % 2 else (xs[h - 1] + xs[h]) / 2


def reward_levels(base_runs: dict[int, list[dict]], smooth: int, step: float = LEVEL_STEP) -> list[float]:
    """The multiples of ``step`` above the base model's reward (the baseline's first evaluation) up to the highest
    that more than half of the baseline's seeds reach on their whole (smoothed) runs (its median passage is then
    finite)."""
    starts = [ev[0]["eval_reward"] for ev in base_runs.values()]
    best = sorted((max(e["eval_reward"] for e in h.smooth_evals(ev, smooth)) for ev in base_runs.values()),
                  reverse=True)
    top = best[len(best) // 2]                  # reached by more than half of the seeds
    k = math.floor(max(starts) / step + 1e-9) + 1
    levels = []
    while k * step <= top + 1e-9:
        levels.append(round(k * step, 6))
        k += 1
    return levels


def level_table(records: list[dict], n_max: int, smooth: int = SMOOTH, step: float = LEVEL_STEP) -> dict:
    """The ratio at equal reward, free of where a budget cuts the curves: each run whole (the baseline's ``n_max``
    iterations, the others the time those took), each reward level L of :func:`reward_levels`, paired per seed,
    the method's first passage to L over the baseline's (summary, with the goal for tree variants), and the median
    first passage in baseline iterations (training time / the seed's baseline time per iteration). Medians count a
    seed that never reached a level as infinitely slow (the median is then of all seeds, not of the quick ones)."""
    runs = runs_by_method(records)
    base = runs[BASELINE]
    unit = {s: budget_time(ev, n_max) / n_max for s, ev in base.items()}
    levels = reward_levels(base, smooth, step)
    passage = {m: {s: [h.time_to_reach(h.smooth_evals(ev, smooth), lv) / unit[s] for lv in levels]
                   for s, ev in by.items() if s in unit and unit[s] > 0}
               for m, by in runs.items()}
    out = {"levels": levels, "step": step, "baseline_iterations": [
        _median([p[i] for p in passage[BASELINE].values()]) for i in range(len(levels))], "methods": {}}
    for m, by in passage.items():
        if m == BASELINE:
            continue
        seeds = sorted(set(by) & set(passage[BASELINE]))
        out["methods"][m] = {
            "ratio": [summary({s: by[s][i] / passage[BASELINE][s][i] for s in seeds},
                              GOALS[BASELINE] if is_tree(m) else None) for i in range(len(levels))],
            "iterations": [_median([by[s][i] for s in seeds]) for i in range(len(levels))]}
    return out


def print_levels(lv: dict) -> None:
    if not lv["levels"]:
        print(f"\nat equal reward: the baseline's median run rose less than {lv['step']} above the base model")
        return
    print("\nat equal reward (whole runs; median over seeds of the paired first-passage ratio, ÷ " + BASELINE + "):")
    print(f"  {'level':>18}: " + " ".join(f"{x:5.2f}" for x in lv["levels"]))
    print(f"  {BASELINE + ' it.':>18}: " + " ".join(f"{x:5.1f}" for x in lv["baseline_iterations"]))
    for m, r in lv["methods"].items():
        print(f"  {m:>18}: " + " ".join(f"{_median(list(s['by_seed'].values())):5.2f}" for s in r["ratio"]))
        if "goal" in r["ratio"][0]:
            print(f"  {'≤ ' + str(GOALS[BASELINE]):>18}: " + " ".join(f"{s['met_goal']:>5}" for s in r["ratio"]))


PHASES = ("t_sample", "t_update", "t_score")   # t_score: the decode and the reward together


def cost_split(records: list[dict]) -> dict:
    """What an iteration of each method costs, in iterations of the baseline, phase by phase, paired per seed:
    {method: {"t_iter" | phase: summary}} from the records' mean phase times (``split``; ``t_update`` holds the
    advantage assignment too). At per-sample parity (a method that needs as many iterations as the baseline) the
    time ratio *is* the ``t_iter`` ratio; its parts say which phase a cheaper method would have to shrink."""
    split = {(r["method"], r["seed"]): dict(r["split"], t_score=r["split"]["t_decode"] + r["split"]["t_reward"])
             for r in records}
    out = {}
    for m in [BASELINE] + sorted({m for m, _ in split} - {BASELINE}):
        seeds = sorted(s for mm, s in split if mm == m and (BASELINE, s) in split)
        out[m] = {k: summary({s: split[(m, s)][k] / split[(BASELINE, s)]["t_iter"] for s in seeds})
                  for k in ("t_iter",) + PHASES}
    return out


def print_cost_split(cost: dict) -> None:
    print("\nan iteration in the baseline's iterations (paired per seed; at per-sample parity the time ratio is this):")
    for m, c in cost.items():
        parts = " + ".join(f"{k[2:]} {c[k]['mean']:.2f}" for k in PHASES)
        print(f"  {m:>18}: {c['t_iter']['mean']:.2f} ± {c['t_iter']['std']:.2f} = {parts} (+ the rest)")


def print_tables(res: dict) -> None:
    for n, t in res["budgets"].items():
        tn = [v for v in t["T_N_s"].values() if not math.isnan(v)]
        print(f"\nbudget N = {n} baseline iterations (T_N {min(tn):.1f}-{max(tn):.1f} s of training); final rewards: "
              + ", ".join(f"{m} {v[0]:.3f}" for m, v in t["final_reward"].items()))
        for ref, row in t["references"].items():
            for m, r in row.items():
                tt, it, sa, st = r["time"], r["iterations"], r.get("samples"), r.get("steady")
                seeds = ", ".join("–" if math.isnan(v) else f"{v:.2f}" for v in tt["by_seed"].values())
                goal = f"; goal ≤ {tt['goal']}: {tt['met_goal']}" if "goal" in tt else ""
                print(f"  {m:>12} ÷ {ref:<12} time {tt['mean']:.2f} ± {tt['std']:.2f} (max {tt['max']:.2f}, reached "
                      f"{tt['reached']}{goal})  iterations {it['mean']:.2f} ± {it['std']:.2f}"
                      + (f"  samples {sa['mean']:.2f}" if sa else "") + f"  [{seeds}]")
                if st:
                    seeds = ", ".join("–" if math.isnan(v) else f"{v:.2f}" for v in st["by_seed"].values())
                    goal = f"; ≤ {st['goal']}: {st['met_goal']}" if "goal" in st else ""
                    print(f"  {'':>12}   {'':<12} steady clock {st['mean']:.2f} ± {st['std']:.2f} (max "
                          f"{st['max']:.2f}, reached {st['reached']}{goal})  [{seeds}]")


def pool_records(parts: list[dict], paths: list[str]) -> list[dict]:
    """The records of several budget.json files, refusing a (method, seed) run that two of them hold: each seed is
    paired with its own run's baseline, so a seed run twice would pair one run's method with another's baseline."""
    seen: dict[tuple[str, int], str] = {}
    for part, path in zip(parts, paths):
        for r in part["records"]:
            key = (r["method"], r["seed"])
            if key in seen:
                raise SystemExit(f"--merge: {path} and {seen[key]} both hold {key[0]} seed {key[1]}; each seed is "
                                 "paired with its own run's baseline, so pool files whose seeds do not overlap "
                                 "(--first-seed) and read a repeated seed with --report on its own file")
            seen[key] = path
    return [r for part in parts for r in part["records"]]


# ------------------------------------------------------------------------------------------------ running them
def schedule(jobs: list[tuple[str, tuple[str, ...], Callable[[], dict]]], n_par: int) -> dict[str, dict]:
    """Run ``(key, dependencies, fn)`` jobs ``n_par`` at a time: each worker takes the first job in the list whose
    dependencies are done (so the list's order is the schedule). Returns {key: fn()}; the first error is raised."""
    pending, done, errors = list(jobs), {}, []
    cond = threading.Condition()

    def worker():
        while True:
            with cond:
                while True:
                    if errors or not pending:
                        return
                    ready = next((j for j in pending if all(d in done for d in j[1])), None)
                    if ready:
                        pending.remove(ready)
                        break
                    cond.wait()
            try:
                value = ready[2]()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                with cond:
                    errors.append(e)
                    cond.notify_all()
                return
            with cond:
                done[ready[0]] = value
                cond.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(n_par)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return done


def run(seeds: list[int], methods: dict[str, dict], n_max: int, out_dir: str, n_par: int) -> list[dict]:
    """Every seed's baseline for ``n_max`` iterations, then each other method ({name: its changes}) for the training
    time it took."""
    t0 = time.time()
    base: dict[int, dict] = {}

    def log(rec):
        print(f"[{time.time() - t0:6.0f}s] {rec['method']} seed {rec['seed']}: {rec['iterations']} it in "
              f"{rec['train_time']:.1f} s, final {rec['evals'][-1]['eval_reward']:.3f}", flush=True)
        return rec

    def baseline_job(seed):
        def fn():
            rec = h.run_one(h.DEMO, BASELINE, h.DEMO.overrides(BASELINE), seed, None,
                            os.path.join(out_dir, "runs", f"{BASELINE}_{seed}"), iterations=n_max, eval_every=1)
            base[seed] = rec
            return log(rec)
        return fn

    def method_job(name, seed):
        def fn():
            t = base[seed]["train_time"]
            return log(h.run_one(h.DEMO, name, methods[name], seed, t, os.path.join(out_dir, "runs", f"{name}_{seed}"),
                                 eval_every_s=t / n_max))
        return fn

    names = tuple(methods)
    jobs = []
    for i, seed in enumerate(seeds):
        jobs.append((f"{BASELINE}/{seed}", (), baseline_job(seed)))
        if i:   # the previous seed's methods beside this seed's baseline
            prev = seeds[i - 1]
            rot = names[prev % len(names):] + names[:prev % len(names)]
            jobs += [(f"{m}/{prev}", (f"{BASELINE}/{prev}",), method_job(m, prev)) for m in rot]
    last = seeds[-1]
    rot = names[last % len(names):] + names[:last % len(names)]
    jobs += [(f"{m}/{last}", (f"{BASELINE}/{last}",), method_job(m, last)) for m in rot]
    done = schedule(jobs, n_par)
    return [done[k] for k, _, _ in jobs]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="baseline iterations to read the ratios "
                    "at; the baseline trains the largest")
    ap.add_argument("--methods", default=",".join(METHODS), help="what trains beside the baseline: harness.py's "
                    "registered names, or NAME=JSON (a new configuration's changes over the demo protocol)")
    ap.add_argument("--smooth", type=int, default=SMOOTH, help="average each curve over this many consecutive "
                    "evaluations after cutting it at the budget (1: the raw curve)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="runs at a time, one thread each")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "budget"))
    ap.add_argument("--report", metavar="BUDGET_JSON", help="read the tables again from an earlier budget.json")
    ap.add_argument("--merge", nargs="+", metavar="BUDGET_JSON", help="pool the seeds of earlier budget.json files")
    ns = ap.parse_args(argv)
    try:
        budgets = tuple(sorted({int(x) for x in ns.budgets.split(",")}))
    except ValueError:
        raise SystemExit(f"--budgets {ns.budgets!r}: whole numbers of baseline iterations, e.g. 20,40,80") from None
    if not budgets or budgets[0] < 2:
        raise SystemExit(f"--budgets {ns.budgets!r}: at least 2 baseline iterations each")
    methods = dict(h.DEMO.resolve(m) for m in h.split_items(ns.methods))
    if BASELINE in methods:
        raise SystemExit(f"--methods: {BASELINE} is the baseline every run is read against; name what trains beside "
                         f"it ({BASELINE}_p12 is the baseline's own run at 12 prompts)")
    from treegrpo.io import atomic_write_json

    if ns.report or ns.merge:
        paths = ns.merge or [ns.report]
        parts = [json.load(open(p, encoding="utf-8")) for p in paths]
        records = pool_records(parts, paths)
        budgets = tuple(b for b in budgets if b <= min(p["n_max"] for p in parts))
        n_max = min(p["n_max"] for p in parts)
    else:
        n_max = budgets[-1]
        records = run(list(range(ns.first_seed, ns.first_seed + ns.seeds)), methods, n_max, ns.out, ns.jobs)
    res = {"budgets": tables(records, budgets, ns.smooth), "cost": cost_split(records),
           "levels": level_table(records, n_max, ns.smooth), "smooth": ns.smooth,
           "n_max": n_max,
           "protocol": "work budget: the baseline trains N iterations, every other method the time that took",
           "records": records,
           "provenance": h.provenance({"base": h.DEMO.base, BASELINE: h.DEMO.overrides(BASELINE), **methods})}
    print_tables(res)
    print_levels(res["levels"])
    print_cost_split(res["cost"])
    if not ns.report:
        os.makedirs(ns.out, exist_ok=True)
        atomic_write_json(os.path.join(ns.out, "budget.json"), h.json_ready(res))
        print(f"wrote {os.path.join(ns.out, 'budget.json')}")


if __name__ == "__main__":
    main()
