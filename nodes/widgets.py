"""Widgets whose defaults come from the config dataclasses (``treegrpo.config``), so that a node, the CLI and a
config file start from the same values. ``CONFIG_WIDGETS`` names the field behind each such widget; the test
``tests/unit/test_layout.py`` checks every node's widget defaults against it."""
from __future__ import annotations

import dataclasses
import json

from comfy_api.latest import io

from treegrpo.config import (AdvantageConfig, ArtistConfig, LoraConfig, MemoryConfig, OptimConfig, TrainConfig,
                             TreeConfig, VideoConfig, field_choices, field_labels)

#: widget name → (config dataclass, field)
CONFIG_WIDGETS = {
    "steps": (TreeConfig, "steps"), "window_start": (TreeConfig, "window_start"),
    "window_width": (TreeConfig, "window_width"), "branch": (TreeConfig, "branch"),
    "noise_level": (TreeConfig, "noise_level"), "window_schedule": (TreeConfig, "window_schedule"),
    "antithetic": (TreeConfig, "antithetic"), "tail_solver": (TreeConfig, "tail_solver"),
    "tail_steps": (TreeConfig, "tail_steps"),
    "backup": (AdvantageConfig, "backup"), "temperature": (AdvantageConfig, "temperature"),
    "adv_clip": (AdvantageConfig, "adv_clip"), "flat_floor": (AdvantageConfig, "flat_floor"),
    "edge_baseline": (AdvantageConfig, "edge_baseline"),
    "lora_rank": (LoraConfig, "rank"), "lora_alpha": (LoraConfig, "alpha"),
    "learning_rate": (OptimConfig, "lr"), "clip_range": (OptimConfig, "clip_range"),
    "kl_beta": (OptimConfig, "kl_beta"),
    "seed": (TrainConfig, "seed"), "cfg": (TrainConfig, "guidance_scale"), "negative": (TrainConfig, "negative_prompt"),
    "iterations": (TrainConfig, "iterations"), "prompts_per_iteration": (TrainConfig, "prompts_per_iter"),
    "eval_every": (TrainConfig, "eval_every"), "run_name": (TrainConfig, "run_name"),
    "gradient_checkpointing": (MemoryConfig, "checkpointing"), "memory_budget_gb": (MemoryConfig, "budget_gb"),
    "offload_rewards": (MemoryConfig, "offload_rewards"), "tiled_decode": (MemoryConfig, "tiled_decode"),
    "frames": (VideoConfig, "frames"), "reward_frames": (VideoConfig, "reward_frames"),
    "frame_stride": (VideoConfig, "frame_stride"),
    "mode": (ArtistConfig, "mode"), "timeout_s": (ArtistConfig, "timeout_s"), "on_timeout": (ArtistConfig, "on_timeout"),
    "artist_every": (ArtistConfig, "every"), "artist_ask": (ArtistConfig, "ask"), "artist_mode": (ArtistConfig, "mode"),
    "artist_timeout_s": (ArtistConfig, "timeout_s"), "artist_away_s": (ArtistConfig, "away_s"),
    "away_s": (ArtistConfig, "away_s"),
    "artist_check_every": (ArtistConfig, "check_every"),
    "tail_steps_schedule": (TreeConfig, "tail_steps_schedule"), "lr_factor_schedule": (OptimConfig, "lr_factor_schedule"),
}


def config_default(widget: str):
    """The default of the config field behind ``widget`` (``antithetic``: its value for the tree method)."""
    klass, name = CONFIG_WIDGETS[widget]
    if (klass, name) == (TreeConfig, "antithetic"):
        return TreeConfig().mirrored
    f = klass.__dataclass_fields__[name]
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if isinstance(value, list):
        return json.dumps(value)   # a list field: its JSON text in a String widget
    return field_labels(klass, name).get(value, value)   # a labelled choice: the label the combo shows


def schedule_value(name: str, text) -> list:
    """The ``[[iteration, value], ...]`` list a schedule widget holds as JSON text (empty text or ``[]``: none). The
    config validates the entries and names its field; this only says when the text is not JSON."""
    text = (text or "").strip()
    if not text:
        return []
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"{name}: {text[:60]!r} is not a JSON list; write [[iteration, value], ...] from iteration 0, "
                         "e.g. [[0, 1], [60, 2]], or [] for none") from None


def config_help(widget: str) -> str:
    klass, name = CONFIG_WIDGETS[widget]
    return klass.__dataclass_fields__[name].metadata.get("help", "")


def widget(kind, name: str, tooltip: str = "", **kw):
    """``kind.Input(name, default=<config default>, tooltip=<tooltip or the field's help>, **kw)``; a combo offers
    the field's ``Literal`` choices (``treegrpo.config.field_choices``), by their labels where the field has them
    (``field_labels``: the text saved workflows keep; the config reads a label as its value), unless ``options``
    are given."""
    if kind is io.Combo and "options" not in kw:
        labels = field_labels(*CONFIG_WIDGETS[name])
        kw["options"] = [labels.get(c, c) for c in field_choices(*CONFIG_WIDGETS[name])]
        if not kw["options"]:
            raise TypeError(f"widget {name!r}: its config field has no Literal choices; pass options")
    return kind.Input(name, default=config_default(name), tooltip=tooltip or config_help(name), **kw)
