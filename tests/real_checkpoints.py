"""Single-file checkpoints in the real format, with random weights, that ComfyUI's own loaders detect as the model
they name: what a user has in ``models/checkpoints`` after downloading ``v1-5-pruned-emaonly.safetensors``, at a
size the CPU trains in seconds.

SD1.5: ComfyUI recognises SD1.x by the UNet's ``model_channels`` 320 and ``context_dim`` 768 (CLIP-L), so those stay;
the UNet is one level deep (one res block, one transformer, no down-sampling); the text encoder is the full CLIP-L
and the VAE the full SD VAE (their configurations are fixed in ComfyUI, not read from the file). About 250 M
parameters, written in fp16 (0.5 GB). Built with ComfyUI's classes (``comfy.supported_models.SD15``,
``comfy.sd1_clip``, ``comfy.ldm.models.autoencoder``) and saved with the original checkpoint's key prefixes. Needs ComfyUI imported (the comfyui fixtures)."""
from __future__ import annotations

import torch

from comfy_test_pack.compat import newer_fields


def _randomize(module: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic small random weights (ComfyUI builds its layers without initialising them); a normalisation
    layer's scale 1 (found by its type too: the UNet's last GroupNorm is named ``out.0``, and a zero scale there
    made the whole denoiser output 0, so nothing could train)."""
    norms = {f"{n}.weight" for n, m in module.named_modules() if "norm" in type(m).__name__.lower()}
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim <= 1:
                p.copy_(torch.ones_like(p) if name in norms or "norm" in name or name.endswith("gamma") or "ln_" in name
                        else torch.zeros_like(p))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


SD15_UNET = {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
             "legacy": False, "adm_in_channels": None, "in_channels": 4, "model_channels": 320,
             "num_res_blocks": [1], "transformer_depth": [1], "channel_mult": [1], "transformer_depth_middle": 1,
             "use_linear_in_transformer": False, "context_dim": 768, "transformer_depth_output": [1, 1],
             "use_temporal_attention": False, "use_temporal_resblock": False, "num_heads": 8,
             "num_head_channels": -1}
SD_VAE = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
          "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}


def save_sd15_checkpoint(path: str, seed: int = 0) -> str:
    """A random SD1.5 single-file checkpoint at ``path`` (``model.diffusion_model.*``,
    ``cond_stage_model.transformer.text_model.*``, ``first_stage_model.*``), fp16 safetensors."""
    import comfy.sd1_clip
    import comfy.supported_models as sm
    import comfy.utils
    from comfy.ldm.models.autoencoder import AutoencoderKL

    cfg = sm.SD15(newer_fields(dict(SD15_UNET)))
    model = cfg.get_model({})
    _randomize(model.diffusion_model, seed)
    clip = comfy.sd1_clip.SD1ClipModel(device="cpu", dtype=torch.float32)
    _randomize(clip, seed + 1)
    vae = AutoencoderKL(ddconfig=dict(SD_VAE), embed_dim=4)
    _randomize(vae, seed + 2)
    # the original checkpoint's layout, written out by hand (ComfyUI's saving helpers differ between versions)
    sd = {**{f"model.diffusion_model.{k}": v for k, v in model.diffusion_model.state_dict().items()},
          **{f"cond_stage_model.transformer.{k}": v for k, v in getattr(clip, clip.clip).transformer.state_dict().items()},
          **{f"first_stage_model.{k}": v for k, v in vae.state_dict().items()}}
    sd = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in sd.items()}
    comfy.utils.save_torch_file(sd, path)
    return path
