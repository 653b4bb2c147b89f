"""Accelerator memory: measured, predicted and planned (docs/design.md §7).

A training iteration has four phases whose peaks differ: sampling the trees (no-grad denoiser calls), decoding the
leaves (VAE), scoring them (reward models) and the update (forward + backward through the LoRA). The model here is
built from measurements of the policy the user loaded, at the latent size of the run:

- **weights**: bytes of the parameters and buffers each component keeps on the accelerator (by their dtypes);
- **working sets**: the peak bytes of tensors allocated during one denoiser call (no grad), one forward + backward
  (with and without gradient checkpointing), one VAE decode and one reward call, each measured at the row counts
  the plan may choose (:class:`Curve`);
- **optimiser state**: the LoRA in float32 with its gradient and AdamW's two moments.

The working sets are measured with :class:`LiveBytes` (every tensor storage allocated while it is active, alive until
its last tensor dies: what CUDA's ``memory_allocated`` counts) under torch's ``FakeTensorMode``, so a probe of Flux
at 1024² allocates nothing and costs no compute. :func:`plan` then picks the fastest settings whose predicted peak
fits the free memory, or says what to change.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GB = 1e9


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the tensor storages created while active (real or fake tensors): ``now`` and ``peak``.

    A storage counts from the op that creates it until its last tensor is freed (views share it). Tensors that
    existed before entering are not counted."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, list[int]] = {}
        self.now = 0
        self.peak = 0

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        entry = self._live.get(key)
        if entry is not None:
            entry[1] += 1
        else:
            n = st.nbytes()
            self._live[key] = [n, 1]
            self.now += n
            self.peak = max(self.peak, self.now)
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self._live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self._track(t)
        return out


def needs_values(e: BaseException) -> bool:
    """Whether ``e`` is a shape-only (fake) tensor refusing to give its values: ``.numpy()``, ``.item()`` and the
    like, which a reward computed on the host (numpy, PIL) needs."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    return isinstance(e, DataDependentOutputException) or (
        isinstance(e, RuntimeError) and "not supported for tensor subclasses" in str(e))


def fake_mode():
    """torch's FakeTensorMode that also accepts the real weights of a loaded model (converted, not copied)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _mode(fake):
    """``fake``: True (a new fake mode), False (real tensors) or a FakeTensorMode to reuse (the mode a fake model
    was built in)."""
    if fake is True:
        return fake_mode()
    return fake or contextlib.nullcontext()


def peak_of(fn: Callable[..., Any], inputs: Callable[[], tuple] = tuple, fake=True) -> int:
    """Peak bytes of the tensors ``fn(*inputs())`` allocates, not counting the inputs (``fake``: measured without
    allocating anything; see :func:`_mode`)."""
    with _mode(fake):
        args = inputs()
        with LiveBytes() as live:
            out = fn(*args)
            del out
    return live.peak


def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages among ``tensors``."""
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if st._cdata not in seen:
            seen.add(st._cdata)
            total += st.nbytes()
    return total


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each in its own dtype."""
    return tensor_bytes([*module.parameters(), *module.buffers()])


@dataclass(frozen=True)
class Curve:
    """Peak bytes of a call as a function of its rows, from measurements at some row counts: exact there,
    piecewise linear between them and linear beyond the last two (the rows of a call share nothing but the
    weights, but a fixed transient can dominate small calls, so a curve probed at 1 and 2 rows alone can
    under-predict 16)."""

    points: tuple   # ((rows, bytes), ...) sorted by rows

    @classmethod
    def linear(cls, base: float, per_row: float) -> "Curve":
        return cls(((1, base + per_row), (2, base + 2 * per_row)))

    def __call__(self, rows: int) -> float:
        if rows <= 0:
            return 0.0
        pts = self.points
        if len(pts) == 1:
            return float(pts[0][1]) * rows / pts[0][0]
        for (r0, y0), (r1, y1) in zip(pts, pts[1:]):
            if rows <= r1:
                break
        return float(y0 + (y1 - y0) * (rows - r0) / (r1 - r0))

    def scaled(self, factor: float) -> "Curve":
        return Curve(tuple((r, y * factor) for r, y in self.points))


@dataclass(frozen=True)
class Footprint:
    """Measured memory of one policy at one latent size (bytes). ``None``: the phase was not measured."""

    weights: dict                       # component -> bytes kept on the accelerator (denoiser, vae, rewards, ...)
    lora: int                           # trainable parameter bytes
    latent: int                         # one float32 latent row
    image: int                          # one decoded float32 image
    sample: Curve                       # one no-grad denoiser call of ``rows`` parents (CFG included)
    update: Curve                       # one forward + backward of ``rows`` parents
    update_ckpt: Optional[Curve]        # the same with gradient checkpointing (None: not available)
    decode: Optional[Curve] = None      # one VAE decode of ``rows`` latents
    reward: Optional[Curve] = None      # one call of the reward models on ``rows`` images
    denoiser_params: int = 0            # parameters of the denoiser (bytes per parameter: its weights' dtype)
    decode_tiled: Optional[Curve] = None  # the VAE decode in tiles (None: the backend has no tiled decode)

    def to_dict(self) -> dict:
        """Plain JSON-able data (curves as lists of [rows, bytes]); :meth:`from_dict` inverts it exactly."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Footprint":
        """The footprint :meth:`to_dict` wrote (a probe made on another machine: the fake probe depends only on the
        model's shapes and dtypes)."""
        kw = dict(data)
        for f in dataclasses.fields(cls):
            v = kw.get(f.name)
            if isinstance(v, dict) and "points" in v:
                kw[f.name] = Curve(tuple((r, y) for r, y in v["points"]))
        return cls(**kw)


@dataclass(frozen=True)
class Workload:
    """What one iteration asks of the accelerator."""

    trees: int                          # trees sampled per iteration (on this rank)
    branching: tuple                    # children per node at each window step
    sample_batch: int = 0               # rows per denoiser call while sampling (0 = a whole level at once)
    microbatch: int = 64                # parents per forward + backward
    decode_batch: int = 0               # latents per VAE decode call (0 = all leaves at once)
    reward_batch: int = 0               # images per reward-model call (0 = all leaves at once)
    checkpointing: bool = False
    offload_rewards: bool = False       # reward models on the CPU except while scoring
    tiled_decode: bool = False          # the VAE decodes in tiles (slower decode, bounded memory)

    @property
    def leaves(self) -> int:
        return self.trees * math.prod(self.branching)

    @property
    def stored_latents(self) -> int:
        """Latents a TreeBatch keeps: every window level plus the leaves."""
        n, level = 0, self.trees
        for b in self.branching:
            n += level
            level *= b
        return n + 2 * level

    @property
    def parents(self) -> int:
        return self.stored_latents - 2 * self.leaves

    @property
    def edges(self) -> int:
        return self.stored_latents - self.trees - self.leaves


PHASES = ("sample", "decode", "reward", "update")


def phases(fp: Footprint, wl: Workload) -> dict[str, tuple[float, float]]:
    """Per phase ``(bytes alive when it starts, bytes it allocates at its peak)``, for
    ``"sample"`` (the trees), ``"decode"`` (the leaves), ``"reward"`` and ``"update"``."""
    w = fp.weights
    rewards_w = w.get("rewards", 0)
    always = sum(v for k, v in w.items() if k not in ("vae", "rewards"))   # denoiser, text encoders, ...
    resident = always + 4 * fp.lora + (0 if wl.offload_rewards else rewards_w)   # LoRA, its grad, AdamW's moments
    tree = wl.stored_latents * fp.latent
    rows = min(wl.sample_batch or wl.leaves, wl.leaves)
    images = wl.leaves * fp.image
    dec, rb = min(wl.decode_batch or wl.leaves, wl.leaves), min(wl.reward_batch or wl.leaves, wl.leaves)
    work = fp.update_ckpt if wl.checkpointing else fp.update
    decode = fp.decode_tiled if wl.tiled_decode else fp.decode
    if work is None:
        raise ValueError("this model cannot use gradient checkpointing")
    return {
        "sample": (resident, tree + 2 * rows * fp.latent + fp.sample(rows)),
        # the decode probe's peak includes its own output images, counted in ``images`` here
        "decode": (resident + tree + w.get("vae", 0), images + (decode(dec) - dec * fp.image if decode else 0.0)),
        "reward": (resident + tree + images + (rewards_w if wl.offload_rewards else 0),
                   fp.reward(rb) if fp.reward else 0.0),
        "update": (resident + tree, (wl.parents + wl.edges) * fp.latent + work(min(wl.microbatch, wl.parents))),
    }


def predict(fp: Footprint, wl: Workload) -> dict[str, float]:
    """Predicted peak bytes of each phase, weights included."""
    return {k: a + b for k, (a, b) in phases(fp, wl).items()}


def describe(peaks: dict[str, float], budget: float) -> str:
    phase = max(peaks, key=peaks.get)
    return f"planned peak {peaks[phase] / GB:.1f} of {budget / GB:.1f} GB ({phase})"


@dataclass(frozen=True)
class Plan:
    workload: Workload
    peaks: dict
    budget: float
    footprint: Optional[Footprint] = field(default=None, compare=False, repr=False)   # what it was planned from

    @property
    def peak(self) -> float:
        return max(self.peaks.values())

    def line(self) -> str:
        wl = self.workload
        parts = [describe(self.peaks, self.budget), "checkpointing " + ("on" if wl.checkpointing else "off"),
                 f"{wl.microbatch} parent{'s' if wl.microbatch != 1 else ''} per microbatch",
                 f"{wl.sample_batch or 'all'} rows per sampling call"]
        if wl.offload_rewards:
            parts.append("reward models on CPU while sampling and training")
        if wl.decode_batch > 1:
            parts.append(f"{wl.decode_batch} latents per decode")
        if wl.tiled_decode:
            parts.append("tiled VAE decode")
        if wl.reward_batch:
            parts.append(f"{wl.reward_batch} image{'s' if wl.reward_batch != 1 else ''} per reward call")
        return ", ".join(parts)


class MemoryPlanError(ValueError):
    """Nothing fits the memory: the message names the smallest change that would."""


def candidates(wl: Workload, fp: Footprint, *, checkpointing: Optional[bool] = None,
               offload_rewards: Optional[bool] = None, sample_batch: Optional[int] = None,
               microbatch: Optional[int] = None, tiled_decode: Optional[bool] = None) -> list[Workload]:
    """Settings to try, fastest first: each choice fixed when given (a user's override), else free. Checkpointing
    (1.49× the update time, measured on the CPU) is tried after halving the microbatch and the sampling batch; offloading the reward
    models (a host↔device copy per iteration) before checkpointing."""
    ckpt = [checkpointing] if checkpointing is not None else \
        [False, True] if fp.update_ckpt is not None else [False]
    off = [offload_rewards] if offload_rewards is not None else \
        [False, True] if fp.weights.get("rewards", 0) else [False]
    sb = [sample_batch] if sample_batch is not None else [0] + halvings(wl.leaves)[1:]
    mb = [microbatch] if microbatch is not None else halvings(min(wl.microbatch, max(wl.parents, 1)))
    db, rb = _batches(wl.decode_batch, wl.leaves), _batches(wl.reward_batch, wl.leaves)
    tiles = [tiled_decode] if tiled_decode is not None else [False, True] if fp.decode_tiled is not None else [False]
    out = []
    for c in ckpt:   # the innermost choice changes first: smaller decode and reward batches cost next to nothing,
        for o in off:    # a tiled decode little (the decode is a small part of an iteration)
            for m in mb:
                for s in sb:
                    for t in tiles:
                        for d in db:
                            for r in rb:
                                out.append(dataclasses.replace(wl, checkpointing=c, offload_rewards=o, microbatch=m,
                                                               sample_batch=s, tiled_decode=t, decode_batch=d,
                                                               reward_batch=r))
    return out


def _batches(batch: int, leaves: int) -> list[int]:
    """Decode / reward batch sizes to try: halvings of a set batch; 0 (all at once, the backend's own way) stays."""
    return halvings(min(batch, leaves)) if batch > 1 else [batch]


def size_text(n_bytes: float) -> str:
    """Bytes in the unit that shows them: ``11.52 GB``; ``850 MB`` / ``2.4 MB`` under 1 GB; ``12 kB`` under 0.1 MB."""
    if n_bytes >= GB:
        return f"{n_bytes / GB:.2f} GB"
    mb = n_bytes / 1e6
    if mb >= 10:
        return f"{mb:.0f} MB"
    return f"{mb:.1f} MB" if mb >= 0.1 else f"{n_bytes / 1e3:.0f} kB"


#: what a budget that the user set is called, for the refusal to name it
BUDGET_SETTING = "memory.budget_gb (the Train node's memory_budget_gb)"


def plan(fp: Footprint, wl: Workload, budget: float, *, suggest: Optional[Callable[[float], str]] = None,
         budget_source: str = "", **fixed) -> Plan:
    """The first of :func:`candidates` whose predicted peak fits ``budget`` bytes.

    ``fixed``: settings the user chose (``checkpointing``, ``offload_rewards``, ``sample_batch``, ``microbatch``).
    Raises :class:`MemoryPlanError` before any work when none fits; ``suggest(shortfall bytes)`` adds the
    smallest change that fits (the caller knows the resolution and the tree). ``budget_source``: the setting that
    set ``budget`` when the user did (the refusal names it), else the device's free memory."""
    best = None
    for cand in candidates(wl, fp, **fixed):
        peaks = predict(fp, cand)
        p = Plan(cand, peaks, budget, fp)
        if p.peak <= budget:
            return p
        if best is None or p.peak < best.peak:
            best = p
    short = best.peak - budget
    phase = max(best.peaks, key=best.peaks.get)
    if budget_source:
        msg = (f"not enough accelerator memory: the {phase} phase needs {size_text(best.peak)} and the budget "
               f"{budget_source} is {size_text(budget)} ({size_text(short)} short): raise it (0 = the GPU's own "
               "memory), or:")
    else:
        msg = (f"not enough accelerator memory: the {phase} phase needs {size_text(best.peak)} and "
               f"{size_text(budget)} are free ({size_text(short)} short), even with {best.line().split(', ', 1)[1]}.")
    if suggest is not None:
        msg += " " + suggest(short)
    raise MemoryPlanError(msg)


def _scaled(fp: Footprint, area: float) -> Footprint:
    """The footprint at ``area`` × the latent area: per-row working sets, latents and images scale with it (the
    tokens of a transformer, the pixels of a UNet); weights do not. An estimate: attention that is not
    memory-efficient grows faster."""
    def s(a: Optional[Curve]) -> Optional[Curve]:
        return None if a is None else a.scaled(area)
    return dataclasses.replace(fp, latent=int(fp.latent * area), image=int(fp.image * area), sample=s(fp.sample),
                               update=s(fp.update), update_ckpt=s(fp.update_ckpt), decode=s(fp.decode),
                               reward=fp.reward)


def smallest_change(fp: Footprint, wl: Workload, budget: float, fixed: Optional[dict] = None) -> str:
    """The least intrusive change that makes some plan fit, as advice: fewer trees per iteration, fp8 weights,
    a narrower tree, a lower resolution (in that order)."""
    fixed = fixed or {}

    def fits(f: Footprint, w: Workload) -> bool:
        return any(max(predict(f, c).values()) <= budget for c in candidates(w, f, **fixed))

    for trees in range(wl.trees - 1, 0, -1):
        if fits(fp, dataclasses.replace(wl, trees=trees)):
            return f"Train {trees} tree{'s' if trees > 1 else ''} per iteration instead of {wl.trees} (fewer prompts " \
                   f"per iteration), or free memory."
    den = fp.weights.get("denoiser", 0)
    fp8 = dataclasses.replace(fp, weights={**fp.weights, "denoiser": fp.denoiser_params or den // 2})
    if den and fp.denoiser_params and den > 1.5 * fp.denoiser_params and fits(fp8, wl):   # not fp8 already
        return "Load the model's weights in fp8 (UNETLoader weight_dtype fp8_e4m3fn), or free memory."
    one = dataclasses.replace(wl, trees=1)
    for width in range(len(wl.branching) - 1, 0, -1):
        br = wl.branching[:width]
        if fits(fp, dataclasses.replace(one, branching=br)):
            return f"Use 1 tree per iteration and a window of {width} step{'s' if width > 1 else ''} " \
                   f"({math.prod(br)} leaves per tree)."
    for side in (0.75, 0.5, 0.375, 0.25):
        if fits(_scaled(fp, side * side), one):
            return f"Lower the resolution to about {side:g}× the width and height, with 1 tree per iteration."
    held = sum(fp.weights.values()) + 4 * fp.lora
    return (f"Even one small tree at a quarter of the resolution does not fit: the weights (denoiser, VAE and reward "
            f"models, which are all on the device while the leaves are scored) with the LoRA and its optimiser state "
            f"hold {size_text(held)}. Use a GPU with more memory, a smaller model or a smaller reward model.")


def available_ram() -> float:
    """Bytes of host memory available now (0 when the system does not say)."""
    try:
        import psutil
        return float(psutil.virtual_memory().available)
    except ImportError:
        try:
            return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return 0.0


def size_guard(wl: Workload, latent_bytes: int, available: float, *, trees_per_prompt: int = 1,
               where: str = "memory") -> None:
    """Without a measured plan (the CPU, or before the model is loaded), a lower bound: the latents one iteration's
    trees keep must fit in ``available`` bytes of ``where``; else MemoryPlanError before anything is allocated, naming
    the smallest change that fits (:func:`latents_advice`)."""
    need = wl.stored_latents * latent_bytes
    if available and need > available:
        raise MemoryPlanError(
            f"one iteration keeps {wl.stored_latents:,} latents of {latent_bytes / 1024:.0f} KiB for its "
            f"{wl.trees:,} tree{'s' if wl.trees > 1 else ''} ({need / GB:.1f} GB) and only {available / GB:.1f} GB of {where} are available: "
            + latents_advice(wl, latent_bytes, available, trees_per_prompt))


def latents_advice(wl: Workload, latent_bytes: int, available: float, trees_per_prompt: int = 1) -> str:
    """The smallest change that makes one iteration's latents fit in ``available`` bytes: fewer prompts per iteration
    (the most that fit), else one prompt and a narrower window (the widest that fits), else a lower resolution."""
    per_tree = dataclasses.replace(wl, trees=1).stored_latents * latent_bytes
    trees = int(available // per_tree)
    if trees >= trees_per_prompt:
        prompts = trees // trees_per_prompt
        return (f"lower prompts_per_iter to at most {prompts:,} (the Train node's prompts_per_iteration, "
                f"--prompts-per-iter on the command line; {trees_per_prompt} tree"
                f"{'s' if trees_per_prompt > 1 else ''} per prompt): the latents of more do not fit, before any "
                "activation")
    if trees >= 1:
        return (f"set prompts_per_iter to 1 and trees_per_prompt to at most {trees}: the latents of more do not fit, "
                "before any activation")
    for width in range(len(wl.branching) - 1, 0, -1):
        one = Workload(trees=1, branching=wl.branching[:width])
        if one.stored_latents * latent_bytes <= available:
            return (f"use 1 prompt per iteration and a window of {width} step{'s' if width > 1 else ''} "
                    f"(window_width {width}, --tree.window_width on the command line: "
                    f"{math.prod(one.branching):,} leaves per tree), or a smaller "
                    "branch")
    one = Workload(trees=1, branching=wl.branching[:1])
    side = math.sqrt(available / (one.stored_latents * latent_bytes))
    return (f"even 1 prompt with a window of 1 step does not fit: lower the resolution to at most {side:.2f}x its width "
            "and height as well")


def accelerator_budget(device) -> float:
    """Bytes this process can use on ``device``: free memory plus what torch already holds (0 on the CPU)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0.0
    free, _ = torch.cuda.mem_get_info(device)
    return float(free + torch.cuda.memory_reserved(device))


# ------------------------------------------------------------------------------------------------- measuring


def halvings(n: int) -> list[int]:
    """``[n, n/2, n/4, ..., 1]`` (integer halving): the batch sizes a plan tries."""
    out = [max(1, int(n))]
    while out[-1] > 1:
        out.append(max(1, out[-1] // 2))
    return out


def probe_rows(wl: Workload) -> dict:
    """The row counts :func:`plan` can ask about for ``wl``, per phase (``probe_policy``'s keywords)."""
    return {"sample_rows": halvings(wl.leaves), "update_rows": halvings(min(wl.microbatch, max(wl.parents, 1))),
            "decode_rows": [b or wl.leaves for b in _batches(wl.decode_batch, wl.leaves)],
            "reward_rows": [b or wl.leaves for b in _batches(wl.reward_batch, wl.leaves)]}


def probe_policy(policy, prompt: str, guidance: float, params: Sequence[torch.Tensor], *,
                 rewards: Sequence[Callable] = (), fake=True, sample_rows: Sequence[int] = (1, 2),
                 update_rows: Sequence[int] = (1, 2), decode_rows: Sequence[int] = (1, 2),
                 reward_rows: Sequence[int] = (1, 2), kl: bool = False,
                 check: Optional[Callable[[], None]] = None) -> Footprint:
    """Measure ``policy`` (see the module docstring) at its latent size; ``params`` are the trainable LoRA
    parameters, ``rewards`` the reward callables ``(images (B, 3, H, W), prompts) -> (B,)``. Each phase's call is
    measured at the row counts given (and 1), so the curves are exact where the plan looks. ``fake=False``
    measures with real tensors (tests); a FakeTensorMode measures a model built in it (the benchmark). ``kl``: the
    update also runs the reference forward (LoRA off, no grad) while the graph of the policy's forward is alive,
    as the update does for ``optim.kl_beta > 0``. ``check``: called before each measurement (about a dozen; on a
    large model each takes seconds to a minute of CPU): it raises to stop the probe (a run's Cancel or Ctrl-C)."""
    check = check or (lambda: None)
    shape = tuple(policy.latent_shape())
    sigmas = policy.sigmas(10)
    params = list(params)
    was = bool(getattr(policy, "gradient_checkpointing", False))
    can_ckpt = policy.set_gradient_checkpointing(False)

    def denoise_peak(rows: int, grad: bool) -> int:
        cond = policy.encode_prompts([prompt] * rows)
        sigma = sigmas[[2] * rows]

        def call(x):
            with torch.set_grad_enabled(grad):
                out = policy.denoise(x, sigma.to(policy.device), cond, guidance)
                if grad and kl:
                    with torch.no_grad(), policy.lora_disabled():
                        policy.denoise(x, sigma.to(policy.device), cond, guidance)
                if grad:
                    torch.autograd.grad(out.float().sum(), params, allow_unused=True)
                return None

        def latents():
            return (torch.randn((rows, *shape), device=policy.device),)

        return policy.run(lambda: peak_of(call, latents, fake), max_batch=rows)

    def curve(fn: Callable[[int], int], rows: Sequence[int]) -> Curve:
        points = []
        for r in sorted({1, *(int(r) for r in rows)}):
            check()
            points.append((r, fn(r)))
        return Curve(tuple(points))

    sample = curve(lambda n: denoise_peak(n, False), sample_rows)
    update = curve(lambda n: denoise_peak(n, True), update_rows)
    update_ckpt = None
    if can_ckpt:
        policy.set_gradient_checkpointing(True)
        try:
            update_ckpt = curve(lambda n: denoise_peak(n, True), update_rows)
        finally:
            policy.set_gradient_checkpointing(was)

    # models are moved onto the device before the fake probes: a move under the fake mode would swap their
    # weights for fake ones
    policy.prepare_memory_probe()
    for r in rewards:
        if hasattr(r, "load"):
            r.load()
    decode = decode_tiled = reward = None
    image_shape = None

    @torch.no_grad()            # as the run decodes and scores its leaves: no graph (ComfyUI's VAE is an inference
    def decode_probe(latents):  # tensor, which cannot be saved for a backward)
        return policy.probe_decode(latents)

    def decode_curve():
        return curve(lambda n: peak_of(decode_probe, lambda: (torch.randn((n, *shape), device=policy.device),),
                                       fake), decode_rows)

    check()
    try:
        with _mode(fake):
            image_shape = tuple(decode_probe(torch.zeros((1, *shape), device=policy.device)).shape[1:])
        decode = decode_curve()
        if policy.set_tiled_decode(True):
            try:
                decode_tiled = decode_curve()
            finally:
                policy.set_tiled_decode(False)
    except ValueError:  # no VAE connected
        pass
    if rewards and image_shape is not None:
        on_host: set = set()      # rewards that read the images' values on the host (a JPEG size, an OCR engine)

        @torch.no_grad()
        def scores(imgs):
            out = []
            for k, r in enumerate(rewards):
                if k in on_host:
                    continue
                try:
                    out.append(r(imgs, [prompt] * imgs.shape[0]))
                except Exception as e:  # noqa: BLE001 - only the shape-only probe's own refusal is taken
                    if not needs_values(e):
                        raise
                    on_host.add(k)      # it prepares its images on the host (numpy, PIL): not measurable here
                    if getattr(r, "host_only", False) or getattr(getattr(r, "reward", None), "host_only", False):
                        continue        # and all its work stays there (a JPEG size): nothing to measure
                    import warnings
                    warnings.warn(f"memory plan: reward {getattr(r, 'name', type(r).__name__)!r} prepares its images "
                                  "on the CPU, so its activations are not measured (its weights are counted); if it "
                                  "runs a large model on the GPU, leave room for it with memory.budget_gb")
            return out

        def score(n):
            return peak_of(scores, lambda: (torch.rand((n, *image_shape)),), fake)
        reward = curve(score, reward_rows)
    weights = dict(policy.memory_weights())
    den_params = int(policy.denoiser_parameters())
    weights["rewards"] = sum(int(r.model_size()) for r in rewards if hasattr(r, "model_size"))
    lora = tensor_bytes(params)
    latent = math.prod(shape) * 4
    image = math.prod(image_shape) * 4 if image_shape else 0
    return Footprint(weights=weights, lora=lora, latent=latent, image=image, sample=sample, update=update,
                     update_ckpt=update_ckpt, decode=decode, reward=reward, denoiser_params=den_params,
                     decode_tiled=decode_tiled)
