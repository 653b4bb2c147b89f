"""The artist's answers given before a crash, used again instead of asking twice.

A run resumed from its checkpoint repeats the iteration a crash cut (ComfyUI killed, the machine off) from the same
noises, so it draws the same trees the artist may already have answered about. Each answer is in
``artist_labels.jsonl`` with the tree's leaf pictures kept beside it (``artist/``); an answer is used again when its
record names this run, iteration, seed, tree and mode, the artist gave it, and the kept pictures are the pictures of
the tree now (:func:`same_pictures`). A check against the start (:mod:`.start_check`, ``artist_checks.jsonl``) the
crash cut is the same: an answer an earlier prompt got about this run, iteration and look whose two kept sides are
the sides now, in either order (which side comes first is drawn anew; :func:`earlier_check`).
"""
from __future__ import annotations

import json
import math
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
    for rec in _records(path):
        if not (rec.get("answered_by") == "artist" and rec.get("run_name") == run_name
                and rec.get("iteration") == iteration and rec.get("seed") == seed and rec.get("mode") == mode
                and isinstance(rec.get("tree"), int) and isinstance(rec.get("leaves"), list)):
            continue
        try:
            answer = Answer.from_dict(rec.get("answer"))
        except (ValueError, TypeError):
            continue
        out[rec["tree"]] = (rec, answer)
    return out


def _records(path: str) -> list[dict]:
    """The records of the JSON-lines file ``path`` in order; lines that cannot be read are passed over (none when
    the file is missing)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def checks_given(path: str, *, run_name: str, iteration: int, again: bool, prompt_id: str) -> list[dict]:
    """The checks the artist answered about iteration ``iteration`` of run ``run_name`` (``again``: the second look)
    in the checks file ``path`` while another prompt than ``prompt_id`` ran (this prompt's own questions are never
    answers given before a crash), newest first. Timeouts are not answers: those are asked again."""
    out = []
    for rec in _records(path):
        if (rec.get("run_name") == run_name and rec.get("iteration") == iteration and rec.get("again") is again
                and rec.get("prompt_id") != prompt_id and rec.get("outcome") == "answered"
                and rec.get("pick") in (0, 1, None) and isinstance(rec.get("sides"), list)
                and len(rec["sides"]) == 2):
            out.append(rec)
    return out[::-1]


def earlier_check(given: list[dict], folder: str, sides: list[torch.Tensor]) -> Optional[tuple[dict, Optional[int]]]:
    """The record and the pick, in the order of ``sides`` (the two side pictures (H, W, 3) in [0, 1] shown now), of
    the first of ``given`` (:func:`checks_given`) whose kept sides are these pictures — in the same order (its pick)
    or swapped (the other side; no preference stays None), whichever order is nearer; else None."""
    for rec in given:
        same = picture_distance(folder, rec["sides"], sides)
        swapped = picture_distance(folder, rec["sides"][::-1], sides)
        if min(same, swapped) > SAME_PICTURE_LEVELS:
            continue
        if same <= swapped:
            return rec, rec["pick"]
        return rec, None if rec["pick"] is None else 1 - rec["pick"]
    return None


def to_levels(image: torch.Tensor) -> torch.Tensor:
    """A picture (H, W, 3) float in [0, 1] as the 8-bit levels it is kept with (uint8)."""
    return image.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu()


def same_pictures(folder: str, kept: list, images: list[torch.Tensor]) -> bool:
    """Whether the pictures kept under ``folder`` (``kept``: paths relative to it, one per leaf) are ``images``
    ((H, W, 3) float in [0, 1], the tree's leaves now, in order): as many, each within
    :data:`SAME_PICTURE_LEVELS` of it on average."""
    return picture_distance(folder, kept, images) <= SAME_PICTURE_LEVELS


def picture_distance(folder: str, kept: list, images: list[torch.Tensor]) -> float:
    """The largest mean difference, in 8-bit levels, between a picture kept under ``folder`` and the one of
    ``images`` in its place (:func:`same_pictures`); infinite when they are not as many, a size differs or a kept
    picture cannot be read."""
    from ..report import read_picture

    if len(kept) != len(images):
        return math.inf
    worst = 0.0
    for rel, image in zip(kept, images):
        try:
            old = read_picture(os.path.join(folder, rel))
        except (OSError, ValueError, TypeError):
            return math.inf
        now = to_levels(image).float() / 255.0
        if old.shape != now.shape:
            return math.inf
        worst = max(worst, 255.0 * float((old - now).abs().mean()))
    return worst


def earlier_answer(given: dict[int, tuple[dict, Answer]], folder: str, tree: int,
                   images: list[torch.Tensor]) -> Optional[tuple[dict, Answer]]:
    """The record and answer of :func:`answers_given` about ``tree`` when its kept pictures are ``images``; else None."""
    found = given.get(tree)
    if found is None or not same_pictures(folder, found[0]["leaves"], images):
        return None
    return found
