"""Installing the pack changes nothing a ComfyUI already has.

``requirements.txt`` is what ComfyUI-Manager and ``comfy node install`` run in ComfyUI's own Python. A venv is made
the way a used ComfyUI looks: this Python's packages (torch, torchvision, transformers, ComfyUI's requirements) seen
through a ``.pth`` file, with older releases than pip would pick of the packages other packs share installed on top
(timm 1.0.x, open-clip-torch 3.x, numpy 2.2). ``pip install --dry-run --report`` of the requirements must then
install none of them in another version, and none of image-reward's pinned dependencies. Needs the package registry
(pip reaches it on this machine and in CI).

ImageReward is optional: without the ``ImageReward`` module the pack starts, every other reward works, and choosing
image_reward is refused before any work with the exact command (``pip install --no-deps image-reward==1.5``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: what other packs installed, older than what pip would choose today (so an upgrade would show)
USER_HAS = {"timm": "1.0.20", "open-clip-torch": "3.1.0", "numpy": "2.2.6"}
#: packages the install must leave as they are (name → the version the venv has)
PROTECTED = ("torch", "torchvision", "torchaudio", "timm", "open-clip-torch", "transformers", "numpy")
#: image-reward 1.5's pins and what they pull in: none may be added
NEVER_ADDED = ("image-reward", "fairscale", "datasets", "pandas", "pyarrow")


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def used_comfyui_venv(tmp_path_factory) -> Path:
    """A venv whose Python sees this Python's packages (torch, ComfyUI's requirements) and holds older releases of
    the packages other packs share; returns its python."""
    venv = tmp_path_factory.mktemp("used_comfyui") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # the new venv's own setuptools would hide this Python's (the venv module seeds an old one)
    _pip(python, "uninstall", "-y", "-q", "setuptools")
    (site / "zz_used_comfyui.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = _pip(python, "install", "--no-deps", "-q", *(f"{k}=={v}" for k, v in USER_HAS.items()))
    if r.returncode != 0:
        pytest.fail(f"could not install {USER_HAS} from the package registry:\n{r.stderr[-3000:]}")
    return python


def _installed(python: Path) -> dict[str, str]:
    r = _pip(python, "list", "--format", "json")
    assert r.returncode == 0, r.stderr
    return {_canon(d["name"]): d["version"] for d in json.loads(r.stdout)}


def test_requirements_change_nothing_a_used_comfyui_has(used_comfyui_venv, tmp_path):
    python = used_comfyui_venv
    before = _installed(python)
    for name, version in USER_HAS.items():
        assert before[_canon(name)] == version, (name, before.get(_canon(name)))
    report = tmp_path / "report.json"
    r = _pip(python, "install", "--dry-run", "--report", str(report), "-r", str(ROOT / "requirements.txt"))
    assert r.returncode == 0, r.stderr[-3000:]
    would = {_canon(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    changed = {n: (before.get(n), would[n]) for n in map(_canon, PROTECTED) if n in would}
    assert not changed, f"the install would change {changed} (installed, would install)"
    added = sorted(n for n in map(_canon, NEVER_ADDED) if n in would)
    assert not added, f"the install would add {added}"
    # what it does add is only what the pack itself needs, none of it replacing an installed release
    replaced = {n: (before[n], v) for n, v in would.items() if n in before and before[n] != v}
    assert not replaced, f"the install would replace {replaced}"


@pytest.mark.parametrize("module", ["ImageReward", "rapidocr"])
def test_optional_extras_change_nothing_a_used_comfyui_has(used_comfyui_venv, tmp_path, module):
    """Each optional reward's install commands (treegrpo.deps.OPTIONAL, the lines the loader shows) replace nothing
    that is installed and never add opencv-python beside the headless OpenCV that packs install."""
    from treegrpo.deps import OPTIONAL

    python = used_comfyui_venv
    before = _installed(python)
    for i, args in enumerate(OPTIONAL[module][1]):
        report = tmp_path / f"report{i}.json"
        r = _pip(python, "install", "--dry-run", "--report", str(report), *args.split())
        assert r.returncode == 0, r.stderr[-3000:]
        would = {_canon(x["metadata"]["name"]): x["metadata"]["version"]
                 for x in json.loads(report.read_text())["install"]}
        replaced = {n: (before[n], v) for n, v in would.items() if n in before and before[n] != v}
        assert not replaced, f"pip install {args} would replace {replaced}"
        assert "opencv-python" not in would and not set(map(_canon, NEVER_ADDED[1:])) & set(would), (args, would)


def test_the_ocr_install_keeps_a_packs_onnxruntime_gpu(tmp_path):
    """A ComfyUI where another pack installed onnxruntime-gpu (a distribution of another name holding the same
    module ``onnxruntime``): the ocr reward's install lines as the pack computes them there name no onnxruntime, so
    pip installs no CPU build over the GPU one; the lines with onnxruntime would have (the hazard is real)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "onnxruntime").mkdir()
    (site / "onnxruntime" / "__init__.py").write_text('__version__ = "1.20.1"\n')
    info = site / "onnxruntime_gpu-1.20.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.20.1\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("onnxruntime/__init__.py,,\n")
    assert _installed(python).get("onnxruntime-gpu") == "1.20.1"
    code = "import json; from treegrpo.deps import optional_install_args as a; print(json.dumps(a('rapidocr')))"
    r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=dict(os.environ,
                       PYTHONPATH=str(ROOT)), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = json.loads(r.stdout)
    # (no OpenCV in this venv: named in the same line)
    assert lines == ["opencv-python-headless pyclipper shapely omegaconf colorlog", "--no-deps rapidocr==3.10.0"], lines

    def would_install(args: str) -> set[str]:
        report = tmp_path / "report.json"
        r = _pip(python, "install", "--dry-run", "--report", str(report), *args.split())
        assert r.returncode == 0, r.stderr[-3000:]
        return {_canon(x["metadata"]["name"]) for x in json.loads(report.read_text())["install"]}

    assert "onnxruntime" not in would_install(lines[0])
    assert "onnxruntime" in would_install("onnxruntime pyclipper")      # what the unchanged line would do


def test_requirements_have_no_upper_bounds_or_torch_pins():
    lines = [ln.split("#", 1)[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    assert "torch" in lines and "torchvision" in lines, lines          # ComfyUI's own: no bound, never replaced
    assert not [ln for ln in lines if "<" in ln or "==" in ln or "~=" in ln], lines
    assert not [ln for ln in lines if _canon(ln.split(">")[0]) in map(_canon, NEVER_ADDED)], lines


HIDE_IMAGEREWARD = textwrap.dedent("""
    import sys
    class _Hide:
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] == "ImageReward":
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None
    sys.meta_path.insert(0, _Hide())
""")


def test_without_image_reward_only_that_reward_is_refused_with_the_command(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HIDE_IMAGEREWARD)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    code = textwrap.dedent("""
        from treegrpo.deps import missing_message
        from treegrpo.rewards.base import load_reward, missing_package
        assert missing_message() is None, missing_message()          # the pack itself lacks nothing
        assert missing_package("hpsv2") is None and missing_package("demo_adherence") is None
        print(missing_package("image_reward"))
        try:
            load_reward("image_reward", path=".")
        except ImportError as e:
            print("LOAD:", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line, load = r.stdout.strip().splitlines()
    assert "image_reward" in line and "pip install --no-deps image-reward==1.5" in line and sys.executable in line
    assert load == "LOAD: " + line
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"prompts": ["a red circle"], "rewards": [{"name": "image_reward", "path": "x"}],
                               "iterations": 1, "output_dir": str(tmp_path / "out")}))
    r = subprocess.run([sys.executable, "-m", "treegrpo.cli", "train", "--config", str(cfg)], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("treegrpo: error: TrainConfig.rewards[0]:") and "--no-deps image-reward==1.5" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
