"""Per-iteration time split (sampling / decode / reward / update) of the diffusers backend, per model family.

Tiny random-weight pipelines of the real architectures (``tests/diffusers_fixtures.py``), saved and loaded
through ``from_pretrained`` and trained by the CLI trainer, so every layer of the real code path is timed.
These are architecture checks of the overheads, not model-size timings: on a tiny model the text
encoders, the VAE and Python dominate. Real-size models (or real weights) on a GPU: point ``--model``
at a local diffusers folder; the same split is reported.

    python benchmarks/bench_families.py [--iterations 4] [--threads 1] [--model DIR --device cuda]
    python benchmarks/bench_families.py --random-size real --device cuda --height 512 --out results/families_gpu.json
    python benchmarks/bench_families.py --random-size real --families sd35m --methods tree,traj_window,traj_all \
        --device cuda --height 512      # the paper's per-iteration comparison at SD3.5-Medium size
    python benchmarks/bench_families.py --comfy [--families WAN21_T2V,QwenImage] --out results/families_comfy.json

``--comfy`` times every family ComfyUI trains (treegrpo/comfyui/families.py) on a tiny random instance of
ComfyUI's own class (tests/comfy_test_pack/families.py), through the Train node's ComfyPolicy and Trainer in a
ComfyUI 0.3.75 booted in this process: the same split per iteration, video families decoding a few frames.

``--methods`` times TreeGRPO (k=2, w=3) and the two trajectory baselines with the same 8 leaves per prompt on
each model: the time per iteration and its split, the quantity the paper's 2.4x is about (it does not
measure learning: the weights are random).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from treegrpo.run import build_rewards, run_training

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

PARTS = ("t_sample", "t_decode", "t_reward", "t_update", "t_iter")


METHOD_TREES = {  # same 8 leaves per prompt; the trajectory baselines share the prefix and the tail solver
    "tree": {},
    "traj_window": {"method": "trajectory", "group_size": 8},
    "traj_all": {"method": "trajectory", "group_size": 8, "window_start": 0, "window_width": 10, "tail_steps": 0},
}


def tree_for(method: str, family: str) -> dict:
    """TreeConfig of ``method`` on ``family`` (the all-step baseline skips a DDIM family's noiseless last step)."""
    from bench_methods import all_step_width

    tree = {"steps": 10, "window_start": 1, "window_width": 3, "branch": 2, "tail_solver": "dpmpp_2m",
            "tail_steps": 3, **METHOD_TREES[method]}
    if method == "traj_all":
        tree["window_width"] = all_step_width(tree["steps"], family)
    return tree


def make_config(model: str, family: str, iterations: int, device: str, out: str, height: int, microbatch: int = 64,
                method: str = "tree", **pipeline):
    from treegrpo.config import TrainConfig
    return TrainConfig.from_dict({
        "backend": "diffusers", "model": model, "prompts": ["a red circle", "a blue square", "a green triangle",
                                                            "a yellow cross"],
        "guidance_scale": 1.0 if family == "flux" else 4.5, "rewards": [{"name": "jpeg_compressibility", "weight": 1.0}],
        "pipeline": {"height": height, "width": height, **pipeline},
        "tree": tree_for(method, family),
        "lora": {"rank": 8, "alpha": 16.0}, "optim": {"lr": 1e-3, "microbatch": microbatch},
        "iterations": iterations + 1, "prompts_per_iter": 4, "eval_every": 0, "checkpoint_every": 0,
        "output_dir": out, "run_name": f"bench_{family}", "device": device})


def summarize(trainer, family: str, t0: float, device: str, method: str = "tree") -> dict:
    hist = trainer.history[1:]  # the first iteration warms up (allocations, lazy imports, autotuning)
    row = {"family": family, "method": method, "iterations": len(hist), "nfe_per_iter": hist[0]["nfe"],
           "lora_params": sum(p.numel() for p in trainer.params), "wall_s": time.perf_counter() - t0,
           "denoiser_params": trainer.policy.denoiser_parameters() if hasattr(trainer.policy, "denoiser_parameters")
           else sum(p.numel() for p in trainer.policy.model.parameters())}
    for k in PARTS:
        row[k] = sum(h[k] for h in hist) / len(hist)
    if device.startswith("cuda"):
        row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return row


def run_family(folder: str, family: str, iterations: int, device: str, out: str, height: int,
               methods: tuple = ("tree",)) -> list[dict]:
    """A saved pipeline folder through the CLI trainer (the whole loading path), once per method."""
    rows = []
    for method in methods:
        cfg = make_config(folder, family, iterations, device, out + "_" + method, height, method=method)
        t0 = time.perf_counter()
        trainer, _ = run_training(cfg, progress=False, write_lora=False)
        rows.append(summarize(trainer, family, t0, device, method))
    return rows


def run_random(name: str, iterations: int, device: str, out: str, height: int, layers: int = 0,
               methods: tuple = ("tree",)) -> list[dict]:
    """A real-size random-weight pipeline (``random_pipelines.py``), built in memory on ``device``, trained
    by each of ``methods`` in turn (a fresh LoRA each); one row per method."""
    from random_pipelines import FAMILY_OF, build
    from treegrpo.backends.diffusers import DiffusersPolicy
    from treegrpo.trainer import Trainer

    family = FAMILY_OF[name]
    on_gpu = device.startswith("cuda")
    rows = []
    for method in methods:
        cfg = make_config(f"random:{name}", family, iterations, device, out + "_" + method, height, microbatch=16,
                          method=method, gradient_checkpointing=on_gpu)
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        # a fresh pipeline per method (LoRA is injected in place); build() seeds its random weights
        pipe = build(name, device=device, dtype=torch.bfloat16 if on_gpu else torch.float32, layers=layers)
        policy = DiffusersPolicy(pipe, family, cfg.pipeline, device, guidance_hint=cfg.guidance_scale)
        trainer = Trainer(cfg, policy, build_rewards(cfg, torch.device(device)), progress=False,
                          base_model_name=f"random:{name}")
        trainer.train()
        rows.append(summarize(trainer, name, t0, device, method))
        del trainer, policy, pipe
        if on_gpu:
            torch.cuda.empty_cache()
    return rows


def run_comfy(names: list[str], iterations: int) -> list[dict]:
    """Each ComfyUI family's tiny instance trained for ``iterations`` (+1 warm-up) by the Trainer through
    ComfyPolicy (what the Train node runs): k=2, w=2 trees of T=6, 2 prompts, CFG 2 with a negative prompt."""
    import comfy_harness as ch
    ch.boot_comfy(None, tempfile.mkdtemp(prefix="bench_families-"))
    from comfy_test_pack.families import build, vae_for
    from treegrpo.comfyui.families import FAMILIES
    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.config import TrainConfig
    from treegrpo.rewards.base import load_reward
    from treegrpo.trainer import Trainer

    rows = []
    for name in names:
        patcher, pos, neg, latent = build(name)
        video = len(latent) == 4 and latent[1] > 1
        cfg = TrainConfig(backend="comfy", prompts=["a", "b"], guidance_scale=2.0, rewards=[{"name": "jpeg_compressibility",
                                                                               "weight": 1.0}],
                          tree={"steps": 6, "window_start": 1, "window_width": 2, "branch": 2},
                          lora={"rank": 4, "alpha": 4.0, "targets": ["auto"]}, optim={"lr": 1e-3},
                          iterations=iterations + 1, prompts_per_iter=2, eval_every=0, checkpoint_every=0,
                          output_dir=tempfile.mkdtemp(prefix="bench_families_out-"), run_name=f"bench_{name}",
                          video={"frames": 5, "reward_frames": 2, "frame_stride": 4})
        t0 = time.perf_counter()
        with torch.inference_mode(False):
            policy = ComfyPolicy(patcher, ["a", "b"], [(pos, neg), (pos, neg)], latent, vae=vae_for(name),
                                 lora_cfg=cfg.lora, video=cfg.video)
            trainer = Trainer(cfg, policy, {"jpeg_compressibility": load_reward("jpeg_compressibility")},
                              progress=False, base_model_name=name)
            trainer.train()
        row = summarize(trainer, name, t0, "cpu", "tree")
        row.update(label=FAMILIES[name].label, media="video" if video else "image", latent=list(latent))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=4, help="timed iterations per family (after one warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--families", default="sd,sd_v,sdxl,sd3,flux")
    ap.add_argument("--model", help="a local diffusers folder to time instead of the tiny pipelines")
    ap.add_argument("--height", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-size", choices=("tiny", "real"), default="tiny",
                    help="real: published denoiser/VAE sizes with random weights (sd15, sdxl, sd35m, flux), for a GPU")
    ap.add_argument("--layers", type=int, default=0, help="with --random-size real: cap the denoiser depth "
                    "(a CPU smoke test of the real widths)")
    ap.add_argument("--methods", default="tree", help="comma-separated methods to time on each model "
                    f"({', '.join(METHOD_TREES)})")
    ap.add_argument("--comfy", action="store_true", help="time every family ComfyUI trains, on tiny instances of "
                    "ComfyUI's own classes (--families: class names; default all)")
    ap.add_argument("--out", default=None, help="results file (default results/families.json, with --comfy "
                    "results/families_comfy.json)")
    args = ap.parse_args()
    args.out = args.out or os.path.join(HERE, "results", "families_comfy.json" if args.comfy else "families.json")
    bad = [m for m in args.methods.split(",") if m not in METHOD_TREES]
    if bad:
        ap.error(f"unknown --methods {bad}; choose from {list(METHOD_TREES)}")
    torch.set_num_threads(args.threads)
    rows = []
    if args.comfy:
        from treegrpo.comfyui.families import FAMILIES
        names = [n for n, f in FAMILIES.items() if f.trains] if args.families == "sd,sd_v,sdxl,sd3,flux" else \
            args.families.split(",")
        rows = run_comfy(names, args.iterations)
        for r in rows:
            print(f"{r['family']:20s} NFE/it {r['nfe_per_iter']:4d}  "
                  + "  ".join(f"{k[2:]} {r[k]:.3f}s" for k in PARTS), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.comfy:
            targets = []
        elif args.random_size == "real":
            names = args.families.split(",") if args.families != "sd,sd_v,sdxl,sd3,flux" else ["sd15", "sdxl", "sd35m", "flux"]
            for name in names:
                for r in run_random(name, args.iterations, args.device, os.path.join(tmp, "out_" + name),
                                    args.height, args.layers, tuple(args.methods.split(","))):
                    rows.append(r)
                    print(f"{name:6s} {r['method']:12s} NFE/it {r['nfe_per_iter']:4d}  "
                          + "  ".join(f"{k[2:]} {r[k]:.3f}s" for k in PARTS)
                          + (f"  peak {r['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in r else ""), flush=True)
            targets = []
        elif args.model:
            from treegrpo.backends.diffusers import detect_family
            targets = [(detect_family(args.model), args.model)]
        else:
            from diffusers_fixtures import save_pipeline
            targets = [(f, save_pipeline(f, os.path.join(tmp, f))) for f in args.families.split(",")]
        for fam, folder in targets:
            for r in run_family(folder, fam, args.iterations, args.device, os.path.join(tmp, "out_" + fam),
                                args.height, tuple(args.methods.split(","))):
                rows.append(r)
                print(f"{fam:6s} {r['method']:12s} NFE/it {r['nfe_per_iter']:4d}  "
                      + "  ".join(f"{k[2:]} {r[k]:.3f}s" for k in PARTS), flush=True)
    from treegrpo.io import atomic_write_json
    atomic_write_json(args.out, {"threads": args.threads, "device": args.device, "torch": torch.__version__,
                                 "random_size": args.random_size, "height": args.height, "rows": rows})
    if args.comfy:
        print("\n| family (ComfyUI class) | latent | NFE/iter | sampling s | decode s | reward s | update s | iteration s |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['label']} (`{r['family']}`) | {'×'.join(map(str, r['latent']))} | {r['nfe_per_iter']} | "
                  f"{r['t_sample']:.3f} | {r['t_decode']:.3f} | {r['t_reward']:.3f} | {r['t_update']:.3f} | "
                  f"{r['t_iter']:.3f} |")
        return
    print("\n| family | method | NFE/iter | sampling s | decode s | reward s | update s | iteration s | update share "
          "| ÷ tree |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tree_t = {r["family"]: r["t_iter"] for r in rows if r.get("method", "tree") == "tree"}
    for r in rows:
        rel = r["t_iter"] / tree_t[r["family"]] if r["family"] in tree_t else float("nan")
        print(f"| {r['family']} | {r.get('method', 'tree')} | {r['nfe_per_iter']} | {r['t_sample']:.3f} | "
              f"{r['t_decode']:.3f} | {r['t_reward']:.3f} | {r['t_update']:.3f} | {r['t_iter']:.3f} | "
              f"{r['t_update'] / r['t_iter']:.0%} | {rel:.2f} |")


if __name__ == "__main__":
    main()
