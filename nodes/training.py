"""Trainer State, GRPO LoRA Trainer Step and the full-loop Train node."""
from __future__ import annotations

import json
import uuid

import comfy.samplers
from comfy_api.latest import io, ui

from treegrpo.comfyui.families import check_trainable, parse_targets, targets_tooltip
from treegrpo.comfyui.runtime import checkpointing_choice, patched_model
from treegrpo.comfyui.steps import RunState, train_step
from treegrpo.comfyui.train_node import prompt_lines, reward_inputs, run_train_node, train_node_config, tree_config
from treegrpo.comfyui.watch import EXISTING_RUN
from treegrpo.config import ConfigError, LoraConfig, OptimConfig, TreeConfig, check_run_name
from treegrpo.lora import LoraDict
from treegrpo.presets import CHOICES as PRESET_CHOICES
from treegrpo.presets import apply_preset, presets_help

from .sampling import tail_inputs, tree_inputs, validate_tree
from .sockets import CATEGORY, PackNode, RewardModel, Run, Tree
from .widgets import schedule_value, widget


def targets_input():
    """The LoRA targets (optional, last on its node): ``auto`` = the model family's attention and MLP layers."""
    return io.String.Input("lora_targets", default="auto", optional=True, tooltip=targets_tooltip())


def video_inputs():
    """Video families: the videos' length and the frames the rewards score (optional, last on the Train node)."""
    return [widget(io.Int, "frames", min=1, max=1024, optional=True),
            widget(io.Int, "reward_frames", min=1, max=1024, optional=True),
            widget(io.Int, "frame_stride", min=1, max=1024, optional=True)]


def lora_inputs():
    return [
        widget(io.Int, "lora_rank", "LoRA rank r", min=1, max=256),
        widget(io.Float, "lora_alpha", "LoRA alpha (scale alpha/r)", min=0.01, max=1024.0, step=0.5),
        widget(io.Float, "learning_rate", "AdamW learning rate", min=1e-7, max=1.0, step=1e-5),
    ]


class TrainerState(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOTrainerState", display_name="TreeGRPO Trainer State", category=f"{CATEGORY}/training",
            description="A named training run that survives between queued prompts (LoRA, optimiser, step). Saved "
                        "to output/treegrpo/<run_name>/ after every step and resumed from there by name.",
            inputs=[
                widget(io.String, "run_name", "runs with the same name continue (output/treegrpo/<run_name>/) with "
                       "the same LoRA rank and alpha; learning rate, KL and the tree may change between queues; a "
                       "Train node's run of that name is refused. Letters, digits, '-', '_', '.', at most 120 bytes"),
                *lora_inputs(),
                widget(io.Float, "clip_range", "PPO ratio clip", min=1e-6, max=1.0, step=1e-5),
                widget(io.Float, "kl_beta", "KL weight to the base model (LoRA off)", min=0.0, max=10.0, step=0.001),
                widget(io.Int, "seed", "seed of the LoRA initialisation", min=0, max=2**31 - 1),
                widget(io.Combo, "gradient_checkpointing", "recompute blocks in backward (less memory, ~1.5x the "
                       "update time); auto: on when the memory plan (made before the run's first tree, on a GPU) "
                       "needs it", optional=True),
                targets_input(),
            ],
            outputs=[Run.Output(display_name="run", tooltip="to the Tree Sampler and the Trainer Step")],
        )

    @classmethod
    def fingerprint_inputs(cls, run_name=None, **kwargs):
        """The run's iteration: every queued prompt after a Trainer Step sees a changed run, so ComfyUI re-runs
        the step nodes downstream instead of answering from its cache (the graph itself may not change)."""
        return RunState.iteration_of(run_name)

    @classmethod
    def validate_inputs(cls, run_name=None, gradient_checkpointing=None, lora_targets=None):
        deps = cls.check_dependencies()
        if deps is not True:
            return deps
        try:
            if run_name is not None:
                check_run_name(run_name, "run_name")
            if lora_targets is not None:
                parse_targets(lora_targets)
        except (ConfigError, ValueError) as e:
            return str(e)
        return cls.check_combos(gradient_checkpointing=gradient_checkpointing)

    @classmethod
    def execute(cls, run_name, lora_rank, lora_alpha, learning_rate, clip_range, kl_beta, seed,
                gradient_checkpointing="auto", lora_targets="auto"):
        targets = parse_targets(lora_targets or "auto")
        return io.NodeOutput(RunState.get(run_name, LoraConfig(rank=lora_rank, alpha=lora_alpha, targets=targets),
                                          OptimConfig(lr=learning_rate, clip_range=clip_range, kl_beta=kl_beta), seed,
                                          checkpointing_choice(gradient_checkpointing)))


class TrainerStep(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOTrainerStep", display_name="TreeGRPO GRPO LoRA Trainer Step",
            category=f"{CATEGORY}/training",
            description="One GRPO update of the run's LoRA on the tree's edges (one iteration per queued prompt: "
                        "use auto-queue to watch it learn). Saves the run, and the LoRA where LoraLoader lists it: "
                        "models/loras/treegrpo/<run_name>/<run_name>.safetensors, replaced at each step.",
            inputs=[
                Tree.Input("tree", tooltip="tree with advantages (from Advantage Backup)"),
                Run.Input("run", tooltip="the same trainer state the Tree Sampler used"),
                io.Model.Input("model", tooltip="base model, returned with the updated LoRA applied"),
            ],
            outputs=[io.Model.Output(display_name="model", tooltip="the model with the updated LoRA applied"),
                     io.LoraModel.Output(display_name="lora", tooltip="the LoRA, for TreeGRPO Save LoRA"),
                     io.String.Output(display_name="stats", tooltip="statistics of this update (JSON)")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, tree, run, model):
        stats = train_step(tree, run)
        lora = LoraDict(run.trainer.lora_tensors("comfy"), metadata=run.trainer.metadata())
        # 5 significant digits: a loss of 1e-8 (the ratio at 1 on a run's first iteration) is not shown as 0.0
        text = json.dumps({k: (float(f"{v:.5g}") if isinstance(v, float) else v) for k, v in stats.items()}, indent=1)
        return io.NodeOutput(patched_model(model, run.lora), lora, text, ui=ui.PreviewText(text))


class Train(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOTrain", display_name="TreeGRPO Train (full loop)", category=f"{CATEGORY}/training",
            description="The whole TreeGRPO loop in one node: sample trees -> decode -> score -> backup -> GRPO "
                        "update, for all iterations. Resumes the run's checkpoint; an interrupt saves one.",
            inputs=[
                io.Model.Input("model", tooltip="the base model to train a LoRA on"),
                io.Clip.Input("clip", tooltip="text encoder for the prompts"),
                io.Vae.Input("vae", tooltip="decodes the leaves for the reward models"),
                io.String.Input("prompts", multiline=True, default="a red circle\na blue square",
                                tooltip="training prompts, one per line"),
                widget(io.String, "negative", "negative prompt (cfg > 1)", multiline=False),
                RewardModel.Input("reward_model", tooltip="from a TreeGRPO Reward Model Loader (weight 1)"),
                RewardModel.Input("reward_model_2", optional=True, lazy=True,
                                  tooltip="optional second reward (weight_2 0: not loaded, not used)"),
                io.Float.Input("weight_2", default=1.0, min=0.0, max=100.0, step=0.05,
                               tooltip="weight of reward 2; 0 = reward 2 is not loaded nor trained on"),
                RewardModel.Input("judge", optional=True,
                                  tooltip="held-out judge: scored on the evaluation samples only, never trained on; "
                                          "its curve next to the training reward shows whether the LoRA improves or "
                                          "only fools the reward (the best LoRA by the judge is kept)"),
                io.Int.Input("width", default=512, min=8, max=4096, step=8, tooltip="image width (pixels)"),
                io.Int.Input("height", default=512, min=8, max=4096, step=8, tooltip="image height (pixels)"),
                widget(io.Float, "cfg", "classifier-free guidance (1 = off; keep 1 for Flux)", min=1.0, max=30.0,
                       step=0.1),
                io.Combo.Input("scheduler", options=comfy.samplers.SCHEDULER_NAMES, default="simple",
                               tooltip="sigma schedule (ComfyUI's schedulers, with the model's shift)"),
                *tree_inputs(),
                widget(io.Int, "iterations", "training iterations (a resumed run continues up to this many)", min=1,
                       max=100000),
                widget(io.Int, "prompts_per_iteration", "prompts (one tree each) per iteration", min=1, max=256),
                *lora_inputs(),
                widget(io.Int, "seed", "seed of the LoRA init, prompts and noises", min=0, max=2**31 - 1),
                widget(io.String, "run_name", "checkpoints go to output/treegrpo/<run_name>/; the same name resumes; "
                       "letters, digits, '-', '_', '.', at most 120 bytes"),
                widget(io.Int, "eval_every", "evaluate on fixed noises every N iterations (reward curve)", min=0,
                       max=100000),
                widget(io.Combo, "gradient_checkpointing", "recompute blocks in backward (less memory, ~1.5x the "
                       "update time); auto: on when the memory plan needs it",
                       optional=True),
                *tail_inputs(),
                widget(io.Float, "memory_budget_gb", "GB the memory plan may use (0 = the GPU's memory; on the CPU "
                       "nothing is planned). The plan picks checkpointing, microbatch and reward offload to fit, "
                       "or stops before any work saying what to change", optional=True, min=0.0, max=4096.0,
                       step=0.5),
                widget(io.Combo, "offload_rewards", "reward models on the CPU except while scoring; auto: when the "
                       "memory plan needs it", optional=True),
                widget(io.Combo, "tiled_decode", "decode the leaves in tiles (less memory, slower decode); auto: when "
                       "the memory plan needs it", optional=True),
                targets_input(),
                *video_inputs(),
                io.Float.Input("guidance", default=0.0, min=0.0, max=100.0, step=0.1, optional=True,
                               tooltip="embedded (distilled) guidance of Flux-style models (Flux.1 dev, Flux.2, "
                                       "HunyuanVideo), as ComfyUI's FluxGuidance node sets it; 0 = the model's "
                                       "default (3.5 for Flux). Other families ignore it; they use cfg"),
                # last, so that workflows saved before these inputs existed keep their widget values in place
                widget(io.Int, "artist_every", "ask you about every N-th tree of the run in this tab (0 = never): "
                       "pick favourites among its leaves; the other trees, and unanswered ones, are scored by the "
                       "reward model", optional=True, min=0, max=10 ** 6),
                widget(io.Combo, "artist_mode", "how you answer: favourites, ranking, best_worst",
                       optional=True),
                widget(io.Int, "artist_timeout_s", "seconds to wait for your answer about one tree", optional=True,
                       min=5, max=86400),
                widget(io.Combo, "artist_ask", "every N-th tree: ask about every artist_every-th tree, the reward "
                       "model scores the rest; when unsure: a taste model learns from your answers, scores the "
                       "trees and asks you only where it is unsure (at most one tree in artist_every; always the "
                       "first 12; 12 unanswered in a row before any answer with a preference stop the run, saved: "
                       "nothing can train without one), and is saved as models/reward_models/<run_name>_taste.safetensors",
                       optional=True),
                io.ClipVision.Input("taste_features", optional=True,
                                    tooltip="artist_ask 'when unsure': the image features the taste model learns on "
                                            "(Load CLIP Vision). Without it: the reward model's image tower (HPS, "
                                            "PickScore, CLIPScore, aesthetic) or the demo model's own encoder"),
                widget(io.String, "tail_steps_schedule", "[[iteration, tail_steps], ...] from iteration 0: a tail that "
                       "lengthens with training, e.g. [[0, 1], [60, 2]] (one dpmpp_2m step, two from iteration 60; "
                       "cheaper early iterations); [] = tail_steps throughout", optional=True, multiline=False),
                widget(io.String, "lr_factor_schedule", "[[iteration, factor], ...] from iteration 0: the learning "
                       "rate times each factor from its iteration on, e.g. [[0, 1], [100, 0.5]]; [] = the learning "
                       "rate throughout", optional=True, multiline=False),
                io.String.Input("eval_prompts", default="", multiline=True, optional=True,
                                tooltip="held-out evaluation prompts, one a line (the Prompt List's eval_prompts); "
                                        "empty = evaluate on the first 32 training prompts"),
                io.Combo.Input("existing_run", options=list(EXISTING_RUN), default="resume", optional=True,
                               tooltip="when run_name already trained: resume it (same settings only; refused where "
                                       "its LoRAs are but its checkpoints are not in ComfyUI's output folder), start a new "
                                       "numbered run beside it (run_name-2, -3, ...; the old one stays), or overwrite "
                                       "it (its files, and its LoRAs in models/loras/treegrpo/<run_name>/, are "
                                       "moved to a previous-<time>/ folder beside them, nothing deleted)"),
                widget(io.Float, "kl_beta", "KL weight to the base model (LoRA off): keeps the LoRA near the base "
                       "model so it does not learn to fool the reward; 0 = off", optional=True, min=0.0, max=10.0,
                       step=0.001),
                io.Int.Input("save_every", default=0, min=0, max=100000, optional=True,
                             tooltip="write the LoRA every N iterations to models/loras/treegrpo/<run_name>/ (LoraLoader "
                                     "lists them; the best by the judge and the last are written there always); 0 = "
                                     "only those"),
                io.Combo.Input("preset", options=list(PRESET_CHOICES), default="custom", optional=True,
                               tooltip="the leaves' ODE tail after the window, never more steps than the schedule "
                                       "leaves after it; custom = tail_solver and tail_steps as set. At 20 steps, "
                                       "window 1-3, branch 2: " + presets_help(
                                           TreeConfig(steps=20, window_start=1, window_width=3, branch=2))),
                widget(io.Int, "artist_away_s", "after a question went unanswered, the next ones wait only this long "
                       "(seconds) until you answer again, so a run left alone does not stall artist_timeout_s on every "
                       "tree; the node shows how many trees fell back", optional=True, min=1, max=86400),
                widget(io.Int, "artist_check_every", "every N iterations, and at the end, you see the model's "
                       "pictures now beside the base model's (same noises) and pick the side closer to what you want "
                       "(twice, on other noises): picking the start rolls the LoRA back to the last state you "
                       "approved; the run ends on a state you preferred to the start, or on the base model (0 = "
                       "never)", optional=True, min=0, max=1000000),
            ],
            outputs=[io.Model.Output(display_name="model", tooltip="the model with the trained LoRA applied"),
                     io.LoraModel.Output(display_name="lora", tooltip="the LoRA, for TreeGRPO Save LoRA"),
                     io.Image.Output(display_name="reward_curve", tooltip="evaluation reward, held-out judge and "
                                     "hacking signals over the run (also shown live on the node while it trains)"),
                     io.Image.Output(display_name="samples", tooltip="evaluation samples with the LoRA")],
            is_output_node=True,
        )

    @classmethod
    def fingerprint_inputs(cls, existing_run="resume", **_):
        """'new' and 'overwrite' start a run at every queue: never answered from ComfyUI's cache of the last one
        (queued again with the graph unchanged, no run started)."""
        return uuid.uuid4().hex if existing_run in EXISTING_RUN[1:] else existing_run

    @classmethod
    def check_lazy_status(cls, weight_2=1.0, **kw):
        """reward_model_2 is loaded only when it counts: a weight_2 of 0 leaves its loader (a model of gigabytes,
        perhaps) unrun. (ComfyUI passes a connected input not yet evaluated as None, an unconnected one not at
        all.)"""
        wanted = "reward_model_2" in kw and kw["reward_model_2"] is None
        return ["reward_model_2"] if wanted and isinstance(weight_2, (int, float)) and weight_2 > 0 else []

    @classmethod
    def validate_inputs(cls, steps=None, window_start=None, window_width=None, branch=None,
                        gradient_checkpointing=None):
        # ComfyUI repeats a failure once per parameter named here: the other checks run first thing in execute.
        # gradient_checkpointing is named so that ComfyUI 0.33+ leaves its value to check_combos, which accepts the
        # boolean of workflows saved before it became a choice (read as on / auto by the node)
        deps = cls.check_dependencies()
        if deps is not True:
            return deps
        tree = validate_tree(steps, window_start, window_width, branch)
        return tree if tree is not True else cls.check_combos(gradient_checkpointing=gradient_checkpointing)

    @classmethod
    def check_inputs(cls, model, prompts, run_name, lora_targets, **combos) -> list[str]:
        """What validation leaves to execution, before any work: the model's family, prompts, run name, LoRA
        targets, combo values. Returns the LoRA targets."""
        check_trainable(model)
        if not [p for p in prompts.splitlines() if p.strip()]:
            raise ValueError("prompts: no prompt given; write one training prompt per line")
        check_run_name(run_name, "run_name")
        targets = parse_targets(lora_targets or "auto")
        bad = cls.check_combos(**combos)
        if bad is not True:
            raise ValueError(bad)
        return targets

    @classmethod
    def execute(cls, model, clip, vae, prompts, negative, reward_model, weight_2, width, height, cfg, scheduler,
                steps, window_start, window_width, branch, noise_level, window_schedule, iterations,
                prompts_per_iteration, lora_rank, lora_alpha, learning_rate, seed, run_name, eval_every,
                reward_model_2=None, gradient_checkpointing="auto", antithetic=True, tail_solver=None, tail_steps=None,
                memory_budget_gb=0.0, offload_rewards="auto", tiled_decode="auto", judge=None, lora_targets="auto",
                frames=1, reward_frames=None, frame_stride=None, guidance=0.0, artist_every=0,
                artist_mode="favourites", artist_timeout_s=600, artist_ask="every N-th tree", taste_features=None,
                tail_steps_schedule="[]", lr_factor_schedule="[]", eval_prompts="", existing_run="resume",
                kl_beta=None, save_every=0, artist_away_s=30, preset="custom",
                artist_check_every=None):
        finite = cls.check_numbers(dict(learning_rate=learning_rate, noise_level=noise_level, cfg=cfg,
                                        lora_alpha=lora_alpha, weight_2=weight_2, memory_budget_gb=memory_budget_gb,
                                        guidance=guidance, kl_beta=kl_beta))
        if finite is not True:
            raise ValueError(finite)
        targets = cls.check_inputs(model, prompts, run_name, lora_targets, scheduler=scheduler,
                                   window_schedule=window_schedule, tail_solver=tail_solver,
                                   gradient_checkpointing=gradient_checkpointing, offload_rewards=offload_rewards,
                                   tiled_decode=tiled_decode, artist_mode=artist_mode, artist_ask=artist_ask,
                                   existing_run=existing_run, preset=preset)
        texts, held_out = prompt_lines(prompts), prompt_lines(eval_prompts)
        rewards, specs, judges = reward_inputs(reward_model, reward_model_2, weight_2, judge)
        tree = apply_preset(tree_config(steps, window_start, window_width, branch, noise_level, window_schedule,
                                        antithetic, tail_solver, tail_steps,
                                        tail_steps_schedule=schedule_value("tail_steps_schedule", tail_steps_schedule)),
                            preset or "custom")
        tc = train_node_config(
            prompts=texts, negative=negative, reward_specs=specs, judges=list(judges), cfg=cfg, tree=tree,
            iterations=iterations, prompts_per_iteration=prompts_per_iteration, lora_rank=lora_rank,
            lora_alpha=lora_alpha, targets=targets, learning_rate=learning_rate,
            lr_factor_schedule=schedule_value("lr_factor_schedule", lr_factor_schedule), kl_beta=kl_beta, seed=seed,
            run_name=run_name, eval_every=eval_every, eval_prompts=held_out, memory_budget_gb=memory_budget_gb,
            gradient_checkpointing=gradient_checkpointing, offload_rewards=offload_rewards, tiled_decode=tiled_decode,
            frames=frames, reward_frames=reward_frames, frame_stride=frame_stride, artist=bool(artist_every))
        artist = dict(every=artist_every, mode=artist_mode, timeout_s=artist_timeout_s, ask=artist_ask,
                      away_s=artist_away_s, check_every=artist_check_every) if artist_every else None
        trainer, curve, grid = run_train_node(
            model, clip, vae, tc, rewards, judges, prompts=texts, eval_prompts=held_out, negative=negative,
            width=width, height=height, scheduler=scheduler, guidance=guidance, artist=artist,
            taste_features=taste_features, existing_run=existing_run, save_every=save_every)
        lora = LoraDict(trainer.lora_tensors("comfy"), metadata=trainer.metadata())
        return io.NodeOutput(patched_model(model, trainer.lora), lora, curve, grid,
                             ui=ui.PreviewImage(grid.cpu(), cls=cls))


NODES = [TrainerState, TrainerStep, Train]
