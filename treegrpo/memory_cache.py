"""The memory probe kept between runs. A fake probe (:func:`treegrpo.memory.probe_policy`) depends only on the models'
shapes and dtypes, the run's size and settings, the device and the code that traced it; on the largest models it takes
minutes of CPU before the first iteration. Each probe's :class:`~treegrpo.memory.Footprint` is kept in a JSON file
named by the hash of those facts (:func:`probe_facts`), so a run of the same model at the same size — the second run
of a workflow, a run resumed — plans at once. A file whose facts differ in any way is not used.

Where: ``$TREEGRPO_CACHE/memory_probes`` (default ``$XDG_CACHE_HOME/treegrpo``, else ``~/.cache/treegrpo``); off with
``memory.reuse_probe`` false. The folder keeps the :data:`KEEP` probes used last (a probe used again counts as new);
older ones — other models, sizes, earlier versions of the pack — are removed when a new one is kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Callable, Optional, Sequence

import torch

from .memory import Footprint

FORMAT = "treegrpo-memory-probe"
VERSION = 1
KEEP = 64                                   # probes kept in the folder (each a few kB)
_NAME = re.compile(r"^[0-9a-f]{32}\.json$")   # a kept probe's file name (:func:`key`); nothing else is removed


def cache_dir() -> str:
    """The folder of kept probes (see the module docstring)."""
    root = os.environ.get("TREEGRPO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "treegrpo")
    return os.path.join(root, "memory_probes")


def module_signature(module: Optional[torch.nn.Module]) -> Optional[str]:
    """sha256 of every parameter's and buffer's name, shape and dtype (not their values: two fine-tunes of one
    architecture share it); None for no module."""
    if module is None:
        return None
    h = hashlib.sha256()
    for kind, items in (("p", module.named_parameters()), ("b", module.named_buffers())):
        for name, t in items:
            h.update(f"{kind}:{name}:{tuple(t.shape)}:{t.dtype};".encode())
    return h.hexdigest()


def tree_shapes(x: Any) -> Any:
    """The shapes and dtypes of a conditioning pytree's tensors (other leaves by their type)."""
    if isinstance(x, torch.Tensor):
        return [list(x.shape), str(x.dtype)]
    if isinstance(x, dict):
        return {str(k): tree_shapes(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [tree_shapes(v) for v in x]
    return type(x).__name__


def source_hash() -> str:
    """sha256 (16 hex digits) of every module of this package: the code that traced the probe (memory.py, the
    backends, ComfyUI's families), so an updated pack measures again."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:16]


def device_facts(device: torch.device) -> dict:
    """The device the probe traced for (its kind, and a GPU's name and compute capability)."""
    device = torch.device(device)
    out = {"type": device.type}
    if device.type == "cuda" and torch.cuda.is_available():
        idx = device.index if device.index is not None else torch.cuda.current_device()
        out.update(name=torch.cuda.get_device_name(idx), capability=list(torch.cuda.get_device_capability(idx)))
    return out


def probe_facts(policy, prompt: str, guidance: float, params: Sequence[torch.Tensor], *, rewards: Sequence = (),
                kl: bool = False, rows: Optional[dict] = None) -> dict:
    """Everything the fake probe of :func:`treegrpo.memory.probe_policy` with these arguments depends on (JSON)."""
    from . import __version__

    return {
        "code": {"treegrpo": __version__, "torch": torch.__version__, "source": source_hash()},
        "policy": f"{type(policy).__module__}.{type(policy).__qualname__}",
        "models": policy.memory_signature(),
        "weights": {k: int(v) for k, v in policy.memory_weights().items()},
        "denoiser_params": int(policy.denoiser_parameters()),
        "device": device_facts(policy.device),
        "latent": [int(s) for s in policy.latent_shape()],
        "cond": tree_shapes(policy.encode_prompts([prompt])),
        "cfg": float(guidance) != 1.0,
        "lora": [[list(p.shape), str(p.dtype)] for p in params],
        "rewards": [[type(r).__qualname__, getattr(r, "name", None),
                     int(r.model_size()) if hasattr(r, "model_size") else None, getattr(r, "batch_size", None)]
                    for r in rewards],
        "kl": bool(kl),
        "rows": {k: sorted(int(r) for r in v) for k, v in sorted((rows or {}).items())},
    }


def key(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def _path(facts: dict, folder: Optional[str]) -> str:
    return os.path.join(folder or cache_dir(), key(facts) + ".json")


def load(facts: dict, folder: Optional[str] = None,
         log: Callable[[str], None] = print) -> Optional[tuple[Footprint, str]]:
    """The kept footprint of a probe with exactly these ``facts`` and its file, or None (none kept; a file that
    cannot be read is said in one line and measured again)."""
    path = _path(facts, folder)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("format") != FORMAT or data.get("version") != VERSION or data.get("facts") != facts:
            return None
        kept = Footprint.from_dict(data["footprint"]), path
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log(f"TreeGRPO memory: the kept measurement {path} cannot be read ({type(e).__name__}: {e}); measuring again")
        return None
    try:
        os.utime(path)              # used now: the last to be pruned
    except OSError:
        pass
    return kept


def store(facts: dict, footprint: Footprint, folder: Optional[str] = None,
          log: Callable[[str], None] = print) -> Optional[str]:
    """Keep ``footprint`` for the next run with these ``facts``; returns the file, or None where it cannot be
    written (said in one line; the run goes on)."""
    from .io import atomic_write_json

    path = _path(facts, folder)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_json(path, {"format": FORMAT, "version": VERSION, "facts": facts,
                                 "footprint": footprint.to_dict()})
        prune(os.path.dirname(path), keep=KEEP)
        return path
    except OSError as e:
        log(f"TreeGRPO memory: cannot keep the measurement for the next run in {path} ({e}); set TREEGRPO_CACHE to a "
            "writable folder, or memory.reuse_probe false")
        return None


def prune(folder: str, keep: int = KEEP) -> list[str]:
    """Remove all but the ``keep`` most recently used probe files of ``folder`` (by modification time; a load
    touches its file); files not named like a probe are left alone. Returns the removed paths. Best effort: a file
    that cannot be removed stays."""
    try:
        names = [n for n in os.listdir(folder) if _NAME.match(n)]
    except OSError:
        return []

    def mtime(n):
        try:
            return os.path.getmtime(os.path.join(folder, n))
        except OSError:
            return 0.0

    removed = []
    for n in sorted(names, key=mtime, reverse=True)[keep:]:
        try:
            os.remove(os.path.join(folder, n))
            removed.append(os.path.join(folder, n))
        except OSError:
            pass
    return removed
