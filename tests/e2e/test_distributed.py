"""Data parallel on the CPU: ``torchrun --nproc_per_node 2`` (gloo) of ``treegrpo train`` gives the same
LoRA as one process over the same trees (within float tolerance of the all-reduce's summation order)."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from treegrpo import cli
from treegrpo.lora import read_lora_file


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(out, **kw) -> dict:
    d = cli.demo_config_dict()
    d.update(output_dir=str(out), iterations=2, prompts_per_iter=5, trees_per_prompt=2, eval_every=0,
             checkpoint_every=0, run_name="ddp", advantage={"flat_floor": 0.0, "reward_stats": "prompt"})
    d.update(kw)
    return d


@pytest.mark.parametrize("std_scope,resumed", [("tree", False), ("batch", True)])
def test_two_process_gloo_run_equals_one_process(tmp_path, std_scope, resumed):
    """(``std_scope`` batch: each rank divides by the whole batch's reward RMS, pooled over ranks. ``resumed``: the
    two processes stop after the first iteration and ``--resume`` the second: every process goes on from the
    checkpoint, which only the first one reads.)"""
    one, two = tmp_path / "one", tmp_path / "two"
    for out in (one, two):
        out.mkdir()
        cfg = _config(out)
        cfg["advantage"]["std_scope"] = std_scope
        (out / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    r1 = subprocess.run([sys.executable, "-m", "treegrpo.cli", "train", "--quiet", "--config", str(one / "cfg.json")],
                        capture_output=True, text=True, timeout=600, env=env)
    assert r1.returncode == 0, r1.stderr[-3000:]
    train = ["-m", "treegrpo.cli", "train", "--quiet", "--config", str(two / "cfg.json")]
    if resumed:
        r0 = _torchrun(train + ["--iterations", "1"], env)
        assert r0.returncode == 0, r0.stderr[-3000:]
        train += ["--resume"]
    r2 = _torchrun(train, env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stdout.count('"iterations": 2') == 1  # only rank 0 reports (and writes)
    if resumed:
        assert r2.stdout.count("resumed from") == 1 and "after iteration 1" in r2.stdout
    a = read_lora_file(str(one / "ddp.safetensors"))[0]
    b = read_lora_file(str(two / "ddp.safetensors"))[0]
    assert a.keys() == b.keys()
    moved = max(float(v.abs().max()) for k, v in a.items() if k.endswith("lora_up.weight"))
    assert moved > 1e-4
    log1 = json.load(open(one / "log.json"))["train"]
    log2 = json.load(open(two / "log.json"))["train"]
    # rank 0 sampled 3 of the 5 prompts (6 of 10 trees): unequal shares, so the edge weighting matters.
    # Its log reports the whole batch (all ranks' trees), as the one process does
    for k in ("nfe", "edges", "parents", "flat_trees", "total_nfe"):
        assert [h[k] for h in log2] == [h[k] for h in log1], k
    for k in ("reward", "reward_std", "reward/demo_adherence"):   # (the on-policy loss is ~1e-9: float noise)
        assert [h[k] for h in log2] == pytest.approx([h[k] for h in log1], rel=1e-5), k
    # the all-reduced gradient is the one-process gradient (its norm, before clipping, to float precision)
    for h1, h2 in zip(log1, log2):
        assert abs(h1["grad_norm"] - h2["grad_norm"]) <= 1e-5 * h1["grad_norm"], (h1["grad_norm"], h2["grad_norm"])
    # Adam divides by √v, so float-level gradient differences show up at ~1e-3 of the step size at most
    lr = _config(one)["optim"]["lr"]
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-2 * lr, rtol=0), (k, float((a[k] - b[k]).abs().max()))


def _torchrun(args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_time_budget_and_time_based_lr_are_shared_by_the_ranks(tmp_path):
    """Under a time budget every rank must stop at the same iteration (else one waits forever in the
    gradient all-reduce) and set the same lr: the ranks agree on the clock, the slowest rank's time."""
    script = tmp_path / "clock.py"
    script.write_text("import sys\nfrom treegrpo.distributed import DataParallel\n"
                      "dp = DataParallel(cpu=True)\n"
                      "open(f'{sys.argv[1]}/clock{dp.rank}.txt', 'w').write(str(dp.max_over_ranks(0.25 + dp.rank)))\n"
                      "dp.close()\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    r = _torchrun([str(script), str(tmp_path)], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(tmp_path / f"clock{i}.txt").read_text() for i in (0, 1)] == ["1.25", "1.25"]

    out = tmp_path / "budget"
    out.mkdir()
    cfg = _config(out, iterations=10 ** 6, time_budget_s=3.0, optim={"lr_schedule": "cosine", "lr": 3e-3})
    (out / "cfg.json").write_text(json.dumps(cfg))
    r = _torchrun(["-m", "treegrpo.cli", "train", "--quiet", "--config", str(out / "cfg.json")], env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("TreeGRPO: data parallel over 2 processes (gloo)") == 1, r.stdout[-2000:]   # rank 0's
    log = json.load(open(out / "log.json"))["train"]
    assert len(log) >= 2 and log[-1]["train_time"] >= 3.0 > log[-2]["train_time"]
    assert log[-1]["lr"] < log[0]["lr"] == 3e-3


def test_an_iteration_without_edges_steps_no_process(tmp_path):
    """A batch whose every tree is too flat to train (``flat_floor``) takes no optimiser step in one process; over
    two it took one on every process with the all-reduced zero gradient (found by a team's walk: AdamW's weight decay
    and step count moved, and the two-process run drifted from the one-process one). Now no process steps."""
    one, two = tmp_path / "one", tmp_path / "two"
    for out in (one, two):
        out.mkdir()
        cfg = _config(out, iterations=1, advantage={"flat_floor": 1e9}, optim={"weight_decay": 0.5})
        (out / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    r1 = subprocess.run([sys.executable, "-m", "treegrpo.cli", "train", "--quiet", "--config", str(one / "cfg.json")],
                        capture_output=True, text=True, timeout=600, env=env)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = _torchrun(["-m", "treegrpo.cli", "train", "--quiet", "--config", str(two / "cfg.json")], env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert json.load(open(two / "log.json"))["train"][0]["edges"] == 0
    a = read_lora_file(str(one / "ddp.safetensors"))[0]
    b = read_lora_file(str(two / "ddp.safetensors"))[0]
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]


def test_processes_started_with_different_settings_are_refused_on_every_process(tmp_path):
    """Each process trains a share of one batch with one LoRA: a process given another learning rate trained apart
    silently, and one given more iterations waited for the others for ever (a team's walk). Refused at start-up,
    before any model loads, on every process, naming the process and the settings."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "cfg.json").write_text(json.dumps(_config(out)))
    script = tmp_path / "per_rank.py"
    script.write_text("import os, sys\nfrom treegrpo import cli\n"
                      f"args = ['train', '--quiet', '--config', {str(out / 'cfg.json')!r}]\n"
                      "if os.environ['RANK'] == '1':\n    args += ['--optim.lr', '0.1', '--iterations', '6']\n"
                      "sys.exit(cli.main(args))\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    r = _torchrun([str(script)], env, timeout=300)
    assert r.returncode != 0
    line = ("]: error: the 2 processes were started with different settings than process 0 (process 1: "
            "iterations, optim.lr): give every process the same config file and flags")
    for rank in (0, 1):      # each process's line names it
        assert r.stderr.count(f"treegrpo [process {rank} of 2{line}") == 1, r.stderr[-3000:]
    assert not (out / "ddp.safetensors").exists() and not (out / "checkpoints").exists()


def test_a_process_waits_for_rank_0s_evaluation_as_long_as_the_readme_says(monkeypatch):
    """Rank 0 evaluates alone while the others wait in their next all-reduce: torch's default (10 minutes with NCCL)
    ended a run whose evaluation of a large model took longer (a team's walk, with the timeout shortened). The
    processes wait ``TREEGRPO_DIST_TIMEOUT_S`` (the README's default); a value that is not seconds is refused."""
    import datetime
    from pathlib import Path

    from treegrpo.config import ConfigError
    from treegrpo.distributed import DEFAULT_TIMEOUT_S, collective_timeout, flat_settings

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"`TREEGRPO_DIST_TIMEOUT_S` ({DEFAULT_TIMEOUT_S} s)" in readme
    monkeypatch.delenv("TREEGRPO_DIST_TIMEOUT_S", raising=False)
    assert collective_timeout() == datetime.timedelta(seconds=DEFAULT_TIMEOUT_S) > datetime.timedelta(minutes=10)
    monkeypatch.setenv("TREEGRPO_DIST_TIMEOUT_S", "90")
    assert collective_timeout() == datetime.timedelta(seconds=90)
    for bad in ("soon", "0", "-5", "inf"):
        monkeypatch.setenv("TREEGRPO_DIST_TIMEOUT_S", bad)
        with pytest.raises(ConfigError, match="TREEGRPO_DIST_TIMEOUT_S"):
            collective_timeout()
    assert flat_settings({"optim": {"lr": 1.0, "x": {"y": 2}}, "iterations": 3}) == {
        "optim.lr": 1.0, "optim.x.y": 2, "iterations": 3}
