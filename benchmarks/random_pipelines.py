"""Real-size diffusers pipelines with random weights, built in memory (no downloads): for timing the
training loop of each family on a GPU when no weights are at hand.

The denoiser (UNet / transformer) and VAE have the published configurations (SD1.5, SDXL, SD3.5-Medium,
Flux.1-dev); the text encoders have the published widths, but ``--text-layers`` (default 2) of depth, since
they run once per iteration and only their output width matters to the denoiser. ``layers`` shrinks the
denoiser depth for a CPU smoke test of this script.

    python benchmarks/bench_families.py --random-size real --device cuda --height 512
"""
from __future__ import annotations

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
                 down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
SDXL_UNET = dict(sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                 transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
                 addition_embed_type="text_time", addition_time_embed_dim=256,
                 projection_class_embeddings_input_dim=2816, use_linear_projection=True)
SD35M = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64, num_attention_heads=24,
             joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
             pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=(16, 56, 56))
VAE4 = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, sample_size=512,
            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)


def _clip(hidden, layers, heads, inter, proj=None, act="quick_gelu"):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, max_position_embeddings=77, projection_dim=proj or hidden,
                         hidden_act=act, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407)
    return (CLIPTextModelWithProjection if proj else CLIPTextModel)(cfg)


def _t5(layers):
    from transformers import T5Config, T5EncoderModel
    return T5EncoderModel(T5Config(vocab_size=100, d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=layers,
                                   feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))


def build(family: str, device: str = "cpu", dtype: torch.dtype = torch.float32, layers: int = 0,
          text_layers: int = 2, cache: str = "/tmp/treegrpo_tok_cache"):
    """An in-memory pipeline: ``sd15``, ``sdxl``, ``sd35m`` or ``flux``; ``layers`` > 0 caps the denoiser depth."""
    import diffusers as d
    from diffusers_fixtures import _t5_tokenizer, clip_tokenizer

    tok = clip_tokenizer(cache)
    with torch.device(device):
        if family == "sd15":
            unet = d.UNet2DConditionModel(**SD15_UNET)
            te = _clip(768, text_layers, 12, 3072)
            vae = d.AutoencoderKL(**VAE4)
            sched = d.DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                    clip_sample=False, set_alpha_to_one=False, steps_offset=1)
            pipe = d.StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=sched,
                                             safety_checker=None, feature_extractor=None,
                                             requires_safety_checker=False)
        elif family == "sdxl":
            cfg = dict(SDXL_UNET)
            if layers:
                cfg["transformer_layers_per_block"] = tuple(min(layers, n) for n in cfg["transformer_layers_per_block"])
            unet = d.UNet2DConditionModel(**cfg)
            te = _clip(768, text_layers, 12, 3072)
            te2 = _clip(1280, text_layers, 20, 5120, proj=1280, act="gelu")
            vae = d.AutoencoderKL(**VAE4)
            sched = d.EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                             steps_offset=1, timestep_spacing="leading")
            pipe = d.StableDiffusionXLPipeline(vae=vae, text_encoder=te, text_encoder_2=te2, tokenizer=tok,
                                               tokenizer_2=tok, unet=unet, scheduler=sched)
        else:
            t5tok = _t5_tokenizer(os.path.join(cache, "t5_tokenizer"))
            vae16 = dict(VAE4, latent_channels=16, use_quant_conv=False, use_post_quant_conv=False)
            if family == "sd35m":
                cfg = dict(SD35M)
                if layers:
                    cfg.update(num_layers=layers, dual_attention_layers=tuple(range(min(layers, 13))))
                tr = d.SD3Transformer2DModel(**cfg)
                pipe = d.StableDiffusion3Pipeline(
                    transformer=tr, scheduler=d.FlowMatchEulerDiscreteScheduler(shift=3.0),
                    vae=d.AutoencoderKL(**vae16, scaling_factor=1.5305, shift_factor=0.0609),
                    text_encoder=_clip(768, text_layers, 12, 3072, proj=768), tokenizer=tok,
                    text_encoder_2=_clip(1280, text_layers, 20, 5120, proj=1280, act="gelu"), tokenizer_2=tok,
                    text_encoder_3=_t5(text_layers), tokenizer_3=t5tok)
            elif family == "flux":
                cfg = dict(FLUX_DEV)
                if layers:
                    cfg.update(num_layers=layers, num_single_layers=layers)
                tr = d.FluxTransformer2DModel(**cfg)
                pipe = d.FluxPipeline(
                    transformer=tr, vae=d.AutoencoderKL(**vae16, scaling_factor=0.3611, shift_factor=0.1159),
                    scheduler=d.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                                max_shift=1.15, base_image_seq_len=256,
                                                                max_image_seq_len=4096),
                    text_encoder=_clip(768, text_layers, 12, 3072), tokenizer=tok, text_encoder_2=_t5(text_layers),
                    tokenizer_2=t5tok)
            else:
                raise ValueError(f"unknown family {family!r}: sd15, sdxl, sd35m, flux")
    # random weights at a sane scale (the constructors' inits leave some output layers at zero)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for m in (getattr(pipe, "unet", None), getattr(pipe, "transformer", None)):
            if m is not None:
                for p in m.parameters():
                    if p.ndim >= 2 and p.abs().sum() == 0:
                        p.normal_(0, 0.02, generator=g)
    return pipe.to(device=device, dtype=dtype)


FAMILY_OF = {"sd15": "sd", "sdxl": "sdxl", "sd35m": "sd3", "flux": "flux"}
