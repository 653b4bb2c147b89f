"""Reward model interface and registry.

A reward model maps decoded images and their prompts to one float per image:
``reward(images (B, 3, H, W) float32 in [0, 1], prompts: list[str]) -> (B,) float32``.
"""
from __future__ import annotations

import inspect
import json
from typing import Callable, Protocol

import torch


class RewardModel(Protocol):
    name: str

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


_REGISTRY: dict[str, Callable[..., RewardModel]] = {}


def register(name: str):
    """Class/function decorator: ``@register("jpeg")`` makes ``load_reward("jpeg", ...)`` build it."""

    def deco(factory):
        _REGISTRY[name] = factory
        return factory

    return deco


def available() -> list[str]:
    _import_builtin()
    return sorted(_REGISTRY)


def load_reward(name: str, path: str | None = None, device: str | torch.device = "cpu", **kwargs) -> RewardModel:
    """Build reward ``name`` (see ``available()``); ``path`` points at its local weight files."""
    _import_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward model {name!r}; available: {', '.join(available())}")
    model = _REGISTRY[name](path=path, device=device, **kwargs)
    try:        # where it came from: a taste model learnt on its image tower finds it again (artist/features.py)
        model.source_path, model.source_options = (None if path is None else str(path)), dict(kwargs)
    except AttributeError:   # a reward that does not take attributes (slots, a function)
        pass
    return model


def missing_package(name: str) -> str | None:
    """One line naming the optional package reward ``name`` needs and the command that installs it (its class's
    ``requires_module``, see ``treegrpo.deps.OPTIONAL``), or None when it is installed or none is needed. Cheap:
    nothing is imported."""
    _import_builtin()
    module = getattr(_REGISTRY.get(name), "requires_module", None)
    if not module:
        return None
    from ..deps import OptionalPackageMissing, require_optional
    try:
        require_optional(module)
    except OptionalPackageMissing as e:
        return str(e)
    return None


def reward_files(name: str) -> dict:
    """What reward ``name`` needs on disk, for the loader's tooltip and the README: ``files`` (what to put in
    ``models/reward_models``; empty when it needs none), ``folder`` (a model folder rather than one file), ``source``
    (project and where the files are published), ``licence`` and ``install`` (an optional package's command)."""
    _import_builtin()
    cls = _REGISTRY[name]
    module = getattr(cls, "requires_module", None)
    install = ""
    if module:
        from ..deps import optional_pip_command
        install = optional_pip_command(module)
    return {"files": getattr(cls, "expected_files", "") or "", "folder": bool(getattr(cls, "is_folder", False)),
            "source": getattr(cls, "source", "") or "", "licence": getattr(cls, "licence", "") or "", "install": install}


def reward_files_help() -> str:
    """One paragraph per reward that needs files: what, from where, licence (the loader's ``file`` tooltip)."""
    rows = []
    for n in available():
        f = reward_files(n)
        if f["files"]:
            extra = f" Needs: {f['install']}." if f["install"] else ""
            rows.append(f"{n}: {f['files']}. From {f['source']}. Licence: {f['licence'] or 'see the source'}.{extra}")
    return "\n".join(rows)


def reward_options(name: str) -> dict[str, inspect.Parameter]:
    """The options (keyword arguments besides ``path`` and ``device``) reward ``name`` accepts, with defaults."""
    _import_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward model {name!r}; available: {', '.join(available())}")
    params = inspect.signature(_REGISTRY[name]).parameters
    return {k: p for k, p in params.items() if k not in ("self", "path", "device") and not k.startswith("_")
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _option_type_error(value, default) -> str | None:
    """What is wrong with ``value`` for an option whose default is ``default`` (None: nothing, or unknown type)."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if isinstance(default, float):
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if isinstance(default, str):
        return None if isinstance(value, str) or value is None else "a string"
    return None


def check_options(name: str, options: dict, where: str = "options") -> None:
    """Refuse unknown option names (listing the ones ``name`` takes) and values of the wrong type, before any
    reward model is built."""
    known = reward_options(name)
    unknown = sorted(set(options) - set(known))
    if unknown:
        listed = ", ".join(f"{k}={p.default!r}" if p.default is not p.empty else k for k, p in known.items())
        raise ValueError(f"{where}: unknown option(s) {unknown} for reward {name!r}; its options are: "
                         f"{listed or 'none'}")
    for k, v in options.items():
        want = _option_type_error(v, known[k].default)
        if want:
            raise ValueError(f"{where}: option {k!r} of reward {name!r} must be {want}, got {v!r}")
    if options.get("dtype") is not None:
        from .torch_reward import resolve_dtype
        try:
            resolve_dtype(options["dtype"], torch.device("cpu"))
        except ValueError as e:
            raise ValueError(f"{where}: option 'dtype' of reward {name!r}: {e}") from None


def parse_options(reward: str, text: str | None) -> dict:
    """The Reward Model Loader's ``options`` JSON text as a dict, checked against what reward ``reward`` accepts
    (names and types): ValueError saying what is wrong."""
    text = (text or "").strip() or "{}"
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"options: not JSON ({e.msg} at line {e.lineno} column {e.colno}); write an object such "
                         'as {"dtype": "bfloat16"}') from None
    if not isinstance(opts, dict):
        raise ValueError(f"options: must be a JSON object such as {{\"dtype\": \"bfloat16\"}}, got {text!r}")
    check_options(reward, opts, where="options")
    return opts


def loader_options(reward: str, options: str | None, question: str | None) -> tuple[dict, list[str]]:
    """The Reward Model Loader's ``options`` JSON and its ``question`` input as the reward's keyword arguments, checked
    (ValueError saying what is wrong), and notes for the console: a question given to a reward that asks none, one
    that replaces the options' own (a question without ``{prompt}`` is said by the reward when it is built)."""
    opts = parse_options(reward, options)
    q, notes = (question or "").strip(), []
    if q and reward != "vlm_judge":
        notes.append(f"the Reward Model Loader's question is read by the vlm_judge reward only; {reward} ignores it")
    elif q:
        if "question" in opts and opts["question"] != q:
            notes.append(f"vlm_judge asks the loader's question {q!r}, not the options' {opts['question']!r}")
        opts["question"] = q
    if reward == "vlm_judge" and "question" in opts:
        from .vlm_judge import check_question
        check_question(opts["question"])
    return opts, notes


def options_help() -> str:
    """Every reward's options with their defaults (the Reward Model Loader's tooltip)."""
    def show(p):
        return p.name if p.default is p.empty else f"{p.name}={json.dumps(p.default)}"
    return "Options: " + "; ".join(f"{n}: {', '.join(show(p) for p in reward_options(n).values()) or 'none'}"
                                   for n in available())


def check_reward_prompts(name: str, prompts: list[str]) -> None:
    """Refuse prompts reward ``name`` cannot score (its class's ``check_prompts``, e.g. ``ocr``: a prompt that quotes
    no text), before any model is built; nothing for rewards that take any prompt."""
    _import_builtin()
    check = getattr(_REGISTRY.get(name), "check_prompts", None)
    if check is not None:
        check(list(prompts), name)


def check_config_prompts(cfg, prompts: list[str]) -> None:
    """The prompts each reward of a TrainConfig ``cfg`` will score (the training prompts and the evaluation prompts;
    the judges the evaluation prompts) are ones it can score, before any model is built; ValueError naming the
    config field."""
    held = list(cfg.eval_prompts) or (cfg.heldout_prompts() if getattr(cfg, "eval_heldout", 0) else [])
    evals = held or list(prompts)
    for field_name, texts in (("rewards", list(dict.fromkeys(list(prompts) + held))),
                              ("eval_rewards", list(dict.fromkeys(evals)))):   # each prompt counted once
        for i, r in enumerate(getattr(cfg, field_name)):
            if field_name == "rewards" and r.weight <= 0:     # not loaded, not scored
                continue
            try:
                check_reward_prompts(r.name, texts)
            except ValueError as e:
                raise ValueError(f"TrainConfig.{field_name}[{i}]: {e}") from None


def check_batch(images: torch.Tensor, prompts: list[str], who: str) -> None:
    """Clear errors for the inputs every reward model shares."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"{who}: images must be (B, 3, H, W), got {tuple(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError(f"{who}: empty image batch")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{who}: {images.shape[0]} images but {len(prompts)} prompts; pass one prompt per image")


def _import_builtin() -> None:
    from . import jpeg  # noqa: F401
    # torch reward models: their heavy libraries (open_clip, transformers, image-reward) load when one is built
    from . import aesthetic, clipscore, hps, hpsv3, imagereward, ocr, pickscore, taste, vlm_judge  # noqa: F401
    try:
        from . import demo_adherence  # noqa: F401
    except ImportError:  # pragma: no cover - demo package missing
        pass
