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
