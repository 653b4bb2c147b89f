"""Command line: ``treegrpo demo | train | sample | export | rewards | config``.

Every field of :class:`~treegrpo.config.TrainConfig` (and its sub-configs) is a flag generated from the
dataclasses, e.g. ``--iterations 50 --tree.branch 3 --optim.lr 1e-4``; their help texts are the fields'.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Optional

from . import interrupts
from .demo.config import demo_config_dict, demo_run_config_dict  # noqa: F401  (benchmarks and tests read them here)
from .config import ConfigError, TrainConfig, config_sections, read_config_file, shorten
# building a run lives in treegrpo.run; the CLI's names for it stay (benchmarks and scripts call cli.run_training)
from .run import build_rewards, check_reward_names, run_training  # noqa: F401

_SUBS = tuple(config_sections())      # every section of the config is a group of flags


def _parse_value(text: str, default: Any):
    """A flag's text as the type of the field's default; ValueError saying what was expected."""
    import math

    if isinstance(default, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {shorten(text)!r}")
    if isinstance(default, int) and not isinstance(default, bool):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected a whole number, got {shorten(text)!r}") from None
    if isinstance(default, float):
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {shorten(text)!r}") from None
        if not math.isfinite(v):
            raise ValueError(f"expected a finite number, got {shorten(text)!r}")
        return v
    if isinstance(default, list):
        text = text.strip()
        if text.startswith("["):
            return json.loads(text)
        items = [t.strip() for t in text.split(",") if t.strip()]
        return [int(t) if t.lstrip("-").isdigit() else t for t in items]   # --tree.branch_schedule 4,2
    if default is None:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """One ``--field`` / ``--sub.field`` flag per config field (default: unset, i.e. keep the config's)."""
    base = TrainConfig.__dataclass_fields__
    g = p.add_argument_group("run configuration (TrainConfig)")
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SUBS:
            continue
        if f.name in PROMPT_FLAGS:   # a prompt may hold commas: one per flag, repeated (or a JSON list)
            g.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg:{f.name}", default=None, metavar="PROMPT",
                           action="append", help=f"{f.metadata.get('help', '')}: one prompt per flag, repeat it for "
                                                 "more, or a JSON list (default: none)")
            continue
        g.add_argument(f"--{f.name.replace('_', '-')}", *FLAG_ALIASES.get(f.name, ()), dest=f"cfg:{f.name}",
                       default=None, metavar="V", help=f"{f.metadata.get('help', '')} (default: {_show_default(f)})")
    for sub in _SUBS:
        klass = base[sub].default_factory
        g = p.add_argument_group(f"{sub} ({klass.__name__})")
        for f in dataclasses.fields(klass):
            g.add_argument(f"--{sub}.{f.name}", dest=f"cfg:{sub}.{f.name}", default=None, metavar="V",
                           help=f"{f.metadata.get('help', '')} (default: {_show_default(f)})")
        if sub == "pipeline":   # the flag of a field that moved (config.moved_fields): scripts that pass it still run
            g.add_argument("--pipeline.gradient_checkpointing", dest=f"cfg:{MOVED_FLAG}", default=None, metavar="V",
                           help=argparse.SUPPRESS)   # true = --memory.checkpointing on (that switch's earlier name)


def _show_default(f) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()
        return repr(v) if not dataclasses.is_dataclass(v) else type(v).__name__
    return "required"


def flag_name(dest: str) -> str:
    """The flag a user typed for a config dest: ``cfg:eval_every`` → ``--eval-every``, ``cfg:tree.branch`` →
    ``--tree.branch``."""
    path = dest[4:]
    return f"--{path}" if "." in path else f"--{path.replace('_', '-')}"


def apply_flags(d: dict, ns: argparse.Namespace) -> dict:
    """Overlay the flags that were given onto a config dict (typed by the dataclass defaults); a value of the
    wrong type is a ConfigError naming the flag."""
    fresh = TrainConfig.__dataclass_fields__
    given = {key for key, val in vars(ns).items() if key.startswith("cfg:") and val is not None}
    for field_name, other in (("prompts", "prompts_file"), ("prompts_file", "prompts")):
        if f"cfg:{field_name}" in given and f"cfg:{other}" not in given:
            d.pop(other, None)        # a prompt flag replaces the config's prompts, whichever way it held them
    if "cfg:tree.tail_steps" in given and "cfg:tree.tail_steps_schedule" not in given \
            and isinstance(d.get("tree"), dict):
        d["tree"].pop("tail_steps_schedule", None)    # the tail a flag sets, not the config's schedule (it would win)
    for key, val in vars(ns).items():
        if key not in given:
            continue
        try:
            _apply_one(d, fresh, key, val)
        except ValueError as e:
            raise ConfigError(f"{flag_name(key)}: {e}") from None
    return d


#: the config's prompt lists: their flags take one prompt each (a prompt may hold commas), repeated
PROMPT_FLAGS = ("prompts", "eval_prompts")


def _prompts(values: list[str]) -> list:
    """The prompts of a repeated prompt flag: each value one prompt, or a JSON list of them."""
    out = []
    for v in values:
        if v.strip().startswith("["):
            try:
                out.extend(json.loads(v))
            except json.JSONDecodeError as e:
                raise ValueError(f"{shorten(v)!r} starts like a JSON list but is not one ({e.msg})") from None
        else:
            out.append(v)
    return out


#: the earlier names of renamed top-level fields, kept as flags (config.moved_fields reads them in files)
FLAG_ALIASES = {"guidance_scale": ("--cfg",)}

#: a flag kept for a field that moved: its value goes where the config file's would (config.moved_fields)
MOVED_FLAG = "pipeline.gradient_checkpointing"


def _apply_one(d: dict, fresh, key: str, val: str) -> None:
    if key == f"cfg:{MOVED_FLAG}":
        pipe = d.setdefault("pipeline", {})
        if dataclasses.is_dataclass(pipe):
            pipe = d["pipeline"] = dataclasses.asdict(pipe)
        pipe["gradient_checkpointing"] = _parse_value(val, False)
        return
    path = key[4:].split(".")
    if path[0] in PROMPT_FLAGS:
        d[path[0]] = _prompts(val)
        return
    if len(path) == 1:
        f = fresh[path[0]]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        d[path[0]] = _parse_value(val, default)
    else:
        sub, name = path
        klass = fresh[sub].default_factory
        kf = klass.__dataclass_fields__[name]
        default = kf.default if kf.default is not dataclasses.MISSING else kf.default_factory()
        cur = d.setdefault(sub, {})
        if dataclasses.is_dataclass(cur):
            cur = dataclasses.asdict(cur)
            d[sub] = cur
        cur[name] = _parse_value(val, default)


def cmd_demo(ns) -> int:
    from .demo.compare import run_demo

    d = apply_flags(demo_run_config_dict(), ns)
    cfg = TrainConfig.from_dict(d)
    if not 1 <= ns.grid_prompts <= 64:
        raise ConfigError(f"--grid-prompts must be 1..64 (prompts in the before/after grid), got {ns.grid_prompts}")
    if ns.dump_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    run_demo(d, grid_prompts=ns.grid_prompts, baseline=not ns.no_baseline, progress=not ns.quiet)
    return 0


def _quiet_libraries() -> None:
    """``--quiet``: diffusers' and transformers' own loading bars off too (the run's are off already)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ("diffusers", "transformers"):
        try:
            __import__(f"{name}.utils.logging", fromlist=["disable_progress_bar"]).disable_progress_bar()
        except (ImportError, AttributeError):
            pass


def base_config(ns) -> dict:
    """The config the flags go onto: ``--config``'s file; else the demo run's, unless a flag names another backend
    (the demo's prompts, rewards, judge and learning rate are the demo task's: a diffusers model starts from the
    config's own defaults)."""
    if ns.config:
        return read_config_file(ns.config)
    return demo_run_config_dict() if getattr(ns, "cfg:backend", None) in (None, "demo") else {}


def cmd_train(ns) -> int:
    d = base_config(ns)
    cfg = TrainConfig.from_dict(apply_flags(d, ns))
    if ns.quiet:
        _quiet_libraries()
    trainer, summary = run_training(cfg, resume=ns.resume, progress=not ns.quiet, allow_changes=ns.allow_changes,
                                    overwrite=ns.overwrite)
    if trainer.rank == 0:
        print(json.dumps({k: v for k, v in summary.items()}, indent=2, default=str))
    if trainer.dist is not None:
        trainer.dist.close()
        if trainer.world > 1:
            # every file is written (atomically) and the group is torn down; skip the interpreter's finalisation,
            # where gloo's worker threads can still be joined late and abort a rank (SIGABRT, "terminate called
            # without an active exception": ~1 in 5 two-process runs here)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    return 0


def cmd_config(ns) -> int:
    d = base_config(ns)
    cfg = TrainConfig.from_dict(apply_flags(d, ns))
    check_reward_names(cfg)
    print(json.dumps(cfg.to_dict(), indent=2))
    return 0


def cmd_rewards(ns) -> int:
    """Every registered reward: its name, then what it needs on disk (the config's ``path``) and, where an optional
    package it needs is missing, the line that installs it."""
    from .rewards.base import available, missing_package, reward_files

    for name in available():
        files = reward_files(name)["files"]
        print(name)
        print(f"    path: {files}" if files else "    path: none (built in, or its models come with its package)")
        missing = missing_package(name)
        if missing:
            print(f"    not installed: {missing}")
    return 0


def check_output_file(path: str, flag: str, suffix: str) -> None:
    """An output file the command may write: a ``suffix`` file in a folder that exists (``sample`` and ``export``
    create no folders: a mistyped path fails at once instead of scattering files)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {path!r}: the folder {folder!r} does not exist; create it first")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is a folder; give a {suffix} file name")
    if not path.lower().endswith(suffix):
        raise ConfigError(f"{flag} {path!r}: write a {suffix} file")


def cmd_export(ns) -> int:
    from .lora import (KOHYA_PREFIXES, from_state_dict, read_lora_file, save_lora_file, to_comfy, to_peft,
                       with_alpha)

    check_output_file(ns.output, "output", ".safetensors")
    if os.path.exists(ns.output) and os.path.exists(ns.input) and os.path.samefile(ns.output, ns.input):
        raise ConfigError(f"output {ns.output!r} is the input file: give another name (the input stays as it is)")
    if os.path.exists(ns.output) and not ns.force:
        raise ConfigError(f"output {ns.output!r} exists: give another name, or add --force to replace it")
    tensors, meta = read_lora_file(ns.input)
    w = from_state_dict(tensors, meta)
    kohya = [p for p in KOHYA_PREFIXES if all(n.startswith(p) for n in w.modules)]
    component = [p for p in ("unet.", "transformer.") if all(n.startswith(p) for n in w.modules)]
    if ns.format == "comfy" and kohya:             # a diffusers run's ComfyUI file: ComfyUI's keys already
        sd = to_comfy(w, prefix="")
    elif ns.format == "comfy" and component:       # a diffusers run's PEFT file: ComfyUI's keys for a diffusers model
        pre = KOHYA_PREFIXES[("unet.", "transformer.").index(component[0])]
        sd = to_comfy(w, prefix=pre, name_map={n: n[len(component[0]):].replace(".", "_") for n in w.modules})
    elif ns.format == "comfy":
        sd = to_comfy(w)
    elif kohya:
        raise ConfigError(f"{ns.input} holds ComfyUI keys of a diffusers model ({kohya[0]}<path with _ for .>): their "
                          "module paths cannot be read back. diffusers' load_lora_weights reads this file as it is, "
                          "and the run that made it wrote <run_name>_diffusers.safetensors in PEFT keys beside it")
    else:                                          # PEFT keeps one alpha: modules with another are rescaled to it
        w = with_alpha(w, w.alpha[w.modules[0]])
        sd = to_peft(w, prefix=ns.prefix)
    meta = dict(meta, **{"treegrpo.lora_alpha": str(w.alpha[w.modules[0]])})
    save_lora_file(ns.output, sd, meta)
    print(f"wrote {ns.output} ({len(w.modules)} modules, {ns.format} keys)")
    return 0


def read_checked_lora(path: str, flag: str = "--lora") -> tuple[dict, dict]:
    """The tensors and metadata of a LoRA file, refused (ConfigError) when it holds NaN or infinite values."""
    from .lora import LoraFileError, check_finite, read_lora_file

    t, meta = read_lora_file(path)
    try:
        check_finite(t, path)
    except LoraFileError as e:
        raise ConfigError(f"{flag} {e}") from None
    return t, meta


def apply_lora_file(policy, base_name: str, cfg: TrainConfig, lora: tuple[dict, dict], path: str) -> None:
    """Put the LoRA ``lora`` (tensors, metadata of ``path``) into ``policy.model``: the modules, ranks and alphas the
    file holds, whatever the config's lora section says; refused when it was trained on another base model."""
    from .lora import add_lora, check_base_model, from_state_dict, load_into_model, match_model_modules

    t, meta = lora
    check_base_model(meta, base_name, path)
    w = match_model_modules(from_state_dict(t, meta), policy.model)
    ranks = {n: w.down[n].shape[0] for n in w.modules}
    add_lora(policy.model, dataclasses.replace(cfg.lora, rank=max(ranks.values()), targets=w.modules),
             rank_pattern=ranks)
    load_into_model(policy.model, w)


def cmd_sample(ns) -> int:
    import torch
    from .backends import load_policy
    from .io import atomic_write
    from .report import labelled_grids, sample_grid, to_pil
    from .tree import sample_ode
    from .video import first_frames

    d = base_config(ns)
    if ns.prompt and not d.get("prompts") and not d.get("prompts_file"):
        d["prompts"] = list(ns.prompt)     # a config of another backend's defaults: the prompts to sample are these
    cfg = TrainConfig.from_dict(apply_flags(d, ns))
    # everything that needs no model first: the output path, the sample count, the LoRA file and its values
    check_output_file(ns.output, "--output", ".png")
    if not 1 <= ns.per_prompt <= 64:
        raise ConfigError(f"--per-prompt must be 1..64 (images per prompt in the grid), got {ns.per_prompt}")
    prompts = ns.prompt or cfg.load_prompts()[:8]
    lora = read_checked_lora(ns.lora) if ns.lora else None
    policy, base_name = load_policy(cfg)
    if lora is not None:
        apply_lora_file(policy, base_name, cfg, lora, ns.lora)
    allp = [p for p in prompts for _ in range(ns.per_prompt)]
    g = torch.Generator().manual_seed(cfg.seed)
    noise = torch.randn((len(allp), *policy.latent_shape()), generator=g)
    with torch.no_grad():
        imgs = policy.decode(sample_ode(policy, allp, noise, cfg.tree.steps, cfg.guidance_scale))
    step = lora[1].get("treegrpo.step") if lora else None
    title = (f"LoRA {os.path.basename(ns.lora)}" + (f" (iteration {step})" if step else "") if lora else
             f"base model {base_name}")
    grid = labelled_grids([sample_grid(first_frames(imgs), ns.per_prompt)], [title], list(prompts))
    atomic_write(ns.output, lambda tmp: to_pil(grid).save(tmp, format="PNG"))
    print(f"wrote {ns.output} ({len(prompts)} prompts x {ns.per_prompt})")
    return 0


def nearest_flags(arg: str, known: list[str]) -> list[str]:
    """The flags a mistyped ``arg`` (``--prompts_file``, ``--tree.window-start``, ``--bracnh``) probably meant:
    the same flag with ``-``/``_`` swapped, else the closest spellings."""
    import difflib

    name = arg.split("=", 1)[0]
    norm = lambda f: f.lower().replace("_", "-")      # noqa: E731
    same = [f for f in known if norm(f) == norm(name)]
    if same:
        return same
    by_norm = {norm(f): f for f in known}
    close = difflib.get_close_matches(norm(name), list(by_norm), n=3, cutoff=0.75)
    if not close and "." not in name:   # --branch for --tree.branch: a field of a section
        close = [k for k in by_norm if k.endswith("." + norm(name).lstrip("-"))][:3]
    return [by_norm[c] for c in close]


class Parser(argparse.ArgumentParser):
    """argparse with errors that quote user input shortened and suggest the nearest flag."""

    def error(self, message: str):
        import re

        m = re.match(r"unrecognized arguments: (.*)", message, re.S)
        if m:
            parsers = getattr(self, "_all_parsers", {})
            chosen = next((parsers[a] for a in getattr(self, "_argv", []) if a in parsers), None)
            known = sorted({o for q in ([self, chosen] if chosen else [self, *parsers.values()]) for a in q._actions
                            for o in a.option_strings if o.startswith("--")})
            parts = []
            for arg in m.group(1).split(" "):
                if not arg.startswith("--"):
                    parts.append(f"{shorten(arg, 60)!r}")
                    continue
                flag = arg.split("=", 1)[0]
                elsewhere = [n for n, q in parsers.items() if q is not chosen
                             and any(flag in a.option_strings for a in q._actions)]
                positional = [a.dest for a in (chosen._actions if chosen else []) if not a.option_strings]
                if (chosen is not None and elsewhere and flag not in known   # another subcommand's flag
                        and flag.lstrip("-").replace("-", "_") not in positional):
                    also = ("; treegrpo config --config FILE prints a config file's settings, validated"
                            if flag == "--dump-config" else "")
                    parts.append(f"{shorten(flag, 60)} (a flag of treegrpo {' / '.join(elsewhere)}, not of "
                                 f"{chosen.prog}{also})")
                    continue
                hint = nearest_flags(arg, known)
                positional = [a.dest for a in (chosen._actions if chosen else []) if not a.option_strings]
                name = arg.split("=", 1)[0].lstrip("-").replace("-", "_")
                if not hint and name in positional:   # export's files: `treegrpo export IN OUT`, no flag
                    usage = " ".join(d.upper() for d in positional)
                    parts.append(f"{shorten(arg.split('=', 1)[0], 60)} ({name} is given without a flag: "
                                 f"{chosen.prog} {usage})")
                    continue
                parts.append(shorten(arg.split('=', 1)[0], 60)
                             + (f" (did you mean {' or '.join(hint)}?)" if hint else ""))
            message = "unrecognized arguments: " + ", ".join(parts)
        else:
            message = re.sub(r"'([^']{100,})'", lambda k: repr(shorten(k.group(1))), message)
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="treegrpo", description="TreeGRPO: tree-structured GRPO LoRA training of "
               "diffusion/flow models (Ding & Ye, 2025).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    d = sub.add_parser("demo", help="train a LoRA on the embedded demo model (no downloads) and compare with "
                       "trajectory GRPO for the same wall-clock")
    d.add_argument("--no-baseline", action="store_true", help="skip the trajectory-GRPO baseline run")
    d.add_argument("--grid-prompts", type=int, default=8, help="prompts shown in the before/after grid")
    d.add_argument("--dump-config", action="store_true", help="print the demo configuration and exit")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    add_config_flags(d)
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("train", help="train from a JSON config file (default: the demo config)")
    t.add_argument("--config", default=None, help="JSON file with TrainConfig fields")
    start = t.add_mutually_exclusive_group()   # continue a run, or move it aside and start again: one of them
    start.add_argument("--resume", action="store_true", help="continue from the latest checkpoint of this run")
    t.add_argument("--allow-changes", action="store_true",
                   help="with --resume: continue although training settings differ from the checkpoint's")
    start.add_argument("--overwrite", action="store_true",
                   help="start again where an earlier run of the same name left its files (they are moved to "
                        "output_dir/previous-<time>/)")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    add_config_flags(t)
    t.set_defaults(func=cmd_train)

    c = sub.add_parser("config", help="print the full, validated configuration")
    c.add_argument("--config", default=None, help="JSON file with TrainConfig fields")
    add_config_flags(c)
    c.set_defaults(func=cmd_config)

    s = sub.add_parser("sample", help="sample a grid from the model (optionally with a LoRA)")
    s.add_argument("--config", default=None, help="JSON config (default: the demo's)")
    s.add_argument("--lora", default=None, help="LoRA safetensors (ComfyUI or PEFT keys)")
    s.add_argument("--prompt", action="append", help="prompt (repeatable; default: first 8 training prompts)")
    s.add_argument("--per-prompt", type=int, default=4, help="images per prompt")
    s.add_argument("--output", default="samples.png", help="PNG path")
    add_config_flags(s)
    s.set_defaults(func=cmd_sample)

    e = sub.add_parser("export", help="convert a LoRA file between ComfyUI and PEFT/diffusers keys (a diffusers "
                                      "run's PEFT file to ComfyUI's lora_unet_ / lora_transformer_ keys)")
    e.add_argument("input")
    e.add_argument("output")
    e.add_argument("--format", choices=("comfy", "peft"), default="comfy")
    e.add_argument("--prefix", default="", help="PEFT key prefix (e.g. 'unet.' or 'transformer.')")
    e.add_argument("--force", action="store_true", help="replace the output file when it exists")
    e.set_defaults(func=cmd_export)

    r = sub.add_parser("rewards", help="list the registered reward models")
    r.set_defaults(func=cmd_rewards)
    p._all_parsers = dict(sub.choices)      # the subcommands' flags, for Parser.error's suggestions
    return p


def main(argv: Optional[list[str]] = None) -> int:
    """The command line: 0 done, 1 out of accelerator memory or disk (one line: how to go on), 2 bad
    input (one line saying what to change), 130 interrupted (Ctrl-C at any moment, start-up included: one line, and
    where the last finished iteration is saved)."""
    with interrupts.handled() as interrupted:
        try:
            parser = build_parser()
            parser._argv = list(sys.argv[1:] if argv is None else argv)
            ns = parser.parse_args(argv)
            rc = ns.func(ns)
            if interrupted.is_set():    # a Ctrl-C some library swallowed after the last stop check: still an interrupt
                return interrupts.report(exit_now=argv is None)
            return rc
        except KeyboardInterrupt:
            return interrupts.report(exit_now=argv is None)
        except BrokenPipeError:
            if interrupted.is_set():   # Ctrl-C on `treegrpo train | tee log` also ends the tee
                return interrupts.report(exit_now=argv is None)
            if not _output_closed():
                raise                  # another pipe (a socket, a child process): not ours to hide
            if argv is None:           # the console script: no second error when the interpreter flushes at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1                   # `treegrpo config | head`: the reader of the output left; nothing more to say
        except Exception as e:
            if interrupted.is_set():   # Ctrl-C inside an import or a C call can surface as another error (ImportError
                return interrupts.report(exit_now=argv is None)   # from a half-imported torch, ...), or as the stop
            if isinstance(e, (ConfigError, ValueError, FileNotFoundError, FloatingPointError)):
                print(f"{who()}: error: {short_message(str(e))}", file=sys.stderr)
                return 2
            if _out_of_memory(e):
                print(f"{who()}: error: {out_of_memory_message(e)}", file=sys.stderr)
                return 1
            from .io import SaveError
            if isinstance(e, SaveError):   # a full disk mid-run: one line, and the way on
                print(f"{who()}: error: {short_message(str(e))} A run keeps its newest checkpoint that was written "
                      "whole: add --resume once there is room", file=sys.stderr)
                return 1
            raise


def who() -> str:
    """``treegrpo``, and under ``torchrun`` / ``accelerate launch`` the process (every process prints its own error
    line: the same line from each is one error, a line from one alone is that process's)."""
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return "treegrpo"
    return f"treegrpo [process {rank} of {world}]" if world > 1 else "treegrpo"


def _out_of_memory(e: BaseException) -> bool:
    torch = sys.modules.get("torch")      # no torch loaded: not its error
    return torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ()))


def out_of_memory_message(e: BaseException) -> str:
    """One line for an accelerator out-of-memory error: what ran out and how to go on."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return (f"out of accelerator memory ({shorten(first, 200)}). Plan for less: --memory.budget_gb a few GB under "
            "the GPU's (for what else runs on it), --memory.checkpointing on, or --memory.offload_rewards on (reward "
            "models on the CPU between scorings). A run that had begun kept its last finished iteration in its "
            "checkpoints folder: add --resume to go on from there (memory settings may change on a resume)")


def _output_closed() -> bool:
    """Whether nobody reads the standard output any more (its pipe's reader exited): what is still buffered cannot
    be written, or the pipe reports an error (poll)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    try:
        import select

        p = select.poll()
        p.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in p.poll(0))
    except (AttributeError, OSError, ValueError):     # no poll (Windows), no file descriptor
        return False


def short_message(text: str, limit: int = 1500) -> str:
    """An error message with quoted user input longer than 100 characters shortened (a 10 000-character prompt is
    not echoed whole), and the whole cut to about ``limit`` (a reward's list of the files it expects stays whole). A
    quote opens and closes beside no letter: the apostrophes of "the reward's" and "ComfyUI's" are not quotes."""
    import re

    text = re.sub(r"(?<!\w)'([^'\n]{100,})'(?!\w)", lambda m: repr(shorten(m.group(1))), text)
    return shorten(text, limit)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
