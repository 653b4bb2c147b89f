"""Packaging: the pack's root imports without ComfyUI, the console script and the ComfyUI registry table."""
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_root_init_imports_outside_comfyui_without_importing_it():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('pack', {str(ROOT / '__init__.py')!r},"
        f" submodule_search_locations=[{str(ROOT)!r}])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['pack'] = m; spec.loader.exec_module(m)\n"
        "assert callable(m.comfy_entrypoint)\n"
        "assert not hasattr(m, 'NODE_CLASS_MAPPINGS'), 'ComfyUI would ignore the V3 entrypoint'\n"
        "bad = [k for k in sys.modules if k == 'comfy' or k.startswith(('comfy.', 'comfy_api'))]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_pyproject_declares_script_extras_and_comfy_table():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["scripts"]["treegrpo"] == "treegrpo.cli:main"
    assert "test" in data["project"]["optional-dependencies"]
    deps = " ".join(data["project"]["dependencies"])
    for dep in ("torch", "diffusers", "transformers", "peft", "safetensors", "open-clip-torch", "image-reward"):
        assert dep in deps, dep
    assert data["tool"]["comfy"]["PublisherId"] and data["tool"]["comfy"]["DisplayName"]


def test_cli_help_lists_commands_and_generated_flags():
    r = subprocess.run([sys.executable, "-m", "treegrpo.cli", "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for flag in ("--tree.branch", "--optim.lr", "--advantage.backup", "--lora.rank", "--resume", "--iterations"):
        assert flag in r.stdout, flag
    r = subprocess.run([sys.executable, "-m", "treegrpo.cli", "--help"], capture_output=True, text=True)
    for cmd in ("demo", "train", "sample", "export", "rewards", "config"):
        assert cmd in r.stdout
