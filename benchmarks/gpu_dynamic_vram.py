"""Training a model ComfyUI 0.33+ loaded with Dynamic VRAM (``ModelPatcherDynamic``, the default on NVIDIA): the
check that needs a GPU (on a CPU ComfyUI never makes a dynamic patcher). ComfyUI (the newest tree of
``../shared/comfyui/``, or the extracted one in ``.cache/comfyui-<version>``) is booted in this process on the GPU and
Dynamic VRAM switched on as its main.py does; a Flux-shaped model (the shapes ComfyUI's model detection reads, one
block of each kind, random weights) is saved as a diffusion-model file and loaded by the core loader, once dynamic
and once plain. The LoRA gradient of ``Σ denoise·w`` through the pack's policy must be the same for both (the pack
trains a dynamic patcher through its non-dynamic delegate), and the update time of each is reported.

    python benchmarks/gpu_dynamic_vram.py [--device cuda] [--out benchmarks/results/dynamic_vram.json]
    python benchmarks/gpu_dynamic_vram.py --device cpu --hidden 256    # a smoke test: the plain path only
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.dirname(HERE))   # the pack's treegrpo/, also where it is not installed (a bare GPU machine)


def enable_dynamic_vram() -> bool:
    """What ComfyUI 0.33's main.py does when it turns Dynamic VRAM on; False where it cannot (no NVIDIA, old torch)."""
    import comfy.memory_management
    import comfy.model_management as mm
    import comfy.model_patcher as cmp
    try:
        import comfy_aimdo.control
    except ImportError:
        return False
    if not hasattr(cmp, "ModelPatcherDynamic") or not mm.is_nvidia():
        return False
    devices = mm.get_all_torch_devices()
    try:
        ok = comfy_aimdo.control.init_devices((d.index, 1024 ** 3) for d in devices)
    except TypeError:
        ok = comfy_aimdo.control.init_devices(d.index for d in devices)
    if ok:
        cmp.CoreModelPatcher = cmp.ModelPatcherDynamic
        comfy.memory_management.aimdo_enabled = True
    return bool(ok)


def flux_file(folder: str, hidden: int) -> str:
    """A Flux.1 file model detection accepts (axes 16/56/56, head dim 128), one double and one single block."""
    import comfy.supported_models as sm
    from comfy_test_pack.compat import newer_fields
    from safetensors.torch import save_file

    heads = hidden // 128
    unet = newer_fields({"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16,
                         "vec_in_dim": 768, "context_in_dim": 4096, "hidden_size": hidden, "mlp_ratio": 4.0,
                         "num_heads": heads, "depth": 1, "depth_single_blocks": 1, "axes_dim": [16, 56, 56],
                         "theta": 10000, "patch_size": 2, "qkv_bias": True})
    model = sm.Flux(unet).get_model({})
    g = torch.Generator().manual_seed(0)
    sd = {k: (torch.randn(v.shape, generator=g) * 0.02).to(torch.bfloat16).contiguous()
          for k, v in model.diffusion_model.state_dict().items()}
    path = os.path.join(folder, "flux_dynamic_check.safetensors")
    save_file(sd, path)
    return path


def gradient(patcher, shape, seed=0):
    from treegrpo.comfyui.families import FLUX
    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.config import LoraConfig

    g = torch.Generator().manual_seed(seed)
    cond = [[torch.randn(1, 16, 4096, generator=g), {"pooled_output": torch.randn(1, 768, generator=g),
                                                     "guidance": 3.5}]]
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["p"], [(cond, cond)], shape, lora_cfg=LoraConfig(rank=8, alpha=8.0,
                                                                                     targets=list(FLUX)))
        with torch.no_grad():
            for p in pol.lora.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    x, w = torch.randn((2, *shape), generator=g), torch.randn((2, *shape), generator=g)
    times = []

    def step():
        for p in pol.lora.parameters():
            p.grad = None
        t0 = time.perf_counter()
        with torch.enable_grad():
            (pol.denoise(x, pol.sigmas(10)[[2, 5]], pol.encode_prompts(["p", "p"]), 1.0).double() * w.to(pol.device)
             ).sum().backward()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)

    for _ in range(3):
        pol.run(step)
    grad = torch.cat([p.grad.flatten().float().cpu() for p in pol.lora.parameters()])
    return grad, min(times), type(pol.patcher).__name__


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--px", type=int, default=512)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "dynamic_vram.json"))
    a = ap.parse_args(argv)
    import comfy_harness as ch

    os.environ[ch.LANE_ENV] = "newest"
    base = tempfile.mkdtemp(prefix="gpu_dynamic_vram-")
    ch.boot_comfy_core(cpu=a.device == "cpu")
    dynamic_on = a.device != "cpu" and enable_dynamic_vram()
    try:
        path = flux_file(base, a.hidden)
        out = measure(path, a, dynamic_on)
    finally:
        shutil.rmtree(base, ignore_errors=True)   # the checkpoint written for the measurement (10 MB at the smoke size)
    print(json.dumps(out, indent=1))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


def measure(path: str, a, dynamic_on: bool) -> dict:
    """The update's gradient through a plain load and, where Dynamic VRAM is on, through ComfyUI's dynamic patcher."""
    import comfy.model_patcher as cmp
    import comfy.sd

    import comfy_harness as ch

    shape = (16, a.px // 8, a.px // 8)
    out = {"comfyui": ch.comfyui_version(), "device": a.device, "hidden": a.hidden, "px": a.px,
           "dynamic_vram": dynamic_on}
    plain = comfy.sd.load_diffusion_model(path, disable_dynamic=True)
    g_plain, t_plain, _ = gradient(plain, shape)
    out["plain"] = {"update_s": t_plain}
    if dynamic_on:
        dyn = comfy.sd.load_diffusion_model(path)
        assert isinstance(dyn, cmp.ModelPatcherDynamic), type(dyn)
        g_dyn, t_dyn, trained = gradient(dyn, shape)
        rel = float((g_dyn - g_plain).abs().max() / g_plain.abs().max())
        out["dynamic"] = {"update_s": t_dyn, "trained_on": trained, "max_rel_grad_diff": rel}
        print(f"dynamic patcher trained on {trained}: gradient differs from the plain load by {rel:.1e}")
        assert rel < 1e-3, out
    return out


if __name__ == "__main__":
    main()
