"""Gradient checkpointing on Flux-style models: update time and activations, plain vs checkpointed (as before issue
30, wrong) vs checkpointed with the copy-on-write recomputation (now), through ComfyUI's Flux and Chroma classes with
random weights at a mid size (hidden 512, 2 double + 2 single blocks, 32×32 latents = 256 image tokens, 3 rows).

    python benchmarks/bench_checkpointing.py [--repeats 5] [--out benchmarks/results/checkpointing.json]

Per setting: the median seconds of one update's forward + backward, the activations autograd keeps after the forward
(saved-tensor hooks, weights excluded: with checkpointing only each block's inputs), the bytes the copy-on-write
recomputation copied per update, and the largest relative gradient difference to the plain pass (float32).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def build(arch: str, hidden: int = 512):
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm
    from comfy_test_pack.compat import newer_fields

    torch.manual_seed(0)
    common = {"in_channels": 16, "out_channels": 16, "context_in_dim": 64, "hidden_size": hidden, "mlp_ratio": 4.0,
              "num_heads": hidden // 64, "depth": 2, "depth_single_blocks": 2, "axes_dim": [16, 24, 24],
              "theta": 10000, "patch_size": 2, "qkv_bias": True}
    if arch == "flux":
        cfg = sm.Flux(newer_fields({"image_model": "flux", "guidance_embed": True, "vec_in_dim": 64, **common}))
        extra = {"pooled_output": torch.randn(1, 64), "guidance": 3.5}
    else:
        common.update(in_channels=64, out_channels=64)
        cfg = sm.Chroma(newer_fields({"image_model": "chroma", "in_dim": 64, "out_dim": hidden, "hidden_dim": 64,
                                      "n_layers": 2, **common}))
        extra = {"pooled_output": None, "guidance": 3.5}
    model = cfg.get_model({})
    with torch.no_grad():
        for t in [*model.diffusion_model.parameters(), *model.diffusion_model.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.randn_like(t) * 0.02)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    cond = [[torch.randn(1, 32, 64), extra]]
    shape = (16, 32, 32)
    return patcher, cond, shape


def measure(arch: str, repeats: int) -> dict:
    import treegrpo.comfyui.policy as P
    from treegrpo.config import LoraConfig
    from treegrpo.comfyui.families import FLUX

    patcher, cond, shape = build(arch)
    with torch.inference_mode(False):
        pol = P.ComfyPolicy(patcher, ["p"], [(cond, cond)], shape, lora_cfg=LoraConfig(rank=16, alpha=16.0,
                                                                                        targets=list(FLUX)))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in pol.lora.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    x = torch.randn((3, *shape), generator=g)
    w = torch.randn((3, *shape), generator=g)
    sigma, c = pol.sigmas(10)[[2, 4, 6]], pol.encode_prompts(["p"] * 3)
    modes: list = []
    cow = P._recompute_copy_on_write

    def recording():
        fwd, rec = cow()
        @contextlib.contextmanager
        def wrapped():
            with rec as m:
                modes.append(m)
                yield m
        return fwd, wrapped()

    def old():   # before issue 30: the recomputation without copy-on-write
        return contextlib.nullcontext(), contextlib.nullcontext()

    def one():
        kept = [0]

        below = []

        def pack(t):   # counts, then hands the tensor to the hooks below (the plain pass's copy-on-write)
            if t.grad_fn is not None:
                kept[0] += t.numel() * t.element_size()
            return below[0][0](t) if below[0] is not None else t

        def unpack(h):
            return below[0][1](h) if below[0] is not None else h

        def step():
            for p in pol.lora.parameters():
                p.grad = None
            below[:] = [torch._C._autograd._top_saved_tensors_default_hooks(False)]
            t0 = time.perf_counter()
            with torch.enable_grad():
                with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                    out = pol.denoise(x, sigma, c, 1.0)
                (out.double() * w).sum().backward()
            return time.perf_counter() - t0

        dt = pol.run(step)
        return dt, kept[0], torch.cat([p.grad.flatten() for p in pol.lora.parameters()])

    rows = {}
    for label, on, ctx in (("plain", False, cow), ("checkpointed, before (no copy-on-write)", True, old),
                           ("checkpointed, copy-on-write", True, recording)):
        pol.set_gradient_checkpointing(on)
        P._recompute_copy_on_write = ctx
        try:
            one()   # warm-up
            runs = []
            for _ in range(repeats):
                modes.clear()
                runs.append(one())
        finally:
            P._recompute_copy_on_write = cow
        rows[label] = {"seconds": statistics.median(r[0] for r in runs), "saved_MB": runs[-1][1] / 2**20,
                       "copied_MB": sum(m.copied_bytes for m in modes if m is not None) / 2**20,
                       "grad": runs[-1][2]}
    ref = rows["plain"]["grad"]
    for r in rows.values():
        gr = r.pop("grad")
        r["max_rel_grad_diff"] = float((gr - ref).abs().max() / ref.abs().max())
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "checkpointing.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    import comfy_harness as ch
    ch.boot_comfy(None, tempfile.mkdtemp(prefix="bench_checkpointing-"))
    out = {arch: measure(arch, a.repeats) for arch in ("flux", "chroma")}
    for arch, rows in out.items():
        base = rows["plain"]["seconds"]
        print(f"\n{arch}: | setting | update s (÷ plain) | activations kept MB | copied MB | max grad diff |")
        for label, r in rows.items():
            print(f"| {label} | {r['seconds']:.3f} ({r['seconds'] / base:.2f}) | {r['saved_MB']:.1f} | "
                  f"{r['copied_MB']:.1f} | {r['max_rel_grad_diff']:.1e} |")
    with open(a.out, "w") as f:
        json.dump({"threads": a.threads, "repeats": a.repeats, "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
