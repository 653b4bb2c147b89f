"""A ComfyUI-trained LoRA in diffusers' keys, for ``pipe.load_lora_weights``.

The Train node's LoRA names the layers of ComfyUI's model (``diffusion_model.input_blocks.1.1.transformer_blocks.0.
attn1.to_q``, fused ``qkv`` and ``linear1`` layers), which diffusers does not read for SD1.x/SD2.x, SDXL and SD3. ComfyUI
itself knows both layouts: the maps its LoraLoader reads diffusers LoRAs with (``comfy.utils.unet_to_diffusers``,
``mmdit_to_diffusers``, ``flux_to_diffusers``: diffusers weight → ComfyUI weight, or → rows of a fused one). Read the
other way they give the twin: a fused layer's LoRA, down ``A`` (r, in) and up ``B`` (out, r), becomes one LoRA per
diffusers layer with the same ``A`` and that layer's rows of ``B`` — ``B[rows] A = (B A)[rows]``, exact.
"""
from __future__ import annotations

import re
from typing import Optional

from ..lora import LoraWeights

#: ComfyUI model class (``comfy.supported_models``, exact) → diffusers pipeline class and its denoiser component
PIPELINES = {
    "SD15": ("StableDiffusionPipeline", "unet"), "SD20": ("StableDiffusionPipeline", "unet"),
    "SDXL": ("StableDiffusionXLPipeline", "unet"), "SSD1B": ("StableDiffusionXLPipeline", "unet"),
    "Segmind_Vega": ("StableDiffusionXLPipeline", "unet"), "KOALA_700M": ("StableDiffusionXLPipeline", "unet"),
    "KOALA_1B": ("StableDiffusionXLPipeline", "unet"),
    "SD3": ("StableDiffusion3Pipeline", "transformer"),
    "Flux": ("FluxPipeline", "transformer"), "FluxSchnell": ("FluxPipeline", "transformer"),
}

#: diffusers names ComfyUI's maps also give a layer for other layouts (LyCORIS LoKr's ``linear_in``/``linear_out``,
#: Flux.2's fused single-block names, the other UNet's embedding); the pipeline's own model has none of them
OTHER_LAYOUTS = {
    "FluxPipeline": re.compile(r"\.linear_(in|out)$|\.to_qkv_mlp_proj$|^single_transformer_blocks\.\d+\.attn\.to_out$"),
    "StableDiffusionXLPipeline": re.compile(r"^class_embedding\."),
    "StableDiffusionPipeline": re.compile(r"^add_embedding\."),
}


class NoDiffusersLayout(ValueError):
    """The LoRA has a layer the map gives no single diffusers layer (or rows) for."""


def pipeline_of(model) -> Optional[tuple[str, str]]:
    """``(diffusers pipeline class name, component)`` for a ComfyUI ``BaseModel``, None for a family diffusers'
    LoRA loader is not given a twin for."""
    return PIPELINES.get(type(getattr(model, "model_config", None)).__name__)


def layer_map(model) -> dict[str, list[tuple[str, Optional[tuple[int, int]]]]]:
    """ComfyUI layer (module path under ``diffusion_model``) → its diffusers layers ``(path, rows)``, ``rows``
    ``(start, size)`` of the output dimension for a fused layer, None for the whole weight. Empty when
    :func:`pipeline_of` is None. Layers whose map changes the values (the final layer's scale/shift swap) are left
    out: no twin is written for a LoRA on them."""
    import comfy.utils

    found = pipeline_of(model)
    if found is None:
        return {}
    pipeline, component = found
    to_diffusers_map = (comfy.utils.unet_to_diffusers if component == "unet" else
                        comfy.utils.mmdit_to_diffusers if pipeline == "StableDiffusion3Pipeline" else
                        comfy.utils.flux_to_diffusers)
    raw = to_diffusers_map(model.model_config.unet_config)
    other = OTHER_LAYOUTS.get(pipeline)
    layers: dict[str, list] = {}
    for name, target in raw.items():
        if not name.endswith(".weight"):
            continue
        name = name[:-len(".weight")]
        if other is not None and other.search(name):
            continue
        if isinstance(target, str):
            comfy_weight, rows = target, None
        elif len(target) == 2 and target[1] is not None and target[1][0] == 0:
            comfy_weight, rows = target[0], (int(target[1][1]), int(target[1][2]))
        else:       # a transform of the values, or a slice along the input: no LoRA twin is exact
            continue
        layers.setdefault(comfy_weight[:-len(".weight")], []).append((name, rows))
    return layers


def to_diffusers(w: LoraWeights, layers: dict) -> LoraWeights:
    """``w`` (ComfyUI module paths) as the same LoRA on diffusers' layers (see the module's docstring). Raises
    :class:`NoDiffusersLayout` naming a layer with no diffusers counterpart, several, or rows that do not tile its
    output."""
    down, up, alpha = {}, {}, {}
    for n in w.modules:
        parts = layers.get(n, [])
        whole = [p for p in parts if p[1] is None]
        fused = sorted((p for p in parts if p[1] is not None), key=lambda p: p[1][0])
        out = w.up[n].shape[0]
        if fused:
            edges = [r for _, r in fused]
            if edges[0][0] != 0 or any(a[0] + a[1] != b[0] for a, b in zip(edges, edges[1:])) \
                    or edges[-1][0] + edges[-1][1] != out:
                raise NoDiffusersLayout(f"layer {n}: diffusers' layers {[p[0] for p in fused]} do not cover its "
                                        f"{out} outputs")
            parts = fused
        elif len(whole) != 1:
            raise NoDiffusersLayout(f"layer {n} has {'no' if not whole else len(whole)} diffusers counterpart"
                                    f"{'' if not whole else 's'}")
        else:
            parts = whole
        for name, rows in parts:
            down[name] = w.down[n].clone()         # each layer its own tensors (safetensors stores no shared memory)
            up[name] = (w.up[n] if rows is None else w.up[n][rows[0]:rows[0] + rows[1]]).clone()
            alpha[name] = w.alpha[n]
    return LoraWeights(down, up, alpha)


def save(w: LoraWeights, model, path: str) -> Optional[str]:
    """Write ``w`` (a LoRA of ComfyUI model ``model``) at ``path`` in diffusers' keys with the family's pipeline
    (:func:`treegrpo.lora.save_diffusers_lora_file`); returns the path, or None for a family without a twin.
    Raises :class:`NoDiffusersLayout` as :func:`to_diffusers`."""
    found = pipeline_of(model)
    if found is None:
        return None
    import diffusers

    from ..lora import save_diffusers_lora_file

    pipeline, component = found
    return save_diffusers_lora_file(to_diffusers(w, layer_map(model)), path, getattr(diffusers, pipeline), component)
