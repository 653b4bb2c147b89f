"""The embedded demo run's configuration (docs/design.md §5): ``treegrpo demo``, the demo workflow's settings and the
"demo" column of the configuration reference."""
from __future__ import annotations


def demo_config_dict() -> dict:
    """The embedded demo task (docs/design.md §5): shapes flow model, prompt-adherence reward; the base the tests and
    benchmarks build on. What ``treegrpo demo`` and the other commands run without a config is
    :func:`demo_run_config_dict`."""
    from .shapes import all_prompts

    return {
        "backend": "demo", "prompts": all_prompts(), "guidance_scale": 1.0,
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


#: what ``treegrpo demo`` and the demo workflow change in :func:`demo_config_dict`: the configuration the budget runs
#: measured best on this task (benchmarks/README.md, ``tree_tail1to2_lrhalf100_p12``) — 12 prompts an iteration, a
#: one-step DPM++ 2M tail lengthened to two at iteration 60, the learning rate 6e-3 halved at iteration 100 — for as
#: much training as the demo gave before (an iteration costs about half of a 24-prompt, three-step-tail one)
DEMO_RUN = {"prompts_per_iter": 12, "iterations": 180, "eval_every": 20,
            "tree": {"tail_steps": 1, "tail_steps_schedule": [[0, 1], [60, 2]]},
            "optim": {"lr": 6e-3, "lr_factor_schedule": [[0, 1], [100, 0.5]]}}


def demo_run_config_dict() -> dict:
    """The ``treegrpo demo`` run: :func:`demo_config_dict` (the demo task, which tests and benchmarks build on) with
    :data:`DEMO_RUN`."""
    d = demo_config_dict()
    for key, value in DEMO_RUN.items():
        d[key] = {**d.get(key, {}), **value} if isinstance(value, dict) else value
    return d
