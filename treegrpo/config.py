"""Configuration dataclasses. Each validates itself on construction and names the bad field.

One dataclass per concern (trl style); the CLI flags are generated from the field metadata
(``help``), so CLI, config files and node widgets share one set of defaults.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional


class ConfigError(ValueError):
    """A configuration value is out of range. The message names the field and the allowed range."""


def _f(default, help: str, **kw):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: json.loads(json.dumps(d)), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def _require(ok: bool, cls: str, name: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{cls}.{name}: {msg}")


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_schedule(cls: str, name: str, sched: list, value_ok, bad_entries: str) -> None:
    """A ``[[iteration, value], ...]`` schedule: whole iterations from 0, increasing, each value passing
    ``value_ok``; [] (none) passes. Raises ConfigError naming ``cls.name``."""
    if not sched:
        return
    _require(all(isinstance(e, (list, tuple)) and len(e) == 2 and _whole(e[0]) and value_ok(e[1]) for e in sched),
             cls, name, f"{bad_entries}, got {sched}")
    _require(sched[0][0] == 0, cls, name, f"must start at iteration 0 (it sets every iteration's value), got {sched}")
    _require(all(a[0] < b[0] for a, b in zip(sched, sched[1:])), cls, name, f"iterations must increase, got {sched}")


def schedule_at(sched: list, iteration: int, default):
    """The value a ``[[iteration, value], ...]`` schedule sets for ``iteration`` (the last entry at or before it);
    ``default`` for an empty schedule."""
    return [v for start, v in sched if start <= iteration][-1] if sched else default


#: the longest run name, in bytes of UTF-8: the longest file named after it (a temporary copy of
#: ``<run>-not-preferred-<iteration>.safetensors``) adds 48 bytes, and file systems allow 255
RUN_NAME_BYTES = 120


#: the most fixed noises per evaluation prompt (each is a whole sample at every evaluation)
MAX_EVAL_SEEDS = 64
#: the training prompts evaluated when no evaluation prompts are given (a prompt file may hold thousands)
DEFAULT_EVAL_PROMPTS = 32

#: names Windows keeps for devices, whatever the extension (``CON``, ``nul.txt``, ``COM1.safetensors``)
WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def windows_reserved(name: str) -> bool:
    """Whether ``name`` (one path component) cannot be a file on Windows: a device name, with any extension, or a
    name ending in '.' or ' ' (Windows drops them: ``run.`` would be ``run``)."""
    return name.split(".")[0].strip().upper() in WINDOWS_DEVICES or name.endswith((".", " "))


def check_run_name(name: str, field: str = "TrainConfig.run_name") -> str:
    """A run name is a file name: letters, digits, '-', '_' or '.', not starting with '.' (so neither '..' nor a
    hidden file), at most :data:`RUN_NAME_BYTES` bytes of UTF-8; returns it, else raises ConfigError naming
    ``field`` (the nodes' widget: ``run_name``)."""
    if not (isinstance(name, str) and name and all(ch.isalnum() or ch in "-_." for ch in name)
            and not name.startswith(".")):
        raise ConfigError(f"{field}: use letters, digits, '-', '_' or '.' (not first; no spaces or other symbols), "
                          f"got {name!r}")
    if windows_reserved(name):
        raise ConfigError(f"{field}: {name!r} cannot be a file name on Windows (a device name such as "
                          "CON, NUL, COM1, or a name ending in '.'); choose another")
    size = len(name.encode("utf-8"))
    if size > RUN_NAME_BYTES:
        raise ConfigError(f"{field}: {size} bytes is too long for the file names made from it; use at "
                          f"most {RUN_NAME_BYTES} (as many Latin letters, fewer of other scripts), got "
                          f"{name[:40]!r}...")
    return name


_TYPES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "list": "a list",
          "dict": "a mapping ({...})"}


def _type_ok(kind: str, v) -> bool:
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, {"str": str, "bool": bool, "list": list, "dict": dict}[kind])


def check_types(obj) -> None:
    """Every field of a config dataclass holds its declared type, before any range check reads it: an integer
    where one belongs (``2.0`` is taken as 2, ``2.5`` is refused), a number for floats (ints too), a string, a
    list (never a string, which would be split into characters), a mapping, a section (a mapping or the
    dataclass). ``null`` only where the field is Optional. Raises ConfigError naming the field."""
    c = type(obj).__name__
    for f in dataclasses.fields(obj):
        ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        optional = ann.startswith("Optional[")
        kind = ann[len("Optional["):-1] if optional else ann
        v = getattr(obj, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if v is None:
            if kind.endswith("Config"):
                _require(False, c, f.name, "must be a section ({...} with its fields) or left out, got null")
            _require(optional, c, f.name, f"must not be null (leave it out for the default, "
                                          f"{json.dumps(default, default=str)})")
            continue
        if kind.startswith("Literal["):   # a string, one of those listed
            _require(_type_ok("str", v), c, f.name, f"must be {_TYPES['str']}, got {v!r} ({type(v).__name__})")
            choices = field_choices(type(obj), f.name)
            _require(v in choices, c, f.name, f"must be one of {list(choices)}, got {v!r}")
        elif kind in _TYPES:
            if kind == "int" and isinstance(v, float) and v.is_integer():
                setattr(obj, f.name, int(v))
                continue
            _require(_type_ok(kind, v), c, f.name, f"must be {_TYPES[kind]}, got {v!r} ({type(v).__name__})")
            if kind == "float":
                _require(math.isfinite(v), c, f.name, f"must be a finite number, got {v!r} (NaN and infinity are "
                                                      f"not settings; the default is {default!r})")
        elif kind.endswith("Config"):   # a section: its fields as a mapping, or the dataclass itself
            _require(isinstance(v, dict) or dataclasses.is_dataclass(v), c, f.name,
                     f"must be a section ({{...}} with its fields), got {v!r} ({type(v).__name__})")


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def field_choices(cls, name: str) -> tuple:
    """The values a ``Literal[...]`` field of config dataclass ``cls`` allows (what a node's combo offers), in
    order; ``()`` for any other field."""
    t = _hints(cls)[name]
    if typing.get_origin(t) is typing.Union:          # Optional[Literal[...]]
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return typing.get_args(t) if typing.get_origin(t) is Literal else ()


def field_labels(cls, name: str) -> dict:
    """``{value: label}`` of a ``Literal`` field whose values a node shows by a label (a combo's text, which saved
    workflows keep); ``{}`` for a field shown by its values."""
    return dict(cls.__dataclass_fields__[name].metadata.get("labels", {}))


def from_label(cls, name: str, value):
    """The value of field ``name`` that a node's label stands for (``value`` itself when it is not a label)."""
    by_label = {label: v for v, label in field_labels(cls, name).items()}
    return by_label.get(value, value) if isinstance(value, str) else value


#: bounds on sizes that multiply into work or memory, checked before any model loads (each error states its reason)
MAX_STEPS = 1000          # denoising steps: the finest schedule diffusion models are trained on (1000 timesteps)
MAX_LR_FACTOR = 100.0     # an lr schedule factor: larger only multiplies the lr past anything that trains
MAX_FRAMES = 1024         # video frames: the longest video any supported family generates is far shorter
MAX_PIXELS_SIDE = 8192    # image side in pixels: beyond any published model's training resolution


@dataclass
class TreeConfig:
    """Shape of the search tree (docs/design.md §1). ``method='trajectory'`` turns the same machinery into
    trajectory GRPO: ``group_size`` independent SDE trajectories from the shared noise."""

    steps: int = _f(10, "number of denoising steps T")
    window_start: int = _f(2, "first SDE (branching) step s; steps < s are shared ODE steps")
    window_width: int = _f(3, "number of SDE steps w in the window")
    branch: int = _f(2, "children per node at every window step k (tree method)")
    branch_schedule: list = _f([], "tree method: children per node at each window step, one entry per step (e.g. "
                                    "[4, 2]: two mirrored pairs at the first step, one at the second); [] = branch "
                                    "at every step")
    method: Literal["tree", "trajectory", "ode"] = _f("tree", "tree | trajectory (the GRPO baseline run by the same code) | ode (G deterministic "
                             "samples per prompt from independent noises, for optim.loss nft / awm)")
    group_size: int = _f(0, "trajectory / ode methods: samples per group G (0 = branch**window_width)")
    window_schedule: Literal["fixed", "sliding", "random"] = _f("fixed", "fixed | sliding | random: where the window sits at each iteration")
    window_shift: int = _f(1, "sliding schedule: steps the window moves each time")
    window_every: int = _f(1, "sliding schedule: iterations between moves")
    window_max_start: int = _f(-1, "sliding/random: last allowed window start (-1 = steps - width)")
    leaf_cap: int = _f(0, "keep only the first N leaves of each tree (0 = all k**w)")
    noise_level: float = _f(0.7, "flow SDE noise level a (Flow-GRPO form)")
    antithetic: Optional[bool] = _f(None, "mirrored siblings: a node's children come in pairs with noise ε and −ε "
                                          "(each child is still N(μ, σ²); pairs cancel the even-order terms of their "
                                          "difference). None: on for the tree method, off for trajectory GRPO")
    eta: float = _f(1.0, "epsilon models: DDIM eta of the SDE steps")
    logprob_reduction: Literal["mean", "sum"] = _f("mean", "mean | sum of the per-dimension Gaussian log-density")
    tail_solver: Literal["euler", "heun", "dpmpp_2m"] = _f("euler", "ODE solver after the window: euler | heun (2 NFE/step) | dpmpp_2m (2nd order, 1 NFE/step)")
    tail_steps: int = _f(0, "ODE steps after the window (0 = the remaining steps of the schedule); with "
                            "tree.method ode the steps of each whole sample. A --tree.tail_steps flag replaces the "
                            "config's tail_steps_schedule")
    tail_steps_schedule: list = _f([], "[[iteration, tail_steps], ...]: the tail's steps from each listed iteration "
                                       "on, first at iteration 0 (e.g. [[0, 1], [60, 2]]: a one-step tail while the "
                                       "policy is far from the reward, two once closer); [] = tail_steps throughout")
    max_leaves: int = _f(256, "refuse trees with more leaves than this (memory guard; raise it deliberately)")

    def __post_init__(self) -> None:
        check_types(self)
        c = "TreeConfig"
        _require(self.steps >= 1, c, "steps", f"must be >= 1, got {self.steps}")
        _require(self.steps <= MAX_STEPS, c, "steps", f"must be <= {MAX_STEPS} (the finest schedule diffusion models "
                 f"are trained on; more steps only repeat its noise levels), got {self.steps}")
        _require(self.window_width >= 1, c, "window_width", f"must be >= 1, got {self.window_width}")
        _require(self.branch >= 1, c, "branch", f"must be >= 1, got {self.branch}")
        _require(self.window_start >= 0, c, "window_start", f"must be >= 0, got {self.window_start}")
        if self.branch_schedule:
            _require(self.method == "tree", c, "branch_schedule",
                     f"only shapes trees (method='tree'), got {self.branch_schedule} with method={self.method!r}; "
                     "set it to []")
            _require(len(self.branch_schedule) == self.window_width, c, "branch_schedule",
                     f"needs one entry per window step ({self.window_width}), got {self.branch_schedule}")
            _require(all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in self.branch_schedule),
                     c, "branch_schedule", f"entries must be whole numbers >= 1, got {self.branch_schedule}")
        _require(self.window_start + self.window_width <= self.steps, c, "window_start",
                 f"window_start + window_width must be <= steps ({self.steps}), got "
                 f"{self.window_start} + {self.window_width}; allowed window_start: 0..{self.steps - self.window_width}"
                 if self.window_width <= self.steps else
                 f"window_width {self.window_width} exceeds steps {self.steps}")
        _require(self.group_size >= 0, c, "group_size", f"must be >= 0, got {self.group_size}")
        _require(self.method != "tree" or self.group_size == 0, c, "group_size",
                 f"only used by method='trajectory' or 'ode' (got {self.group_size} with method='tree'); set it to 0")
        _require(self.window_shift >= 1, c, "window_shift", f"must be >= 1, got {self.window_shift}")
        _require(self.window_every >= 1, c, "window_every", f"must be >= 1, got {self.window_every}")
        mx = self.max_start
        _require(self.window_start <= mx, c, "window_max_start",
                 f"must be >= window_start ({self.window_start}) and <= steps - window_width "
                 f"({self.steps - self.window_width}), got {self.window_max_start}")
        _require(mx <= self.steps - self.window_width, c, "window_max_start",
                 f"must be <= steps - window_width = {self.steps - self.window_width}, got {mx}")
        _require(self.leaf_cap >= 0, c, "leaf_cap", f"must be >= 0, got {self.leaf_cap}")
        _require(0 < self.noise_level <= 10 and math.isfinite(self.noise_level), c, "noise_level",
                 f"must be in (0, 10] (0.7 is usual; over 2 the samples are mostly noise), got {self.noise_level}")
        _require(0 < self.eta <= 1, c, "eta", f"must be in (0, 1], got {self.eta}")
        _require(self.tail_steps >= 0, c, "tail_steps", f"must be >= 0, got {self.tail_steps}")
        _require(self.tail_steps <= MAX_STEPS, c, "tail_steps", f"must be <= {MAX_STEPS} (every leaf runs this many "
                 f"denoiser calls; {MAX_STEPS} is the finest schedule models are trained on), got {self.tail_steps}")
        _check_schedule(c, "tail_steps_schedule", self.tail_steps_schedule, lambda v: _whole(v) and v <= MAX_STEPS,
                        f"entries must be [iteration, tail_steps] pairs of whole numbers >= 0, tail_steps <= "
                        f"{MAX_STEPS} (every leaf runs this many denoiser calls)")
        _require(self.antithetic in (None, True, False), c, "antithetic",
                 f"must be true, false or null (auto), got {self.antithetic!r}")
        if self.method == "ode":     # G whole samples from independent noises: no window to move, cap or mirror
            _require(self.window_schedule == "fixed", c, "window_schedule",
                     f"method 'ode' samples no SDE window to move (got {self.window_schedule!r}); set it to fixed")
            _require(self.leaf_cap == 0, c, "leaf_cap",
                     f"method 'ode' has no tree to cap (got {self.leaf_cap}); set it to 0 and the samples per group "
                     "with group_size")
            _require(self.antithetic is not True, c, "antithetic",
                     "method 'ode' draws each sample's own noise, with no siblings to mirror; set it to null")
        _require(self.leaves <= self.max_leaves, c, "branch",
                 f"{'x'.join(map(str, self.branching))} = {self.leaves} leaves per tree exceed max_leaves="
                 f"{self.max_leaves} (each leaf is a full latent plus its ODE tail); lower branch/window_width, "
                 "set leaf_cap, or raise max_leaves")
        _require(self.leaves > 1, c, "branch",
                 "the tree must have at least 2 leaves to compare (branch**window_width or group_size)")

    @property
    def max_start(self) -> int:
        return self.steps - self.window_width if self.window_max_start < 0 else self.window_max_start

    @property
    def mirrored(self) -> bool:
        """Whether siblings get mirrored noise: ``antithetic``, or by default for trees only (measured: it speeds
        the tree's learning per iteration 1.5×; on trajectory GRPO's one branching step it did not help)."""
        return self.method == "tree" if self.antithetic is None else bool(self.antithetic)

    @property
    def leaves_full(self) -> int:
        return math.prod(self.branch_schedule) if self.branch_schedule else self.branch ** self.window_width

    @property
    def branching(self) -> list[int]:
        """Children per node at each window step: ``[k]*w`` (tree) or ``[G, 1, ..., 1]`` (trajectory)."""
        if self.method == "trajectory":
            g = self.group_size or self.leaves_full
            return [g] + [1] * (self.window_width - 1)
        return list(self.branch_schedule) if self.branch_schedule else [self.branch] * self.window_width

    @property
    def leaves(self) -> int:
        if self.method == "ode":
            return self.group_size or self.leaves_full
        n = math.prod(self.branching)
        return min(n, self.leaf_cap) if self.leaf_cap else n


@dataclass
class AdvantageConfig:
    """Reward aggregation, leaf z-scores and the backup to internal nodes (docs/design.md §1)."""

    backup: Literal["softmax", "mean"] = _f("softmax", "softmax | mean: how child-edge advantages combine into a node's")
    temperature: float = _f(1.0, "softmax backup temperature tau on the old log-probs")
    reward_stats: Literal["tree", "prompt"] = _f("tree", "tree | prompt: group over which each reward is standardised")
    eps: float = _f(1e-6, "added to standard deviations")
    adv_clip: float = _f(5.0, "clip edge advantages to [-adv_clip, adv_clip] (0 = off)")
    flat_floor: float = _f(1e-3, "trees whose weighted raw reward's spread (std over the tree's leaves) is below this "
                                "are not trained")
    std_scope: Literal["tree", "batch"] = _f("tree", "tree | batch: divide centred rewards by the std within each tree (GRPO) or "
                        "over the whole batch (near-flat trees then get small advantages)")
    edge_baseline: Literal["siblings", "none"] = _f("siblings", "siblings | none: subtract from each edge's advantage the mean over its "
                            "siblings (a per-state baseline), or keep the paper's backed-up "
                            "advantages")

    def __post_init__(self) -> None:
        check_types(self)
        c = "AdvantageConfig"
        _require(self.temperature > 0, c, "temperature", f"must be > 0, got {self.temperature}")
        _require(self.eps > 0, c, "eps", f"must be > 0, got {self.eps}")
        _require(self.adv_clip >= 0, c, "adv_clip", f"must be >= 0, got {self.adv_clip}")
        _require(self.flat_floor >= 0, c, "flat_floor", f"must be >= 0, got {self.flat_floor}")


@dataclass
class RewardSpec:
    """One reward model and its weight in the aggregate."""

    name: str = _f("demo_adherence", "registered reward name (see `treegrpo rewards`)")
    weight: float = _f(1.0, "weight lambda in the aggregate")
    path: Optional[str] = _f(None, "local file/folder with the reward model's weights")
    options: dict = _f({}, "extra constructor options of the reward model (e.g. arch, dtype, batch_size)")

    def __post_init__(self) -> None:
        check_types(self)
        _require(math.isfinite(self.weight) and self.weight >= 0, "RewardSpec", "weight",
                 f"must be finite and >= 0, got {self.weight} (reward {self.name!r})")


def _reward_spec(r, i: int, field_name: str = "rewards") -> "RewardSpec":
    """Entry ``i`` of ``TrainConfig.rewards`` (or ``eval_rewards``; a mapping or a RewardSpec), checked field by
    field."""
    if isinstance(r, RewardSpec):
        return r
    where = f"TrainConfig.{field_name}[{i}]"
    if not isinstance(r, dict):
        raise ConfigError(f"{where}: must be a mapping such as {{\"name\": \"hpsv2\", \"weight\": 1.0}}, got {r!r}")
    known = [f.name for f in dataclasses.fields(RewardSpec)]
    bad = sorted(set(r) - set(known))
    if bad:
        raise ConfigError(f"{where}: unknown field(s) {bad}; known: {known}")
    return RewardSpec(**r)


@dataclass
class LoraConfig:
    """LoRA adapter on the policy (PEFT)."""

    rank: int = _f(32, "LoRA rank r")
    alpha: float = _f(64.0, "LoRA alpha (scale = alpha / rank)")
    targets: list = _f(["to_q", "to_k", "to_v", "to_out"], "module names (suffixes) that get LoRA")
    init_from: Optional[str] = _f(None, "start from this LoRA file (ComfyUI or PEFT keys)")

    def __post_init__(self) -> None:
        check_types(self)
        _require(self.rank >= 1, "LoraConfig", "rank", f"must be >= 1, got {self.rank}")
        _require(self.alpha > 0, "LoraConfig", "alpha", f"must be > 0, got {self.alpha}")
        _require(len(self.targets) > 0, "LoraConfig", "targets", "must name at least one module")


@dataclass
class OptimConfig:
    """GRPO update (docs/design.md §1) and AdamW."""

    lr: float = _f(3e-4, "AdamW learning rate")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    clip_range: float = _f(1e-4, "PPO ratio clip epsilon")
    kl_beta: float = _f(0.1, "weight of the KL term to the LoRA-disabled reference model (0 = off): higher keeps "
                             "the LoRA closer to the base model")
    max_grad_norm: float = _f(1.0, "gradient clipping norm (0 = off)")
    microbatch: int = _f(64, "parent nodes per forward/backward (gradient accumulation over microbatches)")
    updates_per_batch: int = _f(1, "optimiser passes over each batch of trees")
    step_weight: Literal["edges", "steps"] = _f("steps", "how the window steps share the loss: steps (every window step the same "
                                   "total weight, as in the policy gradient's sum over steps and in trajectory "
                                   "GRPO) | edges (the plain mean over edges, so a step with more edges weighs "
                                   "more: in a k=2, w=3 tree the last step 4x the first)")
    lr_schedule: Literal["constant", "linear", "cosine"] = _f("constant", "learning-rate schedule over the run: constant | linear | cosine (to 0 "
                                     "at `iterations`, or at `time_budget_s` of training if that comes first)")
    warmup: int = _f(0, "iterations of linear learning-rate warm-up from 0")
    lr_factor_schedule: list = _f([], "[[iteration, factor], ...]: the learning rate times each factor from its "
                                      "iteration on, first at iteration 0 (e.g. [[0, 1], [120, 0.5]]: half the lr "
                                      "once the policy is near the reward, where a constant lr's noise sets a "
                                      "plateau); multiplies the warm-up and lr_schedule; [] = 1 throughout")
    loss: Literal["grpo", "nft", "awm"] = _f("grpo", "grpo (the policy gradient on the SDE window's edges) | nft (DiffusionNFT-style) | awm "
                           "(advantage-weighted matching): nft and awm train the flow-matching loss on the leaves "
                           "re-noised (treegrpo.matching) and need no SDE window likelihoods")
    nft_beta: float = _f(1.0, "nft: the implicit policies' step beta: v+ = (1-beta) v_old + beta v, "
                              "v- = (1+beta) v_old - beta v")
    nft_adv_scale: float = _f(2.0, "nft: optimality r = 1/2 + 1/2 clip(A / scale, -1, 1) of the leaf advantage A")
    matching_timesteps: int = _f(2, "nft/awm: noise levels per leaf per update, drawn uniformly from the sampling "
                                    "schedule")

    def __post_init__(self) -> None:
        check_types(self)
        c = "OptimConfig"
        _require(self.nft_beta > 0, c, "nft_beta", f"must be > 0, got {self.nft_beta}")
        _require(self.nft_adv_scale > 0, c, "nft_adv_scale", f"must be > 0, got {self.nft_adv_scale}")
        _require(self.matching_timesteps >= 1, c, "matching_timesteps", f"must be >= 1, got {self.matching_timesteps}")
        _require(self.lr > 0 and math.isfinite(self.lr), c, "lr", f"must be > 0, got {self.lr}")
        _require(self.weight_decay >= 0, c, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        _require(self.clip_range > 0, c, "clip_range", f"must be > 0, got {self.clip_range}")
        _require(self.kl_beta >= 0, c, "kl_beta", f"must be >= 0, got {self.kl_beta}")
        _require(self.max_grad_norm >= 0, c, "max_grad_norm", f"must be >= 0, got {self.max_grad_norm}")
        _require(self.microbatch >= 1, c, "microbatch", f"must be >= 1, got {self.microbatch}")
        _require(self.updates_per_batch >= 1, c, "updates_per_batch", f"must be >= 1, got {self.updates_per_batch}")
        _require(self.warmup >= 0, c, "warmup", f"must be >= 0 iterations, got {self.warmup}")
        _check_schedule(c, "lr_factor_schedule", self.lr_factor_schedule,
                        lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                   and 0 < v <= MAX_LR_FACTOR),
                        f"entries must be [iteration, factor] pairs: a whole iteration >= 0 and a factor > 0 and <= "
                        f"{MAX_LR_FACTOR:g} (it multiplies optim.lr; set the lr itself for larger changes)")

@dataclass
class PipelineConfig:
    """How the ``diffusers`` backend loads and runs a model (ignored by the other backends)."""

    family: Literal["auto", "sd", "sdxl", "sd3", "flux"] = _f("auto", "auto | sd (SD1.x/SD2.x) | sdxl | sd3 (SD3/SD3.5) | flux; auto reads model_index.json")
    config: Optional[str] = _f(None, "single-file checkpoints: a local diffusers folder with the configs, tokenizers "
                                     "and the components the file lacks (text encoders, VAE)")
    height: int = _f(0, "image height in pixels (0 = the model's default)")
    width: int = _f(0, "image width in pixels (0 = the model's default)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = _f("auto", "weights dtype: auto (bfloat16 on GPU, float32 on CPU) | float32 | bfloat16 | float16")
    autocast: bool = _f(True, "bfloat16 autocast of the denoiser on GPU")
    shift: float = _f(0.0, "flow models: schedule shift (0 = the model's scheduler config)")
    guidance_embed: float = _f(3.5, "Flux-dev: distilled guidance value fed to the model (true CFG is "
                                    "`guidance_scale`)")
    max_sequence_length: int = _f(0, "T5 tokens for SD3/Flux prompts (0 = the pipeline's default: 256 SD3, 512 Flux)")
    decode_batch: int = _f(8, "images per VAE decode call")

    def __post_init__(self) -> None:
        check_types(self)
        c = "PipelineConfig"
        for name in ("height", "width"):
            v = getattr(self, name)
            _require(v == 0 or (v >= 16 and v % 16 == 0), c, name, f"must be 0 (model default) or a multiple of 16 "
                                                                   f">= 16 pixels, got {v}")
            _require(v <= MAX_PIXELS_SIDE, c, name, f"must be <= {MAX_PIXELS_SIDE} pixels (beyond any model's training "
                     f"resolution; memory grows with its square), got {v}")
        _require(self.shift >= 0, c, "shift", f"must be >= 0, got {self.shift}")
        _require(self.max_sequence_length >= 0, c, "max_sequence_length", f"must be >= 0, got {self.max_sequence_length}")
        _require(self.decode_batch >= 1, c, "decode_batch", f"must be >= 1, got {self.decode_batch}")


@dataclass
class MemoryConfig:
    """The memory plan (docs/design.md §7): before the first iteration, measure the model at the run's latent size,
    predict each phase's peak and choose the fastest settings that fit; refuse before any work when none does."""

    plan: Literal["auto", "off"] = _f("auto", "auto (plan when the budget is known: a GPU, or budget_gb > 0) | off (use the settings "
                           "as given)")
    budget_gb: float = _f(0.0, "accelerator memory to plan for, in GB (0 = what the GPU has free when the run starts)")
    checkpointing: Literal["auto", "on", "off"] = _f("auto", "gradient checkpointing: auto (on when needed to fit) | on | off")
    offload_rewards: Literal["auto", "on", "off"] = _f("auto", "reward models on the CPU except while scoring: auto | on | off")
    tiled_decode: Literal["auto", "on", "off"] = _f("auto", "VAE decode in tiles (less memory, slower decode): auto | on | off")
    sample_batch: int = _f(0, "rows per denoiser call while sampling (0 = the plan's choice: a whole tree level)")
    reuse_probe: bool = _f(True, "reuse the measurement of an earlier run with the same models, size and settings "
                           "(kept in $TREEGRPO_CACHE, default ~/.cache/treegrpo; false: measure again)")

    def __post_init__(self) -> None:
        check_types(self)
        c = "MemoryConfig"
        _require(math.isfinite(self.budget_gb) and self.budget_gb >= 0, c, "budget_gb",
                 f"must be a number of GB >= 0, got {self.budget_gb}")
        _require(self.sample_batch >= 0, c, "sample_batch", f"must be >= 0, got {self.sample_batch}")

    def fixed(self) -> dict:
        """The choices the user fixed (``treegrpo.memory.plan``'s overrides)."""
        out = {}
        if self.checkpointing != "auto":
            out["checkpointing"] = self.checkpointing == "on"
        if self.offload_rewards != "auto":
            out["offload_rewards"] = self.offload_rewards == "on"
        if self.tiled_decode != "auto":
            out["tiled_decode"] = self.tiled_decode == "on"
        if self.sample_batch:
            out["sample_batch"] = self.sample_batch
        return out


@dataclass
class SignalsConfig:
    """Reward-hacking signals at every evaluation (``treegrpo.hacking``): the warnings they raise and the best
    checkpoint they select."""

    judge_drop: float = _f(0.05, "warn when a held-out judge falls this far below its best while the training "
                                 "reward is above its value there (0 = off)")
    diversity_floor: float = _f(0.5, "warn when the samples' diversity falls below this fraction of the base "
                                      "model's (0 = off)")
    hf_ceiling: float = _f(1.5, "warn when the samples' high-frequency energy exceeds this multiple of the base "
                                "model's (0 = off)")
    kl_estimate: bool = _f(True, "estimate the KL to the base model (LoRA off) over the SDE window at every "
                                 "evaluation (one extra denoiser call per window step, two with CFG)")
    keep_best: bool = _f(True, "also keep <run_name>_best.safetensors: the LoRA of the evaluation with the best "
                               "held-out judge score (the best evaluation reward when there is no judge), among "
                               "the states no artist's check took back")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("judge_drop", "diversity_floor", "hf_ceiling"):
            v = getattr(self, name)
            _require(math.isfinite(v) and v >= 0, "SignalsConfig", name, f"must be a number >= 0, got {v}")


@dataclass
class ArtistConfig:
    """Asking the artist (treegrpo/artist/answers.py): how a question is asked and what an unanswered one becomes."""

    mode: Literal["favourites", "ranking", "best_worst"] = _f("favourites", "how the artist answers: favourites (click the good ones, shift-click bad ones), "
                                 "ranking (best first), best_worst")
    timeout_s: int = _f(600, "seconds to wait for the answer about one tree before the fallback")
    on_timeout: Literal["skip", "reward_model"] = _f(
        "skip", "an unanswered tree: not trained on (skip), or scored by the reward model",
        labels={"skip": "skip the tree", "reward_model": "use the reward model"})
    every: int = _f(0, "the Train node asks about every N-th tree of the run (0 = never); the others, and unanswered "
                       "ones, are scored by the reward model. With ask 'when unsure': at most one tree in N")
    ask: Literal["every", "unsure"] = _f(
        "every", "every N-th tree, or when unsure: a taste model (treegrpo/artist/taste.py) scores the trees and the "
        "artist is asked only where it is unsure", labels={"every": "every N-th tree", "unsure": "when unsure"})
    away_s: int = _f(30, "after a question went unanswered, the next ones wait only this long (seconds) until the "
                         "artist answers again: a run left alone does not stall timeout_s on every tree")
    check_every: int = _f(5, "every N iterations, and at the end, the artist sees the model's pictures now beside "
                             "the base model's (same noises) and picks the side closer to what they want, twice: "
                             "picking the start rolls the LoRA back to the last state they approved, and the run ends "
                             "on a state they preferred to the start or on the base model "
                             "(treegrpo/artist/start_check.py); 0 = never")

    def __post_init__(self) -> None:
        self.on_timeout = from_label(ArtistConfig, "on_timeout", self.on_timeout)   # a node's label reads as its value
        self.ask = from_label(ArtistConfig, "ask", self.ask)
        check_types(self)
        _require(1 <= self.away_s <= 86400, "ArtistConfig", "away_s",
                 f"{self.away_s} is outside 1..86400 seconds")
        _require(5 <= self.timeout_s <= 86400, "ArtistConfig", "timeout_s",
                 f"{self.timeout_s} is outside 5..86400 seconds (a person needs a few seconds; a day at most)")
        _require(0 <= self.every <= 10 ** 6, "ArtistConfig", "every", f"{self.every} is not 0 (never) or a tree count")
        _require(0 <= self.check_every <= 10 ** 6, "ArtistConfig", "check_every",
                 f"{self.check_every} is not 0 (never) or an iteration count")


@dataclass
class VideoConfig:
    """Video families (ComfyUI's Wan, HunyuanVideo, Mochi, LTX-Video, Cosmos): the length of the sampled videos and
    the frames the image rewards score (``treegrpo.video``)."""

    frames: int = _f(1, "frames per video (video families only; Wan and HunyuanVideo make 1 + 4n frames)")
    reward_frames: int = _f(4, "frames of each video the rewards score (their scores are averaged)")
    frame_stride: int = _f(4, "frames between two scored frames, from the first")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("frames", "reward_frames", "frame_stride"):
            v = getattr(self, name)
            _require(v >= 1, "VideoConfig", name, f"must be >= 1, got {v}")
            _require(v <= MAX_FRAMES, "VideoConfig", name, f"must be <= {MAX_FRAMES} (every frame is decoded and kept "
                     f"in memory for each leaf), got {v}")


@dataclass
class TrainConfig:
    """The whole run: model, prompts, rewards, tree, advantages, LoRA, optimiser, loop and output."""

    backend: Literal["demo", "diffusers", "comfy"] = _f("demo", "policy adapter: demo (the embedded model) | diffusers (a local diffusers folder or "
                               "single-file checkpoint); comfy is set by the ComfyUI nodes")
    model: Optional[str] = _f(None, "model path (diffusers folder / single file); demo: None = shipped weights")
    pipeline: PipelineConfig = field(default_factory=PipelineConfig, metadata={"help": "diffusers model loading"})
    prompts: list = _f([], "training prompts (or prompts_file, not both)")
    prompts_file: Optional[str] = _f(None, "a prompt file: .txt (one prompt a line; '# ' lines are comments), .csv "
                                           "(a prompt column) or .jsonl ({\"prompt\": ...} a line), or a set the "
                                           "pack ships: "
                                           "treegrpo/general_subjects.txt, treegrpo/text_rendering.txt")
    negative_prompt: str = _f("", "negative prompt for CFG")
    guidance_scale: float = _f(1.0, "classifier-free guidance scale, CFG (1 = off; the nodes' cfg; `cfg` in earlier "
                                    "config files and the --cfg flag still mean it)")
    rewards: list = _f([{"name": "demo_adherence", "weight": 1.0}], "reward models: [{name, weight, path, options}]: a registered name (treegrpo rewards), its weight, the local file or folder of its weights, constructor options (e.g. {\"dtype\": \"bfloat16\"})")
    tree: TreeConfig = field(default_factory=TreeConfig, metadata={"help": "tree shape"})
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig, metadata={"help": "advantages"})
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapter"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": "optimiser"})
    memory: MemoryConfig = field(default_factory=MemoryConfig, metadata={"help": "memory plan"})
    iterations: int = _f(100, "training iterations (sample -> score -> update)")
    prompts_per_iter: int = _f(8, "prompts sampled per iteration")
    trees_per_prompt: int = _f(1, "trees (initial noises) per prompt per iteration")
    seed: int = _f(0, "seed of the prompt and noise schedule")
    eval_every: int = _f(10, "evaluate on fixed (prompt, noise) pairs every N iterations (0 = off)")
    eval_every_s: float = _f(0.0, "also evaluate whenever the training time passes a multiple of this many seconds "
                             "(0 = off): equal resolution in time when comparing methods")
    eval_prompts: list = _f([], "evaluation prompts (default: the eval_heldout prompts, else the first 32 training "
                                "prompts)")
    eval_heldout: int = _f(0, "hold out this many different prompts of the prompt list (drawn with the seed): never "
                              "trained on, they are the evaluation prompts, as the Prompt List's eval_count (0 = none; "
                              "each evaluation samples eval_heldout x eval_seeds images)")
    eval_seeds: int = _f(4, "fixed noises per evaluation prompt")
    eval_rewards: list = _f([], "held-out judges: reward models (RewardSpec) scored on the evaluation samples only, "
                                "never trained on; their weighted mean is the log's eval_judge")
    signals: SignalsConfig = field(default_factory=SignalsConfig, metadata={"help": "reward-hacking signals"})
    video: VideoConfig = field(default_factory=VideoConfig, metadata={"help": "video length and scored frames"})
    checkpoint_every: int = _f(50, "write a checkpoint every N iterations (0 = only at the end); --resume continues from the latest")
    keep_checkpoints: int = _f(2, "checkpoints kept on disk")
    output_dir: str = _f("treegrpo_out", "folder for the LoRA, logs (log.csv, eval.csv, log.json) and checkpoints")
    run_name: str = _f("treegrpo", "name of the run (file names, checkpoint identity): letters, digits, -, _ and ., "
                                   "at most 120 bytes")
    device: str = _f("auto", "auto | cpu | cuda[:N] | xpu[:N] | mps")
    max_prompts: int = _f(100000, "refuse prompt lists longer than this")
    time_budget_s: float = _f(0.0, "stop after this many seconds of training (0 = no limit)")

    def __post_init__(self) -> None:
        check_types(self)
        c = "TrainConfig"
        if isinstance(self.tree, dict):
            self.tree = TreeConfig(**self.tree)
        if isinstance(self.advantage, dict):
            self.advantage = AdvantageConfig(**self.advantage)
        if isinstance(self.lora, dict):
            self.lora = LoraConfig(**self.lora)
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)
        if isinstance(self.pipeline, dict):
            self.pipeline = PipelineConfig(**self.pipeline)
        if isinstance(self.memory, dict):
            self.memory = MemoryConfig(**self.memory)
        if isinstance(self.signals, dict):
            self.signals = SignalsConfig(**self.signals)
        if isinstance(self.video, dict):
            self.video = VideoConfig(**self.video)
        self.rewards = [_reward_spec(r, i) for i, r in enumerate(self.rewards)]
        self.eval_rewards = [_reward_spec(r, i, "eval_rewards") for i, r in enumerate(self.eval_rewards)]
        judges = [r.name for r in self.eval_rewards]
        _require(len(set(judges)) == len(judges), c, "eval_rewards", f"duplicate reward names in {judges}")
        import re
        _require(isinstance(self.device, str) and re.fullmatch(r"auto|cpu|mps|(cuda|xpu)(:\d+)?", self.device) is not None,
                 c, "device", f"{shorten(self.device)!r} is not a device this trainer runs on: use auto, cpu, cuda, "
                 "cuda:N (an NVIDIA GPU), xpu[:N] or mps")
        _require(self.backend != "diffusers" or bool(self.model), c, "model",
                 "the diffusers backend needs a model path: a local diffusers folder or a .safetensors checkpoint")
        _require(self.tree.method != "ode" or self.optim.loss != "grpo", c, "tree",
                 "method 'ode' samples no SDE edges for GRPO to train: use optim.loss nft or awm with it, or "
                 "method tree / trajectory")
        _require(self.optim.loss == "grpo" or self.tree.method != "trajectory", c, "optim",
                 f"loss {self.optim.loss!r} trains on leaves: sample them with tree.method ode (independent samples) "
                 "or tree (a tree's leaves)")
        _require(len(self.rewards) > 0, c, "rewards", "name at least one reward model")
        _require(sum(r.weight for r in self.rewards) > 0, c, "rewards",
                 "the reward weights are all zero; give at least one a weight > 0")
        names = [r.name for r in self.rewards]
        _require(len(set(names)) == len(names), c, "rewards", f"duplicate reward names in {names}")
        _require(self.prompts or self.prompts_file, c, "prompts", "empty prompt list: give prompts or prompts_file")
        _require(not (self.prompts and self.prompts_file), c, "prompts_file",
                 f"{self.prompts_file!r} and {len(self.prompts)} inline prompts are both given; a run trains on one "
                 "list: remove `prompts` from the config to train on the file, or drop prompts_file (a run begun "
                 "by an earlier version with both trained on the inline prompts: drop prompts_file to resume it)")
        _require(len(self.prompts) <= self.max_prompts, c, "prompts",
                 f"{len(self.prompts)} prompts exceed max_prompts={self.max_prompts}")
        _require(all(isinstance(p, str) and p.strip() for p in self.prompts), c, "prompts",
                 "every prompt must be a non-empty string")
        _require(self.guidance_scale >= 1.0, c, "guidance_scale", f"must be >= 1, got {self.guidance_scale}")
        _require(self.iterations >= 1, c, "iterations", f"must be >= 1, got {self.iterations}")
        _require(self.prompts_per_iter >= 1, c, "prompts_per_iter", f"must be >= 1, got {self.prompts_per_iter}")
        _require(self.trees_per_prompt >= 1, c, "trees_per_prompt", f"must be >= 1, got {self.trees_per_prompt}")
        trees = self.prompts_per_iter * self.trees_per_prompt
        _require(trees <= MAX_TREES_PER_ITERATION, c, "prompts_per_iter",
                 f"{self.prompts_per_iter} prompts x {self.trees_per_prompt} trees = {trees} trees per iteration is "
                 f"more than {MAX_TREES_PER_ITERATION} (the papers use 8-48); lower prompts_per_iter, and raise "
                 "iterations for more data")
        _require(self.eval_every >= 0, c, "eval_every", f"must be >= 0, got {self.eval_every}")
        _require(isinstance(self.eval_heldout, int) and self.eval_heldout >= 0, c, "eval_heldout",
                 f"must be a whole number >= 0, got {self.eval_heldout!r}")
        _require(not (self.eval_heldout and self.eval_prompts), c, "eval_heldout",
                 f"{self.eval_heldout} held-out prompts and {len(self.eval_prompts)} eval_prompts are both given; "
                 "evaluate on one: drop eval_prompts to evaluate on the held-out prompts, or set eval_heldout to 0")
        _require(math.isfinite(self.eval_every_s) and self.eval_every_s >= 0, c, "eval_every_s",
                 f"must be a number of seconds >= 0, got {self.eval_every_s}")
        _require(1 <= self.eval_seeds <= MAX_EVAL_SEEDS, c, "eval_seeds",
                 f"must be 1..{MAX_EVAL_SEEDS} fixed noises per evaluation prompt, got {self.eval_seeds}")
        _require(0 <= self.seed < 2 ** 63, c, "seed", f"must be a whole number 0 .. 2**63 - 1, got {self.seed}")
        _require(self.checkpoint_every >= 0, c, "checkpoint_every", f"must be >= 0, got {self.checkpoint_every}")
        _require(self.keep_checkpoints >= 1, c, "keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints}")
        _require(self.time_budget_s >= 0, c, "time_budget_s", f"must be >= 0, got {self.time_budget_s}")
        check_run_name(self.run_name)

    def load_prompts(self) -> list[str]:
        """The training prompts (inline list, else the prompts file, without the ``eval_heldout`` ones), validated."""
        return self.split_prompts()[0]

    def heldout_prompts(self) -> list[str]:
        """The ``eval_heldout`` prompts held out of the prompt list for evaluation only ([] when 0)."""
        return self.split_prompts()[1] if self.eval_heldout else []

    def split_prompts(self) -> tuple[list[str], list[str]]:
        """(training prompts, held-out prompts): :func:`treegrpo.prompts.split_heldout` of the prompt list with
        ``eval_heldout`` and the seed (the same on every process and every resume)."""
        from .prompts import split_heldout

        prompts = self._prompt_list()
        different = len(set(prompts))
        _require(self.eval_heldout < different, "TrainConfig", "eval_heldout",
                 f"{self.eval_heldout} prompts held out of {different} different ones leaves none to train on; hold "
                 "out fewer, or give more prompts")
        return split_heldout(prompts, self.eval_heldout, self.seed)

    def _prompt_list(self) -> list[str]:
        """The prompt list (inline, else the prompts file), validated."""
        if self.prompts:
            return list(self.prompts)
        from .prompts import PromptFileError, parse_prompts, shipped_prompt_file

        path = self.prompts_file
        if not os.path.exists(path):
            path = shipped_prompt_file(path) or path        # a set the pack ships: treegrpo/general_subjects.txt
        try:
            with open(path, encoding="utf-8-sig") as fh:
                text = fh.read()
        except UnicodeDecodeError as e:
            raise ConfigError(f"TrainConfig.prompts_file: {self.prompts_file!r} is not UTF-8 text ({e.reason} at byte "
                              f"{e.start}): save it as UTF-8, one prompt per line") from None
        except OSError as e:
            raise ConfigError(f"TrainConfig.prompts_file: cannot read {self.prompts_file!r} ({e.strerror})") from None
        _require("\x00" not in text, "TrainConfig", "prompts_file",
                 f"{self.prompts_file!r} is a binary file, not text with one prompt per line")
        try:
            prompts = parse_prompts(text, path)
        except PromptFileError as e:
            raise ConfigError(f"TrainConfig.prompts_file: {e}") from None
        _require(len(prompts) > 0, "TrainConfig", "prompts_file", f"{self.prompts_file!r} has no prompts")
        _require(len(prompts) <= self.max_prompts, "TrainConfig", "prompts_file",
                 f"{len(prompts)} prompts exceed max_prompts={self.max_prompts}")
        return prompts

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"TrainConfig: a config is a mapping of fields ({{\"prompts\": [...], ...}}), got "
                              f"{type(d).__name__}")
        d = moved_fields(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"TrainConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        for sub, klass in config_sections().items():
            if isinstance(d.get(sub), dict):
                kn = {f.name for f in dataclasses.fields(klass)}
                bad = sorted(set(d[sub]) - kn)
                if bad:
                    raise ConfigError(f"{klass.__name__}: unknown field(s) {bad}; known: {sorted(kn)}")
        return cls(**d)

    @classmethod
    def from_dict_known(cls, d: dict[str, Any]) -> tuple["TrainConfig", list[str]]:
        """A config written by another TreeGRPO version (a checkpoint's): the fields this version knows, and the
        dotted names of those it does not (left out). Values it cannot use still raise ConfigError."""
        if not isinstance(d, dict):
            raise ConfigError(f"TrainConfig: a config is a mapping of fields, got {type(d).__name__}")
        d = moved_fields(d)
        known = {f.name for f in dataclasses.fields(cls)}
        dropped = sorted(set(d) - known)
        out = {k: v for k, v in d.items() if k in known}
        for sub, klass in config_sections().items():
            if isinstance(out.get(sub), dict):
                kn = {f.name for f in dataclasses.fields(klass)}
                dropped += sorted(f"{sub}.{k}" for k in set(out[sub]) - kn)
                out[sub] = {k: v for k, v in out[sub].items() if k in kn}
        return cls(**out), dropped

    def training_settings(self) -> dict:
        """The settings that define what a run learns (a resumed run must keep them): everything but the budget
        (iterations, time), evaluation, checkpointing, output, device, memory plan, backend, model path and the
        pipeline's precision and batching."""
        d = self.to_dict()
        d["optim"].pop("microbatch")     # gradient accumulation: the same update in other pieces
        d["lora"].pop("init_from")
        d["lora"].pop("targets")         # checked by the checkpoint's parameter names (they differ per frontend)
        # a reward of weight 0 changes nothing learnt (the Train node leaves one out, a config may list it)
        d["rewards"] = [{"name": r["name"], "weight": r["weight"]} for r in d["rewards"] if r["weight"] > 0]
        keep = ("prompts", "prompts_file", "negative_prompt", "guidance_scale", "rewards", "tree", "advantage",
                "lora", "optim", "prompts_per_iter", "trees_per_prompt", "seed", "video", "eval_heldout")
        out = {k: d[k] for k in keep}
        # what the model is asked to make: image size, schedule shift, Flux guidance and prompt length (not the
        # weights' dtype, autocast, the decode batch, where single-file configs are read from, or the family: the
        # checkpoint's base model names it, and "auto" and its value are the same model)
        out["pipeline"] = {k: d["pipeline"][k] for k in ("height", "width", "shift", "guidance_embed",
                                                         "max_sequence_length")}
        return out


def moved_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A config dict with the fields earlier versions kept elsewhere moved to where they live now (a copy; ``d`` is
    not changed). ``cfg`` (the guidance scale's name until 2026-12) is ``guidance_scale``.
    ``pipeline.gradient_checkpointing`` (a second switch beside the memory plan's, until 2026-12): true is
    ``memory.checkpointing`` "on" unless that says otherwise, false is the plan's own choice."""
    if "cfg" in d:
        if "guidance_scale" in d and d["guidance_scale"] != d["cfg"]:
            raise ConfigError(f"TrainConfig: both cfg ({d['cfg']!r}) and guidance_scale ({d['guidance_scale']!r}) are "
                              "given; they are one setting (cfg is its earlier name): keep guidance_scale")
        d = dict(d)
        d.setdefault("guidance_scale", d.pop("cfg"))
    pipe = d.get("pipeline")
    if not (isinstance(pipe, dict) and "gradient_checkpointing" in pipe):
        return d
    d, pipe = dict(d), dict(pipe)
    on = pipe.pop("gradient_checkpointing")
    d["pipeline"] = pipe
    mem = d.get("memory")
    if on is True and (mem is None or isinstance(mem, dict)) and (mem or {}).get("checkpointing", "auto") == "auto":
        d["memory"] = {**(mem or {}), "checkpointing": "on"}
    elif not isinstance(on, bool):
        raise ConfigError(f"PipelineConfig.gradient_checkpointing: true or false (now memory.checkpointing: auto | on "
                          f"| off), got {on!r}")
    return d


#: trees one iteration may sample: far above any published setting (8-48 prompts), far below a size that takes hours
#: per iteration on any machine
MAX_TREES_PER_ITERATION = 4096


def config_sections() -> dict[str, type]:
    """TrainConfig's sections (``tree``, ``optim``, ...) and their dataclasses, read from TrainConfig itself: the
    fields whose default is a dataclass."""
    return {f.name: f.default_factory for f in dataclasses.fields(TrainConfig)
            if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)}


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list) -> dict:
    """``json.loads``' object hook: a key twice in one object is refused (JSON allows it and keeps the last; a user
    never means that)."""
    seen = set()
    for k, _ in pairs:
        if k in seen:
            raise _DuplicateKey(k)
        seen.add(k)
    return dict(pairs)


def shorten(value: Any, limit: int = 80) -> str:
    """``value`` as text, cut in the middle to about ``limit`` characters (user input quoted in a message)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    keep = max(8, (limit - 20) // 2)
    return f"{text[:keep]}…[{len(text) - 2 * keep} characters]…{text[-keep:]}"


def _yaml_loader(yaml):
    """PyYAML's safe loader reading every number as YAML 1.2 and JSON do (YAML 1.1 takes ``1e-4`` for text, and the
    learning rate was refused as "not a number"), and refusing a key given twice (it kept the last one silently)."""
    import re

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} appears twice in one mapping (YAML keeps only the last)",
                        key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
        r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)$|^[-+]?[0-9][0-9_]*\.[0-9_]*$|^[-+]?\.[0-9_]+$"),
        list("-+0123456789."))
    return Loader


def read_config_file(path: str) -> dict:
    """The mapping in a JSON (or YAML) config file; errors name the file and what is wrong with it."""
    try:
        with open(path, encoding="utf-8-sig") as fh:      # an editor's byte-order mark is not an error
            text = fh.read()
    except IsADirectoryError:
        raise ConfigError(f"--config {path!r} is a folder; give the config file (JSON) inside it") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"--config {path!r} is not UTF-8 text ({e.reason} at byte {e.start}): save it as "
                          "UTF-8 JSON") from None
    except OSError as e:
        raise ConfigError(f"--config {path!r}: cannot read it ({e.strerror})") from None
    if not text.strip():
        raise ConfigError(f"--config {path!r} is empty: write the run's settings in it (treegrpo demo --dump-config "
                          "prints a complete example)")
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # optional
        except ImportError:
            raise ConfigError(f"--config {path!r} is YAML and PyYAML is not installed: pip install pyyaml, or write "
                              "the config as JSON") from None
        try:
            data = yaml.load(text, Loader=_yaml_loader(yaml))
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ConfigError(f"--config {path!r} is not valid YAML: {getattr(e, 'problem', None) or e}{where}") \
                from None
    else:
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--config {path!r} is not valid JSON: {e.msg} at line {e.lineno}, column "
                              f"{e.colno}") from None
        except _DuplicateKey as e:
            raise ConfigError(f"--config {path!r}: the key {str(e)!r} appears twice in one object (JSON keeps only "
                              "the last, so the first would be ignored); merge them into one") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path!r} must hold a mapping of fields ({{\"prompts\": [...], ...}}), got "
                          f"{type(data).__name__}")
    return data

