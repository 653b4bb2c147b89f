"""The project's structure: the core never imports its adapters, the CLI, the nodes or ComfyUI; node widgets
start from the config dataclasses' defaults."""
import ast
import dataclasses
import json
from pathlib import Path

import pytest

import comfy_harness as ch
from treegrpo.config import (AdvantageConfig, LoraConfig, MemoryConfig, OptimConfig, TrainConfig, TreeConfig,
                             VideoConfig, ArtistConfig)

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "treegrpo"
COMFY_TOP = {"comfy", "comfy_api", "comfy_extras", "comfy_execution", "folder_paths", "nodes", "server",
             "execution", "node_helpers", "latent_preview"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (lazy imports in functions included), absolute."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                out.add(target)
                if not node.module:  # from . import x
                    out.update(f"{target}.{a.name}" for a in node.names)
            else:
                out.add(node.module)
    return out


def layer(mod: str) -> str:
    if mod in ("treegrpo.cli", "treegrpo.__main__", "treegrpo.demo.compare"):      # the commands
        return "cli"
    if mod == "treegrpo.run":                                   # building a run: picks the backend a config names
        return "run"
    if mod.startswith("treegrpo.backends"):
        return "backends"
    if mod.startswith("treegrpo.comfyui"):
        return "comfyui"
    if mod.startswith("nodes") or mod.split(".")[0] in COMFY_TOP:
        return "comfy"
    return "core" if mod.startswith("treegrpo") else "external"


#: what each layer of this package may import (besides the core and external libraries)
ALLOWED = {"core": set(), "backends": set(), "run": {"backends"}, "comfyui": {"comfy", "run"},
           "cli": {"backends", "run"}}


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_layering(path):
    """The core (maths, tree, trainer, rewards, LoRA, policy protocol) imports no adapter, no CLI, no node and
    nothing of ComfyUI; the CLI backends import no ComfyUI; only ``treegrpo.comfyui`` imports ComfyUI."""
    me = layer(module_name(path))
    bad = sorted(m for m in imports_of(path)
                 if layer(m) not in ("core", "external", me) and layer(m) not in ALLOWED[me])
    assert not bad, f"{module_name(path)} ({me}) imports {bad}"


def test_layering_check_catches_an_upward_import(tmp_path, monkeypatch):
    fake = PKG / "tree.py"
    src = fake.read_text(encoding="utf-8") + "\nfrom .comfyui import steps\n"
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: src if self == fake else
                        Path.read_bytes(self).decode(encoding or "utf-8"))
    with pytest.raises(AssertionError, match="treegrpo.comfyui"):
        test_layering(fake)


#: widgets that set something the config dataclasses do not have (node inputs, not run settings)
NODE_ONLY = {"prompts", "width", "height", "scheduler", "trees_per_latent", "prompt", "weight", "weight_2",
             "lora_targets", "frames_per_video", "guidance",
             "reward", "file", "options", "question", "filename_prefix", "text",
             "eval_prompts", "existing_run", "save_every", "preset", "eval_count"}


def field_default(klass, name):
    if (klass, name) == (TreeConfig, "antithetic"):
        return TreeConfig().mirrored     # None = auto: on for trees, what the tree nodes show
    f = {f.name: f for f in dataclasses.fields(klass)}[name]
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return json.dumps(value) if isinstance(value, list) else value   # a list field: JSON text in a String widget


def test_every_widget_default_is_its_config_fields(comfyui_pack):
    import sys

    # the pack's nodes/widgets.py, as ComfyUI imported it (under the pack's module name: ComfyUI owns `nodes`)
    widgets = next(m for m in list(sys.modules.values())
                   if str(getattr(m, "__file__", "") or "").endswith(str(Path("nodes", "widgets.py")))
                   and Path(m.__file__).resolve().parent.parent == ROOT)
    CONFIG_WIDGETS = widgets.CONFIG_WIDGETS

    from treegrpo.config import field_choices, field_labels, from_label

    checked = combos = 0
    for node_id, cls in comfyui_pack.node_classes().items():
        if not node_id.startswith("TreeGRPO") or node_id.startswith("TreeGRPOTest"):
            continue
        for name, _typ, opts in ch._input_specs(cls):
            if "default" not in opts:
                continue
            if name in NODE_ONLY:
                continue
            assert name in CONFIG_WIDGETS, f"{node_id}.{name}: a widget with a default but no config field " \
                                           "(map it in nodes/widgets.py, or list it in NODE_ONLY here)"
            klass, field = CONFIG_WIDGETS[name]
            assert klass in (TreeConfig, AdvantageConfig, LoraConfig, OptimConfig, MemoryConfig, TrainConfig,
                             VideoConfig, ArtistConfig)
            labels = field_labels(klass, field)   # a labelled choice: the combo shows the label, the config reads it
            assert from_label(klass, field, opts["default"]) == field_default(klass, field), \
                f"{node_id}.{name} = {opts['default']!r}, but {klass.__name__}.{field} = {field_default(klass, field)!r}"
            if field_choices(klass, field):     # a Literal field: the combo offers exactly its choices, in order
                assert list(_typ if isinstance(_typ, (list, tuple)) else opts.get("options", [])) == \
                    [labels.get(c, c) for c in field_choices(klass, field)], (node_id, name, _typ, opts)
                assert all(isinstance(c, str) and c.isidentifier() for c in field_choices(klass, field)), \
                    f"{klass.__name__}.{field}: its values are identifiers (a node shows labels: field_labels)"
                combos += 1
            checked += 1
    assert checked >= 25 and combos >= 10, (checked, combos)


def test_the_configuration_reference_is_generated_from_the_dataclasses():
    """docs/configuration.md is the generator's output: every field of every section, its default, the demo's value
    where it differs, and the field's help — one source, so the page cannot drift from the code."""
    import dataclasses

    from treegrpo import config_reference
    from treegrpo.config import TrainConfig, config_sections

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == config_reference.markdown(), \
        "docs/configuration.md is stale: run `python -m treegrpo.config_reference > docs/configuration.md`"
    names = {n for n, *_ in config_reference.rows()}
    expected = {f.name for f in dataclasses.fields(TrainConfig) if f.name not in config_sections()}
    expected |= {f"{s}.{g.name}" for s, k in config_sections().items() for g in dataclasses.fields(k)}
    assert names == expected
    assert all(h for *_, h in config_reference.rows()), "a field without help text"
    assert "| `iterations` | `100` | `180` |" in page    # the default and the demo's value


def test_the_design_documents_every_module():
    """docs/design.md §2 maps the code: every module of treegrpo/ is named in its architecture block, so a module added
    without a line there fails here."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    block = text[text.index("## 2. Architecture"):text.index("## 3.")]
    missing = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                     if p.stem != "__init__" and p.stem not in block)
    assert not missing, f"docs/design.md §2 does not name {missing}"


def test_every_result_says_what_it_backs():
    """benchmarks/results/MANIFEST.md lists every file and folder of benchmarks/results/ once, each with the section of
    benchmarks/README.md whose current claim it backs (results behind history only are read from git, not kept)."""
    import re

    results = ROOT / "benchmarks" / "results"
    text = (results / "MANIFEST.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([^`]+)` \|", text, re.M)
    rows = re.findall(r"^\| `([^`]+)` \| (\S+) § (.+?) \| (current) \|$",
                      text, re.M)
    names = [r[0] for r in rows]
    assert names == listed, f"entries backing no current claim: {sorted(set(listed) - set(names))}"
    assert len(names) == len(set(names)), "an entry listed twice"
    here = {p.name for p in results.iterdir() if p.name != "demo_run" and not p.name.endswith(".tmp")}  # ignored
    assert set(names) == here - {"MANIFEST.md"}, \
        "benchmarks/results/ and its MANIFEST.md disagree: list the new result (or remove the line)"
    for name, doc, sec, status in rows:
        assert doc == "benchmarks/README.md", name
        heads = re.findall(r"^#{2,3} (.+)$", (ROOT / doc).read_text(encoding="utf-8"), re.M)
        assert any(h.startswith(sec) for h in heads), f"{name}: {doc} has no section {sec!r}"
