"""The diffusers backend against real ComfyUI 0.3.75 code: ComfyUI-format LoRA exports name only modules that
ComfyUI's own LoRA key maps know (every key loads, none is dropped), and a single-file checkpoint in the
original (LDM) layout, the denoiser alone or the whole checkpoint, loads through diffusers' ``from_single_file`` into
the same model."""
import importlib.util
import os
import sys
import logging
from pathlib import Path

import pytest
import torch

from diffusers_fixtures import build_pipeline, save_pipeline
from treegrpo.backends.diffusers import DiffusersPolicy
from treegrpo.config import LoraConfig, PipelineConfig
from treegrpo.lora import add_lora, extract_lora, save_lora_file

PC = PipelineConfig(height=16, width=16)
TEST_PACK = Path(__file__).resolve().parents[1] / "comfy_test_pack" / "__init__.py"


@pytest.fixture(scope="module")
def comfy_tiny(comfyui):
    """The test pack's ``_tiny(arch, seed)``: tiny ComfyUI models of the same layouts as the diffusers ones."""
    spec = importlib.util.spec_from_file_location("treegrpo_test_pack_direct", TEST_PACK,
                                                  submodule_search_locations=[os.path.dirname(TEST_PACK)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # its relative imports (comfy_test_pack.compat) resolve through it
    spec.loader.exec_module(mod)
    return mod._tiny


def _trained_comfy_lora(family: str, targets: list[str]) -> dict:
    pipe = build_pipeline(family)
    policy = DiffusersPolicy(pipe, family, PC)
    add_lora(policy.model, LoraConfig(rank=4, alpha=8.0, targets=targets))
    w = extract_lora(policy.model)
    for n in w.modules:
        w.up[n] = torch.randn_like(w.up[n])
    return policy.comfy_lora_state_dict(w), w


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("family,arch,targets", [
    ("sd", "sd15", ["to_q", "to_k", "to_v", "to_out", "proj_in", "proj_out", "ff.net.2"]),
    ("sd3", "sd3", ["to_q", "to_k", "to_v", "to_out", "add_q_proj", "add_k_proj", "add_v_proj"]),
    ("flux", "flux", ["to_q", "to_k", "to_v", "to_out", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]),
])
def test_comfy_format_loads_every_key_in_comfyui(comfy_tiny, family, arch, targets):
    import comfy.lora
    sd, w = _trained_comfy_lora(family, targets)
    patcher, _, _ = comfy_tiny(arch, 0)
    key_map = comfy.lora.model_lora_keys_unet(patcher.model, {})
    h = _Warnings()
    logging.getLogger().addHandler(h)
    try:
        patches = comfy.lora.load_lora(sd, key_map)
    finally:
        logging.getLogger().removeHandler(h)
    assert not [ln for ln in h.lines if "lora key not loaded" in ln], h.lines[:5]
    assert len(patches) == len(w.modules)  # one ComfyUI weight patched per adapted diffusers Linear
    new = patcher.clone()
    assert len(new.add_patches(patches, 1.0)) == len(w.modules)


def test_sdxl_comfy_keys_are_in_comfyuis_unet_map(comfyui):
    """No tiny SDXL ComfyUI model ships with the tests: check against ComfyUI's diffusers->UNet map of the
    same layout (the map ComfyUI's LoraLoader builds ``lora_unet_*`` keys from)."""
    import comfy.utils
    sd, w = _trained_comfy_lora("sdxl", ["to_q", "to_k", "to_v", "to_out", "proj_in", "proj_out"])
    unet_config = {"num_res_blocks": [1, 1], "channel_mult": [1, 2], "transformer_depth": [0, 2],
                   "transformer_depth_output": [0, 0, 2, 2], "transformer_depth_middle": 2}
    known = {"lora_unet_" + k[:-len(".weight")].replace(".", "_")
             for k in comfy.utils.unet_to_diffusers(unet_config) if k.endswith(".weight")}
    names = {k.rsplit(".", 2)[0] if k.endswith(".weight") else k.rsplit(".", 1)[0] for k in sd}
    assert names and names <= known, sorted(names - known)[:5]


def test_single_file_unet_checkpoint_loads_like_the_folder(comfy_tiny, tmp_path):
    """An SD1.x UNet saved in the original LDM layout (``model.diffusion_model.*``, the layout of published
    .safetensors files) + ``pipeline.config`` = the diffusers folder: the same denoiser as from the folder."""
    import comfy.utils
    from safetensors.torch import save_file
    folder = save_pipeline("sd", str(tmp_path / "sd"))
    ref = DiffusersPolicy.load(folder, PC)
    patcher, _, _ = comfy_tiny("sd15", 0)
    mapping = comfy.utils.unet_to_diffusers(patcher.model.model_config.unet_config)
    unet_sd = ref.model.state_dict()
    missing = [k for k in unet_sd if k not in mapping]
    assert not missing, missing[:5]
    ldm = {"model.diffusion_model." + mapping[k]: v.contiguous() for k, v in unet_sd.items()}
    path = str(tmp_path / "tiny_sd15_unet.safetensors")
    save_file(ldm, path)
    single = DiffusersPolicy.load(path, PipelineConfig(height=16, width=16, config=folder))
    got = single.model.state_dict()
    assert got.keys() == unet_sd.keys() and all(torch.equal(got[k], unet_sd[k]) for k in got)
    x = torch.randn((1, *ref.latent_shape()), generator=torch.Generator().manual_seed(0))
    cond = ref.encode_prompts(["a red circle"])
    with torch.no_grad():
        assert torch.allclose(single.denoise(x, torch.tensor([1.5]), cond, 1.0), ref.denoise(x, torch.tensor([1.5]), cond, 1.0))


def test_full_single_file_checkpoint_loads_like_the_folder(comfy_tiny, tmp_path):
    """A whole SD1.x checkpoint in the original layout, as published (UNet ``model.diffusion_model.*``, VAE
    ``first_stage_model.*``, CLIP ``cond_stage_model.transformer.*``), + ``pipeline.config`` for the configs and
    the tokenizer: every component equals the diffusers folder's, and the images decode the same."""
    import re

    import comfy.diffusers_convert
    import comfy.utils
    from safetensors.torch import save_file
    folder = save_pipeline("sd", str(tmp_path / "sd"))
    ref = DiffusersPolicy.load(folder, PC)
    patcher, _, _ = comfy_tiny("sd15", 0)
    mapping = comfy.utils.unet_to_diffusers(patcher.model.model_config.unet_config)
    ldm = {"model.diffusion_model." + mapping[k]: v for k, v in ref.pipe.unet.state_dict().items()}
    vae = comfy.diffusers_convert.convert_vae_state_dict(ref.pipe.vae.state_dict())
    # ComfyUI's converter numbers the decoder's up blocks for SD's 4 levels (up.3 = diffusers up_blocks.0);
    # the tiny VAE has fewer, and the original layout counts from 0
    shift = 4 - len(ref.pipe.vae.config.block_out_channels)
    vae = {re.sub(r"^decoder\.up\.(\d+)\.", lambda m: f"decoder.up.{int(m.group(1)) - shift}.", k): v
           for k, v in vae.items()}
    ldm.update({"first_stage_model." + k: v for k, v in vae.items()})
    # published SD1.x files: cond_stage_model.transformer.text_model.* (transformers 5 names it without text_model.)
    te = {k if k.startswith("text_model.") else "text_model." + k: v
          for k, v in ref.pipe.text_encoder.state_dict().items()}
    ldm.update({"cond_stage_model.transformer." + k: v for k, v in te.items()})
    path = str(tmp_path / "tiny_sd15_full.safetensors")
    save_file({k: v.contiguous() for k, v in ldm.items()}, path)
    single = DiffusersPolicy.load(path, PipelineConfig(height=16, width=16, config=folder))
    for name in ("unet", "vae", "text_encoder"):
        a, b = getattr(ref.pipe, name).state_dict(), getattr(single.pipe, name).state_dict()
        assert a.keys() == b.keys(), (name, sorted(a.keys() ^ b.keys())[:5])
        bad = [k for k in a if not torch.equal(a[k], b[k].reshape(a[k].shape))]
        assert not bad, (name, bad[:5])
    x = torch.randn((1, *ref.latent_shape()), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        c_ref, c_single = ref.encode_prompts(["a red circle"]), single.encode_prompts(["a red circle"])
        assert torch.equal(c_single["cond"]["embeds"], c_ref["cond"]["embeds"])
        # bit-identical weights; the two pipelines' UNets differ at float rounding (~3e-6 seen)
        assert torch.allclose(single.denoise(x, torch.tensor([1.5]), c_single, 1.0),
                              ref.denoise(x, torch.tensor([1.5]), c_ref, 1.0), atol=1e-5, rtol=0)
        assert torch.equal(single.decode(x), ref.decode(x))
