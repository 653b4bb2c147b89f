"""The one way to hook into a run (treegrpo/callbacks.py): every event in its order on a real demo run, a callback
that stops the run (a checkpoint first), and the command line's interrupt line naming the checkpoint it wrote."""
import pytest
import torch

from treegrpo import cli, interrupts
from treegrpo.callbacks import TrainerCallback
from treegrpo.config import TrainConfig


def _trainer(tmp_path, callbacks, **kw):
    from treegrpo.backends import load_policy
    from treegrpo.run import build_rewards, build_trainer

    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), iterations=3, prompts_per_iter=1, eval_every=2, checkpoint_every=2,
             run_name="cb")
    d.update(kw)
    cfg = TrainConfig.from_dict(d)
    policy, name = load_policy(cfg)
    return build_trainer(cfg, policy, build_rewards(cfg, torch.device("cpu")),
                         judges=build_rewards(cfg, torch.device("cpu"), cfg.eval_rewards), progress=False,
                         base_model_name=name, callbacks=callbacks)


class Recorder(TrainerCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, trainer):
        self.events.append(("begin", trainer.iteration))

    def on_step(self, trainer):
        if not self.events or self.events[-1] != ("step", trainer.iteration):
            self.events.append(("step", trainer.iteration))      # one entry per run of steps

    def on_iteration_end(self, trainer, stats):
        assert stats is trainer.history[-1]
        stats["seen_by"] = "recorder"                              # a callback may add to the record
        self.events.append(("iteration", stats["iteration"]))

    def on_evaluate(self, trainer, record):
        assert record is trainer.evals[-1]
        self.events.append(("evaluate", record["iteration"]))

    def on_checkpoint(self, trainer, path):
        assert path.endswith(".pt")
        self.events.append(("checkpoint", trainer.iteration))


def test_every_event_in_its_order_and_two_callbacks_in_list_order(tmp_path):
    rec, order = Recorder(), []

    class Second(TrainerCallback):
        def on_iteration_end(self, trainer, stats):
            order.append(stats.get("seen_by"))                     # the first callback ran before

    tr = _trainer(tmp_path, [rec, Second()])
    tr.train()
    assert rec.events == [("begin", 0), ("evaluate", 0), ("step", 0), ("iteration", 0), ("step", 1),
                          ("iteration", 1), ("evaluate", 2), ("checkpoint", 2), ("step", 2), ("iteration", 2),
                          ("evaluate", 3), ("checkpoint", 3)]      # the final evaluation, the end's checkpoint
    assert order == ["recorder"] * 3
    assert all(h["seen_by"] == "recorder" for h in tr.history)


def test_a_callback_that_says_stop_ends_the_run_with_a_checkpoint(tmp_path):
    from treegrpo.trainer import TrainingInterrupted

    class StopAfterOne(TrainerCallback):
        def should_stop(self, trainer):
            return trainer.iteration >= 1

    note = interrupts.CheckpointNote()
    tr = _trainer(tmp_path, [StopAfterOne(), note], eval_every=0)
    with interrupts.handled():
        with pytest.raises(TrainingInterrupted):
            tr.train()
        assert tr.iteration == 1 and tr.latest_checkpoint() is not None
        assert interrupts._SAVED == [tr.latest_checkpoint()]          # the interrupt line names it
    assert interrupts._SAVED == []                                     # cleared with the handlers


def test_the_interrupt_line_names_the_checkpoint_or_says_there_is_none(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")         # torchrun's other processes: the first one says it (only it saves)
    with interrupts.handled():
        assert interrupts.report() == 130
        assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    with interrupts.handled():
        assert interrupts.report() == 130
        assert "before any iteration finished: nothing to resume" in capsys.readouterr().err
        interrupts.CheckpointNote().on_checkpoint(None, "/runs/r/checkpoints/r-000002.pt")
        interrupts.report()
        assert ("saved in /runs/r/checkpoints/r-000002.pt (resume with --resume; --resume --iterations 2 writes that "
                "iteration's LoRA without training)") in capsys.readouterr().err
