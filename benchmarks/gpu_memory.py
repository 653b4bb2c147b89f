"""Measured vs predicted accelerator memory of one Train-node iteration on a GPU (random weights at the published
size: nothing downloaded). For each model the memory plan is made for ``--budget-gb`` exactly as the Train node
makes it; then one iteration runs with that plan and each phase's ``torch.cuda.max_memory_allocated`` is printed
beside its prediction. Settings of the workflows (2 prompts, k = 2, w = 3: 16 leaves, LoRA rank 32, their CFG and
image size: SD1.5 512 px, the others 1024 px); ``--steps`` (8) changes only the time, not a phase's peak.

    python benchmarks/gpu_memory.py --models sd15,sdxl,sd35m,flux_fp8     # on a GPU (benchmarks/gpu_session.sh)
    python benchmarks/gpu_memory.py --device cpu --layers 1 --px 64 --models sd15 --hps-arch ViT-B-32   # smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_memory  # noqa: E402

GB = 1e9


def reduced(name: str, layers: int) -> dict:
    """The model's unet_config, cut to ``layers`` blocks per stack when > 0 (a smoke test)."""
    cfg = dict(bench_memory.MODELS[name][1])
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


def normal_(tensors, device, std: float = 0.02) -> None:
    """Random N(0, std²) weights in place, drawn on ``device`` (a 12B-parameter model in seconds on a GPU) and copied
    into each tensor wherever it lives, in its dtype."""
    with torch.no_grad():
        for t in tensors:
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, device=device).mul_(std).to(t.dtype))


def build(name: str, device, layers: int, px: int, hps_arch: str = "ViT-H-14"):
    """A real (random-weight) ComfyUI model, VAE and HPS network (``hps_arch``: open_clip's architecture) on
    ``device``."""
    import comfy.model_base
    import comfy.model_patcher
    import comfy.supported_models as sm

    cls_name, _, dtype, compute, _, ctx, pooled, cfg_scale, vae_kind, _ = bench_memory.MODELS[name]
    if device.type == "cpu":
        dtype, compute = (torch.float32, None) if dtype != torch.float8_e4m3fn else (dtype, torch.float32)
    from comfy_test_pack.compat import newer_fields
    mc = getattr(sm, cls_name)(newer_fields(reduced(name, layers)))
    mc.set_inference_dtype(dtype, compute)
    model = mc.get_model({})
    normal_([*model.diffusion_model.parameters(), *model.diffusion_model.buffers()], device)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=torch.device("cpu"))
    extra = {"pooled_output": torch.randn(1, pooled)} if pooled else {}
    if name.startswith("flux"):
        extra["guidance"] = 3.5
    if cls_name == "SDXL":
        extra.update(width=px, height=px, target_width=px, target_height=px)
    conds = [([[torch.randn(1, *ctx), dict(extra)]], [[torch.randn(1, *ctx), dict(extra)]]) for _ in range(2)]
    vae_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vae_model = bench_memory.build_vae(vae_kind, vae_dtype).to(device)
    normal_(vae_model.parameters(), device)
    vae = bench_memory.FakeVAE(vae_model, vae_dtype, device)
    vae.decode = lambda raw: vae.first_stage_model.decode(raw.to(device, vae_dtype)).float().clamp(-1, 1).add(1) \
        .div(2).movedim(1, -1)
    reward = bench_memory.HPSScorer(hps_arch)
    reward.model.to(device, torch.float16 if device.type == "cuda" else torch.float32)
    normal_(reward.model.parameters(), device)
    return patcher, conds, vae, reward, cfg_scale


def stored_footprints(path: str) -> dict:
    """model -> its row in ``path`` ({} when there is none): bench_memory.py's results, or this script's own."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    rows = data.get("models", []) if isinstance(data, dict) else data
    return {r["model"]: r for r in rows if isinstance(r.get("footprint"), dict)}


def run(name: str, device, budget: float, layers: int, px: int, steps: int, hps_arch: str = "ViT-H-14",
        stored: dict | None = None) -> dict:
    """One iteration of ``name`` planned for ``budget`` bytes (``px`` 0: the workflow's size): the plan, each phase's
    predicted and (on a GPU) measured peak in GB. ``stored``: this model's row of bench_memory.py's results (or of this
    script's), whose footprint is used when it was probed on the model built as here (same depth, size and reward
    network) instead of probing again: the Train node's fake probe takes minutes of CPU on the published models and
    gives the same bytes on any machine."""
    from treegrpo import memory
    from treegrpo.comfyui.policy import DEFAULT_TARGETS, ComfyPolicy
    from treegrpo.config import TrainConfig
    from treegrpo.trainer import Trainer

    px = px or bench_memory.MODELS[name][4]
    patcher, conds, vae, reward, cfg_scale = build(name, device, layers, px, hps_arch)
    c = patcher.model.latent_format.latent_channels
    shape = (c, 1, px // 8, px // 8) if getattr(patcher.model.latent_format, "latent_dimensions", 2) == 3 \
        else (c, px // 8, px // 8)
    reward_fn = _HPS(reward, device)
    cfg = TrainConfig(backend="comfy", prompts=["a", "b"], prompts_per_iter=2, guidance_scale=cfg_scale, iterations=1,
                      rewards=[{"name": "hpsv2", "weight": 1.0}], eval_every=0, checkpoint_every=0,
                      tree=dict(steps=steps, window_start=1, window_width=3, branch=2),
                      lora=dict(rank=32, alpha=64.0, targets=DEFAULT_TARGETS),
                      output_dir=tempfile.mkdtemp(prefix="gpu-memory-"), run_name=name)
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["a", "b"], conds, shape, vae=vae, lora_cfg=cfg.lora)
        tr = Trainer(cfg, pol, {"hpsv2": reward_fn}, progress=False)
        t0 = time.perf_counter()
        if stored and (stored.get("layers", 0), stored["px"], stored.get("hps_arch", "ViT-H-14")) == (layers, px, hps_arch):
            fp = memory.Footprint.from_dict(stored["footprint"])
            plan = memory.plan(fp, tr.workload(), budget)
            tr.apply_plan(plan)
            source = "bench_memory.py's footprint"
        else:
            plan = tr.plan_memory(budget)
            fp = plan.footprint
            source = "probed here"
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
    return {"model": name, "px": px, "layers": layers, "hps_arch": hps_arch, "budget_gb": budget / GB, "plan": plan.line(),
            "predicted_gb": {k: v / GB for k, v in plan.peaks.items()}, "measured_gb": measured, "plan_s": t_plan, "footprint_source": source,
            "footprint": fp.to_dict()}


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
    ap.add_argument("--models", default="sd15,sdxl,sd35m,flux_fp8")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-gb", type=float, default=24.0)
    ap.add_argument("--layers", type=int, default=0, help=">0: cut every stack to this many blocks (smoke test)")
    ap.add_argument("--px", type=int, default=0, help="image size; 0: each model's workflow size")
    ap.add_argument("--hps-arch", default="ViT-H-14", help="open_clip architecture of the reward network (HPS v2.1: "
                    "ViT-H-14; a smaller one for a smoke test)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--footprints", default=os.path.join(bench_memory.ROOT, "benchmarks", "results", "memory_newest.json"),
                    help="bench_memory.py's results on the same ComfyUI: plan from their footprints instead of probing "
                         "(an empty value: probe as the Train node does)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", os.path.join(bench_memory.ROOT, "benchmarks", "results")),
                                                  "gpu_memory.json"))
    ns = ap.parse_args(argv)
    import comfy_harness as ch
    ch.boot_comfy_core(cpu=ns.device == "cpu", extra_argv=["--use-pytorch-cross-attention"])
    rows, stored = [], stored_footprints(ns.footprints)
    for name in ns.models.split(","):
        r = run(name, torch.device(ns.device), ns.budget_gb * GB, ns.layers, ns.px, ns.steps, ns.hps_arch,
                stored.get(name))
        rows.append(r)
        print(json.dumps(r), flush=True)
        bench_memory.write_json(ns.out, rows)          # after every model: a run cut off by its time limit keeps what it did
        if ns.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
