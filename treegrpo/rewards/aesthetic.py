"""LAION aesthetic predictor v2 ("improved aesthetic predictor", Schuhmann): a linear MLP head on the
L2-normalised CLIP ViT-L/14 image embedding, predicting a 1–10 aesthetic rating. The prompt is ignored.

Files: the head ``sac+logos+ava1-l14-linearMSE.pth`` = bare state dict ``layers.{0,2,4,6,7}.{weight,bias}``
(768→1024→128→64→16→1, dropouts between, no activations), and OpenAI's CLIP ViT-L/14 (any format
``weightfiles.read_weights`` reads: OpenAI's TorchScript ``ViT-L-14.pt``, an open_clip state dict, or a
transformers/ComfyUI ``clip_vision`` file). Only the image tower is built.

Preprocessing as the reference (``clip.load("ViT-L/14")``'s transform): shorter side to 224 (bicubic),
centre crop 224, OpenAI mean/std.
"""
from __future__ import annotations

import os
from typing import Optional

import torch.nn as nn
import torch.nn.functional as F

from .base import register
from .clip_models import build_open_clip
from .torch_reward import (OPENAI_MEAN, OPENAI_STD, TorchReward, empty_init, files_error, find_file, folder_of,
                           load_into, nearby_folders, normalize, read_weights, resize_shortest_crop, wrong_file)

HEAD_NAMES = ("sac+logos+ava1-l14-linearMSE.pth", "sac+logos+ava1-l14-linearMSE.safetensors")
CLIP_NAMES = ("ViT-L-14.pt", "open_clip_pytorch_model.bin", "open_clip_model.safetensors", "clip_vision_l.safetensors",
              "model.safetensors")


class AestheticHead(nn.Module):
    """The predictor's MLP, module for module (keys ``layers.0/2/4/6/7``)."""

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))

    def forward(self, x):
        return self.layers(x)


@register("laion_aesthetic")
class LaionAesthetic(TorchReward):
    """Aesthetic score (about 1–10) of each image.

    ``path``: the folder holding the head and the CLIP file, or the head file itself (the CLIP file is then
    looked for beside it). Options: ``head`` / ``clip`` (file names in the folder, or paths), ``arch``
    (open_clip architecture of the CLIP file, default ``ViT-L-14``), ``quick_gelu`` (True: OpenAI weights),
    ``dtype`` (auto: fp16 on CUDA; the head always runs in float32), ``batch_size`` (32)."""

    name = "laion_aesthetic"
    expected_files = (f"a folder with the head '{HEAD_NAMES[0]}' and OpenAI's CLIP ViT-L/14 weights as one of "
                      f"{', '.join(repr(n) for n in CLIP_NAMES[:-1])} (or a transformers 'model.safetensors')")
    is_folder = True
    licence = "Apache-2.0 (the head), MIT (OpenAI CLIP)"
    source = ("the head: LAION's improved-aesthetic-predictor (github christophschuhmann/improved-aesthetic-predictor); "
              "CLIP ViT-L/14: OpenAI CLIP (github openai/CLIP) or openai/clip-vit-large-patch14 / "
              "timm/vit_large_patch14_clip_224.openai on Hugging Face")

    def __init__(self, path=None, device="cpu", *, head: Optional[str] = None, clip: Optional[str] = None,
                 arch: str = "ViT-L-14", quick_gelu: bool = True, dtype=None, batch_size: int = 32):
        self._setup(device, dtype, batch_size)
        folder = folder_of(path, self.name, self.expected_files, self.source)
        head_file = clip_file = None
        if path and os.path.isfile(path):  # a file picked in ComfyUI: the head, or the CLIP file beside it
            if os.path.basename(path) in HEAD_NAMES or "linearMSE" in os.path.basename(path):
                head_file = os.path.abspath(path)
            else:
                clip_file = os.path.abspath(path)
        head_file = head_file or self._locate(folder, head, HEAD_NAMES, "the aesthetic head")
        clip_file = clip_file or self._locate(folder, clip, CLIP_NAMES, "the CLIP ViT-L/14 weights")

        sd = read_weights(head_file, self.name)
        if "layers.0.weight" not in sd:
            raise wrong_file(self.name, head_file, f"no 'layers.0.weight' among its keys {sorted(sd)[:4]}",
                             f"the aesthetic head {HEAD_NAMES[0]}")
        with empty_init():
            head_mod = AestheticHead(sd["layers.0.weight"].shape[1])
        load_into(head_mod, sd, self.name, head_file, f"the aesthetic head {HEAD_NAMES[0]}")
        clip_sd = read_weights(clip_file, self.name)
        visual = build_open_clip(arch, clip_sd, self.name, clip_file, "CLIP ViT-L/14 weights", quick_gelu=quick_gelu,
                                 vision_only=True)
        if visual.output_dim != head_mod.layers[0].in_features:
            raise ValueError(f"{self.name}: the CLIP file gives {visual.output_dim}-d embeddings but the head "
                             f"expects {head_mod.layers[0].in_features}-d (the head is for CLIP ViT-L/14)")
        self.module = nn.ModuleDict({"visual": visual, "head": head_mod})
        self.size = visual.image_size[0]
        self.files = {"head": head_file, "clip": clip_file}
        self._finish()

    def _locate(self, folder, option, names, what) -> str:
        if option is not None:
            p = option if os.path.isabs(option) else os.path.join(folder, option)
            if not os.path.isfile(p):
                raise files_error(self.name, f"{what} {p} does not exist", self.expected_files, self.source)
            return p
        # the head sits in the folder; the CLIP may also be in a subfolder or a sibling Hub download
        places = [folder] if names is HEAD_NAMES else nearby_folders(folder, "clip-vit-large-patch14")
        found = next((f for f in (find_file(d, names) for d in places) if f), None)
        if found is None and names is HEAD_NAMES:
            cands = [f for f in sorted(os.listdir(folder)) if "linearMSE" in f]
            found = os.path.join(folder, cands[0]) if len(cands) == 1 else None
        if found is None:
            raise files_error(self.name, f"{what} not found in {folder} (looked for {', '.join(names)})",
                              self.expected_files, self.source)
        return found

    def _keep_fp32(self):
        self.module["head"].float()

    def preprocess(self, images):
        return normalize(resize_shortest_crop(images, self.size), OPENAI_MEAN, OPENAI_STD)

    def _embed(self, images):
        return self.module["visual"](self.preprocess(images).to(self.dtype))

    def _score(self, images, prompts):
        emb = self._embed(images).float()
        return self.module["head"](F.normalize(emb, dim=-1)).squeeze(-1)
