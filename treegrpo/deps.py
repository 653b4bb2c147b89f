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
    # packages writing cv2/): its other needs are installed normally (none pins what ComfyUI has), itself without
    # them; it carries its PP-OCRv6 ONNX models inside the wheel (nothing is downloaded)
    "rapidocr": ("the ocr reward (RapidOCR: PP-OCRv6 text detection and recognition)",
                 ("onnxruntime pyclipper shapely omegaconf colorlog", "--no-deps rapidocr==3.10.0")),
}


class OptionalPackageMissing(ImportError):
    """An optional package that one feature needs is not installed; the message is one line with the command."""


def optional_install_command(module: str) -> str:
    """The command that installs the optional ``module`` into this Python (ComfyUI's own)."""
    return " && ".join(f'"{sys.executable}" -m pip install {args}' for args in OPTIONAL[module][1])


def optional_pip_command(module: str) -> str:
    """The same as plain ``pip install ...`` lines (the README's and the loader's tooltip)."""
    return " && ".join(f"pip install {args}" for args in OPTIONAL[module][1])


def require_optional(module: str) -> None:
    """Raise :class:`OptionalPackageMissing` (one line: what needs it and the install command) when ``module``
    cannot be found; cheap (does not import it)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        what = OPTIONAL[module][0]
        raise OptionalPackageMissing(f"{what} needs the Python package {module!r}, which is not installed; install it "
                                     f"into this Python (it changes no other package; restart ComfyUI after): "
                                     f"{optional_install_command(module)}")


REQUIREMENTS_TXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements.txt")


def missing_packages() -> list[str]:
    """The distributions (requirements.txt names) whose module cannot be found; cheap (does not import them)."""
    out = []
    for module, dist in REQUIRED.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


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
