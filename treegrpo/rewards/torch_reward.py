"""The base of every reward model that runs a torch network, and the pieces they share.

This module holds (1) ``TorchReward`` (device, dtype, batching, offload between scorings), (2) tensor preprocessing
that reproduces the reference pipelines on batches (resize, crop, pad, normalise), and (3) finding a model's files
and loading weights into a module built without a random initialisation, with errors that name the file expected
and where it comes from. The open_clip towers are in :mod:`.clip_models`; each reward is a module of its own.

No network access anywhere: heavy libraries are imported when a model is built, and only local files are read.
"""
from __future__ import annotations

import logging
import os
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

from .base import check_batch
from .weightfiles import read_weights  # noqa: F401  (the loaders' shared reader)

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
        taste model learns on, treegrpo/artist/features.py), for images (B, 3, H, W) in [0, 1]."""
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
