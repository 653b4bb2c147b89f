"""What a ComfyUI ``MODEL`` is on top of its checkpoint: the nodes in front of the Train node or the Tree Sampler
(LoraLoader, ModelSamplingDiscrete / SD3 / Flux / AuraFlow, RescaleCFG, attention patches, ...) make it another model
to train on. The trained LoRA is a change on top of exactly that model, so a run records it (``run.json``, the LoRA's
``treegrpo.model_chain`` metadata) and a resume compares it: another prediction type or other weights under the LoRA
are another model (refused, as another base model is); another noise schedule or sampling patch is said on the
console. Pure description: nothing here changes the model."""
from __future__ import annotations

import hashlib
import logging
from typing import Any

#: elements of one tensor read into the weights' digest: a strided sample, so a model merged in as full weights
#: costs milliseconds, not a pass over gigabytes (another LoRA or strength changes every sample)
SAMPLE = 4096


def _feed(h, x: Any) -> None:
    import torch

    if isinstance(x, torch.Tensor):
        flat = x.detach().reshape(-1)
        step = max(1, -(-flat.numel() // SAMPLE))
        part = flat[::step][:SAMPLE].float().cpu()
        h.update(f"T{tuple(x.shape)}{x.dtype}".encode())
        h.update(part.numpy().tobytes())
    elif isinstance(x, (list, tuple)):
        h.update(b"(")
        for v in x:
            _feed(h, v)
        h.update(b")")
    elif x is None or isinstance(x, (bool, int, float, str)):
        h.update(repr(x).encode())
    elif hasattr(x, "weights"):                    # ComfyUI's weight adapters (LoRA, LoHa, ...): their tensors
        h.update(type(x).__name__.encode())
        _feed(h, x.weights)
    else:                                          # a function, another object: its name
        h.update(getattr(x, "__qualname__", type(x).__name__).encode())


def _digest(x: Any) -> str:
    h = hashlib.sha256()
    _feed(h, x)
    return h.hexdigest()


def _names(fns) -> list[str]:
    fns = fns if isinstance(fns, (list, tuple)) else [fns]
    return [getattr(f, "__qualname__", type(f).__name__) for f in fns]


def _schedule(sampling) -> dict:
    def num(v):
        return None if v is None else float(f"{float(v):.6g}")
    return {k: num(getattr(sampling, k, None)) for k in ("sigma_min", "sigma_max", "shift")}


def describe(model) -> dict:
    """The model's chain as a JSON-able dict: ``sampling`` (its prediction: eps / v / flow / edm / ...),
    ``schedule`` (σ_min, σ_max, shift, to 6 digits), ``weights`` (the patched weight count and a digest of the
    patches: the LoRAs loaded in front, their strengths), ``patches`` (the sampling patches' names, sorted),
    ``on_top`` (whether it is more than the checkpoint alone: a LoRA, a sampling patch, or a prediction or schedule
    other than the checkpoint's own)."""
    from .families import kind_of, own_sampling

    base = getattr(model, "model", model)
    sampling = model.get_model_object("model_sampling") if hasattr(model, "get_model_object") else base.model_sampling
    own = own_sampling(base) or sampling
    schedule = _schedule(sampling)
    resampled = kind_of(sampling, base) != kind_of(own, base) or schedule != _schedule(own)
    patches = getattr(model, "patches", None) or {}
    h = hashlib.sha256()
    for key in sorted(patches):
        h.update(key.encode())
        for entry in sorted(_digest(p) for p in patches[key]):     # LoraLoaders in another order: the same model
            h.update(entry.encode())
    opts = getattr(model, "model_options", None) or {}
    # what else a node put on the model, by name: ComfyUI 0.33's bypass LoRA loaders (injections), object patches
    # other than the sampling (the pack's own Trainer Step output carries its LoRA as object patches: not digested)
    names = [f"injection:{k}" for k in sorted(getattr(model, "injections", None) or {})]
    names += [f"object_patch:{k}" for k in sorted(getattr(model, "object_patches", None) or {}) if k != "model_sampling"]
    for k in ("sampler_cfg_function", "model_function_wrapper"):
        if opts.get(k) is not None:
            names += [f"{k}:{n}" for n in _names(opts[k])]
    for k in ("sampler_pre_cfg_function", "sampler_post_cfg_function"):
        names += [f"{k}:{n}" for n in _names(opts.get(k) or [])]
    to = opts.get("transformer_options") or {}
    for group in ("patches", "patches_replace"):
        for name, fns in sorted((to.get(group) or {}).items()):
            names += [f"{group}.{name}:{n}" for n in (_names(fns) if group == "patches" else sorted(map(str, fns)))]
    names += [f"transformer_options.{k}" for k in ("rope_options", "optimized_attention_override") if to.get(k)]
    return {"sampling": kind_of(sampling, base), "schedule": schedule,
            "weights": {"patched": len(patches), "digest": h.hexdigest()[:16] if patches else ""},
            "patches": sorted(names), "on_top": bool(patches or names or resampled)}


def compare(saved: dict, now: dict, *, strengths_said: bool = False) -> tuple[list[str], list[str]]:
    """(changes that make it another model, changes said on the console) from ``saved`` to ``now``: another
    prediction type or other weights under the LoRA; another schedule or other sampling patches. ``strengths_said``:
    other values of the same patched weights (a LoRA's strength in front) go with the said."""
    other, said = [], []
    if saved.get("sampling") != now["sampling"]:
        other.append(f"its prediction {saved.get('sampling')} -> {now['sampling']} (a ModelSampling node added, "
                     "removed or set to another type)")
    w0, w1 = saved.get("weights") or {}, now["weights"]
    n0, n1 = w0.get("patched", 0), w1["patched"]
    if n0 == n1 and w0.get("digest") != w1["digest"]:
        (said if strengths_said else other).append(f"the weights under the LoRA: a LoRA loaded in front is another one or at another strength (the "
                     f"same {n1} weights patched, with other values)")
    elif n0 != n1:
        other.append(f"the weights under the LoRA: {n0} weights patched by the nodes in front (LoraLoader) -> {n1} "
                     "(a LoRA added or removed)")
    s0, s1 = saved.get("schedule") or {}, now["schedule"]
    moved = [f"{k} {s0.get(k)} -> {s1[k]}" for k in s1 if s0.get(k) != s1[k]]
    if moved:
        said.append(f"its noise schedule: {', '.join(moved)}")
    p0, p1 = saved.get("patches") or [], now["patches"]
    if p0 != p1:
        gone, new = sorted(set(p0) - set(p1)), sorted(set(p1) - set(p0))
        said.append("its sampling patches:" + (f" without {', '.join(gone)}" if gone else "")
                    + (f" with {', '.join(new)}" if new else ""))
    return other, said


def describe_or_none(model) -> dict | None:
    """:func:`describe`, or None (logged: the run is then not compared on resume) for a model it cannot read (a
    tensor it cannot sample, a patcher of another kind): describing never stops a run."""
    try:
        return describe(model)
    except Exception as e:  # noqa: BLE001
        logging.warning("TreeGRPO: could not describe the model in front (%s: %s); a resume will not compare it",
                        type(e).__name__, e)
        return None


def check_resumed(folder: str, run_name: str, now: dict | None, hint: str, *, steps: bool = False) -> None:
    """:func:`check_same_model` against the chain of the run in ``folder`` when it has a checkpoint to resume
    (its ``run.json``), the console lines logged."""
    from .. import checkpoint as ckpt

    if now is None or not ckpt.checkpoint_paths(folder, run_name):
        return
    for line in check_same_model((ckpt.folder_owner(folder) or {}).get("model_chain"), now, run_name, hint,
                                 steps=steps):
        logging.warning(line)


def check_same_model(saved: dict | None, now: dict | None, run_name: str, hint: str, *,
                     steps: bool = False) -> list[str]:
    """Before a run continues: :class:`ValueError` when ``now`` is another model than the ``saved`` chain (the run's
    ``run.json``; None for a run recorded before chains were, which is not compared), naming what changed and
    ``hint`` (the ways on); else the console lines for what changed without making it another model. ``steps``:
    the step nodes' run, whose settings may change between queued prompts: other values of the same patched weights
    (a LoRA strength in front) are said, not refused. A changed schedule or sampling patch is said, as a changed
    scheduler applies on resume."""
    if not saved or not now:
        return []
    other, said = compare(saved, now, strengths_said=steps)
    if other:
        raise ValueError(f"run {run_name!r} was trained on another model than the one in front of it now: "
                         f"{'; '.join(other)}. Its LoRA is a change on top of the model it was trained on: give it "
                         f"that model again, or {hint}; nothing has been trained yet")
    return [f"TreeGRPO {run_name}: continues with {s} (it last trained with the earlier one)" for s in said]
