"""The batched tree sampler (docs/design.md §1).

A batch of trees is stored per *level*: level j of the window (j = 0..w) holds the nodes of every
tree at noise level ``σ[s + j]``, tree-major (node ``i`` of tree ``t`` has global index
``t·n_j + i``). ``parents[j]`` maps level j+1 to level j. One denoiser call evaluates a whole level of
all trees; the shared ODE prefix is computed once per tree; the ODE tail runs once per leaf.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from .config import TreeConfig, schedule_at
from .loss import kl_to_reference
from .policy import Policy, select_cond
from .sde import SDEKernel, ode_step


@dataclass
class NFECounter:
    """Denoiser evaluations per sample (CFG counts 2) and batched calls."""

    nfe: int = 0
    calls: int = 0
    rows: list = field(default_factory=list)

    def add(self, batch: int, cfg: float) -> None:
        self.nfe += batch * (2 if cfg != 1.0 else 1)
        self.calls += 1
        self.rows.append(batch)


@dataclass
class TreeBatch:
    """A batch of sampled trees, ready for scoring and training. Shapes: ``n_j`` nodes per level."""

    sigmas: torch.Tensor                  # (T+1,) schedule used
    window_start: int                     # s
    branching: list[int]                  # children per node at each window step
    cond: Any                             # conditioning pytree, leading dim = tree
    prompts: list[str]                    # (n_trees,)
    prompt_ids: torch.Tensor              # (n_trees,) long, index of each tree's prompt
    latents: list[torch.Tensor]           # w+1 levels: (n_j, C, H, W) at σ[s+j]
    parents: list[torch.Tensor]           # w: (n_{j+1},) long, parent index in level j
    logp_old: list[torch.Tensor]          # w: (n_{j+1},) behaviour log-prob of the edge into each node
    std: list[torch.Tensor]               # w: (n_j,) SDE std of the step out of level j (per parent)
    leaves: torch.Tensor                  # (n_w, C, H, W) clean latents after the ODE tail
    kernel: SDEKernel                     # the SDE transition the window was sampled with (the update reuses it)
    nfe: int = 0
    calls: int = 0
    advantages: Optional[list[torch.Tensor]] = None   # w: (n_{j+1},) edge advantages (after backup)
    leaf_advantages: Optional[torch.Tensor] = None    # (n_w,) z-scored leaf advantages (the matching losses')
    trainable: Optional[torch.Tensor] = None          # (n_trees,) bool, False for flat trees
    rewards: Optional[dict] = None                    # name -> (n_leaves,) raw rewards
    stats: dict = field(default_factory=dict)

    @property
    def prediction(self) -> str:
        return self.kernel.prediction

    @property
    def reduction(self) -> str:
        return self.kernel.reduction

    @property
    def n_trees(self) -> int:
        return len(self.prompts)

    @property
    def width(self) -> int:
        return len(self.parents)

    def tree_of(self, level: int) -> torch.Tensor:
        """(n_level,) tree index of each node at ``level``."""
        n = self.latents[level].shape[0] // self.n_trees
        return torch.arange(self.n_trees, device=self.leaves.device).repeat_interleave(n)

    @property
    def leaf_tree(self) -> torch.Tensor:
        return self.tree_of(self.width)

    @property
    def leaf_prompts(self) -> list[str]:
        per = self.leaves.shape[0] // self.n_trees
        return [p for p in self.prompts for _ in range(per)]


def window_kernel(policy: Policy, cfg: TreeConfig, sigmas: torch.Tensor) -> SDEKernel:
    """The SDE transition of ``policy``'s window steps under ``cfg`` on the schedule ``sigmas`` (T+1,) (its σ_1 is the
    flow step's out of σ = 1)."""
    return SDEKernel(policy.prediction, cfg.noise_level, cfg.eta, cfg.logprob_reduction,
                     float(sigmas[1]) if sigmas.numel() > 1 else None)


def level_sizes(branching: list[int], leaf_cap: int = 0) -> list[int]:
    """Nodes per tree at each window level (w+1 counts, the root's 1 first), keeping the first ``leaf_cap``
    leaves and their ancestors."""
    full = [math.prod(branching[:j]) for j in range(len(branching) + 1)]
    if not leaf_cap or leaf_cap >= full[-1]:
        return full
    return [min(full[j], math.ceil(leaf_cap / math.prod(branching[j:]))) for j in range(len(full))]


def expected_nfe(cfg: TreeConfig, window_start: Optional[int] = None, guidance: float = 1.0) -> int:
    """Denoiser evaluations of one tree: ``s + Σ_j n_j + n_w·tail`` (×2 with CFG).

    Without a leaf cap and with the default tail this is ``s + Σ_{j<w} k^j + k^w·(T−s−w)``."""
    s = cfg.window_start if window_start is None else window_start
    if cfg.method == "ode":   # G independent deterministic samples
        return cfg.leaves * tail_nfe(cfg, 0) * (2 if guidance != 1.0 else 1)
    n = level_sizes(cfg.branching, cfg.leaf_cap)
    tail = tail_nfe(cfg, s)
    per = s + sum(n[:-1]) + n[-1] * tail
    return per * (2 if guidance != 1.0 else 1)


def tail_sigmas(sigmas: torch.Tensor, start: int, tail_steps: int) -> torch.Tensor:
    """Noise levels of the ODE tail from ``sigmas[start]`` to 0: the schedule's own (``sigmas`` (T+1,) from
    ``start`` on), or (tail_steps+1,) levels re-spaced uniformly in the schedule's index (keeps its shift)."""
    rest = sigmas[start:]
    if tail_steps <= 0 or tail_steps == rest.numel() - 1:
        return rest
    pos = torch.linspace(0, rest.numel() - 1, tail_steps + 1, dtype=torch.float64)
    lo = pos.floor().long().clamp(max=rest.numel() - 2)
    frac = (pos - lo).to(rest.dtype)
    return rest[lo] + frac * (rest[lo + 1] - rest[lo])


def tail_nfe(cfg: TreeConfig, window_start: int) -> int:
    """Denoiser calls of one leaf's ODE tail after a window at ``window_start`` (without CFG's factor 2)."""
    n_steps = cfg.tail_steps or (cfg.steps - window_start - (0 if cfg.method == "ode" else cfg.window_width))
    if cfg.tail_solver == "heun":
        return max(0, 2 * n_steps - 1)  # the last step (to σ = 0) is Euler
    return n_steps


def at_iteration(cfg: TreeConfig, iteration: int) -> TreeConfig:
    """The tree of one iteration: ``cfg`` with the ``tail_steps`` that ``tail_steps_schedule`` sets from the last
    listed iteration <= ``iteration`` on (``cfg`` itself when there is no schedule)."""
    if not cfg.tail_steps_schedule:
        return cfg
    return replace(cfg, tail_steps=schedule_at(cfg.tail_steps_schedule, iteration, cfg.tail_steps),
                   tail_steps_schedule=[])


def window_start_at(cfg: TreeConfig, iteration: int, rng: Optional[random.Random] = None) -> int:
    """Window position for an iteration: fixed, sliding (move by ``window_shift`` every
    ``window_every`` iterations, wrapping within [window_start, max_start]) or random."""
    lo, hi = cfg.window_start, cfg.max_start
    if cfg.window_schedule == "fixed" or hi == lo:
        return lo
    if cfg.window_schedule == "sliding":
        return lo + (iteration // cfg.window_every * cfg.window_shift) % (hi - lo + 1)
    return (rng or random).randint(lo, hi)


class Denoiser:
    """Policy ``denoise`` with NFE counting and optional chunking of huge levels."""

    def __init__(self, policy: Policy, cond: Any, guidance: float, counter: NFECounter, max_batch: int = 0):
        self.policy, self.cond, self.guidance, self.counter, self.max_batch = policy, cond, guidance, counter, max_batch

    def __call__(self, x: torch.Tensor, sigma: float | torch.Tensor, tree_idx: torch.Tensor) -> torch.Tensor:
        sig = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(x.shape[0]).contiguous()
        chunk = self.max_batch or x.shape[0]
        outs = []
        for i in range(0, x.shape[0], chunk):
            sl = slice(i, i + chunk)
            self.counter.add(x[sl].shape[0], self.guidance)
            outs.append(self.policy.denoise(x[sl], sig[sl], select_cond(self.cond, tree_idx[sl]), self.guidance))
        return torch.cat(outs) if len(outs) > 1 else outs[0]


def _log_snr(sigma: torch.Tensor, prediction: str) -> torch.Tensor:
    """λ = log(α/σ): α = 1 − σ for flow models, α = 1 in the sigma space of epsilon models."""
    alpha = 1 - sigma if prediction == "flow" else torch.ones_like(sigma)
    return torch.log(alpha) - torch.log(sigma)


def euler_solve(den: Denoiser, x: torch.Tensor, sigmas: torch.Tensor, tree_idx: torch.Tensor,
                callback: Optional[Callable[[], None]] = None, prediction: str = "flow") -> torch.Tensor:
    """Euler (DDIM η = 0 for epsilon models) along ``sigmas`` (n+1,), decreasing: 1 NFE per step. ``x`` (B, ...)
    at ``sigmas[0]``, ``tree_idx`` (B,) each row's tree (its conditioning); returns ``x`` at ``sigmas[-1]``."""
    for i in range(sigmas.numel() - 1):
        x = ode_step(x, den(x, sigmas[i], tree_idx), sigmas[i], sigmas[i + 1])
        if callback:
            callback()
    return x


def heun_solve(den: Denoiser, x: torch.Tensor, sigmas: torch.Tensor, tree_idx: torch.Tensor,
               callback: Optional[Callable[[], None]] = None, prediction: str = "flow") -> torch.Tensor:
    """Heun's second-order method: 2 NFE per step, Euler for the last step to σ = 0 (shapes as
    :func:`euler_solve`)."""
    for i in range(sigmas.numel() - 1):
        s, sn = sigmas[i], sigmas[i + 1]
        x0 = den(x, s, tree_idx)
        if sn > 0:
            d = (x - x0) / s
            x_e = x + (sn - s) * d
            d2 = (x_e - den(x_e, sn, tree_idx)) / sn
            x = x + (sn - s) * (d + d2) / 2
        else:
            x = ode_step(x, x0, s, sn)
        if callback:
            callback()
    return x


def dpmpp_2m_solve(den: Denoiser, x: torch.Tensor, sigmas: torch.Tensor, tree_idx: torch.Tensor,
                   callback: Optional[Callable[[], None]] = None, prediction: str = "flow") -> torch.Tensor:
    """DPM-Solver++(2M) in data prediction: 1 NFE per step, first order at the first step and x̂0 at σ = 0.
    Written in the exponential-integrator form, which holds for flow and sigma-space epsilon models alike (shapes
    as :func:`euler_solve`)."""
    old_x0, old_h = None, None
    for i in range(sigmas.numel() - 1):
        s, sn = sigmas[i], sigmas[i + 1]
        x0 = den(x, s, tree_idx)
        if sn == 0:
            x = x0
        else:
            h = _log_snr(sn, prediction) - _log_snr(s, prediction)
            d = x0 if old_x0 is None else x0 + (x0 - old_x0) * (h / old_h) / 2  # (1 + 1/2r)·D − 1/2r·D_old
            x = (sn / s) * x + (1 - sn / s) * d
            old_h = h
        old_x0 = x0
        if callback:
            callback()
    return x


#: the ODE solvers by name (``TreeConfig.tail_solver``), each ``(den, x, sigmas, tree_idx, callback, prediction)``
ODE_SOLVERS = {"euler": euler_solve, "heun": heun_solve, "dpmpp_2m": dpmpp_2m_solve}


def mirror_siblings(eps: torch.Tensor, branch: int, per_tree: int) -> torch.Tensor:
    """Antithetic children: within each parent's ``branch`` children (tree-major, ``per_tree`` children per
    tree, ordered by parent), child 2i+1 gets −ε of child 2i; an odd last child keeps its own draw.
    ``eps`` (n_children, ...) standard normal → same shape, every row still standard normal."""
    if branch < 2:
        return eps
    rank = torch.arange(eps.shape[0], device=eps.device) % per_tree % branch
    odd = (rank % 2 == 1).nonzero().flatten()
    out = eps.clone()
    out[odd] = -eps[odd - 1]
    return out


def schedule(policy: Policy, steps: int, sigmas: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The noise levels to sample with, (steps + 1,) float32 on the policy's device: ``sigmas`` when given (a run
    keeps the schedule it was trained with when it moves between front-ends), else ``policy.sigmas(steps)``."""
    if sigmas is None:
        sigmas = policy.sigmas(steps)
    elif sigmas.numel() != steps + 1:
        raise ValueError(f"a schedule of {sigmas.numel()} noise levels does not fit {steps} steps (needs {steps + 1})")
    return sigmas.to(policy.device, torch.float32)


@torch.no_grad()
def sample_trees(policy: Policy, prompts: list[str], cfg: TreeConfig, *, cond: Any = None,
                 prompt_ids: Optional[torch.Tensor] = None, window_start: Optional[int] = None,
                 guidance: float = 1.0, generator: Optional[torch.Generator] = None,
                 noise: Optional[torch.Tensor] = None, max_batch: int = 0,
                 callback: Optional[Callable[[], None]] = None, sigmas: Optional[torch.Tensor] = None) -> TreeBatch:
    """Sample one tree per entry of ``prompts`` (repeat a prompt for several trees).

    ``cond``: conditioning per tree (default: ``policy.encode_prompts(prompts)``).
    ``noise``: initial noise (n_trees, C, H, W) (default: drawn from ``generator``).
    ``generator``: one ``torch.Generator``, or a list of one per tree (then each tree's SDE noise is the
    same whichever other trees share the batch: data-parallel ranks sample exactly what one process would).
    Siblings are mirrored in pairs (noise ε, −ε) when ``cfg.mirrored`` (the default for trees; docs/design.md §1's
    independent children with ``antithetic=False``): same marginals and log-probs, less noisy comparisons.
    ``callback`` is called after every step (progress bars, interrupt checks).
    ``sigmas``: the (T+1,) noise levels (default: the policy's schedule; see :func:`schedule`)."""
    n_trees = len(prompts)
    if n_trees == 0:
        raise ValueError("sample_trees: empty prompt list")
    s = cfg.window_start if window_start is None else window_start
    w = cfg.window_width
    if s + w > cfg.steps:
        raise ValueError(f"window_start {s} + window_width {w} exceeds steps {cfg.steps}")
    dev = policy.device
    sigmas = schedule(policy, cfg.steps, sigmas)
    if cond is None:
        cond = policy.encode_prompts(prompts)
    shape = policy.latent_shape()
    if isinstance(generator, (list, tuple)) and len(generator) != n_trees:
        raise ValueError(f"sample_trees: {len(generator)} generators for {n_trees} trees")
    if noise is None:
        gens = generator if isinstance(generator, (list, tuple)) else [generator]
        noise = torch.cat([torch.randn((n_trees if len(gens) == 1 else 1, *shape), generator=g, device="cpu")
                           for g in gens]).to(dev)
    counter = NFECounter()
    den = Denoiser(policy, cond, guidance, counter, max_batch)
    trees = torch.arange(n_trees, device=dev)
    if cfg.method == "ode":
        return _sample_ode_groups(policy, cfg, den, counter, sigmas, noise, cond, prompts, prompt_ids, generator,
                                  callback)

    # shared ODE prefix, once per tree
    x = policy.noise_scaling(sigmas[0], noise.float())
    x = euler_solve(den, x, sigmas[: s + 1], trees, callback)

    # the SDE window: every frontier node gets b_j children
    branching = cfg.branching
    sizes = level_sizes(branching, cfg.leaf_cap)
    latents, parents, logps, stds = [x], [], [], []
    kernel = window_kernel(policy, cfg, sigmas)
    for j, b in enumerate(branching):
        sig, sig_n = sigmas[s + j], sigmas[s + j + 1]
        tree_idx = torch.arange(n_trees, device=dev).repeat_interleave(sizes[j])
        x0 = den(x, sig, tree_idx)
        n_j = x.shape[0]
        mean, std = kernel.mean_std(x, x0, sig.expand(n_j), sig_n.expand(n_j))
        if not bool((std > 0).all()):
            raise ValueError(f"SDE std is 0 at window step {s + j} (sigma {float(sig):.4g} -> {float(sig_n):.4g}): "
                             "move the window away from the final step")
        local = torch.arange(sizes[j + 1], device=dev) // b                        # parent within its tree
        parent = (torch.arange(n_trees, device=dev)[:, None] * sizes[j] + local[None]).flatten()
        if isinstance(generator, (list, tuple)):  # one generator per tree: a tree's noise ignores its batch
            eps = torch.cat([torch.randn((sizes[j + 1], *shape), generator=g, device="cpu") for g in generator]).to(dev)
        else:
            eps = torch.randn((parent.numel(), *shape), generator=generator, device="cpu").to(dev)
        if cfg.mirrored:
            eps = mirror_siblings(eps, b, sizes[j + 1])
        x_child = mean[parent] + std[parent] * eps
        logps.append(kernel.logprob(x_child, mean[parent], std[parent]))
        parents.append(parent)
        stds.append(std.flatten())
        x = x_child
        latents.append(x)
        if callback:
            callback()

    # ODE tail, one per leaf
    tail = tail_sigmas(sigmas, s + w, cfg.tail_steps)
    leaf_tree = torch.arange(n_trees, device=dev).repeat_interleave(sizes[-1])
    leaves = ODE_SOLVERS[cfg.tail_solver](den, x, tail, leaf_tree, callback, policy.prediction)

    return TreeBatch(
        sigmas=sigmas, window_start=s, branching=branching, cond=cond, prompts=list(prompts),
        prompt_ids=prompt_ids if prompt_ids is not None else torch.arange(n_trees),
        latents=latents, parents=parents, logp_old=logps, std=stds, leaves=leaves, kernel=kernel,
        nfe=counter.nfe, calls=counter.calls,
    )


def _sample_ode_groups(policy: Policy, cfg: TreeConfig, den, counter, sigmas, noise, cond, prompts, prompt_ids,
                       generator, callback) -> TreeBatch:
    """``method='ode'``: G deterministic samples per "tree" (a group of one prompt) from G independent initial noises
    (``noise`` gives each group's first; the others come from ``generator``), solved by the tail solver over the
    whole schedule (``tail_steps`` re-spaced). A TreeBatch without a window: the leaves, no edges (for the
    matching losses). NFE: ``G·T`` per group (``tail_steps`` for T when set)."""
    n_trees, g = len(prompts), cfg.leaves
    shape = tuple(noise.shape[1:])
    gens = generator if isinstance(generator, (list, tuple)) else [generator] * n_trees
    extra = [torch.randn((g - 1, *shape), generator=gen, device="cpu") for gen in gens]
    init = torch.cat([torch.cat([noise[i:i + 1].cpu().float(), extra[i]]) for i in range(n_trees)]).to(noise.device)
    x = policy.noise_scaling(sigmas[0], init)
    group = torch.arange(n_trees, device=x.device).repeat_interleave(g)
    leaves = ODE_SOLVERS[cfg.tail_solver](den, x, tail_sigmas(sigmas, 0, cfg.tail_steps), group, callback,
                                          policy.prediction)
    kernel = window_kernel(policy, cfg, sigmas)
    return TreeBatch(sigmas=sigmas, window_start=0, branching=[], cond=cond, prompts=list(prompts),
                     prompt_ids=prompt_ids if prompt_ids is not None else torch.arange(n_trees),
                     latents=[leaves], parents=[], logp_old=[], std=[], leaves=leaves, kernel=kernel,
                     nfe=counter.nfe, calls=counter.calls)


@torch.no_grad()
def sample_ode_window_kl(policy: Policy, prompts: list[str], noise: torch.Tensor, cfg: TreeConfig,
                         guidance: float = 1.0, sigmas: Optional[torch.Tensor] = None,
                         callback: Optional[Callable[[], None]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Euler samples of :func:`sample_ode` (same floats) and, along the way, an estimate of the KL from the
    trained policy to the reference (LoRA off): at each SDE-window step ``s .. s+w−1`` the KL between the two SDE
    transitions out of the current state, ``‖μ_θ − μ_ref‖²/(2·std²)`` reduced like the log-probs, summed over the
    window. Returns (latents (B, ...), kl (B,)); ``w`` extra denoiser calls with the LoRA disabled. ``callback``:
    called after every step (progress, interrupt)."""
    sig = schedule(policy, cfg.steps, sigmas)
    den = Denoiser(policy, policy.encode_prompts(prompts), guidance, NFECounter())
    kernel = window_kernel(policy, cfg, sig)
    idx = torch.arange(len(prompts))
    x = policy.noise_scaling(sig[0], noise.to(policy.device).float())
    kl = torch.zeros(len(prompts), device=x.device)
    window = range(cfg.window_start, cfg.window_start + cfg.window_width)
    for i in range(sig.numel() - 1):
        x0 = den(x, sig[i], idx)
        if i in window:
            with policy.lora_disabled():
                x0_ref = den(x, sig[i], idx)
            s, sn = sig[i].expand(x.shape[0]), sig[i + 1].expand(x.shape[0])
            mean, std = kernel.mean_std(x, x0, s, sn)
            kl += kl_to_reference(mean, kernel.mean_std(x, x0_ref, s, sn)[0], std, kernel.reduction)
        x = ode_step(x, x0, sig[i], sig[i + 1])
        if callback:
            callback()
    return x, kl


def sample_ode(policy: Policy, prompts: list[str], noise: torch.Tensor, steps: int, guidance: float = 1.0,
               callback: Optional[Callable[[], None]] = None, sigmas: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Deterministic Euler samples (clean latents, (B, C, H, W)) from initial ``noise`` (B, C, H, W), one per
    prompt: what evaluation and ``treegrpo sample`` draw. Call inside ``policy.run`` for backends that need it."""
    sig = schedule(policy, steps, sigmas)
    den = Denoiser(policy, policy.encode_prompts(prompts), guidance, NFECounter())
    x = policy.noise_scaling(sig[0], noise.to(policy.device).float())
    return euler_solve(den, x, sig, torch.arange(len(prompts)), callback, policy.prediction)
