"""What a row of each phase costs (issue 35): seconds per sampling row and per update row, on the demo, one thread.

A sampling row is one sample through one denoiser call (the NFE); an update row is one parent trained: its forward
with the LoRA's gradient, the backward, and the reference forward of the KL term. An iteration of any GRPO method
costs ``sampling rows × s + update rows × u`` (decode and reward are 1 % of it on the demo), so the two unit costs
and each method's row counts give the floor of the time ratio: what it would be if sampling cost nothing.

Each method trains ``--iterations`` iterations from seed 0 (no evaluation), the first two dropped (warm-up); the
medians over the rest of seconds per row and of rows per iteration are reported, ``--repeats`` times interleaved.

    python benchmarks/bench_rows.py [--methods tree_tail1_p12,tree_p12,traj_window] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import harness as h
from treegrpo.run import run_training

HERE = os.path.dirname(os.path.abspath(__file__))

WARMUP = 2   # first iterations dropped (allocation, first-call overheads)


def measure(name: str, iterations: int, out_dir: str) -> dict:
    """Median per-row costs (s) and rows per iteration of ``name`` (a harness.py name) over ``iterations``."""
    from treegrpo.config import TrainConfig

    d = h.DEMO.config_dict(h.DEMO.overrides(name))
    d.update(seed=0, iterations=iterations, eval_every=0, checkpoint_every=0, output_dir=out_dir, run_name=name,
             time_budget_s=0.0)
    d["signals"] = {**d.get("signals", {}), "kl_estimate": False}
    tr, _ = run_training(TrainConfig.from_dict(d), progress=False, write_lora=False)
    hist = tr.history[WARMUP:]
    med = statistics.median
    return {"s_per_sample_row": med(x["t_sample"] / x["nfe"] for x in hist),
            "s_per_update_row": med(x["t_update"] / max(1, x["forwards"]) for x in hist),
            "sample_rows": med(x["nfe"] for x in hist), "update_rows": med(x["forwards"] for x in hist),
            "t_sample": med(x["t_sample"] for x in hist), "t_update": med(x["t_update"] for x in hist),
            "t_iter": med(x["t_iter"] for x in hist), "prompts": tr.cfg.prompts_per_iter}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="tree_tail1_p12,tree_p12,traj_window")
    ap.add_argument("--baseline", default="traj_window", help="the method the floors are read against")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tree-iterations", type=int, default=14)
    ap.add_argument("--baseline-iterations", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "rows.json"))
    ns = ap.parse_args(argv)
    if min(ns.tree_iterations, ns.baseline_iterations) <= WARMUP or ns.repeats < 1:
        raise SystemExit(f"bench_rows: give every method more than {WARMUP} iterations (the first {WARMUP} are "
                         "dropped) and at least one repeat")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one core, as bench_budget's runs
    try:
        methods = ns.methods.split(",")
        if ns.baseline not in methods:
            methods.append(ns.baseline)
        runs: dict[str, list[dict]] = {m: [] for m in methods}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(ns.repeats):
                for m in methods:
                    it = ns.baseline_iterations if m == ns.baseline else ns.tree_iterations
                    runs[m].append(measure(m, it, os.path.join(tmp, f"{m}_{r}")))
                    print(m, json.dumps({k: round(v, 5) for k, v in runs[m][-1].items()}), flush=True)
    finally:
        torch.set_num_threads(threads)
    avg = {m: {k: statistics.mean(x[k] for x in rs) for k in rs[0]} for m, rs in runs.items()}
    base = avg[ns.baseline]
    print(f"\n| method | s per sampling row | s per update row | sampling / update rows per prompt | iteration ÷ "
          f"{ns.baseline}'s | update alone ÷ it (sampling free) |\n|---|---|---|---|---|---|")
    for m, a in avg.items():
        per_prompt = f"{a['sample_rows'] / a['prompts']:.1f} / {a['update_rows'] / a['prompts']:.1f}"
        print(f"| {m} | {a['s_per_sample_row'] * 1e3:.2f} ms | {a['s_per_update_row'] * 1e3:.2f} ms | {per_prompt} | "
              f"{a['t_iter'] / base['t_iter']:.3f} | {a['t_update'] / base['t_iter']:.3f} |")
    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    res = {"runs": runs, "mean": avg, "baseline": ns.baseline}
    with open(ns.out, "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
