"""PickScore (Kirstain et al. 2023, "Pick-a-Pic"): a CLIP ViT-H-14 fine-tuned on human preferences, run
with transformers. Reward = ``logit_scale.exp() · cos(image, prompt)`` (about 18–24 for real images), as in
the reference snippet of the PickScore model card.

Files, as users have them: the model folder ``PickScore_v1`` (``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``) and the processor folder of ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``
(``preprocessor_config.json`` and the CLIP tokenizer: ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``,
with ``tokenizer_config.json`` / ``special_tokens_map.json``). The processor folder may be the model folder
itself (files merged), its subfolder ``processor/`` or ``CLIP-ViT-H-14-laion2B-s32B-b79K/``, or the
``processor_path`` option.

Preprocessing reproduces ``CLIPImageProcessor`` with the constants read from the user's
``preprocessor_config.json`` (shorter side to 224, bicubic; centre crop 224 with transformers' floor
rounding; OpenAI mean/std); text: the tokenizer with ``padding=True, truncation=True, max_length=77``.
The projections are applied explicitly (``visual_projection(vision_model(...).pooler_output)``), which
is what ``get_image_features`` computes on transformers 4.x and 5.x alike.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import torch.nn.functional as F

from .base import register
from .clip_models import unique_prompt_index
from .torch_reward import (TorchReward, files_error, folder_of, nearby_folders, normalize, resize_shortest_crop,
                           wrong_file)

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"))
PROCESSOR_HUB_NAME = "CLIP-ViT-H-14-laion2B-s32B-b79K"   # a sibling download of the processor


def _has_processor(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "preprocessor_config.json")) and any(
        all(os.path.isfile(os.path.join(folder, f)) for f in fs) for fs in TOKENIZER_SETS)


@register("pickscore")
class PickScore(TorchReward):
    """PickScore v1. Options: ``processor_path`` (the CLIP-ViT-H-14 processor folder when it is not inside
    the model folder), ``dtype`` (auto: fp16 on CUDA), ``batch_size`` (32)."""

    name = "pickscore"
    expected_files = ("the PickScore_v1 model folder (config.json + model.safetensors or pytorch_model.bin) and "
                      "the processor files of laion/CLIP-ViT-H-14-laion2B-s32B-b79K (preprocessor_config.json, "
                      "tokenizer.json or vocab.json + merges.txt, tokenizer_config.json, special_tokens_map.json) in "
                      "the same folder, in a subfolder, in a sibling folder named like CLIP-ViT-H-14-laion2B-s32B-b79K (a Hub "
                      "download or cache folder), or given as the option processor_path")
    is_folder = True
    licence = "MIT (the processor: MIT)"
    source = ("Hugging Face: the model yuvalkirstain/PickScore_v1, the processor laion/CLIP-ViT-H-14-laion2B-s32B-b79K "
              "(PickScore project: github yuvalkirstain/PickScore)")

    def __init__(self, path=None, device="cpu", *, processor_path: Optional[str] = None, dtype=None,
                 batch_size: int = 32):
        self._setup(device, dtype, batch_size)
        folder = folder_of(path, self.name, self.expected_files, self.source)
        missing = [f for f in ("config.json",) if not os.path.isfile(os.path.join(folder, f))]
        if not any(os.path.isfile(os.path.join(folder, f)) for f in WEIGHTS):
            missing.append(" or ".join(WEIGHTS))
        if missing:
            raise files_error(self.name, f"{folder} lacks {', '.join(missing)}", self.expected_files, self.source)
        proc = self._processor_folder(folder, processor_path)
        with open(os.path.join(folder, "config.json")) as fh:
            try:
                model_type = json.load(fh).get("model_type")
            except json.JSONDecodeError as e:
                raise wrong_file(self.name, os.path.join(folder, "config.json"), f"not JSON: {e}",
                                 "a transformers CLIPModel config.json") from e
        if model_type != "clip":
            raise wrong_file(self.name, os.path.join(folder, "config.json"), f"model_type is {model_type!r}, not 'clip'",
                             "the config.json of PickScore_v1 (a transformers CLIPModel)")

        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

        from .weightfiles import check_folder_weights
        check_folder_weights(folder, self.name)    # cut short, a web page or a Git LFS pointer: said by name
        try:
            self.module, info = CLIPModel.from_pretrained(folder, local_files_only=True, output_loading_info=True)
        except Exception as e:
            raise ValueError(f"{self.name}: cannot load the CLIP model in {folder}: {e}") from e
        self._check_weights(folder, info)
        try:
            ip = CLIPImageProcessor.from_pretrained(proc, local_files_only=True)
            self.tokenizer = AutoTokenizer.from_pretrained(proc, local_files_only=True)
        except Exception as e:
            raise ValueError(f"{self.name}: cannot load the processor files in {proc}: {e}") from e
        self.size = self._edge(ip.size, "shortest_edge")
        self.crop = self._edge(ip.crop_size, "height") if ip.do_center_crop else None
        self.mean, self.std = tuple(ip.image_mean), tuple(ip.image_std)
        self.interpolation = {2: "bilinear", 3: "bicubic"}.get(int(ip.resample), "bicubic")
        self.max_length = 77
        vis = self.module.config.vision_config.image_size
        if (self.crop or self.size) != vis:
            raise ValueError(f"{self.name}: the processor crops to {self.crop or self.size} px but the model expects "
                             f"{vis} px: the processor folder {proc} does not belong to this model")
        self.folders = {"model": folder, "processor": proc}
        self._finish()

    def _check_weights(self, folder: str, info: dict) -> None:
        """transformers fills weights a file lacks with random values (a warning only): a wrong or partial file would
        then score with noise. Refuse unless every weight came from the file (position-id buffers excepted)."""
        def real(keys):
            return [k if isinstance(k, str) else k[0] for k in keys or () if not str(k).endswith("position_ids")]

        missing, unexpected, mismatched = (real(info.get(k)) for k in
                                           ("missing_keys", "unexpected_keys", "mismatched_keys"))
        if missing or unexpected or mismatched:
            what = "; ".join(f"{n} {len(v)} (e.g. {v[0]})" for n, v in
                             (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)) if v)
            raise wrong_file(self.name, folder, f"its weights do not match its config.json ({what}): an incomplete "
                             "download or another model's file", "PickScore_v1's config.json with its own weights")

    @staticmethod
    def _edge(size, key):
        if isinstance(size, int):
            return size
        get = size.get if isinstance(size, dict) else (lambda k: getattr(size, k, None))
        return int(get(key) or get("height") or get("shortest_edge"))

    def _processor_folder(self, folder, option):
        if option is not None:
            p = os.path.abspath(option)
            if not _has_processor(p):
                raise files_error(self.name, f"processor folder {p} lacks preprocessor_config.json or the tokenizer files",
                                  self.expected_files, self.source)
            return p
        for cand in nearby_folders(folder, PROCESSOR_HUB_NAME):
            if _has_processor(cand):
                return cand
        raise files_error(self.name, f"no processor files (preprocessor_config.json + tokenizer) in {folder}, its "
                          f"subfolders or a sibling folder named like {PROCESSOR_HUB_NAME}", self.expected_files,
                          self.source)

    def preprocess(self, images):
        x = resize_shortest_crop(images, self.size, self.interpolation, crop_rounding="floor", crop=self.crop)
        return normalize(x, self.mean, self.std)

    def _embed(self, images):
        m = self.module
        return m.visual_projection(m.vision_model(pixel_values=self.preprocess(images).to(self.dtype)).pooler_output)

    def _score(self, images, prompts):
        m = self.module
        uniq, idx = unique_prompt_index(prompts)
        tok = self.tokenizer(uniq, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        img = self._embed(images).float()
        txt = m.text_projection(m.text_model(input_ids=tok["input_ids"].to(self.device),
                                             attention_mask=tok["attention_mask"].to(self.device)).pooler_output).float()
        cos = (F.normalize(img, dim=-1) * F.normalize(txt, dim=-1)[idx.to(self.device)]).sum(-1)
        return m.logit_scale.float().exp() * cos
