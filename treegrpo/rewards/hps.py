"""HPS v2 / v2.1 (Human Preference Score, Wu et al. 2023): an open_clip ViT-H-14 fine-tuned on human
preferences; the reward is the cosine of the image and prompt embeddings (no logit scale), as in the
``hpsv2`` package's ``score``.

Files, as users have them: ``HPS_v2_compressed.pt`` or ``HPS_v2.1_compressed.pt`` = ``{'state_dict':
<open_clip ViT-H-14 keys>}`` (a plain state dict or a ``.safetensors`` conversion loads too).
Preprocessing as ``hpsv2``'s ``preprocess_val``: scale the longer side to 224 (bicubic), pad to a square
with black, normalise with OpenAI's CLIP mean/std. Tokenizer: open_clip's (its BPE vocabulary ships with
``open_clip_torch``; the ``hpsv2`` wheel lacks it, so that package is not needed).
"""
from __future__ import annotations


import torch.nn.functional as F

from .base import register
from .clip_models import build_open_clip, open_clip_tokenizer, unique_prompt_index
from .torch_reward import (OPENAI_MEAN, OPENAI_STD, TorchReward, normalize, read_weights, require_file,
                           resize_longest_pad)


@register("hpsv2")
class HPSv2(TorchReward):
    """HPS v2 / v2.1 reward (the two differ only in their weight file).

    Options: ``arch`` (open_clip architecture of the file, default ``ViT-H-14``), ``dtype`` (auto: fp16 on
    CUDA), ``batch_size`` (32)."""

    name = "hpsv2"
    expected_files = "one file: HPS_v2.1_compressed.pt (HPS v2.1) or HPS_v2_compressed.pt (HPS v2)"
    is_folder = False
    licence = "Apache-2.0"
    source = "the HPSv2 project (github tgxs002/HPSv2; the files are published on Hugging Face as xswu/HPSv2)"

    def __init__(self, path=None, device="cpu", *, arch: str = "ViT-H-14", dtype=None, batch_size: int = 32):
        self._setup(device, dtype, batch_size)
        file = require_file(path, self.name, self.expected_files, self.source)
        sd = read_weights(file, self.name)
        self.module = build_open_clip(arch, sd, self.name, file, self.expected_files, quick_gelu=False)
        self.tokenizer = open_clip_tokenizer(arch, self.name)
        self.size = int(self.module.visual.image_size[0] if isinstance(self.module.visual.image_size, tuple)
                        else self.module.visual.image_size)
        self.arch = arch
        self._finish()

    def preprocess(self, images):
        return normalize(resize_longest_pad(images, self.size, fill=0.0), OPENAI_MEAN, OPENAI_STD)

    def _embed(self, images):
        return self.module.encode_image(self.preprocess(images).to(self.dtype))

    def _score(self, images, prompts):
        m = self.module
        uniq, idx = unique_prompt_index(prompts)
        img = F.normalize(self._embed(images).float(), dim=-1)
        txt = F.normalize(m.encode_text(self.tokenizer(uniq).to(self.device)).float(), dim=-1)
        return (img * txt[idx.to(self.device)]).sum(-1)
