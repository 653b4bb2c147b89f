"""A Train-node run one can watch and walk away from: which run a queued prompt trains (``existing_run``), a console
line and the time left on the node after every iteration, every evaluation's sample grid kept in the run folder and
shown on the node, and LoRAs written where ComfyUI's LoraLoader lists them
(``models/loras/treegrpo/<run_name>/``): every ``save_every`` iterations, the best by the judge, and the last.

Imported only inside ComfyUI (``folder_paths``, ``server`` and ``comfy`` are imported lazily)."""
from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Callable, Optional

import torch

from .. import checkpoint as ckpt
from ..callbacks import TrainerCallback
from ..io import atomic_write
from ..progress import IterationClock, format_duration, iteration_line

#: the Train node's ``existing_run`` choices: what a queued prompt does when its run_name already trained
EXISTING_RUN = ("resume", "new", "overwrite")


def has_run(folder: str, run_name: str) -> bool:
    """Whether ``folder`` holds files of run ``run_name`` (a LoRA, logs or checkpoints)."""
    return bool(ckpt.run_files(folder, run_name))


def choose_run(run_name: str, existing_run: str, folder_of: Callable[[str], str]) -> tuple[str, bool]:
    """(the run name to train, whether to resume it) for ``existing_run``:

    - ``resume``: ``run_name`` itself, resumed from its newest checkpoint when it has one (a changed training
      setting is refused by :func:`treegrpo.checkpoint.check_resume`);
    - ``new``: ``run_name`` when it never trained, else the first of ``run_name-2``, ``run_name-3``, ... whose
      folder holds no run (the old runs are untouched);
    - ``overwrite``: ``run_name`` started again; the Trainer moves the old run's files to ``previous-<time>/``
      inside its folder and :class:`RunWatcher` its LoRAs to ``previous-<time>/`` inside its LoRA folder (nothing
      is deleted).
    ``folder_of(name)`` is the run's folder."""
    if existing_run not in EXISTING_RUN:
        raise ValueError(f"existing_run: {existing_run!r} is not one of {list(EXISTING_RUN)}")
    if existing_run == "resume":
        return run_name, True
    if existing_run == "overwrite":
        return run_name, False
    name, n = run_name, 1
    while has_run(folder_of(name), name):
        n += 1
        name = f"{run_name}-{n}"
    return name, False


def loras_folder(run_name: str) -> str:
    """``<ComfyUI models/loras>/treegrpo/<run_name>``: where LoraLoader lists the run's LoRAs."""
    import folder_paths

    return os.path.join(folder_paths.get_folder_paths("loras")[0], "treegrpo", run_name)


def archive_loras(folder: str) -> Optional[str]:
    """Move the LoRA files an earlier run of the same name left in its LoRA folder (:func:`loras_folder`: the last,
    the best, the ``save_every`` ones) into ``<folder>/previous-<time>/``, where LoraLoader still lists them, so that
    a fresh run neither overwrites nor mixes with them; returns that folder, or None when there was nothing to move."""
    return move_aside(lora_files(folder), folder)


def lora_files(folder: str) -> list[str]:
    """The LoRA files directly in ``folder`` (sorted full paths; none when it does not exist)."""
    try:
        return sorted(e.path for e in os.scandir(folder) if e.is_file() and e.name.endswith(".safetensors"))
    except FileNotFoundError:
        return []


def archive_taste(run_name: str) -> Optional[str]:
    """Move the taste model an earlier run of this name wrote (``models/reward_models/<run_name>_taste.safetensors``,
    perhaps a reward in another workflow) into ``models/reward_models/previous-<time>/``, where the Reward Model
    Loader still lists it, before a fresh run learns its own; returns that folder, or None."""
    from .artist.taste import taste_file

    path = taste_file(run_name)
    return move_aside([path] if os.path.isfile(path) else [], os.path.dirname(path))


def move_aside(files: list[str], parent: str) -> Optional[str]:
    """Move ``files`` (each directly in ``parent``) into a new ``<parent>/previous-<time>/``; returns it, or None
    when there is nothing to move."""
    if not files:
        return None
    dest = ckpt.previous_folder(parent)
    os.makedirs(dest)
    for p in files:
        os.replace(p, os.path.join(dest, os.path.basename(p)))
    return dest


class RunWatcher(TrainerCallback):
    """The Train node's callback (:class:`treegrpo.callbacks.TrainerCallback`). After each iteration
    (:meth:`on_iteration`): ComfyUI's progress bar, one console line (reward, judge, KL, s/it, time left), the same
    text on the node, and the LoRA every ``save_every`` iterations into :func:`loras_folder`. After each evaluation
    (:meth:`evaluated`): the evaluation's sample grid as ``evals/eval_<iteration>.png`` in the run folder and, beside
    the curves, on the node; the best LoRA copied to the LoRA folder when it changed.
    ``finish()``: the final LoRA there too, the curve and the before/after grid in the run folder."""

    def __init__(self, trainer, total: int, bar, *, save_every: int = 0, node_id: Optional[str] = None,
                 log: Callable[[str], None] = logging.info, clock: Callable[[], float] = time.monotonic):
        self.trainer, self.total, self.bar, self.save_every = trainer, total, bar, save_every
        self.node_id, self.log, self.now = node_id, log, clock
        self.started = clock()
        self.clock = IterationClock()        # the rate over the last iterations, for the time left
        self.clock.tick(self.started)
        self.loras = loras_folder(trainer.cfg.run_name)
        self.first_grid: Optional[torch.Tensor] = None
        self.last_grid: Optional[torch.Tensor] = None
        self._best_mtime = None
        self._warnings_shown = len(trainer.warnings)   # the run's warnings up to the last iteration's line
        trainer.keep_eval_images = True

    def on_train_begin(self, trainer) -> None:
        """A run started afresh (not resumed from a checkpoint) first moves the LoRAs an earlier run of its name
        left in the LoRA folder aside (:func:`archive_loras`), and its taste model (:func:`archive_taste`); a run that
        asks the artist is checkpointed at iteration 0. The console says where the run's files go."""
        if trainer.rank == 0:
            self.log(f"TreeGRPO {trainer.cfg.run_name}: the run folder (logs, checkpoints, figures) is "
                     f"{trainer.cfg.output_dir}; its LoRAs go to {self.loras}")
        if trainer.rank == 0 and getattr(trainer, "started_fresh", False):
            moved = archive_loras(self.loras)
            if moved:
                self.log(f"TreeGRPO {trainer.cfg.run_name}: the LoRAs of an earlier run of this name were moved to "
                         f"{moved}")
            moved = archive_taste(trainer.cfg.run_name)
            if moved:
                self.log(f"TreeGRPO {trainer.cfg.run_name}: the taste model of an earlier run of this name was moved "
                         f"to {moved}")
            if trainer.leaf_scorer is not None:   # the artist answers from the first iteration on: a crash in it
                trainer.save_checkpoint()         # resumes this run, and its answers are used again

    def on_iteration_end(self, trainer, stats: dict) -> None:
        self.on_iteration(stats)

    def on_evaluate(self, trainer, record: dict) -> None:
        self.evaluated(record)

    # ------------------------------------------------------------------ per iteration
    def on_iteration(self, stats: dict) -> None:
        self.clock.tick(self.now())
        t = self.trainer
        last_eval = t.evals[-1] if t.evals else None
        left = self.clock.left(int(stats["iteration"]) + 1, self.total)
        self.copy_best()      # a best LoRA this iteration's check set aside
        line = iteration_line(stats, self.total, run_name=t.cfg.run_name, last_eval=last_eval,
                              s_per_it=self.clock.s_per_it, left_s=left)
        away = _artist_away()
        if away:
            line += f" | {away}"
        for w in stats.get("taste_warnings") or ():
            line += f" | warning: {w}"
        self.log(line)
        self.show_text(line.split(": ", 1)[1].replace(" | ", "\n"))
        self._warnings_shown = len(t.warnings)
        done = int(stats["iteration"]) + 1
        if self.save_every and done % self.save_every == 0 and t.rank == 0:
            path = os.path.join(self.loras, f"{t.cfg.run_name}_it{done:06d}.safetensors")
            t.save_lora(path)
            self.log(f"TreeGRPO {t.cfg.run_name}: saved {path}")
        self.bar()

    def show_text(self, text: str) -> None:
        """Text under the node while it runs (ComfyUI's progress text; nothing where the server lacks it)."""
        if self.node_id is None:
            return
        try:
            from server import PromptServer
            send = getattr(PromptServer.instance, "send_progress_text", None)
            if send is not None:
                send(text, self.node_id)
        except Exception as e:  # noqa: BLE001 - a display must never end the run (an interrupt does)
            _reraise_interrupt(e)

    # ------------------------------------------------------------------ per evaluation
    def evaluated(self, rec: dict) -> None:
        from ..report import sample_grid, signals_image
        t = self.trainer
        images = getattr(t, "last_eval_images", None)
        grid = None
        if images is not None and t.rank == 0:
            grid = sample_grid(images, t.cfg.eval_seeds)
            if len(t.evals) == 1:      # the base model's (a resumed run's first evaluation here is a later one)
                self.first_grid = grid
            self.last_grid = grid
            path = eval_grid_path(t.out, t.iteration)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            from ..report import to_pil
            to_pil(grid).save(path)
        self.copy_best()
        try:
            curve = signals_image(t.evals)[0].movedim(-1, 0)
            self.bar.preview(side_by_side(curve, grid)[None].movedim(1, -1))
        except Exception as e:  # noqa: BLE001 - a preview must never end the run (an interrupt does)
            _reraise_interrupt(e)
            logging.warning("TreeGRPO: could not draw the live preview (%s: %s)", type(e).__name__, e)

    def copy_best(self) -> None:
        """The run's best LoRA into the LoRA folder when it changed; one the artist's check set aside in the run
        folder (a state they did not prefer) is set aside here too, under the same name."""
        src = self.trainer.best_lora_path
        if self.trainer.rank != 0:
            return
        dest = os.path.join(self.loras, os.path.basename(src))
        moved = getattr(self.trainer, "best_set_aside", [])
        while moved:
            after, _ = moved.pop(0)
            ckpt.set_aside_best(dest, after)
        if not os.path.isfile(src):
            if os.path.isfile(dest):     # set aside in the run folder before a stop: its copy here follows now
                ckpt.set_aside_best(dest, after=-1)
            return
        mtime = os.stat(src).st_mtime_ns
        if mtime == self._best_mtime:
            return
        os.makedirs(self.loras, exist_ok=True)
        atomic_write(dest, lambda tmp: shutil.copyfile(src, tmp))
        self._best_mtime = mtime

    # ------------------------------------------------------------------ at the end
    def finish(self) -> str:
        """The final LoRA into the LoRA folder (returned), the best one, ``reward_curve.png`` and
        ``samples_before_after.png`` (the base model's grid left — the run's first evaluation, also when it was
        resumed —, the last one's right, titled, a row per evaluation prompt) in the run folder."""
        t = self.trainer
        path = os.path.join(self.loras, f"{t.cfg.run_name}.safetensors")
        if t.rank != 0:
            return path
        t.save_lora(path)
        self.copy_best()
        twins = self.diffusers_twins()
        from ..report import labelled_pair, signals_image, to_pil
        try:
            if t.evals:
                to_pil(signals_image(t.evals)[0].movedim(-1, 0)).save(os.path.join(t.out, "reward_curve.png"))
            first = self.first_grid
            if first is None and t.evals:   # resumed: the base model's grid from the run's first session, kept
                first = read_grid(eval_grid_path(t.out, t.evals[0]["iteration"]))
            if first is None and t.evals and t.evals[0]["iteration"] == 0 and self.last_grid is not None:
                first = self.base_grid()    # not kept (a version before it kept them, or deleted): sampled again
            if first is not None and self.last_grid is not None:
                pair = labelled_pair(first, self.last_grid, (f"base model (iteration {t.evals[0]['iteration']})",
                                                             f"LoRA at iteration {t.evals[-1]['iteration']}"),
                                     list(t.eval_prompts))
                to_pil(pair).save(os.path.join(t.out, "samples_before_after.png"))
        except Exception as e:  # noqa: BLE001 - the LoRA is saved; a drawing failure is only logged
            _reraise_interrupt(e)
            logging.warning("TreeGRPO: could not draw the run's figures (%s: %s)", type(e).__name__, e)
        elapsed = self.now() - self.started   # the whole run as the person waited for it
        base_best = (f"{t.cfg.run_name}_best.safetensors is the untrained LoRA (no change): no evaluation after "
                     "iteration 0 scored above the base model" if ckpt.best_iteration(t.best_lora_path) == 0 else None)
        self.log(f"TreeGRPO {t.cfg.run_name}: done, iteration {t.iteration}/{self.total} after "
                 f"{format_duration(elapsed)}; LoRA {path} (LoraLoader lists it under treegrpo/{t.cfg.run_name}/); "
                 f"checkpoints, logs and evaluation grids in {t.out}"
                 + (f"; for diffusers' load_lora_weights: {' and '.join(twins)} there" if twins else "")
                 + (f"; {base_best}" if base_best else ""))
        # the node's last text: what the run delivered, and what its end said (a check that took the LoRA back)
        self.show_text("\n".join([f"done: iteration {t.iteration}/{self.total}",
                                  f"LoRA treegrpo/{t.cfg.run_name}/{os.path.basename(path)}",
                                  *([base_best] if base_best else []),
                                  *t.warnings[self._warnings_shown:]]))
        return path

    def diffusers_twins(self) -> list[str]:
        """The last and the best LoRA in diffusers' keys in the run folder (``<run_name>_diffusers.safetensors``,
        ``<run_name>_best_diffusers.safetensors``) for the families diffusers' ``load_lora_weights`` does not read
        ComfyUI's keys of (:mod:`treegrpo.comfyui.diffusers_lora`); the names written. A twin that cannot be made is
        said, never ends the run."""
        from ..lora import from_state_dict, read_lora_file
        t, written = self.trainer, []
        try:
            for src, name in ((None, f"{t.cfg.run_name}_diffusers.safetensors"),
                              (t.best_lora_path, f"{t.cfg.run_name}_best_diffusers.safetensors")):
                if src is not None and not os.path.isfile(src):
                    continue
                w = t.lora_weights() if src is None else from_state_dict(*read_lora_file(src))
                if t.policy.save_diffusers_lora(w, os.path.join(t.out, name)) is None:
                    break
                written.append(name)
        except Exception as e:  # noqa: BLE001 - the ComfyUI LoRA is written; an interrupt still stops
            _reraise_interrupt(e)
            logging.warning("TreeGRPO %s: no copy of the LoRA in diffusers' keys (%s: %s); the ComfyUI LoRA is "
                            "written", t.cfg.run_name, type(e).__name__, e)
        return written

    def base_grid(self) -> torch.Tensor:
        """The base model's evaluation grid sampled again (the LoRA off, the evaluation's fixed noises: iteration 0's
        pictures, as its evaluation drew them) and kept where that evaluation's grid goes."""
        from ..report import sample_grid, to_pil
        t = self.trainer
        with torch.inference_mode(False), t.policy.lora_disabled():
            ev = t.evaluate(return_images=True)
        grid = sample_grid(ev["images"], t.cfg.eval_seeds)
        path = eval_grid_path(t.out, 0)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        to_pil(grid).save(path)
        return grid

    def stopped(self, error: BaseException) -> None:
        """The node's text when the run stops early (Cancel, the artist away, an error): where it can go on from,
        in place of the last iteration's line and its time left."""
        t = self.trainer
        why = ("cancelled" if type(error).__name__ == "InterruptProcessingException" else
               f"stopped ({type(error).__name__})")
        saved = t.checkpointed_iteration
        if saved is not None:
            where = f"saved: queue again to resume from iteration {saved}"
        elif ckpt.checkpoint_paths(t.out, t.cfg.run_name):     # stopped before it read the checkpoint it resumes
            where = "its checkpoints are kept: queued again it resumes from the newest"
        else:
            where = "nothing saved: queued again it starts afresh"
        self.show_text(f"{why} after iteration {t.iteration}/{self.total}\n{where}")


def _artist_away() -> Optional[str]:
    """``artist away: N trees fell back`` while the artist has not answered since a question timed out."""
    from .artist.questions import BOARD
    return BOARD.away_summary()


def _reraise_interrupt(e: Exception) -> None:
    """ComfyUI's interrupt (an Exception subclass) passes through the handlers that keep displays optional."""
    from comfy.model_management import InterruptProcessingException
    if isinstance(e, InterruptProcessingException):
        raise e


def eval_grid_path(run_folder: str, iteration: int) -> str:
    """Where the evaluation grid of ``iteration`` is kept: ``<run folder>/evals/eval_<iteration, 6 digits>.png``."""
    return os.path.join(run_folder, "evals", f"eval_{iteration:06d}.png")


def preview_grid_path(run_folder: str, iteration: int, prompts: list[str]) -> str:
    """Where the Train node's sample grid of ``iteration`` on ``prompts`` is kept (a finished run queued again, after
    ComfyUI restarted, shows it instead of sampling it again): ``<run folder>/previews/preview_<iteration>_<digest
    of the prompts>.png`` (a run started over moves them aside with its other files)."""
    import hashlib
    digest = hashlib.sha256("\n".join(prompts).encode("utf-8")).hexdigest()[:12]
    return os.path.join(run_folder, "previews", f"preview_{iteration:06d}_{digest}.png")


def read_grid(path: str) -> Optional[torch.Tensor]:
    """A kept evaluation grid as (3, H, W) float in [0, 1]; None when it is not there (moved, deleted)."""
    from ..report import read_picture

    try:
        return read_picture(path).permute(2, 0, 1)
    except (OSError, ValueError):
        return None


def side_by_side(left: torch.Tensor, right: Optional[torch.Tensor], pad: int = 8) -> torch.Tensor:
    """Two (3, H, W) images in one, the right one scaled to the left's height (white gap of ``pad`` pixels)."""
    if right is None:
        return left
    h = left.shape[1]
    w = max(1, round(right.shape[2] * h / right.shape[1]))
    right = torch.nn.functional.interpolate(right[None].float(), size=(h, w), mode="bilinear",
                                            align_corners=False)[0].clamp(0, 1)
    gap = torch.ones(3, h, pad)
    return torch.cat([left.float(), gap, right], dim=2)
