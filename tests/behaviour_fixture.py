"""The seeded runs whose LoRA files pin the training behaviour (tests/e2e/test_behaviour.py).

``python tests/behaviour_fixture.py --record`` re-records ``tests/fixtures/behaviour/`` (each run's LoRA file) and
``tests/fixtures/behaviour.json`` (their metadata): do that only for a change that is meant to alter what training
computes, and say so in the commit. A run is compared by its metadata (exactly) and by its LoRA's weight update
ΔW = up·down per module, within :data:`TOLERANCE` of the recorded one: float kernels round differently on other CPUs
(vector units, MKL/oneDNN paths, thread counts), so a byte digest would pin the machine as much as the behaviour.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from treegrpo.run import run_training

FIXTURE = Path(__file__).parent / "fixtures" / "behaviour.json"
LORAS = Path(__file__).parent / "fixtures" / "behaviour"

#: the largest ΔW difference (max over modules of |ΔW − ΔW_recorded|, over the largest |ΔW_recorded|) a run may show.
#: Measured after the pinned iterations (recorded on an AVX512 CPU, 2 threads): another CPU capability
#: (ATEN_CPU_CAPABILITY=default) 2.0e-5 – 3.4e-5 on the CLI runs and 6.3e-5 on the Train node; one thread instead of
#: two 4.6e-6 – 2.7e-5. One-line changes: kl_beta 0.1 → 0.11 moves them 4.3e-3 – 1.4e-1, a learning rate 1 % higher
#: 1.0e-2 – 4.1e-2. So 5e-4: 8× the largest cross-machine round-off, 9× under the smallest change measured.
TOLERANCE = 5e-4

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
    """sha256 of a LoRA file's tensors (sorted keys, dtype, shape, bytes) and its metadata: for byte identity
    between two runs on one machine (step nodes = Train node), not against a recording."""
    import hashlib

    from treegrpo.lora import read_lora_file

    tensors, meta = read_lora_file(path)
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return {"tensors_sha256": h.hexdigest(), "metadata": dict(sorted(meta.items()))}


def lora_metadata(path: str) -> dict:
    from treegrpo.lora import read_lora_file

    return dict(sorted(read_lora_file(path)[1].items()))


def weight_updates(path: str) -> dict:
    """ΔW = up @ down (float64) of every module of a LoRA file."""
    from treegrpo.lora import read_lora_file

    tensors, _ = read_lora_file(path)
    out = {}
    for k, up in tensors.items():
        if k.endswith(".lora_up.weight"):
            m = k[: -len(".lora_up.weight")]
            out[m] = up.double() @ tensors[m + ".lora_down.weight"].double()
    return out


def update_difference(path: str, recorded: str) -> float:
    """max over modules of |ΔW − ΔW_recorded|, relative to the largest |ΔW_recorded| (see :data:`TOLERANCE`)."""
    got, want = weight_updates(path), weight_updates(recorded)
    if got.keys() != want.keys():
        return float("inf")
    scale = max(w.abs().max().item() for w in want.values())
    return max((got[m] - want[m]).abs().max().item() for m in want) / scale


def cli_config(name: str, out: str):
    from treegrpo import cli
    from treegrpo.config import TrainConfig

    d = cli.demo_config_dict()
    d.update(output_dir=out, eval_every=0, checkpoint_every=0, run_name=name)
    for k, v in CLI_RUNS[name].items():
        d[k] = dict(d[k], **v) if isinstance(v, dict) else v
    return TrainConfig.from_dict(d)


def run_cli(name: str, out: str) -> str:
    """The LoRA file the CLI run ``name`` writes under ``out``."""

    _, summary = run_training(cli_config(name, out), progress=False)
    return summary["lora"]


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


def run_train_node(rt, run_name: str = "behaviour_train_node", iterations: int = 2) -> str:
    """The LoRA file the Train node's run writes."""
    r = rt.execute(train_node_graph(run_name, iterations))
    return r.outputs["save"]["text"][0].split("saved ", 1)[1]


def record() -> None:
    import shutil
    import tempfile

    import comfy_harness as ch

    out = {}
    LORAS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: run_cli(name, os.path.join(tmp, name)) for name in CLI_RUNS}
        rt = ch.boot_comfy(ch.REPO_ROOT, os.path.join(tmp, "comfy"))
        files["comfy_train_node"] = run_train_node(rt)
        for name, path in files.items():
            shutil.copy(path, LORAS / f"{name}.safetensors")
            out[name] = {"metadata": lora_metadata(path)}
            print("recorded", name)
    FIXTURE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print("wrote", FIXTURE, "and", LORAS)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.path.insert(0, str(Path(__file__).parent.parent))
    if "--record" in sys.argv:
        record()
    else:
        print(__doc__)
