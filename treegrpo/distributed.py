"""Data-parallel training over several processes (``torchrun`` or ``accelerate launch``).

Each rank samples and scores its share of the trees (whole prompts, round-robin), computes the
gradient of the mean GRPO loss over its own edges, and the gradients are combined into the gradient of
the mean over *all* edges — exactly what one process over all trees computes:

    g = Σ_r E_r·g_r / Σ_r E_r        (E_r: trained edges on rank r)

Process-group set-up and device placement come from accelerate's ``PartialState``, which reads the
environment that both launchers write (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...). Only rank 0
writes files; no collective runs inside a save, so a slow disk cannot leave peers hanging in one.
"""
from __future__ import annotations

import datetime
import math
import os
from typing import Optional

import torch
import torch.distributed as dist

from .advantages import weighted_raw


#: how long a process waits in a collective for the others (seconds; ``TREEGRPO_DIST_TIMEOUT_S``): rank 0 evaluates
#: and writes files alone while the others wait for it at their next all-reduce, and an evaluation of a large model
#: takes longer than torch's default (10 minutes with NCCL)
DEFAULT_TIMEOUT_S = 2 * 3600


def collective_timeout() -> datetime.timedelta:
    """``TREEGRPO_DIST_TIMEOUT_S`` seconds (default :data:`DEFAULT_TIMEOUT_S`)."""
    raw = os.environ.get("TREEGRPO_DIST_TIMEOUT_S", "")
    try:
        s = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        s = float("nan")
    if not (math.isfinite(s) and s > 0):
        from .config import ConfigError
        raise ConfigError(f"TREEGRPO_DIST_TIMEOUT_S {raw!r}: give the seconds a process may wait for the others "
                          f"(default {DEFAULT_TIMEOUT_S})")
    return datetime.timedelta(seconds=s)


def flat_settings(d: dict, prefix: str = "") -> dict:
    """A nested config dict as ``{"optim.lr": 3e-4, ...}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_settings(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def launched() -> bool:
    """True when started by torchrun / accelerate launch with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


class DataParallel:
    """Rank/world of this process and the edge-weighted gradient all-reduce the trainer calls."""

    def __init__(self, cpu: bool = False, backend: Optional[str] = None):
        """``cpu``: processes on the CPU (gloo); else one accelerator per process (nccl on CUDA)."""
        from accelerate import PartialState

        kw = {"backend": backend} if backend else {}
        self.state = PartialState(cpu=cpu, timeout=collective_timeout(), **kw)
        if launched() and self.state.num_processes == 1:
            raise RuntimeError("launched with WORLD_SIZE > 1 but no process group could be set up; on the CPU "
                               "run with --device cpu")
        self.rank = self.state.process_index
        self.world = self.state.num_processes
        self.device = self.state.device

    def all_reduce_grads(self, params: list[torch.nn.Parameter], n_edges: int) -> int:
        """Replace every ``p.grad`` by the edge-weighted mean over ranks (one flat all-reduce); returns the edges
        of all ranks (0: no rank steps, as one process over all trees would not)."""
        if self.world == 1:
            return n_edges
        ref = params[0]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.detach().float().reshape(-1) * n_edges for g in grads]
                         + [torch.tensor([float(n_edges)], device=ref.device)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        total = float(flat[-1])
        flat = flat[:-1] / max(total, 1.0)
        off = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[off:off + n].view_as(g).to(g.dtype).clone()
            off += n
        return int(round(total))

    def check_same_settings(self, settings: dict) -> None:
        """Refuse, on every process at once, a run whose processes were given different settings (``settings``: the
        config as a dict): each trains a share of one batch with one LoRA, so a process with another learning rate,
        LoRA or number of iterations would train apart silently or wait forever for the others."""
        if self.world == 1:
            return
        ref = flat_settings(self.broadcast_object(settings))
        mine = flat_settings(settings)
        diff = sorted(k for k in set(ref) | set(mine) if ref.get(k, "<none>") != mine.get(k, "<none>"))
        every = [None] * self.world
        dist.all_gather_object(every, diff)
        bad = [(r, d) for r, d in enumerate(every) if d]
        if bad:
            from .config import ConfigError
            said = "; ".join(f"process {r}: {', '.join(d[:6])}{' ...' if len(d) > 6 else ''}" for r, d in bad)
            raise ConfigError(f"the {self.world} processes were started with different settings than process 0 "
                              f"({said}): give every process the same config file and flags")

    def sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum of a 1-D float tensor over ranks (batch statistics for the logs), on the CPU."""
        if self.world == 1:
            return values
        t = values.detach().to(self.device, torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu()

    def max_over_ranks(self, value: float) -> float:
        """The largest ``value`` over ranks (the training clock: every rank must see the same time, or the
        time budget and a time-based lr schedule would differ between them)."""
        if self.world == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def broadcast_object(self, obj):
        """The first process's ``obj`` (any picklable value: a checkpoint's state), on every process."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device if dist.get_backend() == "nccl" else None)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        """Tear the group down together: rank 0 is still writing files when the others finish, and a rank
        that destroys its gloo group while a peer is busy can abort at exit ("terminate called without an
        active exception", seen once in CI)."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


#: per-iteration statistics summed over ranks, and those averaged per trained edge
SUMMED = ("flat_trees", "scored_trees", "nfe", "edges", "parents", "forwards", "ref_forwards")
PER_EDGE = ("loss", "kl", "ratio_mean", "clip_frac")


def pool_over_ranks(stats: dict, raw: dict, weights: dict, group) -> None:
    """Data parallel: replace the rank-local batch statistics in ``stats`` by the whole batch's (every
    rank's trees): reward mean/std over all leaves, counts summed, per-edge means weighted by edges.
    ``raw``: {name: (n_leaves,)} this rank's raw rewards; ``group``: a :class:`DataParallel` (``sum_over_ranks``).
    Timings stay this rank's; ``grad_norm`` is already global (taken after the all-reduce)."""
    names = sorted(raw)
    total = weighted_raw(raw, weights).double()
    e = float(stats["edges"])
    vec = [total.numel(), float(total.sum()), float((total ** 2).sum())]
    vec += [float(raw[k].double().sum()) for k in names]
    vec += [float(stats.get(k, 0)) for k in SUMMED] + [float(stats.get(k, 0)) * e for k in PER_EDGE]
    out = group.sum_over_ranks(torch.tensor(vec, dtype=torch.float64)).tolist()
    n, s1, s2 = out[:3]
    stats["reward"] = s1 / n
    stats["reward_std"] = math.sqrt(max(s2 / n - (s1 / n) ** 2, 0.0))
    for k, v in zip(names, out[3:3 + len(names)]):
        stats[f"reward/{k}"] = v / n
    rest = out[3 + len(names):]
    for k, v in zip(SUMMED, rest):
        stats[k] = int(round(v))
    edges = stats["edges"]
    for k, v in zip(PER_EDGE, rest[len(SUMMED):]):
        stats[k] = v / edges if edges else stats[k]
