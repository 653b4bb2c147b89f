"""Core benchmarks on the embedded demo model (issue: core library).

Measures, in one process:
1. the tree sampler's NFE against the formula, for several tree shapes;
2. the sampler's wall time against the raw model forward time of the same NFE (same batch sizes,
   replayed on the bare model), the two run in turn in every round, medians over the rounds — the sampler's overhead;
3. ``treegrpo demo`` end to end (subprocess): wall time and peak RSS.

Usage: ``python benchmarks/bench_core.py [--skip-demo] [--repeat 21] [--out benchmarks/results/core.json]``
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from treegrpo.backends.demo import DemoPolicy
from treegrpo.config import TreeConfig
from treegrpo.io import atomic_write_json
from treegrpo.tree import expected_nfe, sample_trees


def paired_times(fns, repeat: int) -> list[list[float]]:
    """Seconds of each of ``fns`` over ``repeat`` rounds, the functions run one after another within a round, so the
    machine's state at any moment weighs on all of them alike (a best-of-N taken one function after the other is
    not: on a shared machine it moved the sampler's overhead between -29 % and +24 % from one run to the next)."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return times


def bench_sampler(policy: DemoPolicy, shapes, n_trees=8, repeat=21):
    """Per tree shape: the sampler's NFE against the formula, and its time against replaying the same batch sizes
    through the bare model, paired per round: overhead = median over rounds of sampler / bare − 1."""
    rows = []
    prompts = ["a red circle", "a blue square", "a green triangle", "a yellow cross"] * (n_trees // 4)
    cond = policy.encode_prompts(prompts)
    for (T, s, w, k) in shapes:
        cfg = TreeConfig(steps=T, window_start=s, window_width=w, branch=k)
        holder = {}

        def run():
            holder["tb"] = sample_trees(policy, prompts, cfg, cond=cond, generator=torch.Generator().manual_seed(0))

        with torch.no_grad():
            run()
            tb = holder["tb"]
            # replay the same sequence of batch sizes through the bare model (the cost floor)
            sizes = [x.shape[0] for x in tb.latents[:-1]]
            seq = [n_trees] * s + sizes + [tb.leaves.shape[0]] * (T - s - w)
            xs = {b: torch.randn(b, *policy.latent_shape()) for b in set(seq)}
            toks = {b: policy.encode_prompts((prompts * (b // n_trees + 1))[:b])["tokens"] for b in set(seq)}
            sig = {b: torch.full((b,), 0.5) for b in set(seq)}

            def raw():
                for b in seq:
                    policy.model(xs[b], sig[b], toks[b])

            t_sampler, t_raw = paired_times([run, raw], repeat)
        ratios = [a / b for a, b in zip(t_sampler, t_raw)]
        rows.append({"T": T, "s": s, "w": w, "k": k, "trees": n_trees, "nfe": tb.nfe,
                     "nfe_formula": n_trees * expected_nfe(cfg), "calls": tb.calls, "rounds": repeat,
                     "sampler_s": statistics.median(t_sampler), "raw_forward_s": statistics.median(t_raw),
                     "overhead": statistics.median(ratios) - 1,
                     "overhead_quartiles": [float(q) - 1 for q in statistics.quantiles(ratios, n=4)[::2]]})
    return rows


def bench_demo(out_dir: str):
    cmd = [sys.executable, "-m", "treegrpo.cli", "demo", "--quiet", "--output-dir", out_dir]
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise RuntimeError(f"treegrpo demo failed:\n{proc.stderr[-3000:]}")
    summary = json.load(open(os.path.join(out_dir, "summary.json")))
    keys = ("base_reward", "tree_final_reward", "baseline_final_reward", "base_judge", "tree_final_judge",
            "tree_iterations", "baseline_iterations", "tree_train_time_s", "baseline_train_time_s")
    return {"wall_s": wall, "peak_rss_mb": max(peak_kb, before) / 1024, "stdout_tail": proc.stdout[-600:],
            **{k: summary.get(k) for k in keys}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "core.json"))
    ap.add_argument("--repeat", type=int, default=21, help="paired rounds per tree shape (medians are reported)")
    ns = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    policy = DemoPolicy()
    shapes = [(10, 1, 3, 2), (10, 2, 2, 3), (16, 2, 4, 2), (10, 0, 1, 8)]
    rows = bench_sampler(policy, shapes, repeat=ns.repeat)
    print(f"{'T':>3} {'s':>2} {'w':>2} {'k':>2} {'NFE':>6} {'formula':>8} {'calls':>5} {'sampler ms':>10} "
          f"{'raw ms':>8} {'overhead':>8} {'quartiles':>15}")
    for r in rows:
        q1, q3 = r["overhead_quartiles"]
        print(f"{r['T']:>3} {r['s']:>2} {r['w']:>2} {r['k']:>2} {r['nfe']:>6} {r['nfe_formula']:>8} {r['calls']:>5} "
              f"{1000 * r['sampler_s']:>10.1f} {1000 * r['raw_forward_s']:>8.1f} {100 * r['overhead']:>7.1f}% "
              f"{100 * q1:>6.1f}–{100 * q3:.1f} %")
    result = {"sampler": rows, "machine": {"threads": torch.get_num_threads(), "torch": torch.__version__}}
    if not ns.skip_demo:
        d = bench_demo(os.path.join(os.path.dirname(ns.out), "demo_run"))
        print(f"treegrpo demo: wall {d['wall_s']:.1f} s, peak RSS {d['peak_rss_mb']:.0f} MB, eval reward "
              f"base {d['base_reward']:.3f} -> tree {d['tree_final_reward']:.3f}, "
              f"trajectory baseline {d['baseline_final_reward']:.3f}; held-out judge {d['base_judge']:.3f} -> "
              f"{d['tree_final_judge']:.3f}")
        result["demo"] = d
    atomic_write_json(ns.out, result)
    print(f"wrote {ns.out}")
    return result


if __name__ == "__main__":
    main()
