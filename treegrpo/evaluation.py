"""The run's evaluations: deterministic ODE samples on fixed (prompt, noise) pairs, scored by the training rewards
and the held-out judges, with the reward-hacking signals; the best LoRA kept. A mixin of
:class:`treegrpo.trainer.Trainer` (it reads the trainer's config, policy, rewards and history)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from .advantages import check_rewards, weighted_raw
from .hacking import best_index, hacking_checks, image_signals, warning_changes
from .tree import sample_ode, sample_ode_window_kl
from .video import first_frames, frame_strip, score_over_frames


def next_multiple(t: float, every: float) -> float:
    """The first multiple of ``every`` after ``t`` (seconds); ``inf`` when ``every`` is 0 (off)."""
    return (math.floor(t / every) + 1) * every if every else math.inf



class Evaluation:
    """Evaluation, hacking warnings and the best LoRA (``signals.keep_best``) for the Trainer."""

    @property
    def evaluating(self) -> bool:
        return bool(self.cfg.eval_every or self.cfg.eval_every_s) and self.rank == 0

    def start_evaluations(self) -> None:
        """The base model's evaluation (iteration 0), the one a stop cut before the checkpoint it resumes from
        (``eval_pending``), and the clock of the time-based evaluations."""
        if self.evaluating and ((self.iteration == 0 and not self.evals) or getattr(self, "eval_pending", False)):
            self.record_evaluation()
            if self.iteration:                   # the checkpoint it resumed from still says it is pending
                self.checkpointed_iteration = None
        self.eval_pending = False
        self._next_eval_t = next_multiple(self.train_time, self.cfg.eval_every_s)

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
        stop = self.interrupt_check       # a Cancel or Ctrl-C during a long evaluation stops it at the next step
        if self.cfg.signals.kl_estimate:
            x, kl = self.policy.run(lambda: sample_ode_window_kl(self.policy, all_p, noise, self.cfg.tree,
                                                                 self.cfg.guidance_scale, self.sigmas(),
                                                                 callback=stop),
                                    max_batch=len(all_p))
        else:
            x = self.policy.run(lambda: sample_ode(self.policy, all_p, noise, self.cfg.tree.steps,
                                                   self.cfg.guidance_scale, callback=stop, sigmas=self.sigmas()),
                                max_batch=len(all_p))
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
            out["images"] = frame_strip(images).cpu()     # videos: their scored frames side by side
        return out

    def record_evaluation(self) -> dict:
        """Evaluate, log, warn about reward hacking and keep the best LoRA (``signals.keep_best``); returns the
        record. The warnings of :func:`treegrpo.hacking.hacking_checks` go into every record that fails a check;
        the log and ``warnings`` get what :func:`treegrpo.hacking.warning_changes` says (a warning when its check
        starts failing, a line once it has passed for a while)."""
        rec = self.evaluate(return_images=self.keep_eval_images)
        self.last_eval_images = rec.pop("images", None)   # (B, 3, H, W) for an eval callback (videos: frame strips,
        #                                                   treegrpo.video.frame_strip); not in the logs
        self.evals.append(rec)
        sc = self.cfg.signals
        limits = dict(judge_drop=sc.judge_drop, diversity_floor=sc.diversity_floor, hf_ceiling=sc.hf_ceiling)
        found = hacking_checks(self.evals, **limits)
        if found:
            rec["warnings"] = list(found.values())
        started, ended = warning_changes(self.evals, **limits)
        for w in started:     # said when its check starts failing, not at each evaluation while it fails
            self.warnings.append(f"iteration {self.iteration}: {w}")
            self.log(f"TreeGRPO {self.cfg.run_name} warning (iteration {self.iteration}): {w}")
        for line in ended:
            self.log(f"TreeGRPO {self.cfg.run_name} (iteration {self.iteration}): {line}")
        if sc.keep_best and best_index(self.evals) == len(self.evals) - 1:
            self.save_best()
        for cb in self.callbacks:
            cb.on_evaluate(self, rec)
        return rec

    def reject_evaluations_after(self, iteration: int) -> Optional[str]:
        """A check against the start took the run back to the state of ``iteration`` (treegrpo/artist/start_check.py):
        the evaluations since were of states the artist did not prefer to the start. They are marked ``rejected``
        and no longer count for the best LoRA; a best LoRA written from one of them moves aside to
        ``<run>_best-not-preferred-<its iteration>.safetensors`` (returned); when the best evaluation left is of the
        state gone back to, the best LoRA is written from it (the LoRA now)."""
        rejected = [e for e in self.evals if e["iteration"] > iteration and not e.get("rejected")]
        for e in rejected:
            e["rejected"] = True
        if not rejected or not self.cfg.signals.keep_best or self.rank != 0:
            return None
        from .checkpoint import set_aside_best
        moved = set_aside_best(self.best_lora_path, after=iteration)
        if moved is not None:
            self.best_set_aside.append((iteration, moved))
            b = best_index(self.evals)
            if b is not None and self.evals[b]["iteration"] == iteration:
                self.save_best(self.evals[b])
        return moved

