"""TreeGRPO inside ComfyUI: the objects the nodes pass around and the calls they make.

- :class:`RunState` — a training run that survives between queued prompts (LoRA, optimiser, iteration,
  history), saved to ``<output>/treegrpo/<run_name>/`` after every step and reloaded by name.
- :func:`sample_tree` — one batch of trees through ComfyUI's denoiser path (the TREE socket).
- :func:`train_step` — the amortized GRPO update on a TREE with advantages.
- :func:`train_full` — the whole loop (the Train node) on :class:`treegrpo.trainer.Trainer`.

Imported only inside ComfyUI (it imports ``comfy`` lazily).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..advantages import assign_advantages
from ..config import AdvantageConfig, LoraConfig, OptimConfig, TrainConfig, TreeConfig
from ..io import atomic_write, atomic_write_json
from ..lora import save_lora_file, to_comfy
from ..tree import TreeBatch, sample_trees
from ..update import grpo_update
from .comfy import DEFAULT_TARGETS, ComfyLoRA, ComfyPolicy


def comfy_progress(total: int) -> Callable[[], None]:
    """A step callback: advances ComfyUI's ProgressBar and raises on user interrupt."""
    import comfy.model_management
    import comfy.utils

    bar = comfy.utils.ProgressBar(max(1, total))

    def step():
        bar.update(1)
        comfy.model_management.throw_exception_if_processing_interrupted()

    return step


def model_name(model) -> str:
    """A stable description of a ComfyUI model (architecture + parameter count), stored in LoRA metadata."""
    dm = model.model.diffusion_model
    return f"{type(model.model).__name__}/{type(dm).__name__}/{sum(p.numel() for p in dm.parameters())}"


class ManagedReward:
    """A reward model scored inside ComfyUI's memory management: before each call ComfyUI frees room on
    its torch device (unloading other models if needed) and the reward's weights move there; afterwards they
    go back to the CPU, so the policy keeps the VRAM between scorings. Rewards without weights pass through."""

    def __init__(self, reward):
        self.reward = reward
        self.name = getattr(reward, "name", type(reward).__name__)

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
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
    """The TREE socket: sampled trees, the policy that sampled them, and (after backup) advantages."""

    batch: TreeBatch
    policy: ComfyPolicy
    tree_cfg: TreeConfig
    guidance: float
    prompt: str
    run: Optional["RunState"] = None
    adv_stats: dict = field(default_factory=dict)

    @property
    def leaf_latents(self) -> torch.Tensor:
        """Leaves in the model's raw latent space (what VAEDecode expects)."""
        return self.policy.patcher.model.process_latent_out(self.batch.leaves.float())


class RunState:
    """LoRA + optimiser + counters of one named run; one object per run name per ComfyUI process."""

    _registry: dict[str, "RunState"] = {}

    def __init__(self, run_name: str, folder: str, lora_cfg: LoraConfig, optim_cfg: OptimConfig, seed: int = 0):
        self.gradient_checkpointing = False
        self.run_name, self.folder = run_name, folder
        self.lora_cfg, self.optim_cfg, self.seed = lora_cfg, optim_cfg, seed
        self.lora: Optional[ComfyLoRA] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.model_name = ""
        self.iteration = 0
        self.history: list[dict] = []

    @classmethod
    def get(cls, run_name: str, folder: str, lora_cfg: LoraConfig, optim_cfg: OptimConfig, seed: int = 0) -> "RunState":
        """The live run of this name (settings updated), or a new one resumed from its folder if saved."""
        st = cls._registry.get(run_name)
        if st is None or st.folder != folder or st.lora_cfg != lora_cfg:
            st = cls(run_name, folder, lora_cfg, optim_cfg, seed)
            cls._registry[run_name] = st
        st.optim_cfg = optim_cfg
        if st.optimizer is not None:
            for g in st.optimizer.param_groups:
                g["lr"] = optim_cfg.lr
        return st

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.folder, "checkpoint.pt")

    @property
    def lora_path(self) -> str:
        return os.path.join(self.folder, f"{self.run_name}.safetensors")

    def attach(self, model) -> ComfyLoRA:
        """The run's LoRA for ``model`` (created on first use, resumed from disk when a checkpoint exists)."""
        name = model_name(model)
        if self.lora is not None:
            if name != self.model_name:
                raise ValueError(f"run {self.run_name!r} trains a LoRA for {self.model_name}, but the sampler got "
                                 f"{name}: use another run name for another base model")
            return self.lora
        with torch.inference_mode(False):
            self.lora = ComfyLoRA(model.model.diffusion_model, self.lora_cfg, device=model.load_device, seed=self.seed)
            self.optimizer = torch.optim.AdamW(self.lora.parameters(), lr=self.optim_cfg.lr,
                                               weight_decay=self.optim_cfg.weight_decay)
        self.model_name = name
        if os.path.exists(self.checkpoint_path):
            self.load()
        return self.lora

    def save(self) -> str:
        """Checkpoint (LoRA, optimiser, iteration, history) and the LoRA file, both atomic."""
        state = {"run_name": self.run_name, "model_name": self.model_name, "iteration": self.iteration,
                 "lora": {k: v.detach().cpu() for k, v in self.lora.state_dict().items()},
                 "optimizer": self.optimizer.state_dict(), "history": json.dumps(self.history),
                 "rng": torch.get_rng_state()}
        atomic_write(self.checkpoint_path, lambda tmp: torch.save(state, tmp))
        save_lora_file(self.lora_path, to_comfy(self.lora.weights()), self.metadata())
        return self.checkpoint_path

    def load(self) -> None:
        state = torch.load(self.checkpoint_path, map_location="cpu", weights_only=True)
        if state.get("model_name") != self.model_name:
            raise ValueError(f"checkpoint {self.checkpoint_path} was trained on {state.get('model_name')}, not "
                             f"{self.model_name}: use another run name")
        with torch.inference_mode(False):
            self.lora.load_state_dict(state["lora"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
        self.history = json.loads(state["history"])

    def metadata(self) -> dict:
        return {"treegrpo.method": "tree", "treegrpo.step": str(self.iteration),
                "treegrpo.base_model": self.model_name, "treegrpo.run_name": self.run_name,
                "treegrpo.lora_rank": str(self.lora_cfg.rank), "treegrpo.lora_alpha": str(self.lora_cfg.alpha)}

    def lora_state_dict(self) -> dict:
        return to_comfy(self.lora.weights())


def latent_shape_of(latent: dict, model=None) -> tuple[int, int, int]:
    """(C, H, W) of a LATENT; empty latents get the model's channel count (as KSampler does)."""
    s = latent["samples"]
    if model is not None:
        import comfy.sample
        s = comfy.sample.fix_empty_latent_channels(model, s)
    if s.ndim != 4:
        raise ValueError(f"TreeGRPO supports image latents (B, C, H, W); got shape {tuple(s.shape)}")
    return tuple(int(v) for v in s.shape[1:])


def sample_tree(model, positive, negative, latent: dict, tree_cfg: TreeConfig, *, seed: int, cfg: float,
                scheduler: str, trees: int, prompt: str = "", run: Optional[RunState] = None,
                iteration: int = 0) -> TreeResult:
    """Sample ``trees`` trees (one initial noise each) for one conditioning pair, with the run's LoRA."""
    from ..tree import window_start_at
    import random

    if cfg > 1.0 and negative is None:
        raise ValueError("cfg > 1 needs a negative conditioning")
    shape = latent_shape_of(latent, model)
    lora = run.attach(model) if run is not None else None
    policy = ComfyPolicy(model, [prompt or "<prompt>"], [(positive, negative)], shape,
                         lora=lora, lora_cfg=LoraConfig(targets=DEFAULT_TARGETS, rank=4, alpha=4.0),
                         scheduler=scheduler, seed=seed,
                         gradient_checkpointing=bool(run and run.gradient_checkpointing))
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn((trees, *shape), generator=gen)
    s = window_start_at(tree_cfg, iteration, random.Random(seed))
    total = tree_cfg.steps
    step = comfy_progress(total)
    with torch.inference_mode(False):
        batch = policy.run(lambda: sample_trees(policy, [policy.prompts[0]] * trees, tree_cfg, window_start=s,
                                                guidance=cfg, generator=gen, noise=noise, callback=step),
                           max_batch=trees * tree_cfg.leaves)
    batch.prompts = [prompt] * trees
    return TreeResult(batch, policy, tree_cfg, cfg, prompt, run)


def backup_tree(tree: TreeResult, rewards: dict, adv_cfg: AdvantageConfig) -> TreeResult:
    """Leaf rewards (``{"rewards": {name: (n,)}, "weights": {name: w}}``) → advantages on every edge."""
    n = tree.batch.leaves.shape[0]
    raw = {k: v for k, v in rewards["rewards"].items()}
    for k, v in raw.items():
        if v.numel() != n:
            raise ValueError(f"reward {k!r} has {v.numel()} values but the tree has {n} leaves: score the leaf "
                             "images of this tree")
    new = dataclasses.replace(tree, batch=dataclasses.replace(tree.batch))
    new.adv_stats = assign_advantages(new.batch, raw, rewards["weights"], adv_cfg)
    return new


def train_step(tree: TreeResult, run: RunState, *, noise_level: Optional[float] = None) -> dict:
    """One GRPO update of the run's LoRA on the tree's edges; saves the run. Returns the statistics."""
    if tree.batch.advantages is None:
        raise ValueError("this TREE has no advantages yet: connect it through the Advantage Backup node")
    if tree.run is not run or tree.policy.lora is not run.lora:
        raise ValueError("the TREE was sampled without this trainer state: connect the same TreeGRPO Trainer "
                         "State to the Tree Sampler and to the Trainer Step")
    step = comfy_progress(1 + sum(x.shape[0] for x in tree.batch.latents[:-1]) // max(1, run.optim_cfg.microbatch))
    t0 = time.perf_counter()
    with torch.inference_mode(False), torch.enable_grad():
        run.lora.train()
        stats = tree.policy.run(lambda: grpo_update(
            tree.policy, tree.batch, run.optimizer, run.optim_cfg, noise_level=tree.tree_cfg.noise_level,
            eta=tree.tree_cfg.eta, guidance=tree.guidance, params=list(run.lora.parameters()), callback=step),
            max_batch=run.optim_cfg.microbatch)
        run.lora.eval()
    run.iteration += 1
    rec = {"iteration": run.iteration, "t_update": time.perf_counter() - t0, "nfe": tree.batch.nfe,
           **tree.adv_stats, **stats}
    run.history.append(rec)
    run.save()
    return rec


def patched_model(model, run: RunState):
    """A clone of ``model`` with the run's current LoRA applied (object patches; base untouched)."""
    m = model.clone()
    run.attach(model).patch(m)
    return m


def train_full(model, vae, prompts: list[str], conds: list[tuple], rewards: dict, cfg: TrainConfig,
               latent_shape: tuple, *, run_folder: str, scheduler: str = "simple",
               gradient_checkpointing: bool = False) -> Any:
    """The whole TreeGRPO loop on a ComfyUI model (the Train node); resumes the run's latest checkpoint.
    The ProgressBar advances once per iteration; interrupts are checked at every denoiser/update step
    and answered with a checkpoint (by the Trainer) before the exception propagates. Returns the Trainer."""
    import comfy.model_management
    from ..trainer import Trainer

    policy = ComfyPolicy(model, prompts, conds, latent_shape, vae=vae, lora_cfg=cfg.lora, scheduler=scheduler,
                         seed=cfg.seed, gradient_checkpointing=gradient_checkpointing)
    bar = comfy_progress(cfg.iterations)
    with torch.inference_mode(False):
        trainer = Trainer(dataclasses.replace(cfg, output_dir=run_folder), policy, rewards, progress=False,
                          base_model_name=model_name(model),
                          step_callback=comfy.model_management.throw_exception_if_processing_interrupted,
                          iteration_callback=lambda stats: bar())
        trainer.train(resume=True)
    return trainer
