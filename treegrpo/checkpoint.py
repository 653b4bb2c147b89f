"""Training checkpoints: one format for the CLI, the Train node and the step nodes.

A run writes ``<output_dir>/checkpoints/<run_name>-<iteration:07d>.pt`` (atomically, keeping the newest few) and
records itself in ``<output_dir>/run.json``. A checkpoint is a ``torch.save`` dict of plain tensors, numbers and
JSON strings (``torch.load(weights_only=True)`` reads it):

- ``format`` (int), ``run_name``, ``base_model``, ``iteration``, ``train_time`` (s), ``total_nfe``;
- ``lora``: ``{"<module>.down": (r, in), "<module>.up": (out, r)}`` and ``param_names``: the optimiser's parameter
  order under the same names. The names do not depend on the backend (PEFT layers or ComfyUI's activation-space
  LoRA), so a run started in ComfyUI resumes from the CLI on the same model and the other way round;
- ``optimizer`` (AdamW state dict), ``history`` / ``evals`` / ``config`` (JSON), ``torch_rng``, ``python_rng``,
  ``numpy_rng``.
"""
from __future__ import annotations

import glob
import json
import os
import warnings
import time
from typing import Optional

import torch

from .io import atomic_write, atomic_write_json

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint does not belong to this run or does not fit its model."""


def checkpoint_paths(output_dir: str, run_name: str) -> list[str]:
    """The run's checkpoints, oldest first."""
    return sorted(glob.glob(os.path.join(output_dir, "checkpoints", f"{glob.escape(run_name)}-*.pt")))


def write_checkpoint(output_dir: str, run_name: str, iteration: int, state: dict, keep: int) -> str:
    """Write ``state`` as the run's checkpoint of ``iteration`` atomically; delete all but the newest ``keep``."""
    path = os.path.join(output_dir, "checkpoints", f"{run_name}-{iteration:07d}.pt")
    atomic_write(path, lambda tmp: torch.save(dict(state, format=FORMAT, run_name=run_name, iteration=iteration),
                                              tmp))
    for old in checkpoint_paths(output_dir, run_name)[:-keep]:
        os.unlink(old)
    return path


def read_latest_checkpoint(paths: list[str], run_name: str) -> tuple[str, dict]:
    """The newest readable checkpoint among ``paths`` (oldest first) and its state. One that cannot be read (a
    truncated or corrupt file: a full disk, a killed copy) is skipped with a warning, and the previous one is
    used; raises CheckpointError when none can be read."""
    errors = []
    for path in reversed(paths):
        try:
            return path, read_checkpoint(path, run_name)
        except CheckpointError:
            raise
        except Exception as e:  # torch/zip/pickle errors of a damaged file
            errors.append(f"{path}: {type(e).__name__}: {e}")
            warnings.warn(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); trying the previous one")
    raise CheckpointError("no readable checkpoint: " + "; ".join(errors) + ". Start the run again without resuming "
                          "(or under another run_name)")


def read_checkpoint(path: str, run_name: str) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("run_name") != run_name:
        raise CheckpointError(f"checkpoint {path} belongs to run {state.get('run_name')!r}, not {run_name!r}")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {state.get('format')!r}; this version reads format "
                              f"{FORMAT}: start a new run (another run_name) or use the version that wrote it")
    return state


def optimizer_state_in_order(state: dict, saved_names: list[str], names: list[str]) -> dict:
    """An optimiser state dict saved with parameters in ``saved_names`` order, re-indexed for ``names`` order
    (one parameter group)."""
    if sorted(saved_names) != sorted(names):
        missing = sorted(set(names) - set(saved_names))[:3]
        extra = sorted(set(saved_names) - set(names))[:3]
        raise CheckpointError(f"the checkpoint's LoRA does not fit the model (missing {missing}, unknown {extra}): "
                              "another base model or other LoRA targets?")
    where = {n: i for i, n in enumerate(saved_names)}
    new_index = [where[n] for n in names]
    groups = state["param_groups"]
    if len(groups) != 1:
        raise CheckpointError(f"expected one optimiser parameter group, found {len(groups)}")
    return {"state": {i: state["state"][j] for i, j in enumerate(new_index) if j in state["state"]},
            "param_groups": [dict(groups[0], params=list(range(len(names))))]}


def archive_checkpoints(output_dir: str, run_name: str) -> Optional[str]:
    """Move the run's existing checkpoints to ``checkpoints/previous-<time>/`` (a fresh run neither mixes with
    nor deletes them); returns that folder, or None when there were none."""
    old = checkpoint_paths(output_dir, run_name)
    if not old:
        return None
    dest = os.path.join(output_dir, "checkpoints", f"previous-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(dest, exist_ok=True)
    for p in old:
        os.replace(p, os.path.join(dest, os.path.basename(p)))
    return dest


class RunLock:
    """An exclusive lock on ``<output_dir>/.treegrpo.lock`` for as long as a run trains there: a second process
    training into the same folder (which would interleave checkpoints and overwrite the LoRA) is refused at once.
    The operating system drops the lock when the process dies, so a killed run never leaves a stale one."""

    def __init__(self, output_dir: str):
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, ".treegrpo.lock")
        self.fh = open(self.path, "a+")
        try:
            self._lock()
        except OSError:
            self.fh.seek(0)
            who = self.fh.read().strip() or "another process"
            self.fh.close()
            raise CheckpointError(f"output_dir {output_dir!r} is in use by a run that is still training ({who}); "
                                  "wait for it, or choose another output_dir") from None
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}")
        self.fh.flush()

    def _lock(self) -> None:
        try:
            import fcntl
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # Windows
            import msvcrt
            self.fh.seek(0)
            msvcrt.locking(self.fh.fileno(), msvcrt.LK_NBLCK, 1)

    def release(self) -> None:
        if not self.fh.closed:
            self.fh.close()   # closing the file releases the lock


def claim_output_dir(output_dir: str, run_name: str, base_model: str) -> None:
    """Record the run in ``<output_dir>/run.json``; refuse a folder that holds another run's files."""
    path = os.path.join(output_dir, "run.json")
    me = {"run_name": run_name, "base_model": base_model}
    if os.path.exists(path):
        try:
            other = json.load(open(path, encoding="utf-8"))
        except (OSError, ValueError):
            other = {}
        if other.get("run_name") != me["run_name"] or other.get("base_model") != me["base_model"]:
            raise ValueError(f"output_dir {output_dir!r} holds run {other.get('run_name')!r} on "
                             f"{other.get('base_model')!r}; this is run {run_name!r} on {base_model!r}. "
                             "Choose another output_dir (or run_name) so that nothing is overwritten")
    atomic_write_json(path, me)
