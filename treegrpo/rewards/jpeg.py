"""JPEG compressibility / incompressibility (DDPO): the negative (or positive) size in kB of each image
saved as JPEG at quality 95. No weights."""
from __future__ import annotations

import io

import torch
from PIL import Image

from .base import check_batch, register


def jpeg_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """(B,) JPEG sizes in kB of images (B, 3, H, W) in [0, 1]."""
    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    sizes = []
    for a in arr:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


@register("jpeg_compressibility")
class JpegCompressibility:
    """Reward = −(JPEG size in kB): flatter, simpler images score higher."""

    name = "jpeg_compressibility"
    sign = -1.0

    host_only = True    # PIL on the CPU: no accelerator memory for the memory plan to measure

    def __init__(self, path=None, device="cpu", quality: int = 95):
        if path:
            raise ValueError(f"{self.name} needs no weight file, got path={path!r}")
        self.quality = quality

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        check_batch(images, prompts, self.name)
        return self.sign * jpeg_kb(images, self.quality)


@register("jpeg_incompressibility")
class JpegIncompressibility(JpegCompressibility):
    """Reward = +(JPEG size in kB): more detailed images score higher."""

    name = "jpeg_incompressibility"
    sign = 1.0
