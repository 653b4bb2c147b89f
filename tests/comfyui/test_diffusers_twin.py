"""The Train node's LoRA for diffusers: ``<run_name>_diffusers.safetensors`` beside it in the run folder, which
``pipe.load_lora_weights`` reads with every key (diffusers reads none of ComfyUI's keys for SD1.x, SDXL and SD3).

Checked on tiny ComfyUI models whose diffusers twins have the same layout: the weight change diffusers applies to each
of its layers equals ComfyUI's LoRA's (``alpha/r · up @ down``, a fused qkv's rows per layer) for SD1.5, SDXL, SD3
and Flux; for SD1.5 the whole UNet, ComfyUI's weights carried over by ComfyUI's own map, gives the same output in
diffusers with the twin as in ComfyUI with the Train node's file through ComfyUI's LoRA loader."""
import logging

import pytest
import torch

from diffusers_fixtures import build_pipeline
from treegrpo.config import LoraConfig
from treegrpo.lora import read_lora_file, save_lora_file, to_comfy

FLUX = {"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16, "vec_in_dim": 32,
        "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 2, "depth": 1, "depth_single_blocks": 1,
        "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 2, "qkv_bias": True}


def _comfy_model(name: str):
    """A tiny ComfyUI ``BaseModel`` of family ``name`` with random weights, in the diffusers fixtures' layout."""
    import comfy.supported_models as sm
    from comfy_test_pack.compat import newer_fields
    from comfy_test_pack.families import build

    if name != "Flux":          # the test pack's tiny SD1.5, SDXL and SD3 have the diffusers fixtures' layouts
        return build(name)[0].model
    model = sm.Flux(newer_fields(FLUX)).get_model({})    # the test pack's Flux has mlp_ratio 2; diffusers' has 4
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for t in [*model.diffusion_model.parameters(), *model.diffusion_model.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g) * 0.05)
    return model


def _diffusers_pipe(name: str):
    """The diffusers pipeline of the same layout (SDXL: the UNet the test pack's tiny SDXL config describes)."""
    if name != "SDXL":
        return build_pipeline({"SD15": "sd", "SD3": "sd3", "Flux": "flux"}[name])
    import diffusers
    pipe = build_pipeline("sdxl")
    unet = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=256, transformer_layers_per_block=1, projection_class_embeddings_input_dim=2816,
        norm_num_groups=32)
    pipe.register_modules(unet=unet)
    return pipe


def _random_lora(model, seed: int = 0):
    """A ComfyLoRA with the family's default targets and random (non-zero) up weights, as a trained one."""
    from treegrpo.comfyui import families
    from treegrpo.comfyui.policy import ComfyLoRA

    lora = ComfyLoRA(model.diffusion_model, LoraConfig(rank=4, alpha=8.0, targets=families.default_targets(model)),
                     seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in lora.up.values():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lora.weights()


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _load_in_diffusers(pipe, path: str) -> list[str]:
    """``pipe.load_lora_weights(path)``; diffusers' and PEFT's warnings while it loads."""
    h = _Lines()
    loggers = [logging.getLogger(n) for n in ("diffusers", "peft", "")]
    for lg in loggers:
        lg.addHandler(h)
    try:
        pipe.load_lora_weights(path)
    finally:
        for lg in loggers:
            lg.removeHandler(h)
    return [ln for ln in h.lines if any(w in ln.lower() for w in ("unexpected", "missing", "no lora keys", "not loaded"))
            and "prefix='text_encoder" not in ln]       # the twin holds the denoiser's LoRA only


def _applied_deltas(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Layer path → the weight change PEFT adds there (``scaling · B @ A``) after ``load_lora_weights``."""
    out = {}
    for name, m in module.named_modules():
        if hasattr(m, "lora_A") and len(m.lora_A):
            (adapter,) = list(m.lora_A.keys())
            out[name] = m.scaling[adapter] * (m.lora_B[adapter].weight @ m.lora_A[adapter].weight)
    return out


@pytest.mark.parametrize("name", ["SD15", "SDXL", "SD3", "Flux"])
def test_the_diffusers_twin_applies_comfyuis_lora_to_every_diffusers_layer(comfyui, tmp_path, name):
    from treegrpo.comfyui import diffusers_lora

    model = _comfy_model(name)
    w = _random_lora(model)
    layers = diffusers_lora.layer_map(model)
    path = diffusers_lora.save(w, model, str(tmp_path / "run_diffusers.safetensors"))
    assert path
    pipe = _diffusers_pipe(name)
    complaints = _load_in_diffusers(pipe, path)
    assert not complaints, complaints[:3]
    _, component = diffusers_lora.pipeline_of(model)
    got = _applied_deltas(getattr(pipe, component))
    want = {}
    for n in w.modules:
        delta = w.alpha[n] / w.down[n].shape[0] * (w.up[n] @ w.down[n])
        for dname, rows in layers[n]:
            if rows is not None or len(layers[n]) == 1:
                want[dname] = delta if rows is None else delta[rows[0]:rows[0] + rows[1]]
    assert got.keys() == want.keys(), (sorted(got.keys() - want.keys())[:3], sorted(want.keys() - got.keys())[:3])
    bad = [k for k in want if not torch.allclose(got[k], want[k], rtol=1e-5, atol=1e-7)]
    assert not bad, bad[:3]
    fused = sum(1 for n in w.modules if len(layers[n]) > 1)
    assert (fused > 0) == (name in ("SD3", "Flux"))     # the fused qkv / linear1 layers were split
    again = str(tmp_path / "again_diffusers.safetensors")
    diffusers_lora.save(w, model, again)
    assert open(again, "rb").read() == open(path, "rb").read()     # equal LoRAs, equal bytes


def test_sd15_the_twin_in_diffusers_denoises_as_the_comfyui_lora_in_comfyui(comfyui, tmp_path):
    """The whole tiny SD1.5 UNet: ComfyUI's weights carried into the diffusers UNet by ComfyUI's own map (every
    weight, strictly), the Train node's file through ComfyUI's LoRA loader on one side, the twin through
    ``load_lora_weights`` on the other: the same noise prediction."""
    import comfy.lora
    import comfy.model_patcher
    import comfy.utils

    from treegrpo.comfyui import diffusers_lora

    model = _comfy_model("SD15")
    w = _random_lora(model, seed=5)
    comfy_file = save_lora_file(str(tmp_path / "run.safetensors"), to_comfy(w))
    twin = diffusers_lora.save(w, model, str(tmp_path / "run_diffusers.safetensors"))
    pipe = _diffusers_pipe("SD15")
    mapping = comfy.utils.unet_to_diffusers(model.model_config.unet_config)
    ldm = model.diffusion_model.state_dict()
    pipe.unet.load_state_dict({k: ldm[v] for k, v in mapping.items() if v in ldm}, strict=True)   # every weight
    assert not _load_in_diffusers(pipe, twin)

    patcher = comfy.model_patcher.ModelPatcher(model, load_device=torch.device("cpu"),
                                               offload_device=torch.device("cpu"))
    tensors, _ = read_lora_file(comfy_file)
    patches = comfy.lora.load_lora(tensors, comfy.lora.model_lora_keys_unet(model, {}))
    assert len(patcher.add_patches(patches, 1.0)) == len(w.modules)
    patcher.patch_model()
    g = torch.Generator().manual_seed(0)
    x, ctx, t = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 8, 32, generator=g), torch.tensor([500.0, 20.0])
    with torch.no_grad():
        ours = model.diffusion_model(x, timesteps=t, context=ctx)
        theirs = pipe.unet(x, t, encoder_hidden_states=ctx).sample
    patcher.unpatch_model()
    with torch.no_grad():
        base = model.diffusion_model(x, timesteps=t, context=ctx)
    assert (ours - base).abs().max() > 1e-3                    # the LoRA changes the output
    assert torch.allclose(theirs, ours, atol=1e-5, rtol=1e-4), (theirs - ours).abs().max()


def test_a_layer_diffusers_has_no_one_counterpart_of_gives_no_twin(comfyui, tmp_path):
    from treegrpo.comfyui import diffusers_lora
    from treegrpo.lora import LoraWeights

    model = _comfy_model("SD15")
    w = _random_lora(model)
    odd = LoraWeights({**w.down, "time_embed.9": torch.zeros(4, 8)}, {**w.up, "time_embed.9": torch.zeros(8, 4)},
                      {**w.alpha, "time_embed.9": 8.0})
    with pytest.raises(diffusers_lora.NoDiffusersLayout, match="time_embed.9 has no diffusers counterpart"):
        diffusers_lora.save(odd, model, str(tmp_path / "x_diffusers.safetensors"))
    assert not (tmp_path / "x_diffusers.safetensors").exists()


def test_the_train_node_writes_the_twins_in_the_run_folder(comfyui_pack, caplog):
    """A Train node run on SD1.5 leaves ``<run>_diffusers.safetensors`` and ``<run>_best_diffusers.safetensors`` in
    its run folder (not in ``models/loras``, where LoraLoader would list them), says so at its end, and the twin
    of the last LoRA is that LoRA."""
    import os

    from comfy_test_pack.families import build, vae_for
    from treegrpo.comfyui import diffusers_lora
    from treegrpo.comfyui.runtime import latent_shape_for
    from treegrpo.comfyui.train_node import train_full
    from treegrpo.comfyui.watch import loras_folder
    from treegrpo.config import TrainConfig
    from treegrpo.lora import from_state_dict

    patcher, pos, neg, _ = build("SD15")
    vae = vae_for("SD15")
    shape = latent_shape_for(patcher, 8, 8, vae.spacial_compression_decode())
    cfg = TrainConfig(backend="comfy", prompts=["a fox"], rewards=[{"name": "r", "weight": 1.0}],
                      tree={"steps": 3, "window_start": 1, "window_width": 1, "branch": 2},
                      lora={"rank": 2, "alpha": 2.0, "targets": ["auto"]}, optim={"lr": 5e-2, "kl_beta": 0.0},
                      iterations=2, prompts_per_iter=1, eval_every=1, eval_prompts=["a fox"], eval_seeds=1,
                      checkpoint_every=0, run_name="twin_sd15")
    with torch.inference_mode(), caplog.at_level(logging.INFO):
        trainer = train_full(patcher, vae, ["a fox"], [(pos, neg)], {"r": lambda im, p: im.mean(dim=(1, 2, 3))},
                             cfg, shape)
    twins = [os.path.join(trainer.out, f"twin_sd15{s}_diffusers.safetensors") for s in ("", "_best")]
    assert all(os.path.isfile(p) for p in twins)
    assert not [f for f in os.listdir(loras_folder("twin_sd15")) if "diffusers" in f]
    done = [m for m in caplog.messages if "twin_sd15: done" in m]
    assert done and "twin_sd15_diffusers.safetensors and twin_sd15_best_diffusers.safetensors" in done[0]
    last = from_state_dict(*read_lora_file(os.path.join(loras_folder("twin_sd15"), "twin_sd15.safetensors")))
    expected = str(trainer.out) + "/expected_diffusers.safetensors"
    diffusers_lora.save(last, patcher.model, expected)
    assert open(expected, "rb").read() == open(twins[0], "rb").read()
    os.remove(expected)
