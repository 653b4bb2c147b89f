import pytest
import torch

pytest_plugins = ["conftest_comfy"]


@pytest.fixture(autouse=True)
def _torch_threads_unchanged(request):
    """A test that changes torch's thread count must restore it: ComfyUI's worker thread keeps the count it started
    with, so a leaked count makes the CLI (main thread) and the node round differently, and tests that compare
    their LoRAs byte for byte fail later, far from the cause."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"{request.node.nodeid} changed torch's thread count from {before} to {after} without "
                    "restoring it", pytrace=False)


@pytest.fixture(autouse=True)
def _memory_probes_kept_per_test(tmp_path_factory, monkeypatch):
    """Each test keeps the memory probes it makes in a folder of its own (treegrpo/memory_cache.py): never in the
    user's ~/.cache, and never reused by a later test that measures the probe itself."""
    monkeypatch.setenv("TREEGRPO_CACHE", str(tmp_path_factory.mktemp("treegrpo_cache")))


#: the folders of tests/ by what their tests need; a test in ``browser/`` or ``e2e/`` is also ``slow``
FOLDERS = {"unit": "needs neither ComfyUI nor a browser (some tests of a module may still boot ComfyUI: marked comfyui)",
           "comfyui": "mostly tests that boot a real ComfyUI in-process or as a server",
           "browser": "drives the ComfyUI web UI in headless Chromium",
           "e2e": "whole runs as a user makes them: install, first run, benchmarks, several processes, both ComfyUI lanes"}
SLOW_FOLDERS = {"browser", "e2e"}
SLOW_FIXTURES = {"comfyui_server"}   # a ComfyUI main.py subprocess: seconds to start, seconds a prompt


def pytest_configure(config):
    for name, what in FOLDERS.items():
        config.addinivalue_line("markers", f"{name}: tests/{name}/ -- {what}")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder, and ``slow`` the browser and end-to-end tests and those that start a ComfyUI
    server (the fast lane is ``pytest -m "not slow"``; other tests that take seconds are marked where written)."""
    for item in items:
        folder = item.path.parent.name
        if folder in FOLDERS:
            item.add_marker(getattr(pytest.mark, folder))
        if folder in SLOW_FOLDERS or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
