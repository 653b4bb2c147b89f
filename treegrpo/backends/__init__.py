"""Policy adapters for the CLI: the embedded demo model and diffusers pipelines. ``load_policy(cfg)`` builds the
one a TrainConfig asks for. (ComfyUI models have their own adapter in ``treegrpo.comfyui``.)"""
from __future__ import annotations

import os

import torch

from ..policy import Policy


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {name!r} is not a torch device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested but this torch build or machine has no CUDA device; use "
                             "--device cpu (or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {name!r} requested but MPS (Apple GPU) is not available here; use --device cpu")
    elif dev.type == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise ValueError(f"device {name!r} requested but no Intel XPU is available here; use --device cpu")
    return dev


def latent_shape_from_config(cfg) -> "tuple[int, int, int] | None":
    """A leaf's latent shape (C, h, w) for ``cfg``'s model, read from its configuration alone (safetensors metadata,
    JSON files), before any weight loads; None where only the loaded model can tell."""
    if cfg.backend == "demo":
        from ..demo.model import DEFAULT_FLOW_PATH, DemoConfig
        from safetensors import safe_open

        try:
            with safe_open(str(cfg.model or DEFAULT_FLOW_PATH), framework="pt") as f:
                c = DemoConfig.from_json((f.metadata() or {})["config"])
        except Exception:  # noqa: BLE001 - the loader says what is wrong with the file
            return None
        return int(c.in_channels), int(c.resolution), int(c.resolution)
    if cfg.backend == "diffusers" and cfg.model:
        from .diffusers import latent_shape_from_files
        return latent_shape_from_files(cfg.model, cfg.pipeline)
    return None


def load_policy(cfg, device=None) -> tuple[Policy, str]:
    """(policy, base-model name) for ``cfg.backend``; ``cfg.model`` is a local path or None.
    ``device`` overrides ``cfg.device`` (data-parallel ranks get their own GPU)."""
    device = torch.device(device) if device is not None else resolve_device(cfg.device)
    if cfg.backend == "demo":
        from ..demo import BASE_MODEL_NAME
        from .demo import DemoPolicy
        return DemoPolicy.load(cfg.model, device=device), BASE_MODEL_NAME
    if cfg.backend == "diffusers":
        from .diffusers import DiffusersPolicy
        policy = DiffusersPolicy.load(cfg.model, cfg.pipeline, device=device, guidance_hint=cfg.guidance_scale)
        return policy, f"diffusers:{policy.family}:{os.path.basename(os.path.normpath(cfg.model))}"
    raise ValueError(f"backend {cfg.backend!r} cannot be loaded from the CLI (the 'comfy' backend is driven by the "
                     "ComfyUI nodes); use backend 'demo' or 'diffusers'")
