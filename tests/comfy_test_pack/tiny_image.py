"""Tiny random-weight instances of ComfyUI's own text-to-image model classes, for tests that train a LoRA on a CPU.

Each architecture is built exactly as ComfyUI builds it from a checkpoint: a ``unet_config`` dict (the one
``comfy.model_detection.detect_unet_config`` would return, shrunk to depth 1 and widths of ~64), the matching
``comfy.supported_models`` class, ``get_model(state_dict)`` (the state dict only carries the keys the class reads
to pick its prediction type, e.g. SDXL's ``edm_vpred.sigma_max``), then every parameter and checkpoint buffer
filled with ``randn * 0.05`` (ComfyUI allocates weights empty: they come from the file), normalisation gains with
``1 + randn * 0.05``. Non-persistent buffers (computed constants such as RoPE frequency ranges) keep their computed
values.

``build(arch, seed)`` returns ``(ModelPatcher, positive, negative)``: two CONDITIONING lists
``[[context, extra]]`` whose context and extra keys (pooled output, second text encoders, attention masks,
guidance) have the shapes that model's ``model_base`` class and forward expect. ``ARCHS[arch]`` gives the
``supported_models`` class name, the per-sample latent shape the model takes, and LoRA target suffixes (the
attention q/k/v/out and MLP Linear layers of its transformer/UNet blocks; a Linear ``name`` is a target when
``name == t`` or ``name.endswith("." + t)``).

Latent channel counts are the real ones (``latent_format.latent_channels``: Flux2 128, HunyuanImage 2.1 64,
Chroma Radiance 3 pixel channels); spatial sizes are tiny (8x8; Chroma Radiance 16x16 pixels; PixArt 40x40, the
smallest its position embedding allows).
"""
from __future__ import annotations

import torch

from .compat import newer_fields

#: LoRA targets of ComfyUI's SD1.x/SD2.x/SDXL UNet (BasicTransformerBlock: self/cross attention + GEGLU MLP)
_UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]
#: Flux-style double/single stream blocks (Flux, Flux2, Chroma Radiance, HunyuanImage 2.1)
_FLUX_TARGETS = ["img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj", "img_mlp.0", "img_mlp.2",
                 "txt_mlp.0", "txt_mlp.2", "linear1", "linear2"]
#: Lumina 2 / Z-Image NextDiT blocks (fused qkv, SwiGLU MLP)
_NEXTDIT_TARGETS = ["attention.qkv", "attention.out", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]
_PIXART_TARGETS = ["attn.qkv", "attn.proj", "cross_attn.q_linear", "cross_attn.kv_linear", "cross_attn.proj",
                   "mlp.fc1", "mlp.fc2"]

ARCHS: dict[str, dict] = {
    "sd20": {"comfy_class": "SD20", "latent": (4, 8, 8), "targets": _UNET_TARGETS},
    "sd20_v": {"comfy_class": "SD20", "latent": (4, 8, 8), "targets": _UNET_TARGETS},
    "ssd1b": {"comfy_class": "SSD1B", "latent": (4, 8, 8), "targets": _UNET_TARGETS},
    "sdxl_edm": {"comfy_class": "SDXL", "latent": (4, 8, 8), "targets": _UNET_TARGETS},
    "segmind_vega": {"comfy_class": "Segmind_Vega", "latent": (4, 8, 8), "targets": _UNET_TARGETS},
    "koala_700m": {"comfy_class": "KOALA_700M", "latent": (4, 8, 8), "targets": _UNET_TARGETS},
    "koala_1b": {"comfy_class": "KOALA_1B", "latent": (4, 8, 8), "targets": _UNET_TARGETS},
    "flux_schnell": {"comfy_class": "FluxSchnell", "latent": (16, 8, 8), "targets": _FLUX_TARGETS},
    "flux2": {"comfy_class": "Flux2", "latent": (128, 8, 8), "targets": _FLUX_TARGETS},
    "hidream": {"comfy_class": "HiDream", "latent": (16, 8, 8),
                # MM-attention (image and text projections) and every SwiGLU MLP (shared + routed experts, text)
                "targets": ["to_q", "to_k", "to_v", "to_out", "to_q_t", "to_k_t", "to_v_t", "to_out_t",
                            "w1", "w2", "w3"]},
    "lumina2": {"comfy_class": "Lumina2", "latent": (16, 8, 8), "targets": _NEXTDIT_TARGETS},
    "zimage": {"comfy_class": "ZImage", "latent": (16, 8, 8), "targets": _NEXTDIT_TARGETS},
    "auraflow": {"comfy_class": "AuraFlow", "latent": (4, 8, 8),
                 "targets": ["w1q", "w1k", "w1v", "w1o", "w2q", "w2k", "w2v", "w2o", "c_fc1", "c_fc2", "c_proj"]},
    # PixArt's sin-cos position grid is scaled by round(((H + W) / 2) / 64): latents under ~33x33 divide by zero
    "pixart_alpha": {"comfy_class": "PixArtAlpha", "latent": (4, 40, 40), "targets": _PIXART_TARGETS},
    "pixart_sigma": {"comfy_class": "PixArtSigma", "latent": (4, 40, 40), "targets": _PIXART_TARGETS},
    "hunyuan_dit": {"comfy_class": "HunyuanDiT", "latent": (4, 8, 8),
                    "targets": ["attn1.Wqkv", "attn1.out_proj", "attn2.q_proj", "attn2.kv_proj", "attn2.out_proj",
                                "mlp.fc1", "mlp.fc2"]},
    "hunyuan_dit1": {"comfy_class": "HunyuanDiT1", "latent": (4, 8, 8),
                     "targets": ["attn1.Wqkv", "attn1.out_proj", "attn2.q_proj", "attn2.kv_proj", "attn2.out_proj",
                                 "mlp.fc1", "mlp.fc2"]},
    "omnigen2": {"comfy_class": "Omnigen2", "latent": (16, 8, 8),
                 "targets": ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "feed_forward.linear_1",
                             "feed_forward.linear_2", "feed_forward.linear_3"]},
    "hunyuan_image21": {"comfy_class": "HunyuanImage21", "latent": (64, 8, 8), "targets": _FLUX_TARGETS},
    "chroma_radiance": {"comfy_class": "ChromaRadiance", "latent": (3, 16, 16), "targets": _FLUX_TARGETS},
    "cosmos_t2i": {"comfy_class": "CosmosT2IPredict2", "latent": (16, 1, 8, 8),
                   "targets": ["q_proj", "k_proj", "v_proj", "output_proj", "mlp.layer1", "mlp.layer2"]},
    "stable_cascade_c": {"comfy_class": "Stable_Cascade_C", "latent": (16, 8, 8),
                         "targets": ["attention.attn.to_q", "attention.attn.to_k", "attention.attn.to_v",
                                     "attention.attn.out_proj", "kv_mapper.1", "channelwise.0", "channelwise.4"]},
}

# ---- UNet configs (comfy.ldm.modules.diffusionmodules.openaimodel.UNetModel): two levels, one res block each
_UNET_BASE = {"use_checkpoint": False, "image_size": 8, "out_channels": 4, "use_spatial_transformer": True,
              "legacy": False, "in_channels": 4, "model_channels": 32, "num_res_blocks": [1, 1],
              "channel_mult": [1, 2], "use_linear_in_transformer": True, "context_dim": 32,
              "use_temporal_attention": False, "use_temporal_resblock": False}
_SD2 = {**_UNET_BASE, "adm_in_channels": None, "transformer_depth": [1, 1], "transformer_depth_middle": 1,
        "transformer_depth_output": [1, 1, 1, 1]}
# SDXL: no attention at the first level, pooled text + size embeddings through adm (1280 + 6 * 256)
_SDXL = {**_UNET_BASE, "adm_in_channels": 2816, "num_classes": "sequential", "transformer_depth": [0, 1],
         "transformer_depth_middle": 1, "transformer_depth_output": [0, 0, 1, 1]}
#: normalisation layers (torch / comfy.ops GroupNorm, LayerNorm, RMSNorm; Flux's RMSNorm with a ``scale``)
_NORMS = ("GroupNorm", "LayerNorm", "RMSNorm")
# 2 heads whatever the width (the classes' unet_extra_config would give 64-channel heads)
_HEADS = {"num_heads": 2, "num_head_channels": -1}


def _spec(arch: str):
    """(supported_models class name, unet_config, config overrides applied after construction, state dict for
    get_model, cond spec). A cond spec maps ``context`` to its shape and extra keys to shapes (random tensors),
    or to ``("mask", L, n_pad)`` (an attention mask of L tokens whose last n_pad are padding), or to plain values."""
    ctx = (1, 8, 32)
    if arch in ("sd20", "sd20_v"):
        # SD20.model_type: v-prediction when this norm bias has std > 0.09 (SD2.x 768-v), else epsilon (SD2.x base)
        key = "output_blocks.11.1.transformer_blocks.0.norm1.bias"
        sd = {key: torch.tensor([-1.0, 1.0])} if arch == "sd20_v" else {}
        return "SD20", _SD2, _HEADS, sd, {"context": ctx}
    pooled = {"context": ctx, "pooled_output": (1, 1280)}
    if arch == "ssd1b":   # SSD-1B: SDXL without middle-block attention and with uneven decoder depths
        unet = {**_SDXL, "transformer_depth": [0, 2], "transformer_depth_output": [0, 0, 2, 1],
                "transformer_depth_middle": -1}
        return "SSD1B", unet, _HEADS, {}, pooled
    if arch == "segmind_vega":   # Segmind Vega: SDXL distilled further, also without middle-block attention
        unet = {**_SDXL, "transformer_depth_middle": -1}
        return "Segmind_Vega", unet, _HEADS, {}, pooled
    if arch == "koala_700m":   # KOALA-700M: one res block per level and no middle block at all
        unet = {**_SDXL, "transformer_depth_middle": -2}
        return "KOALA_700M", unet, _HEADS, {}, pooled
    if arch == "koala_1b":   # KOALA-1B: one res block per level, deeper attention, attention in the middle block
        unet = {**_SDXL, "transformer_depth": [0, 2], "transformer_depth_output": [0, 0, 2, 2]}
        return "KOALA_1B", unet, _HEADS, {}, pooled
    if arch == "sdxl_edm":   # SDXL.model_type: V_PREDICTION_EDM when the checkpoint has edm_vpred.sigma_max
        sd = {"edm_vpred.sigma_max": torch.tensor(120.0), "edm_vpred.sigma_min": torch.tensor(0.002)}
        return "SDXL", _SDXL, _HEADS, sd, pooled
    if arch == "flux_schnell":   # no guidance embedding; CLIP pooled vector through vector_in
        unet = {"image_model": "flux", "guidance_embed": False, "in_channels": 16, "out_channels": 16,
                "vec_in_dim": 32, "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2,
                "depth": 1, "depth_single_blocks": 1, "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 2,
                "qkv_bias": True}
        return "FluxSchnell", unet, {}, {}, {"context": ctx, "pooled_output": (1, 32)}
    if arch == "flux2":   # patch 1 on 128-channel latents, 4-axis RoPE, shared modulation, SiLU-gated MLPs
        unet = {"image_model": "flux2", "guidance_embed": True, "in_channels": 128, "out_channels": 128,
                "vec_in_dim": None, "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 3.0, "num_heads": 2,
                "depth": 1, "depth_single_blocks": 1, "axes_dim": [8, 8, 8, 8], "theta": 2000, "patch_size": 1,
                "qkv_bias": False, "global_modulation": True, "mlp_silu_act": True, "ops_bias": False,
                "default_ref_method": "index", "ref_index_scale": 10.0}
        # model_base.Flux2 left-pads the text to 512 tokens itself
        return "Flux2", unet, {}, {}, {"context": ctx, "pooled_output": None, "guidance": 4.0}
    if arch == "hidream":
        # caption_channels = [T5 width, Llama width]; one Llama hidden state per block (llama_layers indexes them).
        # 2 routed experts with 2 active: the MoE is exercised but top-k routing cannot switch experts (keeps the
        # model differentiable for finite-difference checks; the real model routes 2 of 4)
        unet = {"image_model": "hidream", "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 1,
                "num_single_layers": 1, "attention_head_dim": 32, "num_attention_heads": 2,
                "caption_channels": [32, 48], "text_emb_dim": 32, "num_routed_experts": 2,
                "num_activated_experts": 2, "axes_dims_rope": [8, 12, 12], "max_resolution": [16, 16],
                "llama_layers": [0, 1]}
        return "HiDream", unet, {}, {}, {"context": ctx, "pooled_output": (1, 32),
                                         "conditioning_llama3": (1, 2, 8, 48)}
    if arch == "lumina2":   # grouped-query attention (2 query heads, 1 kv head), Gemma features of width 32
        unet = {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 64, "cap_feat_dim": 32,
                "n_layers": 1, "n_refiner_layers": 1, "qk_norm": True, "n_heads": 2, "n_kv_heads": 1,
                "axes_dims": [8, 12, 12], "axes_lens": [300, 512, 512], "rope_theta": 10000.0,
                "ffn_dim_multiplier": 4.0}
        return "Lumina2", unet, {}, {}, {"context": ctx}
    if arch == "zimage":
        # Z-Image: NextDiT with its own modulation, whose timestep embedding is 256 wide: dim must be >= 256.
        # Text and image tokens are padded to multiples of 32 with learned pad tokens
        unet = {"image_model": "lumina2", "patch_size": 2, "in_channels": 16, "dim": 256, "cap_feat_dim": 32,
                "n_layers": 1, "n_refiner_layers": 1, "qk_norm": True, "n_heads": 2, "n_kv_heads": 2,
                "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512], "rope_theta": 256.0,
                "ffn_dim_multiplier": 8.0 / 3.0, "z_image_modulation": True, "time_scale": 1000.0,
                "pad_tokens_multiple": 32}
        return "ZImage", unet, {}, {}, {"context": ctx}
    if arch == "auraflow":   # one MMDiT (double) and one DiT (single) layer, 8 register tokens
        unet = {"in_channels": 4, "out_channels": 4, "patch_size": 2, "dim": 64, "n_layers": 2,
                "n_double_layers": 1, "n_heads": 2, "global_conddim": 64, "cond_seq_dim": 32, "max_seq": 16}
        return "AuraFlow", unet, {}, {}, {"context": ctx}
    if arch in ("pixart_alpha", "pixart_sigma"):
        # alpha: size/aspect-ratio micro-conditioning (hidden // 3 per embedding: hidden must divide by 3)
        alpha = arch == "pixart_alpha"
        unet = {"image_model": arch, "patch_size": 2, "in_channels": 4, "hidden_size": 48, "depth": 1,
                "num_heads": 2, "caption_channels": 32, "model_max_length": 8, "micro_condition": alpha,
                "pe_interpolation": None}
        return ("PixArtAlpha" if alpha else "PixArtSigma"), unet, {}, {}, {"context": ctx}
    if arch in ("hunyuan_dit", "hunyuan_dit1"):
        # CLIP (context) and mT5 streams with their masks; padded tokens are replaced by learned padding.
        # HunyuanDiT1 (v1.0/1.1) adds image-size and style embeddings to the pooled text vector
        v1 = arch == "hunyuan_dit1"
        unet = {"image_model": "hydit1" if v1 else "hydit", "input_size": 8, "patch_size": 2, "in_channels": 4,
                "hidden_size": 64, "depth": 1, "num_heads": 2, "mlp_ratio": 2.0, "text_states_dim": 32,
                "text_states_dim_t5": 32, "text_len": 8, "text_len_t5": 8, "qk_norm": True, "size_cond": v1,
                "use_style_cond": v1, "learn_sigma": True}
        return ("HunyuanDiT1" if v1 else "HunyuanDiT"), unet, {}, {}, {
            "context": ctx, "attention_mask": ("mask", 8, 2), "conditioning_mt5xl": (1, 8, 32),
            "attention_mask_mt5xl": ("mask", 8, 3)}
    if arch == "omnigen2":
        unet = {"image_model": "omnigen2", "patch_size": 2, "in_channels": 16, "out_channels": None,
                "hidden_size": 64, "num_layers": 1, "num_refiner_layers": 1, "num_attention_heads": 2,
                "num_kv_heads": 1, "multiple_of": 256, "ffn_dim_multiplier": None, "norm_eps": 1e-5,
                "axes_dim_rope": [8, 12, 12], "axes_lens": [1024, 1664, 1664], "text_feat_dim": 32,
                "timestep_scale": 1000.0}
        # model_base.Omnigen2 takes num_tokens from the attention mask only (all ones: not passed on as a mask)
        return "Omnigen2", unet, {}, {}, {"context": ctx, "attention_mask": ("mask", 8, 0)}
    if arch == "hunyuan_image21":   # HunyuanVideo blocks in 2-D (patch [1, 1]), no pooled vector, no guidance embed
        unet = {"image_model": "hunyuan_video", "in_channels": 64, "out_channels": 64, "vec_in_dim": None,
                "context_in_dim": 32, "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2, "depth": 1,
                "depth_single_blocks": 1, "axes_dim": [16, 16], "theta": 256, "patch_size": [1, 1],
                "qkv_bias": True, "guidance_embed": False, "byt5": False, "meanflow": False,
                "use_cond_type_embedding": False, "vision_in_dim": None}
        return "HunyuanImage21", unet, {}, {}, {"context": ctx}
    if arch == "chroma_radiance":
        # pixel space: 4x4-pixel patches into the Chroma transformer, then a per-patch NeRF head (DCT pixel
        # embedding + MLPs whose weights the transformer predicts)
        unet = {"image_model": "chroma_radiance", "in_channels": 3, "out_channels": 3, "context_in_dim": 32,
                "hidden_size": 64, "mlp_ratio": 2.0, "num_heads": 2, "depth": 1, "depth_single_blocks": 1,
                "axes_dim": [8, 12, 12], "theta": 10000, "patch_size": 4, "qkv_bias": True, "in_dim": 64,
                "out_dim": 64, "hidden_dim": 32, "n_layers": 1, "nerf_hidden_size": 16, "nerf_mlp_ratio": 2,
                "nerf_depth": 1, "nerf_max_freqs": 4, "nerf_tile_size": 512, "nerf_final_head_type": "conv",
                "nerf_embedder_dtype": torch.float32}
        return "ChromaRadiance", unet, {}, {}, {"context": ctx, "pooled_output": None, "guidance": 0.0}
    if arch == "cosmos_t2i":   # Cosmos Predict2 text-to-image: video DiT on (C, T=1, H, W) Wan 2.1 latents
        unet = {"image_model": "cosmos_predict2", "max_img_h": 16, "max_img_w": 16, "max_frames": 4,
                "in_channels": 16, "out_channels": 16, "patch_spatial": 2, "patch_temporal": 1,
                "concat_padding_mask": True, "model_channels": 64, "num_blocks": 1, "num_heads": 2,
                "mlp_ratio": 2.0, "crossattn_emb_channels": 32, "pos_emb_cls": "rope3d", "pos_emb_learnable": True,
                "pos_emb_interpolation": "crop", "min_fps": 1, "max_fps": 30, "use_adaln_lora": True,
                "adaln_lora_dim": 16, "extra_per_block_abs_pos_emb": False, "rope_h_extrapolation_ratio": 4.0,
                "rope_w_extrapolation_ratio": 4.0, "rope_t_extrapolation_ratio": 1.0,
                "extra_h_extrapolation_ratio": 1.0, "extra_w_extrapolation_ratio": 1.0,
                "extra_t_extrapolation_ratio": 1.0, "rope_enable_fps_modulation": False}
        return "CosmosT2IPredict2", unet, {}, {}, {"context": ctx}
    if arch == "stable_cascade_c":
        # Stage C (the text-conditional prior) on 16-channel latents; the CLIP image embedding stays 768 wide
        # because model_base.StableCascade_C feeds zeros of that width when no image is given
        unet = {"stable_cascade_stage": "c", "c_in": 16, "c_out": 16, "c_r": 64, "c_cond": 32,
                "c_hidden": [32, 32], "nhead": [2, 2], "blocks": [[1, 1], [1, 1]],
                "block_repeat": [[1, 1], [1, 1]], "level_config": ["CTA", "CTA"], "c_clip_text": 32,
                "c_clip_text_pooled": 32, "c_clip_img": 768, "c_clip_seq": 4}
        return "Stable_Cascade_C", unet, {}, {}, {"context": ctx, "pooled_output": (1, 1, 32)}
    raise ValueError(f"unknown tiny image arch {arch!r}; known: {sorted(ARCHS)}")


def build(arch: str, seed: int):
    """A tiny random ``arch`` model as ``(ModelPatcher, positive, negative)``; the same seed gives the same weights
    and conds (seeded generators only, the global RNG is left alone)."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models as sm

    cls_name, unet, overrides, sd, cond_spec = _spec(arch)
    cfg = getattr(sm, cls_name)(newer_fields(unet))
    cfg.unet_config.update(overrides)
    model = cfg.get_model(sd)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # what a checkpoint would hold: parameters and persistent buffers (state_dict() shares their storage)
        for t in model.diffusion_model.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype) * 0.05)
        # normalisation gains near 1, as trained: zero-mean gains would shrink every normalised signal ~20x and
        # leave the LoRA's effect on the output near float32 round-off (ill-conditioned finite-difference checks)
        for m in model.diffusion_model.modules():
            if type(m).__name__.endswith(_NORMS):
                for name, p in m.named_parameters(recurse=False):
                    if name in ("weight", "scale"):
                        p.add_(1.0)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    gc = torch.Generator().manual_seed(seed + 1)

    def value(spec):
        if isinstance(spec, tuple) and spec and spec[0] == "mask":
            _, n, pad = spec
            return (torch.arange(n) < n - pad).long().unsqueeze(0)   # integer, as text encoders return it
        if isinstance(spec, tuple):
            return torch.randn(spec, generator=gc)
        return spec

    def cond():
        return [[value(cond_spec["context"]), {k: value(v) for k, v in cond_spec.items() if k != "context"}]]

    return patcher, cond(), cond()
