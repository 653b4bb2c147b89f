"""The training loop: sample trees → decode → score → advantages → update → log → checkpoint.

Backend-free: it drives a :class:`~treegrpo.backends.base.Policy` and reward models. The prompts and
noises of iteration ``i`` depend only on ``(seed, i)``, so methods compared with the same seed see the
same prompts and initial noises, and a resumed run continues exactly where it stopped.
"""
from __future__ import annotations

import csv
import glob
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from .advantages import RewardError, assign_advantages, weighted_raw
from .backends.base import Policy
from .config import TrainConfig
from .io import atomic_write, atomic_write_json
from .lora import add_lora, check_base_model, extract_lora, from_state_dict, load_into_model, read_lora_file, save_lora_file, to_comfy
from .tree import Denoiser, NFECounter, initial_latent, ode_solve, sample_trees, window_start_at
from .update import grpo_update, lr_factor


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


@dataclass
class IterationLog:
    iteration: int
    stats: dict = field(default_factory=dict)



def _next_multiple(t: float, every: float) -> float:
    """The first multiple of ``every`` after ``t`` (seconds); ``inf`` when ``every`` is 0 (off)."""
    return (math.floor(t / every) + 1) * every if every else math.inf

class Trainer:
    """TreeGRPO (or trajectory GRPO) LoRA training on one policy.

    ``rewards``: name → reward model (callable ``(images, prompts) -> (B,)``).
    ``stop``: optional callable returning True to stop (interrupt); checked at every step.
    ``step_callback``: called after every denoiser/update step (progress bars, interrupt checks).
    ``iteration_callback``: called with each iteration's statistics.
    ``dist``: optional data-parallel helper with ``rank``, ``world``, ``all_reduce_grads(params, n_edges)``
    (:class:`treegrpo.distributed.DataParallel`); only rank 0 evaluates and writes files."""

    def __init__(self, cfg: TrainConfig, policy: Policy, rewards: dict[str, Callable], *,
                 progress: bool = True, stop: Optional[Callable[[], bool]] = None,
                 step_callback: Optional[Callable[[], None]] = None, dist: Any = None,
                 lora_params: Optional[list] = None, base_model_name: str = "",
                 iteration_callback: Optional[Callable[[dict], None]] = None):
        self.cfg, self.policy, self.rewards = cfg, policy, rewards
        missing = [r.name for r in cfg.rewards if r.name not in rewards]
        if missing:
            raise ValueError(f"no reward model given for {missing}")
        self.weights = {r.name: r.weight for r in cfg.rewards if r.weight > 0}
        self.prompts = cfg.load_prompts()
        self.eval_prompts = list(cfg.eval_prompts) or self.prompts
        self.progress, self.stop, self.step_callback, self.dist = progress, stop, step_callback, dist
        self.iteration_callback = iteration_callback
        self.rank = getattr(dist, "rank", 0)
        self.world = getattr(dist, "world", 1)
        if cfg.prompts_per_iter < self.world:
            raise ValueError(f"TrainConfig.prompts_per_iter: {cfg.prompts_per_iter} prompts per iteration cannot be "
                             f"split over {self.world} processes; use at least {self.world}")
        self.base_model_name = base_model_name or (cfg.model or cfg.backend)
        self.own_lora = getattr(policy, "lora", None)  # backends with their own LoRA (ComfyUI) vs PEFT
        if lora_params is not None:
            self.params = lora_params
        elif self.own_lora is not None:
            self.params = [p for p in self.own_lora.parameters()]
        else:
            with torch.random.fork_rng(devices=[]):  # the LoRA init depends on the run's seed only
                torch.manual_seed(cfg.seed)
                self.params = add_lora(policy.model, cfg.lora)
        if cfg.lora.init_from:
            t, meta = read_lora_file(cfg.lora.init_from)
            check_base_model(meta, self.base_model_name, cfg.lora.init_from)
            self.load_lora_weights(from_state_dict(t, meta))
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.iteration = 0
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.train_time = 0.0
        self.total_nfe = 0
        self.out = cfg.output_dir

    # ------------------------------------------------------------------ one iteration
    def _set_lr(self) -> float:
        """Set this iteration's learning rate from the schedule (iterations done and, under a time budget,
        the training time used); returns it."""
        o, budget = self.cfg.optim, self.cfg.time_budget_s
        frac = self.train_time / budget if budget else 0.0
        lr = o.lr * lr_factor(self.iteration, self.cfg.iterations, o.warmup, o.lr_schedule, frac)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return lr

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop():
            raise TrainingInterrupted("training stopped by request")

    def _run(self, fn):
        """Run ``fn`` inside the backend's model context when it has one (ComfyUI: a sampling session)."""
        run = getattr(self.policy, "run", None)
        return run(fn) if run is not None else fn()

    def _cb(self) -> None:
        if self.step_callback:
            self.step_callback()
        self._check_stop()

    def score(self, images: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Raw reward per model, (B,) float32 each; non-finite values raise naming the model."""
        out = {}
        for name in self.weights:
            r = self.rewards[name](images, prompts)
            r = torch.as_tensor(r, dtype=torch.float32).reshape(-1).cpu()
            if r.numel() != len(prompts) or not torch.isfinite(r).all():
                raise RewardError(f"reward {name!r} returned {'non-finite values' if r.numel() == len(prompts) else f'{r.numel()} values for {len(prompts)} images'}"
                                  f" at iteration {self.iteration}")
            out[name] = r
        return out

    def train_step(self) -> dict:
        """One iteration; returns its statistics (timings in seconds, NFE, reward, loss)."""
        cfg, it = self.cfg, self.iteration
        t0 = time.perf_counter()
        idx = iteration_prompts(self.prompts, cfg.prompts_per_iter, cfg.seed, it)
        # data parallel: each rank takes its share of the trees
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
        batch = self._run(lambda: sample_trees(
            self.policy, tree_prompts, cfg.tree, prompt_ids=tree_pids, window_start=s, guidance=cfg.cfg,
            generator=sde_gen, noise=noise.to(self.policy.device), callback=self._cb))
        t1 = time.perf_counter()
        with torch.no_grad():
            images = self.policy.decode(batch.leaves)
        t2 = time.perf_counter()
        raw = self.score(images, batch.leaf_prompts)
        t3 = time.perf_counter()
        adv_stats = assign_advantages(batch, raw, self.weights, cfg.advantage,
                                      pool=getattr(self.dist, "sum_over_ranks", None) if self.world > 1 else None)
        stats_lr = self._set_lr()
        self.policy.model.train()
        upd = self._run(lambda: grpo_update(
            self.policy, batch, self.optimizer, cfg.optim, noise_level=cfg.tree.noise_level, eta=cfg.tree.eta,
            guidance=cfg.cfg, params=self.params, callback=self._cb,
            all_reduce=getattr(self.dist, "all_reduce_grads", None)))
        self.policy.model.eval()
        t4 = time.perf_counter()
        self.train_time += t4 - t0
        if hasattr(self.dist, "max_over_ranks"):  # one clock for all ranks: same lr, same stop iteration
            self.train_time = self.dist.max_over_ranks(self.train_time)
        stats = {"iteration": it, "window_start": s, **adv_stats, **{k: v for k, v in upd.items()},
                 "nfe": batch.nfe, "calls": batch.calls, "lr": stats_lr, "t_sample": t1 - t0, "t_decode": t2 - t1,
                 "t_reward": t3 - t2, "t_update": t4 - t3, "t_iter": t4 - t0, "train_time": self.train_time}
        self._pool_over_ranks(stats, raw)
        self.total_nfe += stats["nfe"]
        stats["total_nfe"] = self.total_nfe
        if not math.isfinite(stats["loss"]):
            raise FloatingPointError(f"non-finite loss at iteration {it}")
        self.iteration += 1
        return stats

    _SUMMED = ("flat_trees", "nfe", "edges", "parents", "forwards")
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
        """Deterministic ODE samples on fixed (prompt, noise) pairs: mean reward and diversity
        (mean pairwise RMS distance between the images of one prompt). Not counted as training time."""
        prompts = prompts or self.eval_prompts
        seeds = seeds or self.cfg.eval_seeds
        cfg = self.cfg
        was_training = self.policy.model.training
        self.policy.model.eval()
        all_p = [p for p in prompts for _ in range(seeds)]
        gen = torch.Generator().manual_seed(987654321)
        noise = torch.randn((len(all_p), *self.policy.latent_shape()), generator=gen).to(self.policy.device)
        cond = self.policy.encode_prompts(all_p)
        sig = self.policy.sigmas(cfg.tree.steps).to(self.policy.device)
        den = Denoiser(self.policy, cond, cfg.cfg, NFECounter())
        x = self._run(lambda: ode_solve(den, initial_latent(self.policy, noise, sig[0]), sig, torch.arange(len(all_p)),
                                        "euler", prediction=self.policy.prediction))
        images = self.policy.decode(x)
        raw = self.score(images, all_p)
        total = weighted_raw(raw, self.weights)
        flat = images.flatten(1).reshape(len(prompts), seeds, -1)
        if seeds > 1:
            d = torch.cdist(flat, flat) / math.sqrt(flat.shape[-1])
            div = float(d.sum() / (len(prompts) * seeds * (seeds - 1)))
        else:
            div = 0.0
        self.policy.model.train(was_training)
        out = {"iteration": self.iteration, "train_time": self.train_time, "total_nfe": self.total_nfe,
               "eval_reward": float(total.mean()), "eval_diversity": div,
               **{f"eval/{k}": float(v.mean()) for k, v in raw.items()}}
        if return_images:
            out["images"] = images.cpu()
        return out

    # ------------------------------------------------------------------ files
    def lora_weights(self):
        return self.own_lora.weights() if self.own_lora is not None else extract_lora(self.policy.model)

    def load_lora_weights(self, w) -> None:
        if self.own_lora is not None:
            self.own_lora.load(w)
        else:
            load_into_model(self.policy.model, w)

    def lora_tensors(self, fmt: str = "comfy") -> dict:
        w = self.lora_weights()
        if fmt == "comfy":
            own = getattr(self.policy, "comfy_lora_state_dict", None)  # diffusers models: ComfyUI's key names
            return own(w) if own is not None else to_comfy(w)
        from .lora import to_peft
        return to_peft(w)

    def metadata(self) -> dict:
        return {"treegrpo.method": self.cfg.tree.method, "treegrpo.tree_config": self.cfg.tree.__dict__,
                "treegrpo.step": str(self.iteration), "treegrpo.base_model": self.base_model_name,
                "treegrpo.run_name": self.cfg.run_name, "treegrpo.lora_alpha": str(self.cfg.lora.alpha),
                "treegrpo.lora_rank": str(self.cfg.lora.rank), "treegrpo.backend": self.cfg.backend}

    def save_lora(self, path: Optional[str] = None, fmt: str = "comfy") -> str:
        path = path or os.path.join(self.out, f"{self.cfg.run_name}.safetensors")
        if self.rank != 0:
            return path
        return save_lora_file(path, self.lora_tensors(fmt), self.metadata())

    def checkpoint_state(self) -> dict:
        return {"iteration": self.iteration, "lora": {k: v.detach().cpu().clone() for k, v in
                                                       zip(self._param_names(), self.params)},
                "optimizer": self.optimizer.state_dict(), "history": json.dumps(self.history),
                "evals": json.dumps(self.evals), "train_time": self.train_time, "total_nfe": self.total_nfe,
                "config": json.dumps(self.cfg.to_dict(), default=str), "run_name": self.cfg.run_name,
                "torch_rng": torch.get_rng_state(), "python_rng": json.dumps(random.getstate()),
                "numpy_rng": json.dumps(_numpy_state()),
                "reward_stats": json.dumps(self.history[-1] if self.history else {})}

    def _param_names(self) -> list[str]:
        ids = {id(p): n for n, p in self.policy.model.named_parameters()}
        return [ids.get(id(p), f"param{i}") for i, p in enumerate(self.params)]

    def save_checkpoint(self) -> Optional[str]:
        """Write ``checkpoints/<run>-<iteration>.pt`` atomically and keep the last ``keep_checkpoints``."""
        if self.rank != 0:
            return None
        folder = os.path.join(self.out, "checkpoints")
        path = os.path.join(folder, f"{self.cfg.run_name}-{self.iteration:07d}.pt")
        state = self.checkpoint_state()
        atomic_write(path, lambda tmp: torch.save(state, tmp))
        old = sorted(glob.glob(os.path.join(folder, f"{self.cfg.run_name}-*.pt")))
        for p in old[: -self.cfg.keep_checkpoints]:
            os.unlink(p)
        return path

    def latest_checkpoint(self) -> Optional[str]:
        found = sorted(glob.glob(os.path.join(self.out, "checkpoints", f"{self.cfg.run_name}-*.pt")))
        return found[-1] if found else None

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("run_name") != self.cfg.run_name:
            raise ValueError(f"checkpoint {path} belongs to run {state.get('run_name')!r}, not {self.cfg.run_name!r}")
        names = self._param_names()
        with torch.no_grad():
            for n, p in zip(names, self.params):
                if n not in state["lora"] or state["lora"][n].shape != p.shape:
                    raise ValueError(f"checkpoint {path} does not fit the model: parameter {n}")
                p.copy_(state["lora"][n])
        self.optimizer.load_state_dict(state["optimizer"])  # the lr is re-set from (iteration, train_time)
        self.iteration = int(state["iteration"])
        self.history = json.loads(state["history"])
        self.evals = json.loads(state["evals"])
        self.train_time = float(state["train_time"])
        self.total_nfe = int(state["total_nfe"])
        torch.set_rng_state(state["torch_rng"])
        st = json.loads(state["python_rng"])
        random.setstate((st[0], tuple(st[1]), st[2]))
        if "numpy_rng" in state:
            _set_numpy_state(json.loads(state["numpy_rng"]))

    def claim_output_dir(self) -> None:
        """Record this run in ``<output_dir>/run.json``; refuse a folder that holds a different run's files."""
        if self.rank != 0:
            return
        path = os.path.join(self.out, "run.json")
        me = {"run_name": self.cfg.run_name, "base_model": self.base_model_name}
        if os.path.exists(path):
            try:
                other = json.load(open(path, encoding="utf-8"))
            except (OSError, ValueError):
                other = {}
            if other.get("run_name") != me["run_name"] or other.get("base_model") != me["base_model"]:
                raise ValueError(f"output_dir {self.out!r} holds run {other.get('run_name')!r} on "
                                 f"{other.get('base_model')!r}; this is run {me['run_name']!r} on {me['base_model']!r}. "
                                 "Choose another output_dir (or run_name) so that nothing is overwritten")
        atomic_write_json(path, me)

    def archive_old_checkpoints(self) -> None:
        """A fresh (not resumed) run moves earlier checkpoints of the same name aside instead of mixing with
        or deleting them: ``checkpoints/previous-<time>/``."""
        if self.rank != 0:
            return
        folder = os.path.join(self.out, "checkpoints")
        old = sorted(glob.glob(os.path.join(folder, f"{self.cfg.run_name}-*.pt")))
        if not old:
            return
        dest = os.path.join(folder, f"previous-{time.strftime('%Y%m%d-%H%M%S')}")
        os.makedirs(dest, exist_ok=True)
        for p in old:
            os.replace(p, os.path.join(dest, os.path.basename(p)))

    def _write_logs(self) -> None:
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
    def train(self, iterations: Optional[int] = None, resume: bool = False) -> dict:
        """Run until ``iterations`` (default ``cfg.iterations``) or the time budget; returns a summary.

        On interrupt or error a checkpoint of the last completed iteration is written before raising."""
        cfg = self.cfg
        total = iterations or cfg.iterations
        self.claim_output_dir()
        if resume:
            ck = self.latest_checkpoint()
            if ck:
                self.load_checkpoint(ck)
        else:
            self.archive_old_checkpoints()
        bar = None
        if self.progress and self.rank == 0:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, initial=self.iteration, desc=f"{cfg.tree.method}", unit="it")
        try:
            evaluating = bool(cfg.eval_every or cfg.eval_every_s) and self.rank == 0
            if evaluating and self.iteration == 0 and not self.evals:
                self.evals.append(self.evaluate())
            next_eval_t = _next_multiple(self.train_time, cfg.eval_every_s)
            while self.iteration < total:
                if cfg.time_budget_s and self.train_time >= cfg.time_budget_s:
                    break
                self._check_stop()
                stats = self.train_step()
                self.history.append(stats)
                if self.iteration_callback:
                    self.iteration_callback(stats)
                if bar:
                    bar.update(1)
                    bar.set_postfix(reward=f"{stats['reward']:.3f}", loss=f"{stats['loss']:.2e}")
                due_t = self.train_time >= next_eval_t
                if due_t:
                    next_eval_t = _next_multiple(self.train_time, cfg.eval_every_s)
                if evaluating and (due_t or (cfg.eval_every and self.iteration % cfg.eval_every == 0)):
                    self.evals.append(self.evaluate())
                if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
                    self._write_logs()
        except BaseException:
            self.save_checkpoint()
            self._write_logs()
            raise
        finally:
            if bar:
                bar.close()
        if (cfg.eval_every or cfg.eval_every_s) and self.rank == 0 and \
                (not self.evals or self.evals[-1]["iteration"] != self.iteration):
            self.evals.append(self.evaluate())
        self._write_logs()
        return {"iterations": self.iteration, "train_time": self.train_time, "total_nfe": self.total_nfe,
                "final_eval": self.evals[-1] if self.evals else None}
