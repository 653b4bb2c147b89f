"""The Python packages the pack needs (``requirements.txt``), and a check that they can be imported.

ComfyUI-Manager and a plain ``git clone`` do not always install a pack's requirements; the nodes then call this
to tell the user, at start-up and when a prompt is queued, which packages are missing and the exact command that
installs them into the Python that runs ComfyUI."""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Optional

#: import name → the distribution in requirements.txt that provides it (tests check it against pyproject.toml)
REQUIRED = {
    "torch": "torch", "torchvision": "torchvision", "diffusers": "diffusers", "transformers": "transformers",
    "peft": "peft", "safetensors": "safetensors", "accelerate": "accelerate", "open_clip": "open-clip-torch", "numpy": "numpy", "PIL": "pillow", "tqdm": "tqdm", "matplotlib": "matplotlib",
}

#: import name → (what needs it, the pip arguments that install it without touching what ComfyUI has). A missing
#: optional package disables only what needs it: the reward's loader raises :class:`OptionalPackageMissing`.
OPTIONAL = {
    # image-reward 1.5 pins timm==0.6.13, fairscale and datasets; its model code runs on timm 1.x and needs none
    # of the others (rewards/imagereward.py imports its model files only), so it is installed without them
    "ImageReward": ("the image_reward reward (ImageReward)", ("--no-deps image-reward==1.5",)),
    # rapidocr 3.10 requires opencv-python-headless, which would go in beside a pack's opencv-python (two
    # packages writing cv2/): its other needs are installed normally (none pins what ComfyUI has), OpenCV only where
    # no OpenCV is there (PROVIDED_BY_OTHERS), itself without them; it carries its PP-OCRv6 ONNX models inside the
    # wheel (nothing is downloaded)
    "rapidocr": ("the ocr reward (RapidOCR: PP-OCRv6 text detection and recognition)",
                 ("onnxruntime opencv-python-headless pyclipper shapely omegaconf colorlog",
                  "--no-deps rapidocr==3.10.0")),
}

#: optional package → the other modules it imports that its ``--no-deps`` line does not bring (checked with it)
OPTIONAL_NEEDS = {"rapidocr": ("onnxruntime", "cv2", "pyclipper", "shapely", "omegaconf", "colorlog")}

#: a package named in an install line → the module it provides, which other distributions provide too: the package
#: is left out of the command when the module is already there, whichever distribution brought it (onnxruntime-gpu,
#: -directml and -openvino all install the module ``onnxruntime``; pip would write the CPU build's files over theirs;
#: opencv-python, -contrib and -headless all write ``cv2``)
PROVIDED_BY_OTHERS = {"onnxruntime": "onnxruntime", "opencv-python-headless": "cv2"}


class OptionalPackageMissing(ImportError):
    """An optional package that one feature needs is not installed; the message is one line with the command."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def optional_install_args(module: str, present=None) -> tuple[str, ...]:
    """The pip arguments of each command that installs the optional ``module`` into this Python, less the packages
    of :data:`PROVIDED_BY_OTHERS` whose module ``present(name)`` finds (e.g. ``onnxruntime`` beside an installed
    ``onnxruntime-gpu``; default: whether this Python finds it); a line left with no package is dropped."""
    present = present or _importable
    out = []
    for args in OPTIONAL[module][1]:
        words = [w for w in args.split() if not (w in PROVIDED_BY_OTHERS and present(PROVIDED_BY_OTHERS[w]))]
        if any(not w.startswith("-") for w in words):
            out.append(" ".join(words))
    return tuple(out)


def optional_install_command(module: str) -> str:
    """The command that installs the optional ``module`` into this Python (ComfyUI's own), as it stands now."""
    return " && ".join(f'"{sys.executable}" -m pip install {args}' for args in optional_install_args(module))


def optional_pip_command(module: str) -> str:
    """The same as plain ``pip install ...`` lines (the README's and the loader's tooltip), as it stands now."""
    return " && ".join(f"pip install {args}" for args in optional_install_args(module))


def require_optional(module: str) -> None:
    """Raise :class:`OptionalPackageMissing` (one line: what needs it, what is missing and the install command) when
    ``module`` or a module it needs (:data:`OPTIONAL_NEEDS`) cannot be found; cheap (imports none of them)."""
    missing = [m for m in (module, *OPTIONAL_NEEDS.get(module, ())) if not _importable(m)]
    if missing:
        what = OPTIONAL[module][0]
        names = ", ".join(repr(m) for m in missing)
        raise OptionalPackageMissing(f"{what} needs the Python package{'s' if len(missing) > 1 else ''} {names}, "
                                     f"which {'are' if len(missing) > 1 else 'is'} not installed; install "
                                     f"{'them' if len(missing) > 1 else 'it'} into this Python (it changes no other "
                                     f"package; restart ComfyUI after): {optional_install_command(module)}")


REQUIREMENTS_TXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements.txt")


def missing_packages() -> list[str]:
    """The distributions (requirements.txt names) whose module cannot be found; cheap (does not import them)."""
    return [dist for module, dist in REQUIRED.items() if not _importable(module)]


def install_command() -> str:
    """The command that installs the requirements into this Python (ComfyUI's own)."""
    return f'"{sys.executable}" -m pip install -r "{REQUIREMENTS_TXT}"'


def missing_message() -> Optional[str]:
    """One line naming the missing packages and the install command, or None when nothing is missing."""
    miss = missing_packages()
    if not miss:
        return None
    return (f"TreeGRPO needs Python packages that are not installed: {', '.join(miss)}. Install them into the "
            f"Python that runs ComfyUI, then restart ComfyUI: {install_command()}")
