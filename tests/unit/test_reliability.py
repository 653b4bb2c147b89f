"""Reliability: a catalogue of bad inputs with the error each gives, property tests over random tree
shapes, atomic saves killed mid-write, no overwriting of another run, LoRAs of another base model."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from treegrpo import cli
from treegrpo.advantages import RewardError, backup_advantages
from treegrpo.config import (AdvantageConfig, ConfigError, LoraConfig, OptimConfig, PipelineConfig, RewardSpec,
                             TrainConfig, TreeConfig)
from treegrpo.lora import LoraFileError, check_base_model
from treegrpo.tree import expected_nfe, level_sizes, sample_trees

from analytic import AnalyticPolicy
from treegrpo.run import build_rewards, run_training

CATALOGUE = [
    (lambda: OptimConfig(lr_schedule="exponential"), ConfigError, r"OptimConfig\.lr_schedule: must be one of"),
    (lambda: OptimConfig(warmup=-1), ConfigError, r"OptimConfig\.warmup: must be >= 0"),
    (lambda: PipelineConfig(family="sd4"), ConfigError, r"PipelineConfig\.family: must be one of"),
    (lambda: PipelineConfig(width=100), ConfigError, r"PipelineConfig\.width: must be 0 .* multiple of 16"),
    (lambda: TrainConfig(backend="diffusers", prompts=["a"]), ConfigError, r"TrainConfig\.model: the diffusers backend"),
    (lambda: TreeConfig(branch=0), ConfigError, r"TreeConfig\.branch: must be >= 1"),
    (lambda: TreeConfig(window_width=0), ConfigError, r"TreeConfig\.window_width: must be >= 1"),
    (lambda: TreeConfig(steps=0), ConfigError, r"TreeConfig\.steps: must be >= 1"),
    (lambda: TreeConfig(steps=6, window_start=4, window_width=3), ConfigError, r"window_start.*allowed window_start: 0\.\.3"),
    (lambda: TreeConfig(steps=2, window_start=0, window_width=3), ConfigError, r"window_width 3 exceeds steps 2"),
    (lambda: TreeConfig(branch=4, window_width=5), ConfigError, r"1024 leaves per tree exceed max_leaves=256"),
    (lambda: TreeConfig(branch=1, window_width=2), ConfigError, r"at least 2 leaves"),
    (lambda: TreeConfig(noise_level=-1.0), ConfigError, r"TreeConfig\.noise_level: must be in \(0, 10\]"),
    (lambda: TreeConfig(noise_level=1e6), ConfigError, r"TreeConfig\.noise_level: must be in \(0, 10\]"),
    (lambda: TreeConfig(eta=1.5), ConfigError, r"TreeConfig\.eta: must be in \(0, 1\]"),
    (lambda: TreeConfig(tail_solver="rk4"), ConfigError, r"TreeConfig\.tail_solver: must be one of"),
    (lambda: TreeConfig(window_schedule="zigzag"), ConfigError, r"TreeConfig\.window_schedule: must be one of"),
    (lambda: TreeConfig(leaf_cap=-2), ConfigError, r"TreeConfig\.leaf_cap: must be >= 0"),
    (lambda: AdvantageConfig(backup="max"), ConfigError, r"AdvantageConfig\.backup: must be one of"),
    (lambda: AdvantageConfig(temperature=0), ConfigError, r"AdvantageConfig\.temperature: must be > 0"),
    (lambda: AdvantageConfig(edge_baseline="grandparent"), ConfigError, r"AdvantageConfig\.edge_baseline: must be one of"),
    (lambda: OptimConfig(lr=0), ConfigError, r"OptimConfig\.lr: must be > 0"),
    (lambda: OptimConfig(lr=-1e-4), ConfigError, r"OptimConfig\.lr: must be > 0"),
    (lambda: OptimConfig(microbatch=0), ConfigError, r"OptimConfig\.microbatch: must be >= 1"),
    (lambda: LoraConfig(rank=0), ConfigError, r"LoraConfig\.rank: must be >= 1"),
    (lambda: LoraConfig(targets=[]), ConfigError, r"LoraConfig\.targets: must name at least one"),
    (lambda: RewardSpec(name="x", weight=-1.0), ConfigError, r"RewardSpec\.weight: must be finite and >= 0"),
    (lambda: RewardSpec(name="x", weight=float("nan")), ConfigError, r"RewardSpec\.weight"),
    (lambda: TrainConfig(prompts=[]), ConfigError, r"TrainConfig\.prompts: empty prompt list"),
    (lambda: TrainConfig(prompts=["a red circle", "  "]), ConfigError, r"every prompt must be a non-empty string"),
    (lambda: TrainConfig(prompts=["p"] * 11, max_prompts=10), ConfigError, r"11 prompts exceed max_prompts=10"),
    (lambda: TrainConfig(prompts=["p"], rewards=[{"name": "a", "weight": 0.0}]), ConfigError, r"reward weights are all zero"),
    (lambda: TrainConfig(prompts=["p"], rewards=[{"name": "a"}, {"name": "a"}]), ConfigError, r"duplicate reward names"),
    (lambda: TrainConfig(prompts=["p"], backend="sdxl"), ConfigError, r"TrainConfig\.backend: must be one of"),
    (lambda: TrainConfig(prompts=["p"], run_name="../x"), ConfigError, r"TrainConfig\.run_name"),
    (lambda: TrainConfig(prompts=["p"], guidance_scale=0.5), ConfigError, r"TrainConfig\.guidance_scale: must be >= 1"),
    (lambda: TrainConfig.from_dict({"prompts": ["p"], "learning_rate": 1}), ConfigError, r"unknown field\(s\) \['learning_rate'\]"),
    (lambda: TrainConfig.from_dict({"prompts": ["p"], "tree": {"brnach": 2}}), ConfigError, r"TreeConfig: unknown field\(s\) \['brnach'\]"),
    (lambda: TrainConfig(prompts_file="/nonexistent/prompts.txt").load_prompts(), ConfigError, r"cannot read '/nonexistent/prompts.txt'"),
    (lambda: build_rewards(TrainConfig(prompts=["p"], rewards=[{"name": "aesthetics9000"}]), "cpu"), ConfigError,
     r"unknown reward model\(s\) \['aesthetics9000'\]; available: .*demo_adherence"),
    (lambda: check_base_model({"treegrpo.base_model": "sdxl"}, "sd15", "l.safetensors"), LoraFileError,
     r"l\.safetensors was trained for base model 'sdxl', not 'sd15'"),
]


@pytest.mark.parametrize("make,exc,message", CATALOGUE, ids=[f"bad{i:02d}" for i in range(len(CATALOGUE))])
def test_bad_input_catalogue(make, exc, message):
    with pytest.raises(exc, match=message):
        make()


def test_non_finite_reward_during_training_names_reward_and_checkpoints(tmp_path):
    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), iterations=3, prompts_per_iter=2, eval_every=0, checkpoint_every=0)
    cfg = TrainConfig.from_dict(d)
    from treegrpo.backends import load_policy
    from treegrpo.trainer import Trainer
    good = build_rewards(cfg, "cpu")["demo_adherence"]
    calls = {"n": 0}

    def flaky(images, prompts):
        calls["n"] += 1
        r = good(images, prompts)
        if calls["n"] == 2:
            r[1] = float("nan")
        return r

    tr = Trainer(cfg, load_policy(cfg)[0], {"demo_adherence": flaky}, progress=False)
    with pytest.raises(RewardError, match=r"reward .demo_adherence. returned non-finite values .* at iteration 1"):
        tr.train()
    ck = tr.latest_checkpoint()
    assert ck and ck.endswith("-0000001.pt")  # the last good state (one finished iteration)


def test_refuses_to_overwrite_another_runs_output(tmp_path):
    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), iterations=1, prompts_per_iter=1, eval_every=0, checkpoint_every=0)
    run_training(TrainConfig.from_dict(d), progress=False)
    d["run_name"] = "other_run"
    with pytest.raises(ValueError, match=r"holds run 'treegrpo_demo'.*this is run 'other_run'"):
        run_training(TrainConfig.from_dict(d), progress=False)


WRITER = r"""
import sys, time, torch
from treegrpo.lora import save_lora_file
def slow(tmp):
    open(tmp, "wb").write(b"partial" * 1000)
    print("writing", flush=True)
    time.sleep(60)
import treegrpo.io as io
io.atomic_write(sys.argv[1], slow)
"""


def test_killed_writer_leaves_the_previous_file_intact(tmp_path):
    from treegrpo.lora import read_lora_file, save_lora_file
    path = str(tmp_path / "lora.safetensors")
    save_lora_file(path, {"a.lora_down.weight": torch.ones(2, 3), "a.lora_up.weight": torch.ones(3, 2)},
                   {"treegrpo.step": "1"})
    p = subprocess.Popen([sys.executable, "-c", WRITER, path], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    tensors, meta = read_lora_file(path)
    assert meta["treegrpo.step"] == "1" and torch.equal(tensors["a.lora_down.weight"], torch.ones(2, 3))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(T=st.integers(2, 9), k=st.integers(1, 4), w=st.integers(1, 4), data=st.data())
def test_random_trees_nfe_leaves_and_advantage_invariants(T, k, w, data):
    w = min(w, T)
    if k ** w < 2 or k ** w > 64:
        return
    s = data.draw(st.integers(0, T - w))
    cap = data.draw(st.sampled_from([0, 0, 3, 5]))
    cfg = TreeConfig(steps=T, window_start=s, window_width=w, branch=k, leaf_cap=cap)
    pol = AnalyticPolicy("flow", shape=(2, 1, 1))
    n_trees = data.draw(st.integers(1, 3))
    tb = sample_trees(pol, ["p0"] * n_trees, cfg, generator=torch.Generator().manual_seed(0))
    sizes = level_sizes(cfg.branching, cfg.leaf_cap)
    assert tb.nfe == n_trees * expected_nfe(cfg) == sum(pol.rows)
    assert tb.leaves.shape[0] == n_trees * sizes[-1] == n_trees * cfg.leaves
    r = torch.tensor(data.draw(st.lists(st.floats(-5, 5), min_size=tb.leaves.shape[0], max_size=tb.leaves.shape[0])))
    backup_advantages(tb, {"r": r}, {"r": 1.0}, AdvantageConfig(backup="mean", adv_clip=0, flat_floor=0,
                                                                edge_baseline="none"))
    leaf = tb.advantages[-1]
    per = tb.leaves.shape[0] // n_trees
    for t in range(n_trees):
        assert abs(float(leaf[t * per:(t + 1) * per].mean())) < 1e-4       # zero-mean leaf advantages
    for j in range(1, tb.width):                                          # mean backup averages children
        child, par = tb.advantages[j], tb.parents[j]
        for u in range(tb.advantages[j - 1].numel()):
            assert abs(float(tb.advantages[j - 1][u]) - float(child[par == u].mean())) < 1e-5
    paper = [a.clone() for a in tb.advantages]
    backup_advantages(tb, {"r": r}, {"r": 1.0}, AdvantageConfig(backup="mean", adv_clip=0, flat_floor=0))
    for j in range(1, tb.width):                                          # sibling baseline: sibling sums are 0
        par = tb.parents[j]
        for u in range(paper[j - 1].numel()):
            if int((par == u).sum()) >= 2:
                assert abs(float(tb.advantages[j][par == u].sum())) < 1e-4
                assert torch.allclose(tb.advantages[j][par == u], paper[j][par == u] - paper[j - 1][u], atol=1e-5)


DISK_FULL_WRITER = r"""
import resource, signal, sys, torch
from treegrpo.lora import save_lora_file
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # the kernel then fails the write with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # files may not grow past 4 KiB: the disk is "full"
try:
    save_lora_file(sys.argv[1], {"a.lora_down.weight": torch.zeros(64, 64), "a.lora_up.weight": torch.zeros(64, 64)},
                   {"treegrpo.step": "2"})
except OSError as e:
    print("failed", type(e).__name__, str(e), flush=True)
    sys.exit(0)
print("written", flush=True)
"""


def test_disk_full_during_save_leaves_the_previous_file_intact(tmp_path):
    """A real write failure from the kernel (file-size limit -> EFBIG mid-write, as ENOSPC would be):
    the save raises, the previous LoRA is untouched and no temporary file is left behind."""
    import errno
    from treegrpo.lora import read_lora_file, save_lora_file
    path = str(tmp_path / "lora.safetensors")
    save_lora_file(path, {"a.lora_down.weight": torch.ones(2, 3), "a.lora_up.weight": torch.ones(3, 2)},
                   {"treegrpo.step": "1"})
    before = open(path, "rb").read()
    p = subprocess.run([sys.executable, "-c", DISK_FULL_WRITER, path], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("failed SaveError could not save " + path), p.stdout
    assert os.strerror(errno.EFBIG) in p.stdout and "previous file" in p.stdout
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["lora.safetensors"]
    tensors, meta = read_lora_file(path)
    assert meta["treegrpo.step"] == "1"


def test_a_diverged_run_is_said_to_have_diverged_not_blamed_on_its_reward(tmp_path, capsys):
    """A learning rate of 1e6: the LoRA blows up and the images turn NaN; the line says the sampling diverged and
    what to change (it said the reward model returned non-finite values: check the reward model)."""
    rc = cli.main(["train", "--optim.lr", "1e6", "--iterations", "4", "--eval-every", "0", "--quiet",
                   "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "hold NaN or infinite values: the sampling diverged" in err and "optim.lr" in err, err
    assert "check the reward model" not in err
