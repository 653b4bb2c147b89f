"""Bad input through the real CLI: each case is one line ``treegrpo: error: …`` naming the field or file, exit code
2, no traceback, no model loaded (every check that needs no model runs first) and nothing of an earlier run
changed. Plus the run-safety cases: SIGTERM, ``--resume`` with nothing to resume or other settings, a damaged
latest checkpoint, byte-identical LoRA files."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from treegrpo import checkpoint as ckpt, cli, interrupts
from treegrpo.config import ConfigError, TrainConfig
from treegrpo.run import check_size

ROOT = Path(__file__).resolve().parents[2]


def base(tmp: Path, **over) -> dict:
    d = cli.demo_config_dict()
    d.update(iterations=1, eval_every=0, prompts_per_iter=2, output_dir=str(tmp / "out"))
    for k, v in over.items():
        if "." in k:
            sec, f = k.split(".")
            d[sec] = dict(d.get(sec) or {}, **{f: v})
        else:
            d[k] = v
    return d


def write(tmp: Path, name: str, content) -> str:
    p = tmp / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return str(p)


#: (case id, config overrides or a callable(tmp) -> argv, fragment the message must contain)
CONFIG_CASES = [
    ("branch_str", {"tree.branch": "two"}, "TreeConfig.branch: must be an integer, got 'two'"),
    ("branch_float", {"tree.branch": 2.5}, "TreeConfig.branch: must be an integer, got 2.5"),
    ("steps_bool", {"tree.steps": True}, "TreeConfig.steps: must be an integer"),
    ("noise_str", {"tree.noise_level": "high"}, "TreeConfig.noise_level: must be a number"),
    ("lr_str", {"optim.lr": "1e-3"}, "OptimConfig.lr: must be a number, got '1e-3'"),
    ("lr_negative", {"optim.lr": -1.0}, "OptimConfig.lr: must be > 0"),
    ("lr_nan", {"optim.lr": float("nan")}, "OptimConfig.lr"),
    ("rank_zero", {"lora.rank": 0}, "LoraConfig.rank: must be >= 1"),
    ("targets_str", {"lora.targets": "to_q"}, "LoraConfig.targets: must be a list"),
    ("targets_empty", {"lora.targets": []}, "LoraConfig.targets: must name at least one"),
    ("tree_null", {"tree": None}, "TrainConfig.tree: must be a section"),
    ("tree_str", {"tree": "big"}, "TrainConfig.tree: must be a section"),
    ("optim_list", {"optim": [1, 2]}, "TrainConfig.optim: must be a section"),
    ("iterations_null", {"iterations": None}, "TrainConfig.iterations: must not be null"),
    ("iterations_zero", {"iterations": 0}, "TrainConfig.iterations: must be >= 1"),
    ("prompts_str", {"prompts": "circle"}, "TrainConfig.prompts: must be a list"),
    ("prompts_blank", {"prompts": ["a red circle", "  "]}, "every prompt must be a non-empty string"),
    ("prompts_number", {"prompts": ["a red circle", 3]}, "every prompt must be a non-empty string"),
    ("prompts_none_given", {"prompts": []}, "empty prompt list"),
    ("rewards_dict", {"rewards": {"name": "hpsv2"}}, "TrainConfig.rewards: must be a list"),
    ("rewards_str", {"rewards": "hpsv2"}, "TrainConfig.rewards: must be a list"),
    ("rewards_entry_str", {"rewards": ["hpsv2"]}, "TrainConfig.rewards[0]: must be a mapping"),
    ("rewards_typo", {"rewards": [{"nmae": "demo_adherence"}]}, "TrainConfig.rewards[0]: unknown field(s) ['nmae']"),
    ("rewards_unknown", {"rewards": [{"name": "nosuch"}]}, "unknown reward model(s) ['nosuch']"),
    ("rewards_weight_neg", {"rewards": [{"name": "demo_adherence", "weight": -1}]}, "RewardSpec.weight"),
    ("rewards_all_zero", {"rewards": [{"name": "demo_adherence", "weight": 0}]}, "reward weights are all zero"),
    ("rewards_duplicate", {"rewards": [{"name": "demo_adherence"}, {"name": "demo_adherence"}]}, "duplicate reward"),
    ("rewards_options_list", {"rewards": [{"name": "demo_adherence", "options": [1]}]}, "RewardSpec.options: must be a mapping"),
    ("rewards_option_typo", {"rewards": [{"name": "jpeg_compressibility", "options": {"qualty": 90}}]},
     "TrainConfig.rewards[0].options: unknown option(s) ['qualty'] for reward 'jpeg_compressibility'; its options "
     "are: quality=95"),
    ("rewards_option_type", {"rewards": [{"name": "jpeg_compressibility", "options": {"quality": "high"}}]},
     "option 'quality' of reward 'jpeg_compressibility' must be an integer, got 'high'"),
    ("rewards_option_dtype", {"rewards": [{"name": "demo_adherence"},
                                          {"name": "hpsv2", "weight": 0.5, "options": {"dtype": "fp8"}}]},
     "TrainConfig.rewards[1].options: option 'dtype' of reward 'hpsv2'"),
    ("rewards_option_for_none", {"rewards": [{"name": "demo_adherence", "options": {"dtype": "float16"}}]},
     "its options are: none"),
    ("cfg_below_one", {"guidance_scale": 0.5}, "TrainConfig.guidance_scale: must be >= 1"),
    ("cfg_and_guidance_scale", {"cfg": 0.5}, "both cfg (0.5) and guidance_scale (1.0) are given"),
    ("cfg_str", {"guidance_scale": "high"}, "TrainConfig.guidance_scale: must be a number"),
    ("unknown_top", {"iteratons": 3}, "unknown field(s) ['iteratons']"),
    ("unknown_section_field", {"tree.brnach": 2}, "TreeConfig: unknown field(s) ['brnach']"),
    ("backend_unknown", {"backend": "torch"}, "TrainConfig.backend: must be one of"),
    ("diffusers_no_model", {"backend": "diffusers"}, "the diffusers backend needs a model path"),
    ("run_name_slash", {"run_name": "a/b"}, "TrainConfig.run_name"),
    ("run_name_empty", {"run_name": ""}, "TrainConfig.run_name"),
    ("run_name_too_long", {"run_name": "a" * 121}, "121 bytes is too long for the file names made from it"),
    ("run_name_too_long_unicode", {"run_name": "é" * 61}, "122 bytes is too long"),
    ("window_schedule", {"tree.window_schedule": "sometimes"}, "TreeConfig.window_schedule: must be one of"),
    ("tail_solver", {"tree.tail_solver": "rk4"}, "TreeConfig.tail_solver"),
    ("window_past_end", {"tree.window_start": 9, "tree.window_width": 3}, "TreeConfig"),
    ("huge_tree", {"tree.branch": 10, "tree.window_width": 9, "tree.steps": 12}, "exceed max_leaves"),
    ("branch_schedule_str", {"tree.branch_schedule": "4,2"}, "TreeConfig.branch_schedule: must be a list"),
    ("branch_schedule_len", {"tree.branch_schedule": [4, 2]}, "needs one entry per window step (3), got [4, 2]"),
    ("microbatch_zero", {"optim.microbatch": 0}, "OptimConfig.microbatch: must be >= 1"),
    ("lr_schedule", {"optim.lr_schedule": "step"}, "OptimConfig.lr_schedule: must be one of"),
    ("eval_seeds_zero", {"eval_seeds": 0}, "TrainConfig.eval_seeds: must be 1..64"),
    ("keep_zero", {"keep_checkpoints": 0}, "TrainConfig.keep_checkpoints: must be >= 1"),
    ("time_budget_neg", {"time_budget_s": -5}, "TrainConfig.time_budget_s"),
    ("memory_plan", {"memory.plan": "always"}, "MemoryConfig.plan: must be one of"),
    ("memory_budget_neg", {"memory.budget_gb": -1}, "MemoryConfig.budget_gb"),
    ("memory_ckpt_bool", {"memory.checkpointing": True}, "MemoryConfig.checkpointing: must be a string"),
    ("pipeline_height", {"pipeline.height": 100}, "PipelineConfig.height"),
    ("pipeline_dtype", {"pipeline.dtype": "fp8"}, "PipelineConfig.dtype: must be one of"),
    ("device_tpu", {"device": "tpu"}, "TrainConfig.device: 'tpu' is not a device this trainer runs on"),
    ("device_number", {"device": 3}, "TrainConfig.device"),
    # sizes that multiply into work or memory: bounded before the model loads, the bound and its reason named
    ("steps_huge", {"tree.steps": 100000}, "TreeConfig.steps: must be <= 1000 (the finest schedule"),
    ("tail_steps_huge", {"tree.tail_steps": 10 ** 9}, "TreeConfig.tail_steps: must be <= 1000 (every leaf runs"),
    ("tail_schedule_huge", {"tree.tail_steps_schedule": [[0, 10 ** 9]]}, "tail_steps <= 1000 (every leaf runs"),
    ("lr_factor_huge", {"optim.lr_factor_schedule": [[0, 1e300]]}, "a factor > 0 and <= 100 (it multiplies optim.lr"),
    ("frames_huge", {"video.frames": 100000}, "VideoConfig.frames: must be <= 1024"),
    ("frames_on_images", {"video.frames": 9}, "VideoConfig.frames: 9 frames: the demo backend trains image models"),
    ("height_huge", {"pipeline.height": 65536}, "PipelineConfig.height: must be <= 8192 pixels"),
]

#: (case id, argv, fragments the one-line message must contain): flags of every command, typed wrong
LONG = "x" * 10_000
FLAG_CASES = [
    ("flag_int_word", ["train", "--tree.branch", "two"], ["--tree.branch: expected a whole number, got 'two'"]),
    ("flag_float_word", ["train", "--optim.lr", "fast"], ["--optim.lr: expected a number, got 'fast'"]),
    ("flag_float_inf", ["train", "--optim.lr", "inf"], ["--optim.lr: expected a finite number, got 'inf'"]),
    ("flag_float_nan", ["demo", "--tree.noise-level", "nan"], ["did you mean --tree.noise_level?"]),
    ("flag_top_nan", ["train", "--time-budget-s", "nan"], ["--time-budget-s: expected a finite number"]),
    ("flag_schedule_word", ["demo", "--tree.window_width", "2", "--tree.branch_schedule", "4,two"],
     ["TreeConfig.branch_schedule: entries must be whole numbers >= 1, got [4, 'two']"]),
    ("flag_bool_word", ["train", "--tree.antithetic", "maybe"], ["antithetic: must be true or false"]),
    ("flag_underscore", ["train", "--prompts_file", "p.txt"], ["--prompts_file (did you mean --prompts-file?)"]),
    ("flag_dash_in_section", ["train", "--tree.window-start", "3"],
     ["--tree.window-start (did you mean --tree.window_start?)"]),
    ("flag_section_missing", ["sample", "--branch", "3"], ["(did you mean --tree.branch?)"]),
    ("flag_typo", ["demo", "--iteratons", "3"], ["(did you mean --iterations?)"]),
    ("demo_reward_prompt", ["train", "--prompts", "a cat"],
     ["TrainConfig.rewards[0]: reward 'demo_adherence' is the embedded demo's", "demo prompt 'a cat' must have the "
      "form 'a <colour> <shape>'", "For your own prompts give another reward"]),
    # flags for another backend start from the config's defaults, not the demo task's (its judge refused the prompt)
    ("diffusers_from_flags", ["train", "--backend", "diffusers", "--model", "/nonexistent", "--prompts", "a red fox",
                              "--rewards", '[{"name": "jpeg_compressibility"}]'],
     ["model path '/nonexistent' does not exist"]),
    ("sample_diffusers_prompt", ["sample", "--backend", "diffusers", "--model", "/nonexistent", "--prompt", "a fox"],
     ["model path '/nonexistent' does not exist"]),       # its --prompt is the prompt list of a config without one
    ("flag_of_another_command", ["train", "--dump-config"],
     ["--dump-config (a flag of treegrpo demo, not of treegrpo train; treegrpo config --config FILE prints"]),
    ("flag_long_value", ["train", "--tree.branch", LONG], ["--tree.branch: expected a whole number", "characters]"]),
    ("grid_prompts_zero", ["demo", "--grid-prompts", "0"], ["--grid-prompts must be 1..64"]),
    ("per_prompt_zero", ["sample", "--per-prompt", "0"], ["--per-prompt must be 1..64"]),
    ("device_tpu_flag", ["demo", "--device", "tpu"], ["TrainConfig.device: 'tpu' is not a device"]),
    ("device_cuda_absent", ["sample", "--device", "cuda:7"], ["cuda:7"]),
    ("prompt_long", ["sample", "--prompt", LONG], ["demo prompt 'xxx", "characters]"]),
    ("prompts_per_iter_absurd", ["train", "--prompts-per-iter", "100000"], ["100000 trees per iteration is more than"]),
    ("demo_output_dir_unwritable", ["demo", "--output-dir", "/proc/treegrpo"],
     ["TrainConfig.output_dir: cannot write in '/proc/treegrpo'"]),
    ("output_dir_under_a_file", ["train", "--output-dir", "/etc/passwd/runs/a"],
     ["TrainConfig.output_dir: '/etc/passwd/runs/a' cannot be made: '/etc/passwd' is a file"]),
    ("suggest_from_the_command_only", ["export", "a.safetensors", "b.safetensors", "--prefixx", "x"],
     ["unrecognized arguments: --prefixx (did you mean --prefix?)"]),
    ("positional_given_as_flag", ["export", "a.safetensors", "b.safetensors", "--output", "x"],
     ["--output (output is given without a flag: treegrpo export INPUT OUTPUT)"]),
]


def test_an_error_under_torchrun_names_its_process(capsys, monkeypatch):
    """Every process of a torchrun prints its own error line: each says which process it is."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", "--optim.lr", "fast"]) == 2
    assert capsys.readouterr().err.strip() == \
        "treegrpo [process 1 of 2]: error: --optim.lr: expected a number, got 'fast'"


@pytest.mark.parametrize("case,argv,fragments", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_a_bad_flag_is_one_short_line_naming_it(tmp_path, capsys, monkeypatch, case, argv, fragments):
    """Through main() as the console script runs it: exit 2 and one line under 700 characters naming the flag
    (argparse's usage line before it for an unknown flag), the nearest spelling suggested, no traceback; a
    10 000-character value is not echoed whole."""
    import torch

    monkeypatch.chdir(tmp_path)
    if case == "device_cuda_absent" and torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    try:
        rc = cli.main(argv + (["--output", str(tmp_path / "s.png")] if argv[0] == "sample" else []))
    except SystemExit as e:      # argparse's own errors exit 2 after printing usage and one error line
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert "Traceback" not in err and lines[-1].startswith("treegrpo") and len(lines[-1]) < 700, err[:2000]
    assert len(lines) == 1 or lines[0].startswith("usage:"), lines        # argparse's usage, then the one line
    for f in fragments:
        assert f in lines[-1], lines[-1][:1000]
    if case == "positional_given_as_flag":         # sample's --output is not offered for export
        assert "did you mean" not in lines[-1], lines[-1]
    assert not (tmp_path / "treegrpo_demo_out").exists()


def _no_model(monkeypatch):
    import treegrpo.backends as backends
    monkeypatch.setattr(backends, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))


def _run(argv, capsys) -> str:
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("treegrpo: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_missing_reward_folder_names_every_file_it_needs(tmp_path, capsys, monkeypatch):
    """The reward's whole list of the files it expects, where to put them and their source, uncut: its apostrophes
    ("ComfyUI's", "the reward's") are not quotes of user input, and the list is longer than a flag's line."""
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["train", "--rewards", '[{"name": "pickscore", "weight": 1, "path": "/nonexistent/ps"}]'])
    err = capsys.readouterr().err
    assert rc == 2 and "characters]" not in err and "Traceback" not in err, err
    for part in ("tokenizer_config.json, special_tokens_map.json) in the same folder",
                 "ComfyUI's models/reward_models/ folder", "github yuvalkirstain/PickScore). Nothing is downloaded."):
        assert part in err, err


@pytest.mark.parametrize("case,over,fragment", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_bad_config_is_one_line_before_any_model(tmp_path, capsys, monkeypatch, case, over, fragment):
    _no_model(monkeypatch)
    cfg = write(tmp_path, "c.json", base(tmp_path, **over))
    assert fragment in _run(["train", "--config", cfg], capsys)
    assert not (tmp_path / "out").exists()          # nothing was created either


FILE_CASES = [
    ("prompts_file_missing", lambda t: {"prompts": [], "prompts_file": str(t / "nope.txt")}, "nope.txt"),
    ("prompts_file_empty", lambda t: {"prompts": [], "prompts_file": write(t, "e.txt", "\n  \n")}, "has no prompts"),
    ("prompts_file_binary", lambda t: {"prompts": [], "prompts_file": write(t, "b.txt", b"abc\x00\x01def")}, "binary"),
    ("prompts_file_latin1", lambda t: {"prompts": [], "prompts_file": write(t, "l.txt", "café".encode("latin-1"))},
     "l.txt' is not UTF-8"),
    ("prompts_file_folder", lambda t: {"prompts": [], "prompts_file": str(t)}, "cannot read"),
    ("output_dir_is_file", lambda t: {"output_dir": write(t, "afile", "x")}, "TrainConfig.output_dir: "),
    ("init_from_missing", lambda t: {"lora.init_from": str(t / "none.safetensors")}, "LoraConfig.init_from"),
    ("init_from_not_lora", lambda t: {"lora.init_from": write(t, "junk.safetensors", b"not a safetensors file")},
     "junk.safetensors"),
    ("init_from_nan", lambda t: {"lora.init_from": _nan_lora(t)}, "LoraConfig.init_from: "),
]


def _nan_lora(t) -> str:
    """A diverged run's LoRA (ComfyUI keys, one NaN)."""
    import torch
    from treegrpo.lora import save_lora_file
    up = torch.zeros(8, 4)
    up[0, 0] = float("nan")
    return save_lora_file(str(t / "nan.safetensors"), {"diffusion_model.blocks.0.attn.to_q.lora_up.weight": up,
                                                        "diffusion_model.blocks.0.attn.to_q.lora_down.weight":
                                                            torch.zeros(4, 8)})


@pytest.mark.parametrize("case,over,fragment", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_files_and_folders_are_named(tmp_path, capsys, monkeypatch, case, over, fragment):
    _no_model(monkeypatch)      # all said before the model loads (a LoRA's keys are checked against it after)
    cfg = write(tmp_path, "c.json", base(tmp_path, **over(tmp_path)))
    err = _run(["train", "--config", cfg], capsys)
    assert fragment in err
    if case == "init_from_nan":
        assert "NaN or infinite values" in err and "diverged" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_an_output_dir_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    _no_model(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    cfg = write(tmp_path, "c.json", base(tmp_path, output_dir=str(ro / "run")))
    assert "cannot write" in _run(["train", "--config", cfg], capsys)


@pytest.mark.parametrize("content,fragment", [
    ("{ \"prompts\": [", "is not valid JSON"), ("null", "must hold a mapping"), ("[1, 2]", "must hold a mapping"),
    ('{"tree": {"branch": 2}, "prompts": ["a"], "tree": {"branch": 3}}', "the key 'tree' appears twice"),
    ('{"tree": {"branch": 2, "branch": 3}}', "the key 'branch' appears twice"),
    (b"\xff\xfe{}", "is not UTF-8"), ("", "is empty: write the run's settings"), ("  \n", "is empty"),
])
def test_a_bad_config_file(tmp_path, capsys, monkeypatch, content, fragment):
    _no_model(monkeypatch)
    assert fragment in _run(["train", "--config", write(tmp_path, "c.json", content)], capsys)
    assert fragment in _run(["config", "--config", str(tmp_path / "c.json")], capsys)


def test_a_bad_yaml_config_file(tmp_path, capsys, monkeypatch):
    """A YAML config that does not parse names the file, the problem and its line; without PyYAML the line says what
    to install or to write JSON (both were tracebacks)."""
    import sys

    _no_model(monkeypatch)
    path = write(tmp_path, "c.yaml", "prompts:\n  - a red circle\ntree: {branch: 2\n")
    for argv in (["train", "--config", path], ["config", "--config", path]):
        msg = _run(argv, capsys)
        assert "c.yaml' is not valid YAML" in msg and "line 4" in msg, msg
    path = write(tmp_path, "d.yaml", "prompts: [a red circle]\ntree: {branch: 2}\ntree: {branch: 3}\n")
    assert "the key 'tree' appears twice" in _run(["config", "--config", path], capsys)   # kept the last, silently
    monkeypatch.setitem(sys.modules, "yaml", None)             # PyYAML not installed
    assert "pip install pyyaml, or write the config as JSON" in _run(["config", "--config", path], capsys)


def test_a_config_file_as_editors_write_it_is_read(tmp_path, capsys):
    """A byte-order mark (Windows editors) and YAML's 1e-4 (a string under YAML 1.1: the learning rate was refused as
    "not a number") read as a user means them."""
    path = write(tmp_path, "c.yaml", "prompts: [a red circle]\noptim: {lr: 1e-4, warmup: 2}\n")
    assert cli.main(["config", "--config", path]) == 0
    assert json.loads(capsys.readouterr().out)["optim"]["lr"] == 1e-4
    (tmp_path / "b.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompts": ["a red circle"]}).encode())
    assert cli.main(["config", "--config", str(tmp_path / "b.json")]) == 0
    assert json.loads(capsys.readouterr().out)["prompts"] == ["a red circle"]


def test_every_config_field_is_a_flag():
    """The flag groups come from the config's own sections: every field of TrainConfig and of each section
    parses as a flag (``--field`` / ``--section.field``), video's included."""
    import argparse
    import dataclasses

    from treegrpo.config import config_sections

    p = argparse.ArgumentParser()
    cli.add_config_flags(p)
    sections = config_sections()
    assert {"tree", "optim", "memory", "video", "pipeline"} <= set(sections)
    for f in dataclasses.fields(TrainConfig):
        if f.name in sections:
            for g in dataclasses.fields(sections[f.name]):
                ns, rest = p.parse_known_args([f"--{f.name}.{g.name}", "1"])
                assert not rest and getattr(ns, f"cfg:{f.name}.{g.name}") == "1", (f.name, g.name)
        else:
            ns, rest = p.parse_known_args([f"--{f.name.replace('_', '-')}", "1"])
            want = ["1"] if f.name in cli.PROMPT_FLAGS else "1"      # a prompt flag: one prompt each, repeatable
            assert not rest and getattr(ns, f"cfg:{f.name}") == want, f.name


@pytest.mark.slow
def test_a_memory_budget_that_nothing_fits_names_the_setting_in_megabytes(tmp_path, capsys):
    """On the CPU a plan is made only because memory.budget_gb is set: the refusal names it and gives sizes in
    MB, not 0.00 GB."""
    cfg = write(tmp_path, "c.json", base(tmp_path, **{"memory.budget_gb": 0.001}))
    err = _run(["train", "--config", cfg], capsys)
    assert "memory.budget_gb (the Train node's memory_budget_gb) is 1.0 MB" in err and "0.00 GB" not in err, err
    assert "short): raise it (0 = the GPU's own memory)" in err


def test_config_paths_that_are_not_files(tmp_path, capsys, monkeypatch):
    _no_model(monkeypatch)
    assert "is a folder" in _run(["train", "--config", str(tmp_path)], capsys)
    assert "cannot read it" in _run(["train", "--config", str(tmp_path / "missing.json")], capsys)


def test_treegrpo_config_refuses_an_unknown_reward(tmp_path, capsys):
    cfg = write(tmp_path, "c.json", base(tmp_path, rewards=[{"name": "nosuch"}]))
    assert "unknown reward model(s) ['nosuch']" in _run(["config", "--config", cfg], capsys)


def test_a_batch_too_large_for_memory_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """The latents the trees keep must fit in the available memory: checked from the model's configuration alone,
    before any weight loads, naming the smallest change. The demo's latent is 3x16x16 float32 (3 KiB) and a k=2, w=3
    tree keeps 1 + 2 + 4 + 2*8 = 23 of them (70,656 B): 2 MB hold 28 trees."""
    from treegrpo import memory
    _no_model(monkeypatch)
    monkeypatch.setattr(memory, "available_ram", lambda: 2e6)
    cfg = write(tmp_path, "c.json", base(tmp_path, prompts_per_iter=4000))   # under the 4096-tree cap
    err = _run(["train", "--config", cfg], capsys)
    assert "92,000 latents of 3 KiB for its 4,000 trees" in err and "lower prompts_per_iter to at most 28" in err, err
    assert "the Train node's prompts_per_iteration, --prompts-per-iter on the command line" in err   # both front ends
    # one prompt of 4 trees is already too many for 150 kB: at most 2 trees
    monkeypatch.setattr(memory, "available_ram", lambda: 150e3)
    cfg = write(tmp_path, "c.json", base(tmp_path, prompts_per_iter=1, trees_per_prompt=4))
    assert "set prompts_per_iter to 1 and trees_per_prompt to at most 2" in _run(["train", "--config", cfg], capsys)
    # a k=8, w=4 tree keeps 1 + 8 + 64 + 512 + 2*4096 = 8,777 latents (27 MB); w=3 keeps 1,097 (3.4 MB), w=2 137
    monkeypatch.setattr(memory, "available_ram", lambda: 2e6)
    cfg = write(tmp_path, "c.json", base(tmp_path, prompts_per_iter=1, **{"tree.branch": 8, "tree.window_width": 4,
                                                                          "tree.max_leaves": 4096}))
    assert "a window of 2 steps (window_width 2, --tree.window_width on the command line: 64 leaves per tree)" in \
        _run(["train", "--config", cfg], capsys)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_resolution_too_large_for_memory_is_refused_from_the_model_folders_configs(tmp_path, capsys, monkeypatch):
    """A diffusers folder's JSON configs give the latent shape (the VAE's channels and scale, the denoiser's default
    size): at 8192x8192 an SD latent is 4x1024x1024 float32 (16 MiB) and the smallest tree (k=2, w=1) keeps 5 of
    them; in 20 MB the advice is a resolution at most sqrt(20e6 / (5 * 16 MiB)) = 0.49x. No weight file exists: the
    check reads none."""
    from treegrpo import memory
    _no_model(monkeypatch)
    folder = tmp_path / "sd"
    for sub, conf in {"": {"_class_name": "StableDiffusionPipeline"},
                      "vae": {"latent_channels": 4, "block_out_channels": [8, 8, 8, 8]},
                      "unet": {"sample_size": 64}}.items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        write(folder / sub, "model_index.json" if not sub else "config.json", conf)
    monkeypatch.setattr(memory, "available_ram", lambda: 20e6)
    over = {"backend": "diffusers", "model": str(folder), "prompts_per_iter": 1, "tree.branch": 2,
            "tree.window_width": 1, "tree.window_start": 0, "pipeline.height": 8192, "pipeline.width": 8192}
    err = _run(["train", "--config", write(tmp_path, "c.json", base(tmp_path, **over))], capsys)
    assert "5 latents of 16384 KiB for its 1 tree (0.1 GB)" in err and "lower the resolution to at most 0.49x" in err
    # at the model's own 512x512 (sample_size 64 x 8: 64 KiB latents) the same tree fits
    over.pop("pipeline.height"), over.pop("pipeline.width")
    cfg = TrainConfig.from_dict(base(tmp_path, **over))
    from treegrpo.backends import latent_shape_from_config
    assert latent_shape_from_config(cfg) == (4, 64, 64)
    check_size(cfg)


# ------------------------------------------------------------------------------------------- runs and resuming


def test_out_of_memory_is_one_line_saying_how_to_go_on_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    """An accelerator out of memory in iteration 2: one line (what ran out, how to plan for less, --resume), exit 1,
    the first iteration kept; the run resumed with another memory budget finishes."""
    from treegrpo.trainer import Trainer

    real = Trainer.update

    def update(self, batch):
        if self.iteration == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 11.7 GiB total)\nmore")
        return real(self, batch)

    monkeypatch.setattr(Trainer, "update", update)
    cfg = write(tmp_path, "c.json", base(tmp_path, iterations=2))
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("treegrpo: error: out of accelerator memory (CUDA out of memory. Tried to allocate 2.00 "
                          "GiB (GPU 0; 11.7 GiB total)). Plan for less: --memory.budget_gb")
    assert err.count("\n") == 1 and "add --resume to go on" in err and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir()) == ["treegrpo_demo-0000001.pt"]
    monkeypatch.setattr(Trainer, "update", real)
    assert cli.main(["train", "--config", cfg, "--quiet", "--resume", "--memory.budget_gb", "4"]) == 0


def test_resume_refuses_nothing_to_resume_and_changed_settings(tmp_path, capsys):
    cfg = write(tmp_path, "c.json", base(tmp_path, checkpoint_every=1))
    assert "no checkpoint of run 'treegrpo_demo'" in _run(["train", "--config", cfg, "--resume"], capsys)
    assert not (tmp_path / "out").exists()     # refused: no folder made (it held a lock file before)
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 0
    capsys.readouterr()
    lora = tmp_path / "out" / "treegrpo_demo.safetensors"
    before = lora.read_bytes()
    changed = write(tmp_path, "c2.json", base(tmp_path, checkpoint_every=1, iterations=2, seed=5,
                                              **{"optim.lr": 1e-2}))
    err = _run(["train", "--config", changed, "--resume"], capsys)
    assert "optim.lr: 0.003 -> 0.01" in err and "seed: 0 -> 5" in err and "--allow-changes" in err
    assert lora.read_bytes() == before                       # the earlier run is untouched
    # the budget may change: two iterations instead of one
    longer = write(tmp_path, "c3.json", base(tmp_path, checkpoint_every=1, iterations=2))
    assert cli.main(["train", "--config", longer, "--resume", "--quiet"]) == 0
    assert cli.main(["train", "--config", changed, "--resume", "--allow-changes", "--quiet",
                     "--iterations", "3"]) == 0


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    cfg = write(tmp_path, "c.json", base(tmp_path, checkpoint_every=1, iterations=2, keep_checkpoints=2))
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 0
    ckpts = sorted((tmp_path / "out" / "checkpoints").glob("*.pt"))
    assert len(ckpts) == 2
    ckpts[-1].write_bytes(ckpts[-1].read_bytes()[:1000])    # truncated, as by a full disk
    with pytest.warns(UserWarning, match="unreadable"):
        assert cli.main(["train", "--config", cfg, "--resume", "--quiet", "--iterations", "3"]) == 0
    log = json.loads((tmp_path / "out" / "log.json").read_text())
    assert [h["iteration"] for h in log["train"]] == [0, 1, 2]   # iteration 1 again, from checkpoint 1


def test_identical_runs_write_identical_lora_bytes(tmp_path):
    digests = []
    for i in range(2):
        cfg = write(tmp_path, f"c{i}.json", base(tmp_path, output_dir=str(tmp_path / f"out{i}"),
                                                 **{"tree.steps": 6}))
        assert cli.main(["train", "--config", cfg, "--quiet"]) == 0
        data = (tmp_path / f"out{i}" / "treegrpo_demo.safetensors").read_bytes()
        digests.append(hashlib.sha256(data).hexdigest())
        mode = (tmp_path / f"out{i}" / "treegrpo_demo.safetensors").stat().st_mode & 0o777
        umask = os.umask(0)
        os.umask(umask)
        assert mode == 0o666 & ~umask
    assert digests[0] == digests[1]


@pytest.mark.slow
def test_sigterm_checkpoints_like_ctrl_c_and_the_run_resumes(tmp_path):
    """``docker stop`` / SLURM send SIGTERM: the trainer writes a checkpoint of the last finished iteration, says
    where, and exits 130; ``--resume`` continues from it."""
    cfg = write(tmp_path, "c.json", base(tmp_path, iterations=10_000, checkpoint_every=1, prompts_per_iter=2))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "treegrpo.cli", "train", "--config", cfg, "--quiet"], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ck = tmp_path / "out" / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and not (ck.exists() and list(ck.glob("*.pt"))):
        time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted; the last finished iteration is saved in" in err and "Traceback" not in err
    done = json.loads((tmp_path / "out" / "log.json").read_text())["train"][-1]["iteration"] + 1
    again = write(tmp_path, "c2.json", base(tmp_path, iterations=done + 1, checkpoint_every=1, prompts_per_iter=2))
    assert cli.main(["train", "--config", again, "--resume", "--quiet"]) == 0
    assert json.loads((tmp_path / "out" / "log.json").read_text())["train"][-1]["iteration"] == done


def test_the_catalogue_is_wide():
    assert len(CONFIG_CASES) + len(FILE_CASES) + 4 * 2 + 2 + 1 + 1 >= 64


def test_a_reward_of_weight_zero_is_no_change_to_resume_across():
    """A run begun with a second reward of weight 0 (which the Train node now leaves unloaded) resumes without it;
    a weight that counts is still a change."""
    two = TrainConfig(prompts=["a"], rewards=[{"name": "demo_adherence"}, {"name": "jpeg_compressibility",
                                                                             "weight": 0.0}])
    one = TrainConfig(prompts=["a"], rewards=[{"name": "demo_adherence"}])
    assert ckpt.config_changes(two.to_dict(), one) == []
    counted = TrainConfig(prompts=["a"], rewards=[{"name": "demo_adherence"}, {"name": "jpeg_compressibility",
                                                                                 "weight": 0.5}])
    assert ckpt.config_changes(counted.to_dict(), one) and ckpt.config_changes(two.to_dict(), counted)


def test_a_checkpoint_config_of_another_version_is_read_where_it_can_be(tmp_path):
    """A newer version's config (a field this one does not know) is read with one warning naming the checkpoint and
    the field, and is no change; a value this version cannot use is a change that says so; a newer checkpoint format
    is refused naming both formats and the way out."""
    now = TrainConfig(prompts=["a"])
    saved = now.to_dict()
    saved["tree"]["new_knob"] = 1
    saved["future_section_field"] = "x"
    with pytest.warns(UserWarning, match=r"checkpoint c.pt was written by a newer TreeGRPO: its settings "
                                         r"\['future_section_field', 'tree.new_knob'\] are unknown"):
        assert ckpt.config_changes(saved, now, source="checkpoint c.pt") == []
    bad = now.to_dict()
    bad["tree"]["steps"] = "many"
    assert ckpt.config_changes(bad, now)[0].startswith("the checkpoint's config is not readable")
    with pytest.raises(ConfigError):
        TrainConfig.from_dict({"prompts": ["a"], "tree": {"nonsense": 1}})      # a user's own file: still refused
    import torch
    path = tmp_path / "checkpoints" / "r-0000001.pt"
    path.parent.mkdir()
    torch.save({"format": ckpt.FORMAT + 1, "run_name": "r"}, path)
    with pytest.raises(ckpt.CheckpointError, match=r"has format 2; this version reads format 1: it was written by a "
                                                   r"newer TreeGRPO; update TreeGRPO"):
        ckpt.read_checkpoint(str(path), "r")


def test_lora_metadata_of_another_version_is_read_where_it_can_be(tmp_path):
    """A PEFT-key LoRA whose ``treegrpo.lora_alpha`` another version or tool wrote as something other than a
    number loads with its rank as alpha and one warning naming the key; unknown metadata keys are ignored."""
    import torch
    from treegrpo.lora import from_state_dict

    sd = {"m.lora_A.weight": torch.zeros(4, 8), "m.lora_B.weight": torch.zeros(8, 4)}
    assert from_state_dict(sd, {"treegrpo.lora_alpha": "16.0", "treegrpo.future": "{}"}).alpha == {"m": 16.0}
    with pytest.warns(UserWarning, match="treegrpo.lora_alpha = 'sixteen' is not a positive number"):
        assert from_state_dict(sd, {"treegrpo.lora_alpha": "sixteen"}).alpha == {"m": 4.0}
    with pytest.warns(UserWarning, match="treegrpo.lora_alpha"):
        assert from_state_dict(sd, {"treegrpo.lora_alpha": "-1"}).alpha == {"m": 4.0}


def test_artist_labels_of_another_version_are_read_where_they_can_be(tmp_path, caplog):
    """Every answer the artist gave is kept: a newer record format's unknown answer fields are left out with one
    warning, an answer this version cannot use (an unknown mode) is left out with one warning naming its line, and
    the others are read; a damaged line in the middle is refused naming the line."""
    import logging

    from treegrpo.artist.taste import read_labels

    recs = [{"version": 1, "outcome": "answered", "answer": {"mode": "favourites", "good": [1]}, "leaves": []},
            {"version": 2, "outcome": "answered", "answer": {"mode": "favourites", "good": [0], "confidence": 0.9},
             "leaves": [], "new": 1},
            {"version": 2, "outcome": "answered", "answer": {"mode": "pairwise_v2", "pairs": [[0, 1]]}},
            {"version": 2, "outcome": "timeout", "answer": None}]
    path = tmp_path / "artist_labels.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    with caplog.at_level(logging.WARNING):
        got = read_labels(path)
    assert [a.good for _, a in got] == [(1,), (0,)]
    text = caplog.text
    assert "fields ['confidence'] are unknown here" in text and "record format [2]" in text
    assert "lines [3] cannot be used by this version" in text
    path.write_text(path.read_text().replace(json.dumps(recs[1]), "{not json"))
    with pytest.raises(ValueError, match=r"line 2 is not JSON"):
        read_labels(path)


def test_sample_checks_its_output_and_the_lora_before_any_model(tmp_path, capsys, monkeypatch):
    import torch
    from treegrpo.lora import save_lora_file

    _no_model(monkeypatch)
    assert "does not exist" in _run(["sample", "--output", str(tmp_path / "no" / "x.png")], capsys)
    assert "write a .png" in _run(["sample", "--output", str(tmp_path / "x.jpg")], capsys)
    assert "--per-prompt must be 1..64" in _run(["sample", "--per-prompt", "0", "--output",
                                                str(tmp_path / "x.png")], capsys)
    nan = save_lora_file(str(tmp_path / "nan.safetensors"),
                         {"m.lora_down.weight": torch.full((2, 4), float("nan")), "m.lora_up.weight": torch.zeros(4, 2)})
    assert "NaN or infinite" in _run(["sample", "--lora", nan, "--output", str(tmp_path / "x.png")], capsys)
    assert "LoRA file not found" in _run(["sample", "--lora", str(tmp_path / "none.safetensors"), "--output",
                                          str(tmp_path / "x.png")], capsys)
    assert not (tmp_path / "x.png").exists()


def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path, capsys, monkeypatch):
    """Another process training into the same output_dir holds its lock: this run stops at once, before loading any
    model, naming it; once that process is gone (killed, even), the folder is free again."""
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from treegrpo.checkpoint import RunLock\n"
        "lock = RunLock(%r); print('locked', flush=True); time.sleep(120)") % (str(ROOT), str(out))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = write(tmp_path, "c.json", base(tmp_path))
        with monkeypatch.context() as m:
            _no_model(m)
            err = _run(["train", "--config", cfg, "--quiet"], capsys)
        assert "is in use by a run that is still training (pid" in err
    finally:
        holder.kill()
        holder.wait()
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 0


def test_a_fresh_run_never_replaces_a_finished_one(tmp_path, capsys):
    """Starting a run where a run of the same name left its LoRA is refused (nothing touched); ``--overwrite``
    moves the earlier files to ``previous-<time>/`` (nothing deleted) and trains again."""
    cfg = write(tmp_path, "c.json", base(tmp_path, checkpoint_every=1, eval_every=1))
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    lora, best = out / "treegrpo_demo.safetensors", out / "treegrpo_demo_best.safetensors"
    before, best_before = lora.read_bytes(), best.read_bytes()
    err = _run(["train", "--config", cfg, "--quiet"], capsys)
    assert "already holds run 'treegrpo_demo'" in err and "--resume" in err and "--overwrite" in err
    assert lora.read_bytes() == before
    assert cli.main(["train", "--config", cfg, "--quiet", "--overwrite", "--seed", "3"]) == 0
    archived = list(out.glob("previous-*"))
    assert len(archived) == 1
    assert (archived[0] / "treegrpo_demo.safetensors").read_bytes() == before
    assert (archived[0] / "log.json").exists() and list((archived[0] / "checkpoints").glob("treegrpo_demo-*.pt"))
    assert (archived[0] / "treegrpo_demo_best.safetensors").read_bytes() == best_before   # the best one too
    assert lora.read_bytes() != before                       # the new run's LoRA (another seed)


def test_a_run_started_afresh_moves_every_file_of_the_earlier_one_aside(tmp_path):
    """Everything an earlier run of the name left in its folder (the last, PEFT and best LoRAs, logs, summary,
    figures, evaluation grids, the artist's answers, checkpoints) moves to ``previous-<time>/`` keeping its place, also where a resume
    finds no checkpoint to continue; another run's LoRA in the folder is left alone. With a checkpoint, a resume
    moves nothing."""
    import types

    from treegrpo.run_files import RunFiles

    class Run(RunFiles):
        rank, base_model_name = 0, "m"

        def __init__(self, out):
            self.out, self.cfg, self.loaded = str(out), types.SimpleNamespace(run_name="r"), []

        def log(self, msg):
            pass

        def load_checkpoint(self, path, state=None):
            self.loaded.append(path)

    out = tmp_path / "out"
    theirs = ["r.safetensors", "r_diffusers.safetensors", "r_best.safetensors", "log.json", "log.csv", "eval.csv",
              "summary.json",
              "reward_curve.png", "samples_before_after.png", "evals/eval_000000.png", "evals/eval_000004.png",
              # the artist's answers and checks with their pictures, the LoRA the end's check did not prefer
              "artist_labels.jsonl", "artist_checks.jsonl", "artist/ab12cd34_0_t0/leaf_0.png",
              "artist/ab12cd34_9_check/side_1.png", "r-not-preferred-9.safetensors"]
    for rel in theirs + ["s.safetensors", "notes.txt", "s-not-preferred-3.safetensors"]:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(rel)
    ckpt.claim_output_dir(str(out), "r", "m")
    assert sorted(os.path.relpath(p, out) for p in ckpt.run_files(str(out), "r")) == sorted(theirs)
    run = Run(out)
    run.begin(resume=True)                      # nothing to resume: a fresh start, the earlier files aside
    assert run.started_fresh and not run.loaded
    (moved,) = out.glob("previous-*")
    for rel in theirs:
        assert (moved / rel).read_text() == rel and not (out / rel).exists(), rel
    assert (out / "s.safetensors").exists() and (out / "notes.txt").exists()
    assert (out / "s-not-preferred-3.safetensors").exists()
    ckpt.write_checkpoint(str(out), "r", 3, {"x": 1}, keep=2)
    (out / "r.safetensors").write_text("now")
    run.begin(resume=True)
    assert not run.started_fresh and len(run.loaded) == 1
    assert len(list(out.glob("previous-*"))) == 1 and (out / "r.safetensors").read_text() == "now"


def test_the_lora_folder_of_an_earlier_run_is_moved_aside_not_overwritten(tmp_path):
    """The Train node's LoRA folder (models/loras/treegrpo/<run_name>/): a fresh start moves the earlier run's LoRA
    files into ``previous-<time>/`` inside it (LoraLoader still lists them); earlier ``previous-*`` folders stay."""
    from treegrpo.comfyui.watch import archive_loras

    folder = tmp_path / "loras" / "r"
    assert archive_loras(str(folder)) is None                   # never trained
    folder.mkdir(parents=True)
    (folder / "previous-20260101-000000").mkdir()
    assert archive_loras(str(folder)) is None                   # nothing at the top
    for name in ("r.safetensors", "r_best.safetensors", "r_it000010.safetensors"):
        (folder / name).write_text(name)
    moved = archive_loras(str(folder))
    assert moved and os.path.dirname(moved) == str(folder) and os.path.basename(moved).startswith("previous-")
    assert sorted(os.listdir(moved)) == ["r.safetensors", "r_best.safetensors", "r_it000010.safetensors"]
    assert sorted(os.listdir(folder)) == sorted(["previous-20260101-000000", os.path.basename(moved)])
    (folder / "r.safetensors").write_text("again")
    second = archive_loras(str(folder))
    assert second != moved and (Path(second) / "r.safetensors").read_text() == "again"


def test_the_taste_model_of_an_earlier_run_is_moved_aside_not_overwritten(tmp_path, monkeypatch):
    """A fresh run of a name whose artist run wrote models/reward_models/<run_name>_taste.safetensors (perhaps a
    reward in another workflow) moves it into ``previous-<time>/`` there, where the loader still lists it; another
    run's taste model stays."""
    import sys
    import types

    from treegrpo.comfyui.watch import archive_taste

    fp = types.SimpleNamespace(models_dir=str(tmp_path), folder_names_and_paths={}, filename_list_cache={})
    fp.add_model_folder_path = lambda name, path: fp.folder_names_and_paths.setdefault(name, ([], set()))[0].append(path)
    fp.get_folder_paths = lambda name: list(fp.folder_names_and_paths[name][0])
    monkeypatch.setitem(sys.modules, "folder_paths", fp)       # ComfyUI's folder registry, as much as is used
    root = tmp_path / "reward_models"
    assert archive_taste("r") is None                           # none written
    (root / "r_taste.safetensors").write_text("earlier")
    (root / "s_taste.safetensors").write_text("another run's")
    moved = archive_taste("r")
    assert os.path.dirname(moved) == str(root) and (Path(moved) / "r_taste.safetensors").read_text() == "earlier"
    assert sorted(os.listdir(root)) == sorted([os.path.basename(moved), "s_taste.safetensors"])


def test_export_checks_its_output_before_reading(tmp_path, capsys):
    import torch
    from treegrpo.lora import save_lora_file

    src = save_lora_file(str(tmp_path / "a.safetensors"),
                         {"m.lora_down.weight": torch.ones(2, 4), "m.lora_up.weight": torch.zeros(4, 2)})
    assert "does not exist; create it first" in _run(["export", src, str(tmp_path / "no" / "b.safetensors")], capsys)
    assert "write a .safetensors file" in _run(["export", src, str(tmp_path / "b.pt")], capsys)
    (tmp_path / "d.safetensors").mkdir()
    assert "is a folder" in _run(["export", src, str(tmp_path / "d.safetensors")], capsys)
    assert "LoRA file not found" in _run(["export", str(tmp_path / "none.safetensors"),
                                          str(tmp_path / "b.safetensors")], capsys)
    assert not (tmp_path / "no").exists() and not (tmp_path / "b.safetensors").exists()
    assert cli.main(["export", src, str(tmp_path / "b.safetensors"), "--format", "peft"]) == 0
    # a file of the user's is never replaced unasked, and the input never rewritten in place
    made = (tmp_path / "b.safetensors").read_bytes()
    assert "exists: give another name, or add --force" in _run(["export", src, str(tmp_path / "b.safetensors")],
                                                               capsys)
    assert (tmp_path / "b.safetensors").read_bytes() == made
    assert "is the input file" in _run(["export", src, src, "--force"], capsys)
    assert cli.main(["export", src, str(tmp_path / "b.safetensors"), "--force"]) == 0


def test_sample_applies_the_modules_ranks_and_alpha_the_lora_file_holds(tmp_path, capsys):
    """A LoRA trained on other targets and rank than the config's sampling section is applied as the file says:
    its modules, its rank, its alpha; the grid differs from the base model's."""
    import numpy as np
    from PIL import Image

    cfg = write(tmp_path, "c.json", base(tmp_path, **{"lora.targets": ["to_q", "to_v"], "lora.rank": 3,
                                                       "lora.alpha": 6.0, "optim.lr": 3e-2, "iterations": 2}))
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 0
    lora = str(tmp_path / "out" / "treegrpo_demo.safetensors")
    with_lora, without = str(tmp_path / "a.png"), str(tmp_path / "b.png")
    assert cli.main(["sample", "--lora", lora, "--output", with_lora, "--per-prompt", "1", "--prompt", "a red circle"]) == 0
    assert cli.main(["sample", "--output", without, "--per-prompt", "1", "--prompt", "a red circle"]) == 0
    a, b = (np.asarray(Image.open(p), dtype=np.float32) for p in (with_lora, without))
    w = min(a.shape[1], b.shape[1])          # the grids at the same place; the titles (LoRA / base model) differ
    assert np.abs(a[18:, :w] - b[18:, :w]).mean() > 0
    # the ComfyUI-style keys of a diffusers-trained file resolve onto the model's own module paths
    import torch
    from treegrpo.lora import LoraFileError, LoraWeights, match_model_modules
    m = torch.nn.Sequential(torch.nn.ModuleDict({"to_q": torch.nn.Linear(4, 4)}))
    w = LoraWeights({"lora_unet_0_to_q": torch.zeros(2, 4)}, {"lora_unet_0_to_q": torch.zeros(4, 2)},
                    {"lora_unet_0_to_q": 2.0})
    assert match_model_modules(w, m).modules == ["0.to_q"]
    with pytest.raises(LoraFileError, match="does not have"):
        match_model_modules(LoraWeights({"x": torch.zeros(2, 4)}, {"x": torch.zeros(4, 2)}, {"x": 1.0}), m)


@pytest.fixture(scope="module")
def cli_startup_s():
    """Seconds this machine takes to start Python and import treegrpo.cli (main's handlers are installed then)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import treegrpo.cli"], cwd=ROOT, check=True)
    return time.perf_counter() - t0


@pytest.mark.parametrize("after_s", [0.1, 0.5, 1.2, 3.5])
def test_ctrl_c_at_any_moment_ends_with_one_line_and_the_interrupt_code(tmp_path, cli_startup_s, after_s):
    """SIGINT (Ctrl-C) to `treegrpo train` after_s after its start-up (measured on this machine): while torch
    imports, the model loads or it trains, the process ends with 130 and one line, never a traceback (a
    half-imported torch used to end in an ImportError and exit 1)."""
    delay_s = 1.5 * cli_startup_s + after_s
    cfg = write(tmp_path, "c.json", base(tmp_path, iterations=500, checkpoint_every=1))
    p = subprocess.Popen([sys.executable, "-m", "treegrpo.cli", "train", "--config", cfg, "--quiet"],
                         cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(delay_s)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == 130, err[-3000:]
    assert "Traceback" not in err and lines and lines[-1].startswith("treegrpo: interrupted"), err[-3000:]


def test_a_ctrl_c_raised_inside_a_finaliser_prints_no_traceback(monkeypatch):
    """Ctrl-C can land while the garbage collector runs a library's ``__del__``: our handler's KeyboardInterrupt is
    then "unraisable" and Python prints "Exception ignored ... Traceback" (seen under load at 3.5 s). While the
    command line runs, the unraisable hook says nothing of it once the interrupt flag is set (the flag stops the run);
    anything else, or before the flag, still reaches the previous hook; main puts the previous hook back."""
    from types import SimpleNamespace

    seen = []
    hook = interrupts._quiet_unraisable(seen.append)
    ki = SimpleNamespace(exc_value=KeyboardInterrupt(), object=None)
    other = SimpleNamespace(exc_value=ValueError("x"), object=None)
    interrupts._INTERRUPT.clear()
    hook(ki)
    assert seen == [ki]                      # not ours: no interrupt was asked for
    interrupts._INTERRUPT.set()
    try:
        hook(ki)
        hook(other)
    finally:
        interrupts._INTERRUPT.clear()
    assert seen == [ki, other]
    before = sys.unraisablehook
    assert cli.main(["rewards"]) == 0 and sys.unraisablehook is before


def test_a_ctrl_c_that_a_library_swallows_still_stops_the_run_with_130(tmp_path, capsys, monkeypatch):
    """A library's bare ``except:`` around its own work (an import guard, a finaliser) can eat the KeyboardInterrupt
    main's handler raises: the handler's flag still stops the trainer at its next step check, and main answers 130
    with the one line, not 0 after a whole run (seen in CI: Ctrl-C 3.6 s after start, exit 0, nothing on stderr)."""
    import treegrpo.backends as backends
    load = backends.load_policy

    def load_and_swallow(*a, **k):
        policy = load(*a, **k)
        try:
            os.kill(os.getpid(), signal.SIGINT)      # the handler runs here, on this thread, and raises ...
            time.sleep(0.05)
        except BaseException:                        # ... and a library swallows it
            pass
        return policy

    monkeypatch.setattr(backends, "load_policy", load_and_swallow)
    cfg = write(tmp_path, "c.json", base(tmp_path, iterations=50))
    before = signal.getsignal(signal.SIGINT)    # Python's default, or SIG_IGN when pytest runs as a background job
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 130
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1].startswith("treegrpo: interrupted"), err
    assert '"iterations"' not in out          # no summary: the run did not go on to its end
    assert not interrupts._INTERRUPT.is_set() and signal.getsignal(signal.SIGINT) is before     # put back as it was


def test_a_sigint_handler_a_library_installed_is_replaced_at_the_next_step(tmp_path, capsys, monkeypatch):
    """A library that installs its own SIGINT handler during start-up (one that only sets its own flag) would make
    Ctrl-C do nothing: main's handler is put back at the trainer's next step check, so a Ctrl-C during iteration 2
    ends the run with 130 and the checkpoint of iteration 1."""
    import treegrpo.backends as backends
    from treegrpo.trainer import Trainer
    load = backends.load_policy

    def load_and_take_sigint(*a, **k):
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        return load(*a, **k)

    step = Trainer.train_step

    def step_then_ctrl_c(self):
        if self.iteration == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        return step(self)

    monkeypatch.setattr(backends, "load_policy", load_and_take_sigint)
    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    cfg = write(tmp_path, "c.json", base(tmp_path, iterations=4, checkpoint_every=1))
    before = signal.getsignal(signal.SIGINT)    # Python's default, or SIG_IGN when pytest runs as a background job
    assert cli.main(["train", "--config", cfg, "--quiet"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("treegrpo: interrupted; the last finished iteration is saved"), err
    run_name = TrainConfig.from_dict(json.loads(Path(cfg).read_text())).run_name
    assert ckpt.checkpoint_paths(str(tmp_path / "out"), run_name)[-1].endswith("-0000001.pt")
    assert signal.getsignal(signal.SIGINT) is before


def _float_fields():
    """(section or None, field) of every float setting of TrainConfig and its sections."""
    import dataclasses
    out = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in cli._SUBS:
            klass = TrainConfig.__dataclass_fields__[f.name].default_factory
            out += [(f.name, g.name) for g in dataclasses.fields(klass) if str(g.type) in ("float", "Optional[float]")]
        elif str(f.type) in ("float", "Optional[float]"):
            out.append((None, f.name))
    return out


def test_every_float_setting_refuses_nan_and_infinity(tmp_path):
    """NaN passes every range comparison and infinity most: each float field of every section refuses both, naming
    the field (TrainConfig.from_dict, the path of config files, flags and the nodes' configs alike)."""
    fields = _float_fields()
    assert len(fields) >= 20, fields
    for sec, name in fields:
        for bad in (float("nan"), float("inf")):
            d = base(tmp_path, **{(f"{sec}.{name}" if sec else name): bad})
            with pytest.raises(ConfigError, match=rf"\.{name}: must be a finite number"):
                TrainConfig.from_dict(d)


def test_a_train_node_run_that_asks_the_artist_is_checkpointed_every_iteration():
    """The Train node checkpoints every 25 iterations (every iteration for a shorter run); a run that asks the artist
    every iteration, so a crash (ComfyUI killed, the machine off) costs at most the answers of the iteration it cut
    instead of up to 24 iterations of them asked again."""
    from treegrpo.comfyui.train_node import train_node_config
    from treegrpo.config import TreeConfig

    kw = dict(prompts=["a red circle"], negative="", reward_specs=[{"name": "demo_adherence", "weight": 1.0}],
              judges=[], cfg=1.0, tree=TreeConfig(), prompts_per_iteration=2, lora_rank=4, lora_alpha=4.0,
              targets=["attn"], learning_rate=1e-3, lr_factor_schedule=[], kl_beta=None, seed=0, run_name="r",
              eval_every=0, eval_prompts=[], memory_budget_gb=0.0, gradient_checkpointing="auto",
              offload_rewards=None, tiled_decode=None, frames=None, reward_frames=None, frame_stride=None)
    assert train_node_config(iterations=200, **kw).checkpoint_every == 25
    assert train_node_config(iterations=10, **kw).checkpoint_every == 10
    assert train_node_config(iterations=200, artist=True, **kw).checkpoint_every == 1


def test_a_run_on_another_base_model_starts_afresh_but_never_resumes(tmp_path):
    """The same run name on another base model (a Train node pointed at another checkpoint): resuming it is refused
    with what to do (before any model work on the Train node, which knows the model's name at once; --overwrite on
    the command line); started afresh, the earlier run's files and its run.json move to ``previous-<time>/`` and the
    folder becomes the new run's. A folder of another run name is refused either way."""
    import json
    import types

    from treegrpo.run_files import RunFiles

    class Run(RunFiles):
        rank = 0

        def __init__(self, out, model):
            self.out, self.base_model_name = str(out), model
            self.cfg, self.loaded = types.SimpleNamespace(run_name="r"), []

        def log(self, msg):
            pass

        def load_checkpoint(self, path, state=None):
            self.loaded.append(path)

    out = tmp_path / "out"
    out.mkdir()
    ckpt.claim_output_dir(str(out), "r", "SDXL/UNet/2567")
    ckpt.write_checkpoint(str(out), "r", 3, {"x": 1}, keep=2)
    (out / "r.safetensors").write_text("sdxl run")
    with pytest.raises(ValueError, match=r"trained on 'SDXL/UNet/2567', not on 'Flux/Flux/11901'.*--overwrite"):
        Run(out, "Flux/Flux/11901").begin(resume=True)
    with pytest.raises(ValueError, match=r"not on 'Flux/Flux/11901'.*Set existing_run to 'new'"):
        ckpt.check_run_folder(str(out), "r", "Flux/Flux/11901", hint="Set existing_run to 'new'")
    ckpt.check_run_folder(str(out), "r", None)                  # the model not known yet: only the run is compared
    assert (out / "r.safetensors").read_text() == "sdxl run"    # nothing moved by a refusal
    run = Run(out, "Flux/Flux/11901")
    run.begin(resume=False)                                     # overwrite / a fresh start: the earlier run aside
    (moved,) = out.glob("previous-*")
    assert (moved / "r.safetensors").read_text() == "sdxl run" and (moved / "checkpoints" / "r-0000003.pt").exists()
    assert json.loads((moved / "run.json").read_text()) == {"run_name": "r", "base_model": "SDXL/UNet/2567"}
    assert json.loads((out / "run.json").read_text()) == {"run_name": "r", "base_model": "Flux/Flux/11901"}
    with pytest.raises(ValueError, match=r"holds run 'r' on 'Flux/Flux/11901'; this is run 's'"):
        ckpt.check_run_folder(str(out), "s", None, fresh=True)


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys, monkeypatch):
    """``--resume --overwrite`` asks to continue a run and to move it aside: refused by the parser (it resumed)."""
    _no_model(monkeypatch)
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--resume", "--overwrite", "--output-dir", str(tmp_path / "out")])
    assert e.value.code == 2 and "--overwrite: not allowed with argument --resume" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_train_node_knows_before_any_work_whether_it_can_write_its_folders(tmp_path):
    """The Train node checks its run folder and its LoRA folder before any model work (a LoRA folder it could not
    write failed after all the training): a path through a file, and a folder of another user, are named; a folder
    still to be made under a writable one is fine, and the check creates nothing."""
    import shutil

    from treegrpo.io import cannot_write

    (tmp_path / "f").write_text("x")
    assert "is a file" in cannot_write(str(tmp_path / "f" / "loras" / "run"))
    assert cannot_write(str(tmp_path)) is None
    assert cannot_write(str(tmp_path / "a" / "b")) is None and not (tmp_path / "a").exists()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to check as another user")
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="treegrpo-perm-"))     # pytest's own folders are closed to other users
    try:
        top.chmod(0o755)
        theirs = top / "loras"
        theirs.mkdir(mode=0o755)
        code = ("import sys; sys.path.insert(0, %r); from treegrpo.io import cannot_write; "
                "print(cannot_write(%r))") % (str(ROOT), str(theirs / "treegrpo" / "run"))
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                              code], capture_output=True, text=True)
    finally:
        shutil.rmtree(top)
    if out.returncode != 0:     # this checkout or its Python closed to other users: nothing to check here
        pytest.skip(f"the other user cannot run this Python here: {out.stderr.strip()[-200:]}")
    assert out.stdout.strip() == f"no permission to write in {str(theirs)!r}"


def test_a_model_chain_change_is_named_in_words():
    """What a resume compares (treegrpo.comfyui.model_chain): another LoRA or strength in front (the same weights
    patched, other values), a LoRA added, another prediction refuse; another shift or patch is only said; a run
    recorded before chains were is not compared."""
    from treegrpo.comfyui.model_chain import check_same_model, compare

    chain = {"sampling": "eps", "schedule": {"sigma_min": 0.03, "sigma_max": 14.6, "shift": None},
             "weights": {"patched": 40, "digest": "a"}, "patches": [], "on_top": True}
    other, said = compare(chain, {**chain, "weights": {"patched": 40, "digest": "b"}})
    assert other == ["the weights under the LoRA: a LoRA loaded in front is another one or at another strength "
                     "(the same 40 weights patched, with other values)"] and said == []
    other, _ = compare(chain, {**chain, "weights": {"patched": 80, "digest": "c"}, "sampling": "v"})
    assert "its prediction eps -> v" in other[0] and "40 weights patched by the nodes in front (LoraLoader) -> 80" in other[1]
    other, said = compare(chain, {**chain, "schedule": {**chain["schedule"], "sigma_max": 12.0},
                                  "patches": ["sampler_cfg_function:rescale_cfg"]})
    assert other == [] and said == ["its noise schedule: sigma_max 14.6 -> 12.0",
                                    "its sampling patches: with sampler_cfg_function:rescale_cfg"]
    with pytest.raises(ValueError, match="run 'r' was trained on another model .* set existing_run"):
        check_same_model(chain, {**chain, "sampling": "v"}, "r", "set existing_run to 'new'")
    assert check_same_model(None, {**chain, "sampling": "v"}, "r", "x") == []          # an older run: not compared
    assert check_same_model(chain, chain, "r", "x") == []
    # the step nodes' run (settings may change between prompts): another strength in front is said, a LoRA added not
    said = check_same_model(chain, {**chain, "weights": {"patched": 40, "digest": "b"}}, "r", "x", steps=True)
    assert len(said) == 1 and "another one or at another strength" in said[0]
    with pytest.raises(ValueError, match="a LoRA added or removed"):
        check_same_model(chain, {**chain, "weights": {"patched": 80, "digest": "b"}}, "r", "x", steps=True)
