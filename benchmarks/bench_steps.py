"""How TreeGRPO's advantage changes with the number of denoising steps T (issue 22, item 4).

Two measurements, both on the demo model (one thread, 24 prompts per iteration, the protocol of bench_methods.py):

* ``--cost``: the time per iteration of each method at T = 10, 20, 40 and for both tails (``harness.TAILS``),
  next to the NFE the closed form predicts (``treegrpo.tree.expected_nfe``) and the NFE the run counted. The runs
  are short (``--iterations``, the first one not timed) and go one at a time.
* ``--collect DIR ...``: the time-to-reward runs that ``bench_methods.py --steps T --only ...`` wrote (one folder
  per T), paired per seed, in one table with the cost ratios.

    python benchmarks/bench_steps.py --cost [--steps 10,20,40] [--iterations 3] [--out benchmarks/results/steps]
    python benchmarks/bench_methods.py --steps 20 --only tree --only traj_window --only awm --seeds 4 \\
        --out benchmarks/results/steps/T20
    python benchmarks/bench_steps.py --collect benchmarks/results/steps/T10 benchmarks/results/steps/T20 ...

Writes ``cost.json`` / ``steps.json`` in ``--out`` and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
import harness as h
from treegrpo.run import run_training

HERE = os.path.dirname(os.path.abspath(__file__))

COST_METHODS = ("tree", "traj_window", "traj_all", "awm")


def method_config(name: str, steps: int, tail: str, prompts: int):
    """The TrainConfig ``bench_methods.py --steps steps --tail tail`` trains ``name`` with."""
    from treegrpo.config import TrainConfig

    proto = h.protocol(steps=steps, tail=tail)
    d = proto.config_dict(proto.overrides(name))
    d.update(prompts_per_iter=prompts, eval_every=0, checkpoint_every=0)
    return TrainConfig.from_dict(d)


def predicted_nfe(cfg) -> int:
    """Denoiser calls per iteration by the closed form: trees × ``expected_nfe``."""
    from treegrpo.tree import expected_nfe
    return cfg.prompts_per_iter * cfg.trees_per_prompt * expected_nfe(cfg.tree, guidance=cfg.guidance_scale)


def trained_parents(cfg) -> int:
    """Denoiser forwards (with backward) per prompt in a GRPO update: the window's parents; the matching losses
    train ``matching_timesteps`` re-noised copies of every leaf."""
    t = cfg.tree
    if cfg.optim.loss != "grpo":
        return t.leaves * cfg.optim.matching_timesteps
    if t.method == "trajectory":
        return 1 + t.leaves * (t.window_width - 1)
    return sum(t.branch ** j for j in range(t.window_width))


def measure_cost(name: str, steps: int, tail: str, iterations: int, prompts: int, out: str) -> dict:
    import torch


    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one core per run, as bench_methods' runs (restored: callers may share the process)
    try:
        cfg = method_config(name, steps, tail, prompts)
        cfg = type(cfg).from_dict(dict(cfg.to_dict(), iterations=iterations, output_dir=out, run_name=name))
        tr, _ = run_training(cfg, progress=False, write_lora=False)
    finally:
        torch.set_num_threads(threads)
    timed = tr.history[1:] or tr.history
    mean = {k: sum(h[k] for h in timed) / len(timed) for k in ("t_iter", "t_sample", "t_update")}
    return {"method": name, "steps": steps, "tail": tail, "window_start": cfg.tree.window_start,
            "nfe": tr.history[0]["nfe"], "nfe_predicted": predicted_nfe(cfg),
            "parents_per_prompt": trained_parents(cfg), **mean}


def cost_table(recs: list[dict]) -> str:
    rows = ["| T | tail | method | NFE / iteration (closed form) | parents trained / prompt | s / iteration (sample / "
            "update) | ÷ window GRPO: NFE | ÷ window GRPO: time |", "|---|---|---|---|---|---|---|---|"]
    for r in recs:
        base = next(b for b in recs if (b["steps"], b["tail"], b["method"]) == (r["steps"], r["tail"], "traj_window"))
        rows.append(f"| {r['steps']} | {r['tail']} | {r['method']} | {r['nfe']} ({r['nfe_predicted']}) | "
                    f"{r['parents_per_prompt']} | {r['t_iter']:.2f} ({r['t_sample']:.2f} / {r['t_update']:.2f}) | "
                    f"{r['nfe'] / base['nfe']:.2f} | {r['t_iter'] / base['t_iter']:.2f} |")
    return "\n".join(rows)


def fmt(ms, digits: int = 2) -> str:
    m, s, n = ms
    return "–" if n == 0 or math.isnan(m) else f"{m:.{digits}f} ± {s:.{digits}f}"


def collect(dirs: list[str], cost: dict | None, methods: tuple = ()) -> dict:
    """One row per (T, method) from each folder's explore.json (a ``--only`` run) or methods.json (a full run):
    final reward, s/iteration and its ratio to the window baseline, the time to the baseline's final reward paired
    per seed, and the closed-form NFE ratio. ``methods``: only these (default: all)."""
    from bench_methods import report

    rows = []
    for d in dirs:
        path = os.path.join(d, "explore.json")
        data = json.load(open(path if os.path.exists(path) else os.path.join(d, "methods.json"), encoding="utf-8"))
        recs = [r for r in data["records"] if not methods or r["method"] in methods]
        res = report(recs, baseline="traj_window", smooth=data.get("smooth", 1))["methods"]
        steps, tail = data.get("steps", 10), data.get("tail", "fixed")
        for name, m in res.items():
            c = next((r for r in (cost or {}).get("records", []) if (r["steps"], r["tail"], r["method"])
                      == (steps, tail, name)), None)
            cb = next((r for r in (cost or {}).get("records", []) if (r["steps"], r["tail"], r["method"])
                       == (steps, tail, "traj_window")), None)
            rows.append({"steps": steps, "tail": tail, "method": name, "seeds": len([r for r in recs
                                                                                     if r["method"] == name]),
                         "final_reward": m["final_reward"], "iteration_time_ratio": m["iteration_time_ratio"],
                         "nfe_ratio_closed_form": c["nfe_predicted"] / cb["nfe_predicted"] if c and cb else None,
                         "time_to_baseline_paired": m["time_to_baseline_paired"],
                         "reached": m["reached_baseline_paired"], "it90": m["it90"]})
    return {"rows": rows}


def steps_table(rows: list[dict]) -> str:
    out = ["| T | method | final reward | s/iteration ÷ window GRPO (NFE ratio, closed form) | time to window GRPO's "
           "final reward, paired per seed | seeds reaching it | iterations to 90 % of its gain |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        nfe = f" ({r['nfe_ratio_closed_form']:.2f})" if r["nfe_ratio_closed_form"] else ""
        out.append(f"| {r['steps']} | {r['method']} | {fmt(r['final_reward'], 3)} | {r['iteration_time_ratio']:.2f}{nfe} | "
                   f"{fmt(r['time_to_baseline_paired'])} | {r['reached']} | {fmt(r['it90'], 1)} |")
    return "\n".join(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cost", action="store_true", help="time a few iterations of each method at each T and tail")
    ap.add_argument("--steps", default="10,20,40")
    ap.add_argument("--tails", default="fixed,schedule")
    ap.add_argument("--methods", help=f"comma-separated (--cost: default {','.join(COST_METHODS)}; --collect: "
                    "default all)")
    ap.add_argument("--iterations", type=int, default=3, help="--cost: iterations per run (the first is not timed)")
    ap.add_argument("--prompts", type=int, default=24, help="--cost: prompts per iteration (the protocol's 24)")
    ap.add_argument("--collect", nargs="+", metavar="DIR", help="bench_methods.py --steps output folders")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "steps"))
    ns = ap.parse_args(argv)
    from treegrpo.io import atomic_write_json

    os.makedirs(ns.out, exist_ok=True)
    result: dict = {}
    cost_path = os.path.join(ns.out, "cost.json")
    if ns.cost:
        import tempfile
        recs, t0 = [], time.time()
        for steps in (int(x) for x in ns.steps.split(",")):
            for tail in ns.tails.split(","):
                for name in (ns.methods or ",".join(COST_METHODS)).split(","):
                    with tempfile.TemporaryDirectory() as tmp:
                        r = measure_cost(name, steps, tail, ns.iterations, ns.prompts, tmp)
                    recs.append(r)
                    print(f"[{time.time() - t0:5.0f}s] T={steps} {tail} {name}: {r['t_iter']:.2f} s/it, "
                          f"NFE {r['nfe']} (closed form {r['nfe_predicted']})", flush=True)
        result = {"records": recs, "iterations": ns.iterations, "prompts": ns.prompts}
        atomic_write_json(cost_path, result)
        print(cost_table(recs))
    if ns.collect:
        cost = json.load(open(cost_path, encoding="utf-8")) if os.path.exists(cost_path) else None
        res = collect(ns.collect, cost, tuple(ns.methods.split(",")) if ns.methods else ())
        atomic_write_json(os.path.join(ns.out, "steps.json"), h.json_ready(res))
        print(steps_table(res["rows"]))
        result["collected"] = res
    return result


if __name__ == "__main__":
    main()
