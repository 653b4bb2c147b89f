"""Tiny random-weight diffusers pipelines of the real architectures (SD1.x eps / SD2 v-pred, SDXL, SD3,
Flux), built in code and saved with ``save_pretrained`` so the adapter loads them through the real
``from_pretrained`` path, offline. Denoiser shapes mirror the tiny ComfyUI models of
``tests/comfy_test_pack`` (same module layout), so LoRA keys can be checked against ComfyUI's own maps."""
from __future__ import annotations

import os
import string

import torch

from reward_fixtures import write_clip_tokenizer

FAMILIES = ("sd", "sd_v", "sdxl", "sd3", "flux")


def _t5_tokenizer(folder: str):
    """A character-level T5 tokenizer (Unigram, ``tokenizer.json``) — the real class, a tiny vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    pieces = ["<pad>", "</s>", "<unk>"] + ["▁" + c for c in string.ascii_lowercase] + list(string.ascii_lowercase) \
        + list(string.digits) + ["▁"]
    tok = Tokenizer(models.Unigram([(p, 0.0 if i < 3 else -float(i)) for i, p in enumerate(pieces)], unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    t = T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>", extra_ids=0)
    t.save_pretrained(folder)
    return T5TokenizerFast.from_pretrained(folder)


_CLIP_TOK = {}


def clip_tokenizer(cache: str):
    from transformers import CLIPTokenizer
    path = os.path.join(cache, "clip_tokenizer")
    if not os.path.isfile(os.path.join(path, "vocab.json")):
        write_clip_tokenizer(path)
    return CLIPTokenizer.from_pretrained(path)


def _clip(hidden: int, with_projection: bool = False, projection: int = 32):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, projection_dim=projection,
                         hidden_act="gelu", bos_token_id=49406, eos_token_id=49407, pad_token_id=49407)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg)


def _t5():
    from transformers import T5Config, T5EncoderModel
    return T5EncoderModel(T5Config(vocab_size=100, d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1))


def _vae(latent_channels: int, flux: bool = False):
    from diffusers import AutoencoderKL
    kw = dict(scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False) if flux \
        else {}
    return AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                         up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[8, 16],
                         latent_channels=latent_channels, layers_per_block=1, norm_num_groups=8, sample_size=16, **kw)


def _randomize(*modules, seed: int) -> None:
    """Non-degenerate weights everywhere (diffusers zero-inits some output layers)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in modules:
            for p in m.parameters():
                if p.ndim >= 2 or p.abs().sum() == 0:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def build_pipeline(family: str, seed: int = 0, cache: str = "/tmp/treegrpo_tok_cache"):
    """An in-memory tiny pipeline of ``family`` (``sd``, ``sd_v`` (v-prediction), ``sdxl``, ``sd3``, ``flux``)."""
    import diffusers as d

    torch.manual_seed(seed)
    tok = clip_tokenizer(cache)
    if family in ("sd", "sd_v"):
        unet = d.UNet2DConditionModel(
            sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
            attention_head_dim=2, norm_num_groups=32)
        te = _clip(32)
        sched = d.DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                clip_sample=False, set_alpha_to_one=False, steps_offset=1,
                                prediction_type="v_prediction" if family == "sd_v" else "epsilon")
        vae = _vae(4)
        _randomize(unet, te, vae, seed=seed)
        return d.StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=sched,
                                         safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    if family == "sdxl":
        unet = d.UNet2DConditionModel(
            sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=64, attention_head_dim=(2, 4), use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=8, transformer_layers_per_block=(1, 2),
            projection_class_embeddings_input_dim=32 + 6 * 8, norm_num_groups=32)
        te, te2 = _clip(32), _clip(32, with_projection=True, projection=32)
        sched = d.EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                         steps_offset=1, timestep_spacing="leading")
        vae = _vae(4)
        _randomize(unet, te, te2, vae, seed=seed)
        return d.StableDiffusionXLPipeline(vae=vae, text_encoder=te, text_encoder_2=te2, tokenizer=tok,
                                           tokenizer_2=tok, unet=unet, scheduler=sched, force_zeros_for_empty_prompt=True)
    t5tok = _t5_tokenizer(os.path.join(cache, "t5_tokenizer"))
    if family == "sd3":
        tr = d.SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=16, num_layers=1, attention_head_dim=64,
                                     num_attention_heads=1, joint_attention_dim=32, caption_projection_dim=64,
                                     pooled_projection_dim=32, out_channels=16, pos_embed_max_size=8)
        te, te2, te3 = _clip(16, True, 16), _clip(16, True, 16), _t5()
        sched = d.FlowMatchEulerDiscreteScheduler(shift=3.0)
        vae = _vae(16)
        _randomize(tr, te, te2, te3, vae, seed=seed)
        return d.StableDiffusion3Pipeline(transformer=tr, scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok,
                                          text_encoder_2=te2, tokenizer_2=tok, text_encoder_3=te3, tokenizer_3=t5tok)
    if family == "flux":
        tr = d.FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                      attention_head_dim=32, num_attention_heads=2, joint_attention_dim=32,
                                      pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(8, 12, 12))
        te, te2 = _clip(32), _t5()
        sched = d.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                  base_image_seq_len=256, max_image_seq_len=4096)
        vae = _vae(16, flux=True)
        _randomize(tr, te, te2, vae, seed=seed)
        return d.FluxPipeline(transformer=tr, scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok,
                              text_encoder_2=te2, tokenizer_2=t5tok)
    raise ValueError(family)


def save_pipeline(family: str, folder: str, seed: int = 0) -> str:
    """Build and ``save_pretrained`` a tiny pipeline; returns the folder."""
    pipe = build_pipeline(family, seed)
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder
