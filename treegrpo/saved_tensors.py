"""Copy-on-write protection of the tensors autograd saves for backward.

Some ComfyUI blocks update activations in place after an op saved them (Flux and Chroma's double blocks:
``img += attn``, then ``img_norm2(img)`` saves ``img``, then ``img += mlp``). Plain autograd refuses such a graph
(version counters); under non-reentrant ``torch.utils.checkpoint`` the recomputation stores what it recomputes
without a version check, so backward silently reads the *mutated* tensor and the gradient is wrong.

:func:`copy_on_write_saved` fixes both without copying what is never mutated: every tensor autograd saves is kept
as an alias, and a dispatch mode copies an alias's data just before an op writes into its storage. Memory: only
the saved tensors that are later written in place are duplicated (Flux's residual streams), nothing else.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_WRITES: dict = {}   # OpOverload -> indices / names of the arguments it writes (schema alias_info.is_write)


def _written_arguments(func) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of every argument the op ``func`` (an ``OpOverload``) writes into."""
    got = _WRITES.get(func)
    if got is None:
        got = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write)
        _WRITES[func] = got
    return got


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):   # sparse, nested or opaque tensors: not tracked
        return None


class _CopyOnWrite(TorchDispatchMode):
    """Keeps weak references to the aliases autograd saved, by storage; an op about to write into one of those
    storages first gives each alias a private copy of its current value (``alias.data = alias.clone()``)."""

    def __init__(self):
        super().__init__()
        self.saved: dict = {}
        self.copies = 0          # how many saved tensors had to be copied (diagnostics, tests)
        self.copied_bytes = 0

    def track(self, alias: torch.Tensor) -> None:
        key = _storage_key(alias)
        if key is not None:
            self.saved.setdefault(key, []).append(weakref.ref(alias))

    def _protect(self, t) -> None:
        if isinstance(t, (list, tuple)):
            for u in t:
                self._protect(u)
            return
        if not isinstance(t, torch.Tensor):
            return
        refs = self.saved.pop(_storage_key(t), None)
        for ref in refs or ():
            alias = ref()
            if alias is not None:
                alias.data = alias.clone()
                self.copies += 1
                self.copied_bytes += alias.numel() * alias.element_size()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.saved:
            for i, name in _written_arguments(func):
                self._protect(args[i] if i < len(args) else kwargs.get(name))
        return func(*args, **kwargs)


def _hooks_below():
    """The (pack, unpack) saved-tensor hooks active now (a checkpoint's recomputation hook), or None."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


@contextlib.contextmanager
def copy_on_write_saved(enabled: bool = True) -> Iterator[_CopyOnWrite | None]:
    """Within the block, every tensor autograd saves keeps the value it had when saved, even if the code writes
    into it (or into a view of its storage) afterwards. Stacks on the saved-tensor hooks already active (inside
    ``torch.utils.checkpoint``'s recomputation it hands the protected alias to checkpoint's own hook). Yields the
    dispatch mode (its ``copies`` / ``copied_bytes`` say what was copied), or None when not ``enabled``."""
    if not enabled:
        yield None
        return
    below = _hooks_below()
    mode = _CopyOnWrite()

    def pack(x):
        alias = x.detach()
        mode.track(alias)
        return below[0](alias) if below is not None else alias

    def unpack(h):
        return below[1](h) if below is not None else h

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), mode:
        yield mode
