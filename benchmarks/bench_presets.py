"""What each Train-node preset costs per iteration at real size: TreeGRPO with the preset's tail against window-SDE
GRPO and all-step GRPO (both with the schedule's full Euler tail, as they run), for SD1.5, SDXL, SD3.5-Medium and
Flux.1-dev at the workflows' settings. Composed exactly as ``bench_iteration.py`` composes an iteration, from the
unit costs it measured (``results/iteration.json``: per denoiser call and per row, forward and forward + backward,
the VAE decode and HPS v2.1's network on 16 images), so nothing is measured again here:

    sample = calls × per call + rows × per row    (calls = one batched call per step of the tree: s + w + tail)
    update = ⌈parents ÷ microbatch⌉ calls + parents × forward+backward per row
    iteration = sample + decode + reward + update

    python benchmarks/bench_presets.py             # reads results/iteration.json, writes results/presets.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))

from bench_iteration import LABELS, PROMPTS_PER_ITER, WORKFLOW, composed, method_trees  # noqa: E402

from treegrpo.config import TrainConfig, TreeConfig  # noqa: E402
from treegrpo.presets import PRESETS, apply_preset, preset_cost  # noqa: E402
from treegrpo.tree import tail_nfe  # noqa: E402


def preset_iteration(model: dict, preset: str, reward_s: float) -> dict:
    """One tree iteration's phases (s) with ``preset``'s tail, from ``model``'s unit costs."""
    name, w = model["model"], WORKFLOW[model["model"]]
    tree = apply_preset(TreeConfig(**method_trees(w["steps"])["tree"]), preset)
    cfg = TrainConfig.from_dict(dict(backend="comfy", prompts=["p"], guidance_scale=w["cfg"],
                                     prompts_per_iter=PROMPTS_PER_ITER, tree=dataclasses.asdict(tree)))
    per_tree_nfe, parents_per_tree = preset_cost(cfg.tree)
    cfg_rows = 2 if w["cfg"] > 1 else 1
    rows = PROMPTS_PER_ITER * per_tree_nfe            # x rows (both CFG conds ride in one row)
    calls = cfg.tree.window_start + cfg.tree.window_width + tail_nfe(cfg.tree, cfg.tree.window_start)
    parents = PROMPTS_PER_ITER * parents_per_tree
    f, fb = model["costs"]["forward"], model["costs"]["forward_backward"]
    t = {"t_sample": calls * f["per_call"] + rows * f["per_row"], "t_decode": model["decode_s"], "t_reward": reward_s,
         "t_update": math.ceil(parents / cfg.optim.microbatch) * fb["per_call"] + parents * fb["per_row"]}
    return {**t, "nfe": rows * cfg_rows, "parents": parents, "calls": calls, "iteration_s": sum(t.values())}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--costs", default=os.path.join(HERE, "results", "iteration.json"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "presets.json"))
    ns = ap.parse_args(argv)
    src = json.load(open(ns.costs, encoding="utf-8"))
    out = {"source": os.path.relpath(ns.costs, HERE), "px": src["px"], "models": {}}
    lines = ["| model | preset | NFE / iteration | iteration ÷ window GRPO's | ÷ all-step GRPO's |", "|---|---|---|---|---|"]
    for m in src["models"]:
        base = {k: sum(composed(m["model"], k, m["costs"], m["decode_s"], src["hps_s"])[p]
                       for p in ("t_sample", "t_decode", "t_reward", "t_update"))
                for k in ("window_grpo", "all_step_grpo")}
        rows = {}
        for preset in PRESETS:
            it = preset_iteration(m, preset, src["hps_s"])
            rows[preset] = dict(it, over_window_grpo=it["iteration_s"] / base["window_grpo"],
                                over_all_step_grpo=it["iteration_s"] / base["all_step_grpo"])
            lines.append(f"| {LABELS.get(m['model'], m['model'])} | {preset} | {it['nfe']} | "
                         f"{rows[preset]['over_window_grpo']:.2f} | {rows[preset]['over_all_step_grpo']:.2f} |")
        out["models"][m["model"]] = {"baselines_s": base, "presets": rows}
    print("\n".join(lines))
    with open(ns.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
