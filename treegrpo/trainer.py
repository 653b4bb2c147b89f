"""The training loop: sample trees → decode → score → advantages → update → log → checkpoint.

Backend-free: it drives a :class:`~treegrpo.policy.Policy` and reward models. One iteration is four public
phases, which the CLI loop (:meth:`Trainer.train`), ComfyUI's Train node and its step nodes all run:

1. :meth:`Trainer.sample` — the iteration's prompts, initial noises and window; the trees (a ``TreeBatch``);
2. :meth:`Trainer.score` — leaves decoded and scored (the step nodes score with VAEDecode + Reward Scorer);
3. :meth:`Trainer.backup` — leaf rewards → edge advantages (the Advantage Backup node);
4. :meth:`Trainer.update` — the GRPO update of the LoRA; then :meth:`Trainer.record` logs the iteration and
   :meth:`Trainer.after_iteration` evaluates and checkpoints on schedule.

The prompts and noises of iteration ``i`` depend only on ``(seed, i)``, so methods compared with the same seed
see the same prompts and initial noises, and a resumed run continues exactly where it stopped.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import random
import time
from typing import Any, Callable, Optional, Sequence

import torch

from . import checkpoint as ckpt
from .callbacks import TrainerCallback
from .advantages import backup_advantages, check_rewards, weighted_raw
from .config import AdvantageConfig, TrainConfig, schedule_at
from .io import atomic_write, atomic_write_json
from . import memory
from .lora import PeftLoRA, check_base_model, from_state_dict, read_lora_file, save_lora_file, to_peft
from .policy import Policy
from .scores import LeafScores, ScoringContext
from .hacking import best_index, hacking_warnings, image_signals
from .tree import TreeBatch, at_iteration, sample_ode, sample_ode_window_kl, sample_trees, window_start_at
from .update import grpo_update, lr_factor, matching_update
from .video import first_frames, score_over_frames


def _numpy_state() -> list:
    import numpy as np
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def _set_numpy_state(st: list) -> None:
    import numpy as np
    np.random.set_state((st[0], np.array(st[1], dtype=np.uint32), st[2], st[3], st[4]))


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


def _next_multiple(t: float, every: float) -> float:
    """The first multiple of ``every`` after ``t`` (seconds); ``inf`` when ``every`` is 0 (off)."""
    return (math.floor(t / every) + 1) * every if every else math.inf



class Trainer:
    """TreeGRPO (or trajectory GRPO) LoRA training on one policy.

    ``rewards``: name → reward model (callable ``(images, prompts) -> (B,)``), or None when the leaves are scored
    outside the trainer (ComfyUI's step nodes pass the raw rewards to :meth:`backup`).
    ``callbacks``: the run's hooks (:class:`treegrpo.callbacks.TrainerCallback`: begin, step, stop, iteration end,
    evaluation, checkpoint). Shortcuts for the simplest ones: ``stop`` (a callable returning True to stop, checked
    at every step), ``step_callback`` (called after every denoiser/update step: the step nodes swap their progress
    bar here per phase), ``iteration_callback`` (called with each iteration's statistics, after the callbacks).
    ``dist``: optional data-parallel helper with ``rank``, ``world``, ``all_reduce_grads(params, n_edges)``
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
        #: taste model (the Train node's artist inputs, treegrpo/comfyui/artist.py); None: the reward models alone
        self.leaf_scorer: Optional[Callable] = leaf_scorer
        if rewards is not None:
            missing = [r.name for r in cfg.rewards if r.name not in rewards]
            if missing:
                raise ValueError(f"no reward model given for {missing}")
        self.weights = {r.name: r.weight for r in cfg.rewards if r.weight > 0}
        self.prompts = cfg.load_prompts()
        self.eval_prompts = list(cfg.eval_prompts) or self.prompts
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
            check_base_model(meta, self.base_model_name, cfg.lora.init_from)
            self.lora.load(from_state_dict(t, meta))
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.memory_plan: Optional[memory.Plan] = None
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

    def rebind(self, cfg: TrainConfig, policy: Policy) -> None:
        """Continue this run with new settings and a new policy over the same LoRA (ComfyUI's step nodes build a
        policy per queued prompt: the model, conditioning or tree widgets may have changed)."""
        if policy.lora is not self.lora:
            raise ValueError("rebind: the new policy must carry this trainer's LoRA")
        self.cfg, self.policy = cfg, policy
        self.prompts = cfg.load_prompts()
        self.eval_prompts = list(cfg.eval_prompts) or self.prompts
        self.out = cfg.output_dir

    # ------------------------------------------------------------------ helpers
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

    def _cb(self) -> None:
        if self.step_callback:
            self.step_callback()
        for cb in self.callbacks:
            cb.on_step(self)
        self._check_stop()

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
            self.policy, tree_prompts, tree, prompt_ids=tree_pids, window_start=s, guidance=cfg.cfg,
            generator=sde_gen, noise=noise.to(self.policy.device), callback=self._cb, max_batch=rows,
            sigmas=self.sigmas()),
            max_batch=rows)
        batch.stats["t_sample"] = time.perf_counter() - t0
        return batch

    # ------------------------------------------------------------------ phase 2: score
    def score_images(self, images: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Raw reward per model, (B,) float32 each, for images (B, 3, H, W) or videos (B, F, 3, H, W) (the mean over
        each video's frames); bad values raise naming the model."""
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
        kw = dict(guidance=self.cfg.cfg, params=self.params, callback=self._cb,
                  all_reduce=getattr(self.dist, "all_reduce_grads", None))
        if self.cfg.optim.loss != "grpo":   # NFT / AWM: re-noised leaves, levels and noise from (seed, iteration)
            kw["generator"] = iteration_generator(self.cfg.seed, self.iteration, salt=1 + 10 ** 6 + self.rank)
        update = grpo_update if self.cfg.optim.loss == "grpo" else matching_update
        try:
            upd = self.policy.run(lambda: update(self.policy, batch, self.optimizer, self.cfg.optim, **kw),
                                  max_batch=self.cfg.optim.microbatch)
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
        self._pool_over_ranks(stats, batch.rewards)
        self.total_nfe += stats["nfe"]
        stats["total_nfe"] = self.total_nfe
        if not math.isfinite(stats["loss"]):
            raise FloatingPointError(f"non-finite loss at iteration {self.iteration}")
        for w in stats.get("taste_warnings") or ():
            self.warnings.append(f"iteration {self.iteration}: {w}")
            logging.warning("TreeGRPO %s, iteration %d: %s", self.cfg.run_name, self.iteration, w)
        self.iteration += 1
        self.history.append(stats)
        return stats

    def train_step(self) -> dict:
        """One iteration: sample → score → backup → update → record; returns its statistics."""
        batch = self.sample()
        scores = self.score(batch)
        self.backup(batch, scores.raw, scores.weights, exclude_trees=scores.exclude_trees)
        return self.record(batch, self.update(batch))

    _SUMMED = ("flat_trees", "nfe", "edges", "parents", "forwards", "ref_forwards")
    _PER_EDGE = ("loss", "kl", "ratio_mean", "clip_frac")

    def _pool_over_ranks(self, stats: dict, raw: dict[str, torch.Tensor]) -> None:
        """Data parallel: replace the rank-local batch statistics in ``stats`` by the whole batch's (every
        rank's trees): reward mean/std over all leaves, counts summed, per-edge means weighted by edges.
        Timings stay this rank's; ``grad_norm`` is already global (taken after the all-reduce)."""
        if self.world == 1 or not hasattr(self.dist, "sum_over_ranks"):
            return
        names = sorted(raw)
        total = weighted_raw(raw, self.weights).double()
        e = float(stats["edges"])
        vec = [total.numel(), float(total.sum()), float((total ** 2).sum())]
        vec += [float(raw[k].double().sum()) for k in names]
        vec += [float(stats.get(k, 0)) for k in self._SUMMED] + [float(stats.get(k, 0)) * e for k in self._PER_EDGE]
        out = self.dist.sum_over_ranks(torch.tensor(vec, dtype=torch.float64)).tolist()
        n, s1, s2 = out[:3]
        stats["reward"] = s1 / n
        stats["reward_std"] = math.sqrt(max(s2 / n - (s1 / n) ** 2, 0.0))
        for k, v in zip(names, out[3:3 + len(names)]):
            stats[f"reward/{k}"] = v / n
        rest = out[3 + len(names):]
        for k, v in zip(self._SUMMED, rest):
            stats[k] = int(round(v))
        edges = stats["edges"]
        for k, v in zip(self._PER_EDGE, rest[len(self._SUMMED):]):
            stats[k] = v / edges if edges else stats[k]

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, prompts: Optional[list[str]] = None, seeds: Optional[int] = None,
                 return_images: bool = False) -> dict:
        """Deterministic ODE samples on fixed (prompt, noise) pairs, scored by the training rewards and the held-out
        judges, with the reward-hacking signals (``treegrpo.hacking``: diversity, high-frequency energy,
        saturation, near-black / near-white share) and the window KL to the base model. Not training time."""
        prompts = prompts or self.eval_prompts
        seeds = seeds or self.cfg.eval_seeds
        was_training = self.policy.model.training
        self.policy.model.eval()
        all_p = [p for p in prompts for _ in range(seeds)]
        gen = torch.Generator().manual_seed(987654321)
        noise = torch.randn((len(all_p), *self.policy.latent_shape()), generator=gen)
        kl = None
        if self.cfg.signals.kl_estimate:
            x, kl = self.policy.run(lambda: sample_ode_window_kl(self.policy, all_p, noise, self.cfg.tree,
                                                                 self.cfg.cfg, self.sigmas()), max_batch=len(all_p))
        else:
            x = self.policy.run(lambda: sample_ode(self.policy, all_p, noise, self.cfg.tree.steps, self.cfg.cfg,
                                                   sigmas=self.sigmas()), max_batch=len(all_p))
        images = self.policy.decode(x)
        raw = self.score_images(images, all_p)
        total = weighted_raw(raw, self.weights)
        self.policy.model.train(was_training)
        out = {"iteration": self.iteration, "train_time": self.train_time, "total_nfe": self.total_nfe,
               "eval_reward": float(total.mean()), **image_signals(first_frames(images), seeds),
               **{f"eval/{k}": float(v.mean()) for k, v in raw.items()}}
        if self.judge_weights:
            judged = {n: score_over_frames(self.judges[n], images, all_p) for n in self.judge_weights}
            check_rewards(judged, len(all_p), where=" (held-out judge)")
            out["eval_judge"] = float(weighted_raw(judged, self.judge_weights).mean())
            out.update({f"judge/{k}": float(v.mean()) for k, v in judged.items()})
        if kl is not None:
            out["eval_kl"] = float(kl.mean())
        if return_images:
            out["images"] = first_frames(images).cpu()
        return out

    def record_evaluation(self) -> dict:
        """Evaluate, log, warn about reward hacking (:func:`treegrpo.hacking.hacking_warnings`) and keep the best
        LoRA (``signals.keep_best``); returns the record."""
        rec = self.evaluate(return_images=self.keep_eval_images)
        self.last_eval_images = rec.pop("images", None)   # (B, 3, H, W) for an eval callback; not in the logs
        self.evals.append(rec)
        sc = self.cfg.signals
        found = hacking_warnings(self.evals, judge_drop=sc.judge_drop, diversity_floor=sc.diversity_floor,
                                 hf_ceiling=sc.hf_ceiling)
        if found:
            rec["warnings"] = found
            for w in found:
                self.warnings.append(f"iteration {self.iteration}: {w}")
                self.log(f"TreeGRPO warning (iteration {self.iteration}): {w}")
        if sc.keep_best and best_index(self.evals) == len(self.evals) - 1:
            self.save_best()
        for cb in self.callbacks:
            cb.on_evaluate(self, rec)
        return rec

    @property
    def best_lora_path(self) -> str:
        return os.path.join(self.out, f"{self.cfg.run_name}_best.safetensors")

    def save_best(self) -> Optional[str]:
        """Write the current LoRA as the run's best (atomically), with the evaluation that chose it."""
        if self.rank != 0:
            return None
        rec = self.evals[-1]
        key = "eval_judge" if rec.get("eval_judge") is not None else "eval_reward"
        meta = dict(self.metadata(), **{"treegrpo.best_iteration": str(self.iteration), "treegrpo.best_metric": key,
                                        "treegrpo.best_score": f"{rec[key]:.6f}"})
        return save_lora_file(self.best_lora_path, self.lora_tensors("comfy"), meta)

    # ------------------------------------------------------------------ files
    def lora_weights(self):
        return self.lora.weights()

    def lora_tensors(self, fmt: str = "comfy") -> dict:
        w = self.lora_weights()
        return self.policy.comfy_lora_state_dict(w) if fmt == "comfy" else to_peft(w)

    def metadata(self) -> dict:
        tree = dict(self.cfg.tree.__dict__)
        for key in ("branch_schedule", "tail_steps_schedule"):   # a tree without them is described as before the
            if not tree[key]:                                      # fields existed
                del tree[key]
        return {"treegrpo.method": self.cfg.tree.method, "treegrpo.tree_config": tree,
                "treegrpo.step": str(self.iteration), "treegrpo.base_model": self.base_model_name,
                "treegrpo.run_name": self.cfg.run_name, "treegrpo.lora_alpha": str(self.cfg.lora.alpha),
                "treegrpo.lora_rank": str(self.cfg.lora.rank), "treegrpo.backend": self.cfg.backend}

    @property
    def lora_path(self) -> str:
        return os.path.join(self.out, f"{self.cfg.run_name}.safetensors")

    def save_lora(self, path: Optional[str] = None, fmt: str = "comfy") -> str:
        path = path or self.lora_path
        if self.rank != 0:
            return path
        return save_lora_file(path, self.lora_tensors(fmt), self.metadata())

    def checkpoint_state(self) -> dict:
        named = self.lora.named_lora_parameters()
        return {"base_model": self.base_model_name,
                "lora": {n: p.detach().cpu().clone() for n, p in named}, "param_names": [n for n, _ in named],
                "optimizer": self.optimizer.state_dict(), "history": json.dumps(self.history),
                "evals": json.dumps(self.evals), "train_time": self.train_time, "total_nfe": self.total_nfe,
                "config": json.dumps(self.cfg.to_dict(), default=str), "sigmas": self.sigmas(),
                "torch_rng": torch.get_rng_state(), "python_rng": json.dumps(random.getstate()),
                "numpy_rng": json.dumps(_numpy_state())}

    def save_checkpoint(self) -> Optional[str]:
        """Write ``checkpoints/<run>-<iteration>.pt`` (see :mod:`treegrpo.checkpoint`)."""
        if self.rank != 0:
            return None
        path = ckpt.write_checkpoint(self.out, self.cfg.run_name, self.iteration, self.checkpoint_state(),
                                     self.cfg.keep_checkpoints)
        for cb in self.callbacks:
            cb.on_checkpoint(self, path)
        return path

    def latest_checkpoint(self) -> Optional[str]:
        found = ckpt.checkpoint_paths(self.out, self.cfg.run_name)
        return found[-1] if found else None

    def load_checkpoint(self, path: str, state: Optional[dict] = None) -> None:
        state = state if state is not None else ckpt.read_checkpoint(path, self.cfg.run_name)
        named = self.lora.named_lora_parameters()
        names = [n for n, _ in named]
        opt = ckpt.optimizer_state_in_order(state["optimizer"], state["param_names"], names)
        with torch.no_grad():
            for n, p in named:
                if state["lora"][n].shape != p.shape:
                    raise ckpt.CheckpointError(f"checkpoint {path} does not fit the model: LoRA parameter {n} is "
                                               f"{tuple(state['lora'][n].shape)}, the model's {tuple(p.shape)} "
                                               "(another LoRA rank?)")
                p.copy_(state["lora"][n])
        with torch.inference_mode(False):
            self.optimizer.load_state_dict(opt)  # the lr is re-set from (iteration, train_time)
        self.iteration = int(state["iteration"])
        self.history = json.loads(state["history"])
        self.evals = json.loads(state["evals"])
        self.train_time = float(state["train_time"])
        self.total_nfe = int(state["total_nfe"])
        self._keep_schedule(state.get("sigmas"), json.loads(state.get("config", "{}")).get("backend", self.cfg.backend))
        torch.set_rng_state(state["torch_rng"])
        st = json.loads(state["python_rng"])
        random.setstate((st[0], tuple(st[1]), st[2]))
        _set_numpy_state(json.loads(state["numpy_rng"]))

    def _keep_schedule(self, saved: Optional[torch.Tensor], saved_backend: str) -> None:
        """A run moved to another front-end (the checkpoint's backend is not this one's) continues on the noise levels
        it was trained with, when this policy's own differ at the same step count: ComfyUI's schedulers and the CLI's
        backends space them differently, and the moved run must compute what it would have computed where it
        started. On the same front-end the policy's own apply (a new scheduler or shift is the user's choice), as
        they do for another step count or a checkpoint without a schedule (older versions)."""
        self.kept_sigmas = None
        if saved is None or saved_backend == self.cfg.backend:
            return
        own = self.policy.sigmas(self.cfg.tree.steps).float().cpu()
        if saved.numel() != own.numel() or torch.equal(saved.float(), own):
            return
        self.kept_sigmas = saved.float().cpu()
        self.log(f"run {self.cfg.run_name!r} was trained on the {saved_backend!r} backend and continues on its noise "
                 f"levels (from its checkpoint; this model's own schedule differs by up to "
                 f"{float((own - self.kept_sigmas).abs().max()):.4g})")

    def begin(self, resume: bool) -> None:
        """Claim the output folder; resume the run's latest checkpoint (``resume``) or move an earlier run's files
        aside (``checkpoint.archive_run``)."""
        if self.rank != 0:
            return
        ckpt.claim_output_dir(self.out, self.cfg.run_name, self.base_model_name)
        if resume:
            found = ckpt.checkpoint_paths(self.out, self.cfg.run_name)
            if found:   # the newest readable one: a damaged latest falls back to the one before
                self.load_checkpoint(*ckpt.read_latest_checkpoint(found, self.cfg.run_name))
        else:
            moved = ckpt.archive_run(self.out, self.cfg.run_name)
            if moved:
                self.log(f"an earlier run {self.cfg.run_name!r} was moved to {moved}")

    def write_logs(self) -> None:
        """``log.csv`` (one row per iteration) and ``log.json`` (training and evaluation records)."""
        if self.rank != 0 or not self.history:
            return
        os.makedirs(self.out, exist_ok=True)
        keys = sorted({k for h in self.history for k in h})

        def w(tmp):
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                wr = csv.DictWriter(fh, fieldnames=keys)
                wr.writeheader()
                wr.writerows(self.history)
        atomic_write(os.path.join(self.out, "log.csv"), w)
        atomic_write_json(os.path.join(self.out, "log.json"), {"train": self.history, "eval": self.evals})

    # ------------------------------------------------------------------ the loop
    @property
    def evaluating(self) -> bool:
        return bool(self.cfg.eval_every or self.cfg.eval_every_s) and self.rank == 0

    def start_evaluations(self) -> None:
        """The base model's evaluation (iteration 0) and the clock of the time-based evaluations."""
        if self.evaluating and self.iteration == 0 and not self.evals:
            self.record_evaluation()
        self._next_eval_t = _next_multiple(self.train_time, self.cfg.eval_every_s)

    def after_iteration(self, stats: dict) -> None:
        """The callbacks, then the evaluation and the checkpoint when they are due."""
        cfg = self.cfg
        for cb in self.callbacks:
            cb.on_iteration_end(self, stats)
        if self.iteration_callback:
            self.iteration_callback(stats)
        due_t = self.train_time >= self._next_eval_t
        if due_t:
            self._next_eval_t = _next_multiple(self.train_time, cfg.eval_every_s)
        if self.evaluating and (due_t or (cfg.eval_every and self.iteration % cfg.eval_every == 0)):
            self.record_evaluation()
        if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
            self.save_checkpoint()
            self.write_logs()

    # ------------------------------------------------------------------ memory
    def _offload_rewards(self) -> None:
        for name in self.weights:
            off = getattr(self.rewards[name], "offload", None)
            if off is not None:
                off()

    def workload(self) -> memory.Workload:
        """This rank's share of one iteration, as the memory model sees it."""
        cfg = self.cfg
        trees = cfg.prompts_per_iter * cfg.trees_per_prompt
        trees = -(-trees // self.world)
        batches = [getattr(self.rewards[n], "batch_size", 0) for n in self.weights] if self.rewards else [0]
        return memory.Workload(trees=trees, branching=tuple(cfg.tree.branching), sample_batch=cfg.memory.sample_batch,
                               microbatch=cfg.optim.microbatch, decode_batch=self.policy.decode_batch,
                               reward_batch=0 if 0 in batches else max(batches))

    def plan_memory(self, budget: Optional[float] = None, *, fake: bool = True) -> Optional[memory.Plan]:
        """Measure the model, predict every phase's peak and apply the fastest settings that fit ``budget`` bytes
        (default: ``memory.budget_gb``, else the GPU's memory); logs one line. Raises
        :class:`treegrpo.memory.MemoryPlanError` before any work when nothing fits; None when there is no budget
        (the CPU) or the plan is off."""
        mc = self.cfg.memory
        if mc.checkpointing != "auto":   # the user's choice holds with or without a plan
            self.policy.set_gradient_checkpointing(mc.checkpointing == "on")
        if mc.plan == "off":
            return None
        source = memory.BUDGET_SETTING if not (budget or self.memory_budget) and mc.budget_gb else ""
        budget = budget or self.memory_budget or mc.budget_gb * memory.GB or memory.accelerator_budget(self.policy.device)
        if not budget:   # the CPU: no measured plan, but a batch that cannot fit is refused before allocation
            latent = 4 * math.prod(self.policy.latent_shape())
            memory.size_guard(self.workload(), latent, memory.available_ram(),
                              trees_per_prompt=self.cfg.trees_per_prompt)
            return None
        fixed = mc.fixed()
        rewards = [self.rewards[n] for n in self.weights] if self.rewards else []
        wl = self.workload()
        self.log(f"TreeGRPO memory: measuring the models at this size to plan for {memory.size_text(budget)} "
                 "(shapes only: no memory used; up to a few minutes of CPU on the largest models)")
        fp = memory.probe_policy(self.policy, self.prompts[0], self.cfg.cfg, self.params, rewards=rewards, fake=fake,
                                 kl=self.cfg.optim.kl_beta > 0, **memory.probe_rows(wl))
        p = memory.plan(fp, wl, budget, suggest=lambda short: memory.smallest_change(fp, wl, budget, fixed),
                        budget_source=source, **fixed)
        self.apply_plan(p)
        self.log("TreeGRPO memory: " + p.line())
        if getattr(self.policy, "checkpointing_refusal", ""):
            self.log("TreeGRPO memory: " + self.policy.checkpointing_refusal)
        return p

    def apply_plan(self, p: memory.Plan) -> None:
        """Put the plan's choices into effect: the policy's checkpointing and decode, the config's microbatch and
        sampling batch, the reward models' batch size and place."""
        wl, cfg = p.workload, self.cfg
        self.policy.set_gradient_checkpointing(wl.checkpointing)
        self.policy.set_tiled_decode(wl.tiled_decode)
        self.cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, microbatch=wl.microbatch),
                                       memory=dataclasses.replace(cfg.memory, sample_batch=wl.sample_batch))
        self.memory_plan = p
        if wl.decode_batch > 1:
            self.policy.decode_batch = wl.decode_batch
        for name in self.weights if self.rewards else ():
            if wl.reward_batch and hasattr(self.rewards[name], "batch_size"):
                self.rewards[name].batch_size = wl.reward_batch
        if wl.offload_rewards:
            self._offload_rewards()

    def train(self, iterations: Optional[int] = None, resume: bool = False) -> dict:
        """Run until ``iterations`` (default ``cfg.iterations``) or the time budget; returns a summary.

        On interrupt or error a checkpoint of the last completed iteration is written before raising."""
        if self.memory_plan is None:
            self.plan_memory()
        cfg = self.cfg
        total = iterations or cfg.iterations
        lock = ckpt.RunLock(self.out) if self.rank == 0 else None
        try:
            return self._train(total, resume)
        finally:
            if lock is not None:
                lock.release()

    def _train(self, total: int, resume: bool) -> dict:
        cfg = self.cfg
        self.begin(resume)
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
        except BaseException:
            self.save_checkpoint()
            self.write_logs()
            raise
        finally:
            if bar:
                bar.close()
        for cb in self.callbacks:
            cb.on_train_end(self)
        if self.evaluating and (not self.evals or self.evals[-1]["iteration"] != self.iteration):
            self.record_evaluation()
        self.write_logs()
        best = best_index(self.evals)
        return {"iterations": self.iteration, "train_time": self.train_time, "total_nfe": self.total_nfe,
                "final_eval": self.evals[-1] if self.evals else None,
                "best_eval": self.evals[best] if best is not None else None, "warnings": list(self.warnings)}
