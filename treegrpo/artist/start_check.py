"""Checks against where the run started: is the artist still happier with the pictures now than with the base model's?

A tree's leaves are compared with each other only, and each tree's rewards are z-scored on their own: a run whose
every leaf drifts the same wrong way (all shapes shrinking to nothing, a colour sliding away) keeps getting "the best
of these" as its answer, and a taste model that agrees with those answers keeps agreeing all the way down. Every
``every`` iterations the run therefore shows the artist ``pictures`` samples of the model now beside the base model's
(LoRA off) from the same noises and prompts, in an order drawn at random, and asks which side is closer to what they
want. The answer guards the run (:class:`StartGuard`, a pure state machine):

* a pick of either side gets a second look on other noises (``confirm``): one wrong click must neither throw away a
  good run's progress nor approve a bad state that a later roll-back would return to; only two looks that agree
  decide, anything else changes nothing;
* **now wins**: the LoRA, the optimiser's state and the iteration are kept as a snapshot the artist approved;
* **the start wins**: the LoRA and the optimiser go back to the newest approved snapshot (the start itself before
  any); if the run had just gone back there and loses again, that snapshot is dropped and the one before is used;
* **no preference / no answer**: nothing changes (no second look).

At the end of the run (``final``) the state reached is kept only when the artist prefers it to the start (on two
looks; a check made at that iteration stands); when they prefer the start or have no preference the LoRA goes back
to the newest approved snapshot — kept only if the artist prefers it to the start again, on two looks at noises no
check has used (an approval rests on 2 × ``pictures`` samples from the run's fixed check noises: a state that was
lucky on those is not delivered on that luck alone) — else to the one before, the start itself when none is left. So
a run ends on a state the artist preferred to where it began, or on the base model: never on pictures they did not
prefer to it. Only when nobody answers (the artist is away) does the run end on the state it reached, with a warning
that it was not compared with the start.

A run stopped and resumed (Cancel and queue again, a crash) keeps its guard: each approved state and the start are
written once to ``<run folder>/artist/states/`` and the checkpoint names them (:meth:`StartCheck.state_dict`), so the
resumed run goes back to what the artist approved before the stop, and its start is still the base model's LoRA.
"""
from __future__ import annotations

import copy
import glob
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..callbacks import TrainerCallback

NOW, START = "now", "start"
#: what an ``ask`` returns when nobody answered in time (the artist is away): not a verdict, and at the end of a run
#: not a reason to take the state reached back
NO_ANSWER = "no answer"


@dataclass
class Snapshot:
    """An approved state: the LoRA weights, the optimiser's state dict and the iteration it was taken after;
    ``file``: where it is kept in the run folder (relative), once written (:data:`STATES`)."""

    iteration: int
    weights: Any
    optimizer: Optional[dict] = None
    file: Optional[str] = None


#: where a run keeps its guard's states, in its folder: ``<run>-start-<iteration>.pt`` and ``<run>-<iteration>.pt``
STATES = os.path.join("artist", "states")


@dataclass
class StartGuard:
    """The rule above over a stack of approved snapshots; the start (``initial``) is never dropped.

    ``record(verdict, snapshot)`` returns the snapshot to restore (None: keep training from here). ``keep``: how many
    approved snapshots are kept besides the start (memory: a LoRA and its two Adam moments each)."""

    initial: Snapshot
    keep: int = 3
    approved: list = field(default_factory=list)
    just_restored: bool = False
    restores: int = 0

    def top(self) -> Snapshot:
        return self.approved[-1] if self.approved else self.initial

    def record(self, verdict: Optional[str], current: Callable[[], Snapshot]) -> Optional[Snapshot]:
        """``verdict``: :data:`NOW`, :data:`START` or None (no preference, no answer). ``current`` makes the snapshot
        of the state now (called only when it is approved)."""
        if verdict not in (NOW, START, None):
            raise ValueError(f"check verdict {verdict!r}: use {NOW!r}, {START!r} or None")
        if verdict is None:
            return None
        if verdict == NOW:
            self.approved.append(current())
            del self.approved[:-self.keep]
            self.just_restored = False
            return None
        if self.just_restored and self.approved:
            self.approved.pop()          # the state gone back to lost again: trust the one before
        self.just_restored = True
        self.restores += 1
        return self.top()


@dataclass(frozen=True)
class CheckConfig:
    """``every``: iterations between checks (0: never). ``pictures``: samples per side. ``seed``: the checks'
    noises and the sides' order (the same noises at every check, so two checks compare like with like).
    ``confirm``: a pick of either side is asked again on other noises and decides only when both looks agree.
    ``final``: the run ends with a check and keeps only a state the artist preferred to the start (module
    docstring)."""

    every: int = 5
    pictures: int = 8
    seed: int = 0
    confirm: bool = True
    final: bool = True

    def __post_init__(self):
        if not (isinstance(self.every, int) and self.every >= 0):
            raise ValueError(f"check every {self.every!r}: give the iterations between checks (0: never)")
        if not (isinstance(self.pictures, int) and 1 <= self.pictures <= 64):
            raise ValueError(f"check pictures {self.pictures!r}: give 1..64 samples per side")


GAP = 2   # pixels between the pictures of a side


def side_picture(images: torch.Tensor) -> torch.Tensor:
    """A check's side as the artist sees it: pictures (B, 3, H, W) in [0, 1] in rows of at most 4 with a
    :data:`GAP`-pixel white gap, (H', W', 3)."""
    b, _, h, w = images.shape
    cols = min(4, b)
    rows = -(-b // cols)
    out = torch.ones(rows * (h + GAP) - GAP, cols * (w + GAP) - GAP, 3)
    for i in range(b):
        r, k = divmod(i, cols)
        out[r * (h + GAP):r * (h + GAP) + h, k * (w + GAP):k * (w + GAP) + w] = images[i].movedim(0, -1).float().cpu()
    return out


def side_pictures(picture: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` pictures (n, 3, H, W) of a side drawn by :func:`side_picture` ((H', W', 3)): its inverse (what a
    resumed run's taste model reads back from ``artist_checks.jsonl``)."""
    cols = min(4, n)
    rows = -(-n // cols)
    h = (picture.shape[0] + GAP) // rows - GAP
    w = (picture.shape[1] + GAP) // cols - GAP
    if h <= 0 or w <= 0 or rows * (h + GAP) - GAP != picture.shape[0] or cols * (w + GAP) - GAP != picture.shape[1]:
        raise ValueError(f"a picture of {tuple(picture.shape[:2])} pixels is not a side of {n} pictures")
    return torch.stack([picture[(i // cols) * (h + GAP):(i // cols) * (h + GAP) + h,
                                (i % cols) * (w + GAP):(i % cols) * (w + GAP) + w].movedim(-1, 0) for i in range(n)])


def check_pictures(policy, prompts: list[str], noise: torch.Tensor, steps: int, guidance: float = 1.0,
                   sigmas: Optional[torch.Tensor] = None, start: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """ODE samples of the policy now and of the base model (LoRA off) from the same ``noise`` (B, C, H, W), one
    per prompt: decoded images ``(now, start)``, each (B, 3, H, W) in [0, 1] (video: (B, F, 3, H, W)). ``start``:
    the base model's pictures of these noises made before (they do not change during a run), not sampled again."""
    from ..tree import sample_ode

    was_training = policy.model.training
    policy.model.eval()
    try:
        with torch.no_grad():
            run = lambda: sample_ode(policy, prompts, noise, steps, guidance, sigmas=sigmas)  # noqa: E731
            now = policy.decode(policy.run(run, max_batch=len(prompts)))
            if start is None:
                with policy.lora_disabled():
                    start = policy.decode(policy.run(run, max_batch=len(prompts)))
    finally:
        policy.model.train(was_training)
    return now, start


class StartCheck(TrainerCallback):
    """The check as the trainer runs it after an iteration (one of its ``callbacks``: the state at
    ``on_train_begin`` is the start; ``on_iteration_end`` checks when due and adds ``check`` / ``check_restored`` to
    the iteration's record).

    ``ask(first, second, prompts, iteration, again) -> 0 | 1 | None | NO_ANSWER``: which side the artist prefers
    (``first``/``second``: image batches (B, 3, H, W) in [0, 1]; None: no preference; :data:`NO_ANSWER`: nobody
    answered; ``again``: the second look). Which of the two is the model now is drawn at random per question (the artist is not told).
    ``on_unapproved(trainer)``: called with the state reached before the end of the run takes it back (the Train
    node keeps it as a LoRA file and returns its path, which the warning names: nothing trained is lost)."""

    def __init__(self, ask: Callable, config: CheckConfig = CheckConfig(),
                 on_unapproved: Optional[Callable[[Any], Any]] = None):
        self.ask, self.config, self.on_unapproved = ask, config, on_unapproved
        self.guard: Optional[StartGuard] = None
        self.output_dir, self.run_name = "", ""      # the run's, from :meth:`begin` (where an ``ask`` keeps answers)
        self.began_at = 0                            # the iteration the run started (or resumed) from
        self.records: list[dict] = []
        self.g = torch.Generator().manual_seed(7_000_003 + config.seed)
        self.start_pictures: dict = {}     # (again, fresh) -> the base model's pictures of that look's noises (once)
        self.resumed: Optional[dict] = None    # the state a resumed run's checkpoint kept (load_state_dict)
        self.named: dict[int, set] = {}       # checkpoint iteration -> the state files it names (others are deleted)
        self.pending: set = set()            # the files the checkpoint being written names
        self.reached: Optional[tuple] = None  # (iteration, LoRA weights) of the state the last roll-back left

    def due(self, iteration: int) -> bool:
        return bool(self.config.every) and iteration > 0 and iteration % self.config.every == 0

    @staticmethod
    def snapshot(trainer) -> Snapshot:
        return Snapshot(trainer.iteration, copy.deepcopy(trainer.lora.weights()),
                        copy.deepcopy(trainer.optimizer.state_dict()))

    def on_train_begin(self, trainer) -> None:
        self.begin(trainer)
        if self.due(trainer.iteration) and not any(r["iteration"] == trainer.iteration for r in self.records):
            # the run stopped while this iteration's check waited (Cancel): it is checked now, the looks already
            # answered taken from artist_checks.jsonl (the ask's replay), and the verdict goes to its record
            rec = self(trainer)
            if rec is not None and trainer.history and trainer.history[-1].get("iteration") == trainer.iteration - 1:
                trainer.history[-1]["check"] = rec["verdict"] or "none"
                trainer.history[-1]["check_restored"] = rec["restored"]

    def on_step(self, trainer) -> None:
        if self.guard is None:      # a loop driven step by step (no train()): the state before the first update
            self.begin(trainer)

    def on_train_end(self, trainer) -> None:
        self.finish(trainer)

    def on_iteration_end(self, trainer, stats: dict) -> None:
        rec = self(trainer)
        if rec is not None:
            stats["check"] = rec["verdict"] or "none"
            stats["check_restored"] = rec["restored"]

    def begin(self, trainer) -> None:
        """Take the state the run starts from as the guard's start; a resumed run: the guard its checkpoint kept
        (:meth:`load_state_dict`), else the state it resumed with."""
        self.output_dir, self.run_name = trainer.cfg.output_dir, trainer.cfg.run_name
        self.began_at = trainer.iteration
        self.start_pictures = {}
        kept, self.resumed = self.resumed, None
        self.guard = self.read_guard(trainer, kept) if kept is not None else None
        if self.guard is None:
            self.guard = StartGuard(self.snapshot(trainer))
            if kept is None and trainer.iteration > 0 and getattr(trainer, "rank", 0) == 0:
                # a run begun without checks (artist_check_every 0, or a version before them) resumed with them
                logging.warning("TreeGRPO %s: checks against the start begin at iteration %d (the run's checkpoint "
                                "has none): each shows the pictures now beside the base model's, and picking the "
                                "base model goes back to the state the run resumed from, not further; "
                                "artist_check_every 0 trains on without them", trainer.cfg.run_name, trainer.iteration)

    # -- the guard in the run's checkpoint ---------------------------------------------------------------------------

    def state_dict(self, trainer) -> Optional[dict]:
        """The guard for the checkpoint: its states written to :data:`STATES` (each once) and named, its counters,
        the checks so far and the sides' order generator."""
        if self.guard is None or getattr(trainer, "rank", 0) != 0:
            return None
        states = [self.guard.initial, *self.guard.approved]
        for snap in states:
            if snap.file is None:
                snap.file = self.write_state(trainer, snap, start=snap is self.guard.initial)
        self.pending = {snap.file for snap in states}
        return {"guard": json.dumps({"initial": [self.guard.initial.iteration, self.guard.initial.file],
                                     "approved": [[snap.iteration, snap.file] for snap in self.guard.approved],
                                     "just_restored": self.guard.just_restored, "restores": self.guard.restores,
                                     "records": self.records}),
                "order": self.g.get_state()}

    def load_state_dict(self, trainer, state: dict) -> None:
        self.resumed = state

    def on_checkpoint(self, trainer, path: str) -> None:
        """Delete the state files no checkpoint on disk names; nothing while one on disk is not known (a resumed
        run's older checkpoints, until they are replaced)."""
        from ..checkpoint import checkpoint_paths

        self.named[trainer.iteration] = set(self.pending)
        run = trainer.cfg.run_name
        on_disk = set()
        for p in checkpoint_paths(trainer.out, run):
            try:
                on_disk.add(int(os.path.basename(p)[len(run) + 1:-3]))
            except ValueError:          # another run's (a longer name) or not a checkpoint
                pass
        self.named = {it: files for it, files in self.named.items() if it in on_disk}
        if set(self.named) != on_disk:
            return
        named = set().union(*self.named.values())
        pattern = re.compile(re.escape(trainer.cfg.run_name) + r"-(start-)?\d{7}\.pt")
        folder = os.path.join(trainer.out, STATES)
        for f in glob.glob(os.path.join(glob.escape(folder), glob.escape(trainer.cfg.run_name) + "-*.pt")):
            rel = os.path.relpath(f, trainer.out)
            if pattern.fullmatch(os.path.basename(f)) and rel not in named:
                os.unlink(f)

    def write_state(self, trainer, snap: Snapshot, start: bool) -> str:
        """Write ``snap`` (weights, optimiser state and the LoRA parameters' names) to :data:`STATES`; its path
        relative to the run folder."""
        from ..io import atomic_write

        w = snap.weights
        rel = os.path.join(STATES, f"{trainer.cfg.run_name}-{'start-' if start else ''}{snap.iteration:07d}.pt")
        state = {"iteration": snap.iteration, "down": w.down, "up": w.up, "alpha": json.dumps(w.alpha),
                 "optimizer": snap.optimizer, "param_names": [n for n, _ in trainer.lora.named_lora_parameters()]}
        atomic_write(os.path.join(trainer.out, rel), lambda tmp: torch.save(state, tmp))
        return rel

    def read_state(self, trainer, iteration: int, rel: str) -> Snapshot:
        from ..checkpoint import optimizer_state_in_order
        from ..lora import LoraWeights

        st = torch.load(os.path.join(trainer.out, rel), map_location="cpu", weights_only=True)
        names = [n for n, _ in trainer.lora.named_lora_parameters()]
        opt = st["optimizer"]
        if opt is not None:
            opt = optimizer_state_in_order(opt, st["param_names"], names)
        return Snapshot(iteration, LoraWeights(st["down"], st["up"], json.loads(st["alpha"])), opt, rel)

    def read_guard(self, trainer, kept: dict) -> Optional[StartGuard]:
        """The guard a checkpoint kept (:meth:`state_dict`), or None when its start cannot be read (then the
        state the run resumed with is the start, and a warning says so). An approved state that cannot be read is
        left out, with a warning."""
        saved = json.loads(kept["guard"])
        try:
            initial = self.read_state(trainer, *saved["initial"])
        except Exception as e:      # a deleted or damaged file
            self.say(trainer, f"the state this run started from could not be read ({saved['initial'][1]}: "
                              f"{type(e).__name__}): checks against the start now take back to iteration "
                              f"{trainer.iteration}'s LoRA, which the run resumed with, at most")
            return None
        approved = []
        for iteration, rel in saved["approved"]:
            try:
                approved.append(self.read_state(trainer, iteration, rel))
            except Exception as e:
                self.say(trainer, f"the state the artist approved at iteration {iteration} could not be read ({rel}: "
                                  f"{type(e).__name__}); a check lost goes back to an earlier one")
        self.records = list(saved["records"])
        self.g.set_state(kept["order"])
        self.named = {trainer.iteration: {s.file for s in [initial, *approved]}}
        return StartGuard(initial, approved=approved, just_restored=saved["just_restored"],
                          restores=saved["restores"])

    @staticmethod
    def say(trainer, msg: str) -> None:
        trainer.warnings.append(msg)
        logging.warning("TreeGRPO %s: %s", trainer.cfg.run_name, msg)

    def look(self, trainer, again: bool, fresh: int = 0) -> Optional[str]:
        """One question: the pictures now and the base model's (the second look: other noises; ``fresh`` > 0: the
        end's re-check of an approved state, noises of their own), the artist's verdict :data:`NOW`, :data:`START`
        or None."""
        c, cfg = self.config, trainer.cfg
        prompts = [trainer.prompts[i % len(trainer.prompts)] for i in range(c.pictures)]
        seed = 424_242 + c.seed + (7919 if again else 0) + 104_729 * fresh
        noise = torch.randn((c.pictures, *trainer.policy.latent_shape()), generator=torch.Generator().manual_seed(seed))
        now, start = check_pictures(trainer.policy, prompts, noise, cfg.tree.steps, cfg.guidance_scale,
                                    trainer.sigmas(), start=self.start_pictures.get((again, fresh)))
        self.start_pictures[(again, fresh)] = start
        now_first = bool(torch.rand((), generator=self.g) < 0.5)
        pick = self.ask(*((now, start) if now_first else (start, now)), prompts, trainer.iteration, again)
        if pick not in (0, 1, None, NO_ANSWER):
            raise ValueError(f"a check's answer is 0, 1, None or NO_ANSWER, got {pick!r}")
        return pick if pick in (None, NO_ANSWER) else (NOW if (pick == 0) == now_first else START)

    def __call__(self, trainer) -> Optional[dict]:
        """Run the check when due: the record (iteration, verdict, restored iteration or None), else None."""
        if self.guard is None:
            self.begin(trainer)
        if not self.due(trainer.iteration):
            return None
        looks = [self.look(trainer, again=False)]
        if looks[0] in (NOW, START) and self.config.confirm:
            looks.append(self.look(trainer, again=True))
        verdict = looks[0] if looks[0] in (NOW, START) and all(v == looks[0] for v in looks) else None
        back = self.guard.record(verdict, lambda: self.snapshot(trainer))
        rec = {"iteration": trainer.iteration, "verdict": verdict, "restored": None, "looks": looks}
        if back is not None:
            # the state taken back, for the end of the run when this is its last iteration (:meth:`finish`)
            self.reached = (trainer.iteration, copy.deepcopy(trainer.lora.weights()))
            self.restore(trainer, back)
            rec["restored"] = back.iteration
            msg = (f"the artist preferred the base model's pictures to iteration {trainer.iteration}'s: the LoRA goes "
                   f"back to " + ("where this run started" if back is self.guard.initial
                                  else f"iteration {back.iteration}'s, which the artist approved"))
            trainer.warnings.append(f"iteration {trainer.iteration}: {msg}")
            logging.warning("TreeGRPO %s: %s", trainer.cfg.run_name, msg)
        self.records.append(rec)
        return rec

    def restore(self, trainer, back: Snapshot) -> None:
        """Go back to ``back``: its LoRA and optimiser state; the evaluations of the states after it no longer
        count for the best LoRA (the artist preferred the start to where they led)."""
        self.restore_quietly(trainer, back)
        reject = getattr(trainer, "reject_evaluations_after", None)
        if reject is not None:
            reject(back.iteration)

    @staticmethod
    def restore_quietly(trainer, snap: Snapshot) -> None:
        """Load ``snap``'s LoRA and optimiser state, the evaluations left as they are (not a roll-back)."""
        trainer.lora.load(copy.deepcopy(snap.weights))
        if snap.optimizer is not None:
            trainer.optimizer.load_state_dict(copy.deepcopy(snap.optimizer))

    def approved_again(self, trainer, rec: dict) -> Snapshot:
        """The end's way back: the newest approved snapshot the artist prefers to the start once more, on two looks
        at fresh noises (each pair recorded in ``rec["rechecks"]`` as ``[iteration, looks]``), dropping those they do
        not; the start when none is left. Nobody answering keeps the snapshot (it was approved before)."""
        rec["rechecks"] = []
        while self.guard.approved:
            snap = self.guard.top()
            self.restore(trainer, snap)
            fresh = len(rec["rechecks"]) + 1
            looks = [self.look(trainer, again=False, fresh=fresh)]
            if looks[0] == NOW and self.config.confirm:
                looks.append(self.look(trainer, again=True, fresh=fresh))
            rec["rechecks"].append([snap.iteration, looks])
            if all(v == NOW for v in looks) or looks[-1] == NO_ANSWER:
                return snap
            self.guard.approved.pop()
        return self.guard.initial

    def keep_reached(self, trainer, taken_back: bool) -> Any:
        """``on_unapproved`` with the state the run reached (a check at this last iteration already took it back:
        the copy :meth:`__call__` kept, when this process made that check)."""
        if self.on_unapproved is None:
            return None
        if not taken_back:
            return self.on_unapproved(trainer)
        if self.reached is None or self.reached[0] != trainer.iteration:
            return None
        now = copy.deepcopy(trainer.lora.weights())
        trainer.lora.load(self.reached[1])
        try:
            return self.on_unapproved(trainer)
        finally:
            trainer.lora.load(now)

    def finish(self, trainer) -> Optional[dict]:
        """The end of a run (``config.final``; module docstring): the record of the final check (``final``: True),
        or None when checks are off or the end was checked already (a finished run queued again). A check at the
        last iteration that took the state reached back stands as the end's verdict; the state it went back to is
        then confirmed on fresh noises as any other (:meth:`approved_again`)."""
        if not (self.config.every and self.config.final):
            return None
        if self.guard is None:
            self.begin(trainer)
        last = self.records[-1] if self.records and self.records[-1]["iteration"] == trainer.iteration else None
        if last is not None and last.get("final"):
            return None                  # the end was checked: a finished run queued again ends as it ended
        taken_back = last is not None and last["restored"] is not None
        if last is not None:             # checked at this iteration: that verdict stands (a roll-back it made too)
            looks, kept = [], last["verdict"] == NOW
            unanswered = last["looks"][-1] == NO_ANSWER
        else:
            looks = [self.look(trainer, again=False)]
            if looks[0] == NOW and self.config.confirm:
                looks.append(self.look(trainer, again=True))
            kept = all(v == NOW for v in looks)
            unanswered = looks[-1] == NO_ANSWER
            if kept:
                self.guard.record(NOW, lambda: self.snapshot(trainer))
        said = looks[-1] if looks else (last["verdict"] if last is not None else None)
        rec = {"iteration": trainer.iteration, "verdict": NOW if kept else (START if said == START else None),
               "restored": None, "looks": looks, "final": True}
        if not kept and unanswered:      # the artist is away: nothing to take back for
            top = self.guard.top()
            msg = (f"nobody answered the check at the end of the run: it ends on iteration {trainer.iteration}'s LoRA, "
                   "which was not compared with the base model (" +
                   ("no state of this run was approved" if top is self.guard.initial
                    else f"the newest state the artist approved is iteration {top.iteration}'s") + ")")
            trainer.warnings.append(msg)
            logging.warning("TreeGRPO %s: %s", trainer.cfg.run_name, msg)
        elif not kept:
            kept_at = self.keep_reached(trainer, taken_back)
            reached = None if taken_back else self.snapshot(trainer)
            try:
                back = self.approved_again(trainer, rec)
            except BaseException:
                # stopped during the re-check (Cancel): the run's checkpoint keeps the state it reached, not the one
                # on show, and the run queued again makes its end's check again
                if reached is not None:
                    self.restore_quietly(trainer, reached)
                raise
            self.restore(trainer, back)
            rec["restored"] = back.iteration
            msg = (f"the artist did not prefer iteration {trainer.iteration}'s pictures to the base model's at the end: "
                   "the run ends on " + ("the base model (no state of this run was preferred to it)"
                                         if back is self.guard.initial
                                         else f"iteration {back.iteration}'s LoRA, which the artist approved"))
            if isinstance(kept_at, str):
                msg += f" (iteration {trainer.iteration}'s is kept in {kept_at})"
            trainer.warnings.append(msg)
            logging.warning("TreeGRPO %s: %s", trainer.cfg.run_name, msg)
        self.records.append(rec)
        if rec["restored"] is not None or (kept and looks):
            trainer.save_checkpoint()   # with this record: the run queued again ends as it ended, asking nothing
        return rec
