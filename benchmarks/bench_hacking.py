"""Reward hacking on the embedded demo, and the KL weight that holds it back (issue: reward hacking).

Long demo runs, hot enough for hacking to appear (by default lr 6e-3 for 100 iterations, where the tree collapsed
without KL), for each ``optim.kl_beta`` and seed. Every run evaluates every ``--eval-every`` iterations with the
demo's held-out judge and the hacking signals (``treegrpo.hacking``); per run it reports, at the end and at the
best checkpoint (the evaluation with the best judge score):

- the training reward (the demo classifier) and the held-out judge (an independent classifier, never trained on);
- diversity and high-frequency energy relative to the base model (the run's first evaluation), and the KL estimate.

Then mean ± std over seeds per ``kl_beta``, and the value with the best final held-out score. Budgets are in
iterations (work), so a slower machine measures the same thing.

Usage: ``python benchmarks/bench_hacking.py [--kl 0,1e-3,1e-2,1e-1] [--seeds 3] [--iterations 100] [--lr 6e-3]
[--out benchmarks/results/hacking.json] [--markdown]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from treegrpo.io import atomic_write_json  # noqa: E402
from treegrpo.run import run_training  # noqa: E402

METRICS = ("eval_reward", "eval_judge", "diversity_ratio", "hf_ratio", "eval_kl")


def config(kl: float, seed: int, iterations: int, lr: float, eval_every: int, out: str):
    from treegrpo import cli
    from treegrpo.config import TrainConfig

    d = cli.demo_config_dict()
    d.update(iterations=iterations, seed=seed, eval_every=eval_every, output_dir=out, run_name="hacking",
             checkpoint_every=0)
    d["optim"] = dict(d["optim"], lr=lr, kl_beta=kl)
    return TrainConfig.from_dict(d)


def point(e: dict, base: dict) -> dict:
    return {"iteration": e["iteration"], "eval_reward": e["eval_reward"], "eval_judge": e["eval_judge"],
            "diversity_ratio": e["eval_diversity"] / base["eval_diversity"],
            "hf_ratio": e["eval_hf_energy"] / base["eval_hf_energy"], "eval_kl": e.get("eval_kl", 0.0)}


def run_one(kl: float, seed: int, args) -> dict:
    from treegrpo.hacking import best_index

    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        trainer, _ = run_training(config(kl, seed, args.iterations, args.lr, args.eval_every, out),
                                      progress=False, write_lora=False)
        seconds = time.perf_counter() - t0
    ev = trainer.evals
    base = ev[0]
    return {"kl_beta": kl, "seed": seed, "seconds": seconds, "base": point(base, base),
            "final": point(ev[-1], base), "best": point(ev[best_index(ev)], base),
            "curve": [point(e, base) for e in ev], "warnings": [w for e in ev for w in e.get("warnings", [])]}


def aggregate(runs: list[dict]) -> dict:
    out = {}
    for kl in sorted({r["kl_beta"] for r in runs}):
        rs = [r for r in runs if r["kl_beta"] == kl]
        row = {"seeds": len(rs)}
        for where in ("final", "best"):
            for m in METRICS:
                vals = [r[where][m] for r in rs]
                row[f"{where}_{m}"] = statistics.mean(vals)
                row[f"{where}_{m}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        row["base_eval_reward"] = statistics.mean(r["base"]["eval_reward"] for r in rs)
        row["base_eval_judge"] = statistics.mean(r["base"]["eval_judge"] for r in rs)
        row["runs_warned"] = sum(1 for r in rs if r["warnings"])
        out[str(kl)] = row
    return out


def markdown(res: dict) -> str:
    a = res["by_kl"]
    lines = [f"Demo, lr {res['lr']}, {res['iterations']} iterations, evaluation every {res['eval_every']}, "
             f"{res['seeds']} seeds (mean ± std); ratios are to the base model; best = the evaluation with the best "
             "held-out judge score.", "",
             "| kl_beta | reward (end) | judge (end) | diversity (end) | HF energy (end) | KL (end) | "
             "judge (best) | reward (best) | HF energy (best) | runs warned |", "|---|---|---|---|---|---|---|---|---|---|"]

    def f(row, key, fmt="{:.3f}"):
        return (fmt + " ± " + fmt).format(row[key], row[key + "_std"])

    for kl, row in a.items():
        lines.append(f"| {kl} | {f(row, 'final_eval_reward')} | {f(row, 'final_eval_judge')} | "
                     f"{f(row, 'final_diversity_ratio', '{:.2f}')} | {f(row, 'final_hf_ratio', '{:.2f}')} | "
                     f"{f(row, 'final_eval_kl', '{:.4f}')} | {f(row, 'best_eval_judge')} | "
                     f"{f(row, 'best_eval_reward')} | {f(row, 'best_hf_ratio', '{:.2f}')} | "
                     f"{row['runs_warned']}/{row['seeds']} |")
    base = next(iter(a.values()))
    lines += ["", f"Base model: reward {base['base_eval_reward']:.3f}, judge {base['base_eval_judge']:.3f}. "
              f"Best final held-out score: kl_beta = {res['best_kl_beta']}."]
    return "\n".join(lines)


def plot(res: dict, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for kl in res["by_kl"]:
        runs = [r for r in res["runs"] if str(r["kl_beta"]) == kl]
        its = [p["iteration"] for p in runs[0]["curve"]]
        for ax, key in zip(axes, ("eval_reward", "eval_judge", "hf_ratio")):
            mean = [statistics.mean(r["curve"][i][key] for r in runs) for i in range(len(its))]
            ax.plot(its, mean, marker=".", label=f"kl_beta {kl}")
    for ax, title in zip(axes, ("training reward (demo classifier)", "held-out judge", "HF energy / base")):
        ax.set_title(title, fontsize=9), ax.set_xlabel("iteration"), ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kl", default="0,1e-3,1e-2,1e-1")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--lr", type=float, default=6e-3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "hacking.json"))
    ap.add_argument("--plot", default=None, help="curves PNG (default: beside --out)")
    ap.add_argument("--markdown", action="store_true", help="print the table of an existing --out and exit")
    ap.add_argument("--merge", action="store_true", help="add these runs to an existing --out (same lr, iterations "
                    "and evaluation schedule), replacing runs of the same kl_beta and seed")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.load(open(args.out))))
        return {}
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(2)   # restored after: tests call main in-process
    try:
        kls = [float(k) for k in args.kl.split(",")]
        runs = []
        for seed in range(args.seeds):
            for kl in kls:
                r = run_one(kl, seed, args)
                runs.append(r)
                print(f"kl_beta {kl:g} seed {seed}: reward {r['base']['eval_reward']:.3f} -> {r['final']['eval_reward']:.3f}, "
                      f"judge {r['base']['eval_judge']:.3f} -> {r['final']['eval_judge']:.3f} (best "
                      f"{r['best']['eval_judge']:.3f} @ {r['best']['iteration']}), HF x{r['final']['hf_ratio']:.2f}, "
                      f"diversity x{r['final']['diversity_ratio']:.2f}, {r['seconds']:.0f} s", flush=True)
    finally:
        torch.set_num_threads(threads)
    if args.merge and os.path.exists(args.out):
        old = json.load(open(args.out))
        if (old["lr"], old["iterations"], old["eval_every"]) != (args.lr, args.iterations, args.eval_every):
            raise SystemExit(f"--merge: {args.out} was measured with other settings")
        new = {(r["kl_beta"], r["seed"]) for r in runs}
        runs = [r for r in old["runs"] if (r["kl_beta"], r["seed"]) not in new] + runs
    by_kl = aggregate(runs)
    best = max(by_kl, key=lambda k: by_kl[k]["final_eval_judge"])
    res = {"lr": args.lr, "iterations": args.iterations, "eval_every": args.eval_every,
           "seeds": min(row["seeds"] for row in by_kl.values()),
           "by_kl": by_kl, "best_kl_beta": float(best), "runs": runs}
    atomic_write_json(args.out, res)
    plot(res, args.plot or os.path.splitext(args.out)[0] + ".png")
    print(markdown(res))
    return res


if __name__ == "__main__":
    main()
