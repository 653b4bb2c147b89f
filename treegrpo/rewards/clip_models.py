"""open_clip models built from local weight files (OpenAI TorchScript, open_clip state dicts, transformers CLIP),
their tokenizers and their preprocessing, shared by CLIPScore, HPS v2 and the LAION aesthetic predictor."""
from __future__ import annotations

import json
import os
from typing import Optional

import torch

from .torch_reward import (OPENAI_MEAN, OPENAI_STD, empty_init, load_into, normalize, resize_longest_pad,
                           resize_shortest_crop, squash)

# ----------------------------------------------------------------------------------------------------------------
# open_clip models from local files
# ----------------------------------------------------------------------------------------------------------------

def open_clip_config(arch: str, name: str) -> dict:
    import open_clip
    cfg = open_clip.get_model_config(arch.replace("/", "-"))
    if cfg is None:
        raise ValueError(f"{name}: unknown open_clip architecture {arch!r}; known: {', '.join(open_clip.list_models())}")
    return cfg


def is_hf_clip(sd: dict) -> bool:
    return any(k.startswith(("vision_model.", "text_model.")) for k in sd)


def hf_clip_to_open_clip(sd: dict) -> dict:
    """Rename a transformers ``CLIPModel`` / ``CLIPVisionModelWithProjection`` state dict (e.g. the
    ``openai/clip-vit-large-patch14`` weights ComfyUI keeps in ``models/clip_vision``) to open_clip's keys."""
    out = {}
    for tower, prefix, dst in (("vision_model", "visual.", "visual.transformer.resblocks"),
                               ("text_model", "", "transformer.resblocks")):
        layers = sorted({int(k.split(".")[3]) for k in sd if k.startswith(f"{tower}.encoder.layers.")})
        for i in layers:
            src = f"{tower}.encoder.layers.{i}."
            d = f"{dst}.{i}."
            for t in ("weight", "bias"):
                out[d + f"attn.in_proj_{t}"] = torch.cat([sd[src + f"self_attn.{p}_proj.{t}"] for p in "qkv"])
                out[d + f"attn.out_proj.{t}"] = sd[src + f"self_attn.out_proj.{t}"]
                out[d + f"ln_1.{t}"] = sd[src + f"layer_norm1.{t}"]
                out[d + f"ln_2.{t}"] = sd[src + f"layer_norm2.{t}"]
                out[d + f"mlp.c_fc.{t}"] = sd[src + f"mlp.fc1.{t}"]
                out[d + f"mlp.c_proj.{t}"] = sd[src + f"mlp.fc2.{t}"]
    ren = {"vision_model.embeddings.class_embedding": "visual.class_embedding",
           "vision_model.embeddings.patch_embedding.weight": "visual.conv1.weight",
           "vision_model.embeddings.position_embedding.weight": "visual.positional_embedding",
           "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
           "text_model.embeddings.position_embedding.weight": "positional_embedding",
           "logit_scale": "logit_scale"}
    for t in ("weight", "bias"):
        ren[f"vision_model.pre_layrnorm.{t}"] = f"visual.ln_pre.{t}"
        ren[f"vision_model.post_layernorm.{t}"] = f"visual.ln_post.{t}"
        ren[f"text_model.final_layer_norm.{t}"] = f"ln_final.{t}"
    for a, b in ren.items():
        if a in sd:
            out[b] = sd[a]
    if "visual_projection.weight" in sd:
        out["visual.proj"] = sd["visual_projection.weight"].t().contiguous()
    if "text_projection.weight" in sd:
        out["text_projection"] = sd["text_projection.weight"].t().contiguous()
    return out


def build_open_clip(arch: str, sd: dict, name: str, path: str, expected: str, *, quick_gelu: Optional[bool],
                    vision_only: bool = False) -> torch.nn.Module:
    """An open_clip ``CLIP`` (or only its image tower) of architecture ``arch`` holding the weights ``sd``
    (open_clip/OpenAI keys, or transformers keys, converted). Built without random initialisation.
    ``quick_gelu``: True also for an architecture without it; None: the architecture's own activation."""
    from open_clip.model import CLIP, _build_vision_tower
    cfg = open_clip_config(arch, name)
    if "hf_model_name" in cfg.get("text_cfg", {}) or cfg.get("custom_text") or \
            "timm_model_name" in cfg.get("vision_cfg", {}):
        raise ValueError(f"{name}: architecture {arch!r} uses a Hugging Face text tower or a timm image tower; "
                         f"only open_clip's own CLIP architectures load offline here")
    if is_hf_clip(sd):
        sd = hf_clip_to_open_clip(sd)
    cfg["quick_gelu"] = bool(cfg.get("quick_gelu", False) if quick_gelu is None else
                             quick_gelu or cfg.get("quick_gelu", False))
    if "logit_scale" in sd and sd["logit_scale"].ndim == 1 and sd["logit_scale"].numel() == 1:
        sd["logit_scale"] = sd["logit_scale"].reshape(())
    with empty_init():
        if vision_only:
            model = _build_vision_tower(cfg["embed_dim"], cfg["vision_cfg"], cfg["quick_gelu"])
            sd = {k[len("visual."):]: v for k, v in sd.items() if k.startswith("visual.")}
        else:
            cfg.pop("custom_text", None)
            model = CLIP(**cfg)
    load_into(model, sd, name, path, f"{expected}, for open_clip architecture {arch} (option `arch`)")
    return model


def open_clip_tokenizer(arch: str, name: str):
    import open_clip
    try:
        return open_clip.get_tokenizer(arch.replace("/", "-"))
    except Exception as e:  # HF tokenizers of some archs would need the hub
        raise ValueError(f"{name}: the tokenizer of {arch!r} is not available offline ({e})") from e


def preprocess_cfg(arch: str, pretrained: Optional[str], overrides: dict) -> dict:
    """open_clip's preprocessing for ``arch``/``pretrained`` (size, mean, std, interpolation, resize_mode),
    from its local tables only, with ``overrides`` applied."""
    import open_clip
    cfg = {"size": 224, "mean": OPENAI_MEAN, "std": OPENAI_STD, "interpolation": "bicubic", "resize_mode": "shortest"}
    mcfg = open_clip.get_model_config(arch.replace("/", "-")) or {}
    cfg["size"] = mcfg.get("vision_cfg", {}).get("image_size", 224)
    cfg.update({k: v for k, v in mcfg.get("preprocess_cfg", {}).items() if k in cfg})
    if pretrained:
        pcfg = open_clip.get_pretrained_cfg(arch.replace("/", "-"), pretrained) or {}
        cfg.update({k: v for k, v in pcfg.items() if k in cfg and v is not None})
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(cfg["size"], (tuple, list)):
        if cfg["size"][0] != cfg["size"][1]:
            raise ValueError(f"non-square input size {cfg['size']} is not supported")
        cfg["size"] = cfg["size"][0]
    if cfg["resize_mode"] not in ("shortest", "longest", "squash"):
        raise ValueError(f"resize_mode must be shortest, longest or squash, got {cfg['resize_mode']!r}")
    return cfg


def beside_config(file: str, name: str) -> dict:
    """``open_clip_config.json`` next to a weight file (open_clip's hub layout: ``model_cfg`` with ``quick_gelu``,
    ``preprocess_cfg``), or {}. It says how the weights were trained (GELU or QuickGELU, normalisation), which a
    weight file alone does not."""
    path = os.path.join(os.path.dirname(os.path.abspath(file)), "open_clip_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as e:
        raise ValueError(f"{name}: {path} (beside the weights) is not a readable open_clip config: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{name}: {path} (beside the weights) is not an open_clip config (a JSON object)")
    return cfg


def pretrained_quick_gelu(arch: str, pretrained: Optional[str]) -> bool:
    import open_clip
    if not pretrained:
        return False
    if pretrained == "openai":
        return True
    return bool((open_clip.get_pretrained_cfg(arch.replace("/", "-"), pretrained) or {}).get("quick_gelu", False))


def clip_preprocess(x: torch.Tensor, cfg: dict) -> torch.Tensor:
    if cfg["resize_mode"] == "longest":
        x = resize_longest_pad(x, cfg["size"], 0.0, cfg["interpolation"])
    elif cfg["resize_mode"] == "squash":
        x = squash(x, cfg["size"], cfg["interpolation"])
    else:
        x = resize_shortest_crop(x, cfg["size"], cfg["interpolation"])
    return normalize(x, cfg["mean"], cfg["std"])


def unique_prompt_index(prompts: list[str]) -> tuple[list[str], torch.Tensor]:
    """Distinct prompts (in first-seen order) and, per image, the index of its prompt among them: the
    leaves of a tree share their prompt, so text features are computed once per prompt."""
    uniq: dict[str, int] = {}
    idx = [uniq.setdefault(p, len(uniq)) for p in prompts]
    return list(uniq), torch.tensor(idx, dtype=torch.long)
