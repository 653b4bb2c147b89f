"""The demo workflow through ComfyUI against the same run through the CLI trainer (issue: the ComfyUI path).

Reads the Train node of ``workflows/treegrpo_demo_cpu.json`` (or ``--workflow``), runs that graph in a real ComfyUI
0.3.75 booted in this process (the tests' harness), then the same settings through ``treegrpo.cli.run_training``
on the demo backend, each for the same iterations and evaluation schedule, and reports:

- time per training iteration (the trainer's own ``t_iter``: sampling, decoding, scoring, update), ComfyUI ÷ CLI
  (target ≤ 1.2), and the Train node's whole execution time (evaluations and previews included);
- both evaluation-reward curves (fixed prompts × 2 noises, as the Train node evaluates) and the gain over the base.

Usage: ``python benchmarks/bench_comfy.py [--iterations N] [--out benchmarks/results/comfy.json]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

from treegrpo.io import atomic_write_json  # noqa: E402


def train_node_inputs(api: dict) -> tuple[str, dict]:
    nid = next(k for k, n in api.items() if n["class_type"] == "TreeGRPOTrain")
    return nid, api[nid]["inputs"]


def cli_config(w: dict, out: str):
    """The Train node's settings as a CLI config on the demo backend (the node's LoRA targets on the demo model
    are the attention's q/k/v projections; it evaluates its prompts with 2 noises)."""
    from treegrpo import cli
    from treegrpo.config import TrainConfig

    d = cli.demo_config_dict()
    prompts = [p.strip() for p in w["prompts"].splitlines() if p.strip()]
    d.update(prompts=prompts, output_dir=out, run_name="bench_cli", iterations=w["iterations"],
             prompts_per_iter=w["prompts_per_iteration"], seed=w["seed"], eval_every=w["eval_every"], eval_seeds=2,
             checkpoint_every=0, cfg=w["cfg"],
             tree=dict(steps=w["steps"], window_start=w["window_start"], window_width=w["window_width"],
                       branch=w["branch"], noise_level=w["noise_level"], eta=min(1.0, w["noise_level"]),
                       window_schedule=w["window_schedule"], antithetic=w.get("antithetic", True),
                       tail_solver=w.get("tail_solver", "euler"), tail_steps=w.get("tail_steps", 0)),
             lora=dict(rank=w["lora_rank"], alpha=w["lora_alpha"], targets=["to_q", "to_k", "to_v"]),
             optim=dict(lr=w["learning_rate"]))
    return TrainConfig.from_dict(d)


def summary(train: list[dict], evals: list[dict]) -> dict:
    t = [h["t_iter"] for h in train]
    return {"iterations": len(train), "s_per_iter": statistics.mean(t), "s_per_iter_median": statistics.median(t),
            **{k: statistics.mean(h[k] for h in train) for k in ("t_sample", "t_decode", "t_reward", "t_update")},
            "train_time_s": sum(t), "eval": [(e["iteration"], e["eval_reward"]) for e in evals],
            "base_reward": evals[0]["eval_reward"], "final_reward": evals[-1]["eval_reward"],
            "gain": evals[-1]["eval_reward"] - evals[0]["eval_reward"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflow", default=os.path.join(ROOT, "workflows", "treegrpo_demo_cpu.json"))
    ap.add_argument("--iterations", type=int, default=0, help="override the workflow's iterations (0 = keep)")
    ap.add_argument("--set", action="append", default=[], metavar="WIDGET=VALUE",
                    help="override a Train node widget (JSON value), e.g. --set prompts_per_iteration=16")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "comfy.json"))
    ns = ap.parse_args(argv)

    import comfy_harness as ch
    from treegrpo import cli

    tmp = tempfile.mkdtemp(prefix="bench_comfy-")
    rt = ch.boot_comfy(ch.REPO_ROOT, os.path.join(tmp, "comfy"))
    api = ch.workflow_to_api(json.load(open(ns.workflow, encoding="utf-8")), rt.node_classes())
    nid, w = train_node_inputs(api)
    if ns.iterations:
        w["iterations"] = ns.iterations
    for kv in ns.set:
        k, v = kv.split("=", 1)
        w[k] = json.loads(v)
    w["run_name"] = "bench_comfy"
    t0 = time.perf_counter()
    rt.execute(api)
    node_wall = time.perf_counter() - t0
    log = json.load(open(os.path.join(rt.base_dir, "output", "treegrpo", "bench_comfy", "log.json")))
    comfy = dict(summary(log["train"], log["eval"]), node_wall_s=node_wall)

    t0 = time.perf_counter()
    tr, _ = cli.run_training(cli_config(w, os.path.join(tmp, "cli")), progress=False)
    cli_res = dict(summary(tr.history, tr.evals), wall_s=time.perf_counter() - t0)

    ratio = comfy["s_per_iter"] / cli_res["s_per_iter"]
    res = {"workflow": os.path.relpath(ns.workflow, ROOT), "train_node": {k: v for k, v in w.items()
                                                                           if not isinstance(v, list)},
           "comfy": comfy, "cli": cli_res, "time_per_iteration_ratio": ratio, "target_ratio": 1.2}
    print(f"{'':22} {'s/iter':>8} {'iters':>6} {'base':>7} {'final':>7} {'gain':>7} {'wall s':>8}")
    for name, r in (("ComfyUI Train node", comfy), ("CLI trainer", cli_res)):
        print(f"{name:22} {r['s_per_iter']:8.3f} {r['iterations']:6d} {r['base_reward']:7.3f} {r['final_reward']:7.3f} "
              f"{r['gain']:+7.3f} {r.get('node_wall_s', r.get('wall_s')):8.1f}")
    for name, r in (("ComfyUI Train node", comfy), ("CLI trainer", cli_res)):
        print(f"{name:22} " + "  ".join(f"{k} {r[k]:.3f}" for k in ("t_sample", "t_decode", "t_reward", "t_update")))
    print(f"time per iteration, ComfyUI ÷ CLI: {ratio:.2f} (target ≤ 1.2)")
    os.makedirs(os.path.dirname(ns.out), exist_ok=True)
    atomic_write_json(ns.out, res)
    print("wrote", ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
