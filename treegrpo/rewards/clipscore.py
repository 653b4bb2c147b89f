"""CLIPScore with any open_clip model, and the pieces every CLIP-family reward model shares.

This module holds (1) ``TorchReward``, the base of the reward models that run a torch network (device,
dtype, batching, offload), (2) tensor preprocessing that reproduces the reference pipelines on batches,
(3) reading weight files safely and building open_clip models from them without a random initialisation,
and (4) the ``clipscore`` reward itself.

CLIPScore (Hessel et al. 2021, "CLIPScore: A Reference-free Evaluation Metric for Image Captioning"):
``w · max(cos(E_image, E_text), 0)`` with ``w = 2.5``; ``clamp=False`` keeps negative cosines (a smoother
training signal), ``w=1`` gives the plain cosine.

No network access anywhere: heavy libraries (open_clip, transformers, safetensors) are imported when a model
is built, and only local files are read.
"""
from __future__ import annotations

import logging
import json
import os
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

from .base import check_batch, register
from .weightfiles import is_torchscript, read_weights  # noqa: F401  (the loaders' shared readers)

log = logging.getLogger(__name__)

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

WHERE = ("Put them in ComfyUI's models/reward_models/ folder (then pick them in the TreeGRPO Reward Model Loader) "
         "or, with the CLI, give their location as the reward's `path` in the training config.")


# ----------------------------------------------------------------------------------------------------------------
# errors and file lookup
# ----------------------------------------------------------------------------------------------------------------

def files_error(name: str, problem: str, expected: str, source: str) -> FileNotFoundError:
    """The error a reward model raises when its files are missing: what, where to put them, where they come from."""
    return FileNotFoundError(f"{name}: {problem}. Expected: {expected}. {WHERE} Source: {source}. "
                             f"Nothing is downloaded.")


def wrong_file(name: str, path: str, problem: str, expected: str) -> ValueError:
    return ValueError(f"{name}: {path} is not the expected file ({problem}). Expected: {expected}.")


def folder_of(path: str | os.PathLike | None, name: str, expected: str, source: str) -> str:
    """The model folder: ``path`` itself, the folder of a file inside it (what ComfyUI's file list gives), or the
    snapshot of a Hugging Face cache folder (:func:`hub_snapshot`)."""
    if path is None or str(path) == "":
        raise files_error(name, "no path given", expected, source)
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(path):
        return os.path.dirname(path)
    if not os.path.isdir(path):
        raise files_error(name, f"{path} does not exist", expected, source)
    return hub_snapshot(path)


def hub_snapshot(folder: str) -> str:
    """A Hugging Face cache folder (``models--<org>--<name>/`` with ``snapshots/<commit>/``, what
    ``huggingface-cli download`` leaves without ``--local-dir``) resolved to the snapshot ``refs/main`` names, or to
    the newest one; any other folder as it is."""
    snaps = os.path.join(folder, "snapshots")
    if not os.path.isdir(snaps):
        return folder
    try:
        with open(os.path.join(folder, "refs", "main"), encoding="utf-8") as fh:
            named = os.path.join(snaps, fh.read().strip())
        if os.path.isdir(named):
            return named
    except OSError:
        pass
    found = sorted((os.path.join(snaps, d) for d in os.listdir(snaps) if os.path.isdir(os.path.join(snaps, d))),
                   key=os.path.getmtime)
    return found[-1] if found else folder


def _subfolders(folder: str) -> list[str]:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if os.path.isdir(os.path.join(folder, n))
            and n not in ("snapshots", "refs", "blobs", ".cache")]


def nearby_folders(folder: str, sibling_hint: Optional[str] = None) -> list[str]:
    """Where a download put a companion model (a CLIP beside an aesthetic head, a processor or tokenizer beside
    its model), in the order searched: the folder, its subfolders, then sibling folders whose name contains
    ``sibling_hint`` (the companion's Hub name, e.g. ``bert-base-uncased``); Hub cache folders by their snapshot."""
    out = [folder] + [hub_snapshot(d) for d in _subfolders(folder)]
    # a snapshot's siblings are those of its cache folder models--<org>--<name>/
    home = os.path.dirname(os.path.dirname(folder)) if os.path.basename(os.path.dirname(folder)) == "snapshots" \
        else folder
    if sibling_hint:
        out += [hub_snapshot(d) for d in _subfolders(os.path.dirname(home))
                if sibling_hint.lower() in os.path.basename(d).lower() and d != home]
    return out


def find_file(folder: str, candidates: Sequence[str]) -> Optional[str]:
    for c in candidates:
        p = os.path.join(folder, c)
        if os.path.isfile(p):
            return p
    return None


def require_file(path: str | os.PathLike | None, name: str, expected: str, source: str) -> str:
    if path is None or str(path) == "":
        raise files_error(name, "no path given", expected, source)
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        raise files_error(name, f"{path} is a folder, a weight file is expected", expected, source)
    if not os.path.isfile(path):
        raise files_error(name, f"{path} does not exist", expected, source)
    return path


# ----------------------------------------------------------------------------------------------------------------
# reading weights (the readers are in weightfiles.py)
# ----------------------------------------------------------------------------------------------------------------

def load_into(module: torch.nn.Module, sd: dict, name: str, path: str, expected: str,
              optional: Iterable[str] = ()) -> None:
    """``load_state_dict(assign=True)`` into a module built on the meta device; every parameter must be
    provided (except names starting with one of ``optional``, which are zero-filled). Extra keys are logged."""
    optional = tuple(optional)
    own = module.state_dict(keep_vars=True)
    missing = [k for k in own if k not in sd and own[k].is_meta and not k.startswith(optional)]
    shape = [(k, tuple(sd[k].shape), tuple(own[k].shape)) for k in own if k in sd and sd[k].shape != own[k].shape]
    if missing or shape:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of {len(own)} weights missing, e.g. {', '.join(missing[:3])}")
        if shape:
            k, got, want = shape[0]
            parts.append(f"{len(shape)} weights of the wrong shape, e.g. {k}: {got} in the file, {want} expected")
        raise wrong_file(name, path, "; ".join(parts), expected)
    extra = [k for k in sd if k not in own]
    if extra:
        log.info("%s: ignoring %d extra weights in %s (e.g. %s)", name, len(extra), path, extra[0])
    module.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False, assign=True)
    for mod_name, mod in module.named_modules():  # zero-fill optional weights the file lacks
        for pname, p in list(mod.named_parameters(recurse=False)):
            if p.is_meta:
                setattr(mod, pname, torch.nn.Parameter(torch.zeros(p.shape, dtype=torch.float32),
                                                       requires_grad=False))
    module.requires_grad_(False)


def empty_init():
    """Context manager: build modules with parameters on the meta device (no random init), buffers real."""
    from accelerate import init_empty_weights
    return init_empty_weights(include_buffers=False)


# ----------------------------------------------------------------------------------------------------------------
# tensor preprocessing (batched; matches torchvision/PIL pipelines to within uint8 rounding)
# ----------------------------------------------------------------------------------------------------------------

def _interp(name: str):
    from torchvision.transforms import InterpolationMode
    return {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR}[name]


def resize_shortest_crop(x: torch.Tensor, size: int, interpolation: str = "bicubic",
                         crop_rounding: str = "round", crop: Optional[int] = None) -> torch.Tensor:
    """``Resize(size)`` of the shorter side (longer side ``int(size·long/short)``, as torchvision and
    transformers compute it), then a centre crop ``crop × crop`` (default ``size``). ``crop_rounding``: ``round`` =
    torchvision's ``CenterCrop`` (open_clip, OpenAI CLIP, ImageReward), ``floor`` = transformers'
    ``CLIPImageProcessor``. Output clamped to [0, 1] like the uint8 images the references see."""
    import torchvision.transforms.functional as TF
    h, w = x.shape[-2:]
    if min(h, w) != size:
        x = TF.resize(x, size, interpolation=_interp(interpolation), antialias=True)
    h, w = x.shape[-2:]
    c = size if crop is None else crop
    if crop_rounding == "floor":
        top, left = (h - c) // 2, (w - c) // 2
    else:
        top, left = int(round((h - c) / 2.0)), int(round((w - c) / 2.0))
    return x[..., top:top + c, left:left + c].clamp(0, 1)


def resize_longest_pad(x: torch.Tensor, size: int, fill: float = 0.0, interpolation: str = "bicubic") -> torch.Tensor:
    """HPS's ``ResizeMaxSize``: scale the longer side to ``size`` (``round(dim·scale)``), then pad the
    shorter side with ``fill`` (black, before normalisation) split ``pad//2`` before and the rest after.
    Unlike the reference, an image whose longer side already equals ``size`` is padded too (the reference
    would hand the model a non-square image)."""
    import torchvision.transforms.functional as TF
    h, w = x.shape[-2:]
    scale = size / float(max(h, w))
    if scale != 1.0:
        nh, nw = round(h * scale), round(w * scale)
        x = TF.resize(x, [nh, nw], interpolation=_interp(interpolation), antialias=True)
    x = x.clamp(0, 1)
    h, w = x.shape[-2:]
    ph, pw = size - h, size - w
    if ph or pw:
        x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=fill)
    return x


def squash(x: torch.Tensor, size: int, interpolation: str = "bicubic") -> torch.Tensor:
    import torchvision.transforms.functional as TF
    return TF.resize(x, [size, size], interpolation=_interp(interpolation), antialias=True).clamp(0, 1)


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


# ----------------------------------------------------------------------------------------------------------------
# the base of torch reward models
# ----------------------------------------------------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """``None``/``"auto"``: float16 on CUDA, float32 elsewhere; else a torch dtype or its name."""
    if dtype is None or dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        out = dtype
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        out = _DTYPES[dtype.lower()]
    else:
        raise ValueError(f"dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
    if out not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {out}")
    return out


class TorchReward:
    """Base of the reward models that run a torch network.

    ``self.module`` (one ``nn.Module`` holding all weights, e.g. for a ComfyUI ``ModelPatcher``) runs on
    ``self.device`` in ``self.dtype``; ``offload()`` moves it to the CPU and the next call (or ``load()``)
    moves it back. Images are scored in chunks of ``batch_size``; the result is (B,) float32 on the CPU.
    Subclasses set ``name``, ``expected_files``, ``is_folder``, ``source`` and implement ``_score``."""

    name = ""
    expected_files = ""
    is_folder = False
    source = ""
    licence = ""
    module: torch.nn.Module

    def _setup(self, device, dtype, batch_size: int) -> None:
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if int(batch_size) < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self._placed: Optional[torch.device] = None

    def _finish(self) -> None:
        """Cast to ``self.dtype`` (subclasses keep small heads in float32 afterwards) and move to the device."""
        self.module.eval().requires_grad_(False)
        self.module.to(dtype=self.dtype)
        self._keep_fp32()
        self.load()

    def _keep_fp32(self) -> None:
        pass

    # device management -------------------------------------------------------------------------------------
    def to(self, device) -> "TorchReward":
        """Run on ``device`` from now on (moves the weights now)."""
        self.device = torch.device(device)
        return self.load()

    def load(self, device=None) -> "TorchReward":
        """Move the weights to ``device`` (default: the compute device) after ``offload()``."""
        if device is not None:
            self.device = torch.device(device)
        if self._placed != self.device:
            self.module.to(self.device)
            self._placed = self.device
        return self

    def offload(self) -> "TorchReward":
        """Move the weights to the CPU to free accelerator memory; the next call moves them back."""
        if self._placed is None or self._placed.type != "cpu":
            self.module.to("cpu")
            self._placed = torch.device("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return self

    def model_size(self) -> int:
        """Bytes of weights and buffers (for a memory manager)."""
        return sum(t.numel() * t.element_size() for t in list(self.module.parameters()) + list(self.module.buffers()))

    # scoring -------------------------------------------------------------------------------------------------
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        check_batch(images, prompts, self.name)
        self.load()
        out = []
        with torch.no_grad():
            for i in range(0, images.shape[0], self.batch_size):
                x = images[i:i + self.batch_size].detach().to(self.device, torch.float32)
                r = self._score(x.clamp(0, 1), list(prompts[i:i + self.batch_size]))
                out.append(r.reshape(-1).float().cpu())
        return torch.cat(out)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, D) float32 on the CPU: the unit-normalised image embedding this reward scores with (the features a
        taste model learns on, treegrpo/taste_features.py), for images (B, 3, H, W) in [0, 1]."""
        if not hasattr(self, "_embed"):
            raise ValueError(f"{self.name} has no image tower to give features")
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"{self.name}: images must be (B, 3, H, W), got {tuple(images.shape)}")
        self.load()
        out = []
        with torch.no_grad():
            for i in range(0, images.shape[0], self.batch_size):
                x = images[i:i + self.batch_size].detach().to(self.device, torch.float32).clamp(0, 1)
                out.append(F.normalize(self._embed(x).float(), dim=-1).cpu())
        return torch.cat(out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, dtype={self.dtype}, batch_size={self.batch_size})"


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
