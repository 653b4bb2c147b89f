"""The step nodes' run: a named run shared between queued prompts (:class:`RunState`), whose iteration is the
Trainer's phases, one node each:

- :func:`sample_tree` — phase 1 (``Trainer.sample``) through ComfyUI's denoiser path (the TREE socket, a
  :class:`TreeResult`);
- :func:`backup_tree` — phase 3 (``Trainer.backup``) on rewards scored by the Reward Scorer nodes;
- :func:`train_step` — phase 4 (``Trainer.update`` + ``Trainer.record``), then checkpoint and LoRA file;
- :func:`monitor_tree` — the Run Monitor's hacking signals of each iteration's leaves.

A run checkpoints to ``<output>/treegrpo/<run_name>/`` in the Trainer's format. Imported only inside ComfyUI.
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .. import checkpoint as ckpt
from ..config import AdvantageConfig, LoraConfig, MemoryConfig, OptimConfig, TrainConfig, TreeConfig
from ..progress import iteration_line
from ..io import atomic_write
from ..run import build_trainer
from ..trainer import Trainer
from ..tree import TreeBatch
from . import model_chain, runtime
from .policy import ComfyPolicy


@dataclass
class TreeResult:
    """The TREE socket: sampled trees, the trainer that sampled them (a run's, or a throwaway one without a
    run), and (after backup) the advantage statistics."""

    batch: TreeBatch
    trainer: Trainer
    prompt: str
    run: Optional["RunState"] = None
    adv_stats: dict = field(default_factory=dict)
    iteration: int = 0                    # the run's iteration the trees were sampled at

    @property
    def policy(self) -> ComfyPolicy:
        return self.trainer.policy

    @property
    def leaf_latents(self) -> torch.Tensor:
        """Leaves in the model's raw latent space (what VAEDecode expects)."""
        return self.policy.patcher.model.process_latent_out(self.batch.leaves.float())


class RunState:
    """A named run of the step nodes: settings from the Trainer State node, and the run's Trainer, created when
    the first Tree Sampler attaches a model (resuming the run's checkpoint when one exists)."""

    _registry: dict[str, "RunState"] = {}

    def __init__(self, run_name: str, lora_cfg: LoraConfig, optim_cfg: OptimConfig, seed: int = 0,
                 gradient_checkpointing="auto"):
        self.run_name, self.folder = run_name, runtime.run_folder(run_name)
        self.lora_cfg, self.optim_cfg, self.seed = lora_cfg, optim_cfg, seed
        self.gradient_checkpointing = runtime.checkpointing_choice(gradient_checkpointing)
        self.trainer: Optional[Trainer] = None
        self.sampled_at: Optional[float] = None   # when this iteration's Tree Sampler started (time.monotonic)
        self.step_seconds: list[float] = []       # the last iterations' time, from their sampler to their update
        self.listed_lora_failed = False        # the LoRA folder refused a write (said once)
        self.monitor: list[dict] = _read_monitor(self.folder)   # the Run Monitor's records, one per iteration

    @classmethod
    def get(cls, run_name: str, lora_cfg: LoraConfig, optim_cfg: OptimConfig, seed: int = 0,
            gradient_checkpointing="auto") -> "RunState":
        """The live run of this name (optimiser settings updated), or a new one (resumed from disk when saved)."""
        st = cls._registry.get(run_name)
        if st is None or st.folder != runtime.run_folder(run_name) or st.lora_cfg != lora_cfg:
            st = cls(run_name, lora_cfg, optim_cfg, seed, gradient_checkpointing)
            cls._registry[run_name] = st
        st.optim_cfg, st.gradient_checkpointing = optim_cfg, runtime.checkpointing_choice(gradient_checkpointing)
        return st

    @classmethod
    def iteration_of(cls, run_name: str) -> int:
        """Iterations done by the live run of this name (-1 when there is none in this process)."""
        st = cls._registry.get(run_name)
        return st.iteration if st is not None else -1

    def end_iteration(self, window: int = 10) -> Optional[float]:
        """The iteration just updated ends now: the mean time (s) of the last ``window`` iterations, each from its
        Tree Sampler's start to its Trainer Step's end (the time between queues, a person's pause, left out)."""
        if self.sampled_at is not None:
            self.step_seconds = (self.step_seconds + [time.monotonic() - self.sampled_at])[-window:]
            self.sampled_at = None
        return sum(self.step_seconds) / len(self.step_seconds) if self.step_seconds else None

    @property
    def lora(self):
        return self.trainer.lora if self.trainer is not None else None

    @property
    def iteration(self) -> int:
        return self.trainer.iteration if self.trainer is not None else 0


def _step_config(run: Optional[RunState], prompt: str, tree_cfg: TreeConfig, seed: int, guidance: float,
                 trees: int) -> TrainConfig:
    """The TrainConfig the step nodes' phases run with: one prompt, ``trees`` trees per iteration."""
    kw = dict(backend="comfy", prompts=[prompt], guidance_scale=guidance, tree=tree_cfg, prompts_per_iter=trees,
              seed=seed, eval_every=0, checkpoint_every=1)
    if run is not None:
        kw.update(lora=run.lora_cfg, optim=run.optim_cfg, output_dir=run.folder, run_name=run.run_name,
                  memory=MemoryConfig(checkpointing=run.gradient_checkpointing))
    return TrainConfig(**kw)


def sample_tree(model, positive, negative, latent: dict, tree_cfg: TreeConfig, *, seed: int, cfg: float,
                scheduler: str, trees: int, prompt: str = "", run: Optional[RunState] = None) -> TreeResult:
    """Sample ``trees`` trees for one conditioning pair: the run's next iteration (``Trainer.sample``, with its
    current LoRA), or without a run the trees of iteration 0 of ``seed`` with an untrained LoRA."""
    if cfg > 1.0 and negative is None:
        raise ValueError("cfg > 1 needs a negative conditioning")
    text = prompt.strip() or "<prompt>"
    if run is not None:
        run.sampled_at = time.monotonic()
    tc = _step_config(run, text, tree_cfg, seed, cfg, trees)
    trainer = run.trainer if run is not None else None
    name = runtime.model_name(model)
    if trainer is not None and trainer.base_model_name != name:
        raise ValueError(f"run {run.run_name!r} trains a LoRA for {trainer.base_model_name}, but the sampler got "
                         f"{name}: use another run name for another base model")
    chain = model_chain.describe_or_none(model)
    if trainer is not None:
        for line in model_chain.check_same_model(trainer.model_chain, chain, run.run_name, STEP_HINT, steps=True):
            logging.warning(line)
        trainer.model_chain = chain
    with torch.inference_mode(False):
        policy = ComfyPolicy(model, [text], [(positive, negative)], runtime.latent_shape_of(latent, model),
                             lora=trainer.lora if trainer is not None else None,
                             lora_cfg=run.lora_cfg if run is not None else dataclasses.replace(tc.lora, targets=["auto"]),
                             scheduler=scheduler,
                             seed=run.seed if run is not None else seed,
                             gradient_checkpointing=run is not None and run.gradient_checkpointing == "on")
        policy.check_window(tc.tree)
        if trainer is None:
            trainer = build_trainer(tc, policy, progress=False, base_model_name=name)
            trainer.log = logging.info      # the console: "resumed from ...", the memory plan
            trainer.frontend = "steps"
            trainer.model_chain = chain
            if run is not None:
                check_continuable(run)
                model_chain.check_resumed(run.folder, run.run_name, chain, STEP_HINT, steps=True)
                trainer.begin(resume=True)
                run.trainer = trainer       # only a run that began: a refused one is refused again at the next queue
        else:
            trainer.rebind(tc, policy)
        # the memory plan: made once per run (on the device's memory, before its first tree), re-applied to each
        # new policy; without a GPU only the size guard runs
        if trainer.memory_plan is None:
            trainer.memory_budget = runtime.memory_budget(policy.device) or None
            import comfy.model_management
            trainer.plan_memory(check=comfy.model_management.throw_exception_if_processing_interrupted)
        else:
            trainer.apply_plan(trainer.memory_plan)
        trainer.step_callback = runtime.comfy_progress(tree_cfg.steps)
        batch = trainer.sample()
    batch.prompts = [prompt] * len(batch.prompts)
    return TreeResult(batch, trainer, prompt, run, iteration=trainer.iteration)


#: the ways on when a step run's model changed under it
STEP_HINT = "give the Trainer State another run_name (nothing of this run is changed)"


#: the settings of the step nodes' own runs (:func:`_step_config`): how a checkpoint written before checkpoints named
#: their front-end (``frontend``) tells a step run from another front-end's
STEP_RUN = {"eval_every": 0, "checkpoint_every": 1}


def made_by_steps(state: dict) -> bool:
    """Whether a checkpoint's run is the step nodes': its ``frontend``, or for an older checkpoint its settings."""
    import json

    if "frontend" in state:
        return state["frontend"] == "steps"
    saved = json.loads(state.get("config") or "{}")
    return all(saved.get(k, v) == v for k, v in STEP_RUN.items())


def check_continuable(run: RunState) -> None:
    """Before a step run resumes its newest checkpoint: refuse (``CheckpointError``, saying what to do) a folder
    another process trains in, a run the Train node or the command line made (its logs and checkpoints would mix
    with another training), and a run whose LoRA rank or alpha the Trainer State changed: the saved LoRA would be
    refused, or scaled by another alpha (a change of targets is refused by the checkpoint's parameter names). The
    step settings themselves (lr, KL, tree, prompt) may change between queues."""
    import json

    found = ckpt.checkpoint_paths(run.folder, run.run_name)
    if not found:
        return
    ckpt.check_not_in_use(run.folder)
    _, state = ckpt.read_latest_checkpoint(found, run.run_name, mmap=True)   # tensors left on disk: begin reads them
    if not made_by_steps(state):
        raise ckpt.CheckpointError(
            f"run {run.run_name!r} in {run.folder} was made by the Train node or the command line; the step nodes "
            "would mix another training into it. Continue it with the Train node, or give the Trainer State another "
            "run_name (nothing of that run is changed)")
    saved = json.loads(state.get("config") or "{}")
    lora, now = saved.get("lora") or {}, dataclasses.asdict(run.lora_cfg)
    changed = [f"{k} {lora[k]!r} -> {now[k]!r}" for k in ("rank", "alpha") if k in lora and lora[k] != now[k]]
    if changed:
        raise ckpt.CheckpointError(
            f"run {run.run_name!r} trained a LoRA with other settings ({'; '.join('lora_' + c for c in changed)}): "
            "set the Trainer State's LoRA settings back to continue it, or give it another run_name for a new run "
            f"(its files in {run.folder} stay as they are)")


def _read_monitor(folder: str) -> list[dict]:
    import json
    import os
    try:
        with open(os.path.join(folder, "monitor.json"), encoding="utf-8") as fh:
            return list(json.load(fh))
    except (OSError, ValueError, TypeError):
        return []


def monitor_tree(tree: TreeResult, images: torch.Tensor, rewards: dict, judge: Optional[dict] = None) -> list[dict]:
    """The Run Monitor: the hacking signals of this iteration's leaves (``images`` (n, 3, H, W), their
    ``rewards``, the held-out ``judge``'s scores), recorded in the run (``monitor.json`` in its folder) one record
    per iteration, with the warnings the history raises; returns the records (the first is the base model's)."""
    import os

    from ..advantages import weighted_raw
    from ..config import SignalsConfig
    from ..io import atomic_write_json
    from ..hacking import hacking_warnings, image_signals
    from ..video import leaf_frames

    run = tree.run
    if run is None:
        raise ValueError("the Run Monitor needs a tree sampled with a TreeGRPO Trainer State (the run it records)")
    images = leaf_frames(images, tree.batch.leaves, "the Run Monitor")   # videos: their first frames
    n = images.shape[0]
    raw = {k: torch.as_tensor(v, dtype=torch.float32).reshape(-1) for k, v in rewards["rewards"].items()}
    rec = {"iteration": tree.iteration, "eval_reward": float(weighted_raw(raw, rewards["weights"]).mean()),
           **image_signals(images, n // tree.batch.n_trees)}
    if judge is not None:
        rec["eval_judge"] = float(torch.as_tensor(judge["model"](images.float(), [tree.prompt] * n)).float().mean())
    run.monitor = [r for r in run.monitor if r["iteration"] < tree.iteration] + [rec]
    sc = SignalsConfig()
    found = hacking_warnings(run.monitor, judge_drop=sc.judge_drop, diversity_floor=sc.diversity_floor,
                             hf_ceiling=sc.hf_ceiling)
    if found:
        rec["warnings"] = found
    os.makedirs(run.folder, exist_ok=True)
    atomic_write_json(os.path.join(run.folder, "monitor.json"), run.monitor)
    return run.monitor


def backup_tree(tree: TreeResult, rewards: dict, adv_cfg: AdvantageConfig) -> TreeResult:
    """Leaf rewards (``{"rewards": {name: (n,)}, "weights": {name: w}}``) → advantages on every edge
    (``Trainer.backup`` on a copy of the tree, so the sampler's cached output stays as it was)."""
    new = dataclasses.replace(tree, batch=dataclasses.replace(tree.batch, stats=dict(tree.batch.stats)))
    exclude = rewards.get("exclude_trees")   # an artist's trees without preference: not trained on
    new.adv_stats = tree.trainer.backup(new.batch, dict(rewards["rewards"]), rewards["weights"], adv_cfg,
                                        exclude_trees=None if exclude is None else torch.as_tensor(exclude))
    return new


def listed_lora_path(run_name: str) -> str:
    """``models/loras/treegrpo/<run>/<run>.safetensors``: the step run's LoRA where LoraLoader lists it (the Train
    node's folder for a run of that name)."""
    import os

    from .watch import loras_folder
    return os.path.join(loras_folder(run_name), f"{run_name}.safetensors")


def train_step(tree: TreeResult, run: RunState) -> dict:
    """One GRPO update of the run's LoRA on the tree's edges (``Trainer.update`` + ``record``); saves the
    checkpoint, the logs and the LoRA file, in the run's folder and where LoraLoader lists it
    (:func:`listed_lora_path`). Returns the iteration's statistics."""
    if tree.batch.advantages is None:
        raise ValueError("this TREE has no advantages yet: connect it through the Advantage Backup node")
    if tree.run is not run or tree.trainer is not run.trainer:
        raise ValueError("the TREE was sampled without this trainer state: connect the same TreeGRPO Trainer "
                         "State to the Tree Sampler and to the Trainer Step")
    tr = run.trainer
    tr.step_callback = runtime.comfy_progress(1 + sum(x.shape[0] for x in tree.batch.latents[:-1]) // tr.cfg.optim.microbatch)
    with torch.inference_mode(False), torch.enable_grad():
        upd = tr.update(tree.batch)
    stats = tr.record(tree.batch, upd)
    tr.after_iteration(stats)
    saved = tr.save_lora()
    try:    # where LoraLoader lists it, replaced at each step: a copy of the bytes just written
        atomic_write(listed_lora_path(run.run_name), lambda tmp: shutil.copyfile(saved, tmp))
    except OSError as e:     # a read-only models folder: the run's own copy and checkpoint are written
        if not run.listed_lora_failed:
            logging.warning("TreeGRPO %s: could not write the LoRA to %s (%s); it is in %s", run.run_name,
                            listed_lora_path(run.run_name), e.strerror or e, tr.lora_path)
        run.listed_lora_failed = True
    logging.info(iteration_line(stats, None, run_name=run.run_name, s_per_it=run.end_iteration()))
    return stats
