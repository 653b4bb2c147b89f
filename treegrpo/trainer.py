"""The training loop: sample trees → decode → score → advantages → update → log → checkpoint.

Backend-free: it drives a :class:`~treegrpo.policy.Policy` and reward models. One iteration is four public
phases, which the CLI loop (:meth:`Trainer.train`), ComfyUI's Train node and its step nodes all run:

1. :meth:`Trainer.sample` — the iteration's prompts, initial noises and window; the trees (a ``TreeBatch``);
2. :meth:`Trainer.score` — leaves decoded and scored (the step nodes score with VAEDecode + Reward Scorer);
3. :meth:`Trainer.backup` — leaf rewards → edge advantages (the Advantage Backup node);
4. :meth:`Trainer.update` — the GRPO update of the LoRA; then :meth:`Trainer.record` logs the iteration and
   :meth:`Trainer.after_iteration` evaluates and checkpoints on schedule.

Around the loop, in their own modules: the evaluations (:mod:`treegrpo.evaluation`), the run's files — LoRAs,
checkpoints, logs (:mod:`treegrpo.run_files`) — and the memory plan (:mod:`treegrpo.planning`).

The prompts and noises of iteration ``i`` depend only on ``(seed, i)``, so methods compared with the same seed
see the same prompts and initial noises, and a resumed run continues exactly where it stopped.
"""
from __future__ import annotations

import logging
import math
import random
import time
from typing import Any, Callable, Optional, Sequence

import torch

from . import checkpoint as ckpt
from . import memory
from .advantages import backup_advantages, check_rewards
from .callbacks import TrainerCallback
from .config import DEFAULT_EVAL_PROMPTS, AdvantageConfig, TrainConfig, schedule_at
from .distributed import pool_over_ranks
from .evaluation import Evaluation, next_multiple
from .hacking import best_index
from .io import SaveError
from .lora import (PeftLoRA, check_base_model, check_finite, from_state_dict, match_modules, read_lora_file,
                   with_alpha)
from .planning import MemoryPlanning
from .policy import Policy
from .run_files import RunFiles
from .scores import LeafScores, ScoringContext
from .tree import TreeBatch, at_iteration, sample_trees, window_start_at
from .update import grpo_update, lr_factor, matching_update
from .video import score_over_frames


class TrainingInterrupted(RuntimeError):
    """Raised when the stop callback asks to stop; a checkpoint was written first."""


def iteration_generator(seed: int, iteration: int, salt: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + iteration * 7919 + salt) % (2**63 - 1))


def iteration_prompts(prompts: list[str], n: int, seed: int, iteration: int) -> list[int]:
    """Indices of the ``n`` prompts of an iteration (without replacement while n ≤ len(prompts))."""
    rng = random.Random(seed * 1_000_003 + iteration)
    if n <= len(prompts):
        return rng.sample(range(len(prompts)), n)
    return [rng.randrange(len(prompts)) for _ in range(n)]



#: iterations in a row without a tree to train (every one too flat) before the run says so
FLAT_STREAK = 5


class Trainer(Evaluation, RunFiles, MemoryPlanning):
    """TreeGRPO (or trajectory GRPO) LoRA training on one policy.

    ``rewards``: name → reward model (callable ``(images, prompts) -> (B,)``), or None when the leaves are scored
    outside the trainer (ComfyUI's step nodes pass the raw rewards to :meth:`backup`).
    ``callbacks``: the run's hooks (:class:`treegrpo.callbacks.TrainerCallback`: begin, step, stop, iteration end,
    evaluation, checkpoint). Shortcuts for the simplest ones: ``stop`` (a callable returning True to stop, checked
    at every step), ``step_callback`` (called after every denoiser/update step: the step nodes swap their progress
    bar here per phase), ``iteration_callback`` (called with each iteration's statistics, after the callbacks).
    ``dist``: optional data-parallel helper with ``rank``, ``world``, ``all_reduce_grads(params, n_edges) -> edges``
    (:class:`treegrpo.distributed.DataParallel`); only rank 0 evaluates and writes files."""

    def __init__(self, cfg: TrainConfig, policy: Policy, rewards: Optional[dict[str, Callable]] = None, *,
                 progress: bool = True, stop: Optional[Callable[[], bool]] = None,
                 step_callback: Optional[Callable[[], None]] = None, dist: Any = None, base_model_name: str = "",
                 iteration_callback: Optional[Callable[[dict], None]] = None,
                 judges: Optional[dict[str, Callable]] = None, callbacks: Sequence[TrainerCallback] = (),
                 leaf_scorer: Optional[Callable] = None):
        self.cfg, self.policy, self.rewards = cfg, policy, rewards
        #: the run's hooks (treegrpo.callbacks.TrainerCallback), called in order
        self.callbacks: list[TrainerCallback] = list(callbacks)
        # held-out judges: scored on the evaluation samples only, never trained on
        self.judges = dict(judges or {})
        self.judge_weights = {r.name: r.weight for r in cfg.eval_rewards if r.name in self.judges and r.weight > 0}
        self.warnings: list[str] = []
        self.keep_eval_images = False    # record_evaluation keeps its samples in last_eval_images
        self.last_eval_images: Optional[torch.Tensor] = None
        #: ``(ctx, batch, images, raw) -> LeafScores`` (treegrpo.scores): a person answering about some trees, or the
        #: taste model (the Train node's artist inputs, treegrpo/comfyui/artist/questions.py); None: the reward
        #: models alone
        self.leaf_scorer: Optional[Callable] = leaf_scorer
        if rewards is not None:
            missing = [r.name for r in cfg.rewards if r.weight > 0 and r.name not in rewards]   # weight 0: unused
            if missing:
                raise ValueError(f"no reward model given for {missing}")
        self.weights = {r.name: r.weight for r in cfg.rewards if r.weight > 0}
        self.set_prompts(cfg)
        self.progress, self.stop, self.step_callback, self.dist = progress, stop, step_callback, dist
        self.iteration_callback = iteration_callback
        self.rank = dist.rank if dist is not None else 0
        self.world = dist.world if dist is not None else 1
        if cfg.prompts_per_iter < self.world:
            raise ValueError(f"TrainConfig.prompts_per_iter: {cfg.prompts_per_iter} prompts per iteration cannot be "
                             f"split over {self.world} processes; use at least {self.world}")
        self.base_model_name = base_model_name or (cfg.model or cfg.backend)
        # the backend's own LoRA (ComfyUI), else PEFT layers injected into the policy's model
        self.lora = policy.lora if policy.lora is not None else PeftLoRA(policy.model, cfg.lora, seed=cfg.seed)
        self.params = list(self.lora.parameters())
        if cfg.lora.init_from:
            t, meta = read_lora_file(cfg.lora.init_from)
            check_finite(t, cfg.lora.init_from)
            check_base_model(meta, self.base_model_name, cfg.lora.init_from)
            # whatever key style the file has (ComfyUI's, diffusers', PEFT's): the names of this run's LoRA modules;
            # the file's update at this run's alpha (the one its files are described with)
            w = match_modules(from_state_dict(t, meta), list(self.lora.weights().down))
            self.lora.load(with_alpha(w, cfg.lora.alpha))
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        #: an optimiser step of an iteration that :meth:`record` has not closed has begun: the LoRA and the optimiser
        #: state belong to no iteration until it closes, or until :meth:`undo_update` puts back the copy of them taken
        #: before that step (on the CPU)
        self.mid_update = False
        self._before_update: Optional[tuple[list[torch.Tensor], list[dict]]] = None
        self.optimizer.register_step_pre_hook(lambda *_: self._keep_state_before_update())
        self.memory_plan: Optional[memory.Plan] = None
        self.memory_planned = False    # plan_memory ran to its end (a plan, or none is needed)
        self.memory_budget: Optional[float] = None   # bytes; None: cfg.memory.budget_gb, else the GPU's
        self.log: Callable[[str], None] = print
        self.iteration = 0
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.train_time = 0.0
        self.total_nfe = 0
        self.out = cfg.output_dir
        self._next_eval_t = math.inf
        #: the noise levels a resumed run was trained with, when they differ from this policy's own (a run moved
        #: between ComfyUI, whose scheduler sets them, and the CLI, whose backend does)
        self.kept_sigmas: Optional[torch.Tensor] = None
        #: an evaluation was due after the last finished iteration and has not been recorded (a stop cut it)
        self.eval_pending = False
        self.flat_streak = 0     # iterations in a row in which every tree was too flat to train (watch_flat)
        #: (iteration gone back to, where the best LoRA was moved): best LoRAs of states the artist rejected
        #: (:meth:`reject_evaluations_after`), for a copy of it elsewhere (the Train node's LoRA folder) to follow
        self.best_set_aside: list[tuple[int, str]] = []

    def rebind(self, cfg: TrainConfig, policy: Policy) -> None:
        """Continue this run with new settings and a new policy over the same LoRA (ComfyUI's step nodes build a
        policy per queued prompt: the model, conditioning or tree widgets may have changed)."""
        if policy.lora is not self.lora:
            raise ValueError("rebind: the new policy must carry this trainer's LoRA")
        self.cfg, self.policy = cfg, policy
        self.set_prompts(cfg)
        self.out = cfg.output_dir

    # ------------------------------------------------------------------ helpers
    def set_prompts(self, cfg: TrainConfig) -> None:
        """The training prompts and the evaluation's (``eval_prompts``, else the ``eval_heldout`` ones, else the
        first training prompts), from one read of the prompt list."""
        self.prompts, held = cfg.split_prompts()
        self.eval_prompts = list(cfg.eval_prompts) or held or self.prompts[:DEFAULT_EVAL_PROMPTS]

    def _set_lr(self) -> float:
        """Set this iteration's learning rate from the schedule (iterations done and, under a time budget,
        the training time used); returns it."""
        o, budget = self.cfg.optim, self.cfg.time_budget_s
        frac = self.train_time / budget if budget else 0.0
        lr = (o.lr * lr_factor(self.iteration, self.cfg.iterations, o.warmup, o.lr_schedule, frac)
              * schedule_at(o.lr_factor_schedule, self.iteration, 1.0))
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return lr

    def sigmas(self) -> torch.Tensor:
        """The run's noise levels at ``tree.steps``, (T+1,) float32 on the CPU: the schedule it was trained with
        (:attr:`kept_sigmas`, from its checkpoint) or, for a new run or another step count, the policy's."""
        kept = self.kept_sigmas
        if kept is not None and kept.numel() == self.cfg.tree.steps + 1:
            return kept
        return self.policy.sigmas(self.cfg.tree.steps).float().cpu()

    def _check_stop(self) -> None:
        if (self.stop is not None and self.stop()) or any(cb.should_stop(self) for cb in self.callbacks):
            raise TrainingInterrupted("training stopped by request")

    def interrupt_check(self) -> None:
        """The stop check of a step outside training (an evaluation's sampling): ComfyUI's interrupt (through
        ``step_callback``), a stop request, a callback's ``should_stop``; no progress hooks."""
        if self.step_callback:
            self.step_callback()
        self._check_stop()

    def _cb(self) -> None:
        if self.step_callback:
            self.step_callback()
        for cb in self.callbacks:
            cb.on_step(self)
        self._check_stop()

    def _keep_state_before_update(self) -> None:
        """Before an optimiser step: at the iteration's first, a CPU copy of the LoRA parameters and the optimiser
        state (a few times the LoRA's size), for :meth:`undo_update`."""
        if self.mid_update:
            return
        params = [p.detach().to("cpu", copy=True) for p in self.params]
        state = [{k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v)
                  for k, v in self.optimizer.state.get(p, {}).items()} for p in self.params]
        self._before_update = (params, state)
        self.mid_update = True

    def undo_update(self) -> bool:
        """Put the LoRA and the optimiser state back as they were before the unclosed iteration's first optimiser step
        (an update cut by Ctrl-C, Cancel, a non-finite gradient, running out of memory); returns whether anything was
        put back. A run stopped there is checkpointed at its last whole iteration and resumes bit for bit."""
        if not self.mid_update or self._before_update is None:
            self.mid_update = False
            return False
        params, state = self._before_update
        with torch.no_grad():
            for p, kept, st in zip(self.params, params, state):
                p.copy_(kept)
                if not st:
                    self.optimizer.state.pop(p, None)
                    continue
                now = self.optimizer.state[p]
                for k, v in st.items():
                    if torch.is_tensor(v) and torch.is_tensor(now.get(k)):
                        now[k].copy_(v)
                    else:
                        now[k] = v.clone() if torch.is_tensor(v) else v
        self.mid_update, self._before_update = False, None
        return True

    # ------------------------------------------------------------------ phase 1: sample
    def sample(self) -> TreeBatch:
        """The trees of iteration ``self.iteration``: its prompts (this rank's share), initial noises, window
        start and per-tree SDE noise, all from ``(seed, iteration)``. ``batch.stats['t_sample']`` is in s."""
        cfg, it = self.cfg, self.iteration
        t0 = time.perf_counter()
        idx = iteration_prompts(self.prompts, cfg.prompts_per_iter, cfg.seed, it)
        tree_prompts = [self.prompts[i] for i in idx for _ in range(cfg.trees_per_prompt)]
        tree_pids = torch.tensor([i for i in idx for _ in range(cfg.trees_per_prompt)])
        gen = iteration_generator(cfg.seed, it)
        noise = torch.randn((len(tree_prompts), *self.policy.latent_shape()), generator=gen)
        # data parallel: whole prompts go to ranks round-robin (per-prompt reward statistics stay local);
        # each tree's SDE noise comes from its own generator, so the split does not change any tree
        mine = [t for t in range(len(tree_prompts)) if (t // cfg.trees_per_prompt) % self.world == self.rank]
        tree_prompts = [tree_prompts[i] for i in mine]
        tree_pids, noise = tree_pids[mine], noise[mine]
        s = window_start_at(cfg.tree, it, random.Random(cfg.seed * 31 + it))
        sde_gen = [iteration_generator(cfg.seed, it, salt=1 + t) for t in mine]
        self.policy.model.eval()
        rows = cfg.memory.sample_batch or len(tree_prompts) * cfg.tree.leaves
        tree = at_iteration(cfg.tree, it)      # this iteration's tail (tree.tail_steps_schedule)
        batch = self.policy.run(lambda: sample_trees(
            self.policy, tree_prompts, tree, prompt_ids=tree_pids, window_start=s, guidance=cfg.guidance_scale,
            generator=sde_gen, noise=noise.to(self.policy.device), callback=self._cb, max_batch=rows,
            sigmas=self.sigmas()),
            max_batch=rows)
        batch.stats["t_sample"] = time.perf_counter() - t0
        return batch

    # ------------------------------------------------------------------ phase 2: score
    def score_images(self, images: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Raw reward per model, (B,) float32 each, for images (B, 3, H, W) or videos (B, F, 3, H, W) (the mean over
        each video's frames); bad values raise naming the model."""
        if not bool(torch.isfinite(images).all()):
            raise FloatingPointError(
                f"the decoded images of iteration {self.iteration + 1} hold NaN or infinite values: the sampling "
                "diverged before any reward saw them. Likely the LoRA's updates blew up (optim.lr too high) or the SDE "
                "noise is too strong (tree.noise_level); start again with a lower optim.lr, or resume an earlier "
                "checkpoint with --allow-changes and a lower --optim.lr")
        out = {}
        for name in self.weights:
            out[name] = score_over_frames(self.rewards[name], images, prompts)
        check_rewards(out, len(prompts), where=f" at iteration {self.iteration}")
        return out

    def scoring_context(self, batch: TreeBatch) -> ScoringContext:
        """What a leaf scorer is told about the run (:class:`treegrpo.scores.ScoringContext`)."""
        cfg = self.cfg
        return ScoringContext(iteration=self.iteration,
                              trees_before=self.iteration * cfg.prompts_per_iter * cfg.trees_per_prompt,
                              output_dir=cfg.output_dir, run_name=cfg.run_name, seed=cfg.seed, weights=self.weights,
                              score_images=self.score_images)

    def score(self, batch: TreeBatch) -> LeafScores:
        """Decode the leaves and score them: the reward models' raw rewards ``{name: (n_leaves,)}``, or what the leaf
        scorer makes of them (:class:`treegrpo.scores.LeafScores`)."""
        if self.rewards is None:
            raise ValueError("this trainer has no reward models: score the leaves outside and call backup()")
        t0 = time.perf_counter()
        with torch.no_grad():
            images = self.policy.decode(batch.leaves)
        t1 = time.perf_counter()
        raw = self.score_images(images, batch.leaf_prompts)
        if self.memory_plan is not None and self.memory_plan.workload.offload_rewards:
            self._offload_rewards()
        scores = LeafScores(raw)
        if self.leaf_scorer is not None:
            scores = self.leaf_scorer(self.scoring_context(batch), batch, images, raw)
            if not isinstance(scores, LeafScores):
                raise TypeError(f"a leaf scorer returns treegrpo.scores.LeafScores, got {type(scores).__name__}")
        if scores.stats:
            batch.stats["scorer"] = scores.stats
        batch.stats.update(t_decode=t1 - t0, t_reward=time.perf_counter() - t1)
        return scores

    # ------------------------------------------------------------------ phase 3: advantages
    def backup(self, batch: TreeBatch, raw: dict[str, torch.Tensor], weights: Optional[dict[str, float]] = None,
               adv_cfg: Optional[AdvantageConfig] = None, exclude_trees: Optional[torch.Tensor] = None) -> dict:
        """Leaf rewards → advantages on every window edge (in ``batch``); returns the reward statistics.
        ``weights`` / ``adv_cfg`` default to the config's; ``exclude_trees`` (n_trees,) bool: trees not trained on
        (an artist's "no preference")."""
        t0 = time.perf_counter()
        pool = getattr(self.dist, "sum_over_ranks", None) if self.world > 1 else None
        stats = backup_advantages(batch, raw, self.weights if weights is None else weights,
                                  adv_cfg or self.cfg.advantage, pool=pool, exclude_trees=exclude_trees)
        batch.stats["adv"] = stats
        batch.stats["t_assign"] = time.perf_counter() - t0
        return stats

    # ------------------------------------------------------------------ phase 4: update
    def update(self, batch: TreeBatch) -> dict:
        """The GRPO update of the LoRA on the batch's edges (this iteration's learning rate)."""
        if batch.advantages is None:
            raise ValueError("the trees have no advantages yet: run backup() (the Advantage Backup node) first")
        t0 = time.perf_counter()
        lr = self._set_lr()
        self.policy.model.train()
        kw = dict(guidance=self.cfg.guidance_scale, params=self.params, callback=self._cb,
                  all_reduce=getattr(self.dist, "all_reduce_grads", None))
        if self.cfg.optim.loss != "grpo":   # NFT / AWM: re-noised leaves, levels and noise from (seed, iteration)
            kw["generator"] = iteration_generator(self.cfg.seed, self.iteration, salt=1 + 10 ** 6 + self.rank)
        update = grpo_update if self.cfg.optim.loss == "grpo" else matching_update
        try:
            upd = self.policy.run(lambda: update(self.policy, batch, self.optimizer, self.cfg.optim, **kw),
                                  max_batch=self.cfg.optim.microbatch)
        except BaseException:   # cut after a step (Cancel, Ctrl-C, a NaN or OOM in a later pass): not half-applied
            if self.undo_update():
                self.log(f"TreeGRPO {self.cfg.run_name}: the update of iteration {self.iteration + 1} did not finish; "
                         f"the LoRA goes back to iteration {self.iteration}'s")
            raise
        finally:
            self.policy.model.eval()
        batch.stats["t_update"] = batch.stats.get("t_assign", 0.0) + time.perf_counter() - t0
        return dict(upd, lr=lr)

    def record(self, batch: TreeBatch, upd: dict) -> dict:
        """Close the iteration: its statistics (timings in s, NFE, reward, loss) into the history; returns them."""
        t = {k: batch.stats.get(k, 0.0) for k in ("t_sample", "t_decode", "t_reward", "t_update")}
        t_iter = sum(t.values())
        self.train_time += t_iter
        if hasattr(self.dist, "max_over_ranks"):  # one clock for all ranks: same lr, same stop iteration
            self.train_time = self.dist.max_over_ranks(self.train_time)
        upd = dict(upd)
        lr = upd.pop("lr")
        stats = {"iteration": self.iteration, "window_start": batch.window_start, **batch.stats.get("adv", {}),
                 **batch.stats.get("scorer", {}),
                 **upd, "nfe": batch.nfe, "calls": batch.calls, "lr": lr, **t, "t_iter": t_iter,
                 "train_time": self.train_time}
        if self.world > 1 and hasattr(self.dist, "sum_over_ranks"):
            pool_over_ranks(stats, batch.rewards, self.weights, self.dist)
        self.total_nfe += stats["nfe"]
        stats["total_nfe"] = self.total_nfe
        if not math.isfinite(stats["loss"]):
            self.undo_update()
            raise FloatingPointError(f"non-finite loss at iteration {self.iteration}")
        for w in stats.get("taste_warnings") or ():
            self.warnings.append(f"iteration {self.iteration}: {w}")
            logging.warning("TreeGRPO %s, iteration %d: %s", self.cfg.run_name, self.iteration, w)
        self.iteration += 1
        self.history.append(stats)
        self.mid_update, self._before_update = False, None
        self.watch_flat(stats)
        return stats

    def watch_flat(self, stats: dict) -> None:
        """Warn once per streak (rank 0) when :data:`FLAT_STREAK` iterations in a row trained nothing because every
        scored tree's leaves got the same reward (a reward with no signal on these samples: ``ocr`` before the model draws
        any text, a judge question it always answers alike)."""
        # no edge although trees were scored (not all left out by an artist's skip or by the taste model): the
        # scored trees were flat
        if stats.get("edges", 0) == 0 and stats.get("scored_trees", 0) and stats.get("flat_trees", 0):
            self.flat_streak += 1
        else:
            self.flat_streak = 0
        if self.flat_streak == FLAT_STREAK and self.rank == 0:
            msg = (f"iterations {self.iteration - FLAT_STREAK + 1}-{self.iteration} trained nothing: every tree's "
                   f"leaves scored alike (their reward spread under advantage.flat_floor {self.cfg.advantage.flat_floor}"
                   "), so the reward gives no signal on these samples yet (e.g. ocr reads no text in any leaf); start "
                   "from prompts or a model that already come close, or add a reward that tells the leaves apart")
            self.warnings.append(msg)
            logging.warning("TreeGRPO %s: %s", self.cfg.run_name, msg)

    def train_step(self) -> dict:
        """One iteration: sample → score → backup → update → record; returns its statistics."""
        batch = self.sample()
        scores = self.score(batch)
        self.backup(batch, scores.raw, scores.weights, exclude_trees=scores.exclude_trees)
        return self.record(batch, self.update(batch))

    # ------------------------------------------------------------------ the loop
    def after_iteration(self, stats: dict) -> None:
        """The callbacks, then the evaluation and the checkpoint when they are due."""
        cfg = self.cfg
        due_t = self.train_time >= self._next_eval_t
        if due_t:
            self._next_eval_t = next_multiple(self.train_time, cfg.eval_every_s)
        # an evaluation due here that a stop cuts (in the callbacks or in it) is made when the run resumes
        self.eval_pending = self.evaluating and bool(due_t or (cfg.eval_every and self.iteration % cfg.eval_every == 0))
        for cb in self.callbacks:
            cb.on_iteration_end(self, stats)
        if self.iteration_callback:
            self.iteration_callback(stats)
        if self.eval_pending:
            self.record_evaluation()
            self.eval_pending = False
        if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
            self.save_checkpoint()
            self.write_logs()

    def save_stopped(self) -> None:
        """The run's files when it stops early or fails: the checkpoint of its last whole iteration (an update it
        cut is undone first, :meth:`undo_update`) and the logs; nothing when it stops before its first iteration
        ends and nothing was saved (a checkpoint of no training would hold the folder and its settings)."""
        if self.undo_update():
            self.log(f"TreeGRPO {self.cfg.run_name}: stopped inside the update of iteration {self.iteration + 1}; "
                     f"the LoRA goes back to iteration {self.iteration}'s")
        if self.iteration == 0 and self.checkpointed_iteration is None:
            return   # no iteration finished and nothing saved yet: no run to resume (a rerun starts afresh)
        path = self.save_checkpoint()
        if path and self.iteration:
            self.log(f"TreeGRPO {self.cfg.run_name}: stopped after iteration {self.iteration}, saved in {path}; "
                     "the same run resumed goes on from there")
        self.write_logs()

    def train(self, iterations: Optional[int] = None, resume: bool = False,
              finish: Optional[Callable[[dict], None]] = None) -> dict:
        """Run until ``iterations`` (default ``cfg.iterations``) or the time budget; returns a summary.
        ``finish(summary)`` writes the run's last files while the run folder is still locked (the LoRA files).

        On interrupt or error a checkpoint of the last completed iteration is written before raising."""
        if self.memory_plan is None and not self.memory_planned:
            self.plan_memory()
        cfg = self.cfg
        total = iterations or cfg.iterations
        lock = self._lock_run_folder()
        try:
            summary = self._train(total, resume)
            if finish is not None:
                finish(summary)
            return summary
        finally:
            if lock is not None:
                lock.release()

    def _lock_run_folder(self) -> Optional[ckpt.RunLock]:
        """The first process's lock on the run folder (:class:`treegrpo.checkpoint.RunLock`); a folder in use stops
        every process (the others are told, not left waiting for it in the checkpoint's broadcast)."""
        lock, refused = None, None
        if self.rank == 0:
            try:
                lock = ckpt.RunLock(self.out)
            except ckpt.CheckpointError as e:
                refused = e
        if self.world > 1 and hasattr(self.dist, "broadcast_object"):
            said = self.dist.broadcast_object(None if self.rank else (str(refused) if refused else ""))
            if self.rank and said:
                raise ckpt.CheckpointError(said)
        if refused is not None:
            raise refused
        return lock

    def _train(self, total: int, resume: bool) -> dict:
        cfg = self.cfg
        self.begin(resume)
        if self.iteration >= total and self.rank == 0:
            self.log(f"TreeGRPO {cfg.run_name}: already at iteration {self.iteration} of {total}, nothing left to train "
                     "(raise iterations to train further); the end of the run is written again")
        for cb in self.callbacks:
            cb.on_train_begin(self)
        bar = None
        budget = cfg.time_budget_s
        if self.progress and self.rank == 0:
            from tqdm.auto import tqdm
            if budget:   # a run bounded by training time (the demo's baseline): the bar counts that time, in s
                bar = tqdm(total=round(budget, 1), initial=round(min(self.train_time, budget), 1),
                           desc=f"{cfg.tree.method} (time budget)", unit="s",
                           bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}"
                                      "{postfix}]")
            else:
                bar = tqdm(total=total, initial=self.iteration, desc=f"{cfg.tree.method}", unit="it")
        log = self.log
        if bar is not None and log is print:     # the run's lines above the bar, not glued to its end
            self.log = lambda msg: tqdm.write(str(msg))
        try:
            self.start_evaluations()
            while self.iteration < total:
                if budget and self.train_time >= budget:
                    break
                self._check_stop()
                stats = self.train_step()
                if bar:
                    bar.update((round(min(self.train_time, budget), 1) - bar.n) if budget else 1)
                    bar.set_postfix(**({"it": self.iteration} if budget else {}), reward=f"{stats['reward']:.3f}",
                                    loss=f"{stats['loss']:.2e}")
                self.after_iteration(stats)
            if bar:
                bar.close()
                bar = None
            # the end is checkpointed whatever checkpoint_every says, after the end's own evaluation when there is
            # one (a run queued again at its end then does not evaluate it again); an end callback that fails
            # before it is saved by save_stopped
            final_eval = self.evaluating and (not self.evals or self.evals[-1]["iteration"] != self.iteration)
            if not final_eval and self.iteration != self.checkpointed_iteration:
                self.save_checkpoint()
            for cb in self.callbacks:
                cb.on_train_end(self)
            if final_eval:
                self.record_evaluation()
                self.save_checkpoint()
        except BaseException as e:
            try:
                self.save_stopped()
            except SaveError:
                if not isinstance(e, SaveError):
                    raise
                # the disk that refused a file refuses the stop's checkpoint too: the first error says it
            raise
        finally:
            self.log = log
            if bar:
                bar.close()
        self.write_logs()
        best = best_index(self.evals)
        return {"iterations": self.iteration, "train_time": self.train_time, "total_nfe": self.total_nfe,
                "final_eval": self.evals[-1] if self.evals else None,
                "best_eval": self.evals[best] if best is not None else None, "warnings": list(self.warnings)}
