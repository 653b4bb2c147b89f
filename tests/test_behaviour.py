"""Training behaviour is pinned: seeded runs give the LoRA recorded in tests/fixtures/behaviour.json (recorded
before the training loop was unified, so refactors of the loop cannot change what it computes)."""
import json

import pytest

import behaviour_fixture as bf

RECORDED = json.loads(bf.FIXTURE.read_text())


@pytest.mark.parametrize("name", sorted(bf.CLI_RUNS))
def test_cli_run_gives_the_recorded_lora(tmp_path, name):
    got = bf.run_cli(name, str(tmp_path / name))
    assert got["metadata"] == RECORDED[name]["metadata"]
    assert got["tensors_sha256"] == RECORDED[name]["tensors_sha256"], f"{name}: the trained LoRA changed"


def test_train_node_gives_the_recorded_lora(comfyui_pack):
    got = bf.run_train_node(comfyui_pack)
    want = RECORDED["comfy_train_node"]
    assert got["metadata"] == want["metadata"]
    assert got["tensors_sha256"] == want["tensors_sha256"], "the Train node's LoRA changed"
