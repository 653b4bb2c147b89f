"""Hooking into a run: one protocol, as trl's ``TrainerCallback``. ``Trainer(cfg, policy, rewards, callbacks=[...])``
calls each callback's events in list order; override the ones you need (every event gets the trainer).

Events of a run, in order:

* ``on_train_begin(trainer)``: the run's state is final (fresh, or resumed from its checkpoint), before the first
  iteration of :meth:`Trainer.train`;
* ``on_step(trainer)``: after every denoiser call batch and update step (progress bars; raise to interrupt);
* ``should_stop(trainer) -> bool``: asked at every step; True writes a checkpoint and stops the run
  (``TrainingInterrupted``);
* ``on_iteration_end(trainer, stats)``: after each iteration's update, before the evaluation and checkpoint due
  after it; ``stats`` is the iteration's record in ``trainer.history`` (a callback may add to it);
* ``on_evaluate(trainer, record)``: after an evaluation was logged (``trainer.last_eval_images`` holds its samples
  when ``trainer.keep_eval_images``);
* ``on_checkpoint(trainer, path)``: after a checkpoint was written;
* ``on_train_end(trainer)``: the run reached its end (not when it was stopped or failed), before its last
  evaluation and before the caller saves its LoRA.

A callback with state of its own that a resumed run needs (the artist's approved states) keeps it in the run's
checkpoint: ``state_dict(trainer)`` is asked when a checkpoint is written (plain values and tensors, or None) and
``load_state_dict(trainer, state)`` gets it back when the run resumes from that checkpoint, before ``on_train_begin``.

This module imports nothing: the command line's interrupt handling uses it while an import may be what was cut
short."""
from __future__ import annotations


class TrainerCallback:
    """Override the events you need; the defaults do nothing (and never stop the run)."""

    def on_train_begin(self, trainer) -> None:
        pass

    def on_step(self, trainer) -> None:
        pass

    def should_stop(self, trainer) -> bool:
        return False

    def on_iteration_end(self, trainer, stats: dict) -> None:
        pass

    def on_evaluate(self, trainer, record: dict) -> None:
        pass

    def on_checkpoint(self, trainer, path: str) -> None:
        pass

    def on_train_end(self, trainer) -> None:
        pass

    def state_dict(self, trainer):
        return None

    def load_state_dict(self, trainer, state: dict) -> None:
        pass
