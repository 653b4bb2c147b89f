"""The Train node's run, outside the node: its widget values become one :class:`TrainConfig`
(:func:`train_node_config`), and :func:`run_train_node` does the rest — the reward prompts' check, the latent shape,
the prompts' conditioning, the artist or taste model it asks, the training loop (:func:`train_full`) and the
previews (:func:`run_previews`). ``nodes/training.py`` checks the inputs, calls these two and wires the outputs.
Imported only inside ComfyUI (it imports ``comfy`` lazily).
"""
from __future__ import annotations

import os

import dataclasses
import logging
from typing import Callable, Optional

import torch

from .. import checkpoint as ckpt
from ..io import cannot_write
from ..config import AdvantageConfig, LoraConfig, MemoryConfig, OptimConfig, TrainConfig, TreeConfig, VideoConfig
from ..rewards.base import check_config_prompts
from ..run import build_trainer, check_tail
from ..trainer import Trainer
from . import model_chain, runtime
from .lora_files import LORAS_ELSEWHERE
from .policy import ComfyPolicy
from .runtime import checkpointing_choice


def prompt_lines(text: Optional[str]) -> list[str]:
    """The non-empty lines of a multiline prompt widget, stripped (a byte-order mark pasted with them too)."""
    lines = (p.strip().lstrip("\ufeff").strip() for p in (text or "").splitlines())
    return [p for p in lines if p]


def reward_inputs(reward_model: dict, reward_model_2: Optional[dict], weight_2: float,
                  judge: Optional[dict]) -> tuple[dict, list[dict], dict]:
    """The connected reward models (``{"name", "model"}`` from the Reward Model Loader): ``(rewards {name: model},
    their specs [{name, weight}], judges {name: model})``; the same reward twice is refused; a second reward of
    weight 0 is left out (it would change nothing the run learns)."""
    rewards = {reward_model["name"]: reward_model["model"]}
    specs = [{"name": reward_model["name"], "weight": 1.0}]
    if reward_model_2 is not None and weight_2 > 0:
        if reward_model_2["name"] in rewards:
            raise ValueError(f"reward_model and reward_model_2 are both {reward_model_2['name']!r}; connect "
                             "another reward type to reward_model_2, or raise the first one's weight instead")
        rewards[reward_model_2["name"]] = reward_model_2["model"]
        specs.append({"name": reward_model_2["name"], "weight": weight_2})
    judges = {judge["name"]: judge["model"]} if judge is not None else {}
    return rewards, specs, judges


def tree_config(steps: int, window_start: int, window_width: int, branch: int, noise_level: float,
                window_schedule: str = "fixed", antithetic=True, tail_solver: Optional[str] = None,
                tail_steps: Optional[int] = None, **kw) -> TreeConfig:
    """The tree widgets of the Tree Sampler and the Train node as a :class:`TreeConfig` (``kw``: its other fields).
    Two rules differ from the command line's defaults: an SD1.x/SDXL model's DDIM η is ``noise_level`` (at most 1;
    ``tree.eta`` is 1 there), and a sliding or random window stays in the first half of the steps (it starts no later
    than ``max(window_start, steps // 2 − 1)``); no tail widget: the config's tail."""
    fields = TreeConfig.__dataclass_fields__
    return TreeConfig(steps=steps, window_start=window_start, window_width=window_width, branch=branch,
                      noise_level=noise_level, eta=min(1.0, noise_level), window_schedule=window_schedule,
                      antithetic=bool(antithetic), tail_solver=tail_solver or fields["tail_solver"].default,
                      tail_steps=fields["tail_steps"].default if tail_steps is None else tail_steps,
                      window_max_start=-1 if window_schedule == "fixed" else
                      min(steps - window_width, max(window_start, steps // 2 - 1)), **kw)


def train_node_config(*, prompts: list[str], negative: str, reward_specs: list[dict], judges: list[str], cfg: float,
                      tree: TreeConfig, iterations: int, prompts_per_iteration: int, lora_rank: int,
                      lora_alpha: float, targets: list[str], learning_rate: float, lr_factor_schedule: list,
                      kl_beta: Optional[float], seed: int, run_name: str, eval_every: int, eval_prompts: list[str],
                      memory_budget_gb: float, gradient_checkpointing, offload_rewards: Optional[str],
                      tiled_decode: Optional[str], frames: Optional[int], reward_frames: Optional[int],
                      frame_stride: Optional[int], artist: bool = False) -> TrainConfig:
    """The Train node's widgets (parsed: prompt lines, LoRA targets, the tree with its preset applied, schedules) as
    the run's config. Unset optional widgets (None, 0, "") take the config's defaults; ``kl_beta`` None (a workflow
    saved before the widget) keeps the default; evaluation uses 2 fixed noises per prompt; a checkpoint is written
    every 25 iterations (every iteration for a shorter run, and where the ``artist`` answers: a crash then costs
    no more than the answers of the iteration it cut)."""
    return TrainConfig(
        backend="comfy", prompts=prompts, negative_prompt=negative, guidance_scale=cfg, rewards=reward_specs, tree=tree,
        eval_rewards=[{"name": n, "weight": 1.0} for n in judges],
        advantage=AdvantageConfig(),
        lora=LoraConfig(rank=lora_rank, alpha=lora_alpha, targets=targets),
        optim=OptimConfig(lr=learning_rate, lr_factor_schedule=lr_factor_schedule,
                          **({} if kl_beta is None else {"kl_beta": kl_beta})),
        eval_prompts=eval_prompts,
        iterations=iterations,
        prompts_per_iter=prompts_per_iteration, seed=seed, eval_every=eval_every,
        eval_seeds=2, checkpoint_every=1 if artist else max(1, min(25, iterations)), run_name=run_name,
        memory=MemoryConfig(budget_gb=memory_budget_gb or 0.0,
                            checkpointing=checkpointing_choice(gradient_checkpointing),
                            offload_rewards=offload_rewards or "auto",
                            tiled_decode=tiled_decode or "auto"),
        video=VideoConfig(frames=frames or 1,
                          reward_frames=reward_frames or VideoConfig().reward_frames,
                          frame_stride=frame_stride or VideoConfig().frame_stride))


def encode(clip, text: str, guidance: float = 0.0):
    """CONDITIONING of ``text``; ``guidance`` > 0 sets the embedded guidance (what FluxGuidance does)."""
    cond = clip.encode_from_tokens_scheduled(clip.tokenize(text))
    if guidance and guidance > 0:
        import node_helpers
        cond = node_helpers.conditioning_set_values(cond, {"guidance": float(guidance)})
    return cond


def executing_node_id():
    """The id of the node ComfyUI is executing (for text under it), or None."""
    try:
        from comfy_execution.utils import get_executing_context
        ctx = get_executing_context()
        return None if ctx is None else ctx.node_id
    except ImportError:
        return None


def artist_hook(model, rewards: dict, taste_features, *, every: int, mode: Optional[str], timeout_s: Optional[int],
                ask: Optional[str], away_s: Optional[int], check_every: Optional[int] = None, seed: int = 0):
    """``(leaf scorer, check against the start)`` asking the artist in the tab that queued the prompt (``every`` 0:
    ``(None, None)``). The scorer: every N-th tree, or a taste model that asks when unsure (its features:
    ``taste_features`` (CLIP Vision), else the reward model's image tower or the demo model's encoder). The check
    (:class:`treegrpo.artist.start_check.StartCheck`, every ``check_every`` iterations; None when 0): the pictures
    now beside the base model's, one question in the same dialog."""
    if not every:
        return None, None
    from ..config import ArtistConfig
    from .artist.questions import train_node_artist

    acfg = ArtistConfig(mode=mode or "favourites", timeout_s=timeout_s or 600, every=every,
                        ask=ask or "every", away_s=away_s or ArtistConfig().away_s,
                        check_every=ArtistConfig().check_every if check_every is None else check_every)
    where = runtime.asking_context()
    if acfg.ask == "unsure":
        from ..demo import BASE_MODEL_NAME
        from ..artist.taste import TasteConfig
        from .artist.taste import choose_encoder, train_node_taste

        encoder = choose_encoder(taste_features, rewards, demo=runtime.model_name(model) == BASE_MODEL_NAME)
        hook = train_node_taste(encoder, acfg.mode, acfg.timeout_s, TasteConfig.one_in(acfg.every),
                                away_s=acfg.away_s, **where)

        def learn(first, second, pick):          # the taste model learns each check too (once it exists)
            if "taste" in hook.state:
                hook.state["taste"].learn_check(first, second, pick)
                if pick is not None:                 # and its file says so (a side picked: one more comparison)
                    hook.state["save"]()

        return hook, (start_check(acfg, seed, learn=learn, **where) if acfg.check_every else None)
    return (train_node_artist(acfg.every, acfg.mode, acfg.timeout_s, away_s=acfg.away_s, **where),
            start_check(acfg, seed, **where) if acfg.check_every else None)


def start_check(acfg, seed: int, learn: Optional[Callable] = None, **where):
    """The Train node's check against the start: a :class:`~treegrpo.artist.start_check.StartCheck` whose question
    goes to the artist's dialog (:func:`treegrpo.comfyui.artist.questions.ask_check`, the run folder keeps the
    answers); ``learn(first, second, pick)`` also gets each answer (the taste model's
    :meth:`~treegrpo.artist.taste.OnlineTaste.learn_check`) but one given before a crash that the resumed taste model
    already read back (:func:`treegrpo.artist.taste.from_labels` reads the checks up to the checkpoint's iteration)."""
    from ..artist.start_check import CheckConfig, StartCheck
    from .artist.questions import ask_check

    def ask(first, second, prompts, iteration, again=False):   # the run's folder and name: known once it began
        replayed = []
        pick = ask_check(first, second, prompts, iteration, folder=check.output_dir, run_name=check.run_name,
                         timeout_s=acfg.timeout_s, away_grace_s=acfg.away_s, again=again, replayed=replayed, **where)
        if replayed and replayed[0]["iteration"] <= check.began_at:
            return pick                              # e.g. the end's check, cut after the end's checkpoint
        if learn is not None:                        # video sides: their first frames; no answer: nothing to learn
            learn(*((x if x.ndim == 4 else x[:, 0]).float().cpu() for x in (first, second)),
                  pick if pick in (0, 1) else None)
        return pick

    def keep(trainer) -> str:   # the state the end of the run takes back, as a LoRA beside the run's files
        return trainer.save_lora(os.path.join(trainer.out, f"{trainer.cfg.run_name}-not-preferred-"
                                                            f"{trainer.iteration}.safetensors"))

    check = StartCheck(ask, CheckConfig(every=acfg.check_every, seed=seed), on_unapproved=keep)
    return check


def run_train_node(model, clip, vae, tc: TrainConfig, rewards: dict, judges: dict, *, prompts: list[str],
                   eval_prompts: list[str], negative: str, width: int, height: int, scheduler: str, guidance: float,
                   artist: Optional[dict] = None, taste_features=None, existing_run: Optional[str] = "resume",
                   save_every: Optional[int] = 0):
    """The Train node's whole run: ``(trainer, reward curve image, samples grid)``. Before any work: the rewards'
    prompt requirements (e.g. the ocr reward's quoted text) and the size against the VAE's scale; then the latent
    shape, the conditioning of the training and held-out prompts, the artist hook (``artist``: the keyword arguments
    of :func:`artist_hook`), the loop and its previews."""
    texts, held_out = prompts, eval_prompts
    check_reward_prompts(tc, texts)          # e.g. the ocr reward: every prompt quotes the text to write
    check_tail(tc.tree)                      # a tail_steps its schedule hides: said on the console
    r = vae.spacial_compression_decode()
    if width % r or height % r:
        raise ValueError(f"width {width} and height {height} must be multiples of the VAE's scale factor {r}")
    shape = runtime.latent_shape_for(model, width, height, r, tc.video.frames, vae.temporal_compression_decode() or 1)
    if len(shape) == 4:                      # a video model: what its length and scored frames come to
        from ..video import video_notes
        for note in video_notes(tc.video.frames, vae.temporal_compression_decode() or 1, tc.video.reward_frames,
                                tc.video.frame_stride):
            logging.warning("TreeGRPO: %s", note)
    encoded = texts + [p for p in dict.fromkeys(held_out) if p not in texts]   # held-out prompts need conds too
    conds = [(encode(clip, t, guidance), encode(clip, negative, guidance)) for t in encoded]
    hook, check = artist_hook(model, rewards, taste_features, seed=tc.seed, **artist) if artist else (None, None)
    trainer = train_full(model, vae, encoded, conds, rewards, tc, shape, scheduler=scheduler, judges=judges,
                         artist=hook, start_check=check, existing_run=existing_run or "resume",
                         save_every=save_every or 0,
                         node_id=executing_node_id())
    curve, grid = run_previews(trainer, held_out or texts)
    return trainer, curve, grid


def check_reward_prompts(tc: TrainConfig, prompts: list[str]) -> None:
    """The rewards' prompt requirements (:func:`treegrpo.rewards.base.check_config_prompts`) on the prompts as the
    rewards read them here, without ComfyUI's weighting syntax (:func:`treegrpo.prompts.reward_text`); where that
    syntax sits inside the text the ``ocr`` reward wants written (``"OPEN (24h)"``: the text encoder reads ``24h``
    emphasised, without brackets), the console says what is compared and how to write literal brackets."""
    from ..prompts import reward_text

    read = {p: reward_text(p) for p in dict.fromkeys(list(prompts) + list(tc.eval_prompts))}
    check_config_prompts(dataclasses.replace(tc, eval_prompts=[read[p] for p in tc.eval_prompts]),
                         [read[p] for p in prompts])
    if not any(r.name == "ocr" for r in list(tc.rewards) + list(tc.eval_rewards)):
        return
    from ..rewards.ocr import quoted_text

    typed = {p: quoted_text(p.replace("\\(", "(").replace("\\)", ")")) for p in read}   # \( \) are brackets
    changed = [(typed[p], quoted_text(r)) for p, r in read.items() if typed[p] != quoted_text(r)]
    if changed:
        shown = "; ".join(f"{a!r} is read {b!r}" for a, b in changed[:3])
        logging.warning("TreeGRPO: the ocr reward compares the quoted text as ComfyUI's text encoder reads it, "
                        "without its weighting syntax: %s%s. Write \\( and \\) for brackets the image should "
                        "show", shown, f" (and {len(changed) - 3} more)" if len(changed) > 3 else "")


def check_lost_checkpoints(run_name: str, out: str, loras: str, hint: str) -> None:
    """``existing_run`` resume where the run's LoRA folder holds its LoRAs but ComfyUI's output folder has no run
    folder of it: it trained with another output folder (ComfyUI started with another ``--output-directory``) or its
    run folder went. Starting over there would be a silent fresh start of a run the user asked to continue: refused,
    nothing trained. (A run stopped before its first checkpoint keeps its run folder and starts afresh.)"""
    from .watch import lora_files

    if ckpt.checkpoint_paths(out, run_name) or ckpt.folder_owner(out) is not None or not lora_files(loras):
        return
    raise ValueError(f"TreeGRPO Train: run {run_name!r} has LoRAs in {loras!r} but no checkpoint to resume from in "
                     f"{os.path.join(out, 'checkpoints')!r}. If it trained with another output folder (ComfyUI "
                     f"started with another --output-directory), start ComfyUI with that one again to resume it; else "
                     f"{hint}; nothing has been trained yet")


def train_full(model, vae, prompts: list[str], conds: list[tuple], rewards: dict, cfg: TrainConfig,
               latent_shape: tuple, *, scheduler: str = "simple", judges: Optional[dict] = None,
               artist: Optional[Callable] = None, existing_run: str = "resume", save_every: int = 0,
               node_id: Optional[str] = None, start_check: Optional[Callable] = None) -> Trainer:
    """The whole TreeGRPO loop on a ComfyUI model (the Train node). ``existing_run`` (:data:`watch.EXISTING_RUN`)
    decides what happens when ``cfg.run_name`` already trained: ``resume`` its latest checkpoint, start a ``new``
    numbered run beside it, or ``overwrite`` it (its files moved aside); the run trained is ``trainer.cfg.run_name``.
    Before any sampling the memory plan (``cfg.memory``) picks checkpointing, microbatch and offload for the
    device's memory (or refuses). After every iteration ComfyUI's progress bar moves, one console line and the node
    show reward, judge, KL, s/it and the time left (:class:`watch.RunWatcher`), and every ``save_every`` iterations
    the LoRA is written where LoraLoader lists it; after every evaluation the curves and the sample grid show on the
    node and the grid is kept in the run folder (``judges``: held-out reward models). Interrupts are checked at
    every denoiser/update step and answered with a checkpoint (by the Trainer) before the exception propagates."""
    import comfy.model_management

    from .watch import RunWatcher, choose_run, loras_folder

    name, resume = choose_run(cfg.run_name, existing_run, runtime.run_folder)
    if name != cfg.run_name:
        logging.info("TreeGRPO: run %r already trained; existing_run 'new' trains %r beside it", cfg.run_name, name)
        cfg = dataclasses.replace(cfg, run_name=name)
    out = runtime.run_folder(cfg.run_name)
    for folder, what, elsewhere in (
            (out, "the run's folder (checkpoints, logs)", "start ComfyUI with --output-directory set to a folder it can "
             "write"),
            (loras_folder(cfg.run_name), "the LoRA folder (where LoraLoader lists the run's LoRAs)",
             LORAS_ELSEWHERE)):
        why = cannot_write(folder)
        if why:
            raise ValueError(f"TreeGRPO Train cannot write {what} {folder!r}: {why}. Make it writable for the user "
                             f"ComfyUI runs as, or {elsewhere}; nothing has been trained yet")
    # before any model work: a run of this name trained with other settings or on another base model is not
    # continued silently
    hint = ("set existing_run to 'new' (a fresh numbered run; this one stays) or 'overwrite' (its files are moved to "
            "previous-<time>/)")
    chain = model_chain.describe_or_none(model)
    slow = runtime.slow_precision_note(vae)
    if slow:
        logging.warning(slow)
    if resume:
        ckpt.check_resume(out, dataclasses.replace(cfg, output_dir=out), required=False, override_hint=hint)
        check_lost_checkpoints(cfg.run_name, out, loras_folder(cfg.run_name), hint)
        model_chain.check_resumed(out, cfg.run_name, chain, hint)
    ckpt.check_run_folder(out, cfg.run_name, runtime.model_name(model),
                          fresh=not (resume and ckpt.checkpoint_paths(out, cfg.run_name)),
                          hint=hint[0].upper() + hint[1:])
    ckpt.check_not_in_use(out)      # another ComfyUI training into this folder
    policy = ComfyPolicy(model, prompts, conds, latent_shape, vae=vae, lora_cfg=cfg.lora, scheduler=scheduler,
                         seed=cfg.seed, gradient_checkpointing=cfg.memory.checkpointing == "on", video=cfg.video)
    policy.check_window(cfg.tree)
    bar = runtime.comfy_progress(cfg.iterations)
    with torch.inference_mode(False):
        trainer = build_trainer(dataclasses.replace(cfg, output_dir=out), policy, rewards,
                                progress=False, base_model_name=runtime.model_name(model),
                                step_callback=comfy.model_management.throw_exception_if_processing_interrupted,
                                judges=judges, callbacks=[cb for cb in (start_check, getattr(artist, "keeper", None))
                                                          if cb is not None],
                                leaf_scorer=artist)  # the person answering about some trees (artist_every)
        trainer.log = logging.info
        trainer.model_chain = chain
        # after the check against the start: the console line shows its verdict
        trainer.callbacks.append(RunWatcher(trainer, cfg.iterations, bar, save_every=save_every, node_id=node_id))
        watcher = trainer.callbacks[-1]
        if not cfg.memory.budget_gb:
            trainer.memory_budget = runtime.memory_budget(policy.device) or None
        # the probe of a large model takes minutes of CPU: Cancel stops it between its measurements
        trainer.plan_memory(check=comfy.model_management.throw_exception_if_processing_interrupted)
        try:
            trainer.train(resume=resume)
        except BaseException as e:
            watcher.stopped(e)
            raise
    trainer.save_lora()  # before anything optional: a failing preview must never cost the trained LoRA
    watcher.finish()     # the LoRA where LoraLoader lists it, the run's figures
    return trainer


def run_previews(trainer: Trainer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Train node's optional outputs, as ComfyUI IMAGEs (1, H, W, 3): the reward curve and a grid of
    evaluation samples (2 per prompt, up to 8 prompts). A failure here (a plotting library missing, a reward
    model erroring) is logged and answered with a blank image: the LoRA is already saved."""
    from ..io import atomic_write
    from ..report import curve_image, image_grid, sample_grid, signals_image, to_pil
    from .watch import preview_grid_path, read_grid

    def curve():
        if trainer.evals:
            return signals_image(trainer.evals)
        return curve_image([h["reward"] for h in trainer.history])

    def grid():
        # kept in the run folder as it is shown: a finished run queued again (ComfyUI restarted, its cache gone)
        # shows the same picture without sampling it again
        path = preview_grid_path(trainer.out, trainer.iteration, prompts[:8])
        g = read_grid(path)
        if g is None:
            with torch.inference_mode(False):
                ev = trainer.evaluate(prompts=prompts[:8], seeds=2, return_images=True)
            g = sample_grid(ev["images"], 2) if ev["images"].shape[-1] > 2 * ev["images"].shape[-2] else \
                image_grid(ev["images"], nrow=2, scale=max(1, 128 // max(1, ev["images"].shape[-1])))
            if trainer.rank == 0:
                atomic_write(path, lambda tmp: to_pil(g).save(tmp, format="PNG"))
            g = read_grid(path)
        return g.movedim(0, -1)[None].float()

    return _optional("reward curve", curve, trainer), _optional("sample grid", grid, trainer)


def _optional(what: str, draw: Callable[[], torch.Tensor], trainer: Trainer) -> torch.Tensor:
    """``draw()``, or a blank 64×64 IMAGE with a logged warning when it fails (interrupts still propagate)."""
    import logging

    from comfy.model_management import InterruptProcessingException

    try:
        return draw()
    except InterruptProcessingException:
        raise
    except Exception as e:  # noqa: BLE001 - an optional output must not fail the run
        logging.warning("TreeGRPO: could not draw the %s (%s: %s); the LoRA is saved at %s", what,
                        type(e).__name__, e, trainer.lora_path)
        return torch.zeros(1, 64, 64, 3)
