"""The start-up line for a ComfyUI outside the tested versions (treegrpo/comfyui/versions.py), and that the tested
range is the one the suite runs: the floor is pyproject's ``requires-comfyui``, the newest is the shared tree's."""
import re
import tomllib
from pathlib import Path

import comfy_harness as ch
from treegrpo.comfyui.versions import TESTED, outside_tested

ROOT = Path(__file__).resolve().parents[2]


def test_versions_inside_the_tested_range_say_nothing_and_outside_one_line():
    assert outside_tested("0.3.75") == outside_tested("0.20.1") == outside_tested("0.33.0") == ""
    assert outside_tested(None) == outside_tested("") == outside_tested("unknown") == ""
    old, new = outside_tested("0.3.40"), outside_tested("0.38.2")
    assert "0.3.40 is older than 0.3.75" in old and "update ComfyUI" in old and "\n" not in old
    assert "0.38.2 is newer than 0.33.0" in new and "\n" not in new


def test_the_tested_range_is_what_the_suite_runs():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["comfy"]["requires-comfyui"] == f">={TESTED[0]}" and TESTED[0] == ch.FLOOR_VERSION
    newest = ch.newest_tarball()
    if newest is not None:
        assert newest.name == f"ComfyUI-{TESTED[1]}.tar.gz", "a newer ComfyUI tree: update versions.TESTED, README"
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf"ComfyUI {re.escape(TESTED[0])} and {re.escape(TESTED[1])}", readme)
