"""The training loop on the embedded demo model: learning, logging, files, resume, CLI, validation."""
import csv
import json
import os

import pytest
import torch

from treegrpo import cli
from treegrpo.config import ConfigError, TrainConfig
from treegrpo.lora import from_state_dict, read_lora_file
from treegrpo.run import build_rewards, run_training


def _cfg(tmp_path, **kw):
    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), eval_every=0, checkpoint_every=0)
    for k, v in kw.items():
        if isinstance(v, dict):
            d[k] = dict(d[k], **v)
        else:
            d[k] = v
    return TrainConfig.from_dict(d)


@pytest.mark.parametrize("kw,field", [
    (dict(tree={"branch": 0}), "TreeConfig.branch"),
    (dict(tree={"window_width": 0}), "TreeConfig.window_width"),
    (dict(tree={"steps": 4, "window_start": 2, "window_width": 3}), "TreeConfig.window_start"),
    (dict(prompts=[]), "TrainConfig.prompts"),
    (dict(rewards=[{"name": "demo_adherence", "weight": 0.0}]), "TrainConfig.rewards"),
    (dict(rewards=[{"name": "demo_adherence", "weight": -1.0}]), "RewardSpec.weight"),
    (dict(lora={"rank": 0}), "LoraConfig.rank"),
    (dict(optim={"lr": 0.0}), "OptimConfig.lr"),
    (dict(backend="sdxl"), "TrainConfig.backend"),
    (dict(backend="diffusers"), "TrainConfig.model"),
])
def test_config_errors_name_the_field(tmp_path, kw, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _cfg(tmp_path, **kw)


def test_gradient_checkpointing_is_one_switch_and_the_earlier_one_still_reads(tmp_path):
    """memory.checkpointing is the one switch; configs and command lines that name pipeline.gradient_checkpointing
    (a second switch until 2026-12) mean the same: true = on unless memory says otherwise, false = the plan's choice;
    the chosen setting reaches the policy with or without a memory plan (here the CPU: none)."""
    import argparse

    from treegrpo.checkpoint import config_changes
    from treegrpo.config import PipelineConfig

    base = cli.demo_config_dict()
    assert "gradient_checkpointing" not in PipelineConfig.__dataclass_fields__
    on = TrainConfig.from_dict({**base, "pipeline": {"gradient_checkpointing": True}})
    assert on.memory.checkpointing == "on"
    assert TrainConfig.from_dict({**base, "pipeline": {"gradient_checkpointing": False}}).memory.checkpointing == "auto"
    kept = TrainConfig.from_dict({**base, "pipeline": {"gradient_checkpointing": True}, "memory": {"checkpointing": "off"}})
    assert kept.memory.checkpointing == "off"
    saved, dropped = TrainConfig.from_dict_known({**base, "pipeline": {"gradient_checkpointing": True}})
    assert saved.memory.checkpointing == "on" and dropped == []
    with pytest.raises(ConfigError, match="gradient_checkpointing: true or false"):
        TrainConfig.from_dict({**base, "pipeline": {"gradient_checkpointing": "maybe"}})
    p = argparse.ArgumentParser()
    cli.add_config_flags(p)
    ns = p.parse_args(["--pipeline.gradient_checkpointing", "true"])
    assert TrainConfig.from_dict(cli.apply_flags(dict(base), ns)).memory.checkpointing == "on"

    from treegrpo.backends import load_policy
    from treegrpo.run import build_trainer

    cfg = TrainConfig.from_dict({**base, "output_dir": str(tmp_path), "memory": {"checkpointing": "on"}})
    tr = build_trainer(cfg, load_policy(cfg)[0], build_rewards(cfg, torch.device("cpu")), progress=False)
    assert tr.plan_memory() is None            # no budget on a CPU: no plan ...
    assert tr.policy.model.gradient_checkpointing is True   # ... and the user's choice is in effect


def test_guidance_scale_is_read_under_its_earlier_name_cfg(tmp_path):
    """``guidance_scale`` was ``cfg`` until 2026-12: config files, checkpoints' configs and the ``--cfg`` flag that
    name it still mean it; both names with different values are refused naming both; a run resumed from a checkpoint
    whose config says ``cfg`` sees no change of settings."""
    import argparse

    from treegrpo.checkpoint import config_changes

    base = {k: v for k, v in cli.demo_config_dict().items() if k != "guidance_scale"}
    assert TrainConfig.from_dict({**base, "cfg": 3.0}).guidance_scale == 3.0
    assert TrainConfig.from_dict({**base, "cfg": 3.0, "guidance_scale": 3.0}).guidance_scale == 3.0
    assert TrainConfig.from_dict_known({**base, "cfg": 2.5})[0].guidance_scale == 2.5
    with pytest.raises(ConfigError, match=r"both cfg \(3\.0\) and guidance_scale \(2\.0\)"):
        TrainConfig.from_dict({**base, "cfg": 3.0, "guidance_scale": 2.0})
    p = argparse.ArgumentParser()
    cli.add_config_flags(p)
    for flag in ("--cfg", "--guidance-scale"):
        ns = p.parse_args([flag, "4.5"])
        assert TrainConfig.from_dict(cli.apply_flags(dict(base), ns)).guidance_scale == 4.5
    now = TrainConfig.from_dict({**base, "guidance_scale": 2.0})
    old = {("cfg" if k == "guidance_scale" else k): v for k, v in now.to_dict().items()}
    assert "cfg" in old and config_changes(old, now) == []
    assert config_changes({**old, "cfg": 3.0}, now) == ["guidance_scale: 3.0 -> 2.0"]


def test_a_prompt_given_by_flag_keeps_its_commas():
    """``--prompts`` / ``--eval-prompts``: one prompt per flag, repeated, or a JSON list; a comma is part of the
    prompt (list flags of numbers still split on commas: ``--tree.branch_schedule 4,2``)."""
    import argparse

    p = argparse.ArgumentParser()
    cli.add_config_flags(p)
    ns = p.parse_args(["--prompts", "a cat, sitting on a mat", "--prompts", "a dog", "--eval-prompts", '["x, y", "z"]',
                       "--tree.branch_schedule", "4,2"])
    d = cli.apply_flags(cli.demo_config_dict(), ns)
    assert d["prompts"] == ["a cat, sitting on a mat", "a dog"] and d["eval_prompts"] == ["x, y", "z"]
    assert d["tree"]["branch_schedule"] == [4, 2]
    with pytest.raises(ConfigError, match="--prompts.*JSON list"):
        cli.apply_flags(cli.demo_config_dict(), p.parse_args(["--prompts", '["a", ']))


def test_a_run_trains_on_one_prompt_list_never_ignoring_a_prompts_file():
    """A config holding both inline prompts and a prompts file is refused (the file was ignored); a prompt flag
    replaces the config's prompts whichever way it held them; a checkpoint written with both reads as it trained."""
    import argparse

    from treegrpo.checkpoint import config_changes

    p = argparse.ArgumentParser()
    cli.add_config_flags(p)
    d = cli.apply_flags(cli.demo_config_dict(), p.parse_args(["--prompts-file", "treegrpo/general_subjects.txt"]))
    cfg = TrainConfig.from_dict(d)
    assert cfg.prompts == [] and len(cfg.load_prompts()) == 50
    d = cli.apply_flags(dict(cli.demo_config_dict(), prompts=[], prompts_file="p.txt"),
                        p.parse_args(["--prompts", "a cat"]))
    assert TrainConfig.from_dict(d).load_prompts() == ["a cat"]
    with pytest.raises(ConfigError, match="'p.txt' and 24 inline prompts are both given.*remove `prompts`"):
        TrainConfig.from_dict(dict(cli.demo_config_dict(), prompts_file="p.txt"))
    with pytest.raises(ConfigError, match="both given"):
        TrainConfig.from_dict(cli.apply_flags(cli.demo_config_dict(), p.parse_args(
            ["--prompts", "a cat", "--prompts-file", "p.txt"])))
    now = TrainConfig.from_dict(cli.demo_config_dict())
    assert config_changes(dict(now.to_dict(), prompts_file="p.txt"), now) == []


def test_a_resumed_run_compares_its_prompt_files_prompts_not_its_path(tmp_path, monkeypatch):
    """The same prompts file named by another path resumes; the same path with other lines is a change of settings."""
    from treegrpo.checkpoint import CheckpointError, check_resume

    (tmp_path / "p.txt").write_text("a red circle\na blue square\n")
    d = cli.demo_config_dict()
    d.update(prompts=[], prompts_file="p.txt", iterations=1, prompts_per_iter=2, trees_per_prompt=1, eval_every=0,
             output_dir=str(tmp_path / "out"), run_name="pf")
    monkeypatch.chdir(tmp_path)
    run_training(TrainConfig.from_dict(d), progress=False)
    assert check_resume(str(tmp_path / "out"), TrainConfig.from_dict({**d, "prompts_file": str(tmp_path / "p.txt")}))
    (tmp_path / "p.txt").write_text("a red circle\na green star\n")
    with pytest.raises(CheckpointError, match="the prompts in 'p.txt' are not the ones the run was trained on"):
        check_resume(str(tmp_path / "out"), TrainConfig.from_dict(d))
    # a file with '# ' lines (an earlier version trained on them as prompts): the refusal says they are comments now
    (tmp_path / "p.txt").write_text("# shapes\na red circle\na green star\n")
    with pytest.raises(CheckpointError, match="its 1 line beginning '# ' is comments since 2026-12-07; an earlier "
                                              "version trained on them as prompts"):
        check_resume(str(tmp_path / "out"), TrainConfig.from_dict(d))


def test_fewer_prompts_per_iteration_than_processes_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    from treegrpo.run import prepare

    monkeypatch.setenv("WORLD_SIZE", "4")           # as torchrun --nproc_per_node 4 sets it
    d = cli.demo_config_dict()
    d.update(prompts_per_iter=2, output_dir=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="2 prompts per iteration cannot be split over 4 processes"):
        prepare(TrainConfig.from_dict(d))
    assert not (tmp_path / "out").exists()          # before any file


def test_one_evaluation_seed_says_the_diversity_warning_is_off_and_a_finished_run_says_so(tmp_path, capsys):
    from treegrpo.run import prepare

    d = cli.demo_config_dict()
    d.update(eval_seeds=1, iterations=1, prompts_per_iter=2, eval_every=0, output_dir=str(tmp_path / "out"),
             run_name="done")
    with pytest.warns(UserWarning, match=r"eval_seeds 1: .*signals\.diversity_floor\) is off"):
        prepare(TrainConfig.from_dict(d))
    run_training(TrainConfig.from_dict(d), progress=False)
    capsys.readouterr()
    tr, _ = run_training(TrainConfig.from_dict(d), resume=True, progress=False)     # queued again when finished
    assert tr.iteration == 1
    assert "already at iteration 1 of 1, nothing left to train" in capsys.readouterr().out


def test_a_reader_that_leaves_early_ends_the_command_quietly(monkeypatch, capsys):
    """``treegrpo config | head``: the pipe closes under the printing; exit 1, no traceback. A broken pipe that is
    not the output's (a child process, a socket) is not hidden."""
    import io
    import sys

    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert cli.main(["config"]) == 1
    monkeypatch.setattr(sys, "stdout", io.StringIO())

    def child_gone(ns):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "cmd_config", child_gone)
    with pytest.raises(BrokenPipeError):
        cli.main(["config"])


def test_cli_rejects_bad_input_before_loading_any_model(tmp_path, monkeypatch, capsys):
    import treegrpo.backends as backends

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the configuration was checked")

    monkeypatch.setattr(backends, "load_policy", no_load)
    assert cli.main(["train", "--tree.branch", "0", "--output-dir", str(tmp_path)]) == 2
    assert "TreeConfig.branch" in capsys.readouterr().err
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps(dict(cli.demo_config_dict(), rewards=[{"name": "aesthetics9000"}])))
    assert cli.main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown reward model" in err and "demo_adherence" in err


@pytest.mark.slow
def test_short_training_run_raises_reward(tmp_path):
    """Seeded: 30 TreeGRPO iterations (the demo's settings) lift the fixed-noise evaluation reward."""
    cfg = _cfg(tmp_path, iterations=30, eval_every=30, prompts_per_iter=16)
    trainer, summary = run_training(cfg, progress=False)
    before, after = trainer.evals[0]["eval_reward"], trainer.evals[-1]["eval_reward"]
    print(f"eval reward {before:.4f} -> {after:.4f}")
    # measured, seeds 0/1/2: +0.037/+0.068/+0.089 (sibling baseline), +0.084/+0.054/+0.045 (paper's advantages);
    # no learning stays at 0 and a sign error goes down. How much it learns is the benchmarks' job.
    assert after - before > 0.03, (before, after)
    assert os.path.exists(summary["lora"]) and os.path.exists(tmp_path / "log.csv")
    log = json.load(open(tmp_path / "log.json"))
    assert len(log["train"]) == 30 and all(h["nfe"] == 16 * (1 + 7 + 8 * 3) for h in log["train"])
    # the evaluations as a table too: one row each, the figures of log.json's eval records
    with open(tmp_path / "eval.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["iteration"]) for r in rows] == [0, 30] == [e["iteration"] for e in log["eval"]]
    assert list(rows[0])[:4] == ["iteration", "train_time", "total_nfe", "eval_reward"]
    assert [float(r["eval_reward"]) for r in rows] == [e["eval_reward"] for e in log["eval"]]


def test_eval_csv_has_a_column_for_every_figure_and_joins_warnings(tmp_path):
    """An evaluation without a judge and one with warnings share one table: empty cells, warnings joined."""
    from treegrpo.run_files import EVAL_FIRST, write_csv
    recs = [{"iteration": 0, "eval_reward": 0.5, "diversity": 0.2},
            {"iteration": 5, "eval_reward": 0.7, "eval_judge": 0.6, "warnings": ["a", "b"], "rejected": True}]
    write_csv(str(tmp_path / "e.csv"), recs, first=EVAL_FIRST, join_lists=True)
    with open(tmp_path / "e.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["iteration", "eval_reward", "eval_judge", "diversity", "rejected", "warnings"]
    assert rows[0]["eval_judge"] == "" and rows[1]["warnings"] == "a; b" and rows[1]["rejected"] == "True"


def test_resume_gives_the_same_lora_bytes(tmp_path):
    full = _cfg(tmp_path / "a", iterations=4, prompts_per_iter=2, checkpoint_every=2, run_name="r")
    run_training(full, progress=False)
    part = _cfg(tmp_path / "b", iterations=2, prompts_per_iter=2, checkpoint_every=2, run_name="r")
    run_training(part, progress=False)
    rest = _cfg(tmp_path / "b", iterations=4, prompts_per_iter=2, checkpoint_every=2, run_name="r")
    tr, _ = run_training(rest, resume=True, progress=False)
    assert tr.iteration == 4
    a = read_lora_file(str(tmp_path / "a" / "r.safetensors"))[0]
    b = read_lora_file(str(tmp_path / "b" / "r.safetensors"))[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_moved_to_another_front_end_keeps_the_noise_levels_it_was_trained_with(tmp_path):
    """A checkpoint carries the run's schedule. Resuming it on another backend (a run from ComfyUI's Train node)
    whose policy spaces the levels differently samples on the checkpoint's, in the trees and the evaluation. On the
    same backend, for another step count, or from an older checkpoint without a schedule, the policy's apply."""
    from treegrpo.demo.model import flow_sigmas
    from treegrpo.trainer import Trainer
    from treegrpo.backends.demo import DemoPolicy

    cfg = _cfg(tmp_path, iterations=1, prompts_per_iter=2, run_name="s", checkpoint_every=1, eval_seeds=1)
    tr, _ = run_training(cfg, progress=False)
    state = torch.load(tr.latest_checkpoint(), weights_only=True)
    assert torch.equal(state["sigmas"], flow_sigmas(cfg.tree.steps))
    other = torch.linspace(1.0, 0.0, cfg.tree.steps + 1) ** 2
    from_node = dict(state, sigmas=other, config=json.dumps(dict(json.loads(state["config"]), backend="comfy")))
    logged = []
    fresh = Trainer(cfg, DemoPolicy.load(), rewards={"demo_adherence": lambda im, p: torch.zeros(len(p))})
    fresh.log = logged.append
    fresh.load_checkpoint(tr.latest_checkpoint(), from_node)
    assert torch.equal(fresh.sigmas(), other) and "'comfy' backend and continues on its noise levels" in logged[0]
    assert torch.equal(fresh.sample().sigmas.cpu(), other)
    seen = []
    orig = fresh.policy.denoise
    fresh.policy.denoise = lambda x, sig, c, g: seen.append(float(sig.reshape(-1)[0])) or orig(x, sig, c, g)
    fresh.evaluate(seeds=1)
    assert seen[:2] == [float(other[0]), float(other[1])]
    own = flow_sigmas(cfg.tree.steps)
    for st in (dict(state, sigmas=other),                                   # same backend: e.g. a new shift applies
               dict(from_node, sigmas=torch.linspace(1, 0, 4)),             # another step count
               {k: v for k, v in from_node.items() if k != "sigmas"}):      # an older checkpoint
        fresh.load_checkpoint(tr.latest_checkpoint(), st)
        assert fresh.kept_sigmas is None and torch.equal(fresh.sigmas(), own)
    with pytest.raises(ValueError, match="does not fit"):
        from treegrpo.tree import schedule
        schedule(fresh.policy, 5, other)


def test_demo_cli_writes_all_outputs(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = cli.main(["demo", "--quiet", "--output-dir", str(out), "--iterations", "2", "--prompts-per-iter", "2",
                   "--eval-every", "1", "--eval-seeds", "2", "--grid-prompts", "2"])
    assert rc == 0
    for f in ("treegrpo_demo.safetensors", "reward_curve.png", "samples_before_after.png", "summary.json"):
        assert (out / f).stat().st_size > 0, f
    s = json.load(open(out / "summary.json"))
    assert s["tree_iterations"] == 2 and s["baseline_iterations"] >= 1
    tensors, meta = read_lora_file(str(out / "treegrpo_demo.safetensors"))
    assert all(k.startswith("diffusion_model.") for k in tensors)
    assert meta["treegrpo.method"] == "tree" and meta["treegrpo.step"] == "2" and "treegrpo.loss" not in meta
    assert from_state_dict(tensors, meta).modules
    printed = capsys.readouterr().out
    assert "TreeGRPO" in printed and "trajectory GRPO" in printed


def test_interrupted_run_with_lr_schedule_resumes_to_the_same_lora_bytes(tmp_path):
    """A cosine schedule with warm-up: stopped (by the stop callback) after 2 of 4 iterations, checkpointed,
    resumed by a new process-like Trainer -> the same LoRA tensors as an uninterrupted 4-iteration run."""
    from treegrpo.backends import load_policy
    from treegrpo.trainer import Trainer, TrainingInterrupted

    optim = {"lr_schedule": "cosine", "warmup": 1}
    full = _cfg(tmp_path / "a", iterations=4, prompts_per_iter=2, run_name="r", optim=optim)
    tr_a, _ = run_training(full, progress=False)
    assert [round(h["lr"] / full.optim.lr, 6) for h in tr_a.history] == [0.5, 1.0, 0.75, 0.25]

    cfg = _cfg(tmp_path / "b", iterations=4, prompts_per_iter=2, run_name="r", optim=optim)
    rewards = build_rewards(cfg, torch.device("cpu"))
    policy, name = load_policy(cfg)
    tr = Trainer(cfg, policy, rewards, progress=False, base_model_name=name,
                 stop=lambda: len(tr.history) >= 2)
    with pytest.raises(TrainingInterrupted):
        tr.train()
    ck = torch.load(tr.latest_checkpoint(), weights_only=True)
    assert ck["iteration"] == 2 and "numpy_rng" in ck  # the lr is a function of (iteration, train_time)
    tr_b, _ = run_training(cfg, resume=True, progress=False)
    assert [h["lr"] for h in tr_b.history] == [h["lr"] for h in tr_a.history]
    a = read_lora_file(str(tmp_path / "a" / "r.safetensors"))[0]
    b = read_lora_file(str(tmp_path / "b" / "r.safetensors"))[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class _StepClock:
    """A stand-in for the trainer's ``time`` module: every ``perf_counter()`` call advances ``step`` seconds, so an
    iteration's measured time is the same on every machine and under any load (t_sample, t_decode, t_reward and
    t_assign one step each, t_update two: 1.25 s at step 0.25)."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.t += self.step
        return self.t


def test_lr_schedule_follows_the_time_budget_when_it_ends_the_run_first(tmp_path, monkeypatch):
    """cosine over a run stopped by ``time_budget_s``: each iteration's lr is set from the training time
    used before it (the iteration count, 10⁶, is far away), so the schedule ends with the budget."""
    import math

    from treegrpo import trainer

    monkeypatch.setattr(trainer, "time", _StepClock(0.25))
    warm = run_training(_cfg(tmp_path / "warm", iterations=2, prompts_per_iter=2), progress=False,
                            write_lora=False)[0].history[-1]["t_iter"]
    assert warm == pytest.approx(1.25)
    budget = 6 * warm - 0.1                         # ends in the 6th iteration
    cfg = _cfg(tmp_path, iterations=10 ** 6, prompts_per_iter=2, time_budget_s=budget,
               optim={"lr_schedule": "cosine"})
    tr, _ = run_training(cfg, progress=False, write_lora=False)
    h = tr.history
    assert len(h) == 6 and h[-2]["train_time"] < budget <= h[-1]["train_time"]
    before = [0.0] + [x["train_time"] for x in h[:-1]]
    for x, t in zip(h, before):
        assert x["lr"] == pytest.approx(cfg.optim.lr * 0.5 * (1 + math.cos(math.pi * t / budget)), rel=1e-9)
    assert h[0]["lr"] == cfg.optim.lr and h[-1]["lr"] < h[0]["lr"] * 0.5 * (1 + math.cos(math.pi * 0.5))


def test_a_time_budgeted_run_counts_its_progress_in_seconds(tmp_path, capsys):
    """The demo's baseline is bounded by training time, with an iteration cap far away (100x): its progress bar
    counts training seconds up to the budget (not 0/<cap> iterations) and ends full."""
    cfg = _cfg(tmp_path, iterations=10 ** 4, prompts_per_iter=2, time_budget_s=1.5)
    run_training(cfg, progress=True, write_lora=False)
    err = capsys.readouterr().err
    last = [ln for ln in err.replace("\r", "\n").splitlines() if "time budget" in ln][-1]
    assert "1.5/1.5 s" in last and "100%" in last and "10000" not in err, last


def test_eval_every_seconds_of_training_time(tmp_path):
    from treegrpo.trainer import Trainer
    from treegrpo.backends import load_policy

    def evals(every_s, out):
        cfg = _cfg(out, iterations=3, prompts_per_iter=2, eval_every_s=every_s, eval_seeds=1)
        tr = Trainer(cfg, load_policy(cfg)[0], build_rewards(cfg, torch.device("cpu")), progress=False)
        tr.train()
        return [e["iteration"] for e in tr.evals]

    assert evals(1e-9, tmp_path / "a") == [0, 1, 2, 3]      # every iteration passes a multiple of the period
    assert evals(1e6, tmp_path / "b") == [0, 3]             # only the start and the end
    with pytest.raises(ConfigError, match="eval_every_s"):
        _cfg(tmp_path, eval_every_s=-1.0)


def test_a_tree_shaped_per_step_trains_and_its_lora_says_so(tmp_path):
    """tree.branch_schedule [4, 2] through the whole loop: the NFE per prompt is the formula's (1 prefix + 1 + 4
    window rows + 8 leaves × 3 tail steps), the update trains 1 + 4 parents per tree, and the LoRA's metadata records
    the schedule; a uniform tree's metadata has no such key (as LoRAs written before the option existed)."""
    cfg = _cfg(tmp_path / "shaped", iterations=2, prompts_per_iter=4,
               tree={"window_width": 2, "branch_schedule": [4, 2]})
    trainer, summary = run_training(cfg, progress=False)
    log = json.load(open(tmp_path / "shaped" / "log.json"))
    assert [h["nfe"] for h in log["train"]] == [4 * (1 + 1 + 4 + 8 * 3)] * 2
    trained = [h for h in log["train"] if h["flat_trees"] == 0]
    assert trained and all(h["parents"] == 4 * (1 + 4) and h["edges"] == 4 * (4 + 8) for h in trained)
    meta = json.loads(read_lora_file(summary["lora"])[1]["treegrpo.tree_config"])
    assert meta["branch_schedule"] == [4, 2] and meta["window_width"] == 2
    plain = _cfg(tmp_path / "plain", iterations=1, prompts_per_iter=2)
    _, s2 = run_training(plain, progress=False)
    assert "branch_schedule" not in json.loads(read_lora_file(s2["lora"])[1]["treegrpo.tree_config"])


def test_a_lengthening_tail_trains_each_iteration_with_its_own_tail(tmp_path):
    """tree.tail_steps_schedule [[0, 1], [2, 2]] through the whole loop: iterations 0-1 sample one DPM++(2M) tail
    step, 2-3 two (NFE per prompt 1 prefix + 7 window rows + 8 leaves × tail), a run resumed at iteration 2 keeps
    the schedule, and the LoRA's metadata records it."""
    tree = {"tail_steps": 1, "tail_steps_schedule": [[0, 1], [2, 2]]}
    cfg = _cfg(tmp_path, iterations=2, prompts_per_iter=2, checkpoint_every=1, tree=tree)
    run_training(cfg, progress=False)
    more = _cfg(tmp_path, iterations=4, prompts_per_iter=2, checkpoint_every=1, tree=tree)
    _, summary = run_training(more, resume=True, progress=False, allow_changes=True)
    log = json.load(open(tmp_path / "log.json"))
    assert [h["nfe"] for h in log["train"]] == [2 * (1 + 7 + 8 * t) for t in (1, 1, 2, 2)]
    meta = json.loads(read_lora_file(summary["lora"])[1]["treegrpo.tree_config"])
    assert meta["tail_steps_schedule"] == [[0, 1], [2, 2]]


def test_an_lr_factor_schedule_sets_each_iterations_lr_across_resume(tmp_path):
    """optim.lr_factor_schedule [[0, 1], [2, 0.5], [3, 0.25]] over a 4-iteration run resumed at iteration 2: each
    iteration trains at lr × its factor, on top of the linear warm-up of the first iteration, and the optimiser takes
    it (its param groups hold the last iteration's lr)."""
    optim = {"lr": 2e-3, "warmup": 1, "lr_factor_schedule": [[0, 1], [2, 0.5], [3, 0.25]]}
    run_training(_cfg(tmp_path, iterations=2, prompts_per_iter=2, checkpoint_every=1, optim=optim), progress=False)
    more = _cfg(tmp_path, iterations=4, prompts_per_iter=2, checkpoint_every=1, optim=optim)
    tr, _ = run_training(more, resume=True, progress=False, allow_changes=True)
    log = json.load(open(tmp_path / "log.json"))
    assert [h["lr"] for h in log["train"]] == pytest.approx([1e-3, 2e-3, 1e-3, 5e-4])
    assert [g["lr"] for g in tr.optimizer.param_groups] == pytest.approx([5e-4] * len(tr.optimizer.param_groups))


def _trainer(cfg, **kw):
    from treegrpo.backends import load_policy
    from treegrpo.trainer import Trainer
    policy, name = load_policy(cfg)
    return Trainer(cfg, policy, build_rewards(cfg, torch.device("cpu")), progress=False, base_model_name=name, **kw)


def _same_lora(a_path, b_path):
    a, b = read_lora_file(str(a_path))[0], read_lora_file(str(b_path))[0]
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("every", [0, 2])
def test_the_end_of_a_run_is_checkpointed_and_a_failure_after_the_loop_loses_nothing(tmp_path, every):
    """3 iterations with a checkpoint every 2 (or 0: only at the end): the end's checkpoint is written whatever
    checkpoint_every says. A Ctrl-C in an end-of-run callback (the artist's check at the end, a user's hook) comes
    after it: resuming writes the LoRA of the uninterrupted run, bit for bit, without training again."""
    from treegrpo.callbacks import TrainerCallback

    whole = _cfg(tmp_path / "a", iterations=3, prompts_per_iter=2, checkpoint_every=every, run_name="r")
    tr, _ = run_training(whole, progress=False)
    found = sorted(os.listdir(tmp_path / "a" / "checkpoints"))
    assert found[-1] == "r-0000003.pt" and len(found) == (2 if every else 1), found

    class CtrlC(TrainerCallback):
        def on_train_end(self, trainer):
            raise KeyboardInterrupt

    cut = _cfg(tmp_path / "b", iterations=3, prompts_per_iter=2, checkpoint_every=every, run_name="r")
    with pytest.raises(KeyboardInterrupt):
        _trainer(cut, callbacks=[CtrlC()]).train()
    assert sorted(os.listdir(tmp_path / "b" / "checkpoints"))[-1] == "r-0000003.pt"
    assert not (tmp_path / "b" / "r.safetensors").exists()
    again, _ = run_training(cut, resume=True, progress=False)
    assert again.iteration == 3 and len(again.history) == 3
    assert _same_lora(tmp_path / "a" / "r.safetensors", tmp_path / "b" / "r.safetensors")


def test_a_stop_inside_a_two_pass_update_undoes_it_and_resumes_bit_for_bit(tmp_path):
    """updates_per_batch 2: a stop asked for after the first optimiser step of iteration 1 (ComfyUI's Cancel, a
    callback's should_stop) stops at once; the update is undone, so the checkpoint holds 1 whole iteration (weights and
    Adam state; before, it held 1.5 iterations under iteration 1's name) and the resumed run ends on the uninterrupted
    run's LoRA bytes."""
    from treegrpo.callbacks import TrainerCallback
    from treegrpo.trainer import TrainingInterrupted

    optim = {"updates_per_batch": 2}
    run_training(_cfg(tmp_path / "a", iterations=4, prompts_per_iter=2, run_name="r", optim=optim), progress=False)

    class StopAfterAStep(TrainerCallback):
        asked = False

        def should_stop(self, trainer):
            if trainer.iteration == 1 and trainer.mid_update and not StopAfterAStep.asked:
                StopAfterAStep.asked = True
                return True
            return False

    cfg = _cfg(tmp_path / "b", iterations=4, prompts_per_iter=2, run_name="r", optim=optim)
    tr = _trainer(cfg, callbacks=[StopAfterAStep()])
    logged = []
    tr.log = logged.append
    with pytest.raises(TrainingInterrupted):
        tr.train()
    assert StopAfterAStep.asked and tr.iteration == 1 and len(tr.history) == 1 and not tr.mid_update
    assert any("the update of iteration 2 did not finish" in line for line in logged), logged
    ck = torch.load(tr.latest_checkpoint(), weights_only=True)
    assert ck["iteration"] == 1 and tr.latest_checkpoint().endswith("r-0000001.pt")
    assert {float(s["step"]) for s in ck["optimizer"]["state"].values()} == {2.0}      # 1 iteration × 2 passes
    run_training(cfg, resume=True, progress=False)
    assert _same_lora(tmp_path / "a" / "r.safetensors", tmp_path / "b" / "r.safetensors")


@pytest.mark.parametrize("cut", ["nan_in_the_second_pass", "ctrl_c_after_a_step"])
def test_an_update_cut_after_its_step_is_undone_and_the_run_resumes_bit_for_bit(tmp_path, monkeypatch, cut):
    """Cut after the update of iteration 1 stepped: a non-finite gradient in its second pass, or the command line's
    Ctrl-C (a KeyboardInterrupt wherever the main thread is) right after its one step. The LoRA and the optimiser go
    back to iteration 1's end, that is checkpointed — with checkpoint_every 0 too, where nothing would be left —
    and the resumed run ends on the uninterrupted run's LoRA bytes."""
    from treegrpo import update

    passes = 2 if cut == "nan_in_the_second_pass" else 1
    optim = {"updates_per_batch": passes}
    run_training(_cfg(tmp_path / "a", iterations=3, prompts_per_iter=2, run_name="r", optim=optim), progress=False)
    real, calls = update.optimizer_step, {"n": 0}

    def cut_in_iteration_1(*a, **kw):
        calls["n"] += 1
        if cut == "nan_in_the_second_pass" and calls["n"] == 4:     # iteration 1's second pass, before its step
            raise FloatingPointError("non-finite gradient norm (nan) in the GRPO update")
        out = real(*a, **kw)
        if cut == "ctrl_c_after_a_step" and calls["n"] == 2:        # iteration 1's one step has changed the LoRA
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(update, "optimizer_step", cut_in_iteration_1)
    cfg = _cfg(tmp_path / "b", iterations=3, prompts_per_iter=2, checkpoint_every=0, run_name="r", optim=optim)
    tr = _trainer(cfg)
    with pytest.raises((FloatingPointError, KeyboardInterrupt)):
        tr.train()
    assert tr.iteration == 1 and not tr.mid_update
    assert sorted(os.listdir(tmp_path / "b" / "checkpoints")) == ["r-0000001.pt"]
    ck = torch.load(str(tmp_path / "b" / "checkpoints" / "r-0000001.pt"), weights_only=True)
    assert {float(s["step"]) for s in ck["optimizer"]["state"].values()} == {float(passes)}
    monkeypatch.setattr(update, "optimizer_step", real)
    run_training(cfg, resume=True, progress=False)
    assert _same_lora(tmp_path / "a" / "r.safetensors", tmp_path / "b" / "r.safetensors")


def test_a_stop_during_an_evaluation_ends_it_at_the_next_sampling_step(tmp_path):
    """A Cancel (ComfyUI's interrupt through step_callback) or a stop request that comes while an evaluation samples
    stops it at its next denoiser step, not after the whole evaluation (minutes on a real model with many held-out
    prompts); the iteration before it is checkpointed and the evaluation is not recorded."""
    from treegrpo.trainer import TrainingInterrupted

    cfg = _cfg(tmp_path, iterations=3, prompts_per_iter=2, eval_every=1, run_name="r")
    steps = {"eval": 0}

    class Cancel(Exception):
        pass

    def comfy_interrupt():                  # ComfyUI's check: raises once its flag is set
        if steps.get("cancel"):
            steps["eval"] += 1
            raise Cancel

    tr = _trainer(cfg, step_callback=comfy_interrupt)
    tr.callbacks.append(type("CancelAfterIteration1", (), {
        **{k: (lambda *a: None) for k in ("on_train_begin", "on_step", "on_evaluate", "on_checkpoint",
                                          "on_train_end")},
        "should_stop": lambda self, t: False,
        "on_iteration_end": lambda self, t, stats: steps.update(cancel=stats["iteration"] == 1)})())
    with pytest.raises(Cancel):
        tr.train()
    assert tr.iteration == 2 and steps["eval"] == 1
    assert [e["iteration"] for e in tr.evals] == [0, 1]      # the evaluation at iteration 2 was cut at its first step
    assert tr.latest_checkpoint().endswith("r-0000002.pt")

    stop = {"now": False}
    cfg = _cfg(tmp_path / "b", iterations=3, prompts_per_iter=2, eval_every=1, run_name="r")
    tr = _trainer(cfg, stop=lambda: stop["now"])
    tr.iteration_callback = lambda stats: stop.update(now=stats["iteration"] == 0)
    with pytest.raises(TrainingInterrupted):
        tr.train()
    assert tr.iteration == 1 and [e["iteration"] for e in tr.evals] == [0]


def test_an_evaluation_a_stop_cut_is_made_when_the_run_resumes_and_it_ends_as_if_never_stopped(tmp_path):
    """Ctrl-C or Cancel during the evaluation of iteration 2: the checkpoint of iteration 2 says that evaluation is
    pending, the resumed run makes it first, and the run ends with the evaluations, best LoRA and LoRA of the run
    that was never stopped (the evaluation was lost for good, and with it the best LoRA when it was the best)."""
    whole = _cfg(tmp_path / "a", iterations=4, prompts_per_iter=2, eval_every=2, checkpoint_every=2, run_name="r")
    run_training(whole, progress=False)
    cut_at = {"evaluating": False}

    class Cancel(Exception):
        pass

    def interrupt():                            # ComfyUI's check, set once the evaluation of iteration 2 samples
        if cut_at["evaluating"]:
            raise Cancel

    cfg = _cfg(tmp_path / "b", iterations=4, prompts_per_iter=2, eval_every=2, checkpoint_every=2, run_name="r")
    tr = _trainer(cfg, step_callback=interrupt)
    tr.iteration_callback = lambda stats: cut_at.update(evaluating=stats["iteration"] == 1)
    with pytest.raises(Cancel):
        tr.train()
    assert tr.iteration == 2 and [e["iteration"] for e in tr.evals] == [0]
    again, _ = run_training(cfg, resume=True, progress=False)
    a, b = (json.load(open(tmp_path / d / "log.json")) for d in ("a", "b"))
    assert [e["iteration"] for e in b["eval"]] == [0, 2, 4]
    assert [e["eval_reward"] for e in b["eval"]] == [e["eval_reward"] for e in a["eval"]]
    for name in ("r.safetensors", "r_best.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    once_more, _ = run_training(cfg, resume=True, progress=False)     # at its end: no evaluation made twice
    assert [e["iteration"] for e in once_more.evals] == [0, 2, 4]


def test_a_run_folder_in_use_is_told_to_every_process(tmp_path):
    """torchrun: the first process finds the folder in use and says so to the others (which would otherwise wait for
    it in the checkpoint's broadcast), and each stops with the same one-line error; a free folder is locked by the
    first process only."""
    from types import SimpleNamespace

    from treegrpo.checkpoint import CheckpointError, RunLock
    from treegrpo.trainer import Trainer

    class Group:                      # the broadcast of treegrpo.distributed.DataParallel, one process's view
        def __init__(self, first_says=None):
            self.sent, self.first_says = [], first_says

        def broadcast_object(self, obj):
            self.sent.append(obj)
            return obj if self.first_says is None else self.first_says

    busy = RunLock(str(tmp_path))
    try:
        first = SimpleNamespace(rank=0, world=2, dist=Group(), out=str(tmp_path))
        with pytest.raises(CheckpointError, match="is in use by a run that is still training") as e:
            Trainer._lock_run_folder(first)
        assert first.dist.sent == [str(e.value)]
        other = SimpleNamespace(rank=1, world=2, dist=Group(first_says=str(e.value)), out=str(tmp_path))
        with pytest.raises(CheckpointError, match="is in use by a run that is still training"):
            Trainer._lock_run_folder(other)
    finally:
        busy.release()
    first = SimpleNamespace(rank=0, world=2, dist=Group(), out=str(tmp_path))
    lock = Trainer._lock_run_folder(first)
    assert lock is not None and first.dist.sent == [""]
    other = SimpleNamespace(rank=1, world=2, dist=Group(first_says=""), out=str(tmp_path))
    assert Trainer._lock_run_folder(other) is None
    lock.release()


def test_a_run_the_first_process_cannot_start_stops_the_others_and_a_resume_reaches_them(tmp_path):
    """RunFiles.begin under torchrun: the first process reads the folder and sends what it found (the checkpoint, or
    why it could not start) to the others, which resume from it or stop with the same reason."""
    import types

    from treegrpo import checkpoint as ckpt
    from treegrpo.run_files import RunFiles

    class Group:
        def __init__(self, first_says=None):
            self.sent, self.first_says = [], first_says

        def broadcast_object(self, obj):
            self.sent.append(obj)
            return obj if self.first_says is None else self.first_says

    class Run(RunFiles):
        base_model_name, callbacks = "m", []

        def __init__(self, out, rank, group):
            self.out, self.rank, self.world, self.dist = str(out), rank, 2, group
            self.cfg, self.loaded = types.SimpleNamespace(run_name="r"), []

        def log(self, msg):
            pass

        def load_checkpoint(self, path, state=None):
            self.loaded.append((path, state["iteration"]))

    out = tmp_path / "out"
    out.mkdir()
    ckpt.claim_output_dir(str(out), "r", "another/model")          # the folder of a run on another base model
    ckpt.write_checkpoint(str(out), "r", 3, {"x": 1}, keep=2)
    first = Run(out, 0, Group())
    with pytest.raises(ValueError, match="cannot continue on another base model") as e:
        first.begin(resume=True)
    assert first.dist.sent[0][0] == "failed" and str(e.value) in first.dist.sent[0][1]
    other = Run(out, 1, Group(first_says=first.dist.sent[0]))
    with pytest.raises(ckpt.CheckpointError, match="the first process could not start the run"):
        other.begin(resume=True)
    ckpt.claim_output_dir(str(out), "r", "m", fresh=True)
    first = Run(out, 0, Group())
    first.begin(resume=True)
    other = Run(out, 1, Group(first_says=first.dist.sent[0]))
    other.begin(resume=True)
    assert first.loaded == other.loaded == [(str(out / "checkpoints" / "r-0000003.pt"), 3)]
    assert not other.started_fresh


def test_quiet_also_silences_the_libraries_loading_bars(monkeypatch):
    import diffusers.utils.logging as dlog
    import transformers.utils.logging as tlog

    seen = []

    class Stop(Exception):
        pass

    def fake_run(cfg, **kw):
        seen.append((dlog.is_progress_bar_enabled(), tlog.is_progress_bar_enabled(), kw["progress"]))
        raise Stop()

    monkeypatch.setattr("treegrpo.cli.run_training", fake_run)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    try:
        with pytest.raises(Stop):
            cli.main(["train", "--quiet"])
    finally:
        dlog.enable_progress_bar()
        tlog.enable_progress_bar()
    assert seen == [(False, False, False)]


def test_a_resume_refuses_another_image_size_shift_flux_guidance_or_prompt_length_but_not_another_precision():
    """What the model is asked to make is a training setting (a resume at another size went on silently); the
    weights' dtype, autocast and the decode batch only change how it is computed."""
    from treegrpo.checkpoint import config_changes
    from treegrpo.config import PipelineConfig

    now = TrainConfig(prompts=["a cat"], backend="diffusers", model="m",
                      pipeline=PipelineConfig(height=512, width=512))
    saved = now.to_dict()
    for field, value in (("height", 256), ("width", 768), ("shift", 3.0), ("guidance_embed", 1.0),
                         ("max_sequence_length", 128)):
        old = dict(saved, pipeline=dict(saved["pipeline"], **{field: value}))
        assert config_changes(old, now) == [f"pipeline.{field}: {value!r} -> {saved['pipeline'][field]!r}"]
    for field, value in (("dtype", "float16"), ("autocast", False), ("decode_batch", 2), ("config", "/x"),
                         ("family", "sdxl")):      # the family: the checkpoint's base model says it
        assert config_changes(dict(saved, pipeline=dict(saved["pipeline"], **{field: value})), now) == [], field


def test_a_run_stopped_before_its_first_iteration_ends_leaves_nothing_that_holds_the_folder(tmp_path):
    """Stopped (a Ctrl-C, a crash) inside iteration 1: no checkpoint of no training is written (one held the folder:
    the corrected rerun was refused as "already holds run", and --resume with a changed lr as "other settings");
    the rerun starts afresh, with other settings too. A run stopped after an iteration keeps its checkpoint."""
    from treegrpo.backends import load_policy
    from treegrpo.checkpoint import checkpoint_paths
    from treegrpo.trainer import Trainer, TrainingInterrupted

    cfg = _cfg(tmp_path, iterations=3, prompts_per_iter=2, run_name="r", eval_every=1)
    policy, name = load_policy(cfg)
    tr = Trainer(cfg, policy, build_rewards(cfg, torch.device("cpu")), progress=False, base_model_name=name,
                 stop=lambda: bool(tr.evals))            # after the base model's evaluation, inside iteration 1
    with pytest.raises(TrainingInterrupted):
        tr.train()
    assert checkpoint_paths(str(tmp_path), "r") == [] and tr.iteration == 0
    again, _ = run_training(_cfg(tmp_path, iterations=1, prompts_per_iter=2, run_name="r", optim={"lr": 1e-3}),
                            progress=False)
    assert again.iteration == 1
    policy, name = load_policy(cfg)
    tr = Trainer(cfg, policy, build_rewards(cfg, torch.device("cpu")), progress=False, base_model_name=name,
                 stop=lambda: len(tr.history) >= 1)
    with pytest.raises(TrainingInterrupted):
        tr.train(resume=True)
    assert [os.path.basename(p) for p in checkpoint_paths(str(tmp_path), "r")][-1] == "r-0000001.pt"


def test_a_run_of_the_same_name_that_finished_while_this_one_loaded_is_refused_not_moved_aside(tmp_path):
    """The checks before the model loads found the folder free; while the model loaded, another process's run of
    the same name finished there. Without --overwrite the fresh start refuses it (it moved that run aside)."""
    from treegrpo.backends import load_policy
    from treegrpo.checkpoint import CheckpointError
    from treegrpo.trainer import Trainer

    run_training(_cfg(tmp_path / "other", iterations=1, prompts_per_iter=2, run_name="r"), progress=False)
    cfg = _cfg(tmp_path / "out", iterations=1, prompts_per_iter=2, run_name="r")
    policy, name = load_policy(cfg)
    tr = Trainer(cfg, policy, build_rewards(cfg, torch.device("cpu")), progress=False, base_model_name=name)
    tr.replace_earlier = False                         # the command line without --overwrite
    import shutil
    shutil.copytree(tmp_path / "other", tmp_path / "out", dirs_exist_ok=True)   # that run, finished meanwhile
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(CheckpointError, match="already holds run 'r'"):
        tr.train()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before


def test_without_evaluation_prompts_a_long_prompt_list_is_evaluated_on_its_first_32(tmp_path):
    """A prompt file of hundreds of lines and no eval_prompts: every evaluation sampled every prompt × eval_seeds
    (480 prompts: 70 s an evaluation on the demo model, thousands of images on a real one)."""
    from treegrpo.backends import load_policy
    from treegrpo.trainer import Trainer

    prompts = [f"a {c} {s}" for c in ("red", "green", "blue", "yellow", "magenta", "cyan")
               for s in ("circle", "square", "triangle", "cross")] * 3
    cfg = _cfg(tmp_path, prompts=prompts, eval_every=1)
    tr = Trainer(cfg, load_policy(cfg)[0], build_rewards(cfg, torch.device("cpu")), progress=False)
    assert tr.eval_prompts == prompts[:32]
    for field, value in (("eval_seeds", 65), ("seed", 2 ** 63), ("seed", -1)):
        with pytest.raises(ConfigError, match=f"TrainConfig.{field}"):
            _cfg(tmp_path, **{field: value})


def test_a_refused_resume_names_the_prompt_that_changed_not_both_whole_lists():
    from treegrpo.checkpoint import config_changes

    prompts = [f"a {c} circle" for c in ("red", "green", "blue", "yellow", "magenta", "cyan")] * 40
    now = TrainConfig(prompts=prompts)
    edited = list(prompts)
    edited[117] = "a red circle, 4k"
    assert config_changes(dict(now.to_dict(), prompts=edited), now) == [
        "prompts: 240 -> 240 entries, the first change at entry 118: 'a red circle, 4k' -> 'a yellow circle'"]
    assert config_changes(dict(now.to_dict(), prompts=prompts[:-1]), now) == [
        "prompts: 239 -> 240 entries, the first change at entry 240 added: 'a cyan circle'"]


def test_a_run_started_from_a_lora_of_other_alphas_keeps_its_update_and_describes_its_files_rightly(tmp_path):
    """``lora.init_from`` of a file whose alpha is not this run's (16 and 4 here, against the config's 8): the run
    starts from the file's update ``(alpha/r)·up·down`` exactly, and its files say the alpha they are scaled with
    (the run wrote the config's alpha in the metadata over the file's: the PEFT file, whose only alpha is the
    metadata's, was then read at another strength; a module alpha that differed from the others was dropped)."""
    from treegrpo.lora import save_lora_file, to_comfy
    from treegrpo.trainer import Trainer
    from treegrpo.backends import load_policy

    _, summary = run_training(_cfg(tmp_path / "a", iterations=1, prompts_per_iter=2, run_name="a"), progress=False)
    w = from_state_dict(*read_lora_file(summary["lora"]))
    names = w.modules
    for i, n in enumerate(names):
        w.alpha[n] = 16.0 if i % 2 else 4.0
    src = save_lora_file(str(tmp_path / "other_alpha.safetensors"), to_comfy(w), {})

    def update(lw):                         # module -> (alpha / r)·up·down
        return {n: lw.alpha[n] / lw.down[n].shape[0] * lw.up[n] @ lw.down[n] for n in lw.modules}

    want = update(w)
    cfg = _cfg(tmp_path / "b", iterations=1, prompts_per_iter=2, run_name="b", lora={"alpha": 8.0, "init_from": src})
    policy, name = load_policy(cfg)
    trainer = Trainer(cfg, policy, build_rewards(cfg, "cpu"), progress=False, base_model_name=name)
    got = trainer.lora.weights()
    assert set(got.alpha.values()) == {8.0}
    for n in names:
        assert torch.allclose(update(got)[n], want[n], atol=1e-6), n
    trainer.save_lora(str(tmp_path / "b.safetensors"))
    trainer.save_lora(str(tmp_path / "b_peft.safetensors"), fmt="peft")
    for path in ("b.safetensors", "b_peft.safetensors"):
        t, meta = read_lora_file(str(tmp_path / path))
        assert meta["treegrpo.lora_alpha"] == "8.0"
        back = update(from_state_dict(t, meta))
        assert all(torch.allclose(back[n], want[n], atol=1e-6) for n in names), path


def test_export_to_peft_keeps_each_modules_update_when_the_alphas_differ(tmp_path):
    """PEFT keys carry one alpha (in the metadata): ``treegrpo export --format peft`` of a ComfyUI file whose
    modules have other alphas rescales their ``up`` to the first one's, so every update stays what it was."""
    from treegrpo.lora import save_lora_file, to_comfy

    _, summary = run_training(_cfg(tmp_path / "a", iterations=1, prompts_per_iter=2, run_name="a"), progress=False)
    w = from_state_dict(*read_lora_file(summary["lora"]))
    for i, n in enumerate(w.modules):
        w.alpha[n] = 16.0 if i % 2 else 4.0
    src = save_lora_file(str(tmp_path / "in.safetensors"), to_comfy(w), {})
    out = str(tmp_path / "out.safetensors")
    assert cli.main(["export", src, out, "--format", "peft"]) == 0
    got = from_state_dict(*read_lora_file(out))
    for n in w.modules:
        a = w.alpha[n] / w.down[n].shape[0] * w.up[n] @ w.down[n]
        b = got.alpha[n] / got.down[n].shape[0] * got.up[n] @ got.down[n]
        assert torch.allclose(a, b, atol=1e-6), n


def test_a_tail_steps_flag_sets_the_tail_and_a_tail_the_schedule_hides_is_said(tmp_path, capsys):
    """``treegrpo train --tree.tail_steps 3`` on the demo run (whose config lengthens a one-step tail by a schedule):
    the flag's tail is sampled (the schedule won, silently: 1-step tails); a config whose tail_steps the schedule
    overrides, and NFT / AWM samples of fewer than 4 solver steps, are warned about before the model loads."""
    import warnings
    from treegrpo.run import prepare
    out = tmp_path / "flag"
    assert cli.main(["train", "--tree.tail_steps", "3", "--iterations", "1", "--prompts-per-iter", "2",
                     "--eval-every", "0", "--output-dir", str(out), "--quiet"]) == 0
    log = json.load(open(out / "log.json"))
    assert [h["nfe"] for h in log["train"]] == [2 * (1 + 7 + 8 * 3)]
    import treegrpo                      # the log says how the run was made: its whole config, the version
    assert log["version"] == treegrpo.__version__
    assert (log["config"]["tree"]["tail_steps"], log["config"]["tree"]["tail_steps_schedule"]) == (3, [])
    assert TrainConfig.from_dict(log["config"]).tree.tail_steps == 3
    hidden = _cfg(tmp_path / "a", tree={"tail_steps": 3, "tail_steps_schedule": [[0, 1], [60, 2]]})
    with pytest.warns(UserWarning, match=r"tree.tail_steps 3 is not used: tree.tail_steps_schedule"):
        prepare(hidden)
    ode = _cfg(tmp_path / "b", tree={"method": "ode", "group_size": 4, "tail_steps": 1},
               optim={"loss": "nft", "lr": 1e-2})
    with pytest.warns(UserWarning, match=r"tree.method ode samples each image in 1 solver step"):
        prepare(ode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(_cfg(tmp_path / "c", tree={"method": "ode", "group_size": 4, "tail_steps": 6},
                     optim={"loss": "nft", "lr": 1e-2}))
        prepare(_cfg(tmp_path / "d", tree={"tail_steps": 1, "tail_steps_schedule": [[0, 1], [60, 2]]}))


def test_a_full_disk_mid_run_is_one_line_and_the_run_resumes_from_its_last_whole_checkpoint(tmp_path, capsys,
                                                                                             monkeypatch):
    """The disk fills at the checkpoint of iteration 2: one line (it was two chained tracebacks: the stop's own
    checkpoint failed the same way), exit 1, the checkpoint of iteration 1 kept whole; a half-written checkpoint a
    killed process left is removed by the next checkpoint of the run (it stayed for good)."""
    real = torch.save

    def save(obj, f, *a, **kw):
        if isinstance(obj, dict) and obj.get("iteration", 0) >= 2:
            raise OSError(28, "No space left on device")
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "out"
    args = ["train", "--iterations", "3", "--prompts-per-iter", "2", "--eval-every", "0", "--checkpoint-every", "1",
            "--output-dir", str(out), "--run-name", "r", "--quiet"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("treegrpo: error: could not save") and err.count("\n") == 1, err
    assert "No space left on device" in err and "add --resume once there is room" in err
    assert sorted(os.listdir(out / "checkpoints")) == ["r-0000001.pt"]
    monkeypatch.setattr(torch, "save", real)
    stale = out / "checkpoints" / ".tmp-r-0000007.pt-abc123"          # kill -9 while a checkpoint was written
    stale.write_bytes(b"half")
    keep = out / "checkpoints" / "notes.txt"
    keep.write_text("mine")
    assert cli.main(args + ["--resume"]) == 0
    assert not stale.exists() and keep.read_text() == "mine"
    assert json.load(open(out / "log.json"))["train"][-1]["iteration"] == 2


def test_a_reward_without_signal_is_said_once_per_streak(tmp_path, caplog):
    """Every tree flat (the ocr reward before the model draws any text: all leaves 0) trains nothing; after
    FLAT_STREAK such iterations in a row the run says so, once, with what to change (a user's walk: 0.000 and a LoRA
    saved, no word). A reward with signal says nothing."""
    import logging

    import torch

    from treegrpo import cli
    from treegrpo.backends import load_policy
    from treegrpo.config import TrainConfig
    from treegrpo.trainer import FLAT_STREAK, Trainer

    def trainer(reward, out):
        d = cli.demo_config_dict()
        d.update(prompts=["a red circle"], prompts_per_iter=2, iterations=FLAT_STREAK + 2, eval_every=0, seed=1,
                 output_dir=str(out), run_name="flat", checkpoint_every=0)
        cfg = TrainConfig.from_dict(d)
        return Trainer(cfg, load_policy(cfg)[0], {"demo_adherence": reward}, progress=False)

    t = trainer(lambda im, p: torch.zeros(len(im)), tmp_path / "a")
    with caplog.at_level(logging.WARNING):
        for _ in range(FLAT_STREAK + 2):
            t.after_iteration(t.train_step())
    said = [w for w in t.warnings if "trained nothing" in w]
    assert said == [w for w in t.warnings if w.startswith(f"iterations 1-{FLAT_STREAK} trained nothing")], t.warnings
    assert len(said) == 1 and "advantage.flat_floor" in said[0] and sum("trained nothing" in r.message
                                                                         for r in caplog.records) == 1
    assert all(h["edges"] == 0 for h in t.history)
    # no edge because an artist left every tree out (no tree scored): not the reward's doing, nothing said
    quiet = trainer(lambda im, p: torch.zeros(len(im)), tmp_path / "c")
    for _ in range(FLAT_STREAK + 1):
        quiet.watch_flat({"edges": 0, "scored_trees": 0, "flat_trees": 2})
    assert quiet.warnings == []
    t = trainer(lambda im, p: im.mean(dim=(1, 2, 3)), tmp_path / "b")
    for _ in range(FLAT_STREAK + 1):
        t.after_iteration(t.train_step())
    assert not [w for w in t.warnings if "trained nothing" in w] and all(h["edges"] > 0 for h in t.history)


def test_sample_grid_names_its_model_and_prompts_and_keeps_each_image_whole(tmp_path):
    """`treegrpo sample`: one row per prompt, labelled, titled with the LoRA (or the base model); each 16-pixel demo
    image enlarged to 128 pixels, a row's images the model's own samples (base and LoRA differ inside the grid)."""
    import numpy as np
    from PIL import Image
    trainer, summary = run_training(_cfg(tmp_path / "run", iterations=2, prompts_per_iter=2,
                                         optim={"lr": 0.05}), progress=False)
    prompts = ["a red circle", "a blue square", "a green triangle"]
    grids = {}
    for name, extra in (("base", []), ("lora", ["--lora", summary["lora"]])):
        out = tmp_path / f"{name}.png"
        argv = ["sample", "--output", str(out), "--per-prompt", "2", *extra]
        assert cli.main(argv + [a for p in prompts for a in ("--prompt", p)]) == 0
        grids[name] = np.asarray(Image.open(out).convert("RGB"), dtype=np.float32) / 255
    base, lora = grids["base"], grids["lora"]
    assert base.shape == lora.shape
    h, w = base.shape[:2]
    # 3 rows of 128-pixel images with make_grid's 2-pixel padding, under an 18-pixel title band
    assert h == 18 + 3 * 130 + 2 and w > 2 * 130 + 2
    margin = w - (2 * 130 + 2)
    assert margin > 8 and (base[18:, :margin - 8] < 0.5).any()             # row labels drawn in the margin
    assert np.abs(base[18:, margin:] - lora[18:, margin:]).max() > 0.02     # the LoRA's samples differ


def test_eval_heldout_prompts_are_evaluated_and_never_trained_on(tmp_path):
    """eval_heldout 3 of the demo's prompts: the trainer samples trees only for the others, evaluates on the three
    (drawn with the seed: the same split again), and a resume with another count is refused as a change."""
    from treegrpo import checkpoint as ckpt
    cfg = _cfg(tmp_path, iterations=2, prompts_per_iter=4, eval_every=2, eval_seeds=2, eval_heldout=3,
               checkpoint_every=2, run_name="h")
    train, held = cfg.split_prompts()
    assert len(held) == 3 and not set(held) & set(train) and cfg.split_prompts() == (train, held)
    tr, _ = run_training(cfg, progress=False)
    assert tr.eval_prompts == held and tr.prompts == train
    log = json.load(open(tmp_path / "log.json"))
    assert [e["iteration"] for e in log["eval"]] == [0, 2]
    other = _cfg(tmp_path, iterations=3, prompts_per_iter=4, eval_every=2, eval_seeds=2, eval_heldout=2,
                 checkpoint_every=2, run_name="h")
    with pytest.raises(ckpt.CheckpointError, match="eval_heldout: 3 -> 2"):
        ckpt.check_resume(str(tmp_path), other)


def test_eval_heldout_prompts_are_checked_by_the_rewards_before_any_model():
    """The ocr reward reads the held-out prompts too: one without quoted text is refused before training."""
    from treegrpo.rewards.base import check_config_prompts
    cfg = TrainConfig(prompts=['a sign "OPEN"', 'a mug "HI"', "a cat", 'a shirt "GO"'], eval_heldout=1, seed=0,
                      rewards=[{"name": "ocr"}])
    train, held = cfg.split_prompts()
    if "a cat" in train:          # the seed's draw decides which side; make the unquoted one the held-out one
        seed = next(s for s in range(100) if "a cat" in TrainConfig(prompts=cfg.prompts, eval_heldout=1, seed=s,
                                                                     rewards=[{"name": "ocr"}]).heldout_prompts())
        cfg = TrainConfig(prompts=cfg.prompts, eval_heldout=1, seed=seed, rewards=[{"name": "ocr"}])
    assert cfg.heldout_prompts() == ["a cat"]
    with pytest.raises(ValueError, match="quote none: 'a cat'"):
        check_config_prompts(cfg, cfg.load_prompts())


def test_a_config_may_list_a_reward_of_weight_zero(tmp_path):
    """A reward of weight 0 is neither loaded nor scored nor checked against the prompts (jpeg_compressibility's
    name here, an ocr reward's prompts elsewhere), and the run trains on the others."""
    cfg = _cfg(tmp_path, iterations=1, prompts_per_iter=2,
               rewards=[{"name": "demo_adherence", "weight": 1.0}, {"name": "ocr", "weight": 0.0}])
    trainer, _ = run_training(cfg, progress=False)
    assert trainer.iteration == 1 and set(trainer.weights) == {"demo_adherence"}
