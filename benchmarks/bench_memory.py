"""Accelerator memory of one TreeGRPO iteration at the published model sizes, predicted by ``treegrpo.memory``.

Every architecture is ComfyUI's own class, built at its published size on fake tensors (torch's FakeTensorMode:
shapes and dtypes, no memory, no compute, nothing downloaded), with the dtypes ComfyUI loads it in on a GPU. The
Train node's own code measures it (``memory.probe_policy``: the denoiser without and with gradient checkpointing,
the VAE decoder, the HPS v2.1 reward model) and predicts each phase at the workflows' defaults: 2 prompts per
iteration, k = 2, w = 3 (16 leaves), LoRA rank 32, CFG as in the workflow, text encoders off the accelerator
(the Train node encodes the prompts once, before training). Attention is PyTorch's SDPA, ComfyUI's default on
NVIDIA (``--use-pytorch-cross-attention``). Then the plan for 8/12/16/24 GB cards, and the time cost of gradient
checkpointing measured on this CPU (a reduced-depth model at full width, real tensors).

    python benchmarks/bench_memory.py                  # all models, writes benchmarks/results/memory.json
    python benchmarks/bench_memory.py --models sd15    # a subset
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

GB = 1e9

# published architectures, as ComfyUI's model detection writes their unet_config
SD15 = {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True, "legacy": False,
        "adm_in_channels": None, "in_channels": 4, "model_channels": 320, "num_res_blocks": [2, 2, 2, 2],
        "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0], "channel_mult": [1, 2, 4, 4], "transformer_depth_middle": 1,
        "use_linear_in_transformer": False, "context_dim": 768, "num_heads": 8,
        "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0], "use_temporal_attention": False,
        "use_temporal_resblock": False}
SDXL = {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True, "legacy": False,
        "num_classes": "sequential", "adm_in_channels": 2816, "in_channels": 4, "model_channels": 320,
        "num_res_blocks": [2, 2, 2], "transformer_depth": [0, 0, 2, 2, 10, 10], "channel_mult": [1, 2, 4],
        "transformer_depth_middle": 10, "use_linear_in_transformer": True, "context_dim": 2048,
        "num_head_channels": 64, "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
        "use_temporal_attention": False, "use_temporal_resblock": False}
SD35M = {"in_channels": 16, "patch_size": 2, "out_channels": 16, "depth": 24, "adm_in_channels": 2048,
         "context_embedder_config": {"target": "torch.nn.Linear", "params": {"in_features": 4096, "out_features": 1536}},
         "num_patches": 384 * 384, "pos_embed_max_size": 384, "pos_embed_scaling_factor": None, "qk_norm": "rms",
         "x_block_self_attn_layers": list(range(13)), "input_size": None}
FLUX_DEV = {"image_model": "flux", "in_channels": 16, "patch_size": 2, "out_channels": 16, "vec_in_dim": 768,
            "context_in_dim": 4096, "hidden_size": 3072, "mlp_ratio": 4.0, "num_heads": 24, "depth": 19,
            "depth_single_blocks": 38, "axes_dim": [16, 56, 56], "theta": 10000, "qkv_bias": True,
            "guidance_embed": True}
QWEN_IMAGE = {"image_model": "qwen_image"}   # the class defaults are the published model (60 layers, 3072 wide)

SD_VAE = dict(ddconfig={"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3,
                        "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [],
                        "dropout": 0.0}, embed_dim=4)
SD3_VAE = dict(ddconfig={**SD_VAE["ddconfig"], "z_channels": 16}, embed_dim=16)

#: name -> (supported_models class, unet_config, weight dtype, compute dtype, px, context (tokens, dim), pooled dim,
#: CFG of the workflow, VAE, target peak GB from the issue or None)
MODELS = {
    "sd15": ("SD15", SD15, torch.float16, None, 512, (77, 768), None, 4.5, "sd", 8),
    "sdxl": ("SDXL", SDXL, torch.float16, None, 1024, (77, 2048), 1280, 4.5, "sd", 12),
    "sd35m": ("SD3", SD35M, torch.float16, None, 1024, (154, 4096), 2048, 4.5, "sd3", 16),
    "flux_bf16": ("Flux", FLUX_DEV, torch.bfloat16, None, 1024, (256, 4096), 768, 1.0, "sd3", None),
    "flux_fp8": ("Flux", FLUX_DEV, torch.float8_e4m3fn, torch.bfloat16, 1024, (256, 4096), 768, 1.0, "sd3", 24),
    "qwen_image_fp8": ("QwenImage", QWEN_IMAGE, torch.float8_e4m3fn, torch.bfloat16, 1024, (128, 3584), None, 4.0,
                       "wan", None),
}
BUDGETS_GB = (8, 12, 16, 24)


def build_denoiser(name: str):
    """ComfyUI's model at its published size on fake tensors, in a ModelPatcher, with its conds."""
    import comfy.model_base
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm

    cls_name, unet, dtype, compute, px, ctx, pooled, cfg_scale, vae, _ = MODELS[name]
    from comfy_test_pack.compat import newer_fields
    cfg = getattr(sm, cls_name)(newer_fields(unet))
    cfg.set_inference_dtype(dtype, compute)
    model = cfg.get_model({})
    # the sampling schedule must be real: the sigma table is read as Python floats
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        model.model_sampling = comfy.model_base.model_sampling(cfg, model.model_type)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    extra = {"pooled_output": torch.randn(1, pooled)} if pooled else {}
    if name.startswith("flux"):
        extra["guidance"] = 3.5
    if cls_name == "SDXL":
        extra.update(width=px, height=px, target_width=px, target_height=px)

    def cond():
        return [[torch.randn(1, *ctx), dict(extra)]]

    return patcher, (cond(), cond()), px, cfg_scale, vae


def build_vae(kind: str, dtype=torch.bfloat16):
    """The decoder ComfyUI builds for this VAE (fake weights, created in ``dtype``: fake tensors cannot be cast in
    place)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return _vae(kind).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(default)


def _vae(kind: str):
    if kind == "wan":
        from comfy.ldm.wan.vae import WanVAE
        m = WanVAE(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                   temperal_downsample=[False, True, True], dropout=0.0)
    else:
        from comfy.ldm.models.autoencoder import AutoencoderKL
        m = AutoencoderKL(**(SD_VAE if kind == "sd" else SD3_VAE))
    return m


class FakeVAE:
    """Just what ComfyPolicy needs of ComfyUI's VAE for the memory probe."""

    def __init__(self, model, dtype, device="cpu"):
        import comfy.model_patcher
        self.first_stage_model, self.vae_dtype, self.device = model, dtype, torch.device(device)
        self.patcher = comfy.model_patcher.ModelPatcher(model, load_device=self.device,
                                                        offload_device=torch.device("cpu"))


class HPSScorer:
    """HPS v2.1's network (open_clip ViT-H-14, fp16) scoring images as treegrpo.rewards.hps does: resize to 224,
    image and text towers, cosine score. ``arch``: open_clip's architecture (HPS v2.1's by default)."""

    def __init__(self, arch: str = "ViT-H-14"):
        import open_clip
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float16)
        try:
            self.model = open_clip.create_model(arch, pretrained=None)
        finally:
            torch.set_default_dtype(default)
        self.model.eval().requires_grad_(False)
        self.batch_size = 32

    def model_size(self) -> int:
        from treegrpo.memory import module_bytes
        return module_bytes(self.model)

    def __call__(self, images, prompts):
        dtype = next(self.model.parameters()).dtype
        x = torch.nn.functional.interpolate(images.float(), size=(224, 224), mode="bicubic").to(dtype)
        tokens = torch.zeros((len(prompts), 77), dtype=torch.long)
        with torch.no_grad():
            a = self.model.encode_image(x)
            b = self.model.encode_text(tokens)
        return (torch.nn.functional.normalize(a.float(), dim=-1) * torch.nn.functional.normalize(b.float(), dim=-1)).sum(-1)


def measure(name: str, prompts_per_iter: int = 2, rank: int = 32) -> dict:
    from treegrpo import memory

    t0 = time.perf_counter()
    # everything stays on the CPU in the dtype it was built in: module moves and casts (ComfyUI's model loading,
    # open_clip's) are no-ops here, and fake weights could not be swapped in place anyway
    apply = torch.nn.Module._apply
    torch.nn.Module._apply = lambda self, fn, recurse=True: self
    try:
        fp, wl, px, cfg_scale, shape = probe(name, prompts_per_iter, rank)
    finally:
        torch.nn.Module._apply = apply
    return report(name, fp, wl, px, cfg_scale, shape, time.perf_counter() - t0)


def probe(name: str, prompts_per_iter: int, rank: int):
    """The Train node's policy on the model built in a fake mode, measured by ``memory.probe_policy`` in it."""
    from treegrpo import memory
    from treegrpo.comfyui.policy import DEFAULT_TARGETS, ComfyPolicy
    from treegrpo.config import LoraConfig, OptimConfig

    mode = memory.fake_mode()
    with mode:
        patcher, (pos, neg), px, cfg_scale, vae_kind = build_denoiser(name)
        vae_model = build_vae(vae_kind)
        reward = HPSScorer()
    c = patcher.model.latent_format.latent_channels
    shape = (c, 1, px // 8, px // 8) if getattr(patcher.model.latent_format, "latent_dimensions", 2) == 3 \
        else (c, px // 8, px // 8)
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["p"], [(pos, neg)], shape, vae=FakeVAE(vae_model, torch.bfloat16),
                          lora_cfg=LoraConfig(rank=rank, alpha=2.0 * rank, targets=DEFAULT_TARGETS))
        wl = memory.Workload(trees=prompts_per_iter, branching=(2, 2, 2), microbatch=64,
                             decode_batch=pol.decode_batch, reward_batch=reward.batch_size)
        fp = memory.probe_policy(pol, "p", cfg_scale, list(pol.lora.parameters()), rewards=[reward], fake=mode,
                                 kl=OptimConfig().kl_beta > 0, **memory.probe_rows(wl))   # the default's KL term
    return fp, wl, px, cfg_scale, shape


def report(name, fp, wl, px, cfg_scale, shape, seconds) -> dict:
    from treegrpo import memory

    out = {"model": name, "px": px, "cfg": cfg_scale, "latent": list(shape),
           "weights_gb": {k: v / GB for k, v in fp.weights.items()}, "lora_gb": fp.lora / GB,
           "probe_s": seconds, "footprint": fp.to_dict()}   # benchmarks/gpu_memory.py plans from it on a GPU
    for label, ck in (("no_checkpointing", False), ("checkpointing", True)):
        if ck and fp.update_ckpt is None:
            continue
        peaks = memory.predict(fp, dataclasses.replace(wl, checkpointing=ck, microbatch=min(wl.microbatch, wl.parents)))
        out[label] = {k: v / GB for k, v in peaks.items()}
    least = min((memory.Plan(c_, memory.predict(fp, c_), 0) for c_ in memory.candidates(wl, fp)),
                key=lambda p: p.peak)
    out["smallest"] = {"peak_gb": least.peak / GB, "settings": least.line().split(", ", 1)[1]}
    out["plans"] = {}
    for b in BUDGETS_GB:
        try:
            p = memory.plan(fp, wl, b * GB, suggest=lambda short, b=b: memory.smallest_change(fp, wl, b * GB))
            out["plans"][str(b)] = p.line()
        except memory.MemoryPlanError as e:
            out["plans"][str(b)] = "does not fit: " + str(e)
    out["target_gb"] = MODELS[name][-1]
    return out


def checkpointing_time_ratio(reps: int = 3) -> dict:
    """Forward + backward time with / without gradient checkpointing, real tensors on this CPU: Flux.1's width
    (3072, 24 heads) with 2 double + 2 single blocks, 256×256 px (256 image + 64 text tokens), 1 row."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm

    from treegrpo.comfyui.policy import DEFAULT_TARGETS, ComfyPolicy
    from treegrpo.config import LoraConfig

    from comfy_test_pack.compat import newer_fields
    unet = dict(FLUX_DEV, depth=2, depth_single_blocks=2)
    cfg = sm.Flux(newer_fields(unet))
    cfg.set_inference_dtype(torch.float32, None)
    model = cfg.get_model({})
    with torch.no_grad():
        for t in [*model.diffusion_model.parameters()]:
            t.normal_(0, 0.02)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    cond = [[torch.randn(1, 64, 4096), {"pooled_output": torch.randn(1, 768), "guidance": 3.5}]]
    out = {}
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["p"], [(cond, cond)], (16, 32, 32),
                          lora_cfg=LoraConfig(rank=32, alpha=64.0, targets=DEFAULT_TARGETS))
        params = list(pol.lora.parameters())
        x, sigma, c = torch.randn(1, 16, 32, 32), pol.sigmas(10)[[3]], pol.encode_prompts(["p"])
        for ck in (False, True, False, True):
            pol.set_gradient_checkpointing(ck)

            def step():
                with torch.enable_grad():
                    t = time.perf_counter()
                    for _ in range(reps):
                        torch.autograd.grad(pol.denoise(x, sigma, c, 1.0).square().sum(), params, allow_unused=True)
                    return (time.perf_counter() - t) / reps
            out.setdefault(ck, []).append(pol.run(step))
    off, on = min(out[False]), min(out[True])
    return {"update_s_without": off, "update_s_with": on, "ratio": on / off,
            "setup": "Flux.1 width, 2+2 blocks, 256 px, 1 row, float32, CPU"}


LABELS = {"sd15": "SD1.5", "sdxl": "SDXL", "sd35m": "SD3.5-Medium", "flux_bf16": "Flux.1-dev bf16",
          "flux_fp8": "Flux.1-dev fp8", "qwen_image_fp8": "Qwen-Image fp8"}


def markdown(result: dict) -> str:
    """The README's table from a results file."""
    lines = ["| model @ px | weights: denoiser / VAE / HPS (GB) | peak, all 14 parents in one pass: without / with "
             "checkpointing (GB) | smallest planned peak (GB) and its settings | target (GB) |",
             "|---|---|---|---|---|"]
    for r in result["models"]:
        w = r["weights_gb"]
        nc, ck = max(r["no_checkpointing"].values()), max(r.get("checkpointing", {"x": float("nan")}).values())
        target = r["target_gb"]
        ok = "" if target is None else (" ✓" if r["smallest"]["peak_gb"] <= target else " ✗")
        settings = re.sub(r"(\d+) images? per reward call", r"reward batch \1", r["smallest"]["settings"]) \
            .replace("reward models on CPU while sampling and training", "rewards on CPU")
        lines.append(f"| {LABELS.get(r['model'], r['model'])} @ {r['px']} | {w.get('denoiser', 0):.1f} / "
                     f"{w.get('vae', 0):.2f} / {w.get('rewards', 0):.1f} | {nc:.0f} / {ck:.1f} | "
                     f"**{r['smallest']['peak_gb']:.1f}**: {settings} | {target or '–'}{ok} |")
    t = result.get("checkpointing_time")
    if t:
        lines.append("")
        lines.append(f"Gradient checkpointing costs {t['ratio']:.2f}× the update time without it ({t['setup']}).")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "memory.json"))
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print the README table of --out and exit")
    ap.add_argument("--merge", action="store_true", help="replace only these models' rows in --out")
    ns = ap.parse_args(argv)
    if ns.markdown:
        with open(ns.out, encoding="utf-8") as fh:
            print(markdown(json.load(fh)))
        return 0
    import comfy_harness as ch
    ch.boot_comfy(ch.REPO_ROOT, tempfile.mkdtemp(prefix="bench-memory-"),
                  extra_argv=["--use-pytorch-cross-attention"])
    rows = []
    for name in ns.models.split(","):
        try:
            r = measure(name)
        except Exception as e:  # one architecture failing must not cost the others
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
            continue
        rows.append(r)
        nc, ck = r["no_checkpointing"], r.get("checkpointing", {})
        print(f"{name:16s} weights {sum(r['weights_gb'].values()):6.2f} GB | peak without checkpointing "
              f"{max(nc.values()):6.2f} GB, with {max(ck.values()) if ck else float('nan'):6.2f} GB | smallest plan "
              f"{r['smallest']['peak_gb']:6.2f} GB | target {r['target_gb']} | probes {r['probe_s']:.0f} s", flush=True)
    result = {"comfyui": ch.comfyui_version(), "models": rows}
    if ns.merge and os.path.exists(ns.out):
        with open(ns.out, encoding="utf-8") as fh:
            old = json.load(fh)
        mine = {r["model"] for r in rows}
        result = dict(old, models=[r for r in old["models"] if r["model"] not in mine] + rows)
    if not ns.skip_timing:
        result["checkpointing_time"] = checkpointing_time_ratio()
        print("checkpointing time ratio (CPU):", json.dumps(result["checkpointing_time"]))
    write_json(ns.out, result)
    return 0


def write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
