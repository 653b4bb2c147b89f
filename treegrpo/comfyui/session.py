"""What training inside ComfyUI adds to :class:`treegrpo.trainer.Trainer`: model management, ComfyUI's progress
bar and interrupt, and runs that outlive one queued prompt. The iteration itself is the Trainer's phases:

- :class:`RunState` — a named run (one Trainer: LoRA, optimiser, iteration, history) that the step nodes share
  between queued prompts; it checkpoints to ``<output>/treegrpo/<run_name>/`` in the Trainer's format.
- :func:`sample_tree` — phase 1 (``Trainer.sample``) through ComfyUI's denoiser path (the TREE socket).
- :func:`backup_tree` — phase 3 (``Trainer.backup``) on rewards scored by the Reward Scorer nodes.
- :func:`train_step` — phase 4 (``Trainer.update`` + ``Trainer.record``), then checkpoint and LoRA file.
- :func:`train_full` — the Train node: ``Trainer.train`` on a ComfyUI model.

Imported only inside ComfyUI (it imports ``comfy`` lazily).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .. import checkpoint as ckpt
from ..config import AdvantageConfig, LoraConfig, MemoryConfig, OptimConfig, TrainConfig, TreeConfig, check_run_name
from ..prompts import reward_text
from ..trainer import Trainer
from ..tree import TreeBatch
from .policy import ComfyPolicy


class ComfyProgress:
    """ComfyUI's ProgressBar for a node: ``step()`` advances it and raises on user interrupt (a step callback);
    ``preview(image)`` shows an IMAGE (1, H, W, 3) on the node while it runs (the web UI's progress preview)."""

    def __init__(self, total: int):
        import comfy.utils
        self.bar = comfy.utils.ProgressBar(max(1, total))

    def __call__(self) -> None:
        import comfy.model_management
        self.bar.update(1)
        comfy.model_management.throw_exception_if_processing_interrupted()

    step = __call__

    def preview(self, image: torch.Tensor, max_size: int = 768) -> None:
        from ..report import to_pil
        self.bar.update_absolute(self.bar.current, preview=("JPEG", to_pil(image[0].movedim(-1, 0)), max_size))


def comfy_progress(total: int) -> ComfyProgress:
    """A step callback: advances ComfyUI's ProgressBar and raises on user interrupt."""
    return ComfyProgress(total)


def run_folder(run_name: str) -> str:
    """``<ComfyUI output>/treegrpo/<run_name>``: the run's checkpoints, logs and LoRA file."""
    import os

    import folder_paths

    return os.path.join(folder_paths.get_output_directory(), "treegrpo", check_run_name(run_name))


def model_name(model) -> str:
    """A stable description of a ComfyUI model (architecture + parameter count), stored in LoRA metadata; the
    embedded demo model has the CLI's name for it, so its runs resume on either side."""
    from ..demo import BASE_MODEL_NAME
    from .demo import ComfyDemoDiT

    dm = model.model.diffusion_model
    if isinstance(dm, ComfyDemoDiT):
        return BASE_MODEL_NAME
    return f"{type(model.model).__name__}/{type(dm).__name__}/{sum(p.numel() for p in dm.parameters())}"


class ManagedReward:
    """A reward model scored inside ComfyUI's memory management: before each call ComfyUI frees room on
    its torch device (unloading other models if needed) and the reward's weights move there; afterwards they
    go back to the CPU, so the policy keeps the VRAM between scorings. Rewards without weights pass through.
    The reward reads each prompt without ComfyUI's weighting syntax and embedding names
    (:func:`treegrpo.prompts.reward_text`); the text encoder had it whole."""

    def __init__(self, reward):
        self.reward = reward
        self.name = getattr(reward, "name", type(reward).__name__)

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        prompts = [reward_text(p) for p in prompts]
        if not (hasattr(self.reward, "load") and hasattr(self.reward, "offload")):
            return self.reward(images, prompts)
        import comfy.model_management as mm

        device = mm.get_torch_device()
        size = self.reward.model_size() if hasattr(self.reward, "model_size") else 0
        mm.free_memory(int(size * 1.3), device)
        self.reward.load(device)
        try:
            return self.reward(images, prompts)
        finally:
            self.reward.offload()
            mm.soft_empty_cache()


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


def _choice(checkpointing) -> str:
    """auto / on / off (a boolean from older callers: True = on, False = auto)."""
    if isinstance(checkpointing, bool):
        return "on" if checkpointing else "auto"
    return checkpointing or "auto"


class RunState:
    """A named run of the step nodes: settings from the Trainer State node, and the run's Trainer, created when
    the first Tree Sampler attaches a model (resuming the run's checkpoint when one exists)."""

    _registry: dict[str, "RunState"] = {}

    def __init__(self, run_name: str, lora_cfg: LoraConfig, optim_cfg: OptimConfig, seed: int = 0,
                 gradient_checkpointing="auto"):
        self.run_name, self.folder = run_name, run_folder(run_name)
        self.lora_cfg, self.optim_cfg, self.seed = lora_cfg, optim_cfg, seed
        self.gradient_checkpointing = _choice(gradient_checkpointing)
        self.trainer: Optional[Trainer] = None
        self.monitor: list[dict] = _read_monitor(self.folder)   # the Run Monitor's records, one per iteration

    @classmethod
    def get(cls, run_name: str, lora_cfg: LoraConfig, optim_cfg: OptimConfig, seed: int = 0,
            gradient_checkpointing="auto") -> "RunState":
        """The live run of this name (optimiser settings updated), or a new one (resumed from disk when saved)."""
        st = cls._registry.get(run_name)
        if st is None or st.folder != run_folder(run_name) or st.lora_cfg != lora_cfg:
            st = cls(run_name, lora_cfg, optim_cfg, seed, gradient_checkpointing)
            cls._registry[run_name] = st
        st.optim_cfg, st.gradient_checkpointing = optim_cfg, _choice(gradient_checkpointing)
        return st

    @classmethod
    def iteration_of(cls, run_name: str) -> int:
        """Iterations done by the live run of this name (-1 when there is none in this process)."""
        st = cls._registry.get(run_name)
        return st.iteration if st is not None else -1

    @property
    def lora(self):
        return self.trainer.lora if self.trainer is not None else None

    @property
    def iteration(self) -> int:
        return self.trainer.iteration if self.trainer is not None else 0


def _step_config(run: Optional[RunState], prompt: str, tree_cfg: TreeConfig, seed: int, guidance: float,
                 trees: int) -> TrainConfig:
    """The TrainConfig the step nodes' phases run with: one prompt, ``trees`` trees per iteration."""
    kw = dict(backend="comfy", prompts=[prompt], cfg=guidance, tree=tree_cfg, prompts_per_iter=trees, seed=seed,
              eval_every=0, checkpoint_every=1)
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
    tc = _step_config(run, text, tree_cfg, seed, cfg, trees)
    trainer = run.trainer if run is not None else None
    name = model_name(model)
    if trainer is not None and trainer.base_model_name != name:
        raise ValueError(f"run {run.run_name!r} trains a LoRA for {trainer.base_model_name}, but the sampler got "
                         f"{name}: use another run name for another base model")
    with torch.inference_mode(False):
        policy = ComfyPolicy(model, [text], [(positive, negative)], latent_shape_of(latent, model),
                             lora=trainer.lora if trainer is not None else None,
                             lora_cfg=run.lora_cfg if run is not None else dataclasses.replace(tc.lora, targets=["auto"]),
                             scheduler=scheduler,
                             seed=run.seed if run is not None else seed,
                             gradient_checkpointing=run is not None and run.gradient_checkpointing == "on")
        if trainer is None:
            trainer = Trainer(tc, policy, progress=False, base_model_name=name)
            if run is not None:
                run.trainer = trainer
                trainer.begin(resume=True)
        else:
            trainer.rebind(tc, policy)
        # the memory plan: made once per run (on the device's memory, before its first tree), re-applied to each
        # new policy; without a GPU only the size guard runs
        if trainer.memory_plan is None:
            trainer.log = logging.info
            trainer.memory_budget = memory_budget(policy.device) or None
            trainer.plan_memory()
        else:
            trainer.apply_plan(trainer.memory_plan)
        trainer.step_callback = comfy_progress(tree_cfg.steps)
        batch = trainer.sample()
    batch.prompts = [prompt] * len(batch.prompts)
    return TreeResult(batch, trainer, prompt, run, iteration=trainer.iteration)


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

    run = tree.run
    if run is None:
        raise ValueError("the Run Monitor needs a tree sampled with a TreeGRPO Trainer State (the run it records)")
    n = images.shape[0]
    if n != tree.batch.leaves.shape[0]:
        raise ValueError(f"the Run Monitor got {n} images for {tree.batch.leaves.shape[0]} leaves: connect the VAE "
                         "Decode of this tree's leaves")
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


def train_step(tree: TreeResult, run: RunState) -> dict:
    """One GRPO update of the run's LoRA on the tree's edges (``Trainer.update`` + ``record``); saves the
    checkpoint, the logs and the LoRA file. Returns the iteration's statistics."""
    if tree.batch.advantages is None:
        raise ValueError("this TREE has no advantages yet: connect it through the Advantage Backup node")
    if tree.run is not run or tree.trainer is not run.trainer:
        raise ValueError("the TREE was sampled without this trainer state: connect the same TreeGRPO Trainer "
                         "State to the Tree Sampler and to the Trainer Step")
    tr = run.trainer
    tr.step_callback = comfy_progress(1 + sum(x.shape[0] for x in tree.batch.latents[:-1]) // tr.cfg.optim.microbatch)
    with torch.inference_mode(False), torch.enable_grad():
        upd = tr.update(tree.batch)
    stats = tr.record(tree.batch, upd)
    tr.after_iteration(stats)
    tr.save_lora()
    return stats


def patched_model(model, lora):
    """A clone of ``model`` with ``lora`` (a ComfyLoRA) applied as object patches (the base stays untouched)."""
    m = model.clone()
    lora.patch(m)
    return m


def latent_shape_of(latent: dict, model=None) -> tuple[int, ...]:
    """(C, H, W) of an image LATENT, (C, T, H, W) of a video one (and of the image latents of models that use a
    video VAE, e.g. Qwen-Image); empty latents get the model's channels and dimensions (as KSampler does)."""
    s = latent["samples"]
    if model is not None:
        import comfy.sample
        s = comfy.sample.fix_empty_latent_channels(model, s)
    if s.ndim not in (4, 5):
        raise ValueError(f"TreeGRPO supports latents (B, C, H, W) and (B, C, T, H, W); got shape {tuple(s.shape)}")
    return tuple(int(v) for v in s.shape[1:])


def latent_shape_for(model, width: int, height: int, compression: int, frames: int = 1,
                     temporal_compression: int = 1) -> tuple[int, ...]:
    """The latent of one ``width``×``height`` image for ``model``: (C, H, W), or (C, T, H, W) where the model's
    latents have a time axis (T = 1 for images, ``(frames − 1) // temporal_compression + 1`` for a video family's
    ``frames``-long videos, as ComfyUI's empty video latents)."""
    from ..video import latent_frames_for
    from .families import family_of

    fmt = model.model.latent_format
    c, h, w = fmt.latent_channels, height // compression, width // compression
    if frames > 1:
        name, fam = family_of(model)
        if getattr(fmt, "latent_dimensions", 2) != 3 or (fam is not None and fam.media != "video"):
            raise ValueError(f"frames = {frames}: {fam.label if fam else name} makes images, not videos; set frames "
                             "to 1 (or load a video model such as Wan or HunyuanVideo)")
    if getattr(fmt, "latent_dimensions", 2) == 3:
        return (c, latent_frames_for(frames, temporal_compression), h, w)
    return (c, h, w)


def memory_budget(device) -> float:
    """Bytes the Train node may plan for on ComfyUI's device: the free memory plus what ComfyUI's loaded models
    hold (it unloads them on demand), less the memory ComfyUI keeps in reserve; 0 on the CPU (no plan)."""
    import comfy.model_management as mm

    device = torch.device(device)
    if mm.is_device_cpu(device):
        return 0.0
    loaded = sum(m.model_loaded_memory() for m in mm.current_loaded_models if m.device == device)
    return float(mm.get_free_memory(device) + loaded - mm.extra_reserved_memory())


def train_full(model, vae, prompts: list[str], conds: list[tuple], rewards: dict, cfg: TrainConfig,
               latent_shape: tuple, *, scheduler: str = "simple", judges: Optional[dict] = None,
               artist: Optional[Callable] = None, existing_run: str = "resume", save_every: int = 0,
               node_id: Optional[str] = None) -> Trainer:
    """The whole TreeGRPO loop on a ComfyUI model (the Train node). ``existing_run`` (:data:`watch.EXISTING_RUN`)
    decides what happens when ``cfg.run_name`` already trained: ``resume`` its latest checkpoint, start a ``new``
    numbered run beside it, or ``overwrite`` it (its files moved aside); the run trained is ``trainer.cfg.run_name``.
    Before any sampling the memory plan (``cfg.memory``) picks checkpointing, microbatch and offload for the
    device's memory (or refuses). After every iteration ComfyUI's progress bar moves, one console line and the node
    show reward, judge, KL, s/it and the time left (:class:`watch.RunWatcher`), and every ``save_every`` iterations
    the LoRA is written where LoraLoader lists it; after every evaluation the curves and the sample grid show on the
    node and the grid is kept in the run folder (``judges``: held-out reward models). Interrupts are checked at
    every denoiser/update step and answered with a checkpoint (by the Trainer) before the exception propagates."""
    import comfy.model_management

    from .watch import RunWatcher, choose_run

    name, resume = choose_run(cfg.run_name, existing_run, run_folder)
    if name != cfg.run_name:
        logging.info("TreeGRPO: run %r already trained; existing_run 'new' trains %r beside it", cfg.run_name, name)
        cfg = dataclasses.replace(cfg, run_name=name)
    out = run_folder(cfg.run_name)
    # before any model work: a run of this name trained with other settings is not continued silently
    if resume:
        ckpt.check_resume(out, dataclasses.replace(cfg, output_dir=out), required=False,
                          override_hint="set existing_run to 'new' (a fresh numbered run; this one stays) or "
                                        "'overwrite' (its files are moved to previous-<time>/)")
    policy = ComfyPolicy(model, prompts, conds, latent_shape, vae=vae, lora_cfg=cfg.lora, scheduler=scheduler,
                         seed=cfg.seed, gradient_checkpointing=cfg.memory.checkpointing == "on", video=cfg.video)
    bar = comfy_progress(cfg.iterations)
    with torch.inference_mode(False):
        trainer = Trainer(dataclasses.replace(cfg, output_dir=out), policy, rewards,
                          progress=False, base_model_name=model_name(model),
                          step_callback=comfy.model_management.throw_exception_if_processing_interrupted,
                          judges=judges)
        trainer.log = logging.info
        watcher = RunWatcher(trainer, cfg.iterations, bar, save_every=save_every, node_id=node_id)
        trainer.iteration_callback = watcher.on_iteration
        trainer.eval_callback = watcher.on_evaluate
        trainer.artist = artist       # the person answering about some trees (the Train node's artist_every)
        if not cfg.memory.budget_gb:
            trainer.memory_budget = memory_budget(policy.device) or None
        trainer.train(resume=resume)
    trainer.save_lora()  # before anything optional: a failing preview must never cost the trained LoRA
    watcher.finish()     # the LoRA where LoraLoader lists it, the run's figures
    return trainer


def run_previews(trainer: Trainer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Train node's optional outputs, as ComfyUI IMAGEs (1, H, W, 3): the reward curve and a grid of
    evaluation samples (2 per prompt, up to 8 prompts). A failure here (a plotting library missing, a reward
    model erroring) is logged and answered with a blank image: the LoRA is already saved."""
    from ..report import curve_image, image_grid, signals_image

    def curve():
        if trainer.evals:
            return signals_image(trainer.evals)
        return curve_image([h["reward"] for h in trainer.history])

    def grid():
        with torch.inference_mode(False):
            ev = trainer.evaluate(prompts=prompts[:8], seeds=2, return_images=True)
        g = image_grid(ev["images"], nrow=2, scale=max(1, 128 // max(1, ev["images"].shape[-1])))
        return g.movedim(0, -1)[None].float()

    return _optional("reward curve", curve, trainer), _optional("sample grid", grid, trainer)


def _optional(what: str, draw: Callable[[], torch.Tensor], trainer: Trainer) -> torch.Tensor:
    """``draw()``, or a blank 64×64 IMAGE with a logged warning when it fails (interrupts still propagate)."""
    import logging

    from comfy.model_management import InterruptProcessingException

    try:
        return draw()
    except InterruptProcessingException:
        raise
    except Exception as e:  # noqa: BLE001 - an optional output must not fail the run
        logging.warning("TreeGRPO: could not draw the %s (%s: %s); the LoRA is saved at %s", what,
                        type(e).__name__, e, trainer.lora_path)
        return torch.zeros(1, 64, 64, 3)
