"""The first real run, through a real ComfyUI server (main.py, the pack in custom_nodes), as the web UI sends it:
the shipped demo workflow queued from its JSON, runs started one after another (``existing_run``: resume refuses a
changed setting and names the choices; ``new`` trains a numbered run beside the old one, which stays byte for byte;
``overwrite`` moves the old files aside), a run one can watch (a console line per iteration, every evaluation's grid
in the run folder, LoRAs where LoraLoader lists them, the final curve and before/after grid) and the LoRA loaded by
``compare_base_vs_lora``. Also the Prompt List node on the three file formats and its errors."""
import json
from pathlib import Path

import pytest

import comfy_harness as ch

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"


def _api(comfyui_pack, name: str) -> dict:
    return ch.workflow_to_api(json.loads((WORKFLOWS / f"{name}.json").read_text()), comfyui_pack.node_classes())


def _demo(comfyui_pack, run_name: str, **train) -> dict:
    api = _api(comfyui_pack, "treegrpo_demo_cpu")
    for node in api.values():
        if node["class_type"] == "TreeGRPOTrain":
            node["inputs"].update(iterations=3, eval_every=2, prompts_per_iteration=4, run_name=run_name, **train)
        if node["class_type"] == "TreeGRPOSaveLoRA":
            node["inputs"]["filename_prefix"] = f"treegrpo/{run_name}/{run_name}_saved"
    return api


def _run(srv, api, check=True):
    return ch.wait_history(srv.port, ch.post_prompt(srv.port, api), timeout=600, check=check)


def _lora_choices(srv) -> list:
    info = ch.object_info(srv.port, "LoraLoaderModelOnly")["LoraLoaderModelOnly"]
    return info["input"]["required"]["lora_name"][0]


def test_runs_one_after_another_can_be_watched_and_loaded(comfyui_pack, comfyui_server):
    srv = comfyui_server
    out, loras = Path(srv.base_dir) / "output" / "treegrpo", Path(srv.base_dir) / "models" / "loras" / "treegrpo"
    run = "first_run"
    _run(srv, _demo(comfyui_pack, run, save_every=2))
    folder = out / run
    # watched: one console line per iteration, evaluation grids at 0 and 2 (and the last, 3), figures at the end
    lines = [ln for ln in srv.log_text().splitlines() if f"TreeGRPO {run}: it " in ln]
    assert [ln.split(": it ", 1)[1].split(" |", 1)[0] for ln in lines] == ["1/3", "2/3", "3/3"], lines
    assert all(" | reward " in ln and " | judge " in ln and " | KL " in ln and " left" in ln for ln in lines), lines
    assert sorted(p.name for p in (folder / "evals").glob("*.png")) == \
        ["eval_000000.png", "eval_000002.png", "eval_000003.png"]
    assert (folder / "reward_curve.png").is_file() and (folder / "samples_before_after.png").is_file()
    # LoRAs where LoraLoader lists them: every save_every iterations, the best, the last
    listed = _lora_choices(srv)
    for name in (f"{run}.safetensors", f"{run}_it000002.safetensors", f"{run}_best.safetensors"):
        assert (loras / run / name).is_file(), name
        assert f"treegrpo/{run}/{name}" in listed, (name, listed)
    first_lora = (loras / run / f"{run}.safetensors").read_bytes()

    # the same run again with a changed setting: resume refuses before any work, naming the two other choices
    entry = _run(srv, _demo(comfyui_pack, run, learning_rate=1e-3), check=False)
    assert entry["status"]["status_str"] == "error"
    text = json.dumps(entry["status"]["messages"])
    assert "other settings" in text and "existing_run" in text and "'new'" in text and "'overwrite'" in text, text
    # new: a numbered run beside it; the first run's files are untouched
    _run(srv, _demo(comfyui_pack, run, learning_rate=1e-3, existing_run="new"))
    assert (loras / f"{run}-2" / f"{run}-2.safetensors").is_file()
    assert (out / f"{run}-2" / "evals" / "eval_000003.png").is_file()
    assert (loras / run / f"{run}.safetensors").read_bytes() == first_lora
    assert any(f"TreeGRPO {run}-2: it 3/3" in ln for ln in srv.log_text().splitlines())
    # overwrite: the old files (LoRAs, logs, figures, evaluation grids) move to previous-<time>/ in its folder and
    # its LoRAs to previous-<time>/ in its LoRA folder, where LoraLoader still lists them; the run trains afresh
    first_best = (loras / run / f"{run}_best.safetensors").read_bytes()
    _run(srv, _demo(comfyui_pack, run, learning_rate=1e-3, existing_run="overwrite"))
    moved = list(folder.glob("previous-*"))
    assert len(moved) == 1 and (moved[0] / f"{run}.safetensors").is_file(), list(folder.iterdir())
    for rel in (f"{run}_best.safetensors", "log.json", "reward_curve.png", "samples_before_after.png",
                "evals/eval_000002.png"):
        assert (moved[0] / rel).is_file(), rel
    assert len(json.loads((folder / "log.json").read_text())["train"]) == 3
    (kept,) = (loras / run).glob("previous-*")
    assert (kept / f"{run}.safetensors").read_bytes() == first_lora
    assert (kept / f"{run}_best.safetensors").read_bytes() == first_best
    assert (kept / f"{run}_it000002.safetensors").is_file()
    assert not (loras / run / f"{run}_it000002.safetensors").exists()
    assert (loras / run / f"{run}.safetensors").read_bytes() != first_lora          # the new run's (another lr)
    assert f"treegrpo/{run}/{kept.name}/{run}.safetensors" in _lora_choices(srv)

    # compare_base_vs_lora loads the trained LoRA from LoraLoader's list
    api = _api(comfyui_pack, "compare_base_vs_lora")
    for node in api.values():
        if node["class_type"] == "LoraLoaderModelOnly":
            node["inputs"]["lora_name"] = f"treegrpo/{run}/{run}.safetensors"
    entry = _run(srv, api)
    assert sum(1 for o in entry["outputs"].values() if o.get("images")) >= 2


def test_the_real_model_workflows_have_their_own_runs(comfyui_pack):
    names = ["treegrpo_sd15_lora", "treegrpo_sdxl_lora", "treegrpo_sd35_lora", "treegrpo_flux_lora",
             "treegrpo_qwen_image_lora", "treegrpo_zimage_lora", "treegrpo_wan22_t2v_lora"]
    runs, prefixes = set(), set()
    for name in names:
        api = _api(comfyui_pack, name)
        train = next(n["inputs"] for n in api.values() if n["class_type"] == "TreeGRPOTrain")
        save = next(n["inputs"] for n in api.values() if n["class_type"] == "TreeGRPOSaveLoRA")
        runs.add(train["run_name"])
        prefixes.add(save["filename_prefix"])
        assert train["existing_run"] == "resume" and train["kl_beta"] == pytest.approx(0.1) and train["save_every"] > 0
    assert len(runs) == len(names) and len(prefixes) == len(names), (runs, prefixes)


# ---------------------------------------------------------------------------------------------- the Prompt List
@pytest.fixture()
def input_dir(comfyui_pack):
    import folder_paths
    d = Path(folder_paths.get_input_directory()) / "treegrpo_prompt_tests"
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_prompt_list_reads_txt_csv_jsonl_and_holds_out(comfyui_pack, input_dir):
    (input_dir / "p.txt").write_text("a red circle\n\n  a blue   square \na (green:1.2) cross\n")
    (input_dir / "p.csv").write_text('id,prompt\n1,"a red circle, big"\n2,a blue square\n')
    (input_dir / "p.jsonl").write_text('{"prompt": "a red circle"}\n\n"a blue square"\n{"text": "a cat"}\n')
    cls = comfyui_pack.node_classes()["TreeGRPOPromptList"]
    choices = cls.define_schema().inputs[0].options
    for f in ("p.txt", "p.csv", "p.jsonl"):
        assert f"treegrpo_prompt_tests/{f}" in choices
    assert "treegrpo/general_subjects.txt" in choices and "treegrpo/text_rendering.txt" in choices
    out = cls.execute("treegrpo_prompt_tests/p.txt", 0, 0)
    assert out.result[0].splitlines() == ["a red circle", "a blue square", "a (green:1.2) cross"]
    assert out.result[1] == "" and out.result[2] == 3
    assert cls.execute("treegrpo_prompt_tests/p.csv", 0, 0).result[0].splitlines() == ["a red circle, big",
                                                                                       "a blue square"]
    assert cls.execute("treegrpo_prompt_tests/p.jsonl", 0, 0).result[0].splitlines() == ["a red circle",
                                                                                         "a blue square", "a cat"]
    train, held, n = cls.execute("treegrpo/general_subjects.txt", 5, 3).result
    train, held = train.splitlines(), held.splitlines()
    assert n == 45 and len(held) == 5 and not set(train) & set(held)
    assert cls.execute("treegrpo/general_subjects.txt", 5, 3).result[1].splitlines() == held   # the seed decides


def test_prompt_list_refuses_missing_empty_and_reads_a_long_file(comfyui_pack, input_dir):
    cls = comfyui_pack.node_classes()["TreeGRPOPromptList"]
    msg = cls.validate_inputs(file="treegrpo_prompt_tests/nope.txt")
    assert isinstance(msg, str) and "input/ folder" in msg and "nope.txt" in msg
    assert "outside" in cls.validate_inputs(file="../../etc/passwd.txt")
    (input_dir / "empty.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="holds no prompts"):
        cls.execute("treegrpo_prompt_tests/empty.txt", 0, 0)
    (input_dir / "bad.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        cls.execute("treegrpo_prompt_tests/bad.jsonl", 0, 0)
    (input_dir / "long.txt").write_text("".join(f"prompt number {i}\n" for i in range(10000)))
    train, held, n = cls.execute("treegrpo_prompt_tests/long.txt", 100, 0).result
    assert n == 9900 and len(held.splitlines()) == 100
    with pytest.raises(ValueError, match="hold out fewer"):
        cls.execute("treegrpo_prompt_tests/p.txt" if (input_dir / "p.txt").exists() else
                    "treegrpo_prompt_tests/long.txt", 10 ** 5, 0)


def test_prompt_list_follows_links_the_user_put_in_input(comfyui_pack, input_dir, tmp_path):
    """A prompt file or folder kept elsewhere and linked into input/ (as shared folders are): listed, and read when
    chosen (it was listed, then refused as 'outside input/'); a link that loops is listed once; '..' stays refused."""
    shared = tmp_path / "shared prompts é"
    (shared / "sub").mkdir(parents=True)
    (shared / "été.txt").write_text("a red circle\n")
    (shared / "sub" / "deep.txt").write_text("a blue square\n")
    (shared / "sub" / "loop").symlink_to(shared, target_is_directory=True)
    for link, target in (("linked file.txt", shared / "été.txt"), ("linked folder", shared)):
        (input_dir / link).unlink(missing_ok=True)
        (input_dir / link).symlink_to(target)
    cls = comfyui_pack.node_classes()["TreeGRPOPromptList"]
    choices = cls.define_schema().inputs[0].options
    for name, want in (("treegrpo_prompt_tests/linked file.txt", "a red circle"),
                       ("treegrpo_prompt_tests/linked folder/sub/deep.txt", "a blue square")):
        assert name in choices and cls.validate_inputs(file=name) is True
        assert cls.execute(name, 0, 0).result[0] == want
    assert sum(c.endswith("/deep.txt") for c in choices if "linked folder" in c) == 1      # not again by the loop
    assert "outside" in cls.validate_inputs(file="treegrpo_prompt_tests/linked folder/../../../x.txt")


def test_a_reward_models_entry_in_extra_model_paths_keeps_models_reward_models(comfyui_pack, tmp_path):
    """ComfyUI reads extra_model_paths.yaml before it loads the pack: a ``reward_models:`` entry there registered the
    folder with the extra path alone, hiding models/reward_models (where the README puts the files) and writing the
    taste model where the loader did not look. Both are listed, models/reward_models first, and the taste model
    goes to the first."""
    import folder_paths

    from treegrpo.comfyui.artist.taste import taste_file
    from treegrpo.comfyui.reward_files import FOLDER, all_reward_files, register_model_folder

    own = Path(folder_paths.models_dir) / FOLDER
    extra = tmp_path / "shared models" / FOLDER
    extra.mkdir(parents=True)
    (extra / "external_hps.pt").write_bytes(b"x")
    own.mkdir(parents=True, exist_ok=True)
    (own / "own_hps.pt").write_bytes(b"x")
    saved = folder_paths.folder_names_and_paths.pop(FOLDER)
    try:
        folder_paths.add_model_folder_path(FOLDER, str(extra))           # what ComfyUI does with the yaml entry
        register_model_folder()
        register_model_folder()                                          # (again: no change)
        assert folder_paths.get_folder_paths(FOLDER) == [str(own), str(extra)]
        assert {"external_hps.pt", "own_hps.pt"} <= set(all_reward_files())
        assert Path(taste_file("folders_test")).parent == own
    finally:
        folder_paths.folder_names_and_paths[FOLDER] = saved
        folder_paths.filename_list_cache.pop(FOLDER, None)
        (own / "own_hps.pt").unlink()


# ------------------------------------------------------------------ the SD1.5 workflow on a real-format checkpoint
SITE = """
import sys
sys.path.insert(0, {tests!r})
import reward_fixtures
reward_fixtures.register_tiny_configs()     # the tiny open_clip architecture of the tiny HPS file
"""


@pytest.fixture(scope="module")
def user_comfyui(comfyui_pack, comfyui_dir, tmp_path_factory):
    """A ComfyUI server as a user has it: a single-file SD1.5 checkpoint in models/checkpoints (real format, random
    weights), an HPS v2.1 file in models/reward_models (real format, a tiny CLIP inside), a prompt file in input/."""
    import real_checkpoints
    import reward_fixtures as rf

    base = ch.prepare_base_dir(tmp_path_factory.mktemp("user_comfyui"), ch.REPO_ROOT)
    real_checkpoints.save_sd15_checkpoint(str(base / "models" / "checkpoints" / "my_sd15.safetensors"))
    (base / "models" / "reward_models").mkdir(parents=True, exist_ok=True)
    rf.make_hps_file(str(base / "models" / "reward_models"))
    (base / "input" / "my_prompts.txt").write_text("a red apple\na green pear\na (blue:1.3) plum\na yellow lemon\n")
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(SITE.format(tests=str(Path(__file__).resolve().parents[1])))
    srv = ch.start_server(base, comfy_dir=comfyui_dir, pack_dir=ch.REPO_ROOT, env={"PYTHONPATH": str(site)})
    try:
        yield srv
    finally:
        srv.stop()


def _sd15_workflow(comfyui_pack, **train) -> dict:
    import reward_fixtures as rf
    api = _api(comfyui_pack, "treegrpo_sd15_lora")
    for node in api.values():
        inputs, kind = node["inputs"], node["class_type"]
        if kind == "CheckpointLoaderSimple":
            inputs["ckpt_name"] = "my_sd15.safetensors"
        elif kind == "TreeGRPOPromptList":
            inputs.update(file="my_prompts.txt", eval_count=1)
        elif kind == "TreeGRPORewardModelLoader":
            inputs["options"] = json.dumps({"arch": rf.TINY_HPS})
        elif kind == "TreeGRPOTrain":          # the shipped settings, at 64 px and two iterations
            inputs.update({"width": 64, "height": 64, "iterations": 2, "eval_every": 1, "save_every": 1, **train})
    return api


def test_the_sd15_workflow_on_a_single_file_checkpoint_as_a_user_runs_it(comfyui_pack, user_comfyui):
    srv, run = user_comfyui, "treegrpo_sd15"
    base = Path(srv.base_dir)
    entry = _run(srv, _sd15_workflow(comfyui_pack))
    log = srv.log_text()
    lines = [ln for ln in log.splitlines() if f"TreeGRPO {run}: it " in ln]
    assert [ln.split(": it ", 1)[1].split(" |", 1)[0] for ln in lines] == ["1/2", "2/2"], log[-3000:]
    folder, loras = base / "output" / "treegrpo" / run, base / "models" / "loras" / "treegrpo" / run
    assert sorted(p.name for p in (folder / "evals").glob("*.png")) == \
        ["eval_000000.png", "eval_000001.png", "eval_000002.png"]
    assert (folder / "samples_before_after.png").is_file()
    saved = sorted(p.name for p in loras.glob("*.safetensors"))
    assert {f"{run}.safetensors", f"{run}_it000001.safetensors", f"{run}_it000002.safetensors"} <= set(saved), saved
    assert f"treegrpo/{run}/{run}.safetensors" in _lora_choices(srv)
    assert any(o.get("images") for o in entry["outputs"].values())
    # it trained: the LoRA's up matrices, zero at the start, moved
    from treegrpo.lora import read_lora_file
    ups = [t for k, t in read_lora_file(str(loras / f"{run}.safetensors"))[0].items() if "lora_up" in k]
    assert ups and max(float(t.abs().max()) for t in ups) > 0
    # the held-out prompt was evaluated and never trained on; the rewards read it without the weighting syntax
    train_log = json.loads((folder / "log.json").read_text())
    assert len(train_log["train"]) == 2 and len(train_log["eval"]) == 3
    # the LoRA loads onto the same checkpoint with every key (ComfyUI names the keys it cannot place)
    before = len(srv.log_text())
    graph = {
        "ckpt": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "my_sd15.safetensors"}},
        "lora": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["ckpt", 0], "strength_model": 1.0,
                                                                  "lora_name": f"treegrpo/{run}/{run}.safetensors"}},
        "pos": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["ckpt", 1], "text": "a red apple"}},
        "neg": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["ckpt", 1], "text": ""}},
        "lat": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "ks": {"class_type": "KSampler", "inputs": {"model": ["lora", 0], "positive": ["pos", 0], "negative": ["neg", 0],
                                                   "latent_image": ["lat", 0], "seed": 1, "steps": 2, "cfg": 4.5,
                                                   "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "dec": {"class_type": "VAEDecode", "inputs": {"samples": ["ks", 0], "vae": ["ckpt", 2]}},
        "show": {"class_type": "PreviewImage", "inputs": {"images": ["dec", 0]}},
    }
    _run(srv, graph)
    assert "lora key not loaded" not in srv.log_text()[before:], srv.log_text()[before:][-2000:]
    # the same LoRA for diffusers in the run folder (not where LoraLoader lists it), every layer in the checkpoint's
    # UNet as diffusers builds it
    twin = folder / f"{run}_diffusers.safetensors"
    assert twin.is_file() and (folder / f"{run}_best_diffusers.safetensors").is_file()
    assert not [n for n in _lora_choices(srv) if "diffusers" in n]
    assert f"for diffusers' load_lora_weights: {run}_diffusers.safetensors" in srv.log_text()
    unet = _diffusers_unet_of_my_sd15()
    import diffusers
    pipe = diffusers.StableDiffusionPipeline(vae=None, text_encoder=None, tokenizer=None, unet=unet, scheduler=None,
                                             safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.load_lora_weights(str(twin))
    adapted = [n for n, m in unet.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)]
    comfy_layers = {k.rsplit(".lora_up", 1)[0] for k in read_lora_file(str(loras / f"{run}.safetensors"))[0]
                    if ".lora_up." in k}
    assert len(adapted) == len(comfy_layers) > 0      # SD1.5 has no fused layers: one diffusers layer per ComfyUI one
    # a second run of the same workflow with a changed setting, as a new numbered run beside the first
    _run(srv, _sd15_workflow(comfyui_pack, learning_rate=1e-4, existing_run="new"))
    assert (base / "models" / "loras" / "treegrpo" / f"{run}-2" / f"{run}-2.safetensors").is_file()
    assert any(f"TreeGRPO {run}-2: it 2/2" in ln for ln in srv.log_text().splitlines())


def _diffusers_unet_of_my_sd15():
    """The diffusers UNet of ``real_checkpoints``' SD1.5 layout (one level of 320 channels, CLIP-L's 768, 8 heads)."""
    import diffusers
    return diffusers.UNet2DConditionModel(sample_size=8, block_out_channels=(320,), layers_per_block=1,
                                          down_block_types=("CrossAttnDownBlock2D",),
                                          up_block_types=("CrossAttnUpBlock2D",), cross_attention_dim=768,
                                          attention_head_dim=8)


def test_the_ocr_reward_trains_from_the_graph_and_refuses_prompts_without_text(comfyui_pack, user_comfyui):
    """The OCR workflow's reward and prompt set (treegrpo_sd35_ocr_lora: the ocr reward, the shipped text-rendering
    prompts) on the user's SD1.5 checkpoint through the real server: one iteration trains and evaluates with the real
    OCR model; the same graph with prompts that quote no text stops before any work, naming the reward and a prompt."""
    pytest.importorskip("rapidocr")
    ocr = _api(comfyui_pack, "treegrpo_sd35_ocr_lora")
    loader = next(n for n in ocr.values() if n["class_type"] == "TreeGRPORewardModelLoader")["inputs"]
    plist = next(n for n in ocr.values() if n["class_type"] == "TreeGRPOPromptList")["inputs"]
    assert loader["reward"] == "ocr" and plist["file"] == "treegrpo/text_rendering.txt"
    srv, run = user_comfyui, "treegrpo_ocr_graph"
    api = _sd15_workflow(comfyui_pack, iterations=1, save_every=0, run_name=run, prompts_per_iteration=1)
    for node in api.values():
        if node["class_type"] == "TreeGRPORewardModelLoader":
            node["inputs"].update(reward="ocr", file=loader["file"], options="{}")    # as the web UI sets it
        elif node["class_type"] == "TreeGRPOPromptList":
            node["inputs"].update(file=plist["file"], eval_count=1)
        elif node["class_type"] == "TreeGRPOSaveLoRA":
            node["inputs"]["filename_prefix"] = f"treegrpo/{run}/{run}_saved"
    _run(srv, api)
    log = json.loads((Path(srv.base_dir) / "output" / "treegrpo" / run / "log.json").read_text())
    assert len(log["train"]) == 1 and "reward/ocr" in log["train"][0], log["train"][0].keys()
    assert 0.0 <= log["train"][0]["reward/ocr"] <= 1.0 and len(log["eval"]) == 2
    for node in api.values():
        if node["class_type"] == "TreeGRPOPromptList":
            node["inputs"]["file"] = "my_prompts.txt"
        elif node["class_type"] == "TreeGRPOTrain":
            node["inputs"]["run_name"] = run + "_plain"
    before = len(srv.log_text())
    entry = _run(srv, api, check=False)
    text = json.dumps(entry["status"]["messages"])
    assert entry["status"]["status_str"] == "error" and "reward 'ocr'" in text and "quote none" in text, text
    assert "TreeGRPO " + run + "_plain: it " not in srv.log_text()[before:]
    assert not (Path(srv.base_dir) / "output" / "treegrpo" / (run + "_plain") / "log.json").exists()
