"""Training behaviour is pinned: seeded runs give the LoRA recorded in tests/fixtures/behaviour/ (metadata exactly,
the weight update within ``behaviour_fixture.TOLERANCE``, which the fixture module justifies from measured
cross-CPU round-off and one-line changes). Recorded before the training loop was unified, so refactors of the loop
cannot change what it computes. Byte identity is kept where it is a product promise: a resumed run equals the
uninterrupted one and a node run equals the CLI run on one machine (tests/comfyui/test_checkpoint.py,
tests/comfyui/test_step_equals_train.py, tests/comfyui/test_comfy_nodes.py)."""
import json

import pytest

import behaviour_fixture as bf
from treegrpo.run import run_training

RECORDED = json.loads(bf.FIXTURE.read_text())


def _check(name: str, path: str) -> None:
    assert bf.lora_metadata(path) == RECORDED[name]["metadata"]
    diff = bf.update_difference(path, str(bf.LORAS / f"{name}.safetensors"))
    assert diff <= bf.TOLERANCE, f"{name}: the trained LoRA moved by {diff:.2e} of its update (tolerance " \
                                 f"{bf.TOLERANCE:.0e}): training computes something else"


@pytest.mark.parametrize("name", sorted(bf.CLI_RUNS))
def test_cli_run_gives_the_recorded_lora(tmp_path, name):
    _check(name, bf.run_cli(name, str(tmp_path / name)))


def test_train_node_gives_the_recorded_lora(comfyui_pack):
    _check("comfy_train_node", bf.run_train_node(comfyui_pack))


def test_the_comparison_sees_a_one_line_change(tmp_path):
    """The tolerance is no blanket: the same run with kl_beta 0.1 → 0.11 is refused."""
    import dataclasses


    cfg = bf.cli_config("cli_tree", str(tmp_path / "kl"))
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, kl_beta=0.11))
    _, summary = run_training(cfg, progress=False)
    assert bf.update_difference(summary["lora"], str(bf.LORAS / "cli_tree.safetensors")) > 5 * bf.TOLERANCE
