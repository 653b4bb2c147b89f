"""The pack's nodes executing inside a real ComfyUI 0.3.75 (no mocks): step nodes on the demo model and
on tiny random SD1.x-UNet / SD3-MMDiT models, the full-loop Train node, LoRA files through ComfyUI's
own LoraLoaderModelOnly, interrupt + resume."""
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest
import torch

import comfy_harness as ch
from treegrpo.lora import read_lora_file

NO_FILE = "(none: built-in weights or none needed)"
TEST_PACK = Path(__file__).resolve().parents[1] / "comfy_test_pack"


@pytest.fixture(scope="module")
def rt(comfyui_pack):
    if "TreeGRPOTestTinyModel" not in comfyui_pack.node_classes():
        comfyui_pack.load_pack(TEST_PACK, name="treegrpo_test_pack")
    return comfyui_pack


def step_graph(run_name, seed, nodes, model, pos, neg, to_image, reward="demo_adherence", prompt="a red circle",
               steps=6):
    """API graph of one TreeGRPO iteration with the four step nodes (+ ``nodes`` that make the inputs)."""
    g = json.loads(json.dumps(nodes))
    g.update({
        "run": {"class_type": "TreeGRPOTrainerState", "inputs": {
            "run_name": run_name, "lora_rank": 4, "lora_alpha": 4.0, "learning_rate": 1e-2, "clip_range": 1e-4,
            "kl_beta": 0.0, "seed": 0, "gradient_checkpointing": "on" if run_name in ("tiny_sd15", "tiny_sd3") else "off"}},
        "tree": {"class_type": "TreeGRPOTreeSampler", "inputs": {
            "model": model, "positive": pos, "negative": neg, "latent": ["lat", 0], "seed": seed,
            "cfg": 1.0, "scheduler": "simple", "steps": steps, "window_start": 1, "window_width": 2, "branch": 2,
            "noise_level": 0.7, "window_schedule": "fixed", "trees_per_latent": 1, "prompt": prompt,
            "run": ["run", 0]}},
        "img": to_image,
        "rm": {"class_type": "TreeGRPORewardModelLoader", "inputs": {"reward": reward, "file": NO_FILE}},
        "score": {"class_type": "TreeGRPORewardScorer", "inputs": {
            "images": ["img", 0], "reward_model": ["rm", 0], "prompt": prompt, "weight": 1.0}},
        "adv": {"class_type": "TreeGRPOAdvantageBackup", "inputs": {
            "tree": ["tree", 0], "rewards": ["score", 0], "backup": "softmax", "temperature": 1.0, "adv_clip": 5.0,
            "flat_floor": 0.0}},
        "step": {"class_type": "TreeGRPOTrainerStep", "inputs": {"tree": ["adv", 0], "run": ["run", 0],
                                                                 "model": model}},
    })
    return g


DEMO_NODES = {
    "d": {"class_type": "TreeGRPOLoadDemoModel", "inputs": {}},
    "pos": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["d", 1], "text": "a red circle"}},
    "neg": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["d", 1], "text": ""}},
    "empty": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 2, "color": 0}},
    "lat": {"class_type": "VAEEncode", "inputs": {"pixels": ["empty", 0], "vae": ["d", 2]}},
}
DEMO_DECODE = {"class_type": "VAEDecode", "inputs": {"samples": ["tree", 1], "vae": ["d", 2]}}


def demo_step_graph(run_name, seed):
    return step_graph(run_name, seed, DEMO_NODES, ["d", 0], ["pos", 0], ["neg", 0], DEMO_DECODE)


def _lora(rt, run):
    path = Path(rt.base_dir) / "output" / "treegrpo" / run / f"{run}.safetensors"
    return read_lora_file(str(path))


def _step_stats(result):
    return json.loads(result.outputs["step"]["text"][0])


def test_pack_registers_nodes_with_categories_and_tooltips(rt):
    classes = rt.node_classes()
    ours = {k: v for k, v in classes.items() if k.startswith("TreeGRPO") and not k.startswith("TreeGRPOTest")}
    assert set(ours) >= {"TreeGRPOTreeSampler", "TreeGRPORewardModelLoader", "TreeGRPORewardScorer",
                         "TreeGRPOAdvantageBackup", "TreeGRPOTrainerStep", "TreeGRPOTrain", "TreeGRPOSaveLoRA",
                         "TreeGRPOLoadDemoModel", "TreeGRPOTreePreview", "TreeGRPOTrainerState"}
    for name, cls in ours.items():
        assert cls.CATEGORY.startswith("TreeGRPO/"), name
        for section in cls.INPUT_TYPES().values():
            for inp, spec in section.items():
                if isinstance(spec, tuple) and len(spec) > 1 and isinstance(spec[1], dict) and spec[0] in (
                        "INT", "FLOAT"):
                    assert "min" in spec[1] and "max" in spec[1], (name, inp)


def test_an_optional_input_a_saved_workflow_lacks_takes_the_config_default_not_a_copy_of_it(rt):
    """A workflow saved before an optional input existed runs with execute's default for it: that default is the
    config's (None, resolved from it, or the same value), so changing a config default cannot leave old
    workflows on another value (the Train node repeated the artist's defaults)."""
    import inspect
    import sys
    widgets = sys.modules[rt.node_classes()["TreeGRPOTrain"].__module__.rsplit(".", 1)[0] + ".widgets"]
    checked = 0
    for name, cls in rt.node_classes().items():
        if not name.startswith("TreeGRPO") or name.startswith("TreeGRPOTest"):
            continue
        optional = cls.INPUT_TYPES().get("optional", {})
        for p in inspect.signature(cls.execute).parameters.values():
            if p.name in optional and p.name in widgets.CONFIG_WIDGETS and p.default is not inspect.Parameter.empty:
                checked += 1
                assert p.default is None or p.default == widgets.config_default(p.name), \
                    (name, p.name, p.default, widgets.config_default(p.name))
    assert checked >= 10


def test_step_nodes_two_queued_iterations_on_demo_model(rt, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    from treegrpo import lora as lora_mod
    made = []      # the LoRA files serialised: once a step (the listed copy is a copy of those bytes)
    real_bytes = lora_mod.safetensors_bytes
    monkeypatch.setattr(lora_mod, "safetensors_bytes", lambda *a, **k: made.append(1) or real_bytes(*a, **k))
    from treegrpo.comfyui import steps
    away = [0.0]      # a person's pause of 1000 s between the two queues
    monotonic = time.monotonic
    monkeypatch.setattr(steps.time, "monotonic", lambda: monotonic() + away[0])
    g = demo_step_graph("demo_steps", 1)
    r1 = rt.execute(g)
    s1 = _step_stats(r1)
    w1, _ = _lora(rt, "demo_steps")
    away[0] = 1000.0
    g["tree"]["inputs"]["seed"] = 2
    s2 = _step_stats(rt.execute(g))
    assert len(made) == 2, len(made)
    w2, meta2 = _lora(rt, "demo_steps")
    assert s2["iteration"] == s1["iteration"] + 1
    assert s1["nfe"] == 2 * (1 + 1 + 2 + 4 * 3)          # 2 trees, T=6, s=1, w=2, k=2
    assert meta2["treegrpo.step"] == str(s2["iteration"] + 1)  # iterations done; stats count from 0 (log.json)
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)  # the LoRA moved
    assert all(k.startswith("diffusion_model.") for k in w2)
    # the step's LoRA where LoraLoader lists it, replaced at each step (one file, not one per queue)
    import folder_paths
    listed = Path(folder_paths.get_folder_paths("loras")[0]) / "treegrpo" / "demo_steps" / "demo_steps.safetensors"
    out = Path(rt.base_dir) / "output" / "treegrpo" / "demo_steps" / "demo_steps.safetensors"
    assert listed.read_bytes() == out.read_bytes()
    assert "treegrpo/demo_steps/demo_steps.safetensors" in folder_paths.get_filename_list("loras")
    # the console says each queued iteration, as the Train node does (no end: "it N")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("TreeGRPO demo_steps: it ")]
    assert [ln.split(" | ")[0] for ln in lines] == ["TreeGRPO demo_steps: it 1", "TreeGRPO demo_steps: it 2"], lines
    assert " | reward " in lines[1] and (" s/it" in lines[1] or " it/s" in lines[1]), lines
    # s/it: the iterations' own time, sampler to update, not the pause between queues
    rate = next(p for p in lines[1].split(" | ") if p.endswith(" s/it") or p.endswith(" it/s"))
    assert rate.endswith(" it/s") or float(rate.split()[0]) < 500, lines[1]


def test_a_step_run_refuses_a_changed_lora_and_another_front_ends_run_and_keeps_refusing(rt):
    """After a restart (a new process: no live run) the step nodes refuse, with what to do, a run whose LoRA rank or
    alpha the Trainer State changed, every time it is queued (a refused queue left a half-made run behind, and the
    next queue trained a fresh LoRA over the run's files), and a run the command line or the Train node made; the
    run's files stay as they were, and with its settings back it goes on."""
    from treegrpo import cli
    from treegrpo.comfyui.steps import RunState

    run = "guarded_steps"
    folder = Path(rt.base_dir) / "output" / "treegrpo" / run
    for seed in (1, 2):
        rt.execute(demo_step_graph(run, seed))
    RunState._registry.clear()                    # ComfyUI restarted
    def files():        # the run's files (not the lock the check takes, as every run does)
        return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".treegrpo.lock"}

    before = files()

    def refused(**settings):
        g = demo_step_graph(run, 3)
        g["run"]["inputs"].update(settings)
        res = rt.execute(g, check=False)
        assert not res.success
        return res.error["exception_message"]

    for _ in range(2):
        msg = refused(lora_rank=2)
        assert "lora_rank 4 -> 2" in msg and "set the Trainer State's LoRA settings back" in msg, msg
    assert "lora_alpha 4.0 -> 40.0" in refused(lora_alpha=40.0)
    assert files() == before
    assert _step_stats(rt.execute(demo_step_graph(run, 3)))["iteration"] == 2

    # a run the command line made, in the folder the step nodes would use (with the step nodes' own schedule:
    # the checkpoint names its front-end)
    other = Path(rt.base_dir) / "output" / "treegrpo" / "cli_made"
    assert cli.main(["train", "--quiet", "--iterations", "1", "--prompts-per-iter", "2", "--eval-every", "0",
                     "--checkpoint-every", "1", "--output-dir", str(other), "--run-name", "cli_made"]) == 0
    g = demo_step_graph("cli_made", 0)
    res = rt.execute(g, check=False)
    assert not res.success and "made by the Train node or the command line" in res.error["exception_message"]
    from treegrpo.comfyui.steps import made_by_steps      # checkpoints from before they named their front-end
    assert made_by_steps({"config": json.dumps({"eval_every": 0, "checkpoint_every": 1})})
    assert not made_by_steps({"config": json.dumps({"eval_every": 20, "checkpoint_every": 50})})


def test_run_monitor_records_each_iteration_with_a_held_out_judge(rt):
    """The step graph's Run Monitor: one record per queued iteration (training reward, judge, signals) in the
    run's monitor.json, drawn as an IMAGE."""
    g = demo_step_graph("monitored", 0)
    g["judge"] = {"class_type": "TreeGRPORewardModelLoader", "inputs": {"reward": "demo_judge", "file": NO_FILE}}
    g["monitor"] = {"class_type": "TreeGRPORunMonitor", "inputs": {"tree": ["adv", 0], "images": ["img", 0],
                                                                   "rewards": ["score", 0], "judge": ["judge", 0]}}
    r = rt.execute(json.loads(json.dumps(g)))    # a fresh prompt per queue, as the server gets (ComfyUI writes
    rt.execute(json.loads(json.dumps(g)))        # its fingerprints into the prompt dict it executes)
    assert r.outputs["monitor"]["images"]
    records = json.load(open(Path(rt.base_dir) / "output" / "treegrpo" / "monitored" / "monitor.json"))
    assert [m["iteration"] for m in records] == [0, 1]
    for m in records:
        assert 0 <= m["eval_judge"] <= 1 and 0 <= m["eval_reward"] <= 1
        assert {"eval_diversity", "eval_hf_energy", "eval_saturation", "eval_near_black"} <= set(m)


@pytest.mark.parametrize("arch", ["sd15", "sd3", "flux"])
def test_step_nodes_on_tiny_real_architectures(rt, arch):
    nodes = {"m": {"class_type": "TreeGRPOTestTinyModel", "inputs": {"arch": arch, "seed": 0}},
             "lat": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 2}}}
    g = step_graph(f"tiny_{arch}", 1, nodes, ["m", 0], ["m", 1], ["m", 2],
                   {"class_type": "TreeGRPOTestLatentToImage", "inputs": {"samples": ["tree", 1]}},
                   reward="jpeg_incompressibility", prompt="x")
    s1 = _step_stats(rt.execute(g))
    w1, _ = _lora(rt, f"tiny_{arch}")
    g["tree"]["inputs"]["seed"] = 2
    s2 = _step_stats(rt.execute(g))
    w2, _ = _lora(rt, f"tiny_{arch}")
    assert s2["iteration"] == s1["iteration"] + 1 and s1["edges"] > 0
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)
    from comfy_test_pack import _tiny
    patcher, _, _ = _tiny(arch, 0)
    linear = {f"diffusion_model.{n}" for n, m in patcher.model.diffusion_model.named_modules()
              if isinstance(m, torch.nn.Linear)}
    for k in w2:
        mod = k[: -len(".lora_up.weight")] if k.endswith(".lora_up.weight") else \
            k[: -len(".lora_down.weight")] if k.endswith(".lora_down.weight") else k[: -len(".alpha")]
        assert mod in linear, k


def test_an_sd_window_at_the_last_step_is_refused_before_any_tree_is_sampled(rt):
    """An SD1.x model's (DDIM) last step, into σ = 0, adds no noise: a window ending there is refused when the
    sampler sees the model, saying what to change, before its prefix runs (it failed after the prefix with "SDE std
    is 0"); flow models (SD3 here) may branch at the last step."""
    nodes = {"m": {"class_type": "TreeGRPOTestTinyModel", "inputs": {"arch": "sd15", "seed": 0}},
             "lat": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 2}}}
    g = step_graph("tiny_sd15_last_step", 1, nodes, ["m", 0], ["m", 1], ["m", 2],
                   {"class_type": "TreeGRPOTestLatentToImage", "inputs": {"samples": ["tree", 1]}},
                   reward="jpeg_incompressibility", prompt="x")
    g["tree"]["inputs"].update(window_start=4, window_width=2)          # steps 6: the window's last step is 5
    since = len(rt.progress)
    with pytest.raises(ch.ComfyExecutionError) as e:
        rt.execute(g)
    msg = e.value.result.error["exception_message"]
    assert "the SDE window reaches the last step (5 of 0..5)" in msg and "window_start + window_width <= 5" in msg
    assert not any((p.get("node") or p.get("node_id")) == "tree" for p in rt.progress[since:])
    g["m"]["inputs"]["arch"] = "sd3"
    g["run"]["inputs"]["run_name"] = "tiny_sd3_last_step"
    assert _step_stats(rt.execute(g))["edges"] > 0


class _LogLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_saved_lora_loads_in_lora_loader_with_no_missing_keys_and_changes_output(rt):
    g = demo_step_graph("demo_save", 3)
    g["save"] = {"class_type": "TreeGRPOSaveLoRA", "inputs": {"lora": ["step", 1], "filename_prefix": "treegrpo/t"}}
    for seed in (3, 4, 5):
        g["tree"]["inputs"]["seed"] = seed
        r = rt.execute(g)
    saved = r.outputs["save"]["text"][0].split("saved ", 1)[1]
    assert os.path.dirname(saved).endswith(os.path.join("loras", "treegrpo"))
    name = os.path.relpath(saved, os.path.join(rt.base_dir, "models", "loras"))

    def sample(with_lora):
        gg = {k: v for k, v in DEMO_NODES.items()}
        model = ["d", 0]
        if with_lora:
            gg["lora"] = {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["d", 0], "lora_name": name,
                                                                          "strength_model": 1.0}}
            model = ["lora", 0]
        gg["ks"] = {"class_type": "KSampler", "inputs": {
            "model": model, "positive": ["pos", 0], "negative": ["neg", 0], "latent_image": ["lat", 0], "seed": 7,
            "steps": 6, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}}
        gg["save"] = {"class_type": "SaveLatent", "inputs": {"samples": ["ks", 0],
                                                             "filename_prefix": f"treegrpo_test/{int(with_lora)}"}}
        return gg

    h = _LogLines()
    logging.getLogger().addHandler(h)
    try:
        rt.execute(sample(False))
        rt.execute(sample(True))
    finally:
        logging.getLogger().removeHandler(h)
    assert not [ln for ln in h.lines if "lora key not loaded" in ln], h.lines
    out = Path(rt.base_dir) / "output" / "treegrpo_test"
    import safetensors.torch
    base = safetensors.torch.load_file(str(sorted(out.glob("0_*.latent"))[-1]))["latent_tensor"]
    lora = safetensors.torch.load_file(str(sorted(out.glob("1_*.latent"))[-1]))["latent_tensor"]
    assert (base - lora).abs().max() > 1e-4


def train_graph(run_name, iterations, prompts="a red circle\na blue square\na green triangle"):
    g = {k: v for k, v in DEMO_NODES.items() if k == "d"}
    g["rm"] = {"class_type": "TreeGRPORewardModelLoader", "inputs": {"reward": "demo_adherence", "file": NO_FILE}}
    g["train"] = {"class_type": "TreeGRPOTrain", "inputs": {
        "model": ["d", 0], "clip": ["d", 1], "vae": ["d", 2], "prompts": prompts, "negative": "",
        "reward_model": ["rm", 0], "weight_2": 1.0, "width": 16, "height": 16, "cfg": 1.0, "scheduler": "simple",
        "steps": 6, "window_start": 1, "window_width": 2, "branch": 2, "noise_level": 0.7,
        "window_schedule": "sliding", "iterations": iterations, "prompts_per_iteration": 2, "lora_rank": 4, "lora_alpha": 4.0,
        "learning_rate": 1e-3, "seed": 0, "run_name": run_name, "eval_every": 2, "antithetic": False}}
    g["save"] = {"class_type": "TreeGRPOSaveLoRA", "inputs": {"lora": ["train", 1],
                                                              "filename_prefix": f"treegrpo/{run_name}"}}
    g["curve"] = {"class_type": "PreviewImage", "inputs": {"images": ["train", 2]}}
    return g


def test_train_node_full_loop_writes_lora_and_images(rt):
    r = rt.execute(train_graph("full_loop", 3))
    assert r.outputs["curve"]["images"] and r.outputs["train"]["images"]
    saved = r.outputs["save"]["text"][0].split("saved ", 1)[1]
    tensors, meta = read_lora_file(saved)
    assert meta["treegrpo.step"] == "3" and all(k.startswith("diffusion_model.") for k in tensors)
    assert json.loads(meta["treegrpo.tree_config"])["antithetic"] is False   # the widget reached the sampler
    log = json.load(open(Path(rt.base_dir) / "output" / "treegrpo" / "full_loop" / "log.json"))
    assert len(log["train"]) == 3


def test_a_resumed_run_without_its_base_models_grid_samples_it_again_for_the_before_after_figure(rt):
    """A run whose iteration-0 evaluation grid is not in its folder (a version before the pack kept them, or
    deleted), resumed to its end: the base model's grid is sampled again on the evaluation's fixed noises, the same
    picture as the first session's, and samples_before_after.png is drawn."""
    run = Path(rt.base_dir) / "output" / "treegrpo" / "regrid"
    rt.execute(train_graph("regrid", 2))
    first = run / "evals" / "eval_000000.png"
    kept = first.read_bytes()
    first.unlink()
    (run / "samples_before_after.png").unlink()
    rt.reset_cache()
    rt.execute(train_graph("regrid", 4))
    assert first.read_bytes() == kept and (run / "samples_before_after.png").is_file()


def test_a_second_reward_of_weight_zero_is_not_loaded(rt):
    """reward_model_2 at weight_2 0 leaves its loader unrun (here one that would fail: pickscore without its files),
    and the run trains on the first reward alone; at weight 1 the same graph fails in that loader."""
    g = train_graph("zero_weight", 1)
    g["rm2"] = {"class_type": "TreeGRPORewardModelLoader", "inputs": {"reward": "pickscore", "file": NO_FILE}}
    g["train"]["inputs"].update(reward_model_2=["rm2", 0], weight_2=0.0, eval_every=0)
    rt.execute(json.loads(json.dumps(g)))
    log = json.load(open(Path(rt.base_dir) / "output" / "treegrpo" / "zero_weight" / "log.json"))
    assert [r["name"] for r in log["config"]["rewards"]] == ["demo_adherence"] and len(log["train"]) == 1
    g["train"]["inputs"].update(weight_2=1.0, run_name="zero_weight_counted")
    with pytest.raises(Exception, match="pickscore: no path given"):
        rt.execute(g)


def test_a_finished_run_queued_again_after_a_restart_shows_its_samples_without_sampling_them_again(rt, monkeypatch):
    """A finished run queued again once ComfyUI forgot its outputs (a restart) shows the same sample grid and samples
    nothing: the grid is kept in the run folder as shown, and the run's last evaluation (iteration 1 here, off the
    eval_every grid) is in its last checkpoint (both were made again)."""
    from treegrpo.evaluation import Evaluation
    g = train_graph("kept_preview", 1)
    g["samples"] = {"class_type": "PreviewImage", "inputs": {"images": ["train", 3]}}
    first = rt.execute(json.loads(json.dumps(g)))
    run = Path(rt.base_dir) / "output" / "treegrpo" / "kept_preview"
    kept = sorted((run / "previews").glob("preview_000001_*.png"))
    assert len(kept) == 1 and not list((run / "evals").glob("preview_*"))     # evals/ holds the evaluations' grids
    from treegrpo import checkpoint as ckpt
    assert str(kept[0]) in ckpt.run_files(str(run), "kept_preview")         # moved aside with a run started over
    calls = []
    real = Evaluation.evaluate
    monkeypatch.setattr(Evaluation, "evaluate", lambda self, *a, **kw: calls.append(kw) or real(self, *a, **kw))
    rt.reset_cache()
    again = rt.execute(json.loads(json.dumps(g)))
    assert not calls
    from PIL import Image
    import numpy as np
    a, b = (np.asarray(Image.open(Path(rt.base_dir) / "temp" / r.outputs["samples"]["images"][0]["subfolder"] /
                                  r.outputs["samples"]["images"][0]["filename"])) for r in (first, again))
    assert a.shape[0] > 16 and np.array_equal(a, b)


def test_train_node_schedules_reach_the_trainer(rt):
    """The Train node's schedule widgets (JSON text): iteration 0 samples a one-step tail at the full learning rate,
    iteration 1 a two-step tail at half of it; NFE per iteration = 2 prompts x (1 prefix + 3 window rows + 4 leaves x
    tail) of the graph's steps 6, window 1-2 tree; the LoRA's metadata records the tail schedule."""
    g = train_graph("schedules", 2)
    g["train"]["inputs"].update(tail_steps_schedule="[[0, 1], [1, 2]]", lr_factor_schedule=" [[0, 1], [1, 0.5]] ",
                                tail_solver="dpmpp_2m", window_schedule="fixed")
    r = rt.execute(g)
    saved = r.outputs["save"]["text"][0].split("saved ", 1)[1]
    meta = read_lora_file(saved)[1]
    assert json.loads(meta["treegrpo.tree_config"])["tail_steps_schedule"] == [[0, 1], [1, 2]]
    log = json.load(open(Path(rt.base_dir) / "output" / "treegrpo" / "schedules" / "log.json"))
    assert [h["nfe"] for h in log["train"]] == [2 * (1 + 3 + 4 * t) for t in (1, 2)]
    assert [h["lr"] for h in log["train"]] == pytest.approx([1e-3, 5e-4])


def test_interrupt_saves_a_checkpoint_and_the_next_run_resumes(rt):
    run = "interrupted"
    folder = Path(rt.base_dir) / "output" / "treegrpo" / run
    start = len(rt.progress)
    fut = rt.submit(train_graph(run, 200))
    deadline = time.time() + 240
    # wait for two finished iterations (the Train node's ProgressBar counts iterations)
    while time.time() < deadline:
        done = [p for p in rt.progress[start:] if p.get("max") == 200]
        if done and done[-1]["value"] >= 2:
            break
        time.sleep(0.2)
    rt.interrupt()
    with pytest.raises(ch.ComfyInterrupted):
        fut.result(timeout=240)
    ckpts = sorted((folder / "checkpoints").glob(f"{run}-*.pt"))
    assert ckpts, "no checkpoint written on interrupt"
    done_iters = int(ckpts[-1].stem.rsplit("-", 1)[1])
    assert 2 <= done_iters < 200
    r = rt.execute(train_graph(run, done_iters + 1))
    log = json.load(open(folder / "log.json"))
    assert len(log["train"]) == done_iters + 1          # resumed: only one more iteration ran
    assert [h["iteration"] for h in log["train"]] == list(range(done_iters + 1))
    assert r.outputs["save"]["text"][0].startswith("saved ")
    # the interrupted-and-resumed LoRA is bit-identical to an uninterrupted run of the same length
    resumed = read_lora_file(r.outputs["save"]["text"][0].split("saved ", 1)[1])[0]
    u = rt.execute(train_graph(run + "_uninterrupted", done_iters + 1))
    straight = read_lora_file(u.outputs["save"]["text"][0].split("saved ", 1)[1])[0]
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in resumed), \
        [k for k in resumed if not torch.equal(resumed[k], straight[k])][:5]


def test_real_server_runs_the_demo_graph_and_lists_the_workflows(comfyui_server):
    import urllib.request
    templates = json.loads(urllib.request.urlopen(f"{comfyui_server.url}/workflow_templates", timeout=30).read())
    assert set(templates.get(ch.PACK_NAME, [])) >= {"treegrpo_demo_cpu", "treegrpo_step_by_step"}, templates
    g = train_graph("server_run", 2)
    pid = ch.post_prompt(comfyui_server.port, g)
    entry = ch.wait_history(comfyui_server.port, pid, timeout=300)
    assert entry["status"]["status_str"] == "success", entry["status"]
    assert entry["outputs"]["save"]["text"][0].startswith("saved ")


def test_reward_models_score_under_comfy_memory_management(rt, tmp_path):
    import reward_fixtures as rf
    from treegrpo.comfyui.runtime import ManagedReward
    from treegrpo.rewards.base import load_reward

    rf.register_tiny_configs()
    path, arch = rf.make_hps_file(str(tmp_path))
    model = load_reward("hpsv2", path=path, arch=arch)
    images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    prompts = ["a cat", "a dog", "a red circle"]
    direct = model(images, prompts)
    managed = ManagedReward(model)(images, prompts)
    assert torch.allclose(direct, managed)
    assert next(model.module.parameters()).device.type == "cpu"  # offloaded after scoring
    demo = ManagedReward(load_reward("demo_adherence"))          # weightless-to-manage rewards pass through
    assert demo(images, ["a red circle"] * 3).shape == (3,)


def test_a_train_node_queued_again_unchanged_with_new_or_overwrite_starts_a_run_each_time(rt):
    """existing_run 'new' (and 'overwrite') is a run per queue: ComfyUI answered the second queue of an unchanged
    graph from its cache, and no run started; 'resume' of a finished run may come from the cache."""
    root = Path(rt.base_dir) / "output" / "treegrpo"
    g = train_graph("queued_new", 1)
    g["train"]["inputs"]["existing_run"] = "new"
    for _ in range(2):
        rt.execute(json.loads(json.dumps(g)))      # each queue posts the graph anew (ComfyUI keeps notes in it)
    assert (root / "queued_new").is_dir() and (root / "queued_new-2").is_dir()
    g["train"]["inputs"]["existing_run"] = "resume"
    rt.execute(json.loads(json.dumps(g)))
    before = {p.name for p in root.iterdir()}
    r = rt.execute(json.loads(json.dumps(g)))
    assert {p.name for p in root.iterdir()} == before and r.success
