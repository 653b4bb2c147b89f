"""The ComfyUI versions the pack is tested on, and the start-up line for one outside them.

The test suite runs every real-ComfyUI test on the floor that ``requires-comfyui`` names (pyproject.toml) and on the
newest ComfyUI tree the project has (tests/e2e/test_comfyui_lanes.py). Between the two the pack is expected to work; a
version outside them gets one log line at start-up saying so."""
from __future__ import annotations

import re

#: (oldest, newest) ComfyUI release the whole test suite passed on
TESTED = ("0.3.75", "0.33.0")


def _key(version: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def running_version() -> str | None:
    """``comfyui_version.__version__`` of the ComfyUI this process runs (None outside ComfyUI)."""
    try:
        import comfyui_version
    except ImportError:
        return None
    return getattr(comfyui_version, "__version__", None)


def outside_tested(version: str | None) -> str:
    """The start-up warning for ``version`` ("" inside the tested range or when unknown)."""
    if not version or not re.search(r"\d", version):
        return ""
    low, high = TESTED
    if _key(version) < _key(low):
        return (f"TreeGRPO: ComfyUI {version} is older than {low}, the oldest version the pack is tested on: update "
                "ComfyUI (its nodes and model classes may not be what the pack expects)")
    if _key(version) > _key(high):
        return (f"TreeGRPO: ComfyUI {version} is newer than {high}, the newest version the pack is tested on "
                f"(tested: {low} and {high}); it should work, and a model family added after {low} trains with a "
                "warning")
    return ""
