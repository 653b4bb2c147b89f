"""The step nodes train exactly like the Train node: two iterations queued step by step through the real server
give the same LoRA tensors as the Train node run for two iterations with the same seed and settings."""
import json

import comfy_harness as ch
from behaviour_fixture import lora_digest
from treegrpo.config import OptimConfig
from treegrpo.lora import read_lora_file

PROMPT = "a red circle"
NO_FILE = "(none: built-in weights or none needed)"
SHAPE = dict(steps=6, window_start=1, window_width=2, branch=2, noise_level=0.7, window_schedule="fixed",
             antithetic=True)
LORA = dict(lora_rank=4, lora_alpha=4.0, learning_rate=1e-2)


def step_graph(run_name: str) -> dict:
    return {
        "d": {"class_type": "TreeGRPOLoadDemoModel", "inputs": {}},
        "pos": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["d", 1], "text": PROMPT}},
        "neg": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["d", 1], "text": ""}},
        "empty": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 3, "color": 0}},
        "lat": {"class_type": "VAEEncode", "inputs": {"pixels": ["empty", 0], "vae": ["d", 2]}},
        "run": {"class_type": "TreeGRPOTrainerState", "inputs": {
            "run_name": run_name, **LORA, "clip_range": 1e-4, "kl_beta": OptimConfig().kl_beta, "seed": 0,
            "gradient_checkpointing": "off"}},
        "tree": {"class_type": "TreeGRPOTreeSampler", "inputs": {
            "model": ["d", 0], "positive": ["pos", 0], "negative": ["neg", 0], "latent": ["lat", 0], "seed": 0,
            "cfg": 1.0, "scheduler": "simple", **SHAPE, "trees_per_latent": 1, "prompt": PROMPT,
            "run": ["run", 0]}},
        "img": {"class_type": "VAEDecode", "inputs": {"samples": ["tree", 1], "vae": ["d", 2]}},
        "rm": {"class_type": "TreeGRPORewardModelLoader", "inputs": {"reward": "demo_adherence", "file": NO_FILE}},
        "score": {"class_type": "TreeGRPORewardScorer", "inputs": {
            "images": ["img", 0], "reward_model": ["rm", 0], "prompt": PROMPT, "weight": 1.0}},
        "adv": {"class_type": "TreeGRPOAdvantageBackup", "inputs": {
            "tree": ["tree", 0], "rewards": ["score", 0], "backup": "softmax", "temperature": 1.0,
            "adv_clip": 5.0, "flat_floor": 1e-3, "edge_baseline": "siblings"}},
        "step": {"class_type": "TreeGRPOTrainerStep", "inputs": {"tree": ["adv", 0], "run": ["run", 0],
                                                                 "model": ["d", 0]}},
        "save": {"class_type": "TreeGRPOSaveLoRA", "inputs": {"lora": ["step", 1],
                                                              "filename_prefix": f"treegrpo/{run_name}"}},
    }


def train_graph(run_name: str) -> dict:
    return {
        "d": {"class_type": "TreeGRPOLoadDemoModel", "inputs": {}},
        "rm": {"class_type": "TreeGRPORewardModelLoader", "inputs": {"reward": "demo_adherence", "file": NO_FILE}},
        "train": {"class_type": "TreeGRPOTrain", "inputs": {
            "model": ["d", 0], "clip": ["d", 1], "vae": ["d", 2], "prompts": PROMPT, "negative": "",
            "reward_model": ["rm", 0], "weight_2": 1.0, "width": 16, "height": 16, "cfg": 1.0, "scheduler": "simple",
            **SHAPE, "iterations": 2, "prompts_per_iteration": 3, **LORA, "seed": 0, "run_name": run_name,
            "eval_every": 0, "gradient_checkpointing": "off"}},
        "save": {"class_type": "TreeGRPOSaveLoRA", "inputs": {"lora": ["train", 1],
                                                              "filename_prefix": f"treegrpo/{run_name}"}},
    }


def saved_path(entry: dict) -> str:
    return entry["outputs"]["save"]["text"][0].split("saved ", 1)[1]


def test_two_queued_step_iterations_equal_two_train_node_iterations(comfyui_server):
    port = comfyui_server.port
    step_entries = []
    for _ in range(2):                                   # two prompts queued, as auto-queue would
        pid = ch.post_prompt(port, step_graph("steps_vs_train"))
        step_entries.append(ch.wait_history(port, pid, timeout=300, check=True))
    pid = ch.post_prompt(port, train_graph("train_vs_steps"))
    train_entry = ch.wait_history(port, pid, timeout=300, check=True)

    stepped, trained = lora_digest(saved_path(step_entries[-1])), lora_digest(saved_path(train_entry))
    assert stepped["metadata"]["treegrpo.step"] == trained["metadata"]["treegrpo.step"] == "2"
    first = read_lora_file(saved_path(step_entries[0]))[0]
    last = read_lora_file(saved_path(step_entries[-1]))[0]
    assert any((first[k] != last[k]).any() for k in first)          # the second queued prompt trained again
    assert stepped["tensors_sha256"] == trained["tensors_sha256"], json.dumps(
        {k: v for k, v in stepped["metadata"].items() if trained["metadata"].get(k) != v})
