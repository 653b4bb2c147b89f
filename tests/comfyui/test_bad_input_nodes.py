"""Bad input through the nodes, inside a real ComfyUI 0.3.75: a queued graph with a bad widget fails ComfyUI's
validation with a message naming the input (nothing runs); what only execution can see fails before any sampling,
with a one-line message naming the input, and leaves an earlier run's files as they were."""
import json
import re
from pathlib import Path

import pytest
import torch

import comfy_harness as ch
from treegrpo.lora import read_lora_file
import test_comfy_nodes as tcn

NO_FILE = tcn.NO_FILE


@pytest.fixture(scope="module")
def rt(comfyui_pack):
    return comfyui_pack


def train(**inputs) -> dict:
    g = tcn.train_graph(inputs.pop("run_name", "bad_input"), inputs.pop("iterations", 1))
    g["train"]["inputs"].update(inputs)
    g["save"]["inputs"]["filename_prefix"] = "treegrpo/bad_input"
    return g


def loader(reward="clipscore", options=None, file=NO_FILE) -> dict:
    inputs = {"reward": reward, "file": file}
    if options is not None:
        inputs["options"] = options
    g = tcn.train_graph("bad_loader", 1)
    g["rm"]["inputs"] = inputs
    return g


def step(**over) -> dict:
    g = tcn.demo_step_graph("bad_step", 0)
    for key, inputs in over.items():
        g[key]["inputs"].update(inputs)
    return g


#: (case id, graph, node id, fragment of the validation message)
VALIDATION_CASES = [
    ("train_window_past_steps", train(steps=6, window_start=4, window_width=3), "train", "window"),
    ("train_branch_zero", train(branch=0), "train", "branch = 0 is outside"),
    ("train_steps_huge", train(steps=100000), "train", "steps = 100000 is outside"),
    ("train_iterations_zero", train(iterations=0), "train", "iterations"),
    ("train_lr_zero", train(learning_rate=0.0), "train", "learning_rate"),
    ("train_rank_zero", train(lora_rank=0), "train", "lora_rank"),
    ("train_lr_inf", train(learning_rate=float("inf")), "train", "learning_rate"),
    ("train_cfg_inf", train(cfg=float("inf")), "train", "cfg"),
    ("train_size_absurd", train(width=10 ** 7), "train", "width"),
    ("train_artist_timeout_zero", train(artist_every=2, artist_timeout_s=0), "train", "artist_timeout_s"),
    ("train_artist_timeout_negative", train(artist_every=2, artist_timeout_s=-5), "train", "artist_timeout_s"),
    ("train_artist_every_negative", train(artist_every=-1), "train", "artist_every"),
    ("picks_timeout_zero", {**tcn.demo_step_graph("bad_picks", 0), "score": {
        "class_type": "TreeGRPOArtistPicks", "inputs": {"images": ["img", 0], "tree": ["tree", 0],
                                                        "mode": "favourites", "timeout_s": 0,
                                                        "on_timeout": "skip the tree"}}}, "score", "timeout_s"),
    ("picks_timeout_nan", {**tcn.demo_step_graph("bad_picks", 0), "score": {
        "class_type": "TreeGRPOArtistPicks", "inputs": {"images": ["img", 0], "tree": ["tree", 0],
                                                        "mode": "favourites", "timeout_s": float("nan"),
                                                        "on_timeout": "skip the tree"}}}, "score", "timeout_s"),
    ("picks_mode_unknown", {**tcn.demo_step_graph("bad_picks", 0), "score": {
        "class_type": "TreeGRPOArtistPicks", "inputs": {"images": ["img", 0], "tree": ["tree", 0],
                                                        "mode": "vibes", "timeout_s": 60,
                                                        "on_timeout": "skip the tree"}}}, "score", "mode"),
    ("loader_unknown_reward", loader(reward="nosuch"), "rm", "reward: 'nosuch' is not one of"),
    ("loader_options_not_json", loader(options="{dtype: bf16"), "rm", "options: not JSON"),
    ("loader_options_list", loader(options="[1, 2]"), "rm", "options: must be a JSON object"),
    ("loader_options_typo", loader(options='{"dtyp": "bfloat16"}'), "rm", "unknown option(s) ['dtyp']"),
    ("loader_options_type", loader(reward="hpsv2", options='{"batch_size": "8"}'), "rm",
     "option 'batch_size' of reward 'hpsv2' must be an integer"),
    ("loader_options_dtype", loader(options='{"dtype": "fp8"}'), "rm", "option 'dtype'"),
    ("loader_options_for_a_reward_without", loader(reward="demo_adherence", options='{"w": 1}'), "rm",
     "its options are: none"),
    ("state_run_name_dotdot", step(run={"run_name": "../x"}), "run", "run_name"),
    ("sampler_window_past_steps", step(tree={"steps": 4, "window_start": 3, "window_width": 2}), "tree", "window"),
    ("backup_unknown", step(adv={"backup": "max"}), "adv", "backup: 'max' is not one of"),
    ("backup_edge_baseline_unknown", step(adv={"edge_baseline": "parent"}), "adv", "edge_baseline: 'parent'"),
    ("state_checkpointing_unknown", step(run={"gradient_checkpointing": "maybe"}), "run", "gradient_checkpointing"),
    ("save_prefix_escapes", {**tcn.train_graph("bad_save", 1),
                             "save": {"class_type": "TreeGRPOSaveLoRA",
                                      "inputs": {"lora": ["train", 1], "filename_prefix": "../../x"}}},
     "save", "must be a relative name inside models/loras"),
    # checked when queued: the LoRA is saved after the training (a long name failed there, after hours)
    *[(f"save_prefix_{name}", {**tcn.train_graph("bad_save", 1),
                               "save": {"class_type": "TreeGRPOSaveLoRA",
                                        "inputs": {"lora": ["train", 1], "filename_prefix": prefix}}}, "save", fragment)
      for name, prefix, fragment in [
          ("windows_drive", "C:\\Users\\me\\lora", "must be a relative name inside models/loras"),
          ("folder_only", "treegrpo/", "ends in a folder or a hidden name"),
          ("hidden", "treegrpo/x/.", "ends in a folder or a hidden name"),
          ("device_name", "treegrpo/CON", "'CON' cannot be a file or folder name on Windows"),
          ("too_long", "treegrpo/" + "x" * 300, "use at most 200")]],
    ("state_run_name_windows_device", step(run={"run_name": "nul"}), "run", "cannot be a file name on Windows"),
]


@pytest.mark.parametrize("case,graph,node,fragment", VALIDATION_CASES, ids=[c[0] for c in VALIDATION_CASES])
def test_a_bad_widget_fails_validation_naming_it(rt, case, graph, node, fragment):
    v = rt.validate(graph)
    assert node in v.node_errors, (case, v.error, v.node_errors)
    messages = " | ".join(f"{e.get('message')}: {e.get('details')}" for e in v.node_errors[node]["errors"])
    assert fragment in messages, messages
    assert "Traceback" not in messages


def _execution_error(rt, graph) -> str:
    with pytest.raises(ch.ComfyExecutionError) as e:
        rt.execute(graph)
    err = e.value.result.error
    msg = err["exception_message"]
    assert "\n" not in msg.strip() and "Traceback" not in msg, msg
    return msg


def _sampling_started(rt, since: int) -> bool:
    return any((p.get("node") or p.get("node_id")) == "train" for p in rt.progress[since:])


EXECUTION_CASES = [
    # ComfyUI repeats a validate_inputs failure once per parameter it names, so the Train node and the Tree
    # Sampler check these first thing in execute instead (and ComfyUI 0.3.75 checks no V3 combo by itself)
    ("train_prompts_empty", train(prompts="\n  \n"), "prompts: no prompt given"),
    ("train_run_name_slash", train(run_name="a/b"), "run_name: use letters"),
    ("train_run_name_empty", train(run_name=""), "run_name: use letters"),
    ("train_run_name_dotdot", train(run_name=".."), "run_name: use letters"),
    ("train_run_name_spaces", train(run_name="été 2026 ✨"), "no spaces or other symbols"),
    ("train_scheduler_unknown", train(scheduler="cosine"), "scheduler: 'cosine' is not one of"),
    ("train_checkpointing_unknown", train(gradient_checkpointing="maybe"), "gradient_checkpointing: 'maybe'"),
    ("train_tail_solver_unknown", train(tail_solver="rk4"), "tail_solver: 'rk4'"),
    ("train_offload_unknown", train(offload_rewards="yes"), "offload_rewards: 'yes'"),
    # issue 51: schedule values bounded, a changed setting's way on, new choices checked
    ("train_tail_schedule_huge", train(tail_steps_schedule="[[0, 1000000000]]"), "tail_steps <= 1000"),
    ("train_lr_factor_huge", train(lr_factor_schedule="[[0, 1e300]]"), "a factor > 0 and <= 100"),
    ("train_existing_run_unknown", train(existing_run="replace"), "existing_run: 'replace' is not one of"),
    ("train_preset_unknown", train(preset="turbo"), "preset: 'turbo' is not one of"),
    ("sampler_scheduler_unknown", step(tree={"scheduler": "cosine"}), "scheduler: 'cosine' is not one of"),
    ("loader_file_missing", loader(reward="hpsv2", file="HPS_v2.1_compressed.pt"), "HPS_v2.1_compressed.pt"),
    ("loader_needs_files", loader(reward="pickscore"), "pickscore: no path given"),
    ("loader_file_for_a_reward_without", None, "needs no weight file"),
    ("train_same_reward_twice", {**train(), "rm2": {"class_type": "TreeGRPORewardModelLoader",
                                                      "inputs": {"reward": "demo_adherence", "file": NO_FILE}}},
     "reward_model and reward_model_2 are both 'demo_adherence'"),
    ("scorer_prompts_mismatch", step(score={"prompt": "a red circle\na blue square\na green triangle"}),
     "prompt"),
    # NaN passes ComfyUI's min/max comparison: the node refuses it, naming the input
    ("train_lr_nan", train(learning_rate=float("nan")), "learning_rate: nan is not a number to train with"),
    ("train_noise_nan", train(noise_level=float("nan")), "noise_level: nan is not a number"),
    ("train_artist_ask_unknown", train(artist_every=2, artist_ask="sometimes"), "artist_ask: 'sometimes'"),
    ("train_tail_schedule_not_json", train(tail_steps_schedule="0:1, 60:2"), "tail_steps_schedule: '0:1, 60:2' is not a JSON list"),
    ("train_tail_schedule_late_start", train(tail_steps_schedule="[[5, 1]]"), "TreeConfig.tail_steps_schedule: must start at iteration 0"),
    ("train_lr_schedule_zero_factor", train(lr_factor_schedule="[[0, 1], [2, 0]]"), "OptimConfig.lr_factor_schedule: entries must be"),
]


@pytest.mark.parametrize("case,graph,fragment", EXECUTION_CASES, ids=[c[0] for c in EXECUTION_CASES])
def test_what_only_execution_sees_fails_before_sampling(rt, request, case, graph, fragment):
    if case == "loader_file_for_a_reward_without":
        import folder_paths
        folder = Path(folder_paths.models_dir) / "reward_models"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stray.pt").write_bytes(b"x")
        graph = loader(reward="jpeg_compressibility", file="stray.pt")
        request.addfinalizer((folder / "stray.pt").unlink)
    if case == "train_same_reward_twice":
        graph["train"]["inputs"]["reward_model_2"] = ["rm2", 0]
    since = len(rt.progress)
    v = rt.validate(graph)
    if not v.ok:
        # refused before execution: by the node's own validate_inputs (its message), or, for the combos it leaves to
        # ComfyUI, by ComfyUI 0.33+'s own V3 combo check (0.3.75 has none), naming the value
        messages = json.dumps(v.node_errors)
        if fragment not in messages:
            assert ch.comfyui_version() != ch.FLOOR_VERSION, (case, v.node_errors)
            value = re.search(r"'([^']+)'", fragment).group(1) if "'" in fragment else fragment
            assert value in messages and "not in" in messages, messages
    else:
        assert fragment in _execution_error(rt, graph)
    assert not _sampling_started(rt, since)
    if case.startswith("train_"):
        assert not (Path(rt.base_dir) / "output" / "treegrpo" / "bad_input").exists()   # nothing written


def test_save_lora_into_a_folder_it_cannot_write_is_refused_when_queued(rt, monkeypatch):
    """The Save LoRA node (after the step graph's training) wrote into the first loras folder unchecked: a folder it
    cannot write raised a bare PermissionError after the work. It is refused when the prompt is queued, naming the
    folder and how to give ComfyUI another; a write that still fails says the LoRA is kept in the graph."""
    import folder_paths

    from treegrpo.comfyui.lora_files import save_to_loras

    root = Path(folder_paths.get_folder_paths("loras")[0])
    (root / "treegrpo").mkdir(parents=True, exist_ok=True)
    (root / "treegrpo" / "a_file").write_text("x")
    try:
        cls = rt.node_classes()["TreeGRPOSaveLoRA"]
        msg = cls.validate_inputs(filename_prefix="treegrpo/a_file/my_lora")
        assert isinstance(msg, str) and "cannot write in" in msg and "is a file" in msg and "is_default" in msg
        assert cls.validate_inputs(filename_prefix="treegrpo/fine/my_lora") is True
        assert not (root / "treegrpo" / "fine").exists()                  # the check creates nothing

        def denied(*a, **k):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr("tempfile.mkstemp", denied)                    # the folder became read-only meanwhile
        with pytest.raises(ValueError, match="queue the workflow again and ComfyUI runs only this node"):
            save_to_loras({"x.lora_up.weight": torch.zeros(1, 1)}, "treegrpo/denied/my_lora")
    finally:
        (root / "treegrpo" / "a_file").unlink()


def _in_front(graph: dict, *nodes: tuple[str, str, dict]) -> dict:
    """``graph`` with ``nodes`` (id, class, inputs but the model) chained between the model loader and the Train
    node."""
    src = ["d", 0]
    for nid, cls, inputs in nodes:
        graph[nid] = {"class_type": cls, "inputs": {"model": src, **inputs}}
        src = [nid, 0]
    graph["train"]["inputs"]["model"] = src
    return graph


def test_a_run_resumed_on_another_model_chain_is_refused_or_told(rt):
    """The Train node trains on the MODEL it is given, with what the nodes in front did to it (a LoRA, a sampling
    patch). A resume compared only the architecture: a run continued silently on top of its own LoRA, with another
    LoRA strength or another prediction. Other weights under the LoRA or another prediction are refused before any
    work, naming the change; another shift is said on the console; the LoRA's metadata says what it was trained
    on top of."""
    import logging

    from treegrpo.comfyui.watch import loras_folder

    run = "bad_input_chain"
    rt.execute(_in_front(train(run_name=run, iterations=1), ("ms", "ModelSamplingAuraFlow", {"shift": 2.0})))
    _, meta = read_lora_file(str(Path(loras_folder(run)) / f"{run}.safetensors"))
    chain = json.loads(meta["treegrpo.model_chain"])
    assert chain["sampling"] == "flow" and chain["schedule"]["shift"] == 2.0 and chain["on_top"]
    since = len(rt.progress)
    # the run's own LoRA loaded under it (what the user had in their everyday graph)
    own = f"treegrpo/{run}/{run}.safetensors"
    msg = _execution_error(rt, _in_front(train(run_name=run, iterations=2),
                                         ("ms", "ModelSamplingAuraFlow", {"shift": 2.0}),
                                         ("lo", "LoraLoaderModelOnly", {"lora_name": own, "strength_model": 1.0})))
    assert "trained on another model" in msg and "the weights under the LoRA: 0 weights patched" in msg
    assert "existing_run to 'new'" in msg and not _sampling_started(rt, since)
    # another shift: told, and it trains
    logs = []
    handler = logging.Handler()
    handler.emit = lambda rec: logs.append(rec.getMessage())
    logging.getLogger().addHandler(handler)
    try:
        rt.execute(_in_front(train(run_name=run, iterations=2), ("ms", "ModelSamplingAuraFlow", {"shift": 3.0})))
    finally:
        logging.getLogger().removeHandler(handler)
    assert any("continues with its noise schedule: " in line and "shift 2.0 -> 3.0" in line for line in logs), logs
    # another prediction (an eps sampling put on the flow model), refused
    msg = _execution_error(rt, _in_front(train(run_name=run, iterations=3),
                                         ("ms", "ModelSamplingDiscrete", {"sampling": "eps", "zsnr": False})))
    assert "its prediction flow -> eps" in msg
    # the plain model's LoRA says nothing of a chain (as before chains were recorded)
    rt.execute(train(run_name="bad_input_plain", iterations=1))
    assert "treegrpo.model_chain" not in read_lora_file(
        str(Path(loras_folder("bad_input_plain")) / "bad_input_plain.safetensors"))[1]


def test_a_step_run_whose_sampler_gets_another_model_is_refused(rt):
    """The step nodes' run keeps its LoRA between queued prompts: a Tree Sampler that got another prediction under
    it (an eps sampling put in front) in a later prompt went on training; it is refused, naming the change."""
    g = step(tree={"seed": 1})
    g["tree"]["inputs"]["run"] = ["run", 0]
    g["run"]["inputs"]["run_name"] = "bad_step_chain"
    rt.execute(g)
    g = json.loads(json.dumps(g))
    g["ms"] = {"class_type": "ModelSamplingDiscrete", "inputs": {"model": ["d", 0], "sampling": "eps",
                                                               "zsnr": False}}
    g["tree"]["inputs"].update(model=["ms", 0], seed=2)
    msg = _execution_error(rt, g)
    assert "its prediction flow -> eps" in msg and "another run_name" in msg


def test_an_x0_sampling_set_by_a_node_is_named_as_the_nodes_doing(rt):
    """ModelSamplingDiscrete set to x0 in front of the Train node was refused as if the family could not be trained
    ("cannot train SD1.x", listing EPS among the refused classes); the message now says a node in front did it and
    what to set instead, before any work."""
    since = len(rt.progress)
    msg = _execution_error(rt, _in_front(train(run_name="bad_input_x0", iterations=1),
                                         ("ms", "ModelSamplingDiscrete", {"sampling": "x0", "zsnr": False})))
    assert "a node in front of TreeGRPO" in msg and "predict x0" in msg
    assert "remove that node (the checkpoint itself predicts flow)" in msg and "eps" not in msg   # not for flow
    assert not _sampling_started(rt, since)


def test_a_float16_vae_on_the_cpu_is_said_before_training(rt):
    """ComfyUI started with --fp16-vae on a CPU: each decode of a leaf took ~160x longer (fp16 convolutions), the run
    looked hung after its first evaluation. The Train node says why first; bf16, fp32 or a GPU say nothing."""
    from types import SimpleNamespace

    from treegrpo.comfyui.runtime import slow_precision_note

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert "--fp16-vae" in slow_precision_note(SimpleNamespace(vae_dtype=torch.float16, device=cpu))
    for dtype, device in ((torch.bfloat16, cpu), (torch.float32, cpu), (torch.float16, gpu)):
        assert slow_precision_note(SimpleNamespace(vae_dtype=dtype, device=device)) is None
    assert slow_precision_note(None) is None                          # the demo model's pixel "VAE"


def test_resume_without_the_runs_checkpoints_is_refused_not_started_over(rt):
    """existing_run resume where the run's LoRAs are in models/loras but its run folder is not where ComfyUI now
    writes (started with another --output-directory) or gone: it started over silently (the old LoRAs moved aside);
    now it stops before any sampling, naming the folder it looked in and the ways on, and moves nothing."""
    import shutil

    from treegrpo.comfyui.watch import loras_folder

    run = "bad_input_lost_checkpoints"
    rt.execute(train(run_name=run, iterations=1))
    shutil.rmtree(Path(rt.base_dir) / "output" / "treegrpo" / run)
    loras = Path(loras_folder(run))
    before = sorted(p.relative_to(loras) for p in loras.rglob("*"))
    since = len(rt.progress)
    msg = _execution_error(rt, train(run_name=run, iterations=2))      # (not the same prompt: ComfyUI's cache)
    assert "no checkpoint to resume from" in msg and "--output-directory" in msg and "'overwrite'" in msg
    assert not _sampling_started(rt, since)
    assert sorted(p.relative_to(loras) for p in loras.rglob("*")) == before
    rt.execute(train(run_name=run, iterations=2, existing_run="overwrite"))       # the way on it names
    assert any(p.name.startswith("previous-") for p in loras.iterdir())
    # a run stopped before its first checkpoint (Cancel in iteration 1: its run folder kept, no checkpoint, its
    # iteration-0 best LoRA copied) starts afresh when queued again, as before
    shutil.rmtree(Path(rt.base_dir) / "output" / "treegrpo" / run / "checkpoints")
    rt.execute(train(run_name=run, iterations=3))
    assert (Path(rt.base_dir) / "output" / "treegrpo" / run / "checkpoints").is_dir()


def test_a_train_node_run_continued_with_other_settings_is_refused_untouched(rt):
    """The Train node resumes a run by its name: with other training settings it would not go on learning what it
    began to, so the node stops before any sampling, names the settings, and changes no file of the run."""
    run = "bad_input_resume"
    rt.execute(train(run_name=run, iterations=1))
    folder = Path(rt.base_dir) / "output" / "treegrpo" / run
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".treegrpo.lock"}
    since = len(rt.progress)
    msg = _execution_error(rt, train(run_name=run, iterations=2, learning_rate=5e-3, seed=7))
    assert "optim.lr: 0.001 -> 0.005" in msg and "seed: 0 -> 7" in msg
    assert "existing_run to 'new'" in msg and "'overwrite'" in msg      # the node's two ways on
    assert not _sampling_started(rt, since)
    after = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".treegrpo.lock"}
    assert after == before
    # the budget may change: one more iteration continues the run
    rt.execute(train(run_name=run, iterations=2))
    assert len(json.loads((folder / "log.json").read_text())["train"]) == 2


def test_a_train_node_run_of_another_base_model_is_refused_to_resume_and_overwritten_on_request(rt):
    """The same run_name queued with another checkpoint (its folder's run.json names the model it trained on): with
    existing_run 'resume' the node stops before any sampling, says why and names its two ways on, and changes no
    file; with 'overwrite' it trains, the earlier run's files and run.json in ``previous-<time>/``."""
    run = "bad_input_other_model"
    rt.execute(train(run_name=run, iterations=1))
    folder = Path(rt.base_dir) / "output" / "treegrpo" / run
    owner = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps(dict(owner, base_model="SDXL/SDXL/2567463684")))  # its model then
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".treegrpo.lock"}
    since = len(rt.progress)
    msg = _execution_error(rt, train(run_name=run, iterations=2))
    assert "was trained on 'SDXL/SDXL/2567463684'" in msg and "existing_run to 'new'" in msg and "'overwrite'" in msg
    assert not _sampling_started(rt, since)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".treegrpo.lock"} == before
    rt.execute(train(run_name=run, iterations=1, existing_run="overwrite"))
    (moved,) = folder.glob("previous-*")
    assert json.loads((moved / "run.json").read_text())["base_model"] == "SDXL/SDXL/2567463684"
    assert json.loads((folder / "run.json").read_text()) == owner
    assert len(json.loads((folder / "log.json").read_text())["train"]) == 1


def test_the_node_catalogue_with_the_cli_one_is_wide():
    import test_bad_input as cli_cases
    cli = len(cli_cases.CONFIG_CASES) + len(cli_cases.FILE_CASES)
    nodes = len(VALIDATION_CASES) + len(EXECUTION_CASES) + 1
    assert nodes >= 25 and cli + nodes >= 80, (cli, nodes)
