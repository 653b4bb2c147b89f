"""Which files in ``models/reward_models`` can be which reward: what the Reward Model Loader's file list shows once a
reward is chosen. Pure: decided from the file names and the names beside each file, nothing is read.

A file "can be" a reward when it is that reward's weight file as published (or a renamed copy with the reward's name
in it), or, for rewards kept as a folder, the folder's main weight file. Renamed files that match nothing still load
when chosen (the loader names what it expected); this list only hides files that are plainly something else."""
from __future__ import annotations

import os
import re
from typing import Callable, Iterable

WEIGHT_EXTS = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def _by_folder(files: Iterable[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in files:
        d, b = os.path.split(f.replace("\\", "/"))
        out.setdefault(d, set()).add(b)
    return out


def _hps(b: str, beside: set[str]) -> bool:          # HPS v2 / v2.1: one open_clip file (HPSv3 is a folder model)
    return b.lower().endswith(WEIGHT_EXTS) and "hps" in b.lower() and "hpsv3" not in b.lower() \
        and "config.json" not in beside


def _hpsv3(b: str, beside: set[str]) -> bool:
    return b.lower().endswith(WEIGHT_EXTS) and "hpsv3" in b.lower()


def _is_vlm_folder(beside: set[str]) -> bool:
    """A chat model's folder (Qwen2-VL and its kin ship a chat template and a generation config); PickScore's
    CLIP folder has neither."""
    return bool(beside & {"chat_template.json", "chat_template.jinja", "generation_config.json"})


def _model_weights(b: str) -> bool:
    """A transformers folder's weight file: whole, or the first of its shards."""
    return b in ("model.safetensors", "pytorch_model.bin") or \
        bool(re.fullmatch(r"(model|pytorch_model)-0*1-of-\d+\.(safetensors|bin)", b))


def _vlm_judge(b: str, beside: set[str]) -> bool:
    return _model_weights(b) and "config.json" in beside and _is_vlm_folder(beside)


def _clip(b: str, beside: set[str]) -> bool:
    """Any single CLIP weight file outside a folder model, but another reward's own file (a taste model, HPSv3's
    weights, ImageReward's, an aesthetic head) put there before its folder was complete."""
    return b.lower().endswith(WEIGHT_EXTS) and not _in_folder_model(beside) and "taste" not in b.lower() \
        and not _hpsv3(b, beside) and not _image_reward(b, beside) and not _aesthetic(b, beside)


def _image_reward(b: str, beside: set[str]) -> bool:
    return b == "ImageReward.pt"


def _pickscore(b: str, beside: set[str]) -> bool:
    return b in ("model.safetensors", "pytorch_model.bin") and "config.json" in beside and \
        "ImageReward.pt" not in beside and not _is_vlm_folder(beside)


def _aesthetic(b: str, beside: set[str]) -> bool:
    from .aesthetic import HEAD_NAMES
    return b in HEAD_NAMES or (b.lower().endswith(WEIGHT_EXTS) and "aesthetic" in b.lower())


def _taste(b: str, beside: set[str]) -> bool:
    return b.endswith("_taste.safetensors")


def _in_folder_model(beside: set[str]) -> bool:
    from .aesthetic import HEAD_NAMES
    return "ImageReward.pt" in beside or "config.json" in beside or bool(beside & set(HEAD_NAMES))


#: reward → predicate(file name, names in the same folder); a reward not listed takes any file
MATCHERS: dict[str, Callable[[str, set], bool]] = {
    "hpsv2": _hps, "clipscore": _clip, "image_reward": _image_reward, "pickscore": _pickscore,
    "laion_aesthetic": _aesthetic, "taste": _taste, "hpsv3": _hpsv3, "vlm_judge": _vlm_judge,
}


def files_for(reward: str, files: list[str], needs_file: bool = True) -> list[str]:
    """The entries of ``files`` (paths relative to ``models/reward_models``, '/'-separated, in their order) that can
    be ``reward``; [] when the reward needs no file (``needs_file`` False); all of them for a reward with no
    matcher."""
    if not needs_file:
        return []
    match = MATCHERS.get(reward)
    if match is None:
        return list(files)
    folders = _by_folder(files)
    return [f for f in files if match(os.path.basename(f), folders.get(os.path.dirname(f.replace("\\", "/")), set()))]
