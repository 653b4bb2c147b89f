"""Every shipped workflow converts to the API format with the live node registry and validates in a real
ComfyUI (model files may be missing, nothing else); the CPU demo workflow runs end to end."""
import json
from pathlib import Path

import pytest

import comfy_harness as ch

WORKFLOWS = sorted((Path(__file__).resolve().parents[2] / "workflows").glob("*.json"))
MODEL_FILE_INPUTS = {"ckpt_name", "unet_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "lora_name", "file"}


def test_all_expected_workflows_are_shipped():
    names = {p.stem for p in WORKFLOWS}
    assert names >= {"treegrpo_demo_cpu", "treegrpo_sd15_lora", "treegrpo_sdxl_lora", "treegrpo_sd35_lora",
                     "treegrpo_flux_lora", "treegrpo_step_by_step", "compare_base_vs_lora",
                     "treegrpo_qwen_image_lora", "treegrpo_zimage_lora", "treegrpo_wan22_t2v_lora"}


def test_family_workflows_set_what_their_family_needs(comfyui_pack):
    """Wan 2.2: 33-frame videos, frames scored 8 apart, CFG with a negative prompt, shift 8; Qwen-Image: CFG and
    shift 3.1 through ModelSamplingAuraFlow; Z-Image Turbo: 8 steps without CFG; each text encoder through
    ComfyUI's own CLIPLoader with its family's type."""
    def nodes(name):
        wf = json.loads((Path(__file__).resolve().parents[2] / "workflows" / f"{name}.json").read_text())
        api = ch.workflow_to_api(wf, comfyui_pack.node_classes())
        return {n["class_type"]: n["inputs"] for n in api.values()}

    wan, qwen, zimage = nodes("treegrpo_wan22_t2v_lora"), nodes("treegrpo_qwen_image_lora"), nodes("treegrpo_zimage_lora")
    assert (wan["CLIPLoader"]["type"], qwen["CLIPLoader"]["type"], zimage["CLIPLoader"]["type"]) == \
        ("wan", "qwen_image", "lumina2")
    t = wan["TreeGRPOTrain"]
    assert (t["frames"], t["reward_frames"], t["frame_stride"], t["cfg"]) == (33, 4, 8, 5.0) and t["negative"]
    assert wan["ModelSamplingSD3"]["shift"] == 8.0
    assert qwen["ModelSamplingAuraFlow"]["shift"] == 3.1 and qwen["TreeGRPOTrain"]["cfg"] == 2.5
    assert (zimage["TreeGRPOTrain"]["steps"], zimage["TreeGRPOTrain"]["cfg"]) == (8, 1.0)
    for n in (wan, qwen, zimage):
        assert n["TreeGRPOTrain"]["lora_targets"] == "auto"


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_workflow_converts_and_validates(comfyui_pack, path):
    wf = json.loads(path.read_text())
    assert any(n["type"] == "Note" for n in wf["nodes"]), "every workflow explains itself in a Note"
    api = ch.workflow_to_api(wf, comfyui_pack.node_classes())
    v = comfyui_pack.validate(api)
    problems = []
    for node_id, err in (v.node_errors or {}).items():
        for e in err["errors"]:
            name = (e.get("extra_info") or {}).get("input_name")
            if e["type"] == "value_not_in_list" and name in MODEL_FILE_INPUTS:
                continue  # the user's model files are not on this machine
            problems.append((node_id, err["class_type"], e["type"], e.get("details")))
    assert not problems, problems
    if not v.node_errors:
        assert v.ok, v.error


@pytest.mark.slow
def test_demo_workflow_runs_end_to_end_and_writes_a_lora(comfyui_pack):
    wf = json.loads((Path(__file__).resolve().parents[2] / "workflows" / "treegrpo_demo_cpu.json").read_text())
    api = ch.workflow_to_api(wf, comfyui_pack.node_classes())
    for node in api.values():  # keep the test short: fewer iterations, otherwise the shipped graph
        if node["class_type"] == "TreeGRPOTrain":
            node["inputs"].update(iterations=3, eval_every=3, run_name="wf_demo")
    r = comfyui_pack.execute(api)
    saved = [o["text"][0] for o in r.outputs.values() if "text" in o and o["text"][0].startswith("saved ")]
    assert saved and Path(saved[0].split("saved ", 1)[1]).exists()
    previews = [nid for nid, o in r.outputs.items() if o.get("images")]
    assert len(previews) >= 3  # reward curve, sample grid, tree preview


def test_step_by_step_workflow_queued_twice_trains_two_iterations_on_its_one_prompt(comfyui_pack):
    """The shipped step graph as queued: its String node feeds CLIPTextEncode, the Tree Sampler and the Reward
    Scorer; two queues are the run's iterations 0 and 1, and the LoRA lands where LoraLoader lists it."""
    import folder_paths

    wf = json.loads((Path(__file__).resolve().parents[2] / "workflows" / "treegrpo_step_by_step.json").read_text())
    api = ch.workflow_to_api(wf, comfyui_pack.node_classes())
    prompt = next(n for n in api.values() if n["class_type"] == "PrimitiveString")
    prompt["inputs"]["value"] = "a green square"          # typed once
    uses = [(n["class_type"], k) for n in api.values() for k, v in n["inputs"].items()
            if isinstance(v, list) and api[v[0]] is prompt]
    assert sorted(uses) == [("CLIPTextEncode", "text"), ("TreeGRPORewardScorer", "prompt"),
                            ("TreeGRPOTreeSampler", "prompt")], uses
    state = next(n["inputs"] for n in api.values() if n["class_type"] == "TreeGRPOTrainerState")
    state["run_name"] = "wf_steps"
    stats = []
    for _ in range(2):
        r = comfyui_pack.execute(json.loads(json.dumps(api)))
        stats += [json.loads(o["text"][0]) for o in r.outputs.values()
                  if "text" in o and o["text"][0].lstrip().startswith("{") and "iteration" in o["text"][0]]
    assert [s["iteration"] for s in stats] == [0, 1], stats
    log = json.loads((Path(comfyui_pack.base_dir) / "output" / "treegrpo" / "wf_steps" / "log.json").read_text())
    assert [r["iteration"] for r in log["train"]] == [0, 1]
    assert "treegrpo/wf_steps/wf_steps.safetensors" in folder_paths.get_filename_list("loras")


def test_a_workflow_saved_by_an_earlier_version_keeps_its_widget_values(comfyui_pack):
    """The demo workflow as the pack saved it on 2026-11-30 (commit db82215: 26 Train widgets, gradient_checkpointing
    still a boolean; today's node has 46): it converts, validates, and each widget it had keeps its value — the
    inputs added since come last on the node and take their defaults."""
    path = Path(__file__).resolve().parents[1] / "fixtures" / "workflows" / "treegrpo_demo_cpu_db82215.json"
    wf = json.loads(path.read_text())
    api = ch.workflow_to_api(wf, comfyui_pack.node_classes())
    v = comfyui_pack.validate(api)
    assert not v.node_errors and v.ok, (v.node_errors, v.error)
    train = next(n["inputs"] for n in api.values() if n["class_type"] == "TreeGRPOTrain")
    saved = next(n["widgets_values"] for n in wf["nodes"] if n["type"] == "TreeGRPOTrain")
    assert len(saved) == 26 and train["prompts"] == saved[0]
    assert (train["iterations"], train["prompts_per_iteration"], train["lora_rank"], train["lora_alpha"],
            train["learning_rate"], train["run_name"], train["eval_every"]) == (100, 24, 8, 16.0, 0.003,
                                                                                "treegrpo_demo", 10)
    assert (train["antithetic"], train["gradient_checkpointing"], train["tail_solver"], train["tail_steps"]) == \
        (True, False, "dpmpp_2m", 3)                       # the old boolean: the node reads False as "auto"
    assert not {"artist_every", "kl_beta", "preset", "existing_run"} & set(train)   # added since: defaults
