"""One tiny random instance per training family of treegrpo/comfyui/families.py, keyed by ComfyUI's
``supported_models`` class name: the builders of ``__init__._tiny`` (SD1.x, SDXL, SD3, Flux, Chroma, Qwen-Image,
HunyuanVideo), ``tiny_image`` and ``tiny_video``, plus a VAE for each (the real tiny Wan 2.1 VAE for Wan 2.1-style
video latents, else a projection of the latent's first three channels)."""
from __future__ import annotations

import torch

#: supported_models class → (module, arch key, per-sample latent shape)
TINY: dict[str, tuple[str, str, tuple]] = {
    "SD15": ("base", "sd15", (4, 8, 8)),
    "SDXL": ("base", "sdxl", (4, 8, 8)),
    "SD3": ("base", "sd3", (16, 8, 8)),
    "Flux": ("base", "flux", (16, 8, 8)),
    "Chroma": ("base", "chroma", (16, 8, 8)),
    "QwenImage": ("base", "qwen_image", (16, 1, 8, 8)),
    "HunyuanVideo": ("base", "hunyuan_video", (16, 2, 8, 8)),
}
#: extra instances of a class (another prediction type or derivative): name → (module, arch)
VARIANTS: dict[str, tuple[str, str]] = {}


def _register() -> None:
    from . import tiny_image, tiny_video

    for module, archs in (("image", tiny_image.ARCHS), ("video", tiny_video.ARCHS)):
        for arch, spec in archs.items():
            entry = (module, arch, tuple(spec["latent"]))
            if spec["comfy_class"] in TINY:
                VARIANTS[arch] = entry
            else:
                TINY[spec["comfy_class"]] = entry


_register()


def build(name: str, seed: int = 0):
    """``(patcher, positive, negative, latent_shape)`` of family ``name`` (a class name, or a VARIANTS key)."""
    module, arch, latent = TINY[name] if name in TINY else VARIANTS[name]
    if module == "base":
        from . import _tiny
        patcher, pos, neg = _tiny(arch, seed)
    else:
        from . import tiny_image, tiny_video
        patcher, pos, neg = (tiny_image if module == "image" else tiny_video).build(arch, seed)
    return patcher, pos, neg, latent


class ProjectionVAE:
    """A stand-in VAE with ComfyUI's decode interface: latents (B, C, [T,] H, W) → (B, [T,] H, W, 3) in [0, 1], the
    sigmoid of the first three channels (the reward then sees what the denoiser made)."""

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        x = torch.sigmoid(latents[:, :3].float())
        return x.movedim(1, -1)

    decode_tiled = decode

    def temporal_compression_decode(self):
        return 1

    def spacial_compression_decode(self):
        return 1


def vae_for(name: str):
    """The tiny real Wan 2.1 VAE for Wan 2.1 text-to-video, else :class:`ProjectionVAE`."""
    if name == "WAN21_T2V":
        from .tiny_video import tiny_vae
        return tiny_vae("wan21", 0)
    return ProjectionVAE()


def build_trainable(name: str, seed: int = 0):
    """:func:`build`, or a pytest skip naming why the running ComfyUI cannot train family ``name`` (a fused kernel
    without backward: ``treegrpo.comfyui.families.fused_without_backward``; that refusal has its own test)."""
    import pytest

    from treegrpo.comfyui.families import fused_without_backward

    reason = fused_without_backward(name)
    if reason:
        pytest.skip(f"{name} is refused on this ComfyUI: {reason}")
    return build(name, seed)
