"""ComfyUI's side of a run, shared by the step nodes (:mod:`.steps`) and the Train node (:mod:`.train_node`): the
progress bar and interrupt, the run's folder, the model's name in LoRA metadata, reward models inside ComfyUI's memory
management, LoRA-patched model clones, latent shapes, and the memory a run may plan for.

Imported only inside ComfyUI (it imports ``comfy`` lazily).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import check_run_name
from ..prompts import reward_text


class ComfyProgress:
    """ComfyUI's ProgressBar for a node: ``step()`` advances it and raises on user interrupt (a step callback);
    ``preview(image)`` shows an IMAGE (1, H, W, 3) on the node while it runs (the web UI's progress preview)."""

    def __init__(self, total: int):
        import comfy.utils
        self.bar = comfy.utils.ProgressBar(max(1, total))

    def __call__(self) -> None:
        import comfy.model_management
        self.bar.update(1)
        comfy.model_management.throw_exception_if_processing_interrupted()

    step = __call__

    def preview(self, image: torch.Tensor, max_size: int = 768) -> None:
        from ..report import to_pil
        self.bar.update_absolute(self.bar.current, preview=("JPEG", to_pil(image[0].movedim(-1, 0)), max_size))


def comfy_progress(total: int) -> ComfyProgress:
    """A step callback: advances ComfyUI's ProgressBar and raises on user interrupt."""
    return ComfyProgress(total)


def server_routes(marker: str):
    """``(server, aiohttp.web)`` to add the pack's routes to ComfyUI's running server, once per ``marker`` (an
    attribute set on the server); ``(None, None)`` without a server (the pack imported outside ComfyUI) or when the
    routes under ``marker`` were already added."""
    try:
        from aiohttp import web
        from server import PromptServer
    except ImportError:
        return None, None
    srv = getattr(PromptServer, "instance", None)
    if srv is None or getattr(srv, marker, False):
        return None, None
    setattr(srv, marker, True)
    return srv, web


def asking_context() -> dict:
    """Where a question to the artist goes and how its wait ends: ComfyUI's interrupt check and the prompt and tab
    (``client_id``) that queued the run being executed (keyword arguments of the artist functions)."""
    import comfy.model_management
    from server import PromptServer

    srv = PromptServer.instance
    return dict(check_interrupt=comfy.model_management.throw_exception_if_processing_interrupted,
                prompt_id=getattr(srv, "last_prompt_id", None), client_id=getattr(srv, "client_id", None))


def prompt_queued_at() -> Optional[float]:
    """When the prompt being executed was queued (s since the epoch: ComfyUI's ``create_time``); None where the
    server does not say (no server, an older ComfyUI)."""
    try:
        from server import PromptServer

        srv = PromptServer.instance
        running, _ = srv.prompt_queue.get_current_queue_volatile()
        for item in running:          # (number, prompt_id, prompt, extra_data, outputs)
            if item[1] == srv.last_prompt_id:
                created = item[3].get("create_time")
                return created / 1000 if isinstance(created, (int, float)) else None
    except Exception:  # noqa: BLE001 - only a hint: without it the prompt counts as queued now
        return None
    return None


def run_folder(run_name: str) -> str:
    """``<ComfyUI output>/treegrpo/<run_name>``: the run's checkpoints, logs and LoRA file."""
    import os

    import folder_paths

    return os.path.join(folder_paths.get_output_directory(), "treegrpo", check_run_name(run_name, "run_name"))


def model_name(model) -> str:
    """A stable description of a ComfyUI model (architecture + parameter count), stored in LoRA metadata; the
    embedded demo model has the CLI's name for it, so its runs resume on either side."""
    from ..demo import BASE_MODEL_NAME
    from .demo import ComfyDemoDiT

    dm = model.model.diffusion_model
    if isinstance(dm, ComfyDemoDiT):
        return BASE_MODEL_NAME
    return f"{type(model.model).__name__}/{type(dm).__name__}/{sum(p.numel() for p in dm.parameters())}"


class ManagedReward:
    """A reward model scored inside ComfyUI's memory management: before each call ComfyUI frees room on
    its torch device (unloading other models if needed) and the reward's weights move there; afterwards they
    go back to the CPU, so the policy keeps the VRAM between scorings. Rewards without weights pass through.
    The reward reads each prompt without ComfyUI's weighting syntax and embedding names
    (:func:`treegrpo.prompts.reward_text`); the text encoder had it whole."""

    def __init__(self, reward):
        self.reward = reward
        self.name = getattr(reward, "name", type(reward).__name__)

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        prompts = [reward_text(p) for p in prompts]
        if not (hasattr(self.reward, "load") and hasattr(self.reward, "offload")):
            return self.reward(images, prompts)
        import comfy.model_management as mm

        device = mm.get_torch_device()
        size = self.reward.model_size() if hasattr(self.reward, "model_size") else 0
        mm.free_memory(int(size * 1.3), device)
        self.reward.load(device)
        try:
            return self.reward(images, prompts)
        finally:
            self.reward.offload()
            mm.soft_empty_cache()


def checkpointing_choice(checkpointing) -> str:
    """auto / on / off; a boolean (older callers, workflows saved before it became a choice): True = on, False = auto."""
    if isinstance(checkpointing, bool):
        return "on" if checkpointing else "auto"
    return checkpointing or "auto"


def patched_model(model, lora):
    """A clone of ``model`` with ``lora`` (a ComfyLoRA) applied as object patches (the base stays untouched)."""
    m = model.clone()
    lora.patch(m)
    return m


def latent_shape_of(latent: dict, model=None) -> tuple[int, ...]:
    """(C, H, W) of an image LATENT, (C, T, H, W) of a video one (and of the image latents of models that use a
    video VAE, e.g. Qwen-Image); empty latents get the model's channels and dimensions (as KSampler does)."""
    s = latent["samples"]
    if model is not None:
        import comfy.sample
        s = comfy.sample.fix_empty_latent_channels(model, s)
    if s.ndim not in (4, 5):
        raise ValueError(f"TreeGRPO supports latents (B, C, H, W) and (B, C, T, H, W); got shape {tuple(s.shape)}")
    return tuple(int(v) for v in s.shape[1:])


def latent_shape_for(model, width: int, height: int, compression: int, frames: int = 1,
                     temporal_compression: int = 1) -> tuple[int, ...]:
    """The latent of one ``width``×``height`` image for ``model``: (C, H, W), or (C, T, H, W) where the model's
    latents have a time axis (T = 1 for images, ``(frames − 1) // temporal_compression + 1`` for a video family's
    ``frames``-long videos, as ComfyUI's empty video latents)."""
    from ..video import latent_frames_for
    from .families import family_of

    fmt = model.model.latent_format
    c, h, w = fmt.latent_channels, height // compression, width // compression
    if frames > 1:
        name, fam = family_of(model)
        if getattr(fmt, "latent_dimensions", 2) != 3 or (fam is not None and fam.media != "video"):
            raise ValueError(f"frames = {frames}: {fam.label if fam else name} makes images, not videos; set frames "
                             "to 1 (or load a video model such as Wan or HunyuanVideo)")
    if getattr(fmt, "latent_dimensions", 2) == 3:
        return (c, latent_frames_for(frames, temporal_compression), h, w)
    return (c, h, w)


def memory_budget(device) -> float:
    """Bytes the Train node may plan for on ComfyUI's device: the free memory plus what ComfyUI's loaded models
    hold (it unloads them on demand), less the memory ComfyUI keeps in reserve; 0 on the CPU (no plan)."""
    import comfy.model_management as mm

    device = torch.device(device)
    if mm.is_device_cpu(device):
        return 0.0
    loaded = sum(m.model_loaded_memory() for m in mm.current_loaded_models if m.device == device)
    return float(mm.get_free_memory(device) + loaded - mm.extra_reserved_memory())


def slow_precision_note(vae) -> Optional[str]:
    """A console warning for a VAE that decodes in float16 on the CPU (ComfyUI's ``--fp16-vae``): CPUs compute
    float16 convolutions one to two orders of magnitude slower than float32 (measured 160x on a 3x3, 128-channel
    convolution), and a run decodes every leaf of every tree, so it looks hung. None otherwise."""
    dtype, device = getattr(vae, "vae_dtype", None), getattr(vae, "device", None)
    if dtype != torch.float16 or device is None or torch.device(device).type != "cpu":
        return None
    return ("TreeGRPO: the VAE decodes in float16 on the CPU (ComfyUI started with --fp16-vae?): CPUs compute float16 "
            "convolutions far slower than float32, and the run decodes every leaf of every tree, so each iteration "
            "takes many times longer; start ComfyUI without --fp16-vae (or with --bf16-vae)")
