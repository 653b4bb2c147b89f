"""The cost of one iteration at real size (issue 35): TreeGRPO, window-SDE GRPO and all-step GRPO at the workflows'
settings on the published architectures with random weights, through the ComfyUI path (the Train node's
``ComfyPolicy`` and ``Trainer``), each phase timed on this CPU, beside the closed-form NFE.

Settings of ``workflows/treegrpo_<model>_lora.json``: T = 20 steps (Flux 16), window at step 1 of width 3, k = 2
(8 leaves a tree), 2 prompts an iteration, CFG 4.5 (Flux 1.0, distilled guidance 3.5), LoRA rank 32 on the Train
node's targets, no gradient checkpointing. Window GRPO: 8 trajectories a prompt, SDE on the same 3 steps; all-step
GRPO: 8 trajectories, SDE on every step but the last (to σ = 0). All three decode and score 16 images an iteration.

An iteration of these models takes hours on a CPU (SD1.5 at 128 px: 1.2 s per denoiser row, 544 rows to sample one
tree iteration), so each iteration is *composed* from measured unit costs and the closed-form counts, and the
composition is checked against iterations run whole:

- **Unit costs** of the published architecture at ``--px`` (default 64 px; the width and depth are the published
  ones): a denoiser call as per call + per row × rows, from calls of 1 and ``BATCH`` rows (each x row carries both
  CFG conds), for a forward and for a forward + backward to the LoRA. SD1.5 and SDXL are measured at their published
  depth; SD3.5-Medium and Flux.1-dev (too slow, and Flux too large: 48 GB in float32) from reduced depths fitted as
  fixed + Σ per-block cost × blocks (``FITS``).
- **Composed iteration**: sample = T calls + NFE rows; update = ⌈parents ÷ microbatch⌉ calls + parents trained
  (forward + backward); decode =
  ComfyUI's ``VAE`` (random SD / SD3 weights) on the 16 latents; reward = HPS v2.1's network (open_clip ViT-H-14,
  random weights) on 16 images, timed once (it resizes to 224 px: the same for every model and method).
- **Check**: SD1.5 at reduced depth (``ITERATE``) runs each method's whole iteration through the Train node's
  ``Trainer`` and ``ComfyPolicy``; its NFE and parents are the closed form, and its sample and update phases are
  compared with their composition from the same model's per-row costs.

The ratios are what a GPU user sees up to the GPU's own balance of the phases (batching is cheaper there); the
prepared GPU script measures whole iterations at full resolution.

    python benchmarks/bench_iteration.py                     # writes benchmarks/results/iteration.json
    python benchmarks/bench_iteration.py --models sd15 --px 64
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "tests"))

#: the workflows' Train node settings (workflows/treegrpo_*_lora.json)
WORKFLOW = {"sd15": dict(steps=20, cfg=4.5), "sdxl": dict(steps=20, cfg=4.5), "sd35m": dict(steps=20, cfg=4.5),
            "flux_dev": dict(steps=16, cfg=1.0)}
PROMPTS_PER_ITER, RANK, LEAVES = 2, 32, 8

def method_trees(steps: int) -> dict:
    """The three methods' TreeConfig overrides at the workflows' settings (T = ``steps``)."""
    base = dict(steps=steps, window_start=1, window_width=3, branch=2, noise_level=0.7, window_schedule="fixed",
                eta=1.0)
    return {"tree": dict(base, method="tree", antithetic=True),
            "window_grpo": dict(base, method="trajectory", group_size=LEAVES),
            "all_step_grpo": dict(base, method="trajectory", group_size=LEAVES, window_start=0,
                                  window_width=steps - 1)}


def architectures() -> dict:
    """name -> (ComfyUI supported_models class, published unet_config, context (tokens, dim), pooled dim, VAE kind):
    bench_memory's published configs (tests swap in tiny ones)."""
    import bench_memory

    out = {}
    for name, key in (("sd15", "sd15"), ("sdxl", "sdxl"), ("sd35m", "sd35m"), ("flux_dev", "flux_bf16")):
        cls_name, unet, _, _, _, ctx, pooled, _, vae_kind, _ = bench_memory.MODELS[key]
        out[name] = (cls_name, unet, ctx, pooled, vae_kind)
    return out


def random_init(state: dict, g) -> dict:
    """Random weights in place (ComfyUI's layers skip torch's initialisation, leaving memory as it was): matrices and
    kernels N(0, 0.02²), norm scales 1, biases and other vectors 0. Returns ``state``."""
    import torch

    with torch.no_grad():
        for k, v in state.items():
            if not v.is_floating_point():
                continue
            if v.dim() > 1:
                v.copy_(torch.randn(v.shape, generator=g) * 0.02)
            else:
                v.fill_(1.0 if k.endswith("weight") or k.endswith(".scale") else 0.0)
    return state


def build_model(name: str, overrides: dict | None, px: int, arch: dict | None = None):
    """ComfyUI's model of ``name`` (its published unet_config with ``overrides``) with random float32 weights, in a
    ModelPatcher, with its positive and negative conds, the latent shape at ``px`` and its VAE kind."""
    import torch

    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm
    from comfy_test_pack.compat import newer_fields

    cls_name, unet, ctx, pooled, vae_kind = (arch or architectures())[name]
    cfg = getattr(sm, cls_name)(newer_fields({**unet, **(overrides or {})}))
    cfg.set_inference_dtype(torch.float32, None)
    model = cfg.get_model({})
    g = torch.Generator().manual_seed(0)
    random_init(model.diffusion_model.state_dict(), g)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    extra = {"pooled_output": torch.randn(1, pooled, generator=g)} if pooled else {}
    if cls_name == "Flux":
        extra["guidance"] = 3.5
    if cls_name == "SDXL":
        extra.update(width=px, height=px, target_width=px, target_height=px)

    def cond():
        return [[torch.randn(1, *ctx, generator=g), dict(extra)]]

    c = model.latent_format.latent_channels
    return patcher, (cond(), cond()), (c, px // 8, px // 8), vae_kind


def build_vae(kind: str, ch: int = 128):
    """ComfyUI's ``VAE`` from a random-weight state dict of the SD (4-channel) or SD3/Flux (16-channel) VAE
    (``ch``: the published 128; tests take less)."""
    import torch

    import bench_memory
    import comfy.sd
    from comfy.ldm.models.autoencoder import AutoencoderKL

    conf = bench_memory.SD_VAE if kind == "sd" else bench_memory.SD3_VAE
    m = AutoencoderKL(ddconfig={**conf["ddconfig"], "ch": ch}, embed_dim=conf["embed_dim"])
    sd = random_init(m.state_dict(), torch.Generator().manual_seed(1))
    if ch == 128:
        return comfy.sd.VAE(sd=sd)     # detected from the keys, as ComfyUI's VAELoader does
    vae = comfy.sd.VAE(sd=sd, config={"params": {"ddconfig": {**conf["ddconfig"], "ch": ch},
                                                 "embed_dim": conf["embed_dim"]}})
    vae.latent_channels = conf["embed_dim"]
    return vae


def _policy(patcher, conds, shape, vae):
    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.config import LoraConfig

    return ComfyPolicy(patcher, ["p0", "p1"], [conds, conds], shape, vae=vae, scheduler="simple", seed=0,
                       lora_cfg=LoraConfig(rank=RANK, alpha=2.0 * RANK, targets=["auto"]))


def _stand_in_reward(images, prompts):
    """A free stand-in for the reward inside the iteration (HPS is timed once, beside it): seeded uniform scores,
    unrelated to the images (random-weight images barely differ, and a tree whose rewards are all equal is not
    trained on), so the update trains every edge as in a run; its time does not depend on the values."""
    import torch

    return torch.rand(images.shape[0], generator=torch.Generator().manual_seed(images.shape[0]))


def iteration_phases(patcher, conds, shape, vae, name: str, method: str) -> dict:
    """One iteration of ``method`` through the Train node's Trainer (after :func:`row_costs` warmed the caches);
    returns its phases in seconds, the NFE counted and the closed form."""
    import torch

    from treegrpo.config import TrainConfig
    from treegrpo.trainer import Trainer
    from treegrpo.tree import expected_nfe

    w = WORKFLOW[name]
    cfg = TrainConfig.from_dict(dict(
        backend="comfy", prompts=["p0", "p1"], guidance_scale=w["cfg"], tree=method_trees(w["steps"])[method],
        prompts_per_iter=PROMPTS_PER_ITER, seed=0, eval_every=0, checkpoint_every=0, iterations=1,
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "bench_iteration"),
        lora=dict(rank=RANK, alpha=2.0 * RANK, targets=["auto"]), optim=dict(lr=3e-4),
        rewards=[dict(name="stand_in")]))
    with torch.inference_mode(False):
        pol = _policy(patcher, conds, shape, vae)
        tr = Trainer(cfg, pol, {"stand_in": _stand_in_reward}, progress=False, base_model_name=name)
        tr.log = lambda *_: None
        stats = tr.train_step()
    return {**{k: stats[k] for k in ("t_sample", "t_decode", "t_update")}, "nfe": stats["nfe"], "calls": stats["calls"],
            "parents": stats["parents"], "edges": stats["edges"],
            "nfe_closed_form": PROMPTS_PER_ITER * expected_nfe(cfg.tree, guidance=cfg.guidance_scale)}


def _clock() -> float:
    """``time.perf_counter()`` after the GPU's queued work (if any) has finished."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


#: rows of the larger batch the per-row costs are measured at (beside 1 row): the sampler's tail calls carry the
#: 16 leaves of an iteration, the update's the parents of a microbatch
BATCH = 8


def row_costs(patcher, conds, shape, guidance: float, reps: int = 1) -> dict:
    """Seconds of one denoiser call as ``per_call + per_row × rows``, fitted through 1 and :data:`BATCH` rows
    (x rows; with CFG each carries both conds), for a forward without grad and a forward + backward to the LoRA;
    each point after a warm-up, the best of ``reps``."""
    import torch

    from treegrpo.comfyui.policy import ComfyPolicy
    from treegrpo.config import LoraConfig

    out = {}
    with torch.inference_mode(False):
        pol = ComfyPolicy(patcher, ["p"], [conds], shape, lora_cfg=LoraConfig(rank=RANK, alpha=2.0 * RANK,
                                                                                targets=["auto"]))
        params = list(pol.lora.parameters())
        for rows in (1, BATCH):
            x, sigma = torch.randn(rows, *shape).to(pol.device), pol.sigmas(20)[[3] * rows].to(pol.device)
            c = pol.encode_prompts(["p"] * rows)

            def fwd():
                with torch.no_grad():
                    t = _clock()
                    pol.denoise(x, sigma, c, guidance)
                    return _clock() - t

            def fwd_bwd():
                with torch.enable_grad():
                    t = _clock()
                    torch.autograd.grad(pol.denoise(x, sigma, c, guidance).square().sum(), params, allow_unused=True)
                    return _clock() - t

            out[rows] = (min([pol.run(fwd) for _ in range(reps + 1)][1:]),
                         min([pol.run(fwd_bwd) for _ in range(reps + 1)][1:]))
    res = {}
    for i, key in enumerate(("forward", "forward_backward")):
        per_row = (out[BATCH][i] - out[1][i]) / (BATCH - 1)
        res[key] = {"per_call": out[1][i] - per_row, "per_row": per_row, "at_1": out[1][i], f"at_{BATCH}": out[BATCH][i]}
    return res


def hps_seconds(images: int = PROMPTS_PER_ITER * LEAVES) -> float:
    """HPS v2.1's network (open_clip ViT-H-14, random weights, float32) scoring ``images`` images at 224 px."""
    import open_clip
    import torch

    model = open_clip.create_model("ViT-H-14", pretrained=None).eval()
    tok = open_clip.get_tokenizer("ViT-H-14")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(dev)
    x = torch.rand(images, 3, 224, 224, device=dev)
    text = tok(["a prompt"] * images).to(dev)
    best = math.inf
    with torch.no_grad():
        for _ in range(2):
            t = _clock()
            a = model.encode_image(x)
            b = model.encode_text(text)
            torch.nn.functional.cosine_similarity(a, b)
            best = min(best, _clock() - t)
    return best


def _free(*objs) -> None:
    import gc

    import comfy.model_management as mm
    # only this benchmark's models leave ComfyUI's loaded list (unload_all_models would also unload what others in
    # the process loaded, e.g. a test's models on fake tensors, which cannot be moved); on the CPU their weights
    # already sit where they would be offloaded to, so dropping the references frees them
    mine = {id(o) for o in objs} | {id(getattr(o, "patcher", None)) for o in objs}
    for i in reversed(range(len(mm.current_loaded_models))):
        if id(getattr(mm.current_loaded_models[i], "model", None)) in mine:
            mm.current_loaded_models.pop(i)
    del objs
    gc.collect()


#: the published VAE's base width (tests take less)
VAE_CH = 128

#: models whose iterations run whole on this CPU, at a reduced depth (unet_config overrides): they check the
#: composition (:func:`composed`) against measured phases
ITERATE = {"sd15": {"num_res_blocks": [1, 1, 1, 1], "transformer_depth": [1, 1, 1, 0],
                    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 0, 0]}}

#: models too slow or too large here at the published depth: per-row costs measured at reduced depths and fitted as
#: fixed + Σ per-block cost × blocks (as many depths as unknowns: an exact solve), then evaluated at the published
#: block counts. SD3.5-Medium: 24 joint blocks, 13 with the extra self-attention (MMDiT-X); Flux.1-dev: 19 double +
#: 38 single blocks (12 B parameters, 48 GB in float32).
FITS = {"sd35m": {"blocks": ("with_self_attention", "without"), "published": (13, 11),
                  "depths": ({"num_blocks": 2, "x_block_self_attn_layers": [0, 1]},
                             {"num_blocks": 4, "x_block_self_attn_layers": [0, 1]},
                             {"num_blocks": 4, "x_block_self_attn_layers": [0, 1, 2, 3]})},
        "flux_dev": {"blocks": ("depth", "depth_single_blocks"), "published": (19, 38),
                     "depths": ({"depth": 1, "depth_single_blocks": 1}, {"depth": 2, "depth_single_blocks": 1},
                                {"depth": 1, "depth_single_blocks": 2})}}


def _blocks(name: str, ov: dict) -> list[int]:
    """The block counts of a FITS depth, per kind."""
    if name == "sd35m":
        n, sa = ov["num_blocks"], len(ov["x_block_self_attn_layers"])
        return [sa, n - sa]
    return [ov[k] for k in FITS[name]["blocks"]]


def counts(name: str, method: str) -> dict:
    """Closed-form work of one iteration: denoiser rows sampled (NFE, CFG rows included) in T batched calls (one per
    step: every tree's nodes at that step, both CFG conds), and parents trained (a forward + backward each, both
    CFG rows) in calls of the microbatch."""
    import bench_steps
    from treegrpo.config import TrainConfig
    from treegrpo.tree import expected_nfe

    w = WORKFLOW[name]
    cfg = TrainConfig.from_dict(dict(backend="comfy", prompts=["p"], guidance_scale=w["cfg"], prompts_per_iter=PROMPTS_PER_ITER,
                                     tree=method_trees(w["steps"])[method]))
    parents = PROMPTS_PER_ITER * bench_steps.trained_parents(cfg)
    return {"nfe": PROMPTS_PER_ITER * expected_nfe(cfg.tree, guidance=cfg.guidance_scale), "calls": cfg.tree.steps,
            "parents": parents, "update_calls": math.ceil(parents / cfg.optim.microbatch)}


def composed(name: str, method: str, costs: dict, decode_s: float, reward_s: float) -> dict:
    """One iteration's phases in seconds from the closed-form counts and the per-call and per-row costs: sampling =
    calls × per call + x rows (NFE ÷ CFG rows) × per row; the update likewise with forward + backward per parent;
    decode and reward as measured."""
    c = counts(name, method)
    cfg_rows = 2 if WORKFLOW[name]["cfg"] > 1 else 1
    f, fb = costs["forward"], costs["forward_backward"]
    return {"t_sample": c["calls"] * f["per_call"] + c["nfe"] / cfg_rows * f["per_row"], "t_decode": decode_s,
            "t_reward": reward_s, "t_update": c["update_calls"] * fb["per_call"] + c["parents"] * fb["per_row"], **c}


def decode_seconds(vae, shape, images: int = PROMPTS_PER_ITER * LEAVES) -> float:
    """ComfyUI's VAE decoding ``images`` latents of ``shape`` (the best of 2)."""
    import torch

    lat = torch.randn(images, *shape, generator=torch.Generator().manual_seed(0))
    best = math.inf
    for _ in range(2):
        t = _clock()
        vae.decode(lat)
        best = min(best, _clock() - t)
    return best


def published_costs(name: str, px: int) -> dict:
    """Per-row costs of the published-depth model: measured on it, or from the block fit (:data:`FITS`)."""
    w = WORKFLOW[name]
    if name not in FITS:
        p, c, sh, _ = build_model(name, None, px)
        out = {"costs": row_costs(p, c, sh, w["cfg"])}
        _free(p)
        return out
    pts = []
    for ov in FITS[name]["depths"]:
        p, c, sh, _ = build_model(name, ov, px)
        pts.append((_blocks(name, ov), row_costs(p, c, sh, w["cfg"])))
        _free(p)
        print(f"{name} at {ov}: {pts[-1][1]}", flush=True)
    out = {"costs": {}, "fit": {}, "points": [{"blocks": b, **r} for b, r in pts]}
    for key in ("forward", "forward_backward"):
        out["costs"][key], out["fit"][key] = {}, {}
        for part in ("per_call", "per_row"):
            out["fit"][key][part] = coef = fit_blocks([(b, r[key][part]) for b, r in pts])
            out["costs"][key][part] = coef[0] + sum(c * n for c, n in zip(coef[1:], FITS[name]["published"]))
    return out


def measure_model(name: str, px: int, methods: list[str], reward_s: float) -> dict:
    """The published model's per-row costs and decode time, every method's iteration composed from them; for the
    :data:`ITERATE` models also each method's iteration run whole at the reduced depth beside its composition."""
    w = WORKFLOW[name]
    out = {"model": name, "px": px, **w}
    if name in ITERATE:   # None: the published depth (--whole)
        patcher, conds, shape, vae_kind = build_model(name, ITERATE[name], px)
        vae = build_vae(vae_kind, VAE_CH)
        reduced = row_costs(patcher, conds, shape, w["cfg"])      # also warms the caches for the iterations
        out["check"] = {"depth": ITERATE[name], "costs": reduced, "methods": {}}
        for m in methods:
            r = iteration_phases(patcher, conds, shape, vae, name, m)
            pred = composed(name, m, reduced, r["t_decode"], 0.0)
            out["check"]["methods"][m] = {"measured": r, "composed": pred,
                                          "sample_ratio": pred["t_sample"] / r["t_sample"],
                                          "update_ratio": pred["t_update"] / r["t_update"]}
            print(f"{name} {m} at reduced depth: NFE {r['nfe']} (closed form {r['nfe_closed_form']}), parents "
                  f"{r['parents']}; sample {r['t_sample']:.1f} s (composed {pred['t_sample']:.1f}), decode "
                  f"{r['t_decode']:.1f} s, update {r['t_update']:.1f} s (composed {pred['t_update']:.1f})", flush=True)
        _free(patcher, vae)
    pub = published_costs(name, px)
    out.update(pub)
    vae_kind = architectures()[name][4]
    vae = build_vae(vae_kind, VAE_CH)
    out["decode_s"] = decode_seconds(vae, (4 if vae_kind == "sd" else 16, px // 8, px // 8))
    _free(vae)
    out["methods"] = {m: composed(name, m, out["costs"], out["decode_s"], reward_s) for m in methods}
    print(f"{name}: published depth {out['costs']}, decode {out['decode_s']:.2f} s", flush=True)
    return out


def fit_blocks(points: list[tuple[list[int], float]]) -> list[float]:
    """``[fixed, per block of kind 1, ...]`` with cost = fixed + Σ per_block·blocks through ``points``
    ``[(blocks per kind, cost), ...]`` (least squares; exact with as many points as unknowns)."""
    import torch

    a = torch.tensor([[1.0, *b] for b, _ in points], dtype=torch.float64)
    y = torch.tensor([[c] for _, c in points], dtype=torch.float64)
    return [float(v) for v in torch.linalg.lstsq(a, y).solution[:, 0]]


def summarise(models: list[dict]) -> dict:
    """Per model: each method's composed iteration in seconds (sample + decode + reward + update) and the ratios
    tree ÷ window GRPO and tree ÷ all-step GRPO, in time and in NFE."""
    rows = {}
    for r in models:
        it = {m: sum(ph[k] for k in ("t_sample", "t_decode", "t_reward", "t_update")) for m, ph in r["methods"].items()}
        row = {"iteration_s": it}
        for base in ("window_grpo", "all_step_grpo"):
            if "tree" in it and base in it:
                row[f"tree_over_{base}"] = it["tree"] / it[base]
                row[f"nfe_tree_over_{base}"] = r["methods"]["tree"]["nfe"] / r["methods"][base]["nfe"]
        rows[r["model"]] = row
    return rows


LABELS = {"sd15": "SD1.5", "sdxl": "SDXL", "sd35m": "SD3.5-Medium", "flux_dev": "Flux.1-dev"}


def markdown(res: dict) -> str:
    lines = ["| model | method | NFE | parents trained | sample s | decode s | reward s | update s | iteration s | "
             "tree ÷ this |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["models"]:
        it = res["summary"][r["model"]]["iteration_s"]
        for m, ph in r["methods"].items():
            ratio = it["tree"] / it[m] if "tree" in it else math.nan
            lines.append(f"| {LABELS.get(r['model'], r['model'])} | {m} | {ph['nfe']} | {ph['parents']} | "
                         f"{ph['t_sample']:.0f} | {ph['t_decode']:.1f} | {ph['t_reward']:.1f} | {ph['t_update']:.0f} | "
                         f"{it[m]:.0f} | {ratio:.2f} |")
    checks = [(r["model"], m, c) for r in res["models"] for m, c in r.get("check", {}).get("methods", {}).items()]
    if checks:
        lines += ["", "| model (reduced depth, run whole) | method | sample: composed ÷ measured | "
                      "update: composed ÷ measured |", "|---|---|---|---|"]
        lines += [f"| {LABELS.get(n, n)} | {m} | {c['sample_ratio']:.2f} | {c['update_ratio']:.2f} |"
                  for n, m, c in checks]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(WORKFLOW), help="comma-separated: " + ", ".join(WORKFLOW))
    ap.add_argument("--methods", default="tree,window_grpo,all_step_grpo")
    ap.add_argument("--px", type=int, default=64, help="image size (a multiple of 16)")
    ap.add_argument("--no-hps", action="store_true", help="skip timing HPS v2.1's network (reward column 0)")
    ap.add_argument("--gpu", action="store_true", help="let ComfyUI use the machine's GPU (else it runs with --cpu)")
    ap.add_argument("--whole", action="store_true", help="also run every model's iterations whole at its published "
                    "depth (a GPU machine: benchmarks/gpu_session.sh)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "iteration.json"))
    ns = ap.parse_args(argv)
    models = [m for m in ns.models.split(",") if m]
    unknown = sorted(set(models) - set(WORKFLOW))
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; choose from {sorted(WORKFLOW)}")
    methods = [m for m in ns.methods.split(",") if m]
    bad = sorted(set(methods) - set(method_trees(20)))
    if bad:
        raise SystemExit(f"--methods: unknown {bad}; choose from {sorted(method_trees(20))}")
    if ns.px < 16 or ns.px % 16:
        raise SystemExit(f"--px {ns.px}: a positive multiple of 16 (latents of px/8, patches of 2)")
    if "comfy.model_management" not in sys.modules:   # in a test the harness has booted ComfyUI already
        import comfy_harness as ch
        ch.boot_comfy_core(cpu=not ns.gpu, extra_argv=["--use-pytorch-cross-attention"])

    if ns.whole:
        ITERATE.update({m: None for m in models})
    from treegrpo.io import atomic_write_json

    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    res: list = []
    with torch.inference_mode(False):
        hps_s = 0.0 if ns.no_hps else hps_seconds()
        print(f"HPS v2.1 network, {PROMPTS_PER_ITER * LEAVES} images: {hps_s:.2f} s", flush=True)
        for m in models:   # written after every model: a run cut off by its time limit keeps what it finished
            res.append(measure_model(m, ns.px, methods, hps_s))
            out = {"px": ns.px, "threads": torch.get_num_threads(), "hps_s": hps_s, "models": res,
                   "summary": summarise(res)}
            atomic_write_json(ns.out, out)
    print(markdown(out))
    return out


if __name__ == "__main__":
    main()
