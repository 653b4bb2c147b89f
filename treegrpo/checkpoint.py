"""Training checkpoints: one format for the CLI, the Train node and the step nodes.

A run writes ``<output_dir>/checkpoints/<run_name>-<iteration:07d>.pt`` (atomically, keeping the newest few) and
records itself in ``<output_dir>/run.json``. A checkpoint is a ``torch.save`` dict of plain tensors, numbers and
JSON strings (``torch.load(weights_only=True)`` reads it):

- ``format`` (int), ``run_name``, ``base_model``, ``iteration``, ``train_time`` (s), ``total_nfe``;
- ``lora``: ``{"<module>.down": (r, in), "<module>.up": (out, r)}`` and ``param_names``: the optimiser's parameter
  order under the same names. The names do not depend on the backend (PEFT layers or ComfyUI's activation-space
  LoRA), so a run started in ComfyUI resumes from the CLI on the same model and the other way round;
- ``optimizer`` (AdamW state dict), ``history`` / ``evals`` / ``config`` (JSON), ``torch_rng``, ``python_rng``,
  ``numpy_rng``;
- ``sigmas``: the (T+1,) noise levels the run samples with. A run resumed on another front-end keeps them
  (``Trainer.kept_sigmas``), so it computes what it would have computed where it started.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
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
    """Write ``state`` as the run's checkpoint of ``iteration`` atomically; delete all but the newest ``keep``, and
    the temporary files of checkpoints a killed process did not finish."""
    path = os.path.join(output_dir, "checkpoints", f"{run_name}-{iteration:07d}.pt")
    atomic_write(path, lambda tmp: torch.save(dict(state, format=FORMAT, run_name=run_name, iteration=iteration),
                                              tmp))
    for old in checkpoint_paths(output_dir, run_name)[:-keep]:
        os.unlink(old)
    # the half-written copies a killed process left (kill -9 mid-write): the run holds its folder, so none is in use
    stale = re.compile(rf"\.tmp-{re.escape(run_name)}-\d{{7}}\.pt-")
    for name in os.listdir(os.path.dirname(path)):
        if stale.match(name):
            try:
                os.unlink(os.path.join(os.path.dirname(path), name))
            except OSError:
                pass
    return path


def read_latest_checkpoint(paths: list[str], run_name: str, mmap: bool = False) -> tuple[str, dict]:
    """The newest readable checkpoint among ``paths`` (oldest first) and its state. One that cannot be read (a
    truncated or corrupt file: a full disk, a killed copy) is skipped with a warning, and the previous one is
    used; raises CheckpointError when none can be read. ``mmap``: tensors stay mapped from the file, read only
    when used (for a look at the settings)."""
    errors = []
    for path in reversed(paths):
        try:
            return path, read_checkpoint(path, run_name, mmap=mmap)
        except CheckpointError:
            raise
        except Exception as e:  # torch/zip/pickle errors of a damaged file
            errors.append(f"{path}: {type(e).__name__}: {e}")
            warnings.warn(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); trying the previous one")
    raise CheckpointError("no readable checkpoint: " + "; ".join(errors) + ". Start the run again without resuming "
                          "(or under another run_name)")


def read_checkpoint(path: str, run_name: str, mmap: bool = False) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    if state.get("run_name") != run_name:
        raise CheckpointError(f"checkpoint {path} belongs to run {state.get('run_name')!r}, not {run_name!r}")
    fmt = state.get("format")
    if fmt != FORMAT:
        newer = isinstance(fmt, int) and fmt > FORMAT
        raise CheckpointError(f"checkpoint {path} has format {fmt!r}; this version reads format {FORMAT}"
                              + (": it was written by a newer TreeGRPO; update TreeGRPO to resume it, or start a new "
                                 "run (another run_name)" if newer else
                                 ": start a new run (another run_name) or use the version that wrote it"))
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


#: what a run writes into its folder beside its LoRAs and checkpoints (the folder's own when run.json names the run):
#: logs, figures, and the artist's answers and checks (their pictures in ``artist/``)
RUN_FOLDER_FILES = ("log.json", "log.csv", "eval.csv", "summary.json", "reward_curve.png",
                    "samples_before_after.png", "artist_labels.jsonl", "artist_checks.jsonl")


def best_iteration(path: str) -> Optional[int]:
    """The iteration a best LoRA file holds (its ``treegrpo.best_iteration`` metadata); None without a file, or one
    whose metadata cannot be read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as f:
            return int((f.metadata() or {}).get("treegrpo.best_iteration", ""))
    except (OSError, ValueError, RuntimeError, SafetensorError):
        return None


def set_aside_best(path: str, after: int) -> Optional[str]:
    """Move the best LoRA ``path`` (``<run>_best.safetensors``) to ``<run>_best-not-preferred-<iteration>.safetensors``
    beside it when the iteration its metadata names (``treegrpo.best_iteration``) is after ``after``: a check against
    the start took the run back before that state. The new path, or None (no such file, one of an earlier state, or
    one whose metadata cannot be read: left as it is)."""
    it = best_iteration(path)
    if it is None or it <= after:
        return None
    dest = f"{path[:-len('.safetensors')]}-not-preferred-{it}.safetensors"
    os.replace(path, dest)
    return dest


def run_files(output_dir: str, run_name: str) -> list[str]:
    """What a run of ``run_name`` left in ``output_dir``: its LoRA files (the last and the best, each with its diffusers copy, those
    the artist's checks did not prefer), and where the folder is that run's (``run.json``) its logs, summary,
    figures, evaluation grids (``evals/eval_<iteration>.png``), the Train node's sample grids
    (``previews/preview_*.png``) and the artist's answers with their pictures
    (``artist/``); then its checkpoints."""
    names = (f"{run_name}.safetensors", f"{run_name}_diffusers.safetensors", f"{run_name}_best.safetensors",
             f"{run_name}_best_diffusers.safetensors")
    names += tuple(sorted(os.path.basename(p) for pattern in ("-not-preferred-*", "_best-not-preferred-*")
                          for p in glob.glob(os.path.join(glob.escape(output_dir),
                                                          glob.escape(run_name) + pattern + ".safetensors"))))
    try:
        owner = json.load(open(os.path.join(output_dir, "run.json"), encoding="utf-8")).get("run_name")
    except (OSError, ValueError, AttributeError):
        owner = run_name
    if owner == run_name:   # the folder's files; another run's are claim_output_dir's business
        names += RUN_FOLDER_FILES
    found = [os.path.join(output_dir, n) for n in names if os.path.isfile(os.path.join(output_dir, n))]
    if owner == run_name:
        found += sorted(glob.glob(os.path.join(glob.escape(output_dir), "evals", "eval_*.png")))
        found += sorted(glob.glob(os.path.join(glob.escape(output_dir), "previews", "preview_*.png")))
        found += sorted(p for p in glob.glob(os.path.join(glob.escape(output_dir), "artist", "**"), recursive=True)
                        if os.path.isfile(p))
    return found + checkpoint_paths(output_dir, run_name)


def finished_an_iteration(output_dir: str, run_name: str) -> bool:
    """Whether run ``run_name`` in ``output_dir`` got further than its start: a checkpoint, its logs or LoRA, or
    an artist's answers (not only what a run writes before its first iteration ends: the base model's evaluation
    grid and its "best" LoRA, which is the base model's)."""
    names = (f"{run_name}.safetensors", f"{run_name}_diffusers.safetensors") + RUN_FOLDER_FILES
    return bool(checkpoint_paths(output_dir, run_name)) or any(
        os.path.isfile(os.path.join(output_dir, n)) for n in names)


def check_fresh_start(output_dir: str, run_name: str) -> None:
    """Refuse to start run ``run_name`` afresh where an earlier run of that name left its files (it would replace
    its LoRA and logs): the user resumes it, archives it explicitly, or picks another name or folder."""
    found = run_files(output_dir, run_name)
    if found and not finished_an_iteration(output_dir, run_name):
        return   # stopped before its first iteration ended: the fresh start moves its files aside (archive_run)
    if found:
        shown = ", ".join(os.path.basename(p) for p in found[:4]) + (" ..." if len(found) > 4 else "")
        raise CheckpointError(f"output_dir {output_dir!r} already holds run {run_name!r} ({shown}); pass --resume to "
                              "continue it, --overwrite to start again (its files are moved to "
                              "previous-<time>/, nothing is deleted), or choose another run_name or output_dir")


def previous_folder(parent: str) -> str:
    """A new ``<parent>/previous-<time>`` name (``-2``, ``-3``, ... for two within a second); not created."""
    stamp = time.strftime('%Y%m%d-%H%M%S')
    dest = os.path.join(parent, f"previous-{stamp}")
    n = 1
    while os.path.exists(dest):
        n += 1
        dest = os.path.join(parent, f"previous-{stamp}-{n}")
    return dest


def archive_run(output_dir: str, run_name: str) -> Optional[str]:
    """Move an earlier run's files (:func:`run_files`) to ``<output_dir>/previous-<time>/`` so that a fresh run
    neither mixes with nor deletes them; returns that folder, or None when there was nothing to move."""
    old = run_files(output_dir, run_name)
    if not old:
        return None
    dest = previous_folder(output_dir)
    for p in old:   # each keeps its place in the folder (checkpoints/, evals/)
        to = os.path.join(dest, os.path.relpath(p, output_dir))
        os.makedirs(os.path.dirname(to), exist_ok=True)
        os.replace(p, to)
    if (folder_owner(output_dir) or {}).get("run_name") == run_name:   # which model they were trained on
        shutil.copy2(os.path.join(output_dir, "run.json"), os.path.join(dest, "run.json"))
    return dest


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def config_changes(saved: dict, cfg, source: str = "the checkpoint") -> list[str]:
    """``field: saved -> now`` for every training setting (``TrainConfig.training_settings``) of ``cfg`` that
    differs from the checkpoint's config ``saved`` (a ``to_dict``). Fields a newer version wrote that this one does
    not know are left out with one warning naming ``source`` and them (a newer version adds a field with a default
    that trains as before); a value this version cannot use is a change that names it."""
    from .config import ConfigError, TrainConfig

    if saved.get("prompts") and saved.get("prompts_file"):   # written before both were refused: the inline
        saved = dict(saved, prompts_file=None)                  # prompts trained, the file was never read
    try:
        old, dropped = TrainConfig.from_dict_known(saved)
    except (ConfigError, TypeError) as e:
        return [f"the checkpoint's config is not readable by this version ({e})"]
    if dropped:
        warnings.warn(f"{source} was written by a newer TreeGRPO: its settings {dropped} are unknown to this version "
                      "and left out (update TreeGRPO to use them)")
    before = _flat(old.training_settings())
    now = _flat(cfg.training_settings())
    return [change_text(k, before.get(k), now.get(k)) for k in sorted(set(before) | set(now))
            if before.get(k) != now.get(k)]


def change_text(field: str, before, now) -> str:
    """``field: before -> now``; for two lists (the prompts), their lengths and the first entry that differs, not
    both whole lists (a prompt file's hundreds of lines hid the one that changed)."""
    from .config import shorten

    if isinstance(before, list) and isinstance(now, list) and (len(before) > 3 or len(now) > 3):
        i = next((i for i, (a, b) in enumerate(zip(before, now)) if a != b), min(len(before), len(now)))
        at = (f"entry {i + 1}: {shorten(repr(before[i]), 80)} -> {shorten(repr(now[i]), 80)}"
              if i < min(len(before), len(now)) else
              f"entry {i + 1} {'added' if len(now) > len(before) else 'removed'}: "
              f"{shorten(repr((now if len(now) > len(before) else before)[i]), 80)}")
        return f"{field}: {len(before)} -> {len(now)} entries, the first change at {at}"
    return f"{field}: {before!r} -> {now!r}"


def prompts_digest(prompts: list) -> str:
    """A run's training prompts as one SHA-256 (hex): what its checkpoint keeps to tell a prompts file whose lines
    changed from the same prompts read through another path."""
    import hashlib

    return hashlib.sha256(json.dumps(list(prompts), ensure_ascii=False).encode("utf-8")).hexdigest()


def _comments_note(path: str) -> str:
    """Where a prompt file has ``# `` lines: that they are comments now (versions before 2026-12-07 trained on them
    as prompts, so an unchanged file reads as other prompts)."""
    from .prompts import comment_lines
    try:
        with open(path, encoding="utf-8-sig") as fh:
            n = comment_lines(fh.read(), path)
    except (OSError, UnicodeDecodeError):
        return ""
    return (f" (its {n} line{'s' if n > 1 else ''} beginning '# ' {'are' if n > 1 else 'is'} comments since "
            "2026-12-07; an earlier version trained on them as prompts)") if n else ""


def check_resume(output_dir: str, cfg, *, allow_changes: bool = False, required: bool = True,
                 override_hint: str = "pass --allow-changes to continue anyway") -> Optional[str]:
    """Before any model is loaded: the newest readable checkpoint of ``cfg.run_name`` in ``output_dir`` (None when
    there is none and ``required`` is False), refusing when ``cfg``'s training settings differ from the ones the
    run was trained with (a resumed run goes on learning what it began to learn), unless ``allow_changes``; a prompts
    file counts by its prompts (the checkpoint keeps their digest), not by its path."""
    found = checkpoint_paths(output_dir, cfg.run_name)
    if not found:
        if not required:
            return None
        raise CheckpointError(f"--resume: no checkpoint of run {cfg.run_name!r} in "
                              f"{os.path.join(output_dir, 'checkpoints')}; run without --resume to start it (or give "
                              "the run's output_dir and run_name)")
    path, state = read_latest_checkpoint(found, cfg.run_name)
    changes = config_changes(json.loads(state.get("config", "{}")), cfg, source=f"checkpoint {path}")
    if state.get("prompts_sha256") and not cfg.prompts:   # a prompts file: its prompts count, not its path
        changes = [c for c in changes if not c.startswith("prompts_file:")]
        if prompts_digest(cfg.load_prompts()) != state["prompts_sha256"]:
            changes.append(f"prompts_file: the prompts in {cfg.prompts_file!r} are not the ones the run was trained on"
                           + _comments_note(cfg.prompts_file))
    if changes and not allow_changes:
        raise CheckpointError(f"run {cfg.run_name!r} was trained with other settings (a resumed run goes on learning "
                              f"what it began to learn): {'; '.join(changes)}. Resume with the same settings (only the "
                              "budget, evaluation, checkpointing, memory and the pipeline's precision and decode batch "
                              f"may change), start a new run_name, or {override_hint}")
    return path


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


def check_not_in_use(output_dir: str) -> None:
    """Refuse at once (:class:`CheckpointError`, as :class:`RunLock`) a folder another run is training in, before
    any model loads; the run's own lock is taken when it begins. Under torchrun / accelerate only the first process
    looks (the others would take the probe's lock from each other)."""
    if os.path.isdir(output_dir) and os.environ.get("RANK", "0") == "0":
        RunLock(output_dir).release()


def folder_owner(output_dir: str) -> Optional[dict]:
    """``<output_dir>/run.json`` (``run_name``, ``base_model``): the run the folder belongs to; None when there is
    none, ``{}`` when it cannot be read."""
    path = os.path.join(output_dir, "run.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            other = json.load(f)
    except (OSError, ValueError):
        return {}
    return other if isinstance(other, dict) else {}


def check_run_folder(output_dir: str, run_name: str, base_model: Optional[str], *, fresh: bool = False,
                     hint: Optional[str] = None) -> None:
    """Refuse ``output_dir`` when its ``run.json`` names another run; or the same run on another base model, unless
    the run starts afresh (``fresh``: its earlier files are moved aside, :func:`archive_run`). ``base_model`` None:
    not known yet (the command line's check before loading), only the run is compared. ``hint``: what to do instead
    of a changed base model (the Train node's words; default the command line's)."""
    other = folder_owner(output_dir)
    if other is None:
        return
    if other.get("run_name") != run_name:
        raise ValueError(f"output_dir {output_dir!r} holds run {other.get('run_name')!r} on "
                         f"{other.get('base_model')!r}; this is run {run_name!r}. Choose another output_dir (or "
                         "run_name) so that nothing is overwritten")
    if not fresh and base_model is not None and other.get("base_model") != base_model:
        raise ValueError(f"run {run_name!r} in {output_dir!r} was trained on {other.get('base_model')!r}, not on "
                         f"{base_model!r}: a run cannot continue on another base model. " +
                         (hint or "Start it again with --overwrite (its files are moved to previous-<time>/, nothing "
                                  "is deleted), or choose another run_name or output_dir"))


def claim_output_dir(output_dir: str, run_name: str, base_model: str, *, fresh: bool = False,
                     chain: Optional[dict] = None) -> None:
    """Record the run in ``<output_dir>/run.json`` after :func:`check_run_folder` (``chain``: what the model is on
    top of its checkpoint, where the front-end knows, as ``model_chain``)."""
    check_run_folder(output_dir, run_name, base_model, fresh=fresh)
    record = {"run_name": run_name, "base_model": base_model}
    if chain is not None:
        record["model_chain"] = chain
    atomic_write_json(os.path.join(output_dir, "run.json"), record)
