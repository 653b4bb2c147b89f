"""One checkpoint format: a run started by ComfyUI's Train node resumes from the CLI and the other way round (the
demo model exists on both sides: PEFT layers on the CLI, ComfyUI's activation-space LoRA in the node), and the run
moved between them ends with the same LoRA bytes as the run left where it started: the checkpoint carries the noise
levels the run was trained with (ComfyUI's scheduler and the CLI's backend space them differently)."""
import json
from pathlib import Path

import torch

import behaviour_fixture as bf
from treegrpo import checkpoint as ckpt
from treegrpo import cli
from treegrpo.config import TrainConfig
from treegrpo.demo.model import flow_sigmas
from treegrpo.lora import from_state_dict, read_lora_file
from treegrpo.run import run_training

PROMPTS = ["a red circle", "a blue square", "a green triangle"]


def cli_config(folder: Path, run_name: str, iterations: int) -> TrainConfig:
    """The Train node's settings (behaviour_fixture.train_node_graph) as a CLI config on the demo backend; the
    node's LoRA targets on the demo model are the attention's q/k/v projections."""
    d = cli.demo_config_dict()
    d.update(prompts=PROMPTS, output_dir=str(folder), eval_every=0, checkpoint_every=1, run_name=run_name,
             iterations=iterations, prompts_per_iter=2, seed=0,
             tree=dict(steps=6, window_start=1, window_width=2, branch=2, noise_level=0.7, window_schedule="fixed",
                       antithetic=True, eta=0.7),   # the node's tree config (eta = noise_level; unused by flow)
             lora=dict(rank=4, alpha=4.0, targets=["to_q", "to_k", "to_v"]), optim=dict(lr=1e-2))
    return TrainConfig.from_dict(d)


def node_graph(run_name: str, iterations: int) -> dict:
    g = bf.train_node_graph(run_name, iterations)
    g["train"]["inputs"]["prompts"] = "\n".join(PROMPTS)
    return g


def lora_of(path) -> dict:
    w = from_state_dict(*read_lora_file(str(path)))
    return {**{f"{n}.down": t for n, t in w.down.items()}, **{f"{n}.up": t for n, t in w.up.items()}}


def last_checkpoint(folder: Path, run_name: str) -> dict:
    return torch.load(ckpt.checkpoint_paths(str(folder), run_name)[-1], weights_only=True)


def adam_steps(state: dict) -> set:
    return {int(s["step"]) for s in state["optimizer"]["state"].values()}


def test_a_train_node_run_resumes_from_the_cli_and_back(comfyui_pack):
    run = "moves_between_frontends"
    folder = Path(comfyui_pack.base_dir) / "output" / "treegrpo" / run
    comfyui_pack.execute(node_graph(run, 1))                       # ComfyUI: iteration 0
    after_node = last_checkpoint(folder, run)
    assert after_node["iteration"] == 1 and after_node["base_model"] == "treegrpo-demo-shapes16"

    _, same = run_training(cli_config(folder, run, 1), resume=True, progress=False)    # CLI: nothing to do
    handed = lora_of(same["lora"])
    assert set(handed) == set(after_node["lora"])
    assert all(torch.equal(handed[k], after_node["lora"][k]) for k in handed)   # the node's LoRA, bit for bit
    tr, summary = run_training(cli_config(folder, run, 2), resume=True, progress=False)   # CLI: iteration 1
    assert tr.iteration == 2 and [h["iteration"] for h in tr.history] == [0, 1]
    after_cli = last_checkpoint(folder, run)
    assert adam_steps(after_cli) == {2}                            # the optimiser state came along
    moved = [n for n in after_node["lora"] if not torch.equal(after_node["lora"][n], after_cli["lora"][n])]
    assert moved, "the CLI did not train the resumed LoRA"

    r = comfyui_pack.execute(node_graph(run, 3))                   # ComfyUI again: iteration 2
    log = json.load(open(folder / "log.json"))
    assert [h["iteration"] for h in log["train"]] == [0, 1, 2]
    final = last_checkpoint(folder, run)
    assert final["iteration"] == 3 and adam_steps(final) == {3}
    saved = lora_of(r.outputs["save"]["text"][0].split("saved ", 1)[1])
    assert set(saved) == set(final["lora"]) and all(torch.equal(saved[k], final["lora"][k]) for k in saved)


def equal_loras(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_moved_node_cli_node_equals_the_node_run_uninterrupted(comfyui_pack, capsys):
    """ComfyUI (iteration 0) → CLI (iteration 1) → ComfyUI (iteration 2): every LoRA byte and the AdamW state equal
    those of the same three iterations run in the Train node alone."""
    out = Path(comfyui_pack.base_dir) / "output" / "treegrpo"
    comfyui_pack.execute(node_graph("node_alone", 3))
    alone = last_checkpoint(out / "node_alone", "node_alone")
    run = "node_cli_node"
    comfyui_pack.execute(node_graph(run, 1))
    run_training(cli_config(out / run, run, 2), resume=True, progress=False)
    assert "'comfy' backend and continues on its noise levels" in capsys.readouterr().out
    comfyui_pack.execute(node_graph(run, 3))
    moved = last_checkpoint(out / run, run)
    assert equal_loras(moved["lora"], alone["lora"])
    assert torch.equal(moved["sigmas"], alone["sigmas"])
    for a, b in zip(moved["optimizer"]["state"].values(), alone["optimizer"]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert [h["reward"] for h in json.loads(moved["history"])] == [h["reward"] for h in json.loads(alone["history"])]


def test_a_run_moved_cli_node_equals_the_cli_run_uninterrupted(comfyui_pack):
    """CLI (iteration 0) → ComfyUI (iteration 1): the LoRA equals two iterations on the CLI, byte for byte; the
    node trains on the CLI's noise levels, not its scheduler's."""
    out = Path(comfyui_pack.base_dir) / "output" / "treegrpo"
    _, alone = run_training(cli_config(out / "cli_alone", "cli_alone", 2), progress=False)
    run = "cli_node"
    run_training(cli_config(out / run, run, 1), progress=False)
    r = comfyui_pack.execute(node_graph(run, 2))
    from_node = lora_of(r.outputs["save"]["text"][0].split("saved ", 1)[1])
    assert equal_loras(from_node, lora_of(alone["lora"]))
    assert torch.equal(last_checkpoint(out / run, run)["sigmas"], flow_sigmas(6))   # the CLI's, not ComfyUI's


def test_the_node_resumes_the_clis_lora_bit_for_bit(comfyui_pack):
    """CLI → ComfyUI: a Train node asked for no more iterations than the CLI ran loads the checkpoint and
    returns its LoRA, every tensor equal to the CLI's own LoRA file."""
    run = "cli_then_node"
    folder = Path(comfyui_pack.base_dir) / "output" / "treegrpo" / run
    _, summary = run_training(cli_config(folder, run, 2), progress=False)
    r = comfyui_pack.execute(node_graph(run, 2))
    from_node = lora_of(r.outputs["save"]["text"][0].split("saved ", 1)[1])
    from_cli = lora_of(summary["lora"])
    assert set(from_node) == set(from_cli)
    assert all(torch.equal(from_node[k], from_cli[k]) for k in from_cli)
    assert json.load(open(folder / "log.json"))["train"][-1]["iteration"] == 1


def test_a_failing_preview_never_loses_the_lora(comfyui_pack, monkeypatch, caplog):
    """The Train node writes the LoRA before drawing its curve; when the drawing fails (e.g. matplotlib missing)
    the node still finishes, the run folder holds the LoRA and Save LoRA writes it."""
    import treegrpo.report

    def broken(*a, **k):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr(treegrpo.report, "curve_image", broken)
    run = "preview_fails"
    g = node_graph(run, 1)
    g["curve"] = {"class_type": "PreviewImage", "inputs": {"images": ["train", 2]}}
    r = comfyui_pack.execute(g)
    in_run = Path(comfyui_pack.base_dir) / "output" / "treegrpo" / run / f"{run}.safetensors"
    saved = r.outputs["save"]["text"][0].split("saved ", 1)[1]
    assert lora_of(in_run).keys() == lora_of(saved).keys() and len(lora_of(in_run)) > 0
    assert all(torch.equal(lora_of(in_run)[k], lora_of(saved)[k]) for k in lora_of(saved))
    assert "could not draw the reward curve" in caplog.text and str(in_run) in caplog.text


def test_a_train_node_run_loads_each_model_once(comfyui_pack, caplog):
    """ComfyUI's "loaded completely" line appears once per model (text encoder, diffusion model, VAE) for a whole
    Train node run with evaluations, not once per denoiser call or phase."""
    import logging

    caplog.set_level(logging.INFO)
    g = node_graph("quiet_log", 4)
    g["train"]["inputs"]["eval_every"] = 2
    comfyui_pack.execute(g)
    msgs = [r.getMessage() for r in caplog.records]
    loads = [m for m in msgs if m.startswith("Requested to load")]
    done = [m for m in msgs if m.startswith(("loaded completely", "loaded partially"))]
    assert sorted(loads) == sorted(set(loads)) and len(loads) <= 3, loads   # each model requested at most once
    assert len(done) <= len(loads), (loads, done)                           # and loaded at most once
