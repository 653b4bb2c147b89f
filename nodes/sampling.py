"""Tree Sampler and Load Demo Model nodes."""
from __future__ import annotations

import comfy.samplers
from comfy_api.latest import io

from treegrpo.comfyui.demo import load_demo_comfy
from treegrpo.comfyui.families import check_trainable
from treegrpo.comfyui.steps import sample_tree
from treegrpo.comfyui.train_node import tree_config
from treegrpo.config import ConfigError

from .sockets import CATEGORY, PackNode, Run, Tree
from .widgets import widget


def tree_inputs():
    """Widgets of the tree shape, shared by the Tree Sampler and the Train node."""
    return [
        widget(io.Int, "steps", "denoising steps T", min=1, max=200),
        widget(io.Int, "window_start", "first SDE (branching) step; earlier steps are shared ODE steps. Keep it "
               "early (high noise)", min=0, max=199),
        widget(io.Int, "window_width", "SDE steps in the window (tree depth)", min=1, max=10),
        widget(io.Int, "branch", "children per node; a tree has branch^width leaves", min=1, max=16),
        widget(io.Float, "noise_level", "SDE noise level (flow models) / DDIM eta (epsilon models, capped at 1)",
               min=0.01, max=2.0, step=0.01),
        widget(io.Combo, "window_schedule", "fixed: the window stays at window_start; sliding: it moves one step per "
               "iteration and wraps within the first half of the steps; random: a random start there each iteration"),
        widget(io.Boolean, "antithetic", optional=True,
                         tooltip="mirrored siblings: a node's children come in pairs with noise +e and -e. Each child "
                                 "is still an ordinary SDE sample; the pairs make the comparison between siblings "
                                 "less noisy, so the LoRA learns more per iteration"),
    ]


def tail_inputs():
    """The leaves' ODE tail after the window (optional widgets, last on their nodes so saved workflows keep
    their widget order)."""
    return [
        widget(io.Combo, "tail_solver", "ODE solver after the window: euler (1 call/step), heun (2 calls/step) or "
               "dpmpp_2m (second order, 1 call/step: as good with fewer steps)",
               optional=True),
        widget(io.Int, "tail_steps", "ODE steps after the window (0 = the schedule's remaining steps); the tail is "
               "most of a tree's model calls, so fewer steps of dpmpp_2m make an iteration much cheaper",
               min=0, max=200, optional=True),
    ]


def validate_tree(steps=None, window_start=None, window_width=None, branch=None) -> bool | str:
    """The tree shape's cross-field rules (window inside the steps, leaves within the memory guard), checked when
    a prompt is queued.  Only these four inputs are parameters: ComfyUI then still checks every other input
    against its min/max (it skips that for a node whose validate_inputs takes ``**kwargs``, and reports a
    failure once per parameter).  Since ComfyUI leaves these four to us, their ranges are checked here too."""
    vals = {"steps": steps, "window_start": window_start, "window_width": window_width, "branch": branch}
    if any(v is None for v in vals.values()):  # a linked input: validated at execution
        return True
    for inp in tree_inputs():
        if inp.id in vals and not (inp.min <= vals[inp.id] <= inp.max):
            return f"{inp.id} = {vals[inp.id]} is outside {inp.min}..{inp.max}"
    try:
        tree_config(steps, window_start, window_width, branch, noise_level=0.7)
    except ConfigError as e:
        return str(e)
    return True


class TreeSampler(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOTreeSampler", display_name="TreeGRPO Tree Sampler", category=f"{CATEGORY}/sampling",
            description="Samples search trees: shared ODE prefix, an SDE window where every node branches, ODE "
                        "tail per leaf. Outputs the TREE (for backup and training) and the leaf latents.",
            inputs=[
                io.Model.Input("model", tooltip="the model to sample (and train with the run's LoRA)"),
                io.Conditioning.Input("positive", tooltip="prompt conditioning"),
                io.Conditioning.Input("negative", tooltip="negative conditioning (used when cfg > 1)"),
                io.Latent.Input("latent", tooltip="empty latent: its size sets the image size, its batch the trees"),
                widget(io.Int, "seed", "seed of the initial noises and the SDE noise (with a run: of every "
                       "iteration's, as in the Train node)", min=0, max=0xFFFFFFFFFFFFFFFF,
                       control_after_generate=True),
                widget(io.Float, "cfg", "classifier-free guidance", min=1.0, max=30.0, step=0.1),
                io.Combo.Input("scheduler", options=comfy.samplers.SCHEDULER_NAMES, default="simple",
                               tooltip="sigma schedule (ComfyUI's schedulers, with the model's shift)"),
                *tree_inputs(),
                io.Int.Input("trees_per_latent", default=1, min=1, max=64,
                             tooltip="trees per latent in the batch (each with its own initial noise)"),
                io.String.Input("prompt", default="", multiline=True,
                                tooltip="the prompt text, passed on to reward scorers"),
                Run.Input("run", optional=True, tooltip="trainer state: sample with its current LoRA"),
                *tail_inputs(),
            ],
            outputs=[Tree.Output(display_name="tree", tooltip="the sampled trees, for Advantage Backup and Tree Preview"),
                     io.Latent.Output(display_name="leaves", tooltip="leaf latents in leaf order: decode with VAEDecode")],
        )

    @classmethod
    def validate_inputs(cls, steps=None, window_start=None, window_width=None, branch=None):
        deps = cls.check_dependencies()
        return deps if deps is not True else validate_tree(steps, window_start, window_width, branch)

    @classmethod
    def execute(cls, model, positive, negative, latent, seed, cfg, scheduler, steps, window_start, window_width,
                branch, noise_level, window_schedule, trees_per_latent, prompt, run=None, antithetic=True,
                tail_solver=None, tail_steps=None):
        check_trainable(model)   # a refused family or sampling: before any work
        bad = cls.check_combos(scheduler=scheduler, window_schedule=window_schedule, tail_solver=tail_solver)
        if bad is not True:   # checked here, not in validate_inputs: ComfyUI would repeat it per parameter
            raise ValueError(bad)
        tcfg = tree_config(steps, window_start, window_width, branch, noise_level, window_schedule, antithetic,
                           tail_solver, tail_steps)
        trees = latent["samples"].shape[0] * trees_per_latent
        tree = sample_tree(model, positive, negative, latent, tcfg, seed=seed, cfg=cfg, scheduler=scheduler,
                           trees=trees, prompt=prompt, run=run)
        return io.NodeOutput(tree, {"samples": tree.leaf_latents.cpu()})


class LoadDemoModel(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOLoadDemoModel", display_name="TreeGRPO Load Demo Model", category=f"{CATEGORY}/loaders",
            description="The embedded 16x16 coloured-shapes flow model (no download): prompts like 'a red circle'. "
                        "Use its CLIP with CLIPTextEncode and its VAE with VAEDecode.",
            inputs=[],
            outputs=[io.Model.Output(tooltip="the 16x16 shapes flow model"), io.Clip.Output(tooltip="its text encoder"),
                     io.Vae.Output(tooltip="its (pixel-space) VAE")],
        )

    @classmethod
    def execute(cls):
        return io.NodeOutput(*load_demo_comfy())


NODES = [TreeSampler, LoadDemoModel]
