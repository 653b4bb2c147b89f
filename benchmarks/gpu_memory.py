"""Measured vs predicted accelerator memory of one Train-node iteration on a GPU (random weights at the published
size: nothing downloaded). For each model the memory plan is made for ``--budget-gb`` exactly as the Train node
makes it; then one iteration runs with that plan and each phase's ``torch.cuda.max_memory_allocated`` is printed
beside its prediction.

    python benchmarks/gpu_memory.py --models sdxl,flux_fp8 --budget-gb 24      # on a GPU (≈ 5 min on an H200)
    python benchmarks/gpu_memory.py --device cpu --layers 1 --px 128 --models sdxl   # a smoke test of the script
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_memory as bm  # noqa: E402

GB = 1e9


def reduced(name: str, layers: int) -> dict:
    """The model's unet_config, cut to ``layers`` blocks per stack when > 0 (a smoke test)."""
    cfg = dict(bm.MODELS[name][1])
    if layers > 0:
        for key in ("depth", "depth_single_blocks", "num_layers"):
            if key in cfg:
                cfg[key] = layers
        if "transformer_depth" in cfg:
            cfg["transformer_depth"] = [min(d, layers) for d in cfg["transformer_depth"]]
            cfg["transformer_depth_output"] = [min(d, layers) for d in cfg["transformer_depth_output"]]
            cfg["transformer_depth_middle"] = min(cfg["transformer_depth_middle"], layers)
        if name.startswith("qwen"):
            cfg["num_layers"] = layers
    return cfg


def build(name: str, device, layers: int, px: int):
    """A real (random-weight) ComfyUI model, VAE and HPS network on ``device``."""
    import comfy.model_base
    import comfy.model_patcher
    import comfy.supported_models as sm

    cls_name, _, dtype, compute, _, ctx, pooled, cfg_scale, vae_kind, _ = bm.MODELS[name]
    if device.type == "cpu":
        dtype, compute = (torch.float32, None) if dtype != torch.float8_e4m3fn else (dtype, torch.float32)
    from comfy_test_pack.compat import newer_fields
    mc = getattr(sm, cls_name)(newer_fields(reduced(name, layers)))
    mc.set_inference_dtype(dtype, compute)
    model = mc.get_model({})
    with torch.no_grad():
        for t in [*model.diffusion_model.parameters(), *model.diffusion_model.buffers()]:
            if t.is_floating_point():
                t.copy_((torch.randn(t.shape) * 0.02).to(t.dtype))
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=torch.device("cpu"))
    extra = {"pooled_output": torch.randn(1, pooled)} if pooled else {}
    if name.startswith("flux"):
        extra["guidance"] = 3.5
    if cls_name == "SDXL":
        extra.update(width=px, height=px, target_width=px, target_height=px)
    conds = [([[torch.randn(1, *ctx), dict(extra)]], [[torch.randn(1, *ctx), dict(extra)]]) for _ in range(2)]
    vae_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vae_model = bm.build_vae(vae_kind, vae_dtype)
    with torch.no_grad():
        for p in vae_model.parameters():
            p.normal_(0, 0.02)
    vae = bm.FakeVAE(vae_model.to(device), vae_dtype, device)
    vae.decode = lambda raw: vae.first_stage_model.decode(raw.to(device, vae_dtype)).float().clamp(-1, 1).add(1) \
        .div(2).movedim(1, -1)
    reward = bm.HPSScorer()
    with torch.no_grad():
        for p in reward.model.parameters():
            p.normal_(0, 0.02)
    reward.model.to(device, torch.float16 if device.type == "cuda" else torch.float32)
    return patcher, conds, vae, reward, cfg_scale


def run(name: str, device, budget: float, layers: int, px: int, steps: int) -> dict:
    from treegrpo import memory
    from treegrpo.comfyui.policy import DEFAULT_TARGETS, ComfyPolicy
    from treegrpo.config import LoraConfig, TrainConfig
    from treegrpo.trainer import Trainer

    patcher, conds, vae, reward, cfg_scale = build(name, device, layers, px)
    c = patcher.model.latent_format.latent_channels
    shape = (c, 1, px // 8, px // 8) if getattr(patcher.model.latent_format, "latent_dimensions", 2) == 3 \
        else (c, px // 8, px // 8)
    reward_fn = _HPS(reward, device)
    cfg = TrainConfig(backend="comfy", prompts=["a", "b"], prompts_per_iter=2, cfg=cfg_scale, iterations=1,
                      rewards=[{"name": "hpsv2", "weight": 1.0}], eval_every=0, checkpoint_every=0,
                      tree=dict(steps=steps, window_start=1, window_width=3, branch=2),
                      lora=dict(rank=32, alpha=64.0, targets=DEFAULT_TARGETS),
                      output_dir=tempfile.mkdtemp(prefix="gpu-memory-"), run_name=name)
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["a", "b"], conds, shape, vae=vae, lora_cfg=cfg.lora)
        tr = Trainer(cfg, pol, {"hpsv2": reward_fn}, progress=False)
        t0 = time.perf_counter()
        plan = tr.plan_memory(budget)
        t_plan = time.perf_counter() - t0
        measured = {}

        def phase(key, fn):
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            out = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
                measured[key] = torch.cuda.max_memory_allocated(device) / GB
            return out

        batch = phase("sample", tr.sample)
        images = phase("decode", lambda: torch.no_grad()(pol.decode)(batch.leaves))
        raw = phase("reward", lambda: tr.score_images(images, batch.leaf_prompts))
        tr.backup(batch, raw)
        phase("update", lambda: tr.update(batch))
    return {"model": name, "px": px, "layers": layers, "budget_gb": budget / GB, "plan": plan.line(),
            "predicted_gb": {k: v / GB for k, v in plan.peaks.items()}, "measured_gb": measured, "plan_s": t_plan}


class _HPS:
    """The HPS network as a reward callable (images (B, 3, H, W) in [0, 1])."""

    def __init__(self, scorer, device):
        self.scorer, self.device, self.batch_size = scorer, device, scorer.batch_size

    def model_size(self):
        return self.scorer.model_size()

    def __call__(self, images, prompts):
        x = images.to(self.device, next(self.scorer.model.parameters()).dtype)
        return self.scorer(x, prompts).float().cpu()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="sdxl,flux_fp8")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-gb", type=float, default=24.0)
    ap.add_argument("--layers", type=int, default=0, help=">0: cut every stack to this many blocks (smoke test)")
    ap.add_argument("--px", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", os.path.join(bm.ROOT, "benchmarks", "results")),
                                                  "gpu_memory.json"))
    ns = ap.parse_args(argv)
    import comfy_harness as ch
    ch.boot_comfy(ch.REPO_ROOT, tempfile.mkdtemp(prefix="gpu-memory-"),
                  extra_argv=[] if ns.device == "cuda" else ["--use-pytorch-cross-attention"])
    rows = []
    for name in ns.models.split(","):
        r = run(name, torch.device(ns.device), ns.budget_gb * GB, ns.layers, ns.px, ns.steps)
        rows.append(r)
        print(json.dumps(r), flush=True)
        bm.write_json(ns.out, rows)          # after every model: a run cut off by its time limit keeps what it did
        if ns.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
