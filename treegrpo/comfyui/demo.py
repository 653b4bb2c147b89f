"""The embedded demo model as real ComfyUI objects: MODEL (a ``ModelPatcher`` of a flow ``BaseModel``),
CLIP (a ``comfy.sd.CLIP`` whose tokenizer/encoder map the demo's words to tokens) and VAE (ComfyUI's
pixel-space VAE). With them the demo runs through ComfyUI's stock nodes (CLIPTextEncode, KSampler,
VAEDecode, LoraLoaderModelOnly) and through this pack's nodes. Imported only inside ComfyUI.

Conditioning: ``cond`` is (1, 2, 1) float = the two word tokens (colour, shape); the empty prompt gives
the null tokens, i.e. the unconditional model. The model's timestep is σ (multiplier 1) and it predicts
the flow velocity, so ComfyUI's ``CONST`` sampling turns it into x̂0 = x − σ·v.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..demo.model import DemoConfig, DemoDiT, load_demo_model, tokenize


class ComfyDemoDiT(DemoDiT):
    """DemoDiT with ComfyUI's diffusion-model call signature (module names unchanged, so LoRA files of
    the CLI and of ComfyUI are interchangeable)."""

    def __init__(self, demo_config: Optional[dict] = None, device=None, operations=None, dtype=None, **kwargs):
        super().__init__(DemoConfig(**(demo_config or {})))
        self.dtype = torch.float32  # ComfyUI reads diffusion_model.dtype
        if device is not None:
            self.to(device)

    def forward(self, x, timesteps, context=None, transformer_options={}, control=None, **kwargs):  # noqa: B006
        if context is None:
            tokens = torch.zeros(x.shape[0], self.config.text_len, dtype=torch.long, device=x.device)
        else:
            tokens = context[..., 0].round().long()
            if tokens.shape[0] != x.shape[0]:
                tokens = tokens.repeat(x.shape[0] // tokens.shape[0], 1)
        return super().forward(x, timesteps.float(), tokens)


class DemoTokenizer:
    """ComfyUI tokenizer interface: words of a demo prompt → token ids (unknown words raise)."""

    def __init__(self, embedding_directory=None, tokenizer_data={}):  # noqa: B006
        pass

    def tokenize_with_weights(self, text: str, return_word_ids: bool = False, **kwargs):
        return {"demo": tokenize([text])}

    def untokenize(self, token_weight_pair):
        return token_weight_pair

    def state_dict(self):
        return {}


class DemoTextEncoder(nn.Module):
    """ComfyUI text-encoder interface; the 'embedding' is the token ids themselves (the flow model
    embeds them)."""

    def __init__(self, device=None, dtype=None, model_options={}, **kwargs):  # noqa: B006
        super().__init__()
        self.dtypes = {torch.float32}
        self.register_buffer("_device_anchor", torch.zeros(1))  # a size > 0: ComfyUI then keeps it loaded

    def reset_clip_options(self):
        pass

    def set_clip_options(self, options):
        pass

    def encode_token_weights(self, tokens):
        ids = tokens["demo"].float()
        return ids[..., None], None

    def load_sd(self, sd):
        return [], []


def _model_config(demo_config: DemoConfig):
    import comfy.latent_formats
    import comfy.model_base
    import comfy.supported_models_base

    class PixelLatent(comfy.latent_formats.LatentFormat):
        latent_channels = demo_config.in_channels
        scale_factor = 1.0

    class DemoFlowConfig(comfy.supported_models_base.BASE):
        unet_config = {"demo_config": demo_config.__dict__.copy()}
        unet_extra_config = {}
        sampling_settings = {"multiplier": 1.0, "shift": 1.0}
        latent_format = PixelLatent
        memory_usage_factor = 1.0
        supported_inference_dtypes = [torch.float32]

        def get_model(self, state_dict, prefix="", device=None):
            return comfy.model_base.BaseModel(self, model_type=comfy.model_base.ModelType.FLOW, device=device,
                                              unet_model=ComfyDemoDiT)

    return DemoFlowConfig(DemoFlowConfig.unet_config)


def load_demo_comfy(path: Optional[str] = None):
    """(MODEL, CLIP, VAE) of the demo model for ComfyUI; weights from ``path`` or the shipped file."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.sd
    import comfy.supported_models_base

    with torch.inference_mode(False):
        dit = load_demo_model(path)
        cfg = _model_config(dit.config)
        model = cfg.get_model({})
        model.diffusion_model.load_state_dict(dit.state_dict())
        model.diffusion_model.requires_grad_(False).eval()
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device())
    target = comfy.supported_models_base.ClipTarget(DemoTokenizer, DemoTextEncoder)
    clip = comfy.sd.CLIP(target=target, embedding_directory=None, parameters=0)
    vae = comfy.sd.VAE(sd={"pixel_space_vae": torch.tensor(1.0)})
    return patcher, clip, vae
