"""Tree Preview node: leaves laid out by tree and branch, annotated with reward and advantage."""
from __future__ import annotations

from comfy_api.latest import io, ui

from treegrpo.comfyui.steps import monitor_tree
from treegrpo.report import signals_image, tree_preview

from .sockets import CATEGORY, PackNode, RewardModel, Rewards, Tree


class TreePreview(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOTreePreview", display_name="TreeGRPO Tree Preview", category=f"{CATEGORY}/visualize",
            description="Shows every leaf of every tree in branch order, with its reward and advantage.",
            inputs=[
                Tree.Input("tree", tooltip="tree (with advantages, from Advantage Backup, to show them)"),
                io.Image.Input("images", tooltip="decoded leaves of the tree"),
                Rewards.Input("rewards", optional=True, tooltip="annotate each leaf with its reward"),
            ],
            outputs=[io.Image.Output(display_name="preview", tooltip="one image: the leaves of each tree in branch order")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, tree, images, rewards=None):
        img = tree_preview(tree.batch, images.movedim(-1, 1), rewards)
        return io.NodeOutput(img, ui=ui.PreviewImage(img, cls=cls))


class RunMonitor(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPORunMonitor", display_name="TreeGRPO Run Monitor", category=f"{CATEGORY}/visualize",
            description="The step-by-step run's curves: the training reward, a held-out judge and the reward-hacking "
                        "signals of each iteration's leaves (diversity, high-frequency energy, saturation, "
                        "near-black/white), with a warning when the judge falls while the reward rises.",
            inputs=[
                Tree.Input("tree", tooltip="this iteration's tree (from the Tree Sampler or Advantage Backup)"),
                io.Image.Input("images", tooltip="decoded leaves of the tree"),
                Rewards.Input("rewards", tooltip="the leaves' training rewards (from the Reward Scorer)"),
                RewardModel.Input("judge", optional=True,
                                  tooltip="held-out judge: a reward model the run is not trained on"),
            ],
            outputs=[io.Image.Output(display_name="curves", tooltip="the run's curves and signals so far")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, tree, images, rewards, judge=None):
        img = signals_image(monitor_tree(tree, images.movedim(-1, 1), rewards, judge))
        return io.NodeOutput(img, ui=ui.PreviewImage(img, cls=cls))


NODES = [TreePreview, RunMonitor]
