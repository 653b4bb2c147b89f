"""Tiny random-weight instances of ComfyUI's own text-to-video model classes, and a tiny Wan 2.1 VAE.

Test-only: each model is the real ``comfy.supported_models`` config class and ``comfy.model_base`` model
(``cfg.get_model({})``), so sampling, conds, latent formats and ``model_sampling`` are ComfyUI's, but with
one or two blocks of width 64 (2 heads), 32-wide text features and an 8x8, 2-frame latent: a forward pass
takes milliseconds on a CPU.

* :data:`ARCHS` -- per arch key: ``comfy_class`` (the ``comfy.supported_models`` class), ``latent``
  (per-sample latent shape ``(C, T, H, W)``) and ``targets`` (LoRA target suffixes: the attention q/k/v/out
  and FFN Linear layers of the transformer blocks, matched as ``name == t or name.endswith("." + t)``).
* :func:`build` -- ``(ModelPatcher, positive, negative)``; the conds are ComfyUI CONDITIONING lists
  ``[[context, extra]]`` with what each model's ``extra_conds`` needs (T5-style families get an
  ``attention_mask`` like ComfyUI's T5 encoders return).
* :func:`tiny_vae` -- a ``comfy.sd.VAE`` built by ComfyUI's own state-dict detection from a tiny Wan 2.1 VAE.

Notes on the families:

* ``wan22_t2v`` is ComfyUI's ``WAN22_T2V``, which is the Wan 2.2 *5B TI2V* model (48-channel ``Wan22``
  latents, ``model_base.WAN22``). The Wan 2.2 *14B* T2V/I2V experts have Wan 2.1's architecture and load as
  ``WAN21_T2V`` / ``WAN21_I2V``: use ``wan21_t2v`` for them.
* ``mochi`` has two blocks: Mochi's last block never updates the text stream (no ``mlp_y``/``proj_y``), so
  one block would leave the text branch untested. Mochi also asserts ``hidden_size_x * mlp_ratio_x ==
  1536 * 8``, so its visual FFN stays 8192 wide (~1.5M weights per block) whatever the width.
* ``ltxv`` keeps LTXV's 128 latent channels (``latent_formats.LTXV``); its blocks add residuals in place.
* ``cosmos_t2v`` is the Cosmos-1 video DiT (EDM sampling). Its blocks live in an ``nn.ModuleDict``.
* ``hunyuan_video15`` takes 65 input channels like the real model (32 noise + 32 image cond + 1 mask;
  ``concat_cond`` fills zeros for text-to-video) and keeps ``vision_in_dim=1152`` so its config matches
  ``HunyuanVideo15``'s detection keys (the vision projector is unused without a ``clip_vision_output``).
* Finite-difference LoRA-gradient checks (as in test_comfy_gradients.py) need a step of 3e-3 rather than 1e-2
  for ``hunyuan_video15`` (the random direction's per-module derivatives, each right to <1%, cancel to ~0.1
  out of ~±15) and ``mochi`` (curvature of the 8192-wide FFN: 3.1% off at 1e-2, 0.3% at 3e-3).
* A tiny Wan 2.2 VAE is not possible through ``comfy.sd.VAE``: its detection hard-codes ``dim=160``
  (a 705M-parameter model), so only ``tiny_vae("wan21")`` exists.
"""
from __future__ import annotations

import torch

from .compat import newer_fields

#: width of every tiny model's text features (the context tensor's last dim)
TEXT_DIM = 32
#: text tokens per prompt
TEXT_LEN = 8

_WAN_TARGETS = ["q", "k", "v", "o", "ffn.0", "ffn.2"]   # self_attn.* and cross_attn.* of each block

ARCHS = {
    "wan21_t2v": {"comfy_class": "WAN21_T2V", "latent": (16, 2, 8, 8), "targets": _WAN_TARGETS},
    "wan22_t2v": {"comfy_class": "WAN22_T2V", "latent": (48, 2, 8, 8), "targets": _WAN_TARGETS},
    "hunyuan_video15": {"comfy_class": "HunyuanVideo15", "latent": (32, 2, 8, 8),
                        "targets": ["img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj",
                                    "img_mlp.0", "img_mlp.2", "txt_mlp.0", "txt_mlp.2", "linear1", "linear2"]},
    "mochi": {"comfy_class": "GenmoMochi", "latent": (12, 2, 8, 8),
              "targets": ["attn.qkv_x", "attn.qkv_y", "attn.proj_x", "attn.proj_y",
                          "mlp_x.w1", "mlp_x.w2", "mlp_y.w1", "mlp_y.w2"]},
    "ltxv": {"comfy_class": "LTXV", "latent": (128, 2, 8, 8),
             "targets": ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]},
    "cosmos_t2v": {"comfy_class": "CosmosT2V", "latent": (16, 2, 8, 8),
                   "targets": ["to_q.0", "to_k.0", "to_v.0", "to_out.0", "layer1", "layer2"]},
}


def _unet_config(arch: str) -> dict:
    """The ``unet_config`` ComfyUI's ``model_detection`` would produce for a real checkpoint, scaled down."""
    if arch in ("wan21_t2v", "wan22_t2v"):
        channels = 16 if arch == "wan21_t2v" else 48
        return {"image_model": "wan2.1", "model_type": "t2v", "dim": 64, "out_dim": channels, "in_dim": channels,
                "num_heads": 2, "ffn_dim": 128, "num_layers": 1, "patch_size": (1, 2, 2), "freq_dim": 256,
                "text_dim": TEXT_DIM, "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True,
                "eps": 1e-6}
    if arch == "hunyuan_video15":
        return {"image_model": "hunyuan_video", "in_channels": 65, "out_channels": 32, "vec_in_dim": None,
                "context_in_dim": TEXT_DIM, "hidden_size": 64, "mlp_ratio": 4.0, "num_heads": 2, "depth": 1,
                "depth_single_blocks": 1, "axes_dim": [8, 12, 12], "theta": 256, "patch_size": [1, 1, 1],
                "qkv_bias": True, "guidance_embed": False, "byt5": False, "meanflow": False,
                "use_cond_type_embedding": True, "vision_in_dim": 1152}
    if arch == "mochi":
        return {"image_model": "mochi_preview", "depth": 2, "patch_size": 2, "num_heads": 2, "hidden_size_x": 64,
                "hidden_size_y": 32, "mlp_ratio_x": 1536 * 8 / 64, "mlp_ratio_y": 4.0, "learn_sigma": False,
                "in_channels": 12, "qk_norm": True, "qkv_bias": False, "out_bias": True, "attn_drop": 0.0,
                "patch_embed_bias": True, "posenc_preserve_area": True, "timestep_mlp_bias": True,
                "attend_to_padding": False, "timestep_scale": 1000.0, "use_t5": True, "t5_feat_dim": TEXT_DIM,
                "t5_token_length": TEXT_LEN, "rope_theta": 10000.0}
    if arch == "ltxv":
        return {"image_model": "ltxv", "num_layers": 1, "attention_head_dim": 32, "num_attention_heads": 2,
                "cross_attention_dim": 64, "caption_channels": TEXT_DIM, "in_channels": 128}
    if arch == "cosmos_t2v":
        return {"image_model": "cosmos", "max_img_h": 240, "max_img_w": 240, "max_frames": 128, "in_channels": 16,
                "out_channels": 16, "patch_spatial": 2, "patch_temporal": 1, "model_channels": 64,
                "block_config": "FA-CA-MLP", "concat_padding_mask": True, "pos_emb_cls": "rope3d",
                "pos_emb_learnable": False, "pos_emb_interpolation": "crop", "block_x_format": "THWBD",
                "affline_emb_norm": True, "use_adaln_lora": True, "adaln_lora_dim": 16, "num_blocks": 1,
                "num_heads": 2, "mlp_ratio": 2.0, "crossattn_emb_channels": TEXT_DIM,
                "extra_per_block_abs_pos_emb": True, "rope_h_extrapolation_ratio": 1.0,
                "rope_w_extrapolation_ratio": 1.0, "rope_t_extrapolation_ratio": 2.0,
                "extra_per_block_abs_pos_emb_type": "learnable"}
    raise ValueError(f"unknown tiny video arch {arch!r}; known: {sorted(ARCHS)}")


def _randomize(module: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Fill every floating tensor of ``module.state_dict()`` (what a checkpoint would load: parameters and
    persistent buffers) with ``randn * scale``, from a generator seeded with ``seed``. ComfyUI allocates
    weights with ``torch.empty``; buffers it computes itself (non-persistent, e.g. Cosmos's RoPE ranges) are
    left as they are."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in module.state_dict(keep_vars=True).items():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype) * scale)


def build(arch: str, seed: int = 0):
    """``(ModelPatcher, positive, negative)`` for ``arch`` (a key of :data:`ARCHS`), deterministic in ``seed``."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny video arch {arch!r}; known: {sorted(ARCHS)}")
    cfg = getattr(sm, ARCHS[arch]["comfy_class"])(newer_fields(_unet_config(arch)))
    model = cfg.get_model({})
    _randomize(model.diffusion_model, seed)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    g = torch.Generator().manual_seed(seed + 1)

    def cond():
        extra = {}
        if arch in ("mochi", "ltxv"):       # ComfyUI's T5 encoders for these return the token mask
            extra["attention_mask"] = torch.ones((1, TEXT_LEN), dtype=torch.long)
        if arch == "hunyuan_video15":        # HunyuanVideo's encode_adm reads pooled_output (None: no vector_in)
            extra["pooled_output"] = None
        return [[torch.randn((1, TEXT_LEN, TEXT_DIM), generator=g), extra]]

    return patcher, cond(), cond()


def tiny_vae(kind: str = "wan21", seed: int = 0, dim: int = 8):
    """A real ``comfy.sd.VAE``, detected by ComfyUI from the state dict of a tiny randomly initialised Wan 2.1
    VAE (``dim`` base channels instead of 96; z_dim 16, 4x temporal / 8x spatial compression, causal in time).
    Weights are fan-in scaled normal (norm gains near 1) so activations neither vanish nor explode."""
    import comfy.ldm.wan.vae
    import comfy.sd

    if kind != "wan21":
        raise ValueError(f"tiny_vae({kind!r}): only 'wan21' is possible; ComfyUI detects the Wan 2.2 VAE with a "
                         "hard-coded dim=160 (705M parameters), so it has no tiny form")
    net = comfy.ldm.wan.vae.WanVAE(dim=dim, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                                   temperal_downsample=[False, True, True], dropout=0.0)
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, t in net.state_dict().items():
        if not t.is_floating_point():
            sd[name] = t.clone()
        elif name.endswith("gamma"):                                  # RMS_norm gains
            sd[name] = 1.0 + 0.05 * torch.randn(t.shape, generator=g)
        elif t.ndim == 1:                                             # biases
            sd[name] = 0.05 * torch.randn(t.shape, generator=g)
        else:                                                         # conv / linear weights
            sd[name] = torch.randn(t.shape, generator=g) / (t[0].numel() ** 0.5)
    return comfy.sd.VAE(sd=sd)
