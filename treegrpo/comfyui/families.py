"""The model families ComfyUI loads, and which of them TreeGRPO trains.

ComfyUI knows a model by its ``comfy.supported_models`` class (``model.model.model_config``). Every class of
ComfyUI 0.3.75's registry (``comfy.supported_models.models``) has a row in :data:`FAMILIES`: a text-to-image or
text-to-video family *trains*; the others (image-to-video, editing, inpainting, upscaling, audio, 3D, two-stage
decoders) are *refused*, with the reason. The test ``tests/comfyui/test_families.py`` builds a tiny random instance of
every training family from ComfyUI's own classes and trains it; the README's table is :func:`markdown_table`.

Sampling: TreeGRPO's SDE steps exist for rectified flow (ComfyUI's ``CONST``: x = (1−σ)·x0 + σ·n) and for the
σ-space models (x = x0 + σ·n: ``EPS``, ``V_PREDICTION``, ``EDM`` and Cosmos' ``COSMOS_RFLOW``, whose denoiser
ComfyUI turns into x̂0 itself, so one DDIM(η) step serves them all, docs/design.md §1). Models that predict x0
directly from an input image (``X0``, ``IMG_TO_IMG``) are refused by :func:`check_trainable`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

#: LoRA targets when a model's family names none (attention q/k/v/out of the UNets and DiTs, Flux-style
#: fused qkv / proj and single-block linear1 / linear2); the embedded demo model uses these.
DEFAULT_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "qkv", "proj", "img_attn.qkv", "img_attn.proj",
                   "txt_attn.qkv", "txt_attn.proj", "linear1", "linear2")

# attention + MLP Linear layers of each architecture's blocks (suffixes: ``name == t or name.endswith('.' + t)``);
# embedders, modulation and final layers are left to the base model
UNET = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")          # SD1.x/2.x/XL, attn1 + attn2
MMDIT = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")                           # SD3.x joint blocks
FLUX = ("img_attn.qkv", "img_attn.proj", "txt_attn.qkv", "txt_attn.proj", "img_mlp.0", "img_mlp.2",
        "txt_mlp.0", "txt_mlp.2", "linear1", "linear2")     # double + single stream blocks (Flux.1/2, Chroma, Hunyuan)
QWEN_IMAGE = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
              "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")
WAN = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
       "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")
LUMINA2 = ("attention.qkv", "attention.out", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
PIXART = ("attn.qkv", "attn.proj", "cross_attn.q_linear", "cross_attn.kv_linear", "cross_attn.proj", "mlp.fc1",
          "mlp.fc2")
AURAFLOW = ("w1q", "w1k", "w1v", "w1o", "w2q", "w2k", "w2v", "w2o", "c_fc1", "c_fc2", "c_proj")
HIDREAM = ("to_q", "to_k", "to_v", "to_out", "to_q_t", "to_k_t", "to_v_t", "to_out_t", "w1", "w2", "w3")
HUNYUAN_DIT = ("attn1.Wqkv", "attn1.out_proj", "attn2.q_proj", "attn2.kv_proj", "attn2.out_proj", "mlp.fc1",
               "mlp.fc2")
MOCHI = ("attn.qkv_x", "attn.qkv_y", "attn.proj_x", "attn.proj_y", "mlp_x.w1", "mlp_x.w2", "mlp_y.w1", "mlp_y.w2")
LTXV = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")
COSMOS = ("to_q.0", "to_k.0", "to_v.0", "to_out.0", "layer1", "layer2")
COSMOS2 = ("q_proj", "k_proj", "v_proj", "output_proj", "mlp.layer1", "mlp.layer2")
OMNIGEN2 = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "feed_forward.linear_1",
            "feed_forward.linear_2", "feed_forward.linear_3")


@dataclass(frozen=True)
class Family:
    """One ``comfy.supported_models`` class: what users call it, what it makes, and whether TreeGRPO trains it."""

    label: str                 # the name users know
    media: str                 # image | video | audio | 3d
    reason: str = ""           # empty: trains; else why it is refused (one sentence, for the error and the table)
    targets: tuple = DEFAULT_TARGETS
    sampling: str = ""         # its checkpoints' sampling kinds (:func:`sampling_kind`, " / " between), for the table
    from_text: bool = True     # generates images or videos from text alone (refused ones: other tasks, mostly)

    @property
    def trains(self) -> bool:
        return not self.reason


IMAGE_INPUT = "it generates from an input image (image-to-video): a text-to-video tree has nothing to start from"


def _refused(label: str, media: str, reason: str, from_text: bool = False) -> Family:
    return Family(label, media, reason, targets=(), from_text=from_text)


#: every class of ComfyUI 0.3.75's ``comfy.supported_models.models``, by class name
FAMILIES: dict[str, Family] = {
    # ---- trains: text-to-image
    "SD15": Family("SD1.x", "image", targets=UNET, sampling="eps"),
    "SD20": Family("SD2.x (eps and v)", "image", targets=UNET, sampling="eps / v"),
    "SDXL": Family("SDXL (also EDM / v-prediction checkpoints)", "image", targets=UNET, sampling="eps / v / edm"),
    "SSD1B": Family("SSD-1B (SDXL derivative)", "image", targets=UNET, sampling="eps"),
    "Segmind_Vega": Family("Segmind Vega (SDXL derivative)", "image", targets=UNET, sampling="eps"),
    "KOALA_700M": Family("KOALA 700M (SDXL derivative)", "image", targets=UNET, sampling="eps"),
    "KOALA_1B": Family("KOALA 1B (SDXL derivative)", "image", targets=UNET, sampling="eps"),
    "SD3": Family("SD3 / SD3.5", "image", targets=MMDIT, sampling="flow"),
    "AuraFlow": Family("AuraFlow", "image", targets=AURAFLOW, sampling="flow"),
    "PixArtAlpha": Family("PixArt-α", "image", targets=PIXART, sampling="eps"),
    "PixArtSigma": Family("PixArt-Σ", "image", targets=PIXART, sampling="eps"),
    "HunyuanDiT": Family("Hunyuan-DiT", "image", targets=HUNYUAN_DIT, sampling="v"),
    "HunyuanDiT1": Family("Hunyuan-DiT 1.x", "image", targets=HUNYUAN_DIT, sampling="v"),
    "Flux": Family("Flux.1 dev (and Kontext)", "image", targets=FLUX, sampling="flow"),
    "FluxSchnell": Family("Flux.1 schnell", "image", targets=FLUX, sampling="flow"),
    "Flux2": Family("Flux.2", "image", targets=FLUX, sampling="flow"),
    "Chroma": Family("Chroma", "image", targets=FLUX, sampling="flow"),
    "ChromaRadiance": Family("Chroma Radiance (pixel space)", "image", targets=FLUX, sampling="flow"),
    "HiDream": Family("HiDream-I1", "image", targets=HIDREAM, sampling="flow"),
    "Lumina2": Family("Lumina Image 2.0", "image", targets=LUMINA2, sampling="flow"),
    "ZImage": Family("Z-Image", "image", targets=LUMINA2, sampling="flow"),
    "QwenImage": Family("Qwen-Image", "image", targets=QWEN_IMAGE, sampling="flow"),
    "Omnigen2": Family("OmniGen2", "image", targets=OMNIGEN2, sampling="flow"),
    "HunyuanImage21": Family("HunyuanImage 2.1", "image", targets=FLUX, sampling="flow"),
    "CosmosT2IPredict2": Family("Cosmos Predict2 text-to-image", "image", targets=COSMOS2, sampling="rflow"),
    # ---- trains: text-to-video
    "WAN21_T2V": Family("Wan 2.1 text-to-video (1.3B, 14B)", "video", targets=WAN, sampling="flow"),
    "WAN22_T2V": Family("Wan 2.2 5B text(-image)-to-video", "video", targets=WAN, sampling="flow"),
    "HunyuanVideo": Family("HunyuanVideo", "video", targets=FLUX, sampling="flow"),
    "HunyuanVideo15": Family("HunyuanVideo 1.5", "video", targets=FLUX, sampling="flow"),
    "GenmoMochi": Family("Mochi", "video", targets=MOCHI, sampling="flow"),
    "LTXV": Family("LTX-Video", "video", targets=LTXV, sampling="flow"),
    "CosmosT2V": Family("Cosmos 1.0 text-to-video", "video", targets=COSMOS, sampling="edm"),
    # ---- refused
    "LotusD": _refused("Lotus depth/normals", "image", "it estimates depth or normals of an input image (x0 "
                       "prediction), it does not generate from text"),
    "Stable_Zero123": _refused("Stable Zero123", "3d", "it renders new views of an input image"),
    "SD15_instructpix2pix": _refused("SD1.x InstructPix2Pix", "image", "it edits an input image (the image is part "
                                     "of its input latent)"),
    "SDXL_instructpix2pix": _refused("SDXL InstructPix2Pix", "image", "it edits an input image (the image is part "
                                     "of its input latent)"),
    "SD21UnclipL": _refused("SD2.1 unCLIP-L", "image", "it makes variations of an input image's CLIP-vision embedding"),
    "SD21UnclipH": _refused("SD2.1 unCLIP-H", "image", "it makes variations of an input image's CLIP-vision embedding"),
    "SDXLRefiner": _refused("SDXL refiner", "image", "it refines the last, low-noise steps of an SDXL image; train "
                            "the SDXL base model instead"),
    "SD_X4Upscaler": _refused("SD x4 upscaler", "image", "it upscales an input image"),
    "Stable_Cascade_C": _refused("Stable Cascade stage C", "image", "its latents become images only through a second "
                                 "diffusion model (stage B), so no VAE can decode the leaves for the reward", from_text=True),
    "Stable_Cascade_B": _refused("Stable Cascade stage B", "image", "it is the decoder stage, conditioned on stage C's "
                                 "output rather than generating from text"),
    "SV3D_u": _refused("SV3D-u", "3d", "it renders an orbit around an input image"),
    "SV3D_p": _refused("SV3D-p", "3d", "it renders an orbit around an input image"),
    "SVD_img2vid": _refused("Stable Video Diffusion", "video", IMAGE_INPUT),
    "StableAudio": _refused("Stable Audio", "audio", "it generates audio; TreeGRPO's rewards score images"),
    "ACEStep": _refused("ACE-Step", "audio", "it generates audio; TreeGRPO's rewards score images"),
    "FluxInpaint": _refused("Flux.1 Fill (inpainting)", "image", "it inpaints an input image under a mask"),
    "HunyuanVideoI2V": _refused("HunyuanVideo image-to-video", "video", IMAGE_INPUT),
    "HunyuanVideoSkyreelsI2V": _refused("SkyReels image-to-video", "video", IMAGE_INPUT),
    "HunyuanVideo15_SR_Distilled": _refused("HunyuanVideo 1.5 super-resolution", "video",
                                            "it upscales an input video"),
    "HunyuanImage21Refiner": _refused("HunyuanImage 2.1 refiner", "image", "it refines an input image; train the "
                                      "HunyuanImage 2.1 base model instead"),
    "CosmosI2V": _refused("Cosmos 1.0 image-to-video", "video", IMAGE_INPUT),
    "CosmosI2VPredict2": _refused("Cosmos Predict2 image-to-video", "video", IMAGE_INPUT),
    "WAN21_I2V": _refused("Wan 2.1 image-to-video", "video", IMAGE_INPUT),
    "WAN21_FunControl2V": _refused("Wan 2.1 Fun Control", "video", "it follows an input control video"),
    "WAN21_Vace": _refused("Wan VACE", "video", "it is built around reference and control video inputs"),
    "WAN21_Camera": _refused("Wan 2.1 camera control", "video", "it moves a camera through an input image"),
    "WAN22_Camera": _refused("Wan 2.2 camera control", "video", "it moves a camera through an input image"),
    "WAN21_HuMo": _refused("Wan HuMo", "video", "it animates a person from reference images and audio"),
    "WAN22_S2V": _refused("Wan 2.2 speech-to-video", "video", "it animates an input image from audio"),
    "WAN22_Animate": _refused("Wan 2.2 Animate", "video", "it animates a character image along an input pose video"),
    "Hunyuan3Dv2": _refused("Hunyuan3D 2.0", "3d", "it generates 3D shapes from an image"),
    "Hunyuan3Dv2_1": _refused("Hunyuan3D 2.1", "3d", "it generates 3D shapes from an image"),
    "Hunyuan3Dv2mini": _refused("Hunyuan3D 2 mini", "3d", "it generates 3D shapes from an image"),
}

class FamilyError(ValueError):
    """A model TreeGRPO cannot train, with the family and the reason."""


def family_of(model) -> tuple[str, Optional[Family]]:
    """(ComfyUI class name, :class:`Family` or None) of a ``ModelPatcher``/``BaseModel``: the model config's class,
    else the nearest registry class it derives from (a custom node's subclass of e.g. ``SDXL``)."""
    base = getattr(model, "model", model)
    cfg_type = type(base.model_config)
    for klass in cfg_type.__mro__:
        if klass.__name__ in FAMILIES and klass.__module__ == "comfy.supported_models":
            return cfg_type.__name__, FAMILIES[klass.__name__]
    return cfg_type.__name__, None


def sampling_kind(model) -> str:
    """flow | eps | v | edm | rflow: ComfyUI's sampling class of the model (what the table's sampling column says)."""
    import comfy.model_sampling as ms

    base = getattr(model, "model", model)
    sampling = getattr(model, "get_model_object", lambda name: base.model_sampling)("model_sampling")
    # x0 predictors first: ComfyUI 0.33's IMG_TO_IMG_FLOW derives from CONST but predicts x0 from an input image
    x0 = tuple(k for k in (ms.X0, getattr(ms, "IMG_TO_IMG_FLOW", None)) if k is not None)
    for klass, kind in ((x0, "x0"), (ms.CONST, "flow"), (ms.COSMOS_RFLOW, "rflow"), (ms.EDM, "edm"),
                        (ms.V_PREDICTION, "v"), (ms.EPS, "eps")):
        if isinstance(sampling, klass):
            return kind
    return type(sampling).__name__


def kind_of(sampling, base) -> str:
    """:func:`sampling_kind` of a ``model_sampling`` object of the model ``base`` (another than the one it has)."""
    return sampling_kind(SimpleNamespace(model=base, get_model_object=lambda _: sampling))


def own_sampling(base):
    """The sampling the checkpoint itself has, made afresh from its config (a loaded model's ``model_sampling``
    attribute holds the sampling a node patched in while a clone of it is loaded); None when it cannot be made."""
    try:
        import comfy.model_base

        return comfy.model_base.model_sampling(base.model_config, base.model_type)
    except Exception:        # a model class ComfyUI's function does not know (a custom node's)
        return None


def prediction_of(model) -> str:
    """'flow' or 'epsilon' (σ-space DDIM) for a ComfyUI model's ``model_sampling``; :class:`FamilyError` naming the
    family when its sampling is neither."""
    kind = sampling_kind(model)
    if kind == "flow":
        return "flow"
    if kind in ("eps", "v", "edm", "rflow"):   # x = x0 + σ·n: ComfyUI turns each into x̂0 itself
        return "epsilon"
    base = getattr(model, "model", model)
    sampling = getattr(model, "get_model_object", lambda name: base.model_sampling)("model_sampling")
    name, fam = family_of(model)
    kinds = [k.__name__ for k in type(sampling).__mro__ if k.__module__ == "comfy.model_sampling"]
    own = own_sampling(base)
    own_kind = kind_of(own, base) if own is not None else kind
    if own_kind != kind:     # the checkpoint's own sampling is another: a node in front set this one (an object patch)
        which = next((k for k in kinds if not k.startswith("ModelSampling")), kind)
        raise FamilyError(f"a node in front of TreeGRPO (e.g. ModelSamplingDiscrete set to {kind}) made "
                          f"{fam.label if fam else name} ({name}) predict {kind} ({which}), which TreeGRPO has no SDE "
                          f"step for: remove that node (the checkpoint itself predicts {own_kind})"
                          + (", or set it to eps or v_prediction" if own_kind in ("eps", "v") else ""))
    raise FamilyError(f"TreeGRPO cannot train {fam.label if fam else name} ({name}): its sampling ({', '.join(kinds)}) "
                      "is neither rectified flow (CONST) nor a σ-space model (EPS, V_PREDICTION, EDM), the two kinds "
                      "TreeGRPO's SDE step and log-probability exist for")


def check_trainable(model) -> Optional[Family]:
    """The model's family when TreeGRPO trains it; :class:`FamilyError` (family + reason) when it is refused or
    its sampling is unsupported. A class outside ComfyUI 0.3.75's registry (a newer ComfyUI, a custom node) is
    tried when its sampling is supported, with a warning."""
    name, fam = family_of(model)
    if fam is not None and not fam.trains:
        raise FamilyError(f"TreeGRPO cannot train {fam.label} ({name}): {fam.reason}. TreeGRPO trains text-to-image "
                          "and text-to-video families (README: Model families)")
    prediction_of(model)
    blocked = fused_without_backward(name)
    if blocked:
        raise FamilyError(f"TreeGRPO cannot train {fam.label if fam else name} ({name}) on this ComfyUI: {blocked}")
    if name not in FAMILIES and name not in _WARNED and not _is_own(model):
        _WARNED.add(name)
        logging.warning("TreeGRPO: %s is not a family TreeGRPO was tested on (ComfyUI 0.3.75's registry); training "
                        "it with LoRA targets %s%s", name, ", ".join(default_targets(model)),
                        f" (as {fam.label}, the family it derives from)" if fam else "")
    return fam


#: families whose model, in some ComfyUI versions, calls a comfy-kitchen fused kernel that has no backward and no
#: training path (``comfy.model_management.in_training`` does not reach it): (module, the kernel's name)
NO_BACKWARD = {"CosmosT2IPredict2": ("comfy.ldm.cosmos.predict2", "rms_rope_split_half")}


def fused_without_backward(name: str) -> str:
    """Why the running ComfyUI cannot backpropagate through family ``name`` ("" when it can): ComfyUI 0.33 computes
    Cosmos Predict2's q/k norm and RoPE with a fused comfy-kitchen kernel, whatever the training flag says."""
    if name not in NO_BACKWARD:
        return ""
    import importlib
    import inspect

    module, kernel = NO_BACKWARD[name]
    try:
        source = inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return ""
    if kernel not in source:
        return ""
    return (f"its attention calls comfy-kitchen's fused {kernel} kernel, which has no backward pass (ComfyUI "
            "0.33 and later; ComfyUI 0.3.75 trains it)")


_WARNED: set = set()


def checkpointing_refusal(model) -> str:
    """Why gradient checkpointing must stay off for this model ("" when it may be on). Checkpointing is exact only
    where it was checked: every training family of :data:`FAMILIES` has its checkpointed LoRA gradient compared with
    the plain one module by module (tests/comfyui/test_checkpoint_gradients.py). A class outside the table was not, nor a
    class that only derives from one in it (a newer ComfyUI's or a custom node's)."""
    name, fam = family_of(model)
    if (name in FAMILIES and FAMILIES[name].trains) or _is_own(model):
        return ""
    return (f"{name} is not a family whose checkpointed gradient TreeGRPO has checked (tests/comfyui/test_checkpoint_gradients"
            ".py), and a block that updates activations in place could make it wrong: gradient checkpointing stays "
            "off for it (set it to auto or off; lower the batch or the resolution if memory is short)")


def _is_own(model) -> bool:
    """The embedded demo model (its config class is TreeGRPO's own)."""
    return type(getattr(model, "model", model).model_config).__module__.startswith("treegrpo.")


def default_targets(model) -> list[str]:
    """The LoRA targets (Linear-name suffixes) of the model's family, :data:`DEFAULT_TARGETS` when unknown."""
    _, fam = family_of(model)
    return list(fam.targets if fam is not None and fam.targets else DEFAULT_TARGETS)


def parse_targets(text: str) -> list[str]:
    """The LoRA-targets widget: ``auto`` (the family's defaults) or comma/space-separated name suffixes."""
    items = [t for t in text.replace(",", " ").split() if t]
    if not items:
        raise ValueError("lora_targets: empty; write auto (the family's defaults) or Linear-name suffixes such as "
                         "to_q, to_k, to_v, to_out.0")
    if "auto" in items and len(items) > 1:
        raise ValueError(f"lora_targets: {text!r} mixes auto with names; write auto alone or only names")
    return items


def resolve_targets(targets, model) -> list[str]:
    """``["auto"]`` → the model's family's targets; an explicit list as it is."""
    targets = list(targets)
    return default_targets(model) if targets == ["auto"] else targets


def targets_tooltip() -> str:
    """Per-family defaults for the nodes' lora_targets tooltip (one line per distinct target list)."""
    groups: dict[tuple, list[str]] = {}
    for fam in FAMILIES.values():
        if fam.trains:
            groups.setdefault(fam.targets, []).append(fam.label.split(" (")[0])
    lines = [f"{', '.join(labels)}: {' '.join(t)}" for t, labels in groups.items()]
    return ("auto: the model family's attention and MLP Linear layers; or Linear-name suffixes, comma-separated. "
            "Defaults per family:\n" + "\n".join(lines))


def family_rows(registry=None) -> list[dict]:
    """One row per class of ComfyUI's registry (``comfy.supported_models.models`` unless given), in its order:
    class, label, media, status (trains | refused), reason/sampling. Classes this table does not know (a newer
    ComfyUI) come out as ``untested``."""
    if registry is None:
        import comfy.supported_models
        registry = comfy.supported_models.models
    rows = []
    for klass in registry:
        fam = FAMILIES.get(klass.__name__)
        if fam is None:
            rows.append({"class": klass.__name__, "label": klass.__name__, "media": "?", "status": "untested",
                         "note": "not in TreeGRPO's table (added after ComfyUI 0.3.75)"})
        else:
            rows.append({"class": klass.__name__, "label": fam.label, "media": fam.media,
                         "status": "trains" if fam.trains else "refused",
                         "note": fam.sampling if fam.trains else fam.reason})
    return rows


def markdown_table(registry=None) -> str:
    """The README's family table: trained families first (images, then video), then the refused ones."""
    rows = family_rows(registry)
    order = {"trains": 0, "untested": 1, "refused": 2}
    media = {"image": 0, "video": 1}
    rows.sort(key=lambda r: (order[r["status"]], media.get(r["media"], 2)))
    out = ["| ComfyUI class | family | media | TreeGRPO | sampling / reason |", "|---|---|---|---|---|"]
    out += [f"| `{r['class']}` | {r['label']} | {r['media']} | {r['status']} | {r['note']} |" for r in rows]
    return "\n".join(out)


def markdown_summary(registry=None) -> str:
    """The README's short form: the text-to-image and text-to-video families, trained or refused with the reason;
    the registry's other classes (other tasks) counted, their reasons in the full table."""
    rows = family_rows(registry)
    out = []
    for media in ("image", "video"):
        names = [f"{r['label']} `{r['class']}`" for r in rows if r["status"] == "trains" and r["media"] == media]
        out.append(f"- **Trains, text-to-{media} ({len(names)}):** " + "; ".join(names) + ".")
    untested = [f"`{r['class']}`" for r in rows if r["status"] == "untested"]
    if untested:
        out.append(f"- **Untested (newer than this table):** {', '.join(untested)}.")
    for r in rows:
        if r["status"] == "refused" and FAMILIES[r["class"]].from_text:
            out.append(f"- **Refused:** {r['label']} `{r['class']}`: {r['note']}.")
    other = [r for r in rows if r["status"] == "refused" and not FAMILIES[r["class"]].from_text]
    media = sorted({r["media"] for r in other})
    out.append(f"- **Not text-to-image/video ({len(other)}, refused with the reason):** image-to-video, editing, "
               f"inpainting, upscaling, refiners, {', '.join(m for m in media if m not in ('image', 'video'))} "
               "models.")
    return "\n".join(out)


if __name__ == "__main__":   # inside ComfyUI's python: the README's summary (--table: docs/families.md's table)
    import sys

    import torch
    if not torch.cuda.is_available():      # the table needs no GPU: ComfyUI's --cpu, before its model management loads
        from comfy.cli_args import args
        args.cpu = True
    print(markdown_table() if "--table" in sys.argv else markdown_summary())
