"""The configuration reference (docs/configuration.md), generated from the config dataclasses: every field, its
default and its help text, so the page cannot drift from the code (tests/unit/test_layout.py checks it is current).

    python -m treegrpo.config_reference > docs/configuration.md
"""
from __future__ import annotations

import dataclasses
import inspect
import json

from .config import ArtistConfig, TrainConfig, config_sections
from .demo.config import demo_run_config_dict

HEADER = """# Configuration reference

Every field of the training config: a key of the JSON (or YAML) file, the flag `treegrpo train --section.field` (and
at the top level `--field` with hyphens: `--prompts-per-iter`); a node's widget for a field starts at its default.
`treegrpo train --help` prints the same help text; `treegrpo config` prints a whole validated config (the demo's
without `--config`; its values where they differ from the default are in the column "demo"). Generated from
`treegrpo/config.py` by `python -m treegrpo.config_reference`: edit the help there, not here.
"""


def _show(value) -> str:
    if isinstance(value, list) and len(json.dumps(value)) > 60:
        return f"{len(value)} items"
    text = "none" if value is None else json.dumps(value) if isinstance(value, (list, dict, bool)) else str(value)
    return f"`{text}`"


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows() -> list[tuple[str, str, str, str]]:
    """(dotted name, default, the demo's value where it differs, help) of every field, the top level first, then
    each section in the class's order."""
    sections, demo = config_sections(), demo_run_config_dict()
    top, nested = [], []

    def row(name, f, demo_value):
        default = _default(f)
        differs = demo_value is not _MISSING and demo_value != default
        return name, _show(default), _show(demo_value) if differs else "", f.metadata.get("help", "")

    for f in dataclasses.fields(TrainConfig):
        if f.name in sections:
            sub = demo.get(f.name, {})
            nested += [row(f"{f.name}.{g.name}", g, sub.get(g.name, _MISSING)) for g in dataclasses.fields(sections[f.name])]
        else:
            top.append(row(f.name, f, demo.get(f.name, _MISSING)))
    return top + nested


_MISSING = object()


def first_paragraph(klass) -> str:
    """The first paragraph of a class's docstring on one line, single-spaced (the same text on every Python: 3.13
    strips a docstring's indentation when it compiles it, earlier versions keep it)."""
    return " ".join(inspect.cleandoc(klass.__doc__ or "").split("\n\n")[0].split())


def markdown() -> str:
    sections = config_sections()
    head = ["| field | default | demo | what it does |", "|---|---|---|---|"]
    out = [HEADER, *head]
    out += [f"| `{name}` | {_cell(default)} | {_cell(demo)} | {_cell(help_)} |" for name, default, demo, help_ in rows()
            if "." not in name]
    for sec, klass in sections.items():
        out += ["", f"## `{sec}`", "", first_paragraph(klass), "", *head]
        out += [f"| `{name}` | {_cell(default)} | {_cell(demo)} | {_cell(help_)} |" for name, default, demo, help_
                in rows() if name.startswith(sec + ".")]
    out += ["", "## The artist (ComfyUI only)", "", first_paragraph(ArtistConfig) +
            " The Train node's widget for a field is `artist_<field>`; the Artist Picks node has `mode`, `timeout_s`"
            " and `on_timeout`.", "", "| field | default | what it does |", "|---|---|---|"]
    out += [f"| `{f.name}` | {_cell(_show(_default(f)))} | {_cell(f.metadata.get('help', ''))} |"
            for f in dataclasses.fields(ArtistConfig)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(markdown(), end="")
