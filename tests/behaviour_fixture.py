"""The seeded runs whose LoRA files pin the training behaviour (tests/test_behaviour.py).

``python tests/behaviour_fixture.py --record`` re-records ``tests/fixtures/behaviour.json``: do that only for a
change that is meant to alter what training computes, and say so in the commit. A LoRA is pinned by the sha256
of its tensors (sorted keys, raw bytes) and its metadata; safetensors writes metadata keys in no fixed order, so
the file bytes themselves are not compared.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "behaviour.json"

#: CLI runs on the embedded demo model: config overrides of ``cli.demo_config_dict()``
CLI_RUNS = {
    "cli_tree": dict(iterations=3, prompts_per_iter=4),
    "cli_trajectory_kl_heun": dict(iterations=2, prompts_per_iter=3,
                                   tree={"method": "trajectory", "tail_solver": "heun", "tail_steps": 2},
                                   optim={"kl_beta": 0.01, "lr": 1e-3}),
    "cli_tree_prompt_stats_sum": dict(iterations=2, prompts_per_iter=4, trees_per_prompt=2,
                                      tree={"logprob_reduction": "sum", "window_schedule": "sliding",
                                            "antithetic": False},
                                      advantage={"reward_stats": "prompt", "edge_baseline": "none"}),
}


def lora_digest(path: str) -> dict:
    """sha256 of a LoRA file's tensors (sorted keys, dtype, shape, bytes) and its metadata."""
    from treegrpo.lora import read_lora_file

    tensors, meta = read_lora_file(path)
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return {"tensors_sha256": h.hexdigest(), "metadata": dict(sorted(meta.items()))}


def cli_config(name: str, out: str):
    from treegrpo import cli
    from treegrpo.config import TrainConfig

    d = cli.demo_config_dict()
    d.update(output_dir=out, eval_every=0, checkpoint_every=0, run_name=name)
    for k, v in CLI_RUNS[name].items():
        d[k] = dict(d[k], **v) if isinstance(v, dict) else v
    return TrainConfig.from_dict(d)


def run_cli(name: str, out: str) -> dict:
    from treegrpo import cli

    _, summary = cli.run_training(cli_config(name, out), progress=False)
    return lora_digest(summary["lora"])


def train_node_graph(run_name: str, iterations: int) -> dict:
    """The Train node on the demo model (explicit widget values, so node defaults do not matter)."""
    return {
        "d": {"class_type": "TreeGRPOLoadDemoModel", "inputs": {}},
        "rm": {"class_type": "TreeGRPORewardModelLoader",
               "inputs": {"reward": "demo_adherence", "file": "(none: built-in weights or none needed)"}},
        "train": {"class_type": "TreeGRPOTrain", "inputs": {
            "model": ["d", 0], "clip": ["d", 1], "vae": ["d", 2],
            "prompts": "a red circle\na blue square\na green triangle", "negative": "",
            "reward_model": ["rm", 0], "weight_2": 1.0, "width": 16, "height": 16, "cfg": 1.0,
            "scheduler": "simple", "steps": 6, "window_start": 1, "window_width": 2, "branch": 2,
            "noise_level": 0.7, "window_schedule": "fixed", "iterations": iterations, "prompts_per_iteration": 2,
            "lora_rank": 4, "lora_alpha": 4.0, "learning_rate": 1e-2, "seed": 0, "run_name": run_name,
            "eval_every": 0, "antithetic": True, "gradient_checkpointing": "off"}},
        "save": {"class_type": "TreeGRPOSaveLoRA", "inputs": {"lora": ["train", 1],
                                                              "filename_prefix": f"treegrpo/{run_name}"}},
    }


def run_train_node(rt, run_name: str = "behaviour_train_node", iterations: int = 2) -> dict:
    r = rt.execute(train_node_graph(run_name, iterations))
    return lora_digest(r.outputs["save"]["text"][0].split("saved ", 1)[1])


def record() -> None:
    import tempfile

    import comfy_harness as ch

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CLI_RUNS:
            out[name] = run_cli(name, os.path.join(tmp, name))
            print(name, out[name]["tensors_sha256"])
        rt = ch.boot_comfy(ch.REPO_ROOT, os.path.join(tmp, "comfy"))
        out["comfy_train_node"] = run_train_node(rt)
        print("comfy_train_node", out["comfy_train_node"]["tensors_sha256"])
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print("wrote", FIXTURE)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(Path(__file__).parent.parent))
    if "--record" in sys.argv:
        record()
    else:
        print(__doc__)
