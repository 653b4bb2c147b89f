"""LoRA on the policy with PEFT, and LoRA files in ComfyUI and diffusers/PEFT key formats.

ComfyUI keys (what its SaveLoRA writes and LoraLoader reads), per adapted Linear ``<module>``:
``diffusion_model.<module>.lora_down.weight`` (r, in) = PEFT ``lora_A``,
``diffusion_model.<module>.lora_up.weight`` (out, r) = PEFT ``lora_B``,
``diffusion_model.<module>.alpha`` (scalar). The scale applied is ``alpha / r``.
PEFT/diffusers keys: ``<prefix><module>.lora_A.weight`` / ``.lora_B.weight`` (prefix e.g. ``unet.``).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

from .config import LoraConfig
from .io import atomic_write

COMFY_PREFIX = "diffusion_model."


class LoraFileError(ValueError):
    """A LoRA file is missing, corrupt, or does not fit the model."""


@dataclass
class LoraWeights:
    """Adapter weights per module path: ``down`` (r, in) and ``up`` (out, r), with ``alpha``."""

    down: dict[str, torch.Tensor]
    up: dict[str, torch.Tensor]
    alpha: dict[str, float]

    @property
    def modules(self) -> list[str]:
        return sorted(self.down)


def with_alpha(w: LoraWeights, alpha: float) -> LoraWeights:
    """The same LoRA with every module's alpha ``alpha``: each ``up`` (out, r) is scaled by ``alpha_n / alpha`` so
    every module's update ``(alpha_n / r)·up·down`` is unchanged (a file whose modules have other alphas then fits a
    LoRA with one alpha, and PEFT's single ``lora_alpha``)."""
    up = {n: (u if w.alpha[n] == alpha else u * (w.alpha[n] / alpha)) for n, u in w.up.items()}
    return LoraWeights(dict(w.down), up, {n: float(alpha) for n in w.down})


def is_target(name: str, targets: list[str]) -> bool:
    """Whether module path ``name`` is one of ``targets``: a target is a whole path or its last components
    (``to_q`` names ``blocks.0.attn.to_q``), as PEFT's ``target_modules`` reads them."""
    return any(name == t or name.endswith("." + t) for t in targets)


def add_lora(model: nn.Module, cfg: LoraConfig, adapter_name: str = "default",
             rank_pattern: Optional[dict[str, int]] = None) -> list[nn.Parameter]:
    """Inject PEFT LoRA layers into ``model`` (in place), freeze the base; returns the LoRA parameters.
    ``rank_pattern`` (module path -> rank) overrides ``cfg.rank`` for some modules (PEFT's own option)."""
    from peft import LoraConfig as PeftLoraConfig, inject_adapter_in_model

    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]

    def matches(t: str) -> bool:
        return any(is_target(n, [t]) for n in names)

    # diffusers keeps the output projection in a ModuleList (``to_out.0``): ``to_out`` means that Linear
    targets = [t if matches(t) or not matches(t + ".0") else t + ".0" for t in cfg.targets]
    hit = [n for n in names if is_target(n, targets)]
    if not hit:
        sample = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
        raise ValueError(f"LoraConfig.targets {cfg.targets} match no nn.Linear in the model; Linear modules are: {sample}")
    model.requires_grad_(False)
    inject_adapter_in_model(PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=targets,
                                           rank_pattern=dict(rank_pattern or {}), lora_dropout=0.0,
                                           init_lora_weights=True), model, adapter_name=adapter_name)
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in params:
        p.requires_grad_(True)
    return params


class PeftLoRA:
    """The trainer's handle on PEFT LoRA layers injected into ``model`` (the diffusers and demo backends).

    Same interface as :class:`treegrpo.comfyui.policy.ComfyLoRA`: ``parameters()``, ``named_lora_parameters()``
    (backend-neutral names ``<module>.down`` / ``<module>.up``, what checkpoints store), ``weights()``, ``load(w)``."""

    def __init__(self, model: nn.Module, cfg: LoraConfig, seed: int = 0):
        self.model = model
        with torch.random.fork_rng(devices=[]):  # the LoRA init depends on the run's seed only
            torch.manual_seed(seed)
            self._params = add_lora(model, cfg)

    def parameters(self) -> list[nn.Parameter]:
        return list(self._params)

    def named_lora_parameters(self) -> list[tuple[str, nn.Parameter]]:
        ids = {id(p): n for n, p in self.model.named_parameters()}
        out = []
        for p in self._params:
            n = ids[id(p)]
            kind = "down" if ".lora_A." in n else "up"
            out.append((n.split(".lora_A." if kind == "down" else ".lora_B.")[0] + "." + kind, p))
        return out

    def weights(self) -> "LoraWeights":
        return extract_lora(self.model)

    def load(self, w: "LoraWeights") -> None:
        load_into_model(self.model, w)


@contextlib.contextmanager
def peft_adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Disable every PEFT LoRA layer inside ``model`` (for the KL reference), then restore."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [not m.disable_adapters for m in layers]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m, on in zip(layers, before):
            m.enable_adapters(on)


def _lora_layers(model: nn.Module, adapter_name: str = "default"):
    from peft.tuners.lora import LoraLayer

    for name, m in model.named_modules():
        if isinstance(m, LoraLayer) and adapter_name in m.lora_A:
            yield name, m


def extract_lora(model: nn.Module, adapter_name: str = "default") -> LoraWeights:
    """Current adapter weights of a PEFT-injected model (detached float32 copies on the CPU)."""
    down, up, alpha = {}, {}, {}
    for name, m in _lora_layers(model, adapter_name):
        down[name] = m.lora_A[adapter_name].weight.detach().float().cpu().clone()
        up[name] = m.lora_B[adapter_name].weight.detach().float().cpu().clone()
        alpha[name] = float(m.scaling[adapter_name] * m.r[adapter_name])
    if not down:
        raise ValueError("the model has no LoRA layers (call add_lora first)")
    return LoraWeights(down, up, alpha)


def load_into_model(model: nn.Module, w: LoraWeights, adapter_name: str = "default") -> None:
    """Copy ``w`` into the model's LoRA layers; every module must exist and every shape must match."""
    layers = dict(_lora_layers(model, adapter_name))
    missing = sorted(set(w.down) - set(layers))
    if missing:
        raise LoraFileError(f"LoRA names {len(missing)} module(s) the model does not have LoRA layers for, e.g. "
                            f"{missing[:3]}; was it trained for another base model or other targets?")
    bad = []
    for name in w.down:
        m = layers[name]
        A, B = m.lora_A[adapter_name].weight, m.lora_B[adapter_name].weight
        if A.shape != w.down[name].shape or B.shape != w.up[name].shape:
            bad.append(f"{name}: file {tuple(w.down[name].shape)}/{tuple(w.up[name].shape)} vs model "
                       f"{tuple(A.shape)}/{tuple(B.shape)}")
    if bad:
        raise LoraFileError("LoRA shapes do not match the model (another base model or rank?): " + "; ".join(bad[:3]))
    with torch.no_grad():
        for name in w.down:
            m = layers[name]
            m.lora_A[adapter_name].weight.copy_(w.down[name])
            m.lora_B[adapter_name].weight.copy_(w.up[name])
            r = m.r[adapter_name]
            m.scaling[adapter_name] = w.alpha[name] / r
    untouched = sorted(set(layers) - set(w.down))
    if untouched:
        raise LoraFileError(f"the LoRA file lacks {len(untouched)} adapted module(s), e.g. {untouched[:3]}")


def to_comfy(w: LoraWeights, prefix: str = COMFY_PREFIX, name_map: Optional[dict[str, str]] = None) -> dict:
    """ComfyUI key format. ``name_map`` renames module paths (e.g. diffusers → ComfyUI names)."""
    out = {}
    for n in w.modules:
        k = prefix + (name_map[n] if name_map else n)
        out[k + ".lora_down.weight"] = w.down[n].contiguous()
        out[k + ".lora_up.weight"] = w.up[n].contiguous()
        out[k + ".alpha"] = torch.tensor(float(w.alpha[n]))
    return out


def to_peft(w: LoraWeights, prefix: str = "") -> dict:
    """PEFT/diffusers key format (``lora_A``/``lora_B``); alpha goes into the metadata."""
    out = {}
    for n in w.modules:
        out[f"{prefix}{n}.lora_A.weight"] = w.down[n].contiguous()
        out[f"{prefix}{n}.lora_B.weight"] = w.up[n].contiguous()
    return out


def _metadata_number(metadata: Optional[dict], key: str) -> Optional[float]:
    """A number stored in a LoRA's metadata, or None when absent; a value this version cannot read as a number
    (another version's or tool's) is left out with a warning naming it."""
    raw = (metadata or {}).get(key)
    if raw in (None, "", "null"):
        return None
    try:
        v = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        v = None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        import warnings
        warnings.warn(f"LoRA metadata {key} = {raw!r} is not a positive number this version can read; it is left "
                      "out (the LoRA's alpha then defaults to its rank)")
        return None
    return float(v)


def adapter_alpha(metadata: Optional[dict]) -> Optional[float]:
    """The LoRA alpha diffusers' ``save_lora_weights`` keeps in a file's ``lora_adapter_metadata`` (PEFT's
    ``lora_alpha`` per component, e.g. ``{"unet.lora_alpha": 16, "unet.r": 4}``), or None when it says none, or
    several that differ (the caller then reads alpha = rank, PEFT's own default)."""
    raw = (metadata or {}).get("lora_adapter_metadata")
    try:
        d = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    found = {float(v) for k, v in d.items() if (k == "lora_alpha" or k.endswith(".lora_alpha"))
             and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0}
    return found.pop() if len(found) == 1 else None


def from_state_dict(sd: dict[str, torch.Tensor], metadata: Optional[dict] = None, prefix: Optional[str] = None) -> LoraWeights:
    """Parse ComfyUI (``lora_down/lora_up/alpha``) or PEFT (``lora_A/lora_B``) keys; strips ``prefix``
    (default: ``diffusion_model.`` for ComfyUI keys, none for PEFT keys)."""
    down, up, alpha = {}, {}, {}
    comfy = any(k.endswith(".lora_down.weight") for k in sd)
    peft_alpha = _metadata_number(metadata, "treegrpo.lora_alpha")
    if peft_alpha is None:
        peft_alpha = adapter_alpha(metadata)
    for k, v in sd.items():
        for suf, store in ((".lora_down.weight", down), (".lora_up.weight", up), (".lora_A.weight", down),
                           (".lora_B.weight", up)):
            if k.endswith(suf):
                store[k[: -len(suf)]] = v.float()
        if comfy and k.endswith(".alpha"):
            alpha[k[: -len(".alpha")]] = float(v)
    if not down:
        raise LoraFileError("no LoRA tensors found (expected keys ending in .lora_down.weight/.lora_up.weight "
                            "or .lora_A.weight/.lora_B.weight)")
    if set(down) != set(up):
        raise LoraFileError(f"unpaired LoRA tensors: {sorted(set(down) ^ set(up))[:3]}")
    for n in down:
        if n not in alpha:
            alpha[n] = float(peft_alpha) if peft_alpha is not None else float(down[n].shape[0])
    pre = COMFY_PREFIX if (prefix is None and comfy) else (prefix or "")

    def strip(d):
        return {(k[len(pre):] if pre and k.startswith(pre) else k): v for k, v in d.items()}

    return LoraWeights(strip(down), strip(up), strip(alpha))


#: the key prefixes of a diffusers model's LoRA in ComfyUI's (kohya) style: ``lora_unet_<path with _ for .>``
KOHYA_PREFIXES = ("lora_unet_", "lora_transformer_")
#: prefixes LoRA files put before a module path: ComfyUI's diffusers-style keys, ComfyUI's model prefix, PEFT's
FILE_PREFIXES = KOHYA_PREFIXES + ("diffusion_model.", "unet.", "transformer.")


def match_model_modules(w: LoraWeights, model: nn.Module) -> LoraWeights:
    """``w`` renamed to ``model``'s own ``nn.Linear`` paths, so a LoRA file can be applied whatever key style it
    was saved in: the model's paths, ComfyUI's ``lora_unet_<path with _ for .>``, or a ``unet.``/``transformer.``
    prefix (PEFT/diffusers). Raises LoraFileError naming modules the model does not have."""
    return match_modules(w, [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and "lora_" not in n])


def match_modules(w: LoraWeights, names: list[str]) -> LoraWeights:
    """``w`` renamed to the module paths ``names`` (a model's, or the modules a LoRA already has) by the rule of
    :func:`match_model_modules`."""
    def canon(name: str) -> str:
        for p in FILE_PREFIXES:
            if name.startswith(p):
                name = name[len(p):]
                break
        return name.replace(".", "_")

    linear: dict[str, list[str]] = {}
    for n in names:
        linear.setdefault(canon(n), []).append(n)
    rename, unknown = {}, []
    for n in w.modules:
        hits = linear.get(canon(n), [])
        if len(hits) != 1:
            unknown.append(n)
        else:
            rename[n] = hits[0]
    if unknown:
        raise LoraFileError(f"the LoRA names {len(unknown)} module(s) this model does not have (or not "
                            f"unambiguously), e.g. {unknown[:3]}; was it trained for another base model?")
    return LoraWeights({rename[n]: v for n, v in w.down.items()}, {rename[n]: v for n, v in w.up.items()},
                       {rename[n]: v for n, v in w.alpha.items()})


def check_base_model(metadata: dict, base_model: str, path: str = "LoRA") -> None:
    """Refuse a LoRA whose metadata names another base model (files without the field pass; shapes are
    checked when the weights are loaded)."""
    theirs = (metadata or {}).get("treegrpo.base_model")
    if theirs and base_model and theirs != base_model:
        raise LoraFileError(f"{path} was trained for base model {theirs!r}, not {base_model!r}; load it on that model")


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: Optional[dict] = None) -> bytes:
    """A safetensors file whose bytes depend only on its contents: safetensors writes its JSON header from a hash
    map, in an order that changes from call to call; here the header's keys are sorted (the offsets, which
    locate the data, are unchanged), so equal LoRAs have equal checksums."""
    from safetensors.torch import save

    return sorted_header(save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata))


def sorted_header(raw: bytes) -> bytes:
    """The safetensors file ``raw`` with its JSON header's keys sorted (see :func:`safetensors_bytes`)."""
    n = int.from_bytes(raw[:8], "little")
    header = json.dumps(json.loads(raw[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)   # the data starts 8-byte aligned
    return len(header).to_bytes(8, "little") + header + raw[8 + n:]


def save_lora_file(path: str, tensors: dict[str, torch.Tensor], metadata: Optional[dict] = None) -> str:
    """Write a safetensors LoRA atomically (byte-identical for equal contents); metadata values are stored as
    strings (JSON for non-strings)."""
    meta = {k: v if isinstance(v, str) else json.dumps(v, default=str)
            for k, v in (metadata or {}).items()}
    data = safetensors_bytes(tensors, meta)

    def write(tmp):
        with open(tmp, "wb") as fh:
            fh.write(data)
    return atomic_write(path, write)


def save_diffusers_lora_file(w: LoraWeights, path: str, pipeline_cls, component: str) -> str:
    """Write ``w`` (module paths of the pipeline's ``component``, ``unet`` or ``transformer``) with diffusers' own
    ``pipeline_cls.save_lora_weights``, so that ``pipe.load_lora_weights(path)`` reads it, alpha included as adapter
    metadata; atomically (``treegrpo.io.atomic_write``), byte-identical for equal LoRAs (diffusers' header order
    varies). One rank and one alpha for all modules (PEFT keeps one)."""
    import tempfile

    alphas = {w.alpha[n] for n in w.modules}
    ranks = {w.down[n].shape[0] for n in w.modules}
    if len(alphas) != 1 or len(ranks) != 1:
        raise ValueError("diffusers export needs one rank and alpha for all modules")
    # the layers by their whole paths: a suffix such as "proj" would also name layers the LoRA leaves alone, which
    # PEFT then warns about when the file loads
    meta = {"r": ranks.pop(), "lora_alpha": alphas.pop(), "target_modules": sorted(w.modules)}
    folder = os.path.dirname(os.path.abspath(path))

    def write(tmp: str) -> None:
        with tempfile.TemporaryDirectory(prefix=".tmp-lora-", dir=folder) as d:
            pipeline_cls.save_lora_weights(d, **{f"{component}_lora_layers": to_peft(w),
                                                 f"{component}_lora_adapter_metadata": meta},
                                           weight_name="lora.safetensors")
            with open(os.path.join(d, "lora.safetensors"), "rb") as fh:
                raw = fh.read()
            with open(tmp, "wb") as fh:
                fh.write(sorted_header(raw))

    os.makedirs(folder, exist_ok=True)
    return atomic_write(path, write)


def read_lora_file(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file, with a clear error when it is missing or corrupt."""
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise LoraFileError(f"LoRA file not found: {path}")
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt headers
        raise LoraFileError(f"{path} is not a readable safetensors file (truncated or corrupt?): {e}") from e
    return tensors, meta


def check_finite(tensors: dict[str, torch.Tensor], path: str) -> None:
    """Refuse (LoraFileError) a LoRA file holding NaN or infinite values: the training that wrote it diverged."""
    bad = [k for k, v in tensors.items() if not torch.isfinite(v).all()]
    if bad:
        raise LoraFileError(f"{path!r} holds NaN or infinite values ({bad[:3]}{' ...' if len(bad) > 3 else ''}): "
                            "the training that wrote it diverged; use an earlier checkpoint's LoRA")


class LoraDict(dict):
    """A ComfyUI-key LoRA state dict (ComfyUI's LORA_MODEL type) that carries its file metadata."""

    def __init__(self, tensors: dict, metadata: Optional[dict] = None):
        super().__init__(tensors)
        self.metadata = dict(metadata or {})
