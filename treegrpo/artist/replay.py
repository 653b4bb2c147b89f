"""The artist's answers given before a crash, used again instead of asking twice.

A run resumed from its checkpoint repeats the iteration a crash cut (ComfyUI killed, the machine off) from the same
noises, so it draws the same trees the artist may already have answered about. Each answer is in
``artist_labels.jsonl`` with the tree's leaf pictures kept beside it (``artist/``); an answer is used again when its
record names this run, iteration, seed, tree and mode, the artist gave it, and the kept pictures are the pictures of
the tree now (:func:`same_pictures`).
"""
from __future__ import annotations

import json
import os
from typing import Optional

import torch

from .answers import Answer

#: the largest mean difference, in 8-bit levels, between a kept leaf picture and the leaf now for the two to count as
#: one picture: a resumed run on a GPU may differ by a level in a few pixels (non-deterministic kernels); pictures of
#: other noises differ by tens of levels
SAME_PICTURE_LEVELS = 1.0


def answers_given(path: str, *, run_name: str, iteration: int, seed, mode: str) -> dict[int, tuple[dict, Answer]]:
    """``tree -> (record, answer)`` of the answers the artist gave about iteration ``iteration`` of run ``run_name``
    (seed ``seed``, question mode ``mode``) in the labels file ``path``; the newest per tree. Lines that cannot be
    read (a last line cut by a crash, a record of another format) are passed over: asking again is the safe side."""
    out: dict[int, tuple[dict, Answer]] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not (isinstance(rec, dict) and rec.get("answered_by") == "artist" and rec.get("run_name") == run_name
                and rec.get("iteration") == iteration and rec.get("seed") == seed and rec.get("mode") == mode
                and isinstance(rec.get("tree"), int) and isinstance(rec.get("leaves"), list)):
            continue
        try:
            answer = Answer.from_dict(rec.get("answer"))
        except (ValueError, TypeError):
            continue
        out[rec["tree"]] = (rec, answer)
    return out


def to_levels(image: torch.Tensor) -> torch.Tensor:
    """A picture (H, W, 3) float in [0, 1] as the 8-bit levels it is kept with (uint8)."""
    return image.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu()


def same_pictures(folder: str, kept: list, images: list[torch.Tensor]) -> bool:
    """Whether the pictures kept under ``folder`` (``kept``: paths relative to it, one per leaf) are ``images``
    ((H, W, 3) float in [0, 1], the tree's leaves now, in order): as many, each within
    :data:`SAME_PICTURE_LEVELS` of it on average."""
    from ..report import read_picture

    if len(kept) != len(images):
        return False
    for rel, image in zip(kept, images):
        try:
            old = read_picture(os.path.join(folder, rel))
        except (OSError, ValueError, TypeError):
            return False
        now = to_levels(image).float() / 255.0
        if old.shape != now.shape or 255.0 * float((old - now).abs().mean()) > SAME_PICTURE_LEVELS:
            return False
    return True


def earlier_answer(given: dict[int, tuple[dict, Answer]], folder: str, tree: int,
                   images: list[torch.Tensor]) -> Optional[tuple[dict, Answer]]:
    """The record and answer of :func:`answers_given` about ``tree`` when its kept pictures are ``images``; else None."""
    found = given.get(tree)
    if found is None or not same_pictures(folder, found[0]["leaves"], images):
        return None
    return found
