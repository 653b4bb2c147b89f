"""Model configs across ComfyUI versions: the tiny (and benchmark) builders write the fields ComfyUI 0.3.75's
parameter dataclasses take; newer ComfyUI made some more fields required. :func:`newer_fields` adds those the
running ComfyUI's dataclass has (with the value its own model detection gives a checkpoint of that kind) and leaves
the config as it is on 0.3.75, whose dataclasses would refuse unknown keys."""
from __future__ import annotations

import dataclasses
import importlib

#: image_model → the parameter dataclass its model builds from ``unet_config``
PARAMS = {"flux": ("comfy.ldm.flux.model", "FluxParams"), "flux2": ("comfy.ldm.flux.model", "FluxParams"),
          "chroma": ("comfy.ldm.chroma.model", "ChromaParams"),
          "chroma_radiance": ("comfy.ldm.chroma_radiance.model", "ChromaRadianceParams"),
          "hunyuan_video": ("comfy.ldm.hunyuan_video.model", "HunyuanVideoParams")}


def _defaults(cfg: dict) -> dict:
    """What ComfyUI 0.33's comfy/model_detection.py sets for a checkpoint without these tensors."""
    return {"txt_ids_dims": [3] if cfg.get("image_model") == "flux2" else [],
            "vec_in_dim": None,
            "meanflow_sum": cfg.get("vision_in_dim") is not None,
            "use_x0": False, "use_sequential_txt_ids": False}


def newer_fields(unet: dict) -> dict:
    """A copy of ``unet`` with the required fields of the running ComfyUI's parameter dataclass it lacks."""
    out = dict(unet)
    spec = PARAMS.get(out.get("image_model"))
    if spec is None:
        return out
    params = getattr(importlib.import_module(spec[0]), spec[1], None)
    if params is None or not dataclasses.is_dataclass(params):
        return out
    fields = {f.name for f in dataclasses.fields(params)}
    for key, value in _defaults(out).items():
        if key in fields and key not in out:
            out[key] = value
    return out
