"""Videos for image rewards: which frames a leaf's video is scored on, how few latent frames decode them, and
rewards averaged over frames.

A video leaf is a latent (C, T, H, W). Video VAEs (Wan, HunyuanVideo, Mochi, LTX-Video, Cosmos) are causal in
time with a temporal compression ``tc``: latent frame 0 decodes to pixel frame 0 and latent frame j ≥ 1 to pixel
frames ``tc·(j−1)+1 … tc·j``, so a video of ``1 + tc·(T−1)`` frames. Decoding the first ``m`` latent frames gives
exactly the first ``1 + tc·(m−1)`` pixel frames, which is how only a few frames are decoded per leaf.
"""
from __future__ import annotations

from typing import Callable

import torch


def video_length(latent_frames: int, temporal_compression: int) -> int:
    """Pixel frames of a video of ``latent_frames`` latent frames: ``1 + tc·(T−1)``."""
    return 1 + max(1, int(temporal_compression)) * (int(latent_frames) - 1)


def latent_frames_for(frames: int, temporal_compression: int) -> int:
    """Latent frames of a ``frames``-long video (ComfyUI's empty video latents: ``(frames − 1) // tc + 1``)."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    return (int(frames) - 1) // max(1, int(temporal_compression)) + 1


def frame_indices(length: int, count: int, stride: int) -> list[int]:
    """Pixel frames to score in a ``length``-frame video: ``0, stride, 2·stride, …`` (``count`` of them, fewer when
    the video is shorter)."""
    if count < 1 or stride < 1:
        raise ValueError(f"reward_frames and frame_stride must be >= 1, got {count} and {stride}")
    return [i for i in range(0, int(length), int(stride))][:int(count)] or [0]


def video_notes(frames: int, temporal_compression: int, reward_frames: int, frame_stride: int) -> list[str]:
    """What a video setting gives that differs from what it asks (each a sentence for the console): a length the
    VAE cannot make (not ``tc·k + 1``: the video is that much shorter), fewer scored frames than ``reward_frames``
    (the stride runs past the end), only the first frame scored."""
    if frames <= 1:
        return []
    tc = max(1, int(temporal_compression))
    made = video_length(latent_frames_for(frames, tc), tc)
    notes = []
    if made != frames:
        notes.append(f"frames {frames}: this model's VAE makes videos of {tc}k+1 frames, so the leaves are {made} "
                     f"frames long; set frames to {made} or {made + tc}")
    picked = frame_indices(made, reward_frames, frame_stride)
    if len(picked) < reward_frames:
        notes.append(f"reward_frames {reward_frames} at frame_stride {frame_stride}: a {made}-frame video has only "
                     f"{len(picked)} such frame{'s' if len(picked) > 1 else ''} ({', '.join(map(str, picked))}), so "
                     f"{'only its first frame is' if len(picked) == 1 else 'those are'} scored; "
                     + (f"lower frame_stride to {(made - 1) // (reward_frames - 1)} to spread {reward_frames} frames "
                        "over it" if reward_frames <= made else f"it has {made} frames in all"))
    return notes


def latent_prefix(indices: list[int], temporal_compression: int) -> int:
    """Latent frames to decode so that pixel frame ``max(indices)`` is among the decoded ones (causal VAE)."""
    tc = max(1, int(temporal_compression))
    return -(-max(indices) // tc) + 1


def group_frames(images: torch.Tensor, frames_per_video: int, count: int, stride: int) -> torch.Tensor:
    """A decoded batch of videos as ComfyUI's VAEDecode gives it, (B·L, 3, H, W) with each video's L frames in
    order, → (B, F, 3, H, W): the frames :func:`frame_indices` picks of each video. ``frames_per_video`` 1 returns
    the images unchanged."""
    if frames_per_video <= 1:
        return images
    n = images.shape[0]
    if n % frames_per_video:
        raise ValueError(f"frames_per_video {frames_per_video}: {n} images are not whole videos of that length (set it "
                         "to the frame count of one decoded video)")
    videos = images.reshape(n // frames_per_video, frames_per_video, *images.shape[1:])
    return videos[:, frame_indices(frames_per_video, count, stride)]


def score_over_frames(score: Callable[[torch.Tensor, list[str]], torch.Tensor], images: torch.Tensor,
                      prompts: list[str]) -> torch.Tensor:
    """An image reward over videos: ``images`` (B, F, 3, H, W) → (B,) the mean score of each video's F frames
    (every frame scored with its video's prompt, in one call). (B, 3, H, W) images are scored as they are."""
    if images.ndim == 4:
        return torch.as_tensor(score(images, prompts), dtype=torch.float32).reshape(-1).cpu()
    if images.ndim != 5:
        raise ValueError(f"images must be (B, 3, H, W) or videos (B, F, 3, H, W), got shape {tuple(images.shape)}")
    b, f = images.shape[:2]
    flat = torch.as_tensor(score(images.reshape(b * f, *images.shape[2:]), [p for p in prompts for _ in range(f)]),
                           dtype=torch.float32).reshape(-1).cpu()
    if flat.numel() != b * f:
        raise ValueError(f"a reward returned {flat.numel()} scores for {b * f} frames")
    return flat.reshape(b, f).mean(1)


def frame_strip(images: torch.Tensor, gap: int = 2) -> torch.Tensor:
    """(B, 3, H, W): each video's scored frames side by side, in order, ``gap`` white pixels apart (B, 3, H,
    F·W + (F−1)·gap), so that a sample grid shows the motion; images unchanged."""
    if images.ndim != 5:
        return images
    b, f, c, h, w = images.shape
    out = torch.ones((b, c, h, f * w + (f - 1) * gap), dtype=images.dtype, device=images.device)
    for i in range(f):
        out[..., i * (w + gap):i * (w + gap) + w] = images[:, i]
    return out


def first_frames(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W): each video's first scored frame (for image-only statistics and previews); images unchanged."""
    return images[:, 0] if images.ndim == 5 else images


def leaf_frames(images: torch.Tensor, leaves: torch.Tensor, where: str) -> torch.Tensor:
    """Decoded ``leaves`` (latents (n, C, H, W), or videos (n, C, T, H, W)) as ComfyUI's VAEDecode gives them,
    (N, 3, H, W): one image per leaf, or for videos every frame of every leaf in order (N = n × frames) → (n, 3, H,
    W), each leaf's first frame. Any other count raises ValueError naming ``where`` (the node) and the counts."""
    n, count = images.shape[0], leaves.shape[0]
    if n == count:
        return images
    video = leaves.ndim == 5 and leaves.shape[2] > 1
    if video and count and n > count and n % count == 0:
        return images[:: n // count]
    videos = f" (nor {count} whole videos)" if video else ""
    raise ValueError(f"{where} got {n} images for the tree's {count} leaves{videos}: connect the VAE Decode of this "
                     "tree's leaves")
