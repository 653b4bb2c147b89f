"""Building a run: :func:`build_rewards` and :func:`build_trainer` (the CLI, the Train node, the step nodes, the
benchmarks and the tests), :func:`prepare` (the command line's checks, every one that needs no model, each once,
before minutes of loading; the Train node makes its own in :mod:`treegrpo.comfyui.train_node`), and
:func:`run_training` (the CLI's whole run: prepare, load, train, save)."""
from __future__ import annotations

import os
import tempfile
import warnings
from typing import Optional

from . import interrupts
from .config import ConfigError, TrainConfig, shorten


def check_output_dir(out: str, flag: str = "TrainConfig.output_dir") -> None:
    """``out`` is (or can become) a folder this process writes in; ConfigError naming it otherwise. Nothing is
    created: a folder still to be made is probed in its nearest existing parent (a run refused after this check
    leaves nothing behind, and processes checking the same new folder at once cannot remove it from each other)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"{flag}: {out!r} is a file; choose a folder")
    probe = os.path.abspath(out)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(f"{flag}: {shorten(out)!r} cannot be made: {probe!r} is a file; choose a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"{flag}: cannot write in {shorten(out)!r} ({e.strerror}); choose a folder you "
                          "can write to (--output-dir)") from None


def check_reward_names(cfg: TrainConfig) -> None:
    """Reward names and their options' names and types, before any model is built."""
    from .rewards.base import available, check_options, missing_package

    names = available()
    for field_name in ("rewards", "eval_rewards"):
        specs = getattr(cfg, field_name)
        unknown = [r.name for r in specs if r.name not in names]
        if unknown:
            raise ConfigError(f"TrainConfig.{field_name}: unknown reward model(s) {unknown}; available: {names}")
        for i, r in enumerate(specs):
            missing = missing_package(r.name)
            if missing:
                raise ConfigError(f"TrainConfig.{field_name}[{i}]: {missing}")
            try:
                check_options(r.name, r.options, where=f"TrainConfig.{field_name}[{i}].options")
            except ValueError as e:
                raise ConfigError(str(e)) from None


def build_rewards(cfg: TrainConfig, device, specs: Optional[list] = None, checked: bool = False) -> dict:
    """The reward models of ``specs`` (default: the training rewards) with a weight > 0, by name (``checked``: the
    names and options were checked already, by :func:`prepare`)."""
    from .rewards.base import load_reward

    if not checked:
        check_reward_names(cfg)
    specs = cfg.rewards if specs is None else specs
    return {r.name: load_reward(r.name, path=r.path, device=device, **r.options) for r in specs if r.weight > 0}


def check_window_before_last_step(tree, moving_fix: Optional[str] = None) -> None:
    """A DDIM step (SD1.x / SD2.x / SDXL: epsilon and v models) into σ = 0 adds no noise, so the SDE window must end
    before the last step, at every position it takes (a sliding or random window reaches ``max_start``).
    ``moving_fix``: what to change when a moving window's last position is the one that reaches it (the command
    line's ``tree.window_max_start`` by default)."""
    # the window's positions: an ODE-sampling method (NFT, AWM) samples no window, only its evaluation KL uses the
    # fixed window_start
    moves = tree.window_schedule != "fixed" and tree.method != "ode"
    last = (tree.max_start if moves else tree.window_start) + tree.window_width - 1
    if last >= tree.steps - 1:
        fix = moving_fix or f"set tree.window_max_start <= {tree.steps - 1 - tree.window_width}"
        where = "" if not moves else f" at its last position (window_max_start {tree.max_start}; {fix})"
        raise ConfigError(f"TreeConfig: the SDE window reaches the last step ({tree.steps - 1} of 0..{tree.steps - 1})"
                          f"{where}, where an SD1.x/SD2.x/SDXL (DDIM) step adds no noise: end the window before it "
                          f"(window_start + window_width <= {tree.steps - 1})")


def check_tail(tree) -> None:
    """Warn about a tail that is not what it looks like: a ``tail_steps`` the ``tail_steps_schedule`` overrides from
    iteration 0, and an ODE-sampling method (NFT, AWM) whose whole samples take fewer than 4 solver steps (the demo's
    one-step tail, tuned for the tree's leaves)."""
    sched = tree.tail_steps_schedule
    if sched and tree.tail_steps and tree.tail_steps != sched[0][1]:
        warnings.warn(f"tree.tail_steps {tree.tail_steps} is not used: tree.tail_steps_schedule {sched} sets the tail "
                      f"from iteration 0 ({sched[0][1]} steps); set tree.tail_steps_schedule [] to use tail_steps")
    if tree.method == "ode":
        from .tree import at_iteration
        first = at_iteration(tree, 0)
        n = first.tail_steps or tree.steps
        if n < 4:
            warnings.warn(f"tree.method ode samples each image in {n} solver step(s) from noise (tree.tail_steps "
                          f"{first.tail_steps}{', from tree.tail_steps_schedule' if sched else ''}); NFT and AWM "
                          "are measured here with 6 (--tree.tail_steps 6; 0 = the whole schedule)")


def prepare(cfg: TrainConfig, resume: bool = False, allow_changes: bool = False, overwrite: bool = False) -> None:
    """Every check that needs no model, before one is loaded (minutes for SDXL or Flux): the prompts, the reward
    names and options, the output folder, the LoRA to start from; for ``resume`` a checkpoint whose training
    settings match ``cfg`` (unless ``allow_changes``), otherwise no earlier run of the same name in the folder
    (unless ``overwrite``: the Trainer then moves its files aside)."""
    from . import checkpoint as ckpt

    prompts = cfg.load_prompts()
    if cfg.backend != "comfy" and cfg.video.frames != 1:     # (an older checkpoint may hold it: checked here)
        raise ConfigError(f"VideoConfig.frames: {cfg.video.frames} frames: the {cfg.backend} backend trains image "
                          "models (one frame); video models (Wan, HunyuanVideo, LTX-Video, ...) train in ComfyUI's "
                          "Train node. Leave frames at 1")
    check_reward_names(cfg)
    from .rewards.base import check_config_prompts
    try:
        check_config_prompts(cfg, prompts)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_tail(cfg.tree)
    if cfg.eval_seeds < 2 and cfg.signals.diversity_floor > 0:
        warnings.warn("eval_seeds 1: one sample per evaluation prompt has no diversity to measure, so the warning "
                      "that samples collapse to one image (signals.diversity_floor) is off; use eval_seeds 2 or more "
                      "to keep it")
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)     # torchrun / accelerate launch: the processes
    if cfg.prompts_per_iter < world:
        raise ConfigError(f"TrainConfig.prompts_per_iter: {cfg.prompts_per_iter} prompts per iteration cannot be split "
                          f"over {world} processes; use at least {world}")
    if cfg.backend == "diffusers" and cfg.model and os.path.exists(cfg.model):
        from .backends.diffusers import ModelLoadError, model_family
        try:
            family = model_family(cfg.model, cfg.pipeline)      # a pipeline.family the folder contradicts
        except ModelLoadError as e:
            raise ConfigError(str(e)) from None
        if family in ("sd", "sdxl"):
            check_window_before_last_step(cfg.tree)
        if cfg.pipeline.config and os.path.isdir(cfg.model):
            warnings.warn(f"pipeline.config {cfg.pipeline.config!r} is not read: it gives the configs of a single-file "
                          f"checkpoint, and {cfg.model!r} is a diffusers folder with its own")
    out = cfg.output_dir
    check_output_dir(out)
    ckpt.check_run_folder(out, cfg.run_name, None)      # a folder of another run; its base model once loaded
    ckpt.check_not_in_use(out)
    if cfg.lora.init_from and not os.path.isfile(cfg.lora.init_from):
        raise ConfigError(f"LoraConfig.init_from: no LoRA file at {cfg.lora.init_from!r}")
    if cfg.lora.init_from:      # a diverged run's LoRA trains NaN from the first step
        from .lora import LoraFileError, check_finite, read_lora_file
        try:
            check_finite(read_lora_file(cfg.lora.init_from)[0], cfg.lora.init_from)
        except LoraFileError as e:
            raise ConfigError(f"LoraConfig.init_from: {e}") from None
    if resume:
        ckpt.check_resume(out, cfg, allow_changes=allow_changes)
    elif not overwrite:
        ckpt.check_fresh_start(out, cfg.run_name)
    check_size(cfg)


def check_size(cfg: TrainConfig) -> None:
    """The latents one iteration keeps must fit in the memory of the device they live on, from the model's
    configuration alone: refused before any weights load (minutes for SDXL or Flux), naming the smallest change that
    fits. A lower bound: the measured plan after loading adds the activations (the GPU) and checks again."""
    import math

    from . import memory
    from .backends import latent_shape_from_config, resolve_device

    if cfg.memory.plan == "off":
        return
    try:
        shape = latent_shape_from_config(cfg)
    except Exception:  # noqa: BLE001 - a model folder that cannot be read is the loader's to explain
        shape = None
    if shape is None:
        return
    device = resolve_device(cfg.device)
    available = memory.accelerator_budget(device) if device.type == "cuda" else memory.available_ram()
    world = max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))   # torchrun / accelerate: each rank keeps its share
    wl = memory.Workload(trees=-(-cfg.prompts_per_iter * cfg.trees_per_prompt // world),
                         branching=tuple(cfg.tree.branching))
    try:
        memory.size_guard(wl, 4 * math.prod(shape), available, trees_per_prompt=cfg.trees_per_prompt,
                          where="GPU memory" if device.type == "cuda" else "memory")
    except memory.MemoryPlanError as e:
        raise ConfigError(f"TrainConfig.prompts_per_iter / tree: {e}") from None


def build_trainer(cfg: TrainConfig, policy, rewards: Optional[dict] = None, **kw):
    """The :class:`~treegrpo.trainer.Trainer` of a run on a loaded ``policy``: ``rewards`` by name (None: scored
    outside, as the step nodes do), ``kw`` the Trainer's own (progress, stop, callbacks, judges, leaf_scorer, ...).
    The CLI, the Train node and the step nodes build their trainers here."""
    from .trainer import Trainer

    return Trainer(cfg, policy, rewards, **kw)


def run_training(cfg: TrainConfig, resume: bool = False, progress: bool = True, write_lora: bool = True,
                 allow_changes: bool = False, overwrite: bool = False):
    """Build policy + rewards from ``cfg``, train, save the LoRA; returns (trainer, summary)."""
    from .backends import load_policy, resolve_device
    from .distributed import DataParallel, launched

    prepare(cfg, resume, allow_changes, overwrite)

    device = resolve_device(cfg.device)
    # torchrun / accelerate launch: one process per device
    dist = DataParallel(cpu=device.type == "cpu") if launched() else None
    if dist is not None:
        dist.check_same_settings(cfg.to_dict())
    if dist is not None and device.type == "cuda":
        device = dist.device
    if dist is not None and dist.rank == 0:     # said, so a launcher that started one process is noticed
        print(f"TreeGRPO: data parallel over {dist.world} processes ({dist.state.backend or 'one device each'})",
              flush=True)
    # fail on reward names/files before loading the model; score on the policy's device
    rewards_ready = build_rewards(cfg, device, checked=True)
    judges = build_rewards(cfg, device, cfg.eval_rewards, checked=True) if cfg.eval_every or cfg.eval_every_s else {}
    policy, base_name = load_policy(cfg, device)
    trainer = build_trainer(cfg, policy, rewards_ready, progress=progress, base_model_name=base_name, dist=dist,
                            judges=judges, stop=interrupts.interrupt_requested,
                            callbacks=[interrupts.CheckpointNote()])
    trainer.replace_earlier = overwrite     # else an earlier run that appeared while the model loaded is refused

    def write_loras(summary: dict) -> None:   # in the locked folder: no other run starts in between
        summary["lora"] = trainer.save_lora()
        if trainer.rank == 0:  # the same tensors in diffusers' own key format, where the backend has one
            written = policy.save_diffusers_lora(
                trainer.lora_weights(), os.path.join(cfg.output_dir, f"{cfg.run_name}_diffusers.safetensors"))
            if written:
                summary["lora_diffusers"] = written

    summary = trainer.train(resume=resume, finish=write_loras if write_lora else None)
    return trainer, summary
