"""The embedded demo run's configuration (docs/design.md §5): ``treegrpo demo``, the demo workflow's settings and the
"demo" column of the configuration reference."""
from __future__ import annotations


def demo_config_dict() -> dict:
    """The embedded demo run (docs/design.md §5): shapes flow model, prompt-adherence reward."""
    from .shapes import all_prompts

    return {
        "backend": "demo", "prompts": all_prompts(), "cfg": 1.0,
        "rewards": [{"name": "demo_adherence", "weight": 1.0}],
        "eval_rewards": [{"name": "demo_judge", "weight": 1.0}],   # held out: never trained on
        "tree": {"steps": 10, "window_start": 1, "window_width": 3, "branch": 2, "noise_level": 0.7,
                 "tail_solver": "dpmpp_2m", "tail_steps": 3},
        "advantage": {"backup": "softmax", "flat_floor": 1e-3},
        "lora": {"rank": 8, "alpha": 16.0, "targets": ["to_q", "to_k", "to_v", "to_out"]},
        "optim": {"lr": 3e-3, "clip_range": 1e-4, "microbatch": 256},
        "iterations": 80, "prompts_per_iter": 24, "trees_per_prompt": 1, "seed": 0,
        "eval_every": 10, "eval_seeds": 4, "checkpoint_every": 0, "output_dir": "treegrpo_demo_out",
        "run_name": "treegrpo_demo", "device": "cpu",
    }
