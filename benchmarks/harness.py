"""The benchmarks' one harness: named configurations in a frozen registry, a training run in a child process, and
the paired statistics every table is read with.

* **Registry** — :data:`METHODS` (what is compared: TreeGRPO, the trajectory-GRPO baselines, the flow-matching peers)
  and :data:`VARIANTS` (named changes of one method: its batch, tail, learning rate, lr schedule or tree shape). Both
  are read-only: a lookup returns a fresh copy, and :func:`protocol` builds the registry of another protocol (more
  denoising steps, another lr, a diffusers model instead of the demo) without changing this one.
* **Runs** — :func:`run_one` trains one (configuration, seed) in a child process of this file, one thread, and returns
  its record: the evaluations, iterations, each phase's mean time, the child's own peak RSS.
* **Statistics** — :func:`smooth_evals`, :func:`time_to_reach`, :func:`paired` and :func:`mean_std`: every ratio is
  paired per seed (each seed's target from that seed's baseline) and reported with its spread and the seeds that
  reach it.

An experiment is a small spec over these names — the methods (registered names, or ``NAME=JSON`` changes), seeds and
budgets — given to ``bench_budget.py`` (budgets in work) or ``bench_methods.py`` (time budgets, the peers' lr sweeps,
``--steps``); ``benchmarks/README.md`` names the spec behind each table.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

THREADS = 1  # torch threads per run: one core, so a second process on a 2-core machine does not skew it
EVALS = 32   # evaluations per time-budget run, one every budget/EVALS seconds of training
SMOOTH = 3   # ratios are read off each run's curve averaged over this many consecutive evaluations (1 = raw)
LEAVES_PER_ITER = 192  # the demo protocol: 24 prompts × 8 leaves (k = 2, w = 3)
#: the GRPO methods' shared learning rate, chosen by their sweeps
#: (docs/experiments/2026-12-05-benchmark-protocols-before-budgets.md)
LR = 6e-3
#: the flow-matching peers' own learning rate, chosen by their sweeps (benchmarks/README.md, the flow-matching peers);
#: the tree variants of their objectives train as many leaves per iteration and take the same
PEER_LR = 1.2e-2
PEER_ODE_STEPS = 6   # DPM++(2M) calls per independent peer sample: as many as a tree leaf's path (1 + 3 + 2)
#: the denoising steps' protocol after the window (bench_methods.py --tail)
TAILS = {"fixed": "2 DPM++(2M) steps, as at T = 10 (the protocol's tail)",
         "schedule": "the schedule's own remaining T - s - w steps, DPM++(2M) (what a real model's sampler runs)"}


def merge(a: Mapping, b: Mapping) -> dict:
    """``a`` with ``b``'s entries, nested dicts merged (a new dict; neither argument changes)."""
    out = json.loads(json.dumps(a))
    for k, v in b.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, Mapping) else json.loads(json.dumps(v))
    return out


def json_ready(result: Mapping, raw: tuple = ("records",)) -> dict:
    """``result`` with every NaN or infinite float outside the ``raw`` entries written as null (a ratio no seed
    reached), so the file is standard JSON (``jq``, a browser); the ``raw`` entries (the runs, which ``--merge`` /
    ``--collect`` read back and compute from) stay as they are."""
    def finite(v):
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, Mapping):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return v
    return {k: v if k in raw else finite(v) for k, v in result.items()}


class Registry(Mapping):
    """Name → configuration changes (nested dicts), read-only: every lookup returns a fresh copy."""

    def __init__(self, entries: Mapping):
        self._json = {name: json.dumps(v) for name, v in entries.items()}

    def __getitem__(self, name: str) -> dict:
        return json.loads(self._json[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)


# ------------------------------------------------------------------------------------------------ the registry
#: the demo protocol's tree, over the demo config: 10 steps, the window at step 1, k = 2, w = 3, a 2-step DPM++ tail
BASE = Registry({"base": {"tree": {"steps": 10, "window_start": 1, "window_width": 3, "branch": 2,
                                   "tail_solver": "dpmpp_2m", "tail_steps": 2}, "optim": {"lr": LR}}})["base"]
_PEER = {"tree": {"tail_solver": "dpmpp_2m", "tail_steps": PEER_ODE_STEPS}, "optim": {"lr": PEER_LR}}
METHODS = Registry({
    # TreeGRPO: mirrored siblings (ε, −ε), edge advantages relative to their siblings' mean
    "tree": {"advantage": {"edge_baseline": "siblings"}, "tree": {"antithetic": True}},
    # trajectory GRPO, 8 trajectories per prompt, SDE on the same 3-step window (MixGRPO-style): the baseline
    "traj_window": {"tree": {"method": "trajectory", "group_size": 8}},
    # the baseline offered the tree's mirrored noise (pairs at its one branching step); reported, not tuned on
    "traj_window_mirrored": {"tree": {"method": "trajectory", "group_size": 8, "antithetic": True}},
    # trajectory GRPO with SDE on every step (DanceGRPO / Flow-GRPO-style)
    "traj_all": {"tree": {"method": "trajectory", "group_size": 8, "window_start": 0, "window_width": 10,
                          "tail_steps": 0}},
    # DiffusionNFT- and AWM-style flow matching on 8 independent ODE samples per prompt, at their own lr
    "nft": merge({"tree": {"method": "ode", "group_size": 8}, "optim": {"loss": "nft"}}, _PEER),
    "awm": merge({"tree": {"method": "ode", "group_size": 8}, "optim": {"loss": "awm"}}, _PEER),
    # the same objectives on a tree's 8 correlated leaves
    "tree_nft": {"advantage": {"edge_baseline": "siblings"}, "tree": {"antithetic": True},
                 "optim": {"loss": "nft", "lr": PEER_LR}},
    "tree_awm": {"advantage": {"edge_baseline": "siblings"}, "tree": {"antithetic": True},
                 "optim": {"loss": "awm", "lr": PEER_LR}},
})

_TAIL1 = {"tree": {"tail_steps": 1}}
_TAIL1TO2 = {"tree": {"tail_steps": 1, "tail_steps_schedule": [[0, 1], [60, 2]]}}


def _p(n: int) -> dict:
    return {"prompts_per_iter": n}


def _lr(x: float) -> dict:
    return {"optim": {"lr": x}}


def _lrhalf(it: int) -> dict:
    return {"optim": {"lr_factor_schedule": [[0, 1], [it, 0.5]]}}


def _v(method: str, *changes: dict) -> dict:
    out: dict = {}
    for c in changes:
        out = merge(out, c)
    return {"method": method, "changes": out}


#: named variants: (the method, the changes over it). Batch: ``_p<N>`` trains N prompts' trees per iteration (the
#: protocol's 24: 192 leaves); tail: one DPM++ step after the window (``tail1``), lengthened to two at iteration 60
#: (``tail1to2``); ``lrhalf<I>``: the lr halved at iteration I; shapes: where the window starts and how it branches
#: at the same leaves per prompt. ``tree_tail1to2_lrhalf100_p12`` is the demo's default (treegrpo/demo/config.py).
VARIANTS = Registry({
    "tree_p6": _v("tree", _p(6)), "tree_p8": _v("tree", _p(8)), "tree_p12": _v("tree", _p(12)),
    "traj_window_p12": _v("traj_window", _p(12)),
    "tree_p12_lr4e-3": _v("tree", _p(12), _lr(4e-3)), "tree_p12_lr9e-3": _v("tree", _p(12), _lr(9e-3)),
    "tree_tail1": _v("tree", _TAIL1), "tree_tail1_p12": _v("tree", _TAIL1, _p(12)),
    "tree_tail1_p12_lr4e-3": _v("tree", _TAIL1, _p(12), _lr(4e-3)),
    "tree_tail1to2_p12": _v("tree", _TAIL1TO2, _p(12)),
    **{f"tree_tail1to2_lrhalf{it}_p12": _v("tree", _TAIL1TO2, _lrhalf(it), _p(12)) for it in (60, 100, 150)},
    "tree_start0": _v("tree", {"tree": {"window_start": 0}}), "tree_start3": _v("tree", {"tree": {"window_start": 3}}),
    "tree_start0_p12": _v("tree", {"tree": {"window_start": 0}}, _p(12)),
    # branching all at one step: 8 children of the root (the window's first step)
    "tree_k8_w1": _v("tree", {"tree": {"branch": 8, "window_width": 1, "window_start": 1}}),
    "tree_k8_w1_start0": _v("tree", {"tree": {"window_start": 0, "window_width": 1, "branch": 8}}),
    "tree_42_start0": _v("tree", {"tree": {"window_start": 0, "window_width": 2, "branch_schedule": [4, 2]}}),
    # 16 leaves per prompt: 12 prompts keep the 192 leaves per iteration
    "tree_44_start0": _v("tree", {"tree": {"window_start": 0, "window_width": 2, "branch_schedule": [4, 4]}},
                         _p(12)),
    "tree_44_start0_p6": _v("tree", {"tree": {"window_start": 0, "window_width": 2, "branch_schedule": [4, 4]}},
                            _p(6)),
})


def window_start_for(steps: int) -> int:
    """The window starts at the same noise level at every T: σ = 1 - s/T = 0.9, as s = 1 at T = 10."""
    return max(1, round(steps / 10))


def all_step_width(steps: int, family: str) -> int:
    """SDE window of the all-step baseline: every step, except on DDIM families (sd, sdxl), whose last step
    has no noise (ᾱ' = 1)."""
    return steps - (family in ("sd", "sdxl"))


@dataclass(frozen=True)
class Protocol:
    """What every configuration starts from and the methods at those settings. ``base``: changes over the demo's
    config (the demo protocol) or, with ``whole`` True, a whole TrainConfig dict (``--base-config``: a diffusers
    model, its own tree and window)."""

    base: Mapping
    methods: Registry
    whole: bool = False

    def names(self) -> list[str]:
        return [*self.methods, *VARIANTS]

    def overrides(self, name: str) -> dict:
        """The changes that make registered configuration ``name`` (a fresh dict); an unknown name is refused with
        the names there are."""
        if name in self.methods:
            return self.methods[name]
        if name in VARIANTS:
            v = VARIANTS[name]
            return merge(self.methods[v["method"]], v["changes"])
        raise SystemExit(f"unknown configuration {name!r}: one of {sorted(self.names())}, or NAME=JSON (the changes "
                         "of a new one; e.g. 'mine={\"tree\": {\"branch\": 3}}')")

    def resolve(self, item: str) -> tuple[str, dict]:
        """A spec's method item: a registered name, or ``NAME=JSON`` (that name, with those changes over the demo
        protocol)."""
        name, _, js = item.partition("=")
        return name, (json.loads(js) if js else self.overrides(name))

    def run_overrides(self, overrides: Mapping) -> dict:
        """What a child run applies over the demo config: the protocol's base with ``overrides`` (or, for a whole
        base config, ``overrides`` alone: the child merges them into it)."""
        return dict(overrides) if self.whole else merge(self.base, overrides)

    def config_dict(self, overrides: Mapping) -> dict:
        """The whole TrainConfig dict a run of ``overrides`` trains with."""
        if self.whole:
            return merge(self.base, overrides)
        from treegrpo.demo.config import demo_config_dict

        return merge(demo_config_dict(), merge(self.base, overrides))


PEERS = ("nft", "awm", "tree_nft", "tree_awm")   # the flow-matching objectives, at their own learning rate


def protocol(*, lr: float = LR, steps: int = 10, tail: str = "fixed",
             base_config: Optional[Mapping] = None, peer_lr: Optional[float] = None) -> Protocol:
    """The demo protocol at learning rate ``lr`` and ``steps`` denoising steps: the window at the same noise level
    (:func:`window_start_for`) with the same width (the same 8 leaves and trajectories per prompt), the tail as
    ``TAILS[tail]``, the all-step baseline's SDE on all T steps, the ODE peers' samples as many DPM++ steps as a tree
    leaf's path, at ``peer_lr`` (default: the lr measured best for them on the demo, ``PEER_LR``). With
    ``base_config`` (a TrainConfig dict): every method starts from it, the trajectory baselines sample as many
    trajectories per prompt as its tree has leaves, the all-step baseline's SDE covers its steps, and the peers'
    samples are as long as its tree's leaves' paths, at ``peer_lr`` or else its own lr (the demo's PEER_LR was tuned
    on a 330K-parameter model)."""
    methods = {name: METHODS[name] for name in METHODS}
    if base_config is not None:
        from treegrpo.config import OptimConfig, TreeConfig

        t = TreeConfig(**base_config.get("tree", {}))
        for ov in methods.values():
            if ov.get("tree", {}).get("method") in ("trajectory", "ode"):
                ov["tree"]["group_size"] = t.leaves
                ov["tree"]["branch_schedule"] = []          # the base's tree shape is not theirs
            if ov.get("tree", {}).get("method") == "ode":   # independent whole samples: no window, cap or mirror
                ov["tree"].update(window_schedule="fixed", leaf_cap=0, antithetic=None)
        if peer_lr is None:
            peer_lr = base_config.get("optim", {}).get("lr", OptimConfig.__dataclass_fields__["lr"].default)
        path = t.window_start + t.window_width + (t.tail_steps or t.steps - t.window_start - t.window_width)
        for name in PEERS:
            methods[name]["optim"]["lr"] = peer_lr
            if methods[name]["tree"].get("method") == "ode":
                methods[name]["tree"]["tail_steps"] = path
        family = base_config.get("pipeline", {}).get("family", "auto")
        if family == "auto" and base_config.get("backend") == "diffusers" and base_config.get("model"):
            from treegrpo.backends.diffusers import detect_family
            family = detect_family(base_config["model"], base_config.get("pipeline", {}).get("config"))
        methods["traj_all"]["tree"].update(window_width=all_step_width(t.steps, family), window_schedule="fixed",
                                           window_max_start=-1)     # the SDE on every step: nowhere to move
        return Protocol(Registry({"b": base_config})["b"], Registry(methods), whole=True)
    if tail not in TAILS:
        raise SystemExit(f"--tail {tail!r}: one of {sorted(TAILS)}")
    base = merge(BASE, {"optim": {"lr": lr}})
    if peer_lr is not None:
        for name in PEERS:
            methods[name]["optim"]["lr"] = peer_lr
    if (steps, tail) != (10, "fixed"):
        s, w = window_start_for(steps), base["tree"]["window_width"]
        if s + w > steps:
            raise SystemExit(f"--steps {steps}: the window (start {s}, width {w}) does not fit")
        tail_steps = base["tree"]["tail_steps"] if tail == "fixed" else 0
        base["tree"].update(steps=steps, window_start=s, tail_steps=tail_steps)
        methods["traj_all"]["tree"]["window_width"] = steps
        for name in ("nft", "awm"):
            methods[name]["tree"]["tail_steps"] = s + w + (tail_steps or steps - s - w)
    return Protocol(Registry({"b": base})["b"], Registry(methods))


DEMO = protocol()


def provenance(configs: Optional[Mapping] = None) -> dict:
    """How a result file was made, for its JSON: the command, the commit (and whether the tree had changes), Python,
    torch, the machine and its CPU; ``configs``: each method's changes to the protocol's base (the base included
    as ``base``)."""
    import platform

    import torch

    def git(*args: str) -> Optional[str]:
        try:
            return subprocess.run(["git", *args], cwd=os.path.dirname(os.path.abspath(__file__)),
                                  capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    cpu = platform.processor() or None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"command": [os.path.basename(sys.executable), *sys.argv], "commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(status) if status is not None else None,
            "python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            **({"configs": {k: dict(v) for k, v in configs.items()}} if configs is not None else {})}


def split_items(spec: str) -> list[str]:
    """A ``--methods`` list: commas separate the items except inside a NAME=JSON item's braces."""
    items, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch in "{[") - (ch in "}]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [m for m in items + [cur] if m]


# ------------------------------------------------------------------------------------------------ running
def run_child(argv: list[str]) -> tuple[str, int, "os.struct_rusage"]:
    """Run ``argv`` to the end: its whole stdout, its wait status and its own resource usage (peak RSS). The output
    is read to its end before the wait: a record longer than the pipe's buffer (64 KiB: a run of ~270 iterations)
    would otherwise block the child in its last write while the parent waits for it to exit."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = status   # reaped here: Popen must not wait for it again
    return out, status, usage


def run_one(proto: Protocol, name: str, overrides: Mapping, seed: int, budget: Optional[float], out_dir: str, *,
            threads: int = THREADS, evals: int = EVALS, **extra) -> dict:
    """One training run of ``overrides`` (recorded as ``name``) in a child process; returns its record with the
    child's own peak RSS (MB). ``budget``: training seconds, evaluated every budget/``evals`` s; or None with
    ``iterations`` and ``eval_every`` in ``extra`` (a work budget); ``eval_every_s`` overrides the time cadence."""
    spec = json.dumps({"overrides": proto.run_overrides(overrides), "seed": seed, "budget": budget, "out": out_dir,
                       "threads": threads, "base": dict(proto.base) if proto.whole else None, "evals": evals,
                       **extra})
    out, status, usage = run_child([sys.executable, os.path.abspath(__file__), "--child", spec])
    if status != 0:
        raise RuntimeError(f"run {name} seed {seed} failed (status {status})")
    rec = json.loads(out.strip().splitlines()[-1])
    rec.update(method=name, seed=seed, peak_rss_mb=usage.ru_maxrss / 1024)
    return rec


def child(spec: dict) -> None:
    """The child's side of :func:`run_one`: train, print the record as one JSON line."""
    import torch

    from treegrpo.config import TrainConfig
    from treegrpo.demo.config import demo_config_dict
    from treegrpo.run import run_training

    torch.set_num_threads(spec.get("threads", 1))
    base = spec.get("base")
    d = merge(base, spec["overrides"]) if base else merge(demo_config_dict(), spec["overrides"])
    budget = spec.get("budget")
    d.update(seed=spec["seed"], iterations=spec.get("iterations") or 100000, time_budget_s=budget or 0.0,
             eval_every=spec.get("eval_every", 0),
             eval_every_s=spec.get("eval_every_s") or (budget / spec.get("evals", 8) if budget else 0.0), eval_seeds=4,
             checkpoint_every=0, output_dir=spec["out"], run_name="bench")
    d["signals"] = {**d.get("signals", {}), "kl_estimate": False}   # the tables do not use it; 20 % of an evaluation
    cfg = TrainConfig.from_dict(d)
    tr, summary = run_training(cfg, progress=False, write_lora=False)
    hist = tr.history
    split = {k: sum(h[k] for h in hist) / len(hist) for k in ("t_sample", "t_decode", "t_reward", "t_update", "t_iter")}
    print(json.dumps({"evals": tr.evals, "iterations": tr.iteration, "train_time": tr.train_time,
                      "leaves_per_iter": cfg.prompts_per_iter * cfg.trees_per_prompt * cfg.tree.leaves,
                      "total_nfe": tr.total_nfe, "split": split, "nfe_per_iter": hist[0]["nfe"],
                      "flat_trees": sum(h["flat_trees"] for h in hist)}))


# ------------------------------------------------------------------------------------------------ statistics
def time_to_reach(evals: list[dict], target: float, key: str = "train_time") -> float:
    """First training time (or NFE, or iteration: ``key``) at which the eval reward reaches ``target`` (linear
    interpolation between evaluations; NaN when it never does)."""
    prev = None
    for e in evals:
        if e["eval_reward"] >= target:
            if prev is None:
                return e[key]
            f = (target - prev["eval_reward"]) / max(1e-12, e["eval_reward"] - prev["eval_reward"])
            return prev[key] + f * (e[key] - prev[key])
        prev = e
    return math.nan


def smooth_evals(evals: list[dict], width: int) -> list[dict]:
    """The evaluation curve as a moving average over ``width`` consecutive evaluations: every numeric field is
    averaged, the training time and NFE included, so each point sits at the mean time of the evaluations behind it.
    The first evaluation (the base model, the same for every method) stays as the curve's start. ``width`` 1, or a
    curve shorter than ``width``, is returned as it is."""
    if width <= 1 or len(evals) <= width:
        return evals
    keys = [k for k, v in evals[0].items() if isinstance(v, (int, float)) and all(k in e for e in evals)]
    return [evals[0]] + [{k: sum(e[k] for e in evals[i:i + width]) / width for k in keys}
                         for i in range(len(evals) - width + 1)]


def reward_at(evals: list[dict], t: float) -> float:
    """The eval reward at training time ``t`` (s), interpolated; the last one past the curve's end."""
    pts = [(e["train_time"], e["eval_reward"]) for e in evals]
    for (t0, r0), (t1, r1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return r0 + (r1 - r0) * (t - t0) / max(1e-12, t1 - t0)
    return pts[-1][1]


def diversity_at_reward(evals: list[dict], target: float) -> float:
    """Eval diversity where the reward first reaches ``target`` (interpolated); diversity at equal reward
    is the fair comparison (it falls as any method's reward rises)."""
    t = time_to_reach(evals, target)
    if math.isnan(t):
        return math.nan
    pts = [(e["train_time"], e["eval_diversity"]) for e in evals]
    for (t0, d0), (t1, d1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return d0 + (d1 - d0) * (t - t0) / max(1e-12, t1 - t0)
    return pts[0][1]


def mean_std(xs) -> tuple[float, float, int]:
    """(mean, sample standard deviation, count) over the values that are not NaN (NaN, NaN, 0 when none are)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan, 0
    m = sum(xs) / len(xs)
    return m, (sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1)) ** 0.5, len(xs)


def paired(runs: list[dict], base_runs: list[dict], target: Callable[[list], float],
           base_time: Callable[[list], float]) -> dict:
    """{seed: the time a run needs to reach ``target(baseline evals)`` over ``base_time(baseline evals)``} for the
    seeds the baseline has; NaN where the run never gets there or the baseline's time is 0."""
    base = {r["seed"]: r["evals"] for r in base_runs}
    out = {}
    for r in runs:
        if r["seed"] in base:
            b = base[r["seed"]]
            t_b = base_time(b)
            out[r["seed"]] = time_to_reach(r["evals"], target(b)) / t_b if t_b > 0 else math.nan
    return out


def final_reward(evals: list[dict]) -> float:
    return evals[-1]["eval_reward"]


def best_reward(evals: list[dict]) -> float:
    return max(e["eval_reward"] for e in evals)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        raise SystemExit("harness.py runs as the child of a benchmark (--child SPEC); run bench_budget.py or "
                         "bench_methods.py")
