"""The memory plan applied to a run: this rank's workload, the models measured at the run's size, the fastest
settings that fit the budget put into effect (:mod:`treegrpo.memory` holds the model of memory itself). A mixin of
:class:`treegrpo.trainer.Trainer`."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

from . import memory


class MemoryPlanning:
    """:meth:`plan_memory` before a run's first iteration; :meth:`apply_plan` for a plan made elsewhere."""

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

    def plan_memory(self, budget: Optional[float] = None, *, fake: bool = True,
                    check: Optional[Callable[[], None]] = None) -> Optional[memory.Plan]:
        """Measure the model, predict every phase's peak and apply the fastest settings that fit ``budget`` bytes
        (default: ``memory.budget_gb``, else the GPU's memory); logs one line. Raises
        :class:`treegrpo.memory.MemoryPlanError` before any work when nothing fits; None when there is no budget
        (the CPU) or the plan is off. ``check`` is called between the probe's measurements and raises to stop it
        (default: the run's stop request, :meth:`Trainer._check_stop`; ComfyUI passes its interrupt check)."""
        plan = self._plan_memory(budget, fake, check)
        self.memory_planned = True
        return plan

    def _plan_memory(self, budget: Optional[float], fake: bool,
                     check: Optional[Callable[[], None]]) -> Optional[memory.Plan]:
        mc = self.cfg.memory
        if mc.checkpointing != "auto":   # the user's choice holds with or without a plan
            self.policy.set_gradient_checkpointing(mc.checkpointing == "on")
        if mc.plan == "off":
            return None
        source = memory.BUDGET_SETTING if not (budget or self.memory_budget) and mc.budget_gb else ""
        budget = (budget or self.memory_budget or mc.budget_gb * memory.GB
                  or memory.accelerator_budget(self.policy.device))
        if not budget:   # the CPU: no measured plan, but a batch that cannot fit is refused before allocation
            latent = 4 * math.prod(self.policy.latent_shape())
            memory.size_guard(self.workload(), latent, memory.available_ram(),
                              trees_per_prompt=self.cfg.trees_per_prompt)
            return None
        fixed = mc.fixed()
        rewards = [self.rewards[n] for n in self.weights] if self.rewards else []
        wl = self.workload()
        fp = self._footprint(budget, rewards, wl, fake, check)
        p = memory.plan(fp, wl, budget, suggest=lambda short: memory.smallest_change(fp, wl, budget, fixed),
                        budget_source=source, **fixed)
        self.apply_plan(p)
        self.log("TreeGRPO memory: " + p.line())
        if getattr(self.policy, "checkpointing_refusal", ""):
            self.log("TreeGRPO memory: " + self.policy.checkpointing_refusal)
        return p

    def _footprint(self, budget: float, rewards: list, wl: memory.Workload, fake: bool,
                   check: Optional[Callable[[], None]]) -> memory.Footprint:
        """The models measured at this size: kept from an earlier run with the same facts
        (treegrpo/memory_cache.py, ``memory.reuse_probe``), else probed now (and kept)."""
        from . import memory_cache

        rows = memory.probe_rows(wl)
        kl = self.cfg.optim.kl_beta > 0
        facts = None
        if fake and self.cfg.memory.reuse_probe:
            facts = memory_cache.probe_facts(self.policy, self.prompts[0], self.cfg.guidance_scale, self.params,
                                             rewards=rewards, kl=kl, rows=rows)
            kept = memory_cache.load(facts, log=self.log)
            if kept is not None:
                self.log(f"TreeGRPO memory: planning for {memory.size_text(budget)} with the measurement of an earlier "
                         f"run of these models at this size ({kept[1]}; memory.reuse_probe false measures again)")
                return kept[0]
        self.log(f"TreeGRPO memory: measuring the models at this size to plan for {memory.size_text(budget)} "
                 "(shapes only: no memory used; up to a few minutes of CPU on the largest models)")
        fp = memory.probe_policy(self.policy, self.prompts[0], self.cfg.guidance_scale, self.params, rewards=rewards,
                                 fake=fake, kl=kl, check=check or self._check_stop, **rows)
        if facts is not None:
            memory_cache.store(facts, fp, log=self.log)
        return fp

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
