"""CLIPScore with any open_clip model (Hessel et al. 2021, "CLIPScore: A Reference-free Evaluation Metric for Image
Captioning"): ``w · max(cos(E_image, E_text), 0)`` with ``w = 2.5``; ``clamp=False`` keeps negative cosines (a
smoother training signal), ``w=1`` gives the plain cosine. The reward models' shared base is
:mod:`.torch_reward`, the open_clip towers :mod:`.clip_models`.
"""
from __future__ import annotations

from typing import Optional

import torch.nn.functional as F

from .base import register
from .clip_models import (beside_config, build_open_clip, clip_preprocess, open_clip_tokenizer, preprocess_cfg,
                          pretrained_quick_gelu, unique_prompt_index)
from .torch_reward import TorchReward, require_file
from .weightfiles import is_torchscript, read_weights

# ----------------------------------------------------------------------------------------------------------------
# CLIPScore
# ----------------------------------------------------------------------------------------------------------------

CLIP_FILES = ("one CLIP weight file of the chosen open_clip architecture (default ViT-L-14, OpenAI weights): "
              "OpenAI's TorchScript 'ViT-L-14.pt', an open_clip state dict ('open_clip_pytorch_model.bin' or "
              "'open_clip_model.safetensors'), or a transformers CLIP 'model.safetensors' / ComfyUI clip_vision file")
CLIP_SOURCE = ("OpenAI CLIP (github openai/CLIP, the file clip.load saves as ViT-L-14.pt), the open_clip model "
               "hubs (e.g. timm/vit_large_patch14_clip_224.openai or laion/CLIP-ViT-* on Hugging Face), or "
               "openai/clip-vit-large-patch14 on Hugging Face")


@register("clipscore")
class CLIPScore(TorchReward):
    """``w · max(cos(image, text), 0)`` under an open_clip CLIP model (Hessel et al. 2021).

    Options: ``arch`` (open_clip architecture, default ``ViT-L-14``), ``pretrained`` (open_clip tag of the
    weights, default ``openai``: sets QuickGELU and the preprocessing constants from open_clip's local
    table; ``None`` = OpenAI constants, GELU), ``quick_gelu`` (override), ``w`` (2.5), ``clamp`` (True),
    ``dtype`` (auto: fp16 on CUDA), ``batch_size`` (32), and preprocessing overrides ``mean``, ``std``,
    ``interpolation``, ``resize_mode``."""

    name = "clipscore"
    expected_files = CLIP_FILES
    licence = "that of the CLIP weights (OpenAI CLIP and LAION open_clip: MIT)"
    is_folder = False
    source = CLIP_SOURCE

    def __init__(self, path=None, device="cpu", *, arch: str = "ViT-L-14", pretrained: Optional[str] = "openai",
                 quick_gelu: Optional[bool] = None, w: float = 2.5, clamp: bool = True, dtype=None,
                 batch_size: int = 32, mean=None, std=None, interpolation=None, resize_mode=None):
        self._setup(device, dtype, batch_size)
        file = require_file(path, self.name, self.expected_files, self.source)
        sd = read_weights(file, self.name)
        beside = beside_config(file, self.name)
        if quick_gelu is None:
            quick_gelu = beside["model_cfg"].get("quick_gelu") if "quick_gelu" in beside.get("model_cfg", {}) else \
                pretrained_quick_gelu(arch, pretrained) or is_torchscript(file)
        self.module = build_open_clip(arch, sd, self.name, file, self.expected_files, quick_gelu=quick_gelu)
        self.tokenizer = open_clip_tokenizer(arch, self.name)
        overrides = {k: v for k, v in beside.get("preprocess_cfg", {}).items()
                     if k in ("mean", "std", "interpolation", "resize_mode")}
        overrides.update({k: v for k, v in dict(mean=mean, std=std, interpolation=interpolation,
                                                resize_mode=resize_mode).items() if v is not None})
        self.pre = preprocess_cfg(arch, pretrained, overrides)
        self.w, self.clamp, self.arch = float(w), bool(clamp), arch
        self._finish()

    def _embed(self, images):
        return self.module.encode_image(clip_preprocess(images, self.pre).to(self.dtype))

    def _score(self, images, prompts):
        m = self.module
        uniq, idx = unique_prompt_index(prompts)
        img = F.normalize(self._embed(images).float(), dim=-1)
        txt = F.normalize(m.encode_text(self.tokenizer(uniq).to(self.device)).float(), dim=-1)
        cos = (img * txt[idx.to(self.device)]).sum(-1)
        return self.w * (cos.clamp(min=0) if self.clamp else cos)
