"""Reward-hacking signals of evaluation samples, and the warnings a run's evaluation history raises.

A reward model can be fooled: the LoRA learns textures, saturated colours, blank or burnt images, or one image
per prompt, that score high without being better. These pure functions measure the symptoms on a batch of
decoded images (B, 3, H, W) in [0, 1]; :func:`hacking_warnings` reads them over a run's evaluations.

- high-frequency energy: the mean squared amplitude per pixel (channels summed) of the image's top
  spatial-frequency band, the components with ``max(|fx|, |fy|) >= 3/8`` cycles/pixel (periods under 2.7 px).
  A grid or checkerboard texture puts its power there (at the Nyquist frequency); smooth shapes keep theirs low.
  A 0/1 checkerboard has 0.75 (0.25 per channel). Absolute, not a share of the total: brighter, larger shapes do
  not hide a texture. Compared with the base model's (the first evaluation's) value.
- saturation: mean HSV saturation ``(max − min)/max`` over pixels (0 for black).
- near-black / near-white: the share of pixels with every channel below 0.04 / above 0.96.
- diversity: mean pairwise RMS distance between the images of one prompt.
"""
from __future__ import annotations

import math
from typing import Optional

import torch


def high_frequency_energy(images: torch.Tensor, band: float = 0.375) -> torch.Tensor:
    """(B,) mean squared amplitude per pixel, channels summed, of the components with ``max(|fx|, |fy|) >= band``
    cycles/pixel (Parseval: ``Σ_band |X(f)|² / (H·W)²``)."""
    x = images.float()
    h, w = x.shape[-2:]
    power = torch.fft.fft2(x).abs().pow(2).sum(1)                           # (B, H, W), channels summed
    fy = torch.fft.fftfreq(h, device=x.device).abs()
    fx = torch.fft.fftfreq(w, device=x.device).abs()
    top = torch.maximum(fy[:, None], fx[None, :]) >= band
    return (power * top).flatten(1).sum(1) / (h * w) ** 2


def saturation(images: torch.Tensor) -> torch.Tensor:
    """(B,) mean HSV saturation."""
    mx, mn = images.float().amax(1), images.float().amin(1)
    return torch.where(mx > 0, (mx - mn) / mx.clamp_min(1e-6), torch.zeros_like(mx)).flatten(1).mean(1)


def near_black(images: torch.Tensor, level: float = 0.04) -> torch.Tensor:
    """(B,) share of pixels with every channel below ``level``."""
    return (images.float().amax(1) < level).flatten(1).float().mean(1)


def near_white(images: torch.Tensor, level: float = 0.96) -> torch.Tensor:
    """(B,) share of pixels with every channel above ``level``."""
    return (images.float().amin(1) > level).flatten(1).float().mean(1)


def diversity(images: torch.Tensor, per_prompt: int) -> float:
    """Mean pairwise RMS distance between the ``per_prompt`` consecutive images of each prompt (0 for one)."""
    if per_prompt < 2:
        return 0.0
    flat = images.float().flatten(1).reshape(-1, per_prompt, images[0].numel())
    d = torch.cdist(flat, flat) / math.sqrt(flat.shape[-1])
    return float(d.sum() / (flat.shape[0] * per_prompt * (per_prompt - 1)))


def image_signals(images: torch.Tensor, per_prompt: int) -> dict[str, float]:
    """Every image signal of an evaluation batch, as the log's ``eval_*`` fields."""
    return {"eval_diversity": diversity(images, per_prompt),
            "eval_hf_energy": float(high_frequency_energy(images).mean()),
            "eval_saturation": float(saturation(images).mean()),
            "eval_near_black": float(near_black(images).mean()),
            "eval_near_white": float(near_white(images).mean())}


def hacking_checks(evals: list[dict], *, judge_drop: float, diversity_floor: float,
                   hf_ceiling: float) -> dict[str, str]:
    """The checks that fail on the newest of ``evals`` (a run's evaluation records, the first one the base
    model's), as ``{check: warning}`` with the checks of :data:`CHECKS`:

    - ``judge``: a held-out judge (``eval_judge``) at least ``judge_drop`` below its best while the training
      reward (``eval_reward``) is above its value at that best: the LoRA is learning to fool the training reward;
    - ``diversity``: diversity below ``diversity_floor`` × the first evaluation's: samples of a prompt collapse to
      one image;
    - ``texture``: high-frequency energy above ``hf_ceiling`` × the first evaluation's: a texture the base model
      lacks.
    A threshold of 0 turns its check off."""
    if len(evals) < 2:
        return {}
    first, now = evals[0], evals[-1]
    out = {}
    judged = [e for e in evals if e.get("eval_judge") is not None]
    if judge_drop > 0 and len(judged) >= 2:
        best = max(judged, key=lambda e: e["eval_judge"])
        if now.get("eval_judge") is not None and best is not now and \
                now["eval_judge"] <= best["eval_judge"] - judge_drop and now["eval_reward"] > best["eval_reward"]:
            out["judge"] = (f"held-out judge fell from {best['eval_judge']:.3f} (iteration {best['iteration']}) to "
                            f"{now['eval_judge']:.3f} while the training reward rose from {best['eval_reward']:.3f} "
                            f"to {now['eval_reward']:.3f}: the LoRA is fooling the training reward (the best "
                            "checkpoint is kept; raise optim.kl_beta or lower the learning rate)")
    base_div = first.get("eval_diversity") or 0.0
    if diversity_floor > 0 and base_div > 0 and now.get("eval_diversity", base_div) < diversity_floor * base_div:
        out["diversity"] = (f"diversity fell to {now['eval_diversity']:.4f}, below {diversity_floor:g} x the base "
                            f"model's {base_div:.4f}: the samples of a prompt are collapsing to one image")
    base_hf = first.get("eval_hf_energy") or 0.0
    if hf_ceiling > 0 and base_hf > 0 and now.get("eval_hf_energy", 0.0) > hf_ceiling * base_hf:
        out["texture"] = (f"high-frequency energy rose to {now['eval_hf_energy']:.4f}, above {hf_ceiling:g} x the "
                          f"base model's {base_hf:.4f}: a texture (grid, noise) the base model does not draw")
    return out


#: What each check of :func:`hacking_checks` watches, as the log names it.
CHECKS = {"judge": "the held-out judge against the training reward", "diversity": "diversity",
          "texture": "high-frequency energy"}

#: Evaluations a check must pass in a row before the log says so and would warn again: the signals of a small
#: evaluation set cross their thresholds back and forth (what 5 does on the stored runs: benchmarks/README.md,
#: "A run left to train").
QUIET_EVALUATIONS = 5


def hacking_warnings(evals: list[dict], *, judge_drop: float, diversity_floor: float,
                     hf_ceiling: float) -> list[str]:
    """The warnings of :func:`hacking_checks` about the newest of ``evals``, in the order judge, diversity,
    texture."""
    return list(hacking_checks(evals, judge_drop=judge_drop, diversity_floor=diversity_floor,
                               hf_ceiling=hf_ceiling).values())


def warning_changes(evals: list[dict], *, quiet: int = QUIET_EVALUATIONS,
                    **limits: float) -> tuple[list[str], list[str]]:
    """What a run's log says about the newest of ``evals`` (``limits``: those of :func:`hacking_checks`):

    - the warnings of the checks that fail now and passed at each of the ``quiet`` evaluations before (a check that
      keeps failing, or fails again soon after, is said once);
    - a line for each check that failed ``quiet`` evaluations ago and has passed at every evaluation since.
    Pure: read from the records alone, so a resumed run goes on saying what it would have said."""
    first = max(0, len(evals) - 1 - quiet)
    failed = [hacking_checks(evals[:j + 1], **limits) for j in range(first, len(evals))]
    now, before = failed[-1], failed[:-1]
    started = [w for k, w in now.items() if not any(k in f for f in before)]
    ended = []
    if len(before) == quiet:
        ended = [f"{CHECKS[k]} has passed its check at the last {quiet} evaluations"
                 for k in before[0] if not any(k in f for f in failed[1:])]
    return started, ended


def best_index(evals: list[dict], key: Optional[str] = None) -> Optional[int]:
    """Index of the best evaluation by ``key`` (default: the held-out judge when present, else the evaluation
    reward), passing over those of states the artist rejected (``rejected``: a check against the start took the run
    back before them); None when there is none."""
    if not evals:
        return None
    key = key or ("eval_judge" if evals[-1].get("eval_judge") is not None else "eval_reward")
    scored = [(e[key], i) for i, e in enumerate(evals) if e.get(key) is not None and not e.get("rejected")]
    return max(scored, key=lambda t: (t[0], -t[1]))[1] if scored else None
