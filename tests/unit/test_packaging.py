"""Packaging: the pack's root imports without ComfyUI, the console script and the ComfyUI registry table."""
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
    for dep in ("torch", "diffusers", "transformers", "peft", "safetensors", "open-clip-torch"):
        assert dep in deps, dep
    assert "image-reward" not in deps     # optional, installed with --no-deps (tests/e2e/test_install.py)
    assert data["tool"]["comfy"]["PublisherId"] and data["tool"]["comfy"]["DisplayName"]


def test_cli_help_lists_commands_and_generated_flags():
    r = subprocess.run([sys.executable, "-m", "treegrpo.cli", "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for flag in ("--tree.branch", "--optim.lr", "--advantage.backup", "--lora.rank", "--resume", "--iterations"):
        assert flag in r.stdout, flag
    r = subprocess.run([sys.executable, "-m", "treegrpo.cli", "--help"], capture_output=True, text=True)
    for cmd in ("demo", "train", "sample", "export", "rewards", "config"):
        assert cmd in r.stdout
    # python -m treegrpo is the same command (a Python whose scripts are not on the PATH); a deprecated flag
    # still works but is not offered
    r = subprocess.run([sys.executable, "-m", "treegrpo", "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: treegrpo train") and "--tree.branch" in r.stdout
    assert "--pipeline.gradient_checkpointing" not in r.stdout


def requirement_lines(path: Path) -> list[str]:
    return [ln.split(" #", 1)[0].strip() for ln in path.read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def test_requirements_txt_is_pyprojects_dependency_list():
    """ComfyUI-Manager and `comfy node install` read requirements.txt; pip install -e reads pyproject.toml."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert requirement_lines(ROOT / "requirements.txt") == deps


def test_no_dependency_pins_the_users_setuptools():
    """The image-reward loader bypasses its package __init__ (which needs openai-clip and pkg_resources), so the
    pack neither pins setuptools nor installs openai-clip into ComfyUI's python."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    names = [d.split(";")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()
             for d in data["project"]["dependencies"]]
    assert "setuptools" not in names and "openai-clip" not in names


def test_registry_metadata_is_complete():
    """What `comfy node publish` reads (comfy-cli's registry config parser): a valid node id and X.Y.Z version,
    a license file, the repository URL, publisher, display name, icon, a ComfyUI version range, and OS /
    accelerator classifiers from the registry's lists."""
    import re

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, comfy = data["project"], data["tool"]["comfy"]
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*", project["name"]) and len(project["name"]) < 100
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    assert (ROOT / project["license"]["file"]).is_file()
    assert "MIT" in (ROOT / project["license"]["file"]).read_text()
    assert project["urls"]["Repository"].startswith("https://github.com/")
    assert project["description"]
    assert comfy["PublisherId"] and comfy["DisplayName"]
    icon = comfy["Icon"]
    assert icon.startswith("https://raw.githubusercontent.com/") and icon.endswith(".png")
    assert (ROOT / icon.split("/main/", 1)[1]).is_file(), "the icon URL must point at a file in this repository"
    assert re.fullmatch(r"(?:(==|>=|<=|!=|~=|>|<)\s*)?\d+\.\d+\.\d+", comfy["requires-comfyui"])
    oses = [c for c in project["classifiers"] if c.startswith("Operating System :: ")]
    assert oses and all(c.split(" :: ")[1] in ("Microsoft", "POSIX", "MacOS", "OS Independent") for c in oses)
    accel = [c for c in project["classifiers"] if c.startswith("Environment :: ")]
    assert accel and all(c in ("Environment :: GPU :: NVIDIA CUDA", "Environment :: GPU :: AMD ROCm",
                               "Environment :: GPU :: Intel Arc", "Environment :: NPU :: Huawei Ascend",
                               "Environment :: GPU :: Apple Metal") for c in accel)


def test_the_dependency_check_covers_exactly_the_requirements():
    from treegrpo.deps import REQUIRED

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(";")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower() for d in deps}
    assert set(REQUIRED.values()) == names


def test_an_optional_install_line_leaves_out_what_another_build_already_provides():
    """``onnxruntime-gpu`` (or -directml, -openvino) installs the module ``onnxruntime``: the ocr reward's command
    then leaves out ``onnxruntime``, whose CPU build pip would write over it; every other package stays named."""
    from treegrpo.deps import OPTIONAL, optional_install_args

    full = OPTIONAL["rapidocr"][1]
    assert optional_install_args("rapidocr", present=lambda m: False) == full
    assert optional_install_args("rapidocr", present=lambda m: m == "onnxruntime") == (
        "opencv-python-headless pyclipper shapely omegaconf colorlog", "--no-deps rapidocr==3.10.0")
    # OpenCV from any pack (opencv-python, -contrib): not installed again beside it; where none is there, in the same
    # line (a user's walk: a ComfyUI without OpenCV needed a second install and restart)
    assert optional_install_args("rapidocr", present=lambda m: m == "cv2") == (
        "onnxruntime pyclipper shapely omegaconf colorlog", "--no-deps rapidocr==3.10.0")
    # a module other than the providers' is never left out, installed or not
    assert optional_install_args("rapidocr", present=lambda m: m not in ("onnxruntime", "cv2")) == full
    assert optional_install_args("ImageReward", present=lambda m: True) == ("--no-deps image-reward==1.5",)


def test_a_missing_module_of_an_optional_reward_is_named_with_the_command(monkeypatch):
    """rapidocr installed with ``--no-deps`` alone lacks onnxruntime and the rest: refused before the reward is
    built, naming each missing module, with the install line."""
    import treegrpo.deps as deps

    gone = {"onnxruntime", "shapely", "cv2"}
    monkeypatch.setattr(deps, "_importable", lambda m: m not in gone)
    with pytest.raises(deps.OptionalPackageMissing) as e:
        deps.require_optional("rapidocr")
    msg = str(e.value)
    assert "packages 'onnxruntime', 'cv2', 'shapely', which are not installed" in msg, msg
    assert "-m pip install onnxruntime opencv-python-headless pyclipper shapely omegaconf colorlog" in msg
    assert "rapidocr==3.10.0" in msg
    monkeypatch.setattr(deps, "_importable", lambda m: True)
    deps.require_optional("rapidocr")
    from treegrpo.rewards.base import missing_package
    monkeypatch.setattr(deps, "_importable", lambda m: m != "colorlog")
    assert "package 'colorlog', which is not installed" in missing_package("ocr")
